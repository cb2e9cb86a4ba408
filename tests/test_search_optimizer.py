"""The optimizer (Sec. VI, App. A-J, Alg. 1/7): structural candidates, baselines, determinism, feasibility,
gains over the baselines, the infeasible case, the ablation switches of Table IV (A1-A9), and stage fusion as a
plan choice (A10 turns it off)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from rpegc.core.cost.annotate import annotate
from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import load_hardware
from fixtures.lowering import lower
from rpegc.core.sched.schedule import schedule_program
from rpegc.core.lower.unroll import unroll
from rpegc.core.check.plan_rules import check_plan
from rpegc.core.ir.geometry import Cluster
from rpegc.search import anneal, optimizer, workers
from rpegc.search.anneal import SearchConfig
from rpegc.search.baselines import concurrency_groups, concurrent_plan, greedy_plan
from rpegc.search.compact import CompactVariant
from rpegc.search.directory import MB_FIXED
from rpegc.search.evaluator import Evaluator
from rpegc.search.objective import objective_value
from rpegc.search.optimizer import OptimizeOptions, optimize, parse_ablations
from rpegc.search.space import structural_candidates
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL = dict(budget_s=0, evals=150, steps=2)


def load(name: str):
    return parse((EXAMPLES / name).read_text(), name)


@pytest.fixture(scope="module")
def ppo():
    return load("ppo-8gpu.rpeg")


@pytest.fixture(scope="module")
def grpo():
    return replace(load("grpo.rpeg"), cluster=Cluster("c8", 1, 2, 4, "gh200"), plan=None)


# --- structural candidates (S1, S2) -------------------------------------------------------------------


def test_structural_candidates_follow_s1_and_s2(ppo, grpo):
    ys = structural_candidates(ppo, (0, 1), ac=True)
    assert [(y.ac, tuple(t for _, t in y.tau)) for y in ys] == [
        (False, (0, 0)), (False, (0, 1)), (False, (1, 0)), (False, (1, 1)), (True, (0,)), (True, (1,))]
    assert all(y.program.plan is None and dict(y.program.graph.staleness) == dict(y.tau) for y in ys)
    assert len(structural_candidates(ppo, (0, 1), ac=False)) == 4
    assert len(structural_candidates(grpo, (0, 1, 2), ac=True)) == 3  # no critic: no sharing (S1)


# --- baselines -------------------------------------------------------------------------------------------


def compile_first(p) -> CompactVariant:
    hw = load_hardware(p.cluster.hardware)
    return Evaluator(hw, optimizer.CostOptions(), steps=2).compile(structural_candidates(p, (0,), False)[0])


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_baselines_produce_legal_plans(name, ppo, grpo):
    cv = compile_first(ppo if name == "ppo" else grpo)
    for plan in (greedy_plan(cv), concurrent_plan(cv)):
        program = replace(cv.program, plan=cv.to_plan(plan.choice))
        assert check_plan(program) == []


def test_greedy_runs_everything_on_the_full_gpu_set(ppo):
    cv = compile_first(ppo)
    allocs, _ = cv.placement(greedy_plan(cv).choice)
    assert all(a.size == ppo.cluster.num_devices for a in allocs)


def test_on_a_cpu_profile_the_baselines_keep_every_host_within_its_cores():
    """A CPU device is a worker process on a host core: a baseline places at most as many devices on a node as its
    host has cores (cost/host.cores_needed; cpu-reference: 2 per node), the first of each node."""
    p = replace(load("ppo-tiny.rpeg"), cluster=Cluster("c8", 1, 2, 4, "cpu-reference"), plan=None)
    cv = compile_first(p)
    assert cv.host_cores == 2
    for plan in (greedy_plan(cv), concurrent_plan(cv)):
        allocs, _ = cv.placement(plan.choice)
        used = {d for a in allocs for d in a.devices(p.cluster)}
        assert used <= {0, 1, 4, 5} and cv.host_ratio(plan.choice) <= 1.0


def test_the_optimizer_keeps_every_host_within_its_cores():
    """On a 2-core CPU host a plan on 3 of a node's 4 devices would run 3 workers on 2 cores, time-sliced, which
    the cost model does not price: the optimizer's plans keep within the host's cores (r_host <= 1, both evaluation
    paths), and a plan beyond them is infeasible."""
    p = replace(load("grpo-tiny.rpeg"), plan=None)  # 2 nodes x 4 devices, hardware "cpu"
    hw = load_hardware("cpu-reference")
    r = optimize(p, OptimizeOptions(seed=0, **SMALL), hw)
    per_node = [0] * (p.cluster.racks * p.cluster.nodes)
    for d in {d for pl in r.program.plan.placements for d in pl.alloc.devices(p.cluster)}:
        per_node[d // p.cluster.gpus] += 1
    assert max(per_node) <= 2 and r.evaluation.feasible and r.evaluation.r_host == max(per_node) / 2
    cv = Evaluator(hw, optimizer.CostOptions(), steps=2).compile(structural_candidates(p, (0,), False)[0])
    wide = tuple(max(range(len(d)), key=lambda i: (d.sizes[i] if d.masks[i] < 1 << p.cluster.gpus else 0, -i))
                 for d in cv.dirs)  # every vertex on the most devices of the first node
    e = Evaluator(hw, optimizer.CostOptions(), steps=2).evaluate_one(cv.variant, wide)
    assert cv.host_ratio(wide) == 2.0 and e.r_host == 2.0 and not e.feasible


def test_concurrent_gives_each_group_disjoint_allocations(ppo):
    cv = compile_first(ppo)
    groups = concurrency_groups(cv)
    names = [[cv.vertices[i].name for i in g] for g in groups]
    assert names == [["gen"], ["ref_inf", "reward_inf", "critic_inf"], ["train_actor", "train_critic"]]
    choice = concurrent_plan(cv).choice
    for g in groups:
        masks = [cv.dirs[v].masks[choice[v]] for v in g]
        assert all(not (a & b) for i, a in enumerate(masks) for b in masks[i + 1:])


# --- the search --------------------------------------------------------------------------------------------


def test_same_seed_same_result_and_the_result_is_feasible_and_legal(ppo):
    a = optimize(ppo, OptimizeOptions(seed=3, **SMALL))
    b = optimize(ppo, OptimizeOptions(seed=3, **SMALL))
    assert a.program.plan == b.program.plan and a.variant.key == b.variant.key
    assert a.evaluation == b.evaluation and a.stats.evaluations == b.stats.evaluations
    assert a.evaluation.feasible and a.evaluation.r_peak <= 1.0
    assert check_plan(a.program) == []
    assert dict(a.program.graph.staleness) == dict(a.variant.tau)
    from rpegc.search.report import summary_rows

    assert dict(summary_rows(a))["hardware"].startswith("'gh200': shipped profile (")  # whose machine it priced


def test_beats_or_equals_the_baselines_on_the_8gpu_ppo_example(ppo):
    r = optimize(ppo, OptimizeOptions(seed=0, budget_s=0, evals=300, steps=4))
    assert r.concurrent.evaluation.feasible and r.greedy.evaluation.feasible
    assert r.evaluation.score >= r.concurrent.evaluation.score
    assert r.evaluation.score >= r.greedy.evaluation.score
    assert r.stats.evaluations >= 300  # the search spent its budget (polish comes on top)


def test_finds_a_feasible_plan_where_both_baselines_run_out_of_memory(ppo):
    hw = replace(load_hardware("gh200"), M_GPU=44e9)
    r = optimize(ppo, OptimizeOptions(seed=0, **SMALL), hw)
    assert not r.greedy.evaluation.feasible and not r.concurrent.evaluation.feasible
    assert r.evaluation.feasible


def test_no_feasible_plan_is_a_user_error_with_the_best_peak(ppo):
    hw = replace(load_hardware("gh200"), M_GPU=30e9)
    with pytest.raises(RpegError) as err:
        optimize(ppo, OptimizeOptions(seed=0, **SMALL), hw)
    assert "no memory-feasible plan" in err.value.message and "r_peak = 1." in err.value.message
    assert "more GPUs" in err.value.message


def test_utilization_objective_scores_throughput_times_utilization(ppo):
    r = optimize(ppo, OptimizeOptions(seed=0, objective="util", delta=0.1, **SMALL))
    e = r.evaluation
    assert r.value == pytest.approx(e.score * e.util) or r.value == pytest.approx(e.score * 1e-12)
    assert r.objective == "util"


def test_baseline_option_returns_that_plan_without_searching(ppo):
    r = optimize(ppo, OptimizeOptions(baseline="concurrent", budget_s=0, evals=0, steps=2))
    assert r.source == "concurrent" and r.choice == r.concurrent.choice and r.rounds == 0


def test_the_optimizers_score_is_the_pipelines_under_non_default_cost_options(ppo):
    """optimize searches under the cost options annotate-cost reports with."""
    hw = load_hardware(ppo.cluster.hardware)
    cost = CostOptions(accounting="spec", decode_rows="local_batch", generation_pp="wavefront",
                       tp_decode="per_microbatch", dp_scalar_allreduces=4, pp_inter_tier="replica")
    result = optimize(ppo, OptimizeOptions(**SMALL), hw, cost)

    def pipeline(opts: CostOptions) -> float:
        return schedule_program(annotate(lower(unroll(result.program, SMALL["steps"])), hw, opts)).exec.schedule.score

    assert pipeline(cost) == pytest.approx(result.evaluation.score, rel=1e-12)
    assert pipeline(CostOptions()) != pytest.approx(result.evaluation.score, rel=1e-3)  # the options matter here


def test_the_pass_takes_every_cost_option_of_annotate_cost():
    from dataclasses import fields

    from rpegc.passes.annotate_cost import AnnotateCostPass
    from rpegc.passes.optimize import OptimizePass

    names = {f.name for f in fields(CostOptions)} | {"hardware"}
    assert names <= {f.name for f in fields(OptimizePass)} and names == {f.name for f in fields(AnnotateCostPass)}
    assert OptimizePass(decode_rows="local_batch", tp_decode="per_microbatch").cost_options() == CostOptions(
        decode_rows="local_batch", tp_decode="per_microbatch")
    with pytest.raises(RpegError, match="decode_rows"):
        OptimizePass(decode_rows="rows").check_options()


@pytest.mark.parametrize("options, words", [
    (OptimizeOptions(objective="fast"), "objective"),
    (OptimizeOptions(budget_s=0, evals=0), "budget"),
    (OptimizeOptions(baseline="best"), "baseline"),
    (OptimizeOptions(delta=1.5), "delta"),
])
def test_bad_options_are_user_errors(ppo, options, words):
    with pytest.raises(RpegError, match=words):
        optimize(ppo, options)


def test_unknown_ablation_lists_the_known_ones():
    assert parse_ablations("a1, A9, a10") == {"A1", "A9", "A10"}
    with pytest.raises(RpegError, match="A11.*A1 \\(response-length.*A10 \\(no stage fusion"):
        parse_ablations("A11")


# --- ablations actually change behaviour (Table IV) --------------------------------------------------


class Calls:
    def __init__(self, monkeypatch, module, name):
        self.n = 0
        self.args = []
        original = getattr(module, name)

        def wrapper(*a, **k):
            self.n += 1
            self.args.append(a)
            return original(*a, **k)

        monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("ablation, module, name", [
    ("A4", anneal, "pair_kernel"),
    ("A6", anneal.SearchState, "critical_weights"),
    ("A7", workers, "polish"),
])
def test_switched_off_mechanisms_are_not_used(ppo, monkeypatch, ablation, module, name):
    on = Calls(monkeypatch, module, name)
    optimize(ppo, OptimizeOptions(seed=1, **SMALL))
    assert on.n > 0
    off = Calls(monkeypatch, module, name)
    optimize(ppo, OptimizeOptions(seed=1, ablate=frozenset({ablation}), **SMALL))
    assert off.n == 0


def test_a1_a2_a3_change_the_search_space(ppo, monkeypatch):
    seen = []
    original = workers.Evaluator

    def spy(*a, **k):
        ev = original(*a, **k)
        seen.append(ev)
        return ev

    monkeypatch.setattr(workers, "Evaluator", spy)
    r = optimize(ppo, OptimizeOptions(seed=0, ablate=parse_ablations("A1,A2,A3"), **SMALL))
    ev = seen[-1]
    assert not ev.split and ev.rules.mb_rule == MB_FIXED
    assert all(t == 0 for _, t in r.variant.tau) and len(r.variants) == 2
    assert all(label.endswith("=0)") and "=1," not in label for label, _ in r.variants)
    assert all(not cv.phase_pairs for cv in ev._compiled.values())


def test_a5_restarts_from_the_seed_and_a9_cools(ppo, monkeypatch):
    chains = Calls(monkeypatch, anneal, "Chain")  # Chain(current, evaluation, t)
    optimize(ppo, OptimizeOptions(seed=2, search=SearchConfig(w_stag=2), **SMALL))
    temps = {a[2] for a in chains.args}
    assert temps == {SearchConfig().t_init, SearchConfig().t_warm}  # warm restarts happen
    chains = Calls(monkeypatch, anneal, "Chain")
    optimize(ppo, OptimizeOptions(seed=2, ablate=frozenset({"A5"}), search=SearchConfig(w_stag=2), **SMALL))
    assert {a[2] for a in chains.args} == {SearchConfig().t_init}
    accepts = Calls(monkeypatch, anneal, "accept")
    optimize(ppo, OptimizeOptions(seed=2, ablate=frozenset({"A9"}), **SMALL))
    ts = [a[3] for a in accepts.args]
    assert any(b < a for a, b in zip(ts, ts[1:]))  # geometric cooling lowers t within a chain


def test_a8_rejects_out_of_memory_plans_outright():
    assert objective_value(1000.0, 0.5, 1.01, hard=True) == -math.inf
    assert objective_value(1000.0, 0.5, 1.01) == pytest.approx(1000.0 * math.exp(-0.4))
    assert objective_value(1000.0, 0.5, 0.9, hard=True) == 1000.0
    assert not anneal.accept(anneal.random.Random(0), 10.0, -math.inf, 1.0)


def test_the_double_kernel_moves_two_vertices_that_share_devices(ppo):
    """Two-vertex moves: every proposal changes at most two vertices, and the second one
    shares a device with the first when some vertex does."""
    import random

    ev = Evaluator(load_hardware(ppo.cluster.hardware), CostOptions(), steps=2)
    cv = ev.compile(structural_candidates(ppo, (0,), False)[0])
    state = anneal.SearchState(ev, SearchConfig(p_double=1.0), random.Random(5))
    current = concurrent_plan(cv).choice
    moved = 0
    for _ in range(40):
        for p in anneal.double_kernel(state, cv, current):
            changed = [v for v in range(len(p)) if p[v] != current[v]]
            assert len(changed) <= 2
            if len(changed) == 2:
                u, w = changed
                masks = [cv.dirs[v].masks[x] for v, x in enumerate(current)]

                def alone(v):
                    return not any(masks[x] & masks[v] for x in range(len(masks)) if x != v)

                assert masks[u] & masks[w] or alone(u) or alone(w)  # apart only when the first had no neighbour
                moved += 1
    assert moved > 0


# --- stage fusion: a plan choice of the evaluator (A10 turns it off) -----------------------------------------

def fusing_workload():
    """PPO on 2 CPU workers with a 43.7M actor and 6.1M other models (bench/stage_fusion.py)."""
    from fixtures.programs import load_bench

    return load_bench("stage_fusion").fusing_workload()


def fused_choice(cv):
    """Both trainers on both workers as 2-stage pipelines of 4 microbatches (ZeRO 0, no recomputation), every other
    vertex at its fastest candidate."""
    def pick(v):
        d = cv.dirs[v]
        return next(i for i, (a, s) in enumerate(zip(d.allocs, d.strategies))
                    if a.extent == (1, 1, 2) and (s.dp, s.pp, s.tp, s.mb) == (1, 2, 1, 4) and s.train.recompute == "none")
    return tuple(pick(v) if cv.vertices[v].role == "training" else 0 for v in range(len(cv.vertices)))


def test_the_optimizer_writes_the_fusion_it_chose_and_what_it_gained():
    """A plan whose trainers fuse to its advantage comes out of the optimizer with `rpeg.fuse`, the summary says so,
    and the pass pipeline (with fuse-stages) prices it as the search did."""
    from rpegc.core.lower.fuse_stages import fuse_stages
    from rpegc.search.compact import better
    from rpegc.search.report import summary_rows

    p, hw = fusing_workload()
    hw = replace(hw, M_GPU=2e9)
    evaluator = Evaluator(hw, CostOptions(), 8, fuse=True)
    variant = structural_candidates(optimizer.base_structure(p), (0,), False)[0]
    cv = evaluator.compile(variant)
    choice = fused_choice(cv)
    apart, fused = cv.evaluate_as(choice, ()), cv.evaluate_as(choice, cv.fusion_groups(choice, *cv.placement(choice)))
    assert fused.fused and better(fused, apart) and fused.makespan < apart.makespan
    r = optimizer._result(evaluator, SearchConfig(), variant, choice, None, None, 0.0, "search")
    assert [f.vertices for f in r.program.plan.fusions] == [("train_actor", "train_critic")]
    assert r.evaluation.fused and r.fusion.chosen and r.fusion.apart == apart
    gain = fused.makespan / apart.makespan - 1.0
    assert dict(summary_rows(r))["stage fusion"] == (
        f"@train_actor + @train_critic fused: makespan {fused.makespan:.3f} s against {apart.makespan:.3f} s apart "
        f"({gain:+.1%})")
    low = fuse_stages(lower(unroll(r.program, 8)), hw)
    assert len(low.exec.fusions) == 8
    assert schedule_program(annotate(low, hw)).exec.schedule.makespan == r.evaluation.makespan
    baseline = optimizer._result(evaluator, SearchConfig(), variant, choice, None, None, 0.0, "concurrent")
    assert not baseline.program.plan.fusions and baseline.evaluation == replace(apart, peak=baseline.evaluation.peak)


def test_the_search_fuses_exactly_where_it_pays_and_A10_never():
    """Whatever plan a search returns, it runs fused if and only if fusing that placement prices better; with A10 no
    plan is ever priced fused."""
    from rpegc.search.compact import better
    from rpegc.search.report import summary_rows

    p, hw = fusing_workload()
    for evals in (1000, 3000):
        r = optimize(p, OptimizeOptions(budget_s=0, evals=evals, seed=0, ac=False, jobs=1), hw)
        f = r.fusion
        assert f.enabled and f.chosen == (f.fused is not None and better(f.fused, f.apart))
        assert bool(r.program.plan.fusions) == f.chosen == bool(r.evaluation.fused)
    off = optimize(p, OptimizeOptions(budget_s=0, evals=1000, seed=0, ac=False, jobs=1, ablate=frozenset({"A10"})), hw)
    assert not off.program.plan.fusions and not off.evaluation.fused and not off.fusion.enabled
    assert "not searched" in dict(summary_rows(off))["stage fusion"]
