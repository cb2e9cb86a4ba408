"""Gantt charts of scheduled exec graphs: files are written for small and large clusters, rows collapse."""

from __future__ import annotations

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.program import Program, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.sched.schedule import schedule_program
from rpegc.tools.gantt import Bar, bars_from_program, device_rows, draw_bars, draw_gantt


def ppo_program(cluster: Cluster, gen: Alloc, inf: Alloc, train: Alloc, steps: int = 3, phases: int = 2) -> Program:
    """An async PPO-like exec graph: split generation, inference on `inf`, training on `train`."""
    st = Strategy(1, 1, 1, 1)
    nodes, edges = [], []

    def op(name, step, order, role, alloc, t, phase=None):
        nid = f"{name}#{step}" + (f".q{phase}" if phase else "")
        nodes.append(ExecNode(nid, "op", step, order, name, role, "actor", alloc=alloc, strategy=st,
                              phase=phase, nphases=phases if phase else None, time=t))
        return nid

    def xfer(kind, nid, step, order, src, dst, t):
        nodes.append(ExecNode(nid, kind, step, order, alloc=dst, src_alloc=src, bytes=1000, time=t))
        return nid

    for k in range(steps):
        g = [op("gen", k, 0, "generation", gen, 0.6, q) for q in range(1, phases + 1)]
        edges += [ExecEdge(a, b) for a, b in zip(g, g[1:])]
        inf_nodes = []
        for q, gq in enumerate(g, 1):
            c = xfer("comm", f"c{k}.{q}", k, 1, gen, inf, 0.05)
            i = op("ref", k, 1, "inference", inf, 0.2, q)
            edges += [ExecEdge(gq, c), ExecEdge(c, i)]
            inf_nodes.append(i)
        c = xfer("comm", f"cy{k}", k, 2, inf, train, 0.05)
        t = op("train", k, 2, "training", train, 0.9)
        edges += [ExecEdge(inf_nodes[-1], c), ExecEdge(c, t), ExecEdge(g[-1], t)]
        if k:
            edges.append(ExecEdge(f"train#{k - 1}", t))
            r = xfer("reshard" if gen == train else "comm", f"w{k}", k, 0, train, gen, 0.1)
            edges += [ExecEdge(f"train#{k - 1}", r), ExecEdge(r, g[0])]
    graph = ExecGraph("ppo", steps, tuple(nodes), tuple(edges), lowered=True)
    return schedule_program(Program(Workload(64, 1, 512, 128), (), cluster=cluster, exec=graph))


def _png_ok(path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_gantt_8_devices_png(tmp_path):
    c = Cluster("c", 1, 1, 8, "h100")
    p = ppo_program(c, Alloc((0, 0, 0), (1, 1, 4)), Alloc((0, 0, 4), (1, 1, 2)), Alloc((0, 0, 0), (1, 1, 4)))
    out = tmp_path / "g8.png"
    rows = draw_gantt(p, str(out), title="PPO, 8 GPUs")
    _png_ok(out)
    assert [r.label for r in rows] == [f"GPU {d}" for d in range(8)]  # small clusters: a row per GPU


def test_gantt_64_devices_collapses_rows(tmp_path):
    c = Cluster("c", 1, 8, 8, "h100")
    p = ppo_program(c, Alloc((0, 0, 0), (1, 4, 8)), Alloc((0, 4, 0), (1, 2, 8)), Alloc((0, 6, 0), (1, 2, 8)))
    out = tmp_path / "g64.svg"
    rows = draw_gantt(p, str(out))
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert [r.label for r in rows] == ["GPUs 0-31", "GPUs 32-47", "GPUs 48-63"]


def test_bars_from_program_colours_by_role():
    c = Cluster("c", 1, 1, 8, "h100")
    p = ppo_program(c, Alloc((0, 0, 0), (1, 1, 4)), Alloc((0, 0, 4), (1, 1, 4)), Alloc((0, 0, 0), (1, 1, 4)), steps=2)
    bars = {b.node: b for b in bars_from_program(p)}
    assert bars["gen#0.q1"].kind == "generation" and bars["gen#0.q1"].devices == (0, 1, 2, 3)
    assert bars["ref#1.q2"].kind == "inference" and bars["train#1"].kind == "training"
    assert bars["c0.1"].kind == "comm" and bars["c0.1"].devices == (4, 5, 6, 7)  # destination only
    assert bars["w1"].kind == "reshard"
    node = {n.id: n for n in p.exec.nodes}
    assert (bars["train#1"].start, bars["train#1"].finish) == (node["train#1"].start, node["train#1"].finish)


def test_two_panels_share_rows(tmp_path):
    predicted = [Bar((0, 1), 0.0, 1.0, "generation", "gen#0", "0", "gen#0"),
                 Bar((2, 3), 1.0, 1.5, "training", "train#0", "0", "train#0")]
    measured = [Bar((0, 1), 0.0, 1.2, "generation", "gen#0", "0", "gen#0"),
                Bar((2, 3), 1.3, 1.9, "training", "train#0", "0", "train#0")]
    out = tmp_path / "both.png"
    rows = draw_bars([("predicted", predicted), ("measured", measured)], str(out), collapse=True)
    _png_ok(out)
    assert [r.devices for r in rows] == [(0, 1), (2, 3)]


def test_rows_fall_back_to_nodes_when_too_many():
    # 64 devices each running its own bar: 64 distinct rows collapse to 8 node rows.
    bars = [Bar((d,), 0.0, 1.0 + d, "inference", f"x{d}", "", f"x{d}") for d in range(64)]
    rows = device_rows([bars], 64, collapse=True, gpus_per_node=8, max_rows=40)
    assert [r.label for r in rows] == [f"node {n}" for n in range(8)]
    assert rows[1].devices == tuple(range(8, 16))


def test_idle_devices_get_their_own_row():
    bars = [Bar(tuple(range(0, 16)), 0.0, 1.0, "training", "t", "", "t")]
    rows = device_rows([bars], 32, collapse=True)
    assert [r.label for r in rows] == ["GPUs 0-15", "GPUs 16-31"]


def test_unscheduled_program_and_bad_extension(tmp_path):
    c = Cluster("c", 1, 1, 8, "h100")
    p = ppo_program(c, Alloc((0, 0, 0), (1, 1, 4)), Alloc((0, 0, 4), (1, 1, 4)), Alloc((0, 0, 0), (1, 1, 4)), steps=1)
    raw = p.exec.nodes[0].with_(start=None, finish=None)
    unscheduled = Program(p.workload, (), cluster=c, exec=ExecGraph("g", 1, (raw,), ()))
    with pytest.raises(RpegError, match="run the schedule pass"):
        bars_from_program(unscheduled)
    with pytest.raises(RpegError, match=r"\.png"):
        draw_gantt(p, str(tmp_path / "chart.jpeg"))


def test_bars_carry_vertex_names():
    c = Cluster("c", 1, 1, 8, "h100")
    p = ppo_program(c, Alloc((0, 0, 0), (1, 1, 4)), Alloc((0, 0, 4), (1, 1, 2)), Alloc((0, 0, 0), (1, 1, 4)))
    by_node = {b.node: b for b in bars_from_program(p)}
    assert (by_node["gen#1.q2"].label, by_node["gen#1.q2"].short) == ("gen#1.q2", "gen")
    assert (by_node["train#2"].label, by_node["train#2"].short) == ("train#2", "train")
    assert (by_node["c0.1"].label, by_node["c0.1"].short) == ("comm c0.1", "comm")
    assert by_node["w1"].short == "reshard"  # generation and training share their allocation


def test_cpu_worker_rows(tmp_path):
    bars = [Bar((0, 1), 0.0, 1.0, "training", "train#0", "train", "train#0"),
            Bar((2,), 0.0, 0.5, "comm", "c", "comm", "c")]
    rows = draw_bars([("measured", bars)], str(tmp_path / "w.png"), num_devices=4, unit="worker")
    assert [r.label for r in rows] == [f"worker {d}" for d in range(4)]
    collapsed = device_rows([bars], 4, collapse=True, unit="worker")
    assert [r.label for r in collapsed] == ["workers 0-1", "worker 2", "worker 3"]


def test_a_verifier_pool_has_a_row_of_its_own(tmp_path):
    """A verify node and the transfers into its pool draw on the row past the devices, labelled as the pool."""
    from fixtures.torch_runs import compile_plan

    plan = compile_plan(tmp_path, "v.rpeg", steps=2, text=open("examples/grpo-verify.rpeg").read())
    bars = bars_from_program(plan.program)
    pool = [b for b in bars if b.devices == (1,)]  # one device: the pool is id 1
    assert {b.kind for b in pool} == {"verify", "comm"} and len(pool) == 4  # 2 steps: Y in, the verifier
    rows = device_rows([bars], plan.program.cluster.num_devices, collapse=False)
    assert [r.label for r in rows] == ["GPU 0", "verifier pool"]
    draw_gantt(plan.program, str(tmp_path / "g.png"))
