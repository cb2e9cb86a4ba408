"""Graph realization (Alg. 2 line 1): loading plans without xDSL, validation, artifacts, plan hash."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import MemoryReport
from rpegc.core.ir.geometry import Alloc
from rpegc.runtime.plan import build_run_plan, load_plan, plan_hash
from rpegc.syntax.json_form import program_to_json
from fixtures.runtime_plans import colocated_plan, disaggregated_plan, lower, scheduled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_json(p, path) -> str:
    path.write_text(json.dumps(program_to_json(p)))
    return str(path)


def test_load_json_plan(tmp_path):
    p = scheduled(disaggregated_plan(1), 3)
    plan = load_plan(write_json(p, tmp_path / "p.json"))
    assert plan.program == p
    assert plan.steps == plan.plan_steps == 3
    assert [n.id for n in plan.nodes] and len(plan.nodes) == len(p.exec.nodes)
    pos = {n.id: n.index for n in plan.nodes}
    for e in p.exec.edges:  # nodes are in a topological order
        assert pos[e.src] < pos[e.dst]
    assert plan.predicted_makespan == p.exec.schedule.makespan


def test_a_plan_knows_the_cluster_nodes_its_devices_lie_on(tmp_path):
    """What a local run's report holds against the cost model's hosts (report.oversubscription): flat nodes of the
    racks x nodes x gpus cluster."""
    assert load_plan(write_json(scheduled(disaggregated_plan(1), 2), tmp_path / "d.json")).nodes_used == 4
    assert load_plan(write_json(scheduled(colocated_plan(0), 2), tmp_path / "c.json")).nodes_used == 1


def test_load_text_plan(tmp_path):
    printer = pytest.importorskip("rpegc.syntax.printer")
    p = scheduled(disaggregated_plan(1), 2)
    path = tmp_path / "p.exec.rpeg"
    path.write_text(printer.print_program(p))
    assert load_plan(str(path)).hash == plan_hash(p)


def test_runtime_never_imports_xdsl(tmp_path):
    path = write_json(scheduled(disaggregated_plan(1), 2), tmp_path / "p.json")
    code = (
        "import sys\n"
        "from rpegc.runtime.cli import main\n"
        f"rc = main([{path!r}, '--quiet', '--trace', {str(tmp_path / 't.jsonl')!r}])\n"
        f"rc |= main(['verify', {path!r}, {str(tmp_path / 't.jsonl')!r}])\n"
        "bad = sorted(m for m in sys.modules if m == 'xdsl' or m.startswith('xdsl.'))\n"
        "print('XDSL', bad)\n"
        "sys.exit(rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "XDSL []" in out.stdout


def test_plan_must_be_lowered():
    p = colocated_plan(0)
    from rpegc.core.lower.unroll import unroll

    with pytest.raises(RpegError, match="not lowered"):
        build_run_plan(unroll(p, 2))
    with pytest.raises(RpegError, match="no exec.graph"):
        build_run_plan(p)
    with pytest.raises(RpegError, match="rpeg.graph"):
        build_run_plan(replace(lower(p, 1), graph=None))


def test_steps_are_bounded_by_the_unrolled_horizon():
    p = scheduled(colocated_plan(0), 2)
    with pytest.raises(RpegError, match=r"unrolled for 2 step.*unroll\{k=5\}"):
        build_run_plan(p, steps=5)
    with pytest.raises(RpegError, match="choose 1..2"):
        build_run_plan(p, steps=0)
    assert {n.step for n in build_run_plan(p, steps=1).nodes} == {0}


def test_missing_comm_is_a_plan_error():
    p = scheduled(disaggregated_plan(0, quantiles=False), 1)
    g = p.exec
    comm = next(n for n in g.nodes if n.kind == "comm" and n.container == "v")
    src = next(e.src for e in g.edges if e.dst == comm.id)
    dsts = [e.dst for e in g.edges if e.src == comm.id]
    from rpegc.core.ir.exec_graph import ExecEdge

    edges = tuple(e for e in g.edges if comm.id not in (e.src, e.dst)) + tuple(ExecEdge(src, d) for d in dsts)
    broken = replace(p, exec=replace(g, nodes=tuple(n for n in g.nodes if n.id != comm.id), edges=edges))
    with pytest.raises(RpegError, match=r"reads %v of step 0 .* lacks a Comm"):
        build_run_plan(broken)


def test_missing_dependency_on_a_version_is_a_plan_error():
    p = scheduled(disaggregated_plan(1, quantiles=False), 3)
    g = p.exec
    # Drop the publication Comm's edge into gen#2: it could then read v1 before it arrives.
    comm = next(n for n in g.nodes if n.kind == "comm" and n.model == "actor" and n.step == 2)
    edges = tuple(e for e in g.edges if not (e.src == comm.id and e.dst == "gen#2"))
    with pytest.raises(RpegError, match=r"gen#2 reads weights @actor v1 .* no predecessor produces it"):
        build_run_plan(replace(p, exec=replace(g, edges=edges)))


def test_artifacts_producers_and_consumers():
    plan = build_run_plan(scheduled(disaggregated_plan(1, quantiles=True), 3))
    gen_alloc = Alloc((0, 0, 0), (1, 1, 4))
    # Version 0 of every model is installed where it is read; later versions are produced.
    assert {(a.name, a.index) for a in plan.initial} == {("actor", 0), ("ref", 0), ("critic", 0), ("reward", 0)}
    v1 = next(a for a in plan.producers if a.kind == "weights" and a.name == "actor" and a.index == 1
              and a.alloc == gen_alloc)
    assert [plan.nodes[i].kind for i in plan.producers[v1]] == ["comm"]
    assert {plan.nodes[i].id for i in plan.consumers[v1]} == {"gen#2.q1", "gen#2.q2", "gen#2.q3"}
    # A phase Comm moves one phase of %Y; a whole-container reader on the generation GPUs reads all phases.
    phase_comm = next(n for n in plan.nodes if n.kind == "comm" and n.node.fraction is not None)
    assert phase_comm.inputs[0].phase == phase_comm.outputs[0].phase is not None
    final = {a for a in plan.retained if a.kind == "weights"}
    assert {(a.name, a.index) for a in final} == {("actor", 3), ("critic", 3)}


def test_inputs_and_outputs_are_the_bindings_the_lowering_wrote():
    """The runtime locates what each node binds (an Op on its allocation, a transfer from its source to its
    destination) and derives nothing: the plan's data_in/data_out and version_in/version_out are the inputs
    and outputs, one to one."""
    plan = build_run_plan(scheduled(disaggregated_plan(1, quantiles=True), 2))
    for n in plan.nodes:
        x = n.node
        src = x.alloc if n.kind == "op" else x.src_alloc
        assert [(a.name, a.phase, a.alloc) for a in n.inputs if a.kind == "data"] == \
            [(d.container, d.phase, src) for d in x.data_in]
        assert [(a.name, a.phase, a.alloc) for a in n.outputs if a.kind == "data"] == \
            [(d.container, d.phase, x.alloc) for d in x.data_out]
        assert all(a.index == x.step for a in n.inputs + n.outputs if a.kind == "data")
        assert [(a.name, a.index) for a in n.inputs if a.kind == "weights"] == list(x.version_in)
    # A Comm from a split generation to a whole-container reader gathers the phases into the whole container.
    gather = [n for n in plan.nodes if n.kind == "comm" and len(n.inputs) > 1]
    assert gather and all({a.phase for a in n.inputs} == {1, 2, 3} and [a.phase for a in n.outputs] == [None]
                          for n in gather)
    # Bytes of a phase copy are its share of the container.
    phase = next(a for a in plan.artifact_bytes if a.kind == "data" and a.phase == 1 and a.name == "Y")
    whole = next(b for a, b in plan.artifact_bytes.items() if a.kind == "data" and a.phase is None and a.name == "Y")
    assert plan.artifact_bytes[phase] < whole


def test_colocated_async_reshard_depends_on_the_version_it_moves():
    # insert-reshard puts a Reshard between gen#k and train_actor#k on shared GPUs also when tau > 0;
    # the version it moves (k) is produced by train_actor#k-1, so the Reshard depends on it and binds it.
    plan = build_run_plan(scheduled(colocated_plan(1), 3))
    reshards = [n for n in plan.nodes if n.kind == "reshard" and n.step > 0]
    assert reshards
    for n in reshards:
        (a,) = n.inputs
        assert any(plan.nodes[u].kind == "op" and a in plan.nodes[u].outputs for u in plan.producers[a])


def _edit_node(p, node_id, **change):
    g = p.exec
    return replace(p, exec=replace(g, nodes=tuple(n.with_(**change) if n.id == node_id else n for n in g.nodes)))


def test_bindings_that_disagree_with_the_graph_are_plan_errors():
    from rpegc.core.ir.exec_graph import DataRef

    p = scheduled(disaggregated_plan(0, quantiles=True), 1)
    train = next(n for n in p.exec.nodes if n.vertex == "train_critic")
    dropped = tuple(d for d in train.data_in if d.container != "v")
    with pytest.raises(RpegError, match=r"train_critic#0 binds no copy of %v .* recompile the plan"):
        build_run_plan(_edit_node(p, train.id, data_in=dropped))
    with pytest.raises(RpegError, match=r"train_critic#0 writes %Y, which vertex @train_critic does not write"):
        build_run_plan(_edit_node(p, train.id, data_out=(DataRef("Y"),)))
    comm = next(n for n in p.exec.nodes if n.kind == "comm" and n.fraction is not None)
    with pytest.raises(RpegError, match=r"binds %Y phase 4, but graph @\w+ has 3 quantile phase"):
        build_run_plan(_edit_node(p, comm.id, data_out=(DataRef("Y", 4),)))
    with pytest.raises(RpegError, match=r"moves %Y but binds no copy to write"):
        build_run_plan(_edit_node(p, comm.id, data_out=()))
    # A reader that binds a later phase than its own reads a copy that arrives after it may start.
    reader = next(n for n in p.exec.nodes if n.kind == "op" and n.phase == 2 and n.role == "inference")
    wrong = tuple(DataRef(d.container, 3) if d.container == "Y" else d for d in reader.data_in)
    with pytest.raises(RpegError, match=rf"{reader.id} reads data %Y#0.q3 .* no predecessor produces it"):
        build_run_plan(_edit_node(p, reader.id, data_in=wrong))


def test_plan_hash_covers_everything_the_run_depends_on():
    p = scheduled(disaggregated_plan(1), 2)
    g = p.exec
    # A re-annotated time (even float noise) is another plan: the sim runs on these times.
    noisy = replace(p, exec=replace(g, nodes=tuple(n.with_(time=n.time * (1 + 1e-12)) for n in g.nodes)))
    assert plan_hash(noisy) != plan_hash(p)
    first = g.nodes[0]
    for change in (dict(start=first.start + 1.0, finish=first.finish + 1.0), dict(finish=first.finish * 2)):
        assert plan_hash(replace(p, exec=replace(g, nodes=(first.with_(**change),) + g.nodes[1:]))) != plan_hash(p)
    assert plan_hash(replace(p, exec=replace(g, schedule=replace(g.schedule, makespan=1.0)))) != plan_hash(p)
    assert plan_hash(replace(p, exec=replace(g, edges=g.edges[1:]))) != plan_hash(p)
    assert plan_hash(replace(p, cluster=replace(p.cluster, hardware="h100-80g"))) != plan_hash(p)
    assert plan_hash(replace(p, workload=replace(p.workload, B=p.workload.B * 2))) != plan_hash(p)
    assert plan_hash(replace(p, file="elsewhere.rpeg")) == plan_hash(p)  # where it was read from is not the plan
    assert plan_hash(replace(p, graph=replace(p.graph, staleness=(("actor", 0),)))) != plan_hash(p)
    moved = replace(p, exec=replace(g, nodes=(g.nodes[0].with_(bytes=g.nodes[0].bytes + 1),) + g.nodes[1:]))
    assert plan_hash(moved) != plan_hash(p)
    # Another schedule order is another plan.
    late = max(g.nodes, key=lambda n: n.start)
    reordered = replace(p, exec=replace(g, nodes=tuple(
        n.with_(start=-1.0, finish=-0.5) if n.id == late.id else n for n in g.nodes)))
    assert plan_hash(reordered) != plan_hash(p)


def test_bad_plan_files_are_located_errors(tmp_path):
    with pytest.raises(RpegError, match="cannot read the plan file"):
        load_plan(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"workload": {"B": 1,}')
    with pytest.raises(RpegError) as e:
        load_plan(str(bad))
    assert e.value.loc.file == str(bad) and e.value.loc.line == 1 and "invalid JSON" in e.value.message


def _with_first(p, **change):
    g = p.exec
    return replace(p, exec=replace(g, nodes=(g.nodes[0].with_(**change),) + g.nodes[1:]))


@pytest.mark.parametrize("make,message", [
    (lambda p: replace(p, exec=replace(p.exec, steps=1000000)), r"the plan says 1000000 step\(s\), but its nodes end at step 1"),
    (lambda p: replace(p, exec=replace(p.exec, steps=1)), r"is in step 1, but the plan has 1 step"),
    (lambda p: _with_first(p, start=math.nan), r"has start nan; times must be finite, >= 0 and at most 1e\+09 s"),
    (lambda p: _with_first(p, start=-1.0), r"has start -1\.0"),
    (lambda p: _with_first(p, time=math.inf), r"has time inf"),
    (lambda p: _with_first(p, start=1.0, finish=0.5), r"finishes at 0\.5, before it starts at 1\.0"),
    (lambda p: _with_first(p, bytes=-1), r"moves -1 bytes"),
    (lambda p: replace(p, exec=replace(p.exec, memory=MemoryReport(peak=((0, -1.0),), persistent=(), transient=(),
                                                                   m_eff=1.0, r_peak=0.5, feasible=True))),
     r"exec.memory peak of device 0 is -1\.0"),
    (lambda p: replace(p, exec=replace(p.exec, schedule=replace(p.exec.schedule, makespan=math.nan))),
     r"exec.schedule makespan is nan"),
])
def test_inconsistent_plans_are_rejected_whatever_their_form(make, message):
    """The plan loader's own checks, for plans from the text form or built in memory."""
    with pytest.raises(RpegError, match=message):
        build_run_plan(make(scheduled(disaggregated_plan(1), 2)))


def test_a_plan_file_is_checked_as_rpegc_checks_it(tmp_path):
    """rpeg-run accepted plan files rpegc rejects: an allocation larger than dp*pp*tp, a container size dividing by
    zero, an unknown hardware profile; and what neither checked: a node with a finish but no start, a Comm node
    publishing a version (ignored before) (issue 33, item 5)."""
    good = program_to_json(scheduled(disaggregated_plan(1), 1))
    cases = [
        (lambda d: d["plan"]["placements"][0].update(extent=[1, 1, 1000]), r"extent \(1, 1, 1000\)"),
        (lambda d: next(c for c in d["rpeg_graph"]["containers"] if c["dims"]).update(dims=["B/0", "Lp"]),
         "divides by zero"),
        (lambda d: d["cluster"].update(hardware="nope"), "unknown hardware profile 'nope'"),
        (lambda d: d["nodes"][0].pop("start"), "has a finish but no start"),
        (lambda d: next(n for n in d["nodes"] if n["kind"] == "comm").update(version_out={"actor": 99}),
         "publishes @actor version 99; a transfer publishes no version"),
    ]
    for i, (tamper, message) in enumerate(cases):
        doc = json.loads(json.dumps(good))
        tamper(doc)
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(RpegError, match=message):
            load_plan(str(path))
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good))
    assert load_plan(str(path)).steps == 1
