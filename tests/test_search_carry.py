"""A plan carried across actor-critic sharing (search/carry.py): every vertex keeps its placement, the shared
trainer takes either trainer's, the two trainers take the shared one's; a placement that is not a candidate
falls back to the fastest candidate on the same allocation; the workers take carried plans as elites."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.ir.geometry import Strategy
from rpegc.search.anneal import SearchConfig
from rpegc.search.baselines import concurrent_plan
from rpegc.search.carry import Carried, carried_choices, placements_of
from rpegc.search.directory import DirectoryRules
from rpegc.search.evaluator import Evaluator
from rpegc.search.space import structural_candidates
from rpegc.search.workers import AnnealTask, Problem, Worker
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def ppo():
    p = replace(parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg"), plan=None)
    hw = load_hardware(p.cluster.hardware)
    variants = structural_candidates(p, taus=(0,))
    separate, shared = variants  # ac = 0, ac = 1
    assert not separate.ac and shared.ac
    ev = Evaluator(hw, CostOptions(), 2)
    return p, hw, ev, ev.compile(separate), ev.compile(shared)


def by_vertex(cv, choice):
    return {c.vertex: c for c in placements_of(cv, choice)}


def test_the_shared_trainer_takes_either_trainers_placement(ppo):
    _, _, _, separate, shared = ppo
    # a plan whose trainers sit on different allocations: the concurrent plan, with the critic's trainer moved
    base = concurrent_plan(separate).choice
    t = [v.name for v in separate.vertices].index("train_critic")
    theirs = by_vertex(separate, base)["train_actor"].alloc
    other = next(i for i, a in enumerate(separate.dirs[t].allocs) if a != theirs)
    plan = placements_of(separate, base[:t] + (other,) + base[t + 1:])
    carried = carried_choices(shared, plan)
    assert len(carried) == 2
    source = {c.vertex: c for c in plan}
    for choice in carried:
        got = by_vertex(shared, choice)
        for name in ("gen", "ref_inf", "reward_inf", "critic_inf"):
            assert (got[name].alloc, got[name].strategy) == (source[name].alloc, source[name].strategy)
    assert {by_vertex(shared, c)["train_ac"].alloc for c in carried} == {source["train_actor"].alloc,
                                                                          source["train_critic"].alloc}


def test_both_trainers_take_the_shared_trainers_placement(ppo):
    _, _, _, separate, shared = ppo
    plan = placements_of(shared, concurrent_plan(shared).choice)
    (choice,) = carried_choices(separate, plan)
    got, ac = by_vertex(separate, choice), {c.vertex: c for c in plan}["train_ac"]
    assert got["train_actor"].alloc == got["train_critic"].alloc == ac.alloc


def test_a_strategy_that_is_no_candidate_falls_back_to_the_fastest_on_its_allocation(ppo):
    _, _, _, separate, shared = ppo
    plan = list(placements_of(separate, concurrent_plan(separate).choice))
    k = next(i for i, c in enumerate(plan) if c.vertex == "gen")
    plan[k] = replace(plan[k], strategy=Strategy(dp=3, pp=7, tp=5, mb=11))  # on no directory
    choice = carried_choices(separate, tuple(plan))[0]
    v = [x.name for x in separate.vertices].index("gen")
    d = separate.dirs[v]
    assert choice[v] == min(i for i, a in enumerate(d.allocs) if a == plan[k].alloc)
    assert d.t_op[choice[v]] == min(d.t_op[i] for i, a in enumerate(d.allocs) if a == plan[k].alloc)


def test_a_vertex_that_cannot_keep_its_allocation_carries_nothing(ppo):
    _, _, _, separate, _ = ppo
    plan = [c for c in placements_of(separate, concurrent_plan(separate).choice)]
    plan[0] = Carried(plan[0].vertex, plan[0].role, replace(plan[0].alloc, origin=(5, 5, 5)), plan[0].strategy)
    assert carried_choices(separate, tuple(plan)) == []
    nameless = tuple(c for c in plan if c.role != "generation")
    assert carried_choices(separate, nameless) == []  # no vertex of generation's name or role to take from


def test_a_worker_evaluates_carried_plans_within_its_share_and_keeps_the_best_as_an_elite(ppo):
    p, hw, _, separate, shared = ppo
    variants = tuple(structural_candidates(p, taus=(0,)))
    worker = Worker(Problem(variants, hw, CostOptions(), 2, True, DirectoryRules(), SearchConfig(), 0))
    plan = placements_of(separate, concurrent_plan(separate).choice)
    carried = carried_choices(shared, plan)
    (report,) = worker.anneal([AnnealTask(1, 40, 0.0, (), (), (plan,))], None)
    st = worker.search(1).state
    assert all(st.evaluator.cached(variants[1], c) is not None for c in carried)
    assert report.stats.evaluations <= 40  # the carried plans are part of the share
    evals = [st.evaluator.cached(variants[1], c) for c in carried]
    best = max((st.value(e), c) for c, e in zip(carried, evals) if e.feasible)
    elites = st.elites[variants[1].vertex_set]
    assert best in elites or len(elites) == SearchConfig().k_elite and min(elites)[0] >= best[0]


@pytest.mark.parametrize("carry", [True, False])
def test_a_report_gives_its_best_plans_placements_only_when_plans_are_carried(ppo, carry):
    p, hw, _, separate, _ = ppo
    variants = tuple(structural_candidates(p, taus=(0,)))
    worker = Worker(Problem(variants, hw, CostOptions(), 2, True, DirectoryRules(), SearchConfig(carry=carry), 0))
    (report,) = worker.anneal([AnnealTask(0, 30, 0.0, ())], None)
    assert report.placements == (placements_of(separate, report.best[0]) if carry else ())
