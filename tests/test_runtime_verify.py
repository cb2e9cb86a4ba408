"""Execution verification (paper Sec. VII): tampered traces are rejected with the right rule."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.sim import SimBackend
from rpegc.runtime.controller import RunOptions, run
from rpegc.runtime.plan import build_run_plan
from rpegc.runtime.trace import read_trace, trace_from_records, trace_records, write_trace
from rpegc.runtime.verify import compare, verify
from fixtures.runtime_plans import disaggregated_plan, random_program, scheduled


@pytest.fixture(scope="module")
def ran():
    p = scheduled(disaggregated_plan(1), 3)
    plan = build_run_plan(p)
    result = run(plan, SimBackend(jitter=0.2, seed=4), RunOptions(policy="alg2"))
    assert verify(plan, result.trace) == []
    return plan, trace_records(result.trace)


def tampered(records, change):
    recs = copy.deepcopy(records)
    change(recs)
    return trace_from_records(list(enumerate(recs, start=1)))


def node(recs, node_id):
    return next(r for r in recs if r["type"] == "node" and r["id"] == node_id)


def rules(violations):
    return {v.rule for v in violations}


def two_ops(edges, alloc_b=(0, 0, 1, 4), policy="alg2"):
    """Two Op nodes a (1 s) and b (2 s) on the GPUs (0, 0, 0)+(1, 1, 4) and `alloc_b`."""
    p = random_program(["op", "op"], [(0, 0, 1, 4), alloc_b], [1.0, 2.0], edges, [0, 0])
    plan = build_run_plan(p)
    result = run(plan, SimBackend(), RunOptions(policy=policy))
    assert verify(plan, result.trace) == []
    return plan, trace_records(result.trace)


def test_untampered_trace_verifies_after_a_file_round_trip(ran, tmp_path):
    plan, records = ran
    trace = trace_from_records(list(enumerate(records, start=1)))
    path = tmp_path / "t.jsonl"
    write_trace(trace, str(path))
    again = read_trace(str(path))
    assert verify(plan, again) == []
    assert again.nodes == {k: replace(v, line=again.nodes[k].line) for k, v in trace.nodes.items()}


def test_a_nodes_wait_for_a_core_is_written_where_measured_and_read_back(ran, tmp_path):
    """A wall-clock backend's workers say how long a node's thread waited for a core (trace `waited`); a simulated
    run measures none and writes no field."""
    plan, records = ran
    assert not any("waited" in r for r in records)
    trace = trace_from_records(list(enumerate(records, start=1)))
    first = next(iter(trace.nodes))
    trace.nodes[first] = replace(trace.nodes[first], waited=0.00125)
    path = tmp_path / "t.jsonl"
    write_trace(trace, str(path))
    again = read_trace(str(path))
    assert again.nodes[first].waited == 0.00125 and verify(plan, again) == []
    assert {n.waited for k, n in again.nodes.items() if k != first} == {None}


def test_a_nodes_speed_witnesses_are_written_where_they_ran_and_read_back(ran, tmp_path):
    """A CPU run's workers and pool processes end their operators with the speed witness (trace `witness`, seconds
    each); a simulated run runs none and writes no field."""
    plan, records = ran
    assert not any("witness" in r for r in records)
    trace = trace_from_records(list(enumerate(records, start=1)))
    first = next(iter(trace.nodes))
    trace.nodes[first] = replace(trace.nodes[first], witness=(2.5e-4, 3e-4))
    path = tmp_path / "t.jsonl"
    write_trace(trace, str(path))
    again = read_trace(str(path))
    assert again.nodes[first].witness == (2.5e-4, 3e-4) and verify(plan, again) == []
    assert {n.witness for k, n in again.nodes.items() if k != first} == {()}


def test_swapped_version_is_rejected(ran):
    plan, records = ran
    # tau(actor) = 1: gen at step 2 reads v1. Claim it read v2.
    trace = tampered(records, lambda rs: node(rs, "gen#2.q1")["consumed"].update(actor=2))
    v = verify(plan, trace)
    assert rules(v) == {"version", "version-rule"}
    assert all(x.nodes == ("gen#2.q1",) for x in v)
    assert any("v2" in x.message and "v1" in x.message for x in v)


def test_wrong_produced_version_is_rejected(ran):
    plan, records = ran
    trace = tampered(records, lambda rs: node(rs, "train_actor#1")["produced"].update(actor=5))
    v = verify(plan, trace)
    assert {"version", "version-rule", "update-order"} <= rules(v)


def test_two_nodes_on_one_device_at_once_are_rejected():
    plan, records = two_ops([])  # independent, same GPUs: the run serialises them
    a, b = sorted((r for r in records if r["type"] == "node"), key=lambda r: r["start"])

    def overlap(rs):
        late = node(rs, b["id"])
        late["dispatch"] = late["start"] = a["start"] + 0.5
        late["finish"] = late["start"] + 2.0

    v = verify(plan, tampered(records, overlap))
    assert rules(v) == {"device", "worker"}
    assert v[0].nodes == (a["id"], b["id"])
    assert "at the same time" in v[0].message


def test_node_started_before_its_predecessor_is_rejected():
    plan, records = two_ops([(0, 1)], alloc_b=(1, 0, 1, 4))  # a -> b on disjoint GPUs

    def early(rs):
        node(rs, "v1#0")["dispatch"] = node(rs, "v1#0")["start"] = 0.25

    v = verify(plan, tampered(records, early))
    assert rules(v) == {"dependency"}
    assert v[0].nodes == ("v0#0", "v1#0")
    assert "before its predecessor v0#0 finished" in v[0].message


def test_plan_order_is_enforced_for_the_plan_policy():
    plan, records = two_ops([], policy="plan")
    first, second = sorted((r for r in records if r["type"] == "node"), key=lambda r: r["start"])

    def swap(rs):
        x, y = node(rs, first["id"]), node(rs, second["id"])
        y["dispatch"] = y["start"] = 0.0
        y["finish"] = 2.0
        x["dispatch"] = x["start"] = 2.0
        x["finish"] = 3.0

    v = verify(plan, tampered(records, swap))
    assert rules(v) == {"order"}


def test_early_release_is_rejected(ran):
    plan, records = ran

    def early(rs):
        rel = next(r for r in rs if r["type"] == "release" and r["artifact"].startswith("data %v#1"))
        rel["time"] = 0.0

    v = verify(plan, tampered(records, early))
    assert rules(v) == {"release"}
    assert any("still needed it" in x.message for x in v)


def test_missing_node_and_wrong_binding_are_rejected(ran):
    plan, records = ran
    trace = tampered(records, lambda rs: rs.remove(node(rs, "train_critic#2")))
    assert "node-set" in rules(verify(plan, trace))
    trace = tampered(records, lambda rs: node(rs, "gen#0.q1").update(devices=[0, 1, 2], workers=[0, 1, 2]))
    v = verify(plan, trace)
    assert "binding" in rules(v) and any(x.nodes == ("gen#0.q1",) for x in v)
    trace = tampered(records, lambda rs: node(rs, "gen#0.q1").update(strategy=[2, 1, 2, 1]))
    assert rules(verify(plan, trace)) == {"binding"}


def test_trace_of_another_plan_is_rejected_by_hash(ran):
    plan, records = ran
    other = build_run_plan(scheduled(disaggregated_plan(0), 3))
    v = verify(other, trace_from_records(list(enumerate(records, start=1))))
    assert [x.rule for x in v] == ["plan-hash"]


def test_versions_are_checked_against_tau_not_only_the_plan():
    # A plan unrolled with tau(actor) = 1 but whose graph now claims tau = 0: the plan's own
    # version_in no longer matches the staleness semantics, and verify says so.
    p = scheduled(disaggregated_plan(1), 3)
    g = p.graph
    p0 = replace(p, graph=replace(g, staleness=(("actor", 0), ("critic", 0))))
    plan = build_run_plan(p0)
    v = verify(plan, run(plan, SimBackend()).trace)
    assert rules(v) == {"version-rule"}
    assert {x.nodes[0] for x in v} == {"gen#1.q1", "gen#1.q2", "gen#1.q3", "gen#2.q1", "gen#2.q2", "gen#2.q3"}


def test_malformed_trace_files_are_located_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header"\n')
    with pytest.raises(RpegError) as e:
        read_trace(str(bad))
    assert e.value.loc.line == 1 and "invalid JSON" in e.value.message
    bad.write_text(json.dumps({"type": "node", "id": "x"}) + "\n")
    with pytest.raises(RpegError, match="first record must be the header"):
        read_trace(str(bad))
    with pytest.raises(RpegError, match="cannot read the trace"):
        read_trace(str(tmp_path / "missing.jsonl"))


def test_compare_reports_predicted_and_measured(ran):
    plan, records = ran
    cmp = compare(plan, trace_from_records(list(enumerate(records, start=1))))
    assert len(cmp.nodes) == len(plan.nodes)
    assert cmp.predicted_makespan == plan.predicted_makespan
    assert 0.0 < cmp.mean_abs_rel_error <= 0.2  # uniform jitter of +-20 %
    row = next(t for t in cmp.nodes if t.id == "gen#0.q1")
    assert row.predicted_time == plan.node("gen#0.q1").node.time


def test_a_resumed_run_verifies_against_the_whole_plan():
    """A run resumed at step s executes plan.from_step(s); its trace header records s, so the trace
    checks against the plan file as compiled (the steps before s are not missing), and only there."""
    plan = build_run_plan(scheduled(disaggregated_plan(1), 3))
    rest = plan.from_step(1)
    assert {n.step for n in rest.nodes} == {1, 2} and rest.first_step == 1
    assert all(a.kind == "weights" for a in rest.initial)
    result = run(rest, SimBackend(), RunOptions(policy="alg2"))
    records = trace_records(result.trace)
    assert records[0]["first_step"] == 1
    assert verify(plan, result.trace) == [] and verify(rest, result.trace) == []
    assert len(compare(plan, result.trace).nodes) == len(rest.nodes)
    dropped = tampered(records, lambda rs: rs.remove(node(rs, "train_critic#2")))
    assert "node-set" in rules(verify(plan, dropped))
    as_full = tampered(records, lambda rs: rs[0].update(first_step=0))  # claims to be the whole run
    assert "node-set" in rules(verify(plan, as_full))
    with pytest.raises(RpegError, match="first_step"):
        tampered(records, lambda rs: rs[0].update(first_step=-1))


def _trace_file(records, tmp_path, index, text_change):
    """The trace as JSON lines with line `index` (0-based) changed textually; returns (path, that line)."""
    lines = [json.dumps(r, separators=(",", ":")) for r in records]
    lines[index] = text_change(lines[index])
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), lines[index]


def _set(key, value):
    """Set `key` to the raw JSON text `value` (which may be NaN or nested too deep to build as a dict)."""
    def change(line):
        rec = json.loads(line)
        rec[key] = "@@"
        return json.dumps(rec, separators=(",", ":")).replace('"@@"', value)
    return change


@pytest.mark.parametrize("key,value,message", [
    ("finish", "NaN", r"'NaN' is not a JSON number"),
    ("finish", "1e999", r"too large"),
    ("start", "-1", r"'start' must be a finite number >= 0, got -1"),
    ("waited", "-0.5", r"'waited' must be a finite number >= 0, got -0.5"),
    ("waited", '"long"', r"'waited' must be a finite number >= 0"),
    ("witness", "[0.1,-2]", r"'witness' must be a list of finite numbers >= 0"),
    ("witness", "0.5", r"'witness' must be a list of finite numbers >= 0"),
    ("bytes", "-1", r"'bytes' must be an integer >= 0, got -1"),
    ("finish", "0", r"finish 0\.0 is before start"),
    ("step", "true", r"'step' must be an integer >= 0, got true"),
    ("kind", '"send"', r"'kind' is 'send'; expected op or comm or reshard"),
    ("devices", '[0,"x"]', r"'devices' must be a list of integers"),
    ("consumed", '{"actor":-2}', r"'consumed' must be an object \{model: version\} with versions >= 0"),
    ("strategy", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
     r"more than 64 levels deep"),
])
def test_bad_trace_records_are_located_at_line_and_value(ran, tmp_path, key, value, message):
    plan, records = ran
    index = next(i for i, r in enumerate(records) if r["type"] == "node" and r["start"] > 0)
    path, line = _trace_file(records, tmp_path, index, _set(key, value))
    with pytest.raises(RpegError, match=message) as e:
        read_trace(path)
    assert e.value.loc.line == index + 1
    assert e.value.loc.col > 1 and line[e.value.loc.col - 1 - len(f'"{key}":'):].startswith(f'"{key}":') or \
        "levels deep" in message


def test_unknown_trace_fields_are_errors(ran, tmp_path):
    plan, records = ran
    path, line = _trace_file(records, tmp_path, 0, lambda s: s[:-1] + ',"colour":1}')
    with pytest.raises(RpegError, match=r"unknown field 'colour' in a 'header' record") as e:
        read_trace(path)
    assert (e.value.loc.line, e.value.loc.col) == (1, line.index('"colour"') + len('"colour":') + 1)


def test_a_plan_with_other_times_is_another_plan(ran):
    """The hash covers the node times: a trace does not verify against a re-annotated plan."""
    plan, records = ran
    p = plan.program
    g = p.exec
    other = build_run_plan(replace(p, exec=replace(g, nodes=(g.nodes[0].with_(time=g.nodes[0].time * 2),)
                                                   + g.nodes[1:])))
    v = verify(other, trace_from_records(list(enumerate(records, start=1))))
    assert [x.rule for x in v] == ["plan-hash"]


def test_trace_writer_never_writes_nan(tmp_path):
    from rpegc.runtime.trace import TraceWriter

    w = TraceWriter(str(tmp_path / "t.jsonl"))
    try:
        with pytest.raises(RpegError, match=r"cannot write a 'node' record: the value at finish is not a finite"):
            w({"type": "node", "finish": float("nan")})
    finally:
        w.close()
    assert (tmp_path / "t.jsonl").read_text() == ""
