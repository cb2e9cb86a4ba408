"""Honest run reporting: start-up apart from the steady state, and oversubscribed hosts.

Definitions (used by `rpeg-run`'s summary and its `--gantt`, and by `rpeg-run verify`):

- start-up: everything on the run's clock before the first node of the run's first step starts
  (worker launch, process groups, installs of the initial checkpoint). The sim clock has none (0).
- steady state: the steps after the first. Step k's interval is step k's finish minus step k-1's
  finish (k > first step), on the measured clock and, from the schedule, on the predicted clock; the
  summary compares their means, the steps' throughput. Not their medians: a pipelined plan (staleness >= 1)
  finishes steps in bursts, two close together and then a long wait, whose median interval is half the step
  (measured on a 23.6M-parameter GRPO: median 3.7 s, mean 5.9 s); a checkpoint write counts too. The schedule
  has no checkpoints (their cadence is the run's), so the predicted interval of a step a checkpoint precedes adds
  its priced write (`PricedWrites`, core/cost/checkpoint.py): the writing worker blocks between its nodes.
- steady-state node error: mean |measured - predicted| / predicted node time over the nodes of the
  steady-state steps (step 0, which warms caches and allocators, is left out). With one step there is
  no steady state; the error then falls back to all nodes.
- time per part: per vertex (and per kind of transfer), the median over the steady-state steps' nodes of the
  measured run time (start to finish) against the median of what the plan prices each to run for: its annotated
  time less the control round trip the cost model puts before every node ([overhead] `node`), which the trace
  measures apart (the control overhead). It says which part of a run its prediction misses.
- beside another core: per operator part, the median share of its nodes' run time during which another core of
  their host ran an operator of another node (a device's worker on a device the node does not hold, or the verifier
  pool's processes). Two operators computing at once share the host's memory bandwidth and caches; the cost model
  prices that where its schedule overlaps them (core/cost/contention.overlap_stretches), so a part measured slower
  than priced and mostly beside another core, more than its schedule put it there, is that.
- oversubscribed: the torch backend launched more worker processes on this host than the host has
  cores, or the plan's devices lie on more than one of its cluster's nodes and a local launch put them all on this
  host (the cost model priced each node as a host of its own: its cores, its control round trip, links between
  nodes); measured times then say more about the host than about the plan, so the summary prints measured numbers
  only.
"""

from __future__ import annotations

import bisect
import heapq
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

from rpegc.core.ir.exec_graph import ExecNode
from rpegc.runtime.trace import Trace


@dataclass(frozen=True)
class SteadyState:
    startup_s: float  # the run's clock before the first step's first node started
    first_step: int  # first step of the steady state (the run's first step + 1)
    last_step: int
    measured_s: float  # mean measured step interval (the steps' throughput)
    predicted_s: Optional[float]  # mean predicted step interval (None: the plan has no schedule)
    written_s: float = 0.0  # the priced checkpoint writes (with their commits) per step that predicted_s includes

    @property
    def ratio(self) -> Optional[float]:
        if not self.predicted_s:
            return None
        return self.measured_s / self.predicted_s

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1


@dataclass(frozen=True)
class Oversubscription:
    workers: int
    cores: int
    nodes: int = 1  # the cluster's nodes the plan's devices lie on, all launched on this host

    @property
    def label(self) -> str:
        if self.workers <= self.cores:
            return (f"oversubscribed: the plan's devices lie on {self.nodes} nodes, each priced as a host of its "
                    f"own, and all {self.workers} workers run on this host's {self.cores} cores; measured times are "
                    "not comparable with the prediction")
        return (f"oversubscribed: {self.workers} workers on {self.cores} cores; measured times are not comparable "
                "with the prediction")


def startup_time(trace: Trace) -> float:
    """Clock time before the first node of the run's first step started (0 for an empty trace)."""
    first = trace.header.first_step
    starts = [r.start for r in trace.nodes.values() if r.step == first]
    if not starts:
        starts = [r.start for r in trace.nodes.values()]
    return max(0.0, min(starts, default=0.0))


@dataclass(frozen=True)
class PricedWrites:
    """A run's checkpoint writes as the cost model prices them: before each step of `steps` (a boundary), one write
    that blocks its slowest worker `seconds` (core/cost/checkpoint.checkpoint_time), then the controller's commit of
    it, `commit_s` (core/cost/checkpoint.commit_time), during which it dispatches nothing."""

    steps: tuple[int, ...]
    seconds: float
    commit_s: float = 0.0

    @property
    def each_s(self) -> float:
        """What one checkpoint adds to its step."""
        return self.seconds + self.commit_s


def intervals(finishes: Sequence[tuple[int, float]]) -> list[float]:
    """Step k's finish minus step k-1's finish, for consecutive (step, finish) pairs in step order."""
    ordered = sorted(finishes)
    return [b - a for (ka, a), (kb, b) in zip(ordered, ordered[1:]) if kb == ka + 1]


def steady_state(trace: Trace, writes: Optional[PricedWrites] = None) -> Optional[SteadyState]:
    """The steady state of a trace's steps (None with fewer than two steps); the predicted intervals include the
    priced checkpoint `writes` before their steps."""
    steps = sorted(trace.steps, key=lambda s: s.step)
    measured = intervals([(s.step, s.finish) for s in steps])
    if not measured:
        return None
    predicted_pairs = [(s.step, s.predicted_finish) for s in steps if s.predicted_finish is not None]
    predicted = intervals(predicted_pairs) if len(predicted_pairs) == len(steps) else []
    first, last = steps[1].step, steps[-1].step
    written = 0.0
    if writes is not None and predicted:
        written = writes.each_s * sum(first <= b <= last for b in writes.steps) / len(predicted)
    return SteadyState(
        startup_s=startup_time(trace),
        first_step=first,
        last_step=last,
        measured_s=statistics.fmean(measured),
        predicted_s=statistics.fmean(predicted) + written if predicted else None,
        written_s=written,
    )


@dataclass(frozen=True)
class WitnessGroup:
    """One kind of process's speed witnesses in a run's steady steps (the trace's `witness`: a worker's as it ended an
    operator, a verifier pool process's as it ended its share; runtime/speed_probe.py) against its calibration's."""

    what: str  # "workers" or "verifier pools"
    median_s: float
    count: int
    calibrated_s: float  # [overhead] witness or [host] verify_witness
    weight_s: float  # the predicted time of the nodes they ended

    @property
    def factor(self) -> float:
        """The run's witness over the calibration's: above 1, the cores ran slower than when they were priced."""
        return self.median_s / self.calibrated_s


@dataclass(frozen=True)
class WitnessSpeed:
    """How fast the cores of a run's steady steps ran against the calibration, per kind of process."""

    groups: tuple[WitnessGroup, ...]

    @property
    def factor(self) -> float:
        """The groups' factors weighted by the predicted time of the nodes they ended: what the steady state's
        predicted time would have been multiplied by at the speed the cores ran."""
        total = sum(g.weight_s for g in self.groups)
        return sum(g.factor * g.weight_s for g in self.groups) / total


@dataclass(frozen=True)
class WitnessedNode:
    """A node whose witnesses count: its group, the calibration's witness of that group and its predicted time."""

    group: str
    calibrated_s: float
    predicted_s: float


def witness_speed(trace: Trace, steady: SteadyState, nodes: Mapping[str, WitnessedNode]) -> Optional[WitnessSpeed]:
    """The speed witnesses of the steady state's `nodes` against their groups' calibration; None where none ran."""
    seen: dict[str, list[float]] = {}
    weight: dict[str, float] = {}
    calibrated: dict[str, float] = {}
    for r in trace.nodes.values():
        n = nodes.get(r.id)
        if n is None or not r.witness or not steady.first_step <= r.step <= steady.last_step or n.calibrated_s <= 0:
            continue
        seen.setdefault(n.group, []).extend(r.witness)
        weight[n.group] = weight.get(n.group, 0.0) + n.predicted_s
        calibrated[n.group] = n.calibrated_s
    groups = tuple(WitnessGroup(g, statistics.median(v), len(v), calibrated[g], weight[g]) for g, v in seen.items())
    if not groups or sum(g.weight_s for g in groups) <= 0:
        return None
    return WitnessSpeed(groups)


def host_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscription(local_workers: int, cores: Optional[int] = None, nodes: int = 1) -> Optional[Oversubscription]:
    """The label's data when `local_workers` processes share fewer cores, or the plan's devices lie on `nodes` > 1
    nodes of its cluster that a local launch puts on this one host, else None."""
    cores = host_cores() if cores is None else cores
    if local_workers > cores or (local_workers > 0 and nodes > 1):
        return Oversubscription(local_workers, cores, nodes)
    return None


@dataclass(frozen=True)
class ControlOverhead:
    """What the control plane adds to a measured run (wall clock): the time between a node becoming able to
    start and its start, i.e. a completion's report, the controller's reaction and the command's delivery.

    A node can start once its last predecessor finished and the node that ran before it on any of its
    devices finished (its enabling finish); its control wait is its start minus that (0 if it started
    earlier). `critical_s` sums the waits along each steady step's critical chain (from the step's last
    node back through enabling nodes, inside the step's interval): the part of the step time the control
    plane accounts for."""

    nodes: int  # steady-state nodes measured
    per_node_s: float  # mean control wait per node
    critical_s: float  # median over steady steps of the control waits on the step's critical chain
    step_share: float  # median over steady steps of critical wait / step interval


def control_overhead(preds: dict[str, Sequence[str]], trace: Trace) -> Optional[ControlOverhead]:
    """The control overhead of a wall-clock trace, from the plan's predecessor lists (node id -> ids);
    None with fewer than two steps (no steady state)."""
    steady = steady_state(trace)
    if steady is None:
        return None
    recs = trace.nodes
    enabling: dict[str, Optional[str]] = {}
    last_on: dict[int, str] = {}
    for r in sorted(recs.values(), key=lambda r: (r.start, r.finish, r.id)):
        before = [p for p in preds.get(r.id, ()) if p in recs]
        before += [last_on[d] for d in r.devices if d in last_on]
        enabling[r.id] = max(before, key=lambda p: recs[p].finish, default=None)
        for d in r.devices:  # nodes sharing a device never overlap: the latest started ran last
            last_on[d] = r.id

    def wait(node: str, after: float = float("-inf")) -> float:
        e = enabling[node]
        ready = max(recs[e].finish if e is not None else recs[node].start, after)
        return max(0.0, recs[node].start - ready)

    steady_nodes = [r.id for r in recs.values() if steady.first_step <= r.step <= steady.last_step]
    finish = {s.step: s.finish for s in trace.steps}
    critical, shares = [], []
    for k in range(steady.first_step, steady.last_step + 1):
        if k - 1 not in finish or k not in finish or finish[k] <= finish[k - 1]:
            continue
        lo = finish[k - 1]
        node: Optional[str] = max((r.id for r in recs.values() if r.step == k), key=lambda i: recs[i].finish)
        total = 0.0
        while node is not None and recs[node].finish > lo:
            total += wait(node, after=lo)
            node = enabling[node]
        critical.append(total)
        shares.append(total / (finish[k] - lo))
    if not steady_nodes or not critical:
        return None
    return ControlOverhead(
        nodes=len(steady_nodes),
        per_node_s=statistics.fmean(wait(i) for i in steady_nodes),
        critical_s=statistics.median(critical),
        step_share=statistics.median(shares),
    )


@dataclass(frozen=True)
class PartTime:
    """One part of a run (a vertex, or one kind of transfer) over the steady-state steps: medians of its nodes."""

    label: str
    nodes: int
    measured_s: float  # run time, start to finish
    predicted_s: float  # the annotated time less the control round trip priced before it
    beside: Optional[float] = None  # median share of its run time beside another core's operator; None: not known
    # mean s its worker thread waited for a core in one of its nodes (the trace's `waited`); None: not measured. The
    # mean, not the median: a few long waits are the part's time as much as many short ones
    waited: Optional[float] = None

    @property
    def ratio(self) -> Optional[float]:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else None


def part_label(node: ExecNode) -> str:
    """The part of a run a node belongs to: its vertex, or what a transfer moves and where."""
    if node.kind == "op":  # a quantile phase is a part of its own: the first holds the prefill
        vertex = node.vertex or node.id
        return f"{vertex} phase {node.phase}/{node.nphases}" if node.phase is not None else vertex
    if node.kind == "reshard":
        return f"reshard @{node.model}"
    what = f"%{node.container}" if node.container else f"@{node.model} weights"
    where = " to the verifier pool" if node.alloc is None else " from the verifier pool" if node.src_alloc is None \
        else ""
    return f"transfer {what}{where}"


def part_times(timings: Iterable, labels: Mapping[str, str], steps: range, control_s: float,
               beside: Optional[Mapping[str, float]] = None,
               waited: Optional[Mapping[str, float]] = None) -> list[PartTime]:
    """`timings` (runtime.verify.NodeTiming) of the nodes of `steps` grouped by `labels` (node id -> part, the
    plan's order), each part's median measured run time against the median of its priced time less `control_s`;
    with `beside` (node id -> share: `beside_shares`), the median share of its nodes that have one; with `waited`
    (node id -> s), the mean wait for a core of its nodes that have one."""
    beside, waited = beside or {}, waited or {}
    groups: dict[str, list[tuple[float, float, Optional[float], Optional[float]]]] = {
        label: [] for label in labels.values()}
    for t in timings:
        if t.step in steps and t.id in labels and t.predicted_time is not None:
            groups[labels[t.id]].append((t.measured_time, max(0.0, t.predicted_time - control_s), beside.get(t.id),
                                         waited.get(t.id)))
    return [PartTime(label, len(rows), statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
                     _known(statistics.median, (r[2] for r in rows)), _known(statistics.fmean, (r[3] for r in rows)))
            for label, rows in groups.items() if rows]


def _known(statistic: Callable[[list[float]], float], values: Iterable[Optional[float]]) -> Optional[float]:
    """`statistic` of the values that are not None; None where none is."""
    known = [v for v in values if v is not None]
    return statistic(known) if known else None


@dataclass(frozen=True)
class Busy:
    """An operator node's run on the measured clock and the cores its process(es) compute on."""

    id: str
    host: int
    cores: frozenset  # device ids (a verifier pool: its own id, one past the devices)
    start: float
    finish: float


def beside_shares(busy: Sequence[Busy]) -> dict[str, float]:
    """Per operator node, the share of its run time during which another core of its host ran another operator:
    the length of the union of the others' runs (on cores it does not hold) within its own, over its own."""
    by_host: dict[int, list[Busy]] = {}
    for b in sorted(busy, key=lambda b: b.start):
        by_host.setdefault(b.host, []).append(b)
    out: dict[str, float] = {}
    for runs in by_host.values():
        starts = [o.start for o in runs]
        running: list[tuple[float, int]] = []  # (finish, index) of the runs started before the current one
        for i, b in enumerate(runs):
            while running and running[0][0] <= b.start:
                heapq.heappop(running)
            # the runs it meets: those still running when it starts and those that start while it runs (the work
            # is the number of overlapping pairs, whatever the runs' lengths)
            near = [runs[j] for _, j in running] + runs[i + 1:bisect.bisect_left(starts, b.finish, lo=i + 1)]
            heapq.heappush(running, (b.finish, i))
            if b.finish <= b.start:
                continue
            inside = sorted((max(o.start, b.start), min(o.finish, b.finish)) for o in near
                            if not (o.cores & b.cores) and o.finish > b.start)
            out[b.id] = _union_length(inside) / (b.finish - b.start)
    return out


def _union_length(spans: Sequence[tuple[float, float]]) -> float:
    """The length of the union of sorted spans."""
    total, end = 0.0, float("-inf")
    for lo, hi in spans:
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total
