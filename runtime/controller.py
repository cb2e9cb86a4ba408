"""The completion-driven controller (paper Sec. VII, Alg. 2; docs/architecture.md, Runtime).

`run(plan, backend)` realises a `RunPlan` on a backend:

A. bind every node to workers and a resource set R(x): an Op node its allocation; a Comm/Reshard
   node its destination allocation ("destination", the scheduler's reservation rule, spec 7) or
   both endpoints ("endpoints", Table III). The backend chooses the default; callers may override.
B. launch the persistent workers once (`backend.start`) and install the initial checkpoint
   (version 0) wherever a node reads it.
C. dispatch completion-driven: a node is ready when all its predecessors completed; ready nodes are
   visited by RL step, then Comm/Reshard before Op, then topological order, and one starts when
   R(x) is free. On each completion the controller records it, publishes the node's outputs and
   model versions, releases R(x), and releases every artifact and parameter copy that no remaining
   node consumes. Nothing ever waits on a predicted time.

Dispatch policies:
- "alg2": exactly the above.
- "plan": additionally, on every device the nodes run in the plan's order (planned start, then
  planned finish, then topological order), as if the schedule's per-device sequence were extra
  dependency edges. Still completion-driven: a node waits for completions only, never for a clock.
  If every node takes exactly its predicted time and R(x) is the scheduler's reservation
  ("destination"), each node then starts at max(finish of its predecessors, finish of the previous
  node on its devices), which is exactly the start Alg. 5 assigned, so the run reproduces the
  schedule's start times and makespan. "alg2" does not guarantee that: its ready order differs from
  the scheduler's (EST, transfer first, rank, order) and a greedy first-fit can start a node early
  that delays a more critical one.
- "auto": "plan" when every node has a planned start and finish, else "alg2".

Chained dispatch ("plan" policy, `RunOptions.lookahead` > 0). Waiting for a completion to reach the
controller and the next command to reach a worker costs a round trip per node (on a CPU host ~1 ms: two
process wake-ups and the controller's reaction). Workers run their commands in the order they get them,
so a node whose unfinished predecessors end on its own workers can be handed over early: it waits in its
workers' queues and starts the moment they finish. The controller offers a node for chaining when every
predecessor (plan order included) has been handed over and at most `lookahead` nodes would wait ahead of
it; the backend takes it only if it can guarantee that the node's start (its last worker begins it) comes
after each unfinished predecessor's finish (`Backend.chain`), else the node waits for its completions as
usual. So every dependency still holds in the trace, and `verify` checks chained runs like any other.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Callable, Optional

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.base import RESERVE_RULES, Backend, BackendError, Completion, Dispatch
from rpegc.core.cost.host import alloc_devices
from rpegc.runtime.plan import Artifact, RunNode, RunPlan
from rpegc.runtime.trace import (
    ArtifactEvent,
    NodeRecord,
    StepRecord,
    Trace,
    TraceHeader,
    event_record,
    header_record,
    node_record,
    step_record,
)

POLICIES = ("auto", "plan", "alg2")


@dataclass(frozen=True)
class RunOptions:
    policy: str = "auto"
    reserve: Optional[str] = None  # None: the backend's default_reserve
    lookahead: int = 2  # "plan" policy: nodes a worker may hold queued behind its running one (0: none)


@dataclass(frozen=True)
class StepProgress:
    """Reported once per completed RL step (all its nodes finished)."""

    step: int
    finish: float  # backend clock
    predicted_finish: Optional[float]
    steps_done: int
    steps_total: int
    wall_s: float


@dataclass
class RunResult:
    trace: Trace
    makespan: float
    predicted_makespan: Optional[float]
    wall_s: float
    policy: str
    reserve: str
    controller_s: float = 0.0  # the dispatch loop's own time: all of it but the waits in backend.wait()


def resolve_policy(plan: RunPlan, policy: str) -> str:
    if policy not in POLICIES:
        raise RpegError(None, f"unknown dispatch policy '{policy}'; use one of {', '.join(POLICIES)}")
    if policy == "auto":
        return "plan" if plan.scheduled else "alg2"
    if policy == "plan" and not plan.scheduled:
        raise RpegError(
            plan.program.exec.loc if plan.program.exec else None,
            "the 'plan' dispatch policy follows the schedule's order, but the plan has no start/finish times; "
            "run the schedule pass or use the 'alg2' policy",
        )
    return policy


def check_lookahead(lookahead: int) -> int:
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise RpegError(None, f"lookahead {lookahead!r}: give a whole number >= 0 of queued commands (0: none)")
    return lookahead


def resolve_reserve(backend: Backend, reserve: Optional[str]) -> str:
    rule = reserve or backend.default_reserve
    if rule not in RESERVE_RULES:
        raise RpegError(None, f"unknown reservation rule '{rule}'; use one of {', '.join(RESERVE_RULES)}")
    return rule


def reserved_devices(n: RunNode, rule: str) -> tuple[int, ...]:
    """R(x): an Op node's allocation; a transfer's destination, plus its source under "endpoints"; a node on the
    verifier pool also holds the devices whose cores the pool shares (cost/host.py)."""
    extra = n.node.shares + (n.src_devices if n.kind != "op" and rule != "destination" else ())
    return tuple(sorted(set(n.devices) | set(extra))) if extra else n.devices


def dispatch_key(n: RunNode) -> tuple:
    """Alg. 2 line 7: RL step, then Comm/Reshard before Op, then the fixed topological order."""
    return (n.step, 0 if n.is_transfer else 1, n.index)


def planned_key(n: RunNode) -> tuple:
    return (n.node.start, n.node.finish, n.index)


def device_order_edges(plan: RunPlan, reserved: list[tuple[int, ...]]) -> set[tuple[int, int]]:
    """(previous, next) pairs of consecutive nodes on each device in the plan's order; the members of a fusion
    are one unit there (they run together): the unit before them precedes each, each precedes the unit after."""
    members = {i: g for g in plan.fusion_groups() for i in g}
    by_device: dict[int, list[tuple[int, ...]]] = {}
    for n in sorted(plan.nodes, key=planned_key):
        unit = members.get(n.index, (n.index,))
        for d in reserved[n.index]:
            seq = by_device.setdefault(d, [])
            if not seq or seq[-1] != unit:
                seq.append(unit)
    edges: set[tuple[int, int]] = set()
    for seq in by_device.values():
        for before, after in zip(seq, seq[1:]):
            edges.update((before[0], v) for v in after)
    return edges


def _mask(devices: tuple[int, ...], cache: dict[tuple[int, ...], int]) -> int:
    m = cache.get(devices)
    if m is None:
        m = 0
        for d in devices:
            m |= 1 << d
        cache[devices] = m
    return m


class _Run:
    """State of one execution (Alg. 2 lines 3-26)."""

    def __init__(self, plan: RunPlan, backend: Backend, policy: str, reserve: str,
                 sink: Optional[Callable[[dict], None]], on_step: Optional[Callable[[StepProgress], None]],
                 lookahead: int = 0):
        self.plan, self.backend, self.policy, self.reserve = plan, backend, policy, reserve
        self.lookahead = lookahead if policy == "plan" else 0
        self.sink, self.on_step = sink, on_step
        nodes = plan.nodes
        self.reserved = [reserved_devices(n, reserve) for n in nodes]
        cache: dict[tuple[int, ...], int] = {}
        self.masks = [_mask(r, cache) for r in self.reserved]
        self.succs = [list(n.succs) for n in nodes]
        self.remaining = [len(n.preds) for n in nodes]
        if policy == "plan":
            for u, v in device_order_edges(plan, self.reserved):
                if v not in nodes[u].succs:
                    self.succs[u].append(v)
                    self.remaining[v] += 1
        self.fused = {i: g for g in plan.fusion_groups() for i in g}  # member -> its fusion's members
        self.keys = [dispatch_key(n) for n in nodes]
        self.preds: list[list[int]] = [[] for _ in nodes]
        for u, vs in enumerate(self.succs):
            for v in vs:
                self.preds[v].append(u)
        self.issued = [False] * len(nodes)
        self.unissued = [len(p) for p in self.preds]  # predecessors not yet dispatched
        self.candidates: list[tuple[tuple, int]] = []  # chaining candidates: all predecessors dispatched
        self.cons_left = {a: len(c) for a, c in plan.consumers.items()}
        self.cons_unissued = dict(self.cons_left)  # consumers not yet handed to the backend
        self.prod_left = {a: len(p) for a, p in plan.producers.items()}
        self.present: set[Artifact] = set()
        self.steps_left: dict[int, int] = {}
        self.predicted_finish: dict[int, float] = {}  # per step, its last node's scheduled finish
        for n in nodes:
            self.steps_left[n.step] = self.steps_left.get(n.step, 0) + 1
            if plan.scheduled:
                self.predicted_finish[n.step] = max(self.predicted_finish.get(n.step, n.node.finish), n.node.finish)
        self.step_nodes = dict(self.steps_left)
        self.step_finish: dict[int, float] = {}
        self.node_records: dict[str, NodeRecord] = {}
        self.events: list[ArtifactEvent] = []
        self.step_records: list[StepRecord] = []
        self.dispatched_at: dict[int, float] = {}
        self.waiting_s = 0.0  # time blocked in backend.wait()
        self.loop_s = 0.0
        self.running: dict[str, int] = {}
        self.workers: dict[int, int] = {}
        self.wall0 = time.perf_counter()

    def emit(self, record: dict) -> None:
        if self.sink is not None:
            self.sink(record)

    # -- A, B: realise and launch -------------------------------------------------------------

    def launch(self, options: dict) -> None:
        self.workers = dict(self.backend.start(self.plan))
        missing = [d for d in self.plan.devices if d not in self.workers]
        if missing:
            raise BackendError(None, f"backend '{self.backend.name}' launched no worker for device(s) {missing[:8]}")
        h = TraceHeader(
            plan_hash=self.plan.hash, plan_file=self.plan.file, backend=self.backend.name, clock=self.backend.clock,
            steps=self.plan.steps, plan_steps=self.plan.plan_steps, policy=self.policy, reserve=self.reserve,
            workers=self.workers, options=options, first_step=self.plan.first_step,
        )
        self.header = h
        self.emit(header_record(h))
        for a in self.plan.initial:
            self.backend.install(a, self.devices_of(a))
            self.present.add(a)
            e = ArtifactEvent("install", a.label, self.backend.now())
            self.events.append(e)
            self.emit(event_record(e))

    def devices_of(self, a: Artifact) -> tuple[int, ...]:
        assert self.plan.program.cluster is not None
        return alloc_devices(a.alloc, self.plan.program.cluster)

    # -- C: dispatch loop ------------------------------------------------------------------------

    def loop(self) -> None:
        start = time.perf_counter()
        try:
            self._loop()
        finally:
            self.loop_s = time.perf_counter() - start

    def _loop(self) -> None:
        nodes = self.plan.nodes
        ready: list[tuple[tuple, int]] = sorted((self.keys[i], i) for i, r in enumerate(self.remaining) if r == 0)
        busy = 0
        done = 0
        while done < len(nodes):
            waiting = []
            for entry in ready:
                i = entry[1]
                if self.issued[i]:
                    continue  # a member of a fusion dispatched with another member
                group = self.fused.get(i)
                if group is not None and any(self.remaining[j] for j in group):
                    waiting.append(entry)  # a fusion starts when all its members can
                    continue
                m = self.masks[i]
                if m & busy:
                    waiting.append(entry)
                    continue
                busy |= m
                if group is None:
                    self.dispatch(nodes[i])
                else:
                    self.dispatch_fused([nodes[j] for j in group])
            ready = waiting
            if self.lookahead:
                busy |= self.chain()
            if not self.running:
                stuck = ", ".join(nodes[i].id for _, i in ready[:6]) or "none ready"
                raise BackendError(None, f"the run is stuck: nothing runs and nothing can start ({stuck})")
            waited = time.perf_counter()
            completions = self.backend.wait()
            self.waiting_s += time.perf_counter() - waited
            if not completions:
                raise BackendError(None, f"backend '{self.backend.name}' returned from wait() without a completion")
            touched: list[Artifact] = []
            last: Optional[str] = None
            for c in completions:
                i = self.complete(c)
                done += 1
                last = c.node
                for s in self.succs[i]:
                    self.remaining[s] -= 1
                    if self.remaining[s] == 0 and not self.issued[s]:
                        bisect.insort(ready, (self.keys[s], s))
                touched += nodes[i].outputs
                touched += nodes[i].inputs
            busy = 0  # a chained node holds its devices past its predecessor's completion
            for i in self.running.values():
                busy |= self.masks[i]
            self.release_unused(touched, after=last)

    def chain(self) -> int:
        """Offer the chaining candidates to the backend in dispatch order (those a chained node makes candidates
        too); returns the devices of the nodes it took."""
        taken = 0
        deferred: list[tuple[tuple, int]] = []
        depth: dict[int, int] = {}
        while self.candidates:
            entry = self.candidates.pop(0)
            i = entry[1]
            if self.remaining[i] == 0 or i in self.fused:
                continue  # it is (or becomes) ready the usual way; a fusion's members are never chained
            after = [p for p in self.preds[i] if self.in_flight(p)]
            if 1 + max((self.queue_depth(p, depth) for p in after), default=0) > self.lookahead:
                deferred.append(entry)  # too far ahead for now: offered again after the next completions
                continue
            n = self.plan.nodes[i]
            t = self.backend.now()  # before the backend sends: a worker may start it at once
            if self.backend.chain(self.dispatch_of(n), tuple(self.plan.nodes[p].id for p in after)):
                self.issue(n, t)
                taken |= self.masks[i]
        self.candidates = deferred
        return taken

    def in_flight(self, i: int) -> bool:
        """Node i was handed to the backend and has not completed."""
        return self.plan.nodes[i].id in self.running

    def queue_depth(self, i: int, memo: dict[int, int]) -> int:
        """How many nodes wait ahead of node i's start in its workers' queues, i included (0: i is not queued:
        its predecessors all finished)."""
        d = memo.get(i)
        if d is None:
            ahead = [p for p in self.preds[i] if self.in_flight(p)]
            d = 0 if self.remaining[i] == 0 else 1 + max((self.queue_depth(p, memo) for p in ahead), default=0)
            memo[i] = d
        return d

    def dispatch_of(self, n: RunNode) -> Dispatch:
        return Dispatch(
            node=n,
            reserved=self.reserved[n.index],
            workers=tuple(self.workers[x] for x in n.devices),
            src_workers=tuple(self.workers[x] for x in n.src_devices),
            inputs=n.inputs,
            outputs=n.outputs,
            versions_in=n.node.version_in,
            versions_out=n.node.version_out,
            last_reads=tuple(a for a in n.inputs if self.cons_unissued.get(a) == 1 and a not in self.plan.retained),
        )

    def issue(self, n: RunNode, at: float) -> None:
        """Book `n` as handed to the backend at `at` (dispatched or chained)."""
        self.dispatched_at[n.index] = at
        self.running[n.id] = n.index
        self.issued[n.index] = True
        for a in n.inputs:
            self.cons_unissued[a] -= 1
        for s in self.succs[n.index]:
            self.unissued[s] -= 1
            if self.unissued[s] == 0 and self.lookahead and self.remaining[s]:
                bisect.insort(self.candidates, (self.keys[s], s))

    def dispatch(self, n: RunNode) -> None:
        self.check_present(n)
        d = self.dispatch_of(n)
        self.issue(n, self.backend.now())
        self.backend.submit(d)

    def dispatch_fused(self, members: list[RunNode]) -> None:
        """The members of one fusion, handed to the backend as one operator."""
        for n in members:
            self.check_present(n)
        ds = tuple(self.dispatch_of(n) for n in members)
        at = self.backend.now()
        for n in members:
            self.issue(n, at)
        self.backend.submit_fused(ds)

    def check_present(self, n: RunNode) -> None:
        for a in n.inputs:
            if a not in self.present:
                raise RuntimeError(f"controller bug: {n.id} dispatched before {a.label} is present")

    def complete(self, c: Completion) -> int:
        i = self.running.pop(c.node, None)
        if i is None:
            raise BackendError(None, f"backend '{self.backend.name}' reported node '{c.node}', which is not running")
        n = self.plan.nodes[i]
        s = n.node.strategy
        rec = NodeRecord(
            id=n.id, kind=n.kind, step=n.step, dispatch=self.dispatched_at[i], start=c.start, finish=c.finish,
            devices=self.reserved[i], workers=tuple(self.workers[x] for x in self.reserved[i]),
            strategy=(s.dp, s.pp, s.tp, s.mb) if s is not None else None,
            consumed=c.versions_in, produced=c.versions_out, bytes=c.bytes,
            inputs=tuple(a.label for a in n.inputs), outputs=tuple(a.label for a in n.outputs),
            microtasks=c.microtasks, waited=c.waited, witness=c.witness,
        )
        self.node_records[n.id] = rec
        self.emit(node_record(rec))
        self.present.update(n.outputs)  # publish outputs and model versions
        for a in n.outputs:
            self.prod_left[a] -= 1
        for a in n.inputs:
            self.cons_left[a] -= 1
        self.finish_step(n, c.finish)
        return i

    def release_unused(self, artifacts: list[Artifact], after: Optional[str]) -> None:
        """Alg. 2 line 24: free artifacts whose consumers and producers have all completed."""
        for a in dict.fromkeys(artifacts):
            if a not in self.present or a in self.plan.retained:
                continue
            if self.cons_left.get(a, 0) or self.prod_left.get(a, 0):
                continue
            self.backend.release(a, self.devices_of(a))
            self.present.discard(a)
            e = ArtifactEvent("release", a.label, self.backend.now(), after)
            self.events.append(e)
            self.emit(event_record(e))

    def finish_step(self, n: RunNode, finish: float) -> None:
        k = n.step
        self.step_finish[k] = max(self.step_finish.get(k, finish), finish)
        self.steps_left[k] -= 1
        if self.steps_left[k]:
            return
        predicted = self.predicted_finish.get(k)
        rec = StepRecord(k, self.step_finish[k], predicted, self.step_nodes[k])
        self.step_records.append(rec)
        self.emit(step_record(rec))
        self.backend.step_done(k, rec.finish)
        if self.on_step is not None:
            done = sum(1 for left in self.steps_left.values() if left == 0)
            self.on_step(StepProgress(k, rec.finish, predicted, done, len(self.steps_left),
                                      time.perf_counter() - self.wall0))

    def summary(self) -> dict:
        peak = self.backend.peak_memory()
        makespan = max((r.finish for r in self.node_records.values()), default=0.0)
        out = {
            "steps": self.plan.steps,
            "nodes": len(self.node_records),
            "makespan": makespan,
            "predicted_makespan": self.plan.predicted_makespan,
            "wall_s": time.perf_counter() - self.wall0,
            "peak_memory": max(peak.values(), default=0.0),
        }
        self.emit({"type": "summary", **out})
        return out


def run(
    plan: RunPlan,
    backend: Backend,
    options: RunOptions = RunOptions(),
    sink: Optional[Callable[[dict], None]] = None,
    on_step: Optional[Callable[[StepProgress], None]] = None,
    header_options: Optional[dict] = None,
) -> RunResult:
    """Alg. 2: execute `plan` on `backend`; returns the trace (also streamed record by record to `sink`)."""
    policy = resolve_policy(plan, options.policy)
    reserve = resolve_reserve(backend, options.reserve)
    state = _Run(plan, backend, policy, reserve, sink, on_step, check_lookahead(options.lookahead))
    try:
        state.launch(header_options or {})
        state.loop()
        summary = state.summary()
    finally:
        backend.shutdown()
    trace = Trace(
        header=state.header, nodes=state.node_records, events=state.events, steps=state.step_records,
        summary=summary, file="<memory>",
    )
    return RunResult(
        trace=trace,
        makespan=summary["makespan"],
        predicted_makespan=summary["predicted_makespan"],
        wall_s=summary["wall_s"],
        policy=policy,
        reserve=reserve,
        controller_s=max(0.0, state.loop_s - state.waiting_s),
    )
