"""The completion-driven controller on the sim backend (paper Alg. 2): it replays the schedule when
durations match the predictions, stays valid under jitter, and scales to 2,048 devices."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.sim import SimBackend
from rpegc.runtime.controller import RunOptions, device_order_edges, reserved_devices, run
from rpegc.runtime.plan import build_run_plan
from rpegc.runtime.verify import compare, verify
from fixtures.runtime_plans import (
    big_plan,
    colocated_plan,
    disaggregated_plan,
    random_program,
    scheduled,
)

PLANS = [
    ("colocated", lambda: scheduled(colocated_plan(0), 3)),
    ("colocated-async", lambda: scheduled(colocated_plan(1), 3)),
    ("disaggregated", lambda: scheduled(disaggregated_plan(1, quantiles=True), 4)),
    ("disaggregated-sync", lambda: scheduled(disaggregated_plan(0, quantiles=False), 3)),
    ("zero-time-transfers", lambda: scheduled(disaggregated_plan(1, quantiles=True), 3, zero_every=3)),
]


@pytest.mark.parametrize("name,make", PLANS, ids=[n for n, _ in PLANS])
def test_plan_policy_replays_the_schedule_exactly(name, make):
    p = make()
    plan = build_run_plan(p)
    result = run(plan, SimBackend(), RunOptions(policy="plan"))
    recs = result.trace.nodes
    for n in p.exec.nodes:
        assert recs[n.id].start == n.start, n.id
        assert recs[n.id].finish == n.finish, n.id
    assert result.makespan == p.exec.schedule.makespan
    assert verify(plan, result.trace) == []


class SlowWait(SimBackend):
    """A sim backend whose wait() blocks 20 ms, like a backend waiting for its workers."""

    def wait(self):
        time.sleep(0.02)
        return super().wait()


def test_the_controllers_own_time_leaves_out_the_waits():
    plan = build_run_plan(PLANS[0][1]())
    result = run(plan, SlowWait())
    waits = len({r.finish for r in result.trace.nodes.values()})  # at least one wait per distinct finish time
    assert 0 < result.controller_s < result.wall_s - 0.02 * waits * 0.9


@pytest.mark.parametrize("name,make", PLANS, ids=[n for n, _ in PLANS])
def test_alg2_policy_is_valid_and_never_waits_on_predicted_times(name, make):
    p = make()
    plan = build_run_plan(p)
    result = run(plan, SimBackend(), RunOptions(policy="alg2"))
    assert verify(plan, result.trace) == []
    # Completion-driven: every node starts when its last predecessor (or a device) freed up, i.e. at
    # t = 0 or at some node's finish time; never at a planned start that no completion explains.
    finishes = {r.finish for r in result.trace.nodes.values()} | {0.0}
    assert all(r.start in finishes for r in result.trace.nodes.values())


def test_alg2_dispatch_order_is_step_then_transfers_then_topological():
    # Everything on one 8-GPU node: only one node runs at a time, so the ready order decides.
    p = scheduled(colocated_plan(0), 2)
    plan = build_run_plan(p)
    trace = run(plan, SimBackend(), RunOptions(policy="alg2")).trace
    by_start = sorted(trace.nodes.values(), key=lambda r: (r.start, r.finish))
    # r1 (the Reshard before train_actor#0) is dispatched as soon as gen#0 completes, ahead of the
    # ready Op nodes of step 0, because transfers come first within a step.
    order = [r.id for r in by_start]
    assert order.index("r1") == order.index("gen#0") + 1
    steps = [r.step for r in by_start]
    assert steps == sorted(steps)  # step 0 finishes before step 1 starts on a single shared node


@given(st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_dags_replay_alg5_exactly(data):
    n = data.draw(st.integers(2, 14))
    kinds = data.draw(st.lists(st.sampled_from(["op", "op", "comm", "reshard"]), min_size=n, max_size=n))
    allocs = data.draw(st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(1, 1), st.sampled_from([1, 2, 4]))
        .map(lambda a: (a[0], min(a[1], 4 - a[3]), a[2], a[3])), min_size=n, max_size=n))
    times = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.25, 2.0, 3.7]), min_size=n, max_size=n))
    times[0] = 1.0
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges = data.draw(st.lists(st.sampled_from(pairs), max_size=2 * n, unique=True))
    steps = sorted(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    p = random_program(kinds, allocs, times, edges, steps)
    plan = build_run_plan(p)
    result = run(plan, SimBackend(), RunOptions(policy="plan"))
    for node in p.exec.nodes:
        assert result.trace.nodes[node.id].start == node.start
    assert result.makespan == p.exec.schedule.makespan
    assert verify(plan, result.trace) == []
    jittered = run(plan, SimBackend(jitter=0.5, seed=data.draw(st.integers(0, 99))), RunOptions(policy="alg2"))
    assert verify(plan, jittered.trace) == []


@pytest.mark.parametrize("policy", ["plan", "alg2"])
@pytest.mark.parametrize("dist,x", [("uniform", 0.4), ("lognormal", 0.5)])
def test_jittered_runs_verify(policy, dist, x):
    p = scheduled(disaggregated_plan(1), 4)
    plan = build_run_plan(p)
    result = run(plan, SimBackend(jitter=x, distribution=dist, seed=7), RunOptions(policy=policy))
    assert verify(plan, result.trace) == []
    assert result.makespan != p.exec.schedule.makespan
    cmp = compare(plan, result.trace)
    assert cmp.mean_abs_rel_error > 0.01


def test_jitter_is_reproducible_from_the_seed():
    plan = build_run_plan(scheduled(disaggregated_plan(1), 3))
    a = run(plan, SimBackend(jitter=0.3, seed=5)).trace
    b = run(plan, SimBackend(jitter=0.3, seed=5)).trace
    c = run(plan, SimBackend(jitter=0.3, seed=6)).trace
    assert [(r.id, r.start, r.finish) for r in a.nodes.values()] == [(r.id, r.start, r.finish) for r in b.nodes.values()]
    assert a.makespan != c.makespan


def test_plan_policy_keeps_the_planned_device_order_under_jitter():
    p = scheduled(disaggregated_plan(1), 4)
    plan = build_run_plan(p)
    trace = run(plan, SimBackend(jitter=0.6, seed=2), RunOptions(policy="plan")).trace
    reserved = [reserved_devices(n, "destination") for n in plan.nodes]
    for u, v in device_order_edges(plan, reserved):
        assert trace.nodes[plan.nodes[v].id].start >= trace.nodes[plan.nodes[u].id].finish


def test_versions_and_releases_follow_the_plan():
    p = scheduled(disaggregated_plan(1), 4)
    plan = build_run_plan(p)
    trace = run(plan, SimBackend()).trace
    # tau(actor) = 1: generation at step k reads max(0, k - 1); training at step k reads k, writes k + 1.
    assert [dict(trace.nodes[f"gen#{k}.q1"].consumed)["actor"] for k in range(4)] == [0, 0, 1, 2]
    assert [dict(trace.nodes[f"train_actor#{k}"].consumed)["actor"] for k in range(4)] == [0, 1, 2, 3]
    assert [dict(trace.nodes[f"train_actor#{k}"].produced)["actor"] for k in range(4)] == [1, 2, 3, 4]
    released = {e.artifact: e.time for e in trace.events if e.kind == "release"}
    # The final actor version stays; older copies on the training GPUs are released once used.
    assert "weights @actor v4 @(1,0,0)+(1,1,4)" not in released
    assert "weights @actor v1 @(1,0,0)+(1,1,4)" in released
    assert released["weights @actor v1 @(1,0,0)+(1,1,4)"] >= trace.nodes["train_actor#1"].finish
    # Every data artifact is freed (the graph declares no outputs), right after its last reader.
    data = [a for a in plan.producers if a.kind == "data"]
    assert data and all(a.label in released for a in data)
    for a in data:
        readers = [trace.nodes[plan.nodes[i].id].finish for i in plan.consumers.get(a, ())]
        assert released[a.label] == max(readers + [trace.nodes[plan.nodes[i].id].finish for i in plan.producers[a]])
    # Nothing leaks: every artifact but the results is released by the end.
    made = {a.label for a in list(plan.producers) + list(plan.initial)}
    assert made - {a.label for a in plan.retained} == set(released)


def test_prefix_of_the_steps_runs_and_verifies():
    p = scheduled(disaggregated_plan(1), 4)
    plan = build_run_plan(p, steps=2)
    result = run(plan, SimBackend())
    assert {r.step for r in result.trace.nodes.values()} == {0, 1}
    assert result.trace.header.steps == 2 and result.trace.header.plan_steps == 4
    assert verify(build_run_plan(p), result.trace) == []  # verify restricts the full plan itself
    assert result.makespan <= max(n.finish for n in p.exec.nodes if n.step < 2)


def test_endpoint_reservation_holds_both_ends_of_a_transfer():
    p = scheduled(disaggregated_plan(1), 3)
    plan = build_run_plan(p)
    result = run(plan, SimBackend(), RunOptions(reserve="endpoints"))
    comm = next(n for n in plan.nodes if n.kind == "comm")
    assert set(result.trace.nodes[comm.id].devices) == set(comm.devices) | set(comm.src_devices)
    assert verify(plan, result.trace) == []
    assert result.makespan >= p.exec.schedule.makespan - 1e-9


def test_sim_needs_annotated_times():
    p = scheduled(colocated_plan(0), 1)
    from dataclasses import replace

    g = p.exec
    stripped = replace(p, exec=replace(g, nodes=(g.nodes[0].with_(time=None),) + g.nodes[1:]))
    with pytest.raises(RpegError, match="annotate-cost"):
        run(build_run_plan(stripped), SimBackend())


def test_bad_jitter_settings_are_user_errors():
    with pytest.raises(RpegError, match="jitter"):
        SimBackend(jitter=1.5)
    with pytest.raises(RpegError, match="distribution"):
        SimBackend(jitter=0.1, distribution="gamma")


def test_plan_policy_needs_a_schedule():
    p = scheduled(colocated_plan(0), 1)
    from dataclasses import replace

    g = p.exec
    unscheduled = replace(p, exec=replace(g, nodes=tuple(n.with_(start=None, finish=None) for n in g.nodes)))
    plan = build_run_plan(unscheduled)
    with pytest.raises(RpegError, match="schedule pass"):
        run(plan, SimBackend(), RunOptions(policy="plan"))
    assert run(plan, SimBackend()).policy == "alg2"  # auto falls back


def test_2048_devices_8_steps():
    p = scheduled(big_plan(), 8)
    t0 = time.perf_counter()
    plan = build_run_plan(p)
    result = run(plan, SimBackend(jitter=0.2, seed=1))
    violations = verify(plan, result.trace)
    elapsed = time.perf_counter() - t0
    assert len(plan.devices) == 2048 and plan.steps == 8
    assert violations == []
    assert len(result.trace.nodes) == len(p.exec.nodes)
    print(f"2048 devices, K=8: {len(plan.nodes)} nodes, build+run+verify {elapsed:.2f} s")


class OneAtATime(SimBackend):
    """Reports one completion per wait(), later ones first: completions from real worker processes
    arrive one by one and in no particular order."""

    def __init__(self):
        super().__init__()
        self.pending = []

    def wait(self):
        if not self.pending:
            self.pending = super().wait()
        return [self.pending.pop()]


@pytest.mark.parametrize("policy", ["plan", "alg2"])
def test_controller_handles_completions_one_at_a_time(policy):
    p = scheduled(disaggregated_plan(1), 3, zero_every=4)
    plan = build_run_plan(p)
    result = run(plan, OneAtATime(), RunOptions(policy=policy))
    assert verify(plan, result.trace) == []
    if policy == "plan":
        assert result.makespan == p.exec.schedule.makespan


def test_a_clock_that_would_overflow_is_a_located_error():
    """Times are bounded (<= 1e9 s) when read, but a backend built on the sim may stretch them (the plugin's
    slow-sim `--slowdown 1e308`): the simulated clock then stops with an error at the node, not at inf."""

    class Stretched(SimBackend):
        def factor(self, node_id: str) -> float:
            return 1e308

    plan = build_run_plan(scheduled(colocated_plan(0), 1))
    with pytest.raises(RpegError, match="the simulated clock overflows"):
        run(plan, Stretched(), RunOptions(policy="alg2"))
