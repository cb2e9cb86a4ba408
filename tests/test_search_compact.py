"""The compact form (rpegc/search/compact.py) and the evaluation cache.

Why relays are exact (the claim the differential test checks numerically): a relay has time 0 and
reserves no device, so selecting it never changes device availability and its finish equals the latest
finish of its predecessors, i.e. it forwards a precedence exactly like the bare edge it stands for. Its
order key is below every real node and it is a transfer (first tie-breaker), and its downstream rank
is the maximum over its successors; so whenever a real node y is selected while a ready relay z still
blocks a real node w, key(y) < key(z) <= key(w) on (EST, kind, -rank), and y would be selected before w
on the lowered graph too. Hence both graphs place the real nodes in the same order at the same times."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rpegc.core.cost.annotate import annotate
from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import load_hardware
from fixtures.lowering import lower
from rpegc.core.lower.unroll import unroll
from rpegc.search.compact import OPERATOR, PUBLICATION, PAIR_RESHARD, venn_cells
from rpegc.search.evaluator import Evaluator
from rpegc.search.space import structural_candidates
from rpegc.syntax.parser import parse

PPO = Path(__file__).resolve().parent.parent / "examples" / "ppo-8gpu.rpeg"


@pytest.fixture(scope="module")
def setup():
    p = parse(PPO.read_text(), "ppo-8gpu.rpeg")
    ev = Evaluator(load_hardware(p.cluster.hardware), CostOptions(), steps=3)
    return p, ev, structural_candidates(p, (0, 1), True)


def random_plans(cv, n, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(rng.integers(len(d))) for d in cv.dirs) for _ in range(n)]


def test_superset_minus_relays_is_the_lowered_graph(setup):
    p, ev, variants = setup
    for variant in variants:
        cv = ev.compile(variant)
        for choice in random_plans(cv, 5) + [tuple(0 for _ in cv.dirs)]:
            s, times, reserved, _ = cv.schedule(choice)
            real = Counter(("op" if s.kind[i] == OPERATOR else "transfer") for i in range(s.n) if reserved[i])
            g = lower(unroll(replace(variant.program, plan=cv.to_plan(choice)), cv.steps)).exec
            want = Counter("op" if n.kind == "op" else "transfer" for n in g.nodes)
            assert real == want
            assert all(times[i] == 0.0 for i in range(s.n) if not reserved[i])  # relays take no time


def test_reshard_nodes_get_the_time_annotate_gives_them(setup):
    p, ev, variants = setup
    cv = ev.compile(variants[0])
    d = cv.dirs
    # gen and train_actor on the same devices in different layouts: a pair Reshard every step.
    gen, train = cv.vindex["gen"], cv.vindex["train_actor"]
    g_alloc = d[gen].allocs[0]
    t = next(i for i, (a, s) in enumerate(zip(d[train].allocs, d[train].strategies))
             if a == g_alloc and s.layout() != d[gen].strategies[0].layout())
    choice = tuple(0 if v != train else t for v in range(len(cv.vertices)))
    s, times, reserved, _ = cv.schedule(choice)
    mine = sorted(times[i] for i in range(s.n) if s.kind[i] in (PUBLICATION, PAIR_RESHARD) and reserved[i])
    q = annotate(lower(unroll(replace(cv.program, plan=cv.to_plan(choice)), cv.steps)), cv.hw, cv.opts)
    theirs = sorted(n.time for n in q.exec.nodes if n.kind == "reshard" or (n.kind == "comm" and n.model))
    assert mine == theirs and len(mine) >= cv.steps


def test_plans_round_trip_through_directory_indices(setup):
    p, ev, variants = setup
    cv = ev.compile(variants[-1])
    for choice in random_plans(cv, 10, seed=3):
        assert cv.choice_of(cv.to_plan(choice)) == choice


def test_critical_path_weights_point_at_operators_of_the_schedule(setup):
    p, ev, variants = setup
    cv = ev.compile(variants[0])
    for choice in random_plans(cv, 5, seed=4):
        w = cv.critical_weights(choice)
        e = cv.evaluate(choice)
        assert w.sum() > 0 and w.sum() <= e.makespan * (1 + 1e-12)


def test_venn_cells():
    assert venn_cells([0b0011, 0b0110]) == {(0,), (0, 1), (1,)}
    assert venn_cells([0b11, 0b11]) == {(0, 1)}
    assert venn_cells([0b01, 0b10]) == {(0,), (1,)}


def test_cache_counts_only_misses_and_both_paths_agree(setup):
    p, ev, variants = setup
    ev = Evaluator(ev.hw, ev.opts, steps=2, batch_threshold=8)
    y = variants[1]
    plans = random_plans(ev.compile(y), 20, seed=5)
    batched = ev.evaluate(y, plans)  # 20 misses: the batched path
    assert ev.stats.evaluations == 20 and ev.stats.hits == 0
    again = ev.evaluate(y, plans[:3] + plans[:1])
    assert ev.stats.evaluations == 20 and ev.stats.hits == 4 and again[:3] == batched[:3]
    reference = [ev.compile(y).evaluate(c) for c in plans]
    for a, b in zip(batched, reference):
        assert (a.makespan, a.r_peak, a.feasible) == (b.makespan, b.r_peak, b.feasible)
        assert a.score_pen == pytest.approx(b.score_pen, rel=1e-12)
