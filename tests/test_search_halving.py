"""Successive halving over the structural variants (search/halving.py): the rung sizes, exact shares of an
evaluation budget, and that the budget follows promise — the variants that found the better plans get more,
and the polish spends on the best plan's own variant first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import load_hardware
from rpegc.search.anneal import SearchConfig, polish_reserve
from rpegc.search.baselines import concurrent_plan
from rpegc.search.directory import DirectoryRules
from rpegc.search.evaluator import Evaluator
from rpegc.search.halving import Board, polish_best, rung_sizes, shares
from rpegc.search.space import structural_candidates
from rpegc.search.workers import LocalPool, Problem
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_rungs_halve_down_to_the_last_size():
    assert rung_sizes(6) == [6, 3, 2]
    assert rung_sizes(6, last=1) == [6, 3, 2, 1]
    assert rung_sizes(4) == [4, 2] and rung_sizes(2) == [2] and rung_sizes(1) == [1]
    assert rung_sizes(9) == [9, 5, 3, 2]


def test_shares_add_up_and_differ_by_at_most_one():
    for total, k in [(10, 3), (0, 4), (7, 7), (1000, 6)]:
        parts = shares(total, k)
        assert sum(parts) == total and len(parts) == k and max(parts) - min(parts) <= 1


def test_the_budget_follows_promise_and_is_spent_exactly():
    p = parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")
    r = optimize(p, OptimizeOptions(budget_s=0, evals=2000, steps=2, seed=0, jobs=1))
    assert r.stats.evaluations == 2000  # the annealing and the polish together
    assert 0 < r.polish_evaluations <= 2000
    spent = {v.label: v.evaluations for v in r.variant_stats}
    assert len(spent) == 6 and min(spent.values()) > 0  # every variant had its first share
    ranked = sorted(r.variant_stats, key=lambda v: -(v.best.score if v.best else 0.0))
    # the two most promising variants reach the last rung: each gets more than any variant dropped first
    assert min(spent[v.label] for v in ranked[:2]) > max(spent[v.label] for v in ranked[3:])
    assert r.variant.label() in {v.label for v in ranked[:2]}


def test_the_polish_reserve_pays_for_whole_passes_between_a_floor_and_a_cap():
    cfg = SearchConfig()  # a fifth at least, up to two passes within half
    assert polish_reserve(cfg, 1_000, 1_000_000) == cfg.polish_share  # two passes are less than a fifth
    assert polish_reserve(cfg, 12_000, 60_000) == pytest.approx(0.4)  # two passes
    assert polish_reserve(cfg, 12_000, 30_000) == pytest.approx(0.4)  # one: two would take 80%
    assert polish_reserve(cfg, 12_000, 20_000) == cfg.polish_share  # half of it does not pay for a pass
    assert polish_reserve(cfg, 12_000, float("inf")) == polish_reserve(cfg, 0, 1_000) == cfg.polish_share
    assert polish_reserve(replace(cfg, polish=False), 12_000, 30_000) == 0.0


class RecordingPool:
    """A pool in this process that records the polish tasks it is given, call by call."""

    def __init__(self, pool):
        self.pool, self.calls = pool, []

    def polish(self, tasks, deadline):
        self.calls.append(tasks)
        return self.pool.polish(tasks, deadline)


def test_the_polish_spends_on_the_best_plans_own_variant_first():
    """Its own variant gets the whole polish budget; the variants with the same vertices (another tau) get what
    it leaves, and start from its result."""
    p = replace(parse((EXAMPLES / "grpo-tiny.rpeg").read_text(), "grpo-tiny.rpeg"), plan=None)
    hw = load_hardware(p.cluster.hardware)
    variants = tuple(structural_candidates(p))
    config = SearchConfig()
    pool = RecordingPool(LocalPool(Problem(variants, hw, CostOptions(), 8, True, DirectoryRules(), config, 0)))
    board = Board(variants, config)
    first = pool.pool.worker.search(0)
    board.records[0].best = (first.seeds[0], first.state.evaluate(variants[0], [first.seeds[0]])[0])
    budget = board.evaluations + 40  # less than one pass over the directories
    polish_best(pool, board, budget, None)
    assert [[(t.index, t.max_evals, t.choice) for t in call] for call in pool.calls] == [[(0, 40, first.seeds[0])]]
    assert board.evaluations == budget  # nothing left for the siblings: they are not polished

    pool.calls.clear()
    board = Board(variants, config)
    # a start the polish must move: every vertex at its slowest candidate on the first device alone (feasible: a
    # start on more devices than the host has cores is one no single move makes feasible)
    slow = tuple(max((i for i in range(len(d)) if d.masks[i] == 1), key=lambda i: d.t_op[i])
                 for d in pool.pool.worker.evaluator.compile(variants[0]).dirs)
    board.records[0].best = (slow, first.state.evaluate(variants[0], [slow])[0])
    polish_best(pool, board, 10_000, None)
    own, siblings = pool.calls
    assert [t.index for t in siblings] == [j for j, v in enumerate(variants) if j and v.vertex_set == variants[0].vertex_set]
    assert own[0].max_evals == 10_000 and all(0 < t.max_evals < 10_000 for t in siblings)
    assert siblings[0].choice != slow  # the own variant's polish moved it, and the siblings start there


def test_each_variant_is_carried_the_best_plan_of_every_other_vertex_set():
    p = replace(parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg"), plan=None)
    variants = tuple(structural_candidates(p, taus=(0, 1)))
    board = Board(variants, SearchConfig())
    e = Evaluator(load_hardware(p.cluster.hardware), CostOptions(), 2)
    for i, v in enumerate(variants):  # every variant's concurrent plan, under its own label
        cv = e.compile(v)
        choice = concurrent_plan(cv).choice
        board.records[i].best = (choice, e.evaluate_one(v, choice))
        board.records[i].placements = v.label()  # stands for the placements of its best plan
    shared = [i for i, v in enumerate(variants) if v.ac]
    separate = [i for i, v in enumerate(variants) if not v.ac]
    best_separate = min(separate, key=board.promise)
    best_shared = min(shared, key=board.promise)
    assert all(board.carried(i) == (variants[best_separate].label(),) for i in shared)
    assert all(board.carried(i) == (variants[best_shared].label(),) for i in separate)
    board.records[best_shared].skipped = (None, "fits nowhere")
    assert board.carried(separate[0]) == (variants[min(set(shared) - {best_shared}, key=board.promise)].label(),)
