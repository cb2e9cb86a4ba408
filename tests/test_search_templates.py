"""Template seeds (search/templates.py): every template lays the roles out on a partition of the devices, block
descent improves each template without leaving its blocks and within its budget, on Table X at 128 GPUs the
templates reach the better of the two basins the annealing alone ended in (60.1K tokens/s in 2 of 8 seeds,
58.2K in the others; bench/README.md, "Stability"), a lone trainer may leave a block of the rest to inference
(at 64 GPUs that layout is the best plan any run found), every vertex colocated on one block of each size holding
device 0 is a template too, and a worker makes a variant's templates in the first of its shares that pays for them,
restarting its worst chains from them."""

from __future__ import annotations

import random

import pytest

from rpegc.core.cost.hardware import load_hardware
from rpegc.core.cost.options import CostOptions
from rpegc.search.anneal import UNLIMITED, Budget, SearchConfig, SearchState, VariantSearch
from rpegc.search.baselines import concurrent_plan
from rpegc.search.directory import DirectoryRules
from rpegc.search.evaluator import Evaluator
from rpegc.search.space import base_structure, structural_candidates
from rpegc.search.templates import block_descent, colocated, template_seeds, templates
from rpegc.search.workers import AnnealTask, Problem, Worker
from rpegc.syntax.parser import parse

from fixtures.programs import EXAMPLES, load_bench


@pytest.fixture(scope="module")
def ppo_8gpu():
    return parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")


@pytest.fixture(scope="module")
def table_x_128():
    """The 128-GPU Table X workload in its structure ac = 0, tau(actor) = 1, tau(critic) = 0."""
    case = next(c for c in load_bench("workloads").table_x(128) if c.gpus == 128)
    evaluator = Evaluator(case.hw, CostOptions(), 8)
    variant = next(v for v in structural_candidates(base_structure(case.program), (0, 1), False)
                   if dict(v.program.graph.staleness) == {"actor": 1, "critic": 0})
    return evaluator, evaluator.compile(variant)


@pytest.fixture(scope="module")
def table_x_64_shared():
    """The 64-GPU Table X workload with actor and critic shared (one trainer), tau = 1: its best plan (111,439
    tokens/s, bench/results/stability.csv) puts the trainer and ref_inf on one half, generation on a quarter and
    the other inference on the last quarter."""
    case = next(c for c in load_bench("workloads").table_x(64) if c.gpus == 64)
    evaluator = Evaluator(case.hw, CostOptions(), 8)
    variant = next(v for v in structural_candidates(base_structure(case.program), (0, 1), True)
                   if v.label() == "ac=1 tau(actor_ac=1)")
    return evaluator, evaluator.compile(variant)


def state(evaluator) -> SearchState:
    return SearchState(evaluator, SearchConfig(), random.Random(0))


def test_templates_partition_the_devices_by_role(table_x_128):
    _, cv = table_x_128
    n = cv.num_devices
    full = (1 << n) - 1
    roles = [d.role for d in cv.dirs]
    ts = templates(cv)
    assert len(ts) >= 4
    for t in ts:
        (g,) = t.blocks[roles.index("generation")]
        assert g & 1 and bin(g).count("1") in (n // 2, n // 4)
        trainers = [t.blocks[v][0] for v, r in enumerate(roles) if r == "training"]
        assert all(not b & g for b in trainers)
        assert all(a == b or not a & b for a in trainers for b in trainers)
        union = 0
        for b in trainers:
            union |= b
        assert union == full & ~g
        allowed = {g, full & ~g, *trainers}
        for v, r in enumerate(roles):
            assert t.blocks[v] and set(t.blocks[v]) <= allowed
            assert all(b in cv.dirs[v].masks for b in t.blocks[v])


def test_block_descent_stays_on_the_blocks_and_never_worsens(table_x_128):
    evaluator, cv = table_x_128
    st = state(evaluator)
    ts = templates(cv)
    starts = block_descent(st, cv, ts, Budget(None, 0, evaluator.stats.evaluations))  # no evaluation: the starts
    plans = block_descent(st, cv, ts, UNLIMITED)
    for t, start, plan in zip(ts, starts, plans, strict=True):
        assert all(cv.dirs[v].masks[c] in t.blocks[v] for v, c in enumerate(plan))
        before, after = evaluator.evaluate_one(cv.variant, start), evaluator.evaluate_one(cv.variant, plan)
        assert (st.value(after), -after.r_peak) >= (st.value(before), -before.r_peak)


def test_the_templates_reach_the_better_basin_within_their_budget(table_x_128):
    evaluator, cv = table_x_128
    st = state(evaluator)
    before = evaluator.stats.evaluations
    seeds = template_seeds(st, cv, Budget(None, 20_000, before), 1.0)
    assert evaluator.stats.evaluations - before <= 20_000
    evals = evaluator.evaluate(cv.variant, seeds)
    assert all(e.feasible for e in evals)
    assert [st.value(e) for e in evals] == sorted((st.value(e) for e in evals), reverse=True)
    assert evals[0].score > 60_000


def test_a_small_budget_cuts_the_descent(ppo_8gpu):
    p = ppo_8gpu
    evaluator = Evaluator(load_hardware(p.cluster.hardware), CostOptions(), 8)
    cv = evaluator.compile(next(iter(structural_candidates(base_structure(p)))))
    before = evaluator.stats.evaluations
    block_descent(state(evaluator), cv, templates(cv), Budget(None, 25, before))
    assert evaluator.stats.evaluations - before <= 25


def test_every_vertex_colocated_on_one_block_of_each_size_is_a_template_and_a_seed():
    """On the 2-core host's 2-worker cluster: everything on worker 0 (the verifier pool beside it), and everything
    on both. The chains alone missed the first on the demo's arithmetic GRPO (a data-parallel plan 8% slower)."""
    text = (EXAMPLES / "grpo-verify.rpeg").read_text().replace("gpus = 1,", "gpus = 2,")
    p = parse(text.replace('{fn = "rule"}', '{fn = "rule", per_response = 5e-4}'), "v.rpeg")
    evaluator = Evaluator(load_hardware("cpu-reference"), CostOptions(), 8)
    cv = evaluator.compile(next(iter(structural_candidates(base_structure(p)))))
    ts = colocated(cv)
    on = [v for v, device in enumerate(cv.device_vertex) if device]
    assert [{t.blocks[v] for v in on} for t in ts] == [{(0b01,)}, {(0b11,)}]
    pool = next(v for v, device in enumerate(cv.device_vertex) if not device)
    assert all(set(t.blocks[pool]) == set(cv.dirs[pool].masks) for t in ts)
    seeds = template_seeds(state(evaluator), cv, Budget(None, None, evaluator.stats.evaluations), 1.0)
    assert any(all(cv.dirs[v].masks[c[v]] == 0b01 for v in on) for c in seeds)


def test_no_templates_when_the_budget_cannot_pay_for_a_pass(table_x_128):
    evaluator, cv = table_x_128
    before = evaluator.stats.evaluations
    assert template_seeds(state(evaluator), cv, Budget(None, 200, before), 1.0) is None
    assert evaluator.stats.evaluations == before


def test_a_lone_trainer_leaves_a_block_of_the_rest_to_inference(table_x_64_shared):
    evaluator, cv = table_x_64_shared
    roles = [d.role for d in cv.dirs]
    (t,) = [v for v, r in enumerate(roles) if r == "training"]
    g = roles.index("generation")
    full = (1 << cv.num_devices) - 1
    split = [x for x in templates(cv) if x.blocks[t][0] != full & ~x.blocks[g][0]]
    assert split
    for x in split:
        spare = full & ~x.blocks[g][0] & ~x.blocks[t][0]
        assert any(spare in x.blocks[v] for v, r in enumerate(roles) if r == "inference")
    seeds = template_seeds(state(evaluator), cv, Budget(None, 10_000, evaluator.stats.evaluations), 1.0)
    assert evaluator.evaluate_one(cv.variant, seeds[0]).score > 111_400


def test_the_templates_wait_for_a_share_that_pays_for_them(ppo_8gpu):
    p = ppo_8gpu
    variants = tuple(structural_candidates(base_structure(p)))
    worker = Worker(Problem(variants, load_hardware(p.cluster.hardware), CostOptions(), 2, True, DirectoryRules(),
                            SearchConfig(), 0))
    worker.anneal([AnnealTask(0, 100, 0.0, ())], None)  # one pass of its templates costs 826 evaluations
    assert worker.templated == set() and len(worker.searches[0].seeds) == 1  # the concurrent plan only
    worker.anneal([AnnealTask(0, 2_000, 0.0, ())], None)
    assert worker.templated == {0}


def test_seeds_added_to_a_running_population_restart_its_worst_chains(table_x_64_shared):
    evaluator, cv = table_x_64_shared
    st = state(evaluator)
    search = VariantSearch(st, cv.variant, concurrent_plan(cv).choice)
    search.run(Budget(None, 600, evaluator.stats.evaluations), 1_200)
    assert len(search.chains) >= 2
    values = sorted(st.value(c.e_cur) for c in search.chains)
    worst = min(search.chains, key=lambda c: st.value(c.e_cur)).current
    best = template_seeds(st, cv, UNLIMITED, 1.0)[0]
    assert st.value(evaluator.evaluate_one(cv.variant, best)) > values[-1]
    search.add_seeds([best, worst])  # the second is worse than every chain left: it restarts none
    after = sorted(st.value(c.e_cur) for c in search.chains)
    assert after == sorted([*values[1:], st.value(evaluator.evaluate_one(cv.variant, best))])
    assert sum(c.current == best for c in search.chains) == 1
