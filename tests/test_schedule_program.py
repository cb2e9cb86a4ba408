"""schedule_program: the `schedule` pass's semantics on ExecGraph dataclasses (Alg. 5 + Eq. 4-6)."""

from __future__ import annotations

import pytest

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode, MemoryReport
from rpegc.core.ir.program import Program, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.sched.schedule import schedule_program

C8 = Cluster("c", 1, 1, 8, "h100")
ALL8 = Alloc((0, 0, 0), (1, 1, 8))
LOW = Alloc((0, 0, 0), (1, 1, 4))
HIGH = Alloc((0, 0, 4), (1, 1, 4))
ST = Strategy(4, 1, 1, 1)
WL = Workload(64, 1, 512, 128)


def op(nid, step, order, role, alloc, t, phase=None, vertex=None):
    return ExecNode(nid, "op", step, order, vertex or nid.split("#")[0], role, "actor", alloc=alloc, strategy=ST,
                    phase=phase, nphases=2 if phase else None, time=t)


def xfer(nid, kind, step, order, src, dst, t):
    return ExecNode(nid, kind, step, order, alloc=dst, src_alloc=src, bytes=1 << 20, time=t)


def program(nodes, edges, steps=1, memory=None, cluster=C8):
    graph = ExecGraph("g", steps, tuple(nodes), tuple(ExecEdge(a, b) for a, b in edges), lowered=True, memory=memory)
    return Program(WL, (), cluster=cluster, exec=graph)


def times_of(p):
    return {n.id: (n.start, n.finish) for n in p.exec.nodes}


def spec_chain(alloc, memory=None):
    nodes = [op("gen#0", 0, 0, "generation", alloc, 1.676318), op("ref#0", 0, 1, "inference", alloc, 0.2504039),
             op("train#0", 0, 2, "training", alloc, 0.9874231)]
    return program(nodes, [("gen#0", "ref#0"), ("ref#0", "train#0")], memory=memory)


def test_spec_87_chain():
    p = schedule_program(spec_chain(ALL8))
    r = p.exec.schedule
    assert r.makespan == pytest.approx(2.914145, rel=1e-6)
    assert r.score == pytest.approx(1.405558e4, rel=1e-6)
    assert r.score_pen == r.score  # no memory report: no penalty
    assert r.util == pytest.approx(1.0) and r.p_eff == pytest.approx(1.0)
    t = times_of(p)
    assert t["gen#0"] == (0.0, 1.676318) and t["ref#0"][0] == 1.676318 and t["train#0"][1] == r.makespan


def test_spec_87_memory_penalty_and_partial_utilization():
    mem = MemoryReport(peak=(), persistent=(), transient=(), m_eff=1.546188e10, r_peak=1.118639, feasible=False)
    r = schedule_program(spec_chain(ALL8, mem)).exec.schedule
    assert r.score_pen == pytest.approx(r.score * 8.690270e-3, rel=1e-5)
    r = schedule_program(spec_chain(LOW)).exec.schedule
    assert r.util == pytest.approx(0.5)  # |D| is the whole cluster, not just the GPUs used


def test_input_is_not_modified():
    p = spec_chain(ALL8)
    q = schedule_program(p)
    assert p.exec.schedule is None and all(n.start is None for n in p.exec.nodes)
    assert q.exec.nodes[0].with_(start=None, finish=None) == p.exec.nodes[0]


def test_transfers_reserve_only_their_destination():
    # gen on LOW, then a comm LOW -> HIGH; another op on LOW runs while the comm runs.
    nodes = [op("gen#0", 0, 0, "generation", LOW, 1.0), xfer("c0", "comm", 0, 1, LOW, HIGH, 0.5),
             op("inf#0", 0, 1, "inference", HIGH, 1.0), op("other#0", 0, 2, "inference", LOW, 1.0)]
    p = schedule_program(program(nodes, [("gen#0", "c0"), ("c0", "inf#0"), ("gen#0", "other#0")]))
    t = times_of(p)
    assert t["c0"] == (1.0, 1.5) and t["other#0"] == (1.0, 2.0) and t["inf#0"] == (1.5, 2.5)
    assert p.exec.schedule.util == pytest.approx((1.0 * 4 + 0.5 * 4 + 1.0 * 4 + 1.0 * 4) / (8 * 2.5))
    assert p.exec.schedule.p_eff == pytest.approx(3.0 / 2.5)  # only Op time counts


def test_reshard_reserves_its_allocation():
    nodes = [op("train#0", 0, 2, "training", LOW, 1.0), xfer("r1", "reshard", 1, 0, LOW, LOW, 0.25),
             op("gen#1", 1, 0, "generation", LOW, 1.0), op("x#0", 0, 3, "inference", LOW, 0.1)]
    p = schedule_program(program(nodes, [("train#0", "r1"), ("r1", "gen#1"), ("train#0", "x#0")], steps=2))
    t = times_of(p)
    # At t=1 the reshard and x#0 compete for LOW: the transfer goes first; at 1.25 gen#1 (rank 1.0)
    # beats x#0 (rank 0.1); x#0 runs last.
    assert t["r1"] == (1.0, 1.25) and t["gen#1"] == (1.25, 2.25) and t["x#0"][0] == 2.25


def test_generation_phases_are_not_interrupted():
    # gen#0.q1 -> gen#0.q2 on LOW; a training op of another vertex becomes ready on LOW at t=1 with a
    # larger own rank than q2 but a smaller rank than the chain head q1.
    nodes = [op("gen#0.q1", 0, 0, "generation", LOW, 1.0, phase=1, vertex="gen"),
             op("gen#0.q2", 0, 0, "generation", LOW, 1.0, phase=2, vertex="gen"),
             op("pre#0", 0, 1, "inference", HIGH, 1.0), op("y#0", 0, 2, "training", LOW, 1.5)]
    p = schedule_program(program(nodes, [("gen#0.q1", "gen#0.q2"), ("pre#0", "y#0")]))
    t = times_of(p)
    assert t["gen#0.q2"] == (1.0, 2.0) and t["y#0"] == (2.0, 3.5)


def test_inference_phases_do_not_inherit():
    # The same shape with inference phases: the intruder with the larger rank goes first.
    nodes = [op("inf#0.q1", 0, 0, "inference", LOW, 1.0, phase=1, vertex="inf"),
             op("inf#0.q2", 0, 0, "inference", LOW, 1.0, phase=2, vertex="inf"),
             op("pre#0", 0, 1, "inference", HIGH, 1.0), op("y#0", 0, 2, "training", LOW, 1.5)]
    t = times_of(schedule_program(program(nodes, [("inf#0.q1", "inf#0.q2"), ("pre#0", "y#0")])))
    assert t["y#0"] == (1.0, 2.5) and t["inf#0.q2"] == (2.5, 3.5)


def test_earlier_step_first_on_equal_rank():
    # Independent equal-time nodes on one allocation: step-major order, then vertex order.
    nodes = [op("b#1", 1, 1, "inference", ALL8, 1.0), op("a#1", 1, 0, "inference", ALL8, 1.0),
             op("b#0", 0, 1, "inference", ALL8, 1.0), op("a#0", 0, 0, "inference", ALL8, 1.0)]
    t = times_of(schedule_program(program(nodes, [], steps=2)))
    assert sorted(t, key=lambda k: t[k][0]) == ["a#0", "b#0", "a#1", "b#1"]


LOC = Loc("x.rpeg", 7, 3)


def test_missing_time_asks_for_annotate_cost():
    nodes = [op("gen#0", 0, 0, "generation", ALL8, 1.0),
             op("ref#0", 0, 1, "inference", ALL8, 1.0).with_(time=None, loc=LOC)]
    with pytest.raises(RpegError, match="run annotate-cost") as e:
        schedule_program(program(nodes, [("gen#0", "ref#0")]))
    assert e.value.loc == LOC


def test_bad_inputs_are_located_user_errors():
    with pytest.raises(RpegError, match="no executable graph"):
        schedule_program(Program(WL, (), cluster=C8))
    with pytest.raises(RpegError, match="no cluster"):
        schedule_program(Program(WL, (), exec=spec_chain(ALL8).exec))
    bad = op("x#0", 0, 0, "inference", Alloc((0, 0, 6), (1, 1, 4)), 1.0).with_(loc=LOC)
    with pytest.raises(RpegError, match="does not fit") as e:
        schedule_program(program([bad], []))
    assert e.value.loc == LOC
    with pytest.raises(RpegError, match="unknown node ghost"):
        schedule_program(program([op("x#0", 0, 0, "inference", ALL8, 1.0)], [("x#0", "ghost")]))
    with pytest.raises(RpegError, match="cycle"):
        nodes = [op("a#0", 0, 0, "inference", ALL8, 1.0), op("b#0", 0, 1, "inference", ALL8, 1.0)]
        schedule_program(program(nodes, [("a#0", "b#0"), ("b#0", "a#0")]))
    with pytest.raises(RpegError, match="has no allocation; give it a destination allocation"):
        schedule_program(program([xfer("c0", "comm", 0, 0, LOW, None, 1.0)], []))
    with pytest.raises(RpegError, match="makespan is 0"):
        schedule_program(program([op("x#0", 0, 0, "inference", ALL8, 0.0)], []))
    with pytest.raises(RpegError, match="used twice"):
        schedule_program(program([op("x#0", 0, 0, "inference", ALL8, 1.0)] * 2, []))
