"""Where a run's host cores go: each process's main thread's time on a core and waiting for one, and its other
threads' time on a core, from Linux's per-thread scheduler statistics (/proc/self/task/TID/schedstat: ns on a core,
ns runnable but waiting for one, time slices).

A CPU worker's main thread runs the plan's operators on the core it is bound to (controller/pinning.py); a verifier
pool's worker hands its responses to its child processes (counted apart, while they live); everything else floats:
the controller, and each worker's command reader, sender and gloo transport threads. Where every core of the host is
taken by a worker, that work preempts the operators, and a node takes longer than its price by the time its main
thread waited (docs/calibration.md, "What slows the nodes that share their cores"). The cost model prices that work
where the profile calibrates it ([overhead] contention and node, core/cost/contention.py); rpeg-run shows it. A
worker also reads its thread's wait around each node it runs (`thread_wait_s`): the trace's `waited`, which the
overheads' control runs calibrate `contention` from (tools/overhead_timing.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from rpegc.runtime.backends.torch.controller.processes import descendants

TASKS = "/proc/self/task"
WAIT_NOTE = 0.05  # a main thread that waited longer than this share of the time it ran is named in the summary
BUSY_NOTE = 0.1  # ... if it ran at least this many cores: a worker that mostly waits for others is not the plan's time


@dataclass(frozen=True)
class ThreadCpu:
    """A process's threads at one moment: seconds its main thread ran and waited for a core, its others ran, and its
    living child processes' threads ran and waited for a core."""

    at: float  # time.monotonic()
    main_on: float
    main_wait: float
    others_on: float
    children_on: float = 0.0
    children_wait: float = 0.0


def read_thread_cpu(main_tid: Optional[int] = None, children: bool = False) -> Optional[ThreadCpu]:
    """This process's threads now (`main_tid`: the main thread's id, default the caller's; `children`: also its
    living descendant processes', a worker's verifier pool); None where the kernel keeps no per-thread statistics."""
    main = main_tid if main_tid is not None else threading.get_native_id()
    on = wait = others = 0.0
    found = False
    for tid, (ran, waited) in _threads(TASKS):
        if tid == main:
            on, wait, found = ran, waited, True
        else:
            others += ran
    below = [t for pid in (descendants(os.getpid()) if children else []) for _, t in _threads(f"/proc/{pid}/task")]
    return ThreadCpu(time.monotonic(), on, wait, others, sum(ran for ran, _ in below),
                     sum(waited for _, waited in below)) if found else None


def thread_wait_s() -> Optional[float]:
    """Seconds the calling thread has been runnable but waiting for a core since it started; None where the kernel
    keeps no per-thread statistics. A worker reads it around each node (trace.NodeRecord.waited)."""
    stat = _schedstat("/proc/thread-self/schedstat")
    return None if stat is None else stat[1]


def _schedstat(path: str) -> Optional[tuple[float, float]]:
    """(s on a core, s runnable but waiting for one) of a thread's schedstat file; None where it cannot be read (the
    thread exited, or no /proc here)."""
    try:
        with open(path, encoding="ascii") as f:
            ran, waited = (int(x) / 1e9 for x in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return ran, waited


def _threads(tasks: str) -> list[tuple[int, tuple[float, float]]]:
    """(thread id, (s on a core, s waiting for one)) of every thread under a /proc task directory that still lives."""
    out = []
    try:
        tids = os.listdir(tasks)
    except OSError:
        return out  # the process exited, or no /proc here
    for tid in tids:
        stat = _schedstat(os.path.join(tasks, tid, "schedstat"))
        if stat is not None:  # else the thread exited meanwhile
            out.append((int(tid), stat))
    return out


@dataclass(frozen=True)
class CoreUse:
    """Cores a process used between two readings: per second of the wall span, its main thread's time on a core and
    waiting for one, its other threads' time on a core, its child processes' (a verifier pool's) on a core and waiting
    for one."""

    span_s: float
    main: float
    main_wait: float
    others: float
    children: float = 0.0
    children_wait: float = 0.0

    def plain(self) -> dict[str, float]:
        """As a worker's bye carries it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, d) -> Optional["CoreUse"]:
        """The `plain` form back; None for anything else."""
        names = [f.name for f in dataclasses.fields(cls)]
        ok = isinstance(d, dict) and sorted(d) == sorted(names) and all(
            isinstance(d[n], (int, float)) and not isinstance(d[n], bool) and math.isfinite(d[n]) for n in names)
        return cls(**{n: float(d[n]) for n in names}) if ok else None


def usage(start: Optional[ThreadCpu], end: Optional[ThreadCpu]) -> Optional[CoreUse]:
    """The cores used between two readings; None where either is missing."""
    if start is None or end is None or end.at <= start.at:
        return None
    span = end.at - start.at
    return CoreUse(span, (end.main_on - start.main_on) / span, (end.main_wait - start.main_wait) / span,
                   (end.others_on - start.others_on) / span, max(0.0, end.children_on - start.children_on) / span,
                   max(0.0, end.children_wait - start.children_wait) / span)


def cpu_lines(workers: Mapping[int, CoreUse], controller: Optional[CoreUse],
              pools: frozenset[int] = frozenset(), oversubscribed: bool = False, priced: bool = False) -> list[str]:
    """The summary's lines: per worker (rank -> `usage`; `pools`: the ranks that run a verifier pool, with their pool
    processes' cores) and for the controller's process, the cores they took from their start to their stop; a note where
    a device worker's main thread waited for a core (module docstring), unless the run has more workers than cores
    (`oversubscribed`: they wait for each other, as the summary says) or the profile prices it (`priced`)."""
    if not workers:
        return []
    lines = ["threads on the host's cores (cores busy per second of the run, /proc schedstat):"]
    for r, u in sorted(workers.items()):
        what = " (the verifier pool's)" if r in pools else ""
        pool = f"; its pool processes {u.children:.2f}, waiting for a core {u.children_wait:.2f}" if r in pools else ""
        lines.append(f"  worker {r}{what}: main thread {u.main:.2f}, waiting for a core {u.main_wait:.2f}; "
                     f"its other threads {u.others:.2f}{pool}")
    if controller is not None:
        lines.append(f"  controller: {controller.main + controller.others:.2f}")
    waited = {r: u.main_wait / u.main for r, u in workers.items() if u.main >= BUSY_NOTE and r not in pools}
    if waited and max(waited.values()) > WAIT_NOTE and not oversubscribed and not priced:
        worst = max(waited, key=lambda r: waited[r])
        lines.append(f"note: worker {worst}'s main thread waited for a core {waited[worst]:.0%} of the time it ran: "
                     "the controller and the workers' other threads share the cores of the plan's operators, which "
                     "the profile does not price (it has no [overhead] contention: calibrate it again, "
                     "docs/calibration.md)")
    return lines
