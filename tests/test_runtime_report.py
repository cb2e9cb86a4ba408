"""Start-up, steady state and oversubscription (rpegc.runtime.report) on hand-computable traces."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from rpegc.core.ir.exec_graph import DataRef, ExecNode
from rpegc.core.ir.geometry import Alloc
from rpegc.runtime import cli, report
from rpegc.runtime.cli import _summary_lines
from rpegc.runtime.report import (Busy, ControlOverhead, Oversubscription, PartTime, PricedWrites, beside_shares,
                                  control_overhead, intervals, oversubscription, part_label, part_times, startup_time,
                                  steady_state)
from rpegc.runtime.trace import NodeRecord, StepRecord, Trace, TraceHeader
from rpegc.runtime.verify import Comparison, NodeTiming


def header(clock: str = "wall", backend: str = "torch", options: dict | None = None, first_step: int = 0):
    return TraceHeader(plan_hash="h", plan_file="p.rpeg", backend=backend, clock=clock, steps=3, plan_steps=3,
                       policy="plan", reserve="endpoints", workers={0: 0}, options=options or {},
                       first_step=first_step)


def node(i: str, step: int, start: float, finish: float, device: int = 0) -> NodeRecord:
    return NodeRecord(id=i, kind="op", step=step, dispatch=start, start=start, finish=finish, devices=(device,),
                      workers=(device,), strategy=(1, 1, 1, 1), consumed=(), produced=(), bytes=0, inputs=(),
                      outputs=())


# Start-up 2.0 s; steps finish at 3.0, 3.5, 4.5 (intervals 0.5, 1.0) on the wall clock,
# and at 0.25, 0.5, 0.75 on the schedule (intervals 0.25, 0.25).
STEPS = [StepRecord(0, 3.0, 0.25, 1), StepRecord(1, 3.5, 0.5, 1), StepRecord(2, 4.5, 0.75, 1)]
NODES = {"a#0": node("a#0", 0, 2.0, 3.0), "a#1": node("a#1", 1, 3.0, 3.5), "a#2": node("a#2", 2, 3.5, 4.5)}


def synthetic(options: dict | None = None, steps=STEPS, nodes=NODES) -> Trace:
    return Trace(header(options=options), dict(nodes), [], list(steps), None)


class ChainPlan:
    """What the summary needs of a plan: a#k after a#(k-1); no cluster prices it."""

    program = SimpleNamespace(cluster=None)
    nodes = tuple(SimpleNamespace(id=i, node=ExecNode(i, "op", int(i[-1]), 0, vertex="a")) for i in NODES)

    @staticmethod
    def pred_ids() -> dict[str, tuple[str, ...]]:
        return {"a#0": (), "a#1": ("a#0",), "a#2": ("a#1",)}


def test_startup_is_the_time_before_the_first_steps_first_node():
    assert startup_time(synthetic()) == 2.0
    assert startup_time(Trace(header(), {}, [], [], None)) == 0.0


def test_intervals_are_consecutive_step_finishes():
    assert intervals([(2, 4.5), (0, 3.0), (1, 3.5)]) == [0.5, 1.0]
    assert intervals([(0, 3.0)]) == []


def test_steady_state_means_over_the_steps_after_the_first():
    s = steady_state(synthetic())
    assert s is not None
    assert (s.startup_s, s.first_step, s.last_step, s.steps) == (2.0, 1, 2, 2)
    assert s.measured_s == pytest.approx(0.75)  # mean of 0.5 and 1.0
    assert s.predicted_s == pytest.approx(0.25)
    assert s.ratio == pytest.approx(3.0)


def test_steady_state_is_the_throughput_of_steps_that_finish_in_bursts():
    """A pipelined plan finishes two steps close together, then waits: the median interval (0.1 s) says nothing of
    the step; the mean is the throughput (steps 1-3 in 1.1 s)."""
    steps = [StepRecord(k, f, 0.5 * k, 1) for k, f in enumerate((1.0, 1.1, 2.0, 2.1))]
    s = steady_state(synthetic(steps=steps))
    assert s is not None and s.measured_s == pytest.approx(1.1 / 3) and s.predicted_s == pytest.approx(0.5)


def test_the_predicted_steady_state_includes_the_priced_checkpoint_writes_before_its_steps():
    """A write before step 2 (inside the steady state) adds its price to step 2's predicted interval; one before
    step 0 or after the last (not a steady interval) adds nothing."""
    s = steady_state(synthetic(), PricedWrites((2,), 0.1))
    assert s.predicted_s == pytest.approx((0.25 + 0.35) / 2) and s.written_s == pytest.approx(0.05)
    assert steady_state(synthetic(), PricedWrites((0, 3), 0.1)).predicted_s == pytest.approx(0.25)
    # the controller's commit of each ([host] checkpoint_commit) adds to the same step
    committed = steady_state(synthetic(), PricedWrites((2,), 0.06, 0.04))
    assert committed.predicted_s == pytest.approx(s.predicted_s) and committed.written_s == pytest.approx(0.05)
    line = cli._steady_line(s, None)
    assert "predicted 0.3 s/step, 50 ms of it checkpoint writes (measured/predicted 2.5)" in line


def test_the_summary_says_what_the_checkpoints_cost_against_their_price_or_why_unpriced():
    class Written:
        checkpoint_write_seconds = staticmethod(lambda: [0.004, 0.006, 0.020])
        checkpoint_commit_seconds = staticmethod(lambda: [0.003, 0.002, 0.004])

    hw = SimpleNamespace(name="cpu")
    assert cli._checkpoint_lines(Written, hw, PricedWrites((20, 40, 60), 0.005)) == [
        "checkpoint writes: 3, median 6 ms measured, 5 ms priced each (core/cost/checkpoint.py; the predicted steady "
        "state includes them)"]
    assert cli._checkpoint_lines(Written, hw, PricedWrites((20, 40, 60), 0.005, 0.0025))[1:] == [
        "checkpoint commits (the controller's index, rename and pruning): median 3 ms measured, 2.5 ms priced each"]
    unpriced, = cli._checkpoint_lines(Written, hw, None)
    assert "not priced: the profile 'cpu' has no [host] checkpoint_rate" in unpriced
    assert cli._checkpoint_lines(Written, None, None) == []  # a simulated clock: nothing measured against
    # more workers than cores: measured only, as the run's other times
    assert cli._checkpoint_lines(Written, hw, PricedWrites((20,), 0.005), oversubscribed=True) == [
        "checkpoint writes: 3, median 6 ms measured"]


def test_one_step_has_no_steady_state():
    assert steady_state(synthetic(steps=STEPS[:1])) is None


def test_unscheduled_steps_have_no_predicted_interval():
    steps = [StepRecord(k, s.finish, None, 1) for k, s in enumerate(STEPS)]
    s = steady_state(synthetic(steps=steps))
    assert s is not None and s.predicted_s is None and s.ratio is None


def comparison() -> Comparison:
    # predicted 1.0 s per node; errors: step 0 +100 %, step 1 -50 %, step 2 +0 %
    rows = tuple(NodeTiming(i, "op", r.step, 1.0, None, None, 0.0, t)
                 for (i, r), t in zip(NODES.items(), (2.0, 0.5, 1.0)))
    return Comparison(rows, 0.75, 4.5)


def test_steady_node_error_leaves_out_the_first_step():
    c = comparison()
    assert c.steady_steps == (1, 2)
    assert c.steady_abs_rel_error == pytest.approx(0.25)  # (50 + 0) / 2
    assert c.mean_abs_rel_error == pytest.approx(0.5)  # (100 + 50 + 0) / 3


def test_oversubscription_label():
    o = oversubscription(8, cores=2)
    assert o == Oversubscription(8, 2)
    assert o.label == "oversubscribed: 8 workers on 2 cores; measured times are not comparable with the prediction"
    assert oversubscription(2, cores=2) is None


def test_a_plan_over_several_nodes_launched_on_one_host_is_oversubscribed():
    """The cost model prices each cluster node as a host of its own (its cores, its control round trip): two nodes'
    workers launched here share this host's cores, which no price saw (the demo's optimized ppo-tiny plan priced
    0.31 ms a node with a core left on each node and measured 2.64). Workers launched elsewhere are not counted."""
    o = oversubscription(2, cores=2, nodes=2)
    assert o == Oversubscription(2, 2, 2)
    assert o.label == ("oversubscribed: the plan's devices lie on 2 nodes, each priced as a host of its own, and all 2 "
                       "workers run on this host's 2 cores; measured times are not comparable with the prediction")
    assert oversubscription(2, cores=2, nodes=1) is None and oversubscription(0, cores=2, nodes=2) is None
    lines = _summary_lines(comparison(), synthetic({"local_workers": 2, "host_cores": 2, "plan_nodes": 2}),
                           ChainPlan())
    assert o.label in lines and not any("measured/predicted" in line for line in lines)


def test_host_cores_follow_the_affinity(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert report.host_cores() == 2
    assert oversubscription(4) == Oversubscription(4, 2)


def test_summary_compares_the_steady_state():
    lines = _summary_lines(comparison(), synthetic({"local_workers": 2, "host_cores": 2}), ChainPlan())
    assert lines == [
        "start-up: 2 s (workers, process groups, installs)",
        "steady state: measured 0.75 s/step, predicted 0.25 s/step (measured/predicted 3) over steps 1-2; "
        "mean |node time error| 25.00 %",
        "control overhead: 0 ms per node (report, reaction, command), 0 ms per step on the critical chain "
        "(0 % of the step)",
        "makespan: measured 4.5 s (wall clock), predicted 0.75 s (measured/predicted 6.0000)",
    ]


def test_oversubscribed_summary_prints_measured_numbers_only():
    lines = _summary_lines(comparison(), synthetic({"local_workers": 8, "host_cores": 2}), ChainPlan())
    assert lines == [
        "start-up: 2 s (workers, process groups, installs)",
        "oversubscribed: 8 workers on 2 cores; measured times are not comparable with the prediction",
        "steady state: measured 0.75 s/step over steps 1-2",
        "control overhead: 0 ms per node (report, reaction, command), 0 ms per step on the critical chain "
        "(0 % of the step)",
        "makespan: measured 4.5 s (wall clock)",
    ]
    assert not any("predicted" in line for line in lines)


def test_sim_summary_has_no_startup_and_is_never_oversubscribed():
    t = Trace(header(clock="sim", backend="sim"), dict(NODES), [], list(STEPS), None)
    lines = _summary_lines(comparison(), t, ChainPlan())
    assert lines[0].startswith("steady state: measured 0.75 s/step, predicted 0.25 s/step")
    assert not any(line.startswith(("start-up", "oversubscribed", "control")) for line in lines)


def test_one_step_summary_keeps_the_node_error_on_the_makespan_line():
    t = Trace(header(clock="sim", backend="sim"), {"a#0": NODES["a#0"]}, [], STEPS[:1], None)
    rows = (NodeTiming("a#0", "op", 0, 1.0, None, None, 0.0, 2.0),)
    lines = _summary_lines(Comparison(rows, 1.0, 3.0), t, ChainPlan())
    assert lines == ["makespan: measured 3 s (sim clock), predicted 1 s (measured/predicted 3.0000); "
                     "mean |node time error| 100.00 %"]


# Two devices: per step a on device 0, then b on device 1 (data edge a -> b); b#k publishes to a#(k+1);
# c#1 on device 0 has no predecessor but runs after a#1 there. Control waits (start - enabling finish):
# a#1 4 ms, c#1 6 ms, b#1 1 ms, a#2 3 ms, b#2 2 ms. Steps finish at 1.5, 3.0, 4.5.
GAPS = {
    "a#0": node("a#0", 0, 0.0, 1.0), "b#0": node("b#0", 0, 1.002, 1.5, device=1),
    "a#1": node("a#1", 1, 1.504, 2.5), "c#1": node("c#1", 1, 2.506, 2.9), "b#1": node("b#1", 1, 2.501, 3.0, device=1),
    "a#2": node("a#2", 2, 3.003, 4.0), "b#2": node("b#2", 2, 4.002, 4.5, device=1),
}
GAP_PREDS = {"a#0": (), "b#0": ("a#0",), "a#1": ("b#0",), "c#1": (), "b#1": ("a#1",), "a#2": ("b#1",),
             "b#2": ("a#2",)}
GAP_STEPS = [StepRecord(0, 1.5, 1.5, 2), StepRecord(1, 3.0, 3.0, 3), StepRecord(2, 4.5, 4.5, 2)]


def test_control_overhead_is_the_wait_after_a_node_could_start():
    c = control_overhead(GAP_PREDS, synthetic(steps=GAP_STEPS, nodes=GAPS))
    assert c is not None
    assert c.nodes == 5
    assert c.per_node_s == pytest.approx((0.004 + 0.006 + 0.001 + 0.003 + 0.002) / 5)
    # critical chain of step 1: b#1 <- a#1 <- b#0 (finished at the step boundary): 1 + 4 ms; step 2: 2 + 3 ms
    assert c.critical_s == pytest.approx(0.005)
    assert c.step_share == pytest.approx(0.005 / 1.5)


def test_control_overhead_counts_an_early_start_as_no_wait_and_needs_a_steady_state():
    early = dict(GAPS, **{"b#2": node("b#2", 2, 3.99, 4.5, device=1)})  # clocks of two hosts a little apart
    c = control_overhead(GAP_PREDS, synthetic(steps=GAP_STEPS, nodes=early))
    assert c is not None and c.per_node_s == pytest.approx((0.004 + 0.006 + 0.001 + 0.003) / 5)
    assert control_overhead(GAP_PREDS, synthetic(steps=GAP_STEPS[:1], nodes=GAPS)) is None
    assert isinstance(c, ControlOverhead)


ONE = Alloc((0, 0, 0), (1, 1, 1))


def test_a_part_is_a_vertex_or_what_a_transfer_moves_and_where():
    assert part_label(ExecNode("gen#3", "op", 3, 0, vertex="gen")) == "gen"
    assert part_label(ExecNode("gen#3.q2", "op", 3, 0, vertex="gen", phase=2, nphases=4)) == "gen phase 2/4"
    y = (DataRef("Y"),)
    assert part_label(ExecNode("c1", "comm", 3, 1, container="Y", alloc=ONE, src_alloc=ONE, data_in=y)) \
        == "transfer %Y"
    assert part_label(ExecNode("c2", "comm", 3, 1, container="Y", alloc=None, src_alloc=ONE)) \
        == "transfer %Y to the verifier pool"
    assert part_label(ExecNode("c3", "comm", 3, 1, container="r", alloc=ONE, src_alloc=None)) \
        == "transfer %r from the verifier pool"
    assert part_label(ExecNode("c4", "comm", 3, 1, model="actor", alloc=ONE, src_alloc=ONE)) \
        == "transfer @actor weights"
    assert part_label(ExecNode("r1", "reshard", 3, 1, model="actor", alloc=ONE, src_alloc=ONE)) == "reshard @actor"


def test_part_times_are_medians_of_the_steady_nodes_less_the_priced_control():
    # a: steps 1-3 measured 2, 4, 9 ms, each priced 3.5 ms of which 0.5 control; c: one node; step 0 left out
    rows = [NodeTiming(f"a#{k}", "op", k, 0.0035, None, None, 0.0, m) for k, m in enumerate((0.1, 0.002, 0.004,
                                                                                         0.009))]
    rows.append(NodeTiming("c#1", "comm", 1, 0.0015, None, None, 1.0, 1.004))
    rows.append(NodeTiming("d#1", "op", 1, None, None, None, 0.0, 1.0))  # unscheduled: no part
    labels = {"a#0": "a", "a#1": "a", "a#2": "a", "a#3": "a", "c#1": "transfer %Y", "d#1": "d"}
    parts = part_times(rows, labels, range(1, 4), 0.0005)
    assert [p.label for p in parts] == ["a", "transfer %Y"]  # the labels' order
    a, c = parts
    assert (a.nodes, a.measured_s, a.predicted_s) == (3, pytest.approx(0.004), pytest.approx(0.003))
    assert a.ratio == pytest.approx(4 / 3)
    assert (c.nodes, c.measured_s, c.predicted_s) == (1, pytest.approx(0.004), pytest.approx(0.001))
    assert PartTime("x", 1, 0.001, 0.0).ratio is None  # priced at the control round trip alone
    assert part_times(rows, labels, range(5, 9), 0.0005) == []


def test_beside_is_the_share_of_a_run_another_core_of_its_host_computed():
    runs = [Busy("a", 0, frozenset({0}), 0.0, 10.0), Busy("b", 0, frozenset({1}), 5.0, 15.0),
            Busy("c", 0, frozenset({1}), 12.0, 20.0), Busy("d", 0, frozenset({0}), 10.0, 20.0),
            Busy("e", 0, frozenset({0, 1}), 20.0, 30.0),  # both cores: its own ranks, nothing beside
            Busy("f", 1, frozenset({2}), 0.0, 30.0),  # another host's
            Busy("pool", 0, frozenset({2, 1}), 25.0, 40.0)]  # a pool sharing device 1's core, which e holds
    shares = beside_shares(runs)
    assert shares["a"] == pytest.approx(0.5)  # b from 5 to 10
    assert shares["b"] == shares["d"] == shares["c"] == pytest.approx(1.0)  # c and d overlap: counted once
    assert shares["e"] == 0.0 and shares["f"] == 0.0 and shares["pool"] == 0.0
    long = [Busy("L", 0, frozenset({0}), 0.0, 100.0)] + [Busy(f"s{k}", 0, frozenset({1}), k / 10, k / 10 + 0.05)
                                                          for k in range(1000)]
    spread = beside_shares(long)  # one long run among many short ones, each met once
    assert spread["L"] == pytest.approx(0.5) and all(spread[f"s{k}"] == pytest.approx(1.0) for k in range(1000))
    rows = [NodeTiming(i, "op", 1, 0.002, None, None, 0.0, 0.001) for i in ("a", "b", "x")]
    (part,) = part_times(rows, {"a": "v", "b": "v", "x": "v"}, range(1, 2), 0.0, {"a": 0.2, "b": 0.6})
    assert part.beside == pytest.approx(0.4)  # the median of the nodes that have one
    assert part_times(rows, {"a": "v"}, range(1, 2), 0.0)[0].beside is None
    (part,) = part_times(rows, {"a": "v", "b": "v", "x": "v"}, range(1, 2), 0.0, None, {"a": 0.001, "b": 0.004})
    assert part.waited == pytest.approx(0.0025)  # the mean of the nodes that have one: a long wait counts in full
    assert part_times(rows, {"a": "v"}, range(1, 2), 0.0)[0].waited is None


def test_the_parts_say_how_much_of_their_time_another_core_computed_beside_them():
    nodes = tuple(SimpleNamespace(id=i, kind="op", devices=(d,), node=ExecNode(i, "op", s, 0, vertex=v))
                  for i, d, s, v in (("g#1", 0, 1, "gen"), ("t#1", 1, 1, "train"), ("g#2", 0, 2, "gen")))
    plan = SimpleNamespace(program=SimpleNamespace(cluster=SimpleNamespace(gpus=2)), model_devices=(0, 1),
                           nodes=nodes)
    rows = (NodeTiming("g#1", "op", 1, 1.0, None, None, 0.0, 1.0),
            NodeTiming("t#1", "op", 1, 1.0, None, None, 0.5, 2.5),  # beside g#1 from 0.5 and g#2 to 2.5
            NodeTiming("g#2", "op", 2, 1.0, None, None, 2.0, 3.0))
    lines = cli._part_lines(Comparison(rows, 0.0, 3.0), plan, range(1, 3), 0.0, {})
    assert lines[0].endswith("; the share of an operator's time another core computed beside it):")
    assert lines[1].endswith("(1.00x),  50 % beside") and lines[2].endswith("(2.00x),  50 % beside")
    waited = cli._part_lines(Comparison(rows, 0.0, 3.0), plan, range(1, 3), 0.0, {"g#1": 0.002, "g#2": 0.001})
    assert waited[0].endswith("beside it; the mean time an operator's worker waited for a core in it):")
    assert waited[1].endswith("(1.00x),  50 % beside, waited 1.5 ms") and waited[2].endswith("50 % beside")


def test_a_priced_wall_clock_summary_says_where_the_steady_state_went():
    lines = _summary_lines(comparison(), synthetic({"local_workers": 2, "host_cores": 2}), ChainPlan(), 0.25)
    assert lines[2] == ("control overhead: 0 ms per node (report, reaction, command; priced 250 ms), 0 ms per step "
                        "on the critical chain (0 % of the step)")
    # steps 1-2 of `comparison`: measured 0.5 and 1.0 s, each priced 1.0 s of which 0.25 control
    assert lines[3:5] == ["time per node (steady steps' medians, the control round trip apart):",
                          "  a       750 ms measured,      750 ms predicted (1.00x)"]
    over = _summary_lines(comparison(), synthetic({"local_workers": 8, "host_cores": 2}), ChainPlan(), 0.25)
    assert not any(line.startswith("time per node") for line in over)  # oversubscribed: measured numbers only
    assert cli._priced_profile(ChainPlan(), SimpleNamespace(clock="wall")) is None  # no cluster prices it


def witnessed(seconds) -> dict:
    """NODES, each with one speed witness of `seconds` (steps 0, 1, 2)."""
    return {i: dataclasses.replace(r, witness=(s,)) for (i, r), s in zip(NODES.items(), seconds)}


def test_the_speed_witness_line_says_how_fast_the_cores_ran_and_the_ratio_at_that_speed():
    """The steady steps' witnesses (step 0's left out) against the profile's ([overhead] witness): their median
    4e-4 s against 2e-4 is cores at half the speed they were priced at, and the steady state's 3x is 1.5x at it."""
    hw = SimpleNamespace(overhead=SimpleNamespace(witness=2e-4), verify_witness=0.0)
    lines = _summary_lines(comparison(), synthetic({"local_workers": 2, "host_cores": 2}, nodes=witnessed(
        (9e-3, 3e-4, 5e-4))), ChainPlan(), hw=hw)
    assert ("speed witness (workers 0.4 ms against 0.2 (median of 2)): the cores ran at 0.5x the speed they were "
            "priced at; measured/predicted at that speed 1.5") in lines
    plain = _summary_lines(comparison(), synthetic({"local_workers": 2, "host_cores": 2}), ChainPlan(), hw=hw)
    over = _summary_lines(comparison(), synthetic({"local_workers": 8, "host_cores": 2}, nodes=witnessed(
        (9e-3, 3e-4, 5e-4))), ChainPlan(), hw=hw)
    assert not any(line.startswith("speed witness") for line in plain + over)  # none ran; not compared


def test_the_speed_witness_weighs_each_kind_of_process_by_the_predicted_time_of_its_nodes():
    """A workers' group at 2x its calibration over 1 s of predicted nodes and a verifier pools' group at 1x over 3 s:
    the steady state's prediction at the speed the cores ran is 1.25x."""
    steady = steady_state(synthetic())
    assert steady is not None
    nodes = {"a#1": report.WitnessedNode("workers", 2e-4, 1.0),
             "a#2": report.WitnessedNode("verifier pools", 5e-4, 3.0)}
    speed = report.witness_speed(synthetic(nodes=witnessed((1.0, 4e-4, 5e-4))), steady, nodes)
    assert speed is not None and [(g.what, g.count, g.factor) for g in speed.groups] == [
        ("workers", 1, pytest.approx(2.0)), ("verifier pools", 1, pytest.approx(1.0))]
    assert speed.factor == pytest.approx((2.0 * 1.0 + 1.0 * 3.0) / 4.0)
    assert report.witness_speed(synthetic(), steady, nodes) is None  # no witness ran


@pytest.mark.parametrize("fn, counted", [("math", ("verifier pools", 3e-4)), ("rule", ("workers", 2e-4)),
                                         ("exact_match", None)])
def test_a_verify_nodes_witnesses_are_held_against_the_witness_that_prices_it(fn, counted):
    """A pool of math against [host] verify_witness, the toy rule (its worker scores the rows) against [overhead]
    witness; a pool of another function is not counted (its reference was timed after math); an operator against
    [overhead] witness."""
    from rpegc.core.ir.program import VERIFY

    class VerifyPlan(ChainPlan):
        program = SimpleNamespace(cluster=None, verifier=lambda name: SimpleNamespace(name=name, fn=fn))
        nodes = (SimpleNamespace(id="a#0", node=ExecNode("a#0", "op", 0, 0, vertex="a")),
                 *(SimpleNamespace(id=i, node=ExecNode(i, "op", int(i[-1]), 0, vertex="a", role=VERIFY, model="v"))
                   for i in ("a#1", "a#2")))

    hw = SimpleNamespace(overhead=SimpleNamespace(witness=2e-4), verify_witness=3e-4)
    nodes = cli._witnessed_nodes(VerifyPlan(), comparison(), hw)
    assert nodes["a#0"] == report.WitnessedNode("workers", 2e-4, 1.0)
    want = {} if counted is None else {i: report.WitnessedNode(*counted, 1.0) for i in ("a#1", "a#2")}
    assert {k: v for k, v in nodes.items() if k != "a#0"} == want
