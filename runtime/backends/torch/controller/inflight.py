"""The nodes a torch run has sent to its workers and not yet completed: the ranks' reports gathered into one
Completion per node, and the workers watched while the controller waits (a death, an error report or a node past
its timeout stops the run with a message naming the node, the device and the worker).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from rpegc.runtime.backends.base import BackendError, Completion, Dispatch
from rpegc.runtime.backends.torch.checkpoints.exports import Exports
from rpegc.runtime.backends.torch.controller.pool import WorkerPool
from rpegc.runtime.backends.torch.controller.run_record import RunRecord


@dataclass
class Pending:
    """A node its ranks run. It starts when its last rank begins it (before, it cannot have begun on all
    its devices) and finishes when the last of its `ends` ranks finished."""

    dispatch: Optional[Dispatch]
    ranks: set[int]
    ends: frozenset[int] = frozenset()
    start: float = float("-inf")
    finish: float = float("-inf")
    bytes: int = 0
    versions_in: dict = field(default_factory=dict)
    versions_out: dict = field(default_factory=dict)
    since: float = 0.0  # when it could start: sent, or the last node it is chained after finished
    after: tuple[str, ...] = ()  # the nodes it is chained after
    microtasks: list = field(default_factory=list)  # a fused member's, as its ranks report them
    waited: Optional[float] = None  # the most any rank's thread waited for a core while it ran it (None: unmeasured)
    witness: list = field(default_factory=list)  # each speed witness its ranks and pool processes ran, s
    senders: frozenset[int] = frozenset()  # ranks that run it on their sender thread (a transfer's sources)


class InFlight:
    """The run's nodes in flight and what their workers reported: completions, memory, metrics, exports."""

    def __init__(self, pool: WorkerPool, device_of: dict[int, int], timeout_s: float, now: Callable[[], float],
                 record: RunRecord, exports: Exports):
        self.pool, self.device_of, self.timeout_s, self.now = pool, device_of, timeout_s, now
        self.record, self.exports = record, exports
        self.pending: dict[str, Pending] = {}
        self.ready: list[Completion] = []
        self.mem: dict[int, float] = {}  # bytes each device held at its last report
        self.peak: dict[int, float] = {}
        self.count = 0  # nodes completed
        self.failed = False

    def fail(self, message: str, loc=None) -> None:
        self.failed = True
        raise BackendError(loc, message)

    # -- sending ---------------------------------------------------------------------------------------

    def done_at_once(self, d: Dispatch) -> None:
        """A node with nothing to send (the copy is already where and as it should be): done when dispatched."""
        t = self.now()
        self.ready.append(Completion(node=d.id, start=t, finish=t, bytes=0, versions_in=(),
                                     versions_out=d.versions_out))
        self.count += 1

    def sent(self, d: Dispatch, ranks, ends: frozenset[int], after: tuple[str, ...] = (),
             senders: frozenset[int] = frozenset()) -> None:
        self.pending[d.id] = Pending(d, set(ranks), ends or frozenset(ranks), since=self.now(), after=after,
                                     senders=senders)

    def running(self, node: str) -> Optional[Pending]:
        return self.pending.get(node)

    def queued(self, pend: Pending) -> bool:
        """Whether a chained node still waits in its workers' queues behind an unfinished predecessor."""
        return any(a in self.pending for a in pend.after)

    # -- receiving -------------------------------------------------------------------------------------

    def await_ready(self, world: int) -> None:
        """Wait until the `world` workers have said they are ready (each built its models and joined its groups)."""
        ready: set[int] = set()
        deadline = time.time() + self.timeout_s
        while len(ready) < world:
            msg = self.receive_one()
            if msg is not None and msg["type"] == "ready":
                ready.add(msg["rank"])
            elif msg is None and time.time() > deadline:
                where = (f"see the worker logs in {self.pool.log_dir}" if self.pool.log_dir else
                         "see the workers' own output (a worker without this run's secret file stops at once)")
                self.fail(f"only {len(ready)} of {world} workers started within {self.timeout_s:.0f} s; {where}")

    def wait(self) -> list[Completion]:
        if not self.ready and not self.pending:
            raise BackendError(None, "wait() with nothing running")
        if not self.ready:
            self.pool.flush_releases()
        while not self.ready:
            self.receive_one()
        out, self.ready = self.ready, []
        return out

    def receive_one(self) -> Optional[dict]:
        """Handle the next report, or check on the workers when none came; returns a report of another kind."""
        msg = self.pool.poll()
        if msg is None:
            self.check_workers()
            return None
        return self.on_message(msg)

    def drain_exports(self) -> None:
        deadline = time.time() + self.timeout_s
        while self.exports.jobs:
            if self.receive_one() is None and time.time() > deadline:
                self.fail("exports of checkpoints or final weights did not finish in time")

    def check_workers(self) -> None:
        exited = self.pool.exited()
        if exited is not None:
            r, rc = exited
            running = [p for p, pend in self.pending.items() if r in pend.ranks and not self.queued(pend)]
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            what = f"while running node {', '.join(running)}" if running else "while idle"
            why = "; SIGKILL comes from the kernel's out-of-memory killer or a kill -9" if rc == -signal.SIGKILL else ""
            self.fail(f"worker {r} (device {self.device_of.get(r, r)}) {how} {what}; the run stopped "
                      f"(log: {self.pool.log_path(r)}){why}")
        now = self.now()
        for node, pend in self.pending.items():
            if now - pend.since > self.timeout_s and not self.queued(pend):
                devs = sorted(self.device_of[r] for r in pend.ranks)
                self.fail(f"node {node} did not finish within {self.timeout_s:.0f} s on device(s) {devs}")

    def on_message(self, msg: dict) -> Optional[dict]:
        """A worker's report: an error stops the run, a node's or an export's completion is recorded; any other
        report (a worker's `ready`) is returned to the caller."""
        if msg["type"] == "error":
            self._error(msg)
        if msg["type"] != "done":
            return msg
        r = msg["rank"]
        d = self.device_of[r]
        self.mem[d] = float(msg.get("mem", 0))
        self.peak[d] = max(self.peak.get(d, 0.0), self.mem[d])
        if "export" in msg:
            self.exports.report(r, msg)
            return None
        pend = self.pending[msg["node"]]
        pend.ranks.discard(r)
        pend.start = max(pend.start, msg["start"])
        if r in pend.ends:
            pend.finish = max(pend.finish, msg["finish"])
        pend.bytes += int(msg.get("bytes", 0))
        pend.versions_in.update(msg.get("versions_in") or {})
        pend.versions_out.update(msg.get("versions_out") or {})
        pend.microtasks += [tuple(t) for t in msg.get("microtasks") or ()]
        if msg.get("waited") is not None:
            pend.waited = max(pend.waited or 0.0, float(msg["waited"]))
        pend.witness += [float(s) for s in msg.get("witness") or ()]
        if msg.get("metrics") or msg.get("reward_stats"):
            assert pend.dispatch is not None
            step = pend.dispatch.node.step
            if msg.get("metrics"):
                self.record.add_metrics(step, msg["metrics"])
            if msg.get("reward_stats"):
                self.record.reward_report(step, msg["reward_stats"])
        if not pend.ranks:
            self._complete(msg["node"], pend)
        return None

    def _error(self, msg: dict) -> None:
        # A worker that died makes its peers' collectives fail a moment later: report the death, the cause, if one
        # shows within a second.
        deadline = time.time() + 1.0
        while time.time() < deadline:
            self.check_workers()
            time.sleep(0.05)
        r = msg["rank"]
        dev = self.device_of.get(r, r)
        if msg.get("node"):
            self.fail(f"node {msg['node']} failed on device {dev} (worker {r}): {msg['message'].strip()}")
        self.fail(f"worker {r} (device {dev}) failed in {msg['what']}: {msg['message'].strip()}")

    def _complete(self, node: str, pend: Pending) -> None:
        del self.pending[node]
        now = self.now()
        for other in self.pending.values():
            if node in other.after:
                other.since = now
        d = pend.dispatch
        assert d is not None
        out = d.versions_out if d.node.kind != "op" else tuple(sorted(pend.versions_out.items()))
        self.ready.append(Completion(node=node, start=pend.start, finish=pend.finish, bytes=pend.bytes,
                                     versions_in=tuple(sorted(pend.versions_in.items())), versions_out=out,
                                     microtasks=tuple(sorted(pend.microtasks, key=lambda t: (t[0], t[4], t[5]))),
                                     waited=pend.waited, witness=tuple(pend.witness)))
        self.count += 1


def is_training(d: Dispatch) -> bool:
    return d.node.kind == "op" and d.node.node.role == "training"
