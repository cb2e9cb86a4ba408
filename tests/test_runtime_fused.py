"""A fused plan in the runtime (issue 34, item 5, the controller's part; docs/stage-fusion.md): the controller hands a
fusion's members to the backend as one operator, the sim backend runs them from one start to one finish and replays
the schedule exactly, and `verify` accepts members holding their devices together and flags members that ran apart
(tests/test_torchrun_fused.py runs one on the torch backend)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rpegc import api
from rpegc.runtime.backends.sim import SimBackend
from rpegc.runtime.controller import RunOptions, device_order_edges, reserved_devices, run
from rpegc.runtime.plan import build_run_plan
from rpegc.runtime.verify import verify

SOURCE = (Path(__file__).resolve().parents[1] / "lit_tests" / "Inputs" / "ppo-fused-2.rpeg").read_text()
PIPELINE = "verify-wellformed,unroll{k=3},split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule"


@pytest.fixture(scope="module")
def plan():
    return build_run_plan(api.run_pipeline(SOURCE, PIPELINE, "ppo-fused-2.rpeg"))


def test_the_sim_backend_replays_a_fused_schedule_exactly(plan):
    result = run(plan, SimBackend(), RunOptions(policy="plan"))
    assert result.makespan == plan.predicted_makespan
    for n in plan.nodes:
        rec = result.trace.nodes[n.id]
        assert (rec.start, rec.finish) == (n.node.start, n.node.finish), n.id
    assert verify(plan, result.trace) == []
    assert len(plan.fusion_groups()) == 3


@pytest.mark.parametrize("policy, jitter", [("alg2", 0.0), ("plan", 0.3), ("alg2", 0.3)])
def test_fused_members_run_together_under_any_policy_and_jitter(plan, policy, jitter):
    result = run(plan, SimBackend(jitter=jitter, seed=7), RunOptions(policy=policy))
    for group in plan.fusion_groups():
        recs = {(result.trace.nodes[plan.nodes[i].id].start, result.trace.nodes[plan.nodes[i].id].finish)
                for i in group}
        assert len(recs) == 1
    assert verify(plan, result.trace) == []


def test_members_that_ran_apart_are_a_violation(plan):
    result = run(plan, SimBackend(), RunOptions(policy="plan"))
    first = plan.nodes[plan.fusion_groups()[0][1]].id
    rec = result.trace.nodes[first]
    late = dataclasses.replace(rec, start=rec.finish, finish=rec.finish + (rec.finish - rec.start))
    trace = dataclasses.replace(result.trace, nodes={**result.trace.nodes, first: late})
    rules = {v.rule for v in verify(plan, trace)}
    assert "fusion" in rules


def test_the_plan_order_treats_a_fusion_as_one_unit(plan):
    reserved = [reserved_devices(n, "destination") for n in plan.nodes]
    edges = device_order_edges(plan, reserved)
    for group in plan.fusion_groups():
        assert not any((u, v) in edges for u in group for v in group)  # no member waits for another
        before = {u for u, v in edges if v == group[0]}
        assert before and all((u, v) in edges for u in before for v in group)


def test_the_plan_hash_covers_the_fused_microtask_orders(plan):
    from rpegc.runtime.plan import plan_hash

    p = plan.program
    f = p.exec.fusions[0]
    swapped = (f.stages[0][1:2] + f.stages[0][:1] + f.stages[0][2:],) + f.stages[1:]
    other = dataclasses.replace(p, exec=dataclasses.replace(
        p.exec, fusions=(dataclasses.replace(f, stages=swapped),) + p.exec.fusions[1:]))
    assert plan_hash(other) != plan_hash(p) == plan.hash
    unfused = dataclasses.replace(p, exec=dataclasses.replace(p.exec, fusions=()))
    assert plan_hash(unfused) != plan.hash


@pytest.mark.parametrize("bad", [[[0, 0, "X", 0, 1.0, 2.0]], [[0, 0, "F", 0, 2.0, 1.0]], [[0, -1, "F", 0, 1.0, 2.0]],
                                 [[0, 0, "F", 0]], "F0.0"])
def test_a_malformed_microtask_record_is_a_located_trace_error(plan, bad):
    from rpegc.core.ir.errors import RpegError
    from rpegc.runtime.trace import trace_from_records, trace_records

    records = trace_records(run(plan, SimBackend(), RunOptions(policy="plan")).trace)
    i = next(k for k, r in enumerate(records) if r["type"] == "node")
    records[i] = {**records[i], "microtasks": bad}
    with pytest.raises(RpegError, match="'microtasks' must be a list of") as e:
        trace_from_records([(k + 1, r) for k, r in enumerate(records)], "t.jsonl")
    assert e.value.loc.line == i + 1
