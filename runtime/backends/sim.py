"""The simulated backend: a discrete-event clock driven by the plan's annotated node times.

Paper: Sec. VII (the runtime executes the plan; predicted times guide selection only) and docs/architecture.md,
Runtime ("sim: simulated clock from the annotated times, scales to thousands of devices").
One process, no workers: a node submitted at simulated time t finishes at t + time(x) * factor, where
factor is 1 without jitter and otherwise a seeded multiplicative draw per node (uniform in
[1 - x, 1 + x], or lognormal exp(N(0, x))). Draws depend only on (seed, node id), so a run is
reproducible whatever the dispatch order. The backend keeps the set of artifacts that exist (installed,
produced, not yet released) and fails a node whose bound input is missing, so a controller that
released something early is caught; it also accounts the bytes those artifacts hold per device.
A chained node (`chain`, "plan" policy) starts at its running predecessors' latest finish: with no
control delay to save, a chained run has the same starts and finishes as one that is not.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.base import Backend, BackendError, BackendSpec, Completion, Dispatch
from rpegc.runtime.backends.options import cli_option
from rpegc.runtime.plan import Artifact, RunPlan

DISTRIBUTIONS = ("uniform", "lognormal")
# The largest lognormal sigma: at sigma 3 one node in a thousand already runs e^(3 * 3.09) ~ 10^4 times its
# predicted time and the mean factor is e^(sigma^2 / 2) = 90; a larger sigma models no machine and drives
# exp() towards overflow (it overflows past e^709).
MAX_LOGNORMAL_SIGMA = 3.0
MAX_EXPONENT = 700.0  # exp(700) ~ 1e304 is still a finite double


class SimBackend(Backend):
    name = "sim"
    clock = "sim"
    default_reserve = "destination"  # the scheduler's rule, so a jitter-free run replays the schedule

    def __init__(self, jitter: float = 0.0, distribution: str = "uniform", seed: int = 0):
        if distribution not in DISTRIBUTIONS:
            raise RpegError(None, f"unknown jitter distribution '{distribution}'; use {' or '.join(DISTRIBUTIONS)}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not (
                math.isfinite(jitter) and jitter >= 0.0) or (distribution == "uniform" and jitter >= 1.0) or (
                distribution == "lognormal" and jitter > MAX_LOGNORMAL_SIGMA):
            raise RpegError(
                None,
                f"jitter {jitter} is out of range; give 0 <= jitter < 1 for uniform (+-100*jitter %) "
                f"or 0 <= jitter <= {MAX_LOGNORMAL_SIGMA:g} (the log-space sigma) for lognormal",
            )
        self.jitter, self.distribution, self.seed = jitter, distribution, seed
        self._clock = 0.0
        self._events: list[tuple[float, int, Dispatch, float]] = []
        self._seq = 0
        self._finish: dict[str, float] = {}  # node id -> finish, of the nodes submitted and not yet completed
        self._store: set[Artifact] = set()
        self._plan: RunPlan | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, plan: RunPlan) -> dict[int, int]:
        for n in plan.nodes:
            t = n.node.time
            if t is None:
                raise RpegError(
                    n.node.loc,
                    f"node {n.id} has no time annotation; the sim backend runs on predicted times, so run "
                    "the annotate-cost pass (or give `time = ...`) first",
                )
            if not (math.isfinite(t) and t >= 0.0):
                raise RpegError(n.node.loc, f"node {n.id} has time {t}; times must be finite and non-negative")
        self._plan = plan
        self._clock = 0.0
        self._events.clear()
        self._finish.clear()
        self._store.clear()
        size = (max(plan.devices) + 1) if plan.devices else 0
        self._held = np.zeros(size)
        self._peak = np.zeros(size)
        self._index_cache: dict[Artifact, np.ndarray] = {}
        return {d: d for d in plan.devices}  # one persistent worker per device, rank = device id

    def shutdown(self) -> None:
        self._events.clear()

    def now(self) -> float:
        return self._clock

    # -- work -----------------------------------------------------------------------------------

    def factor(self, node_id: str) -> float:
        """The multiplicative jitter of one node; exactly 1.0 without jitter."""
        if self.jitter == 0.0:
            return 1.0
        rng = random.Random(f"{self.seed}/{node_id}")
        if self.distribution == "uniform":
            return 1.0 + rng.uniform(-self.jitter, self.jitter)
        return math.exp(max(-MAX_EXPONENT, min(MAX_EXPONENT, rng.gauss(0.0, self.jitter))))

    def _start(self, d: Dispatch) -> None:
        self._check_inputs(d, set())
        self._schedule(d, self._clock)

    def chain(self, d: Dispatch, after: tuple[str, ...]) -> bool:
        start = max([self._clock] + [self._finish[x] for x in after if x in self._finish])
        self._check_inputs(d, {a for x in self._events if x[0] <= start for a in x[2].outputs})
        self._schedule(d, start)
        return True

    def _check_inputs(self, d: Dispatch, made: set[Artifact]) -> None:
        """Every input of `d` is present, or `made` by a node that finishes before it starts."""
        for a in d.inputs:
            if a not in self._store and a not in made:
                raise BackendError(
                    d.node.node.loc, f"node {d.id} needs {a.label}, which is not present (released or never made)"
                )

    def submit_fused(self, ds: tuple[Dispatch, ...]) -> None:
        """The members of a fusion run as one operator: one duration (the first member's time, which every member
        carries, and its jitter), one start and one finish for all."""
        for d in ds:
            self._check_inputs(d, set())
        for d in ds:
            self._schedule(d, self._clock, timed_as=ds[0])

    def _schedule(self, d: Dispatch, start: float, timed_as: Optional[Dispatch] = None) -> None:
        timed_as = timed_as or d
        t = timed_as.node.node.time
        assert t is not None
        f = self.factor(timed_as.id)
        finish = start + (t if f == 1.0 else t * f)
        if not math.isfinite(finish):
            raise BackendError(
                d.node.node.loc, f"node {d.id}: the simulated clock overflows ({start:g} s + time {t:g} s x "
                                 f"jitter {f:g}); the plan's times are too large to simulate",
            )
        heapq.heappush(self._events, (finish, self._seq, d, start))
        self._finish[d.id] = finish
        self._seq += 1

    run_op = transfer = reshard = _start

    def wait(self) -> list[Completion]:
        if not self._events:
            raise BackendError(None, "wait() with nothing running")
        t = self._events[0][0]
        self._clock = t
        out = []
        while self._events and self._events[0][0] == t:
            _, _, d, start = heapq.heappop(self._events)
            del self._finish[d.id]
            for a in d.outputs:
                self._add(a)
            out.append(Completion(
                node=d.id, start=start, finish=t, bytes=d.node.node.bytes,
                versions_in=self._versions_read(d), versions_out=d.versions_out,
            ))
        return out

    def _versions_read(self, d: Dispatch) -> tuple[tuple[str, int], ...]:
        """The versions of the parameter copies actually bound (looked up in the store, by model)."""
        bound = {a.name: a.index for a in d.inputs if a.kind == "weights" and a in self._store}
        return tuple((m, bound[m]) for m, _ in d.versions_in if m in bound)

    # -- artifacts ------------------------------------------------------------------------------

    def install(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        self._add(artifact, devices)

    def release(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        if artifact not in self._store:
            raise BackendError(None, f"release of {artifact.label}, which is not present")
        self._store.remove(artifact)
        self._account(artifact, -1.0)

    def _add(self, a: Artifact, devices: tuple[int, ...] | None = None) -> None:
        if a in self._store:
            return  # e.g. a Reshard re-lays out a copy that is already there
        self._store.add(a)
        self._account(a, 1.0, devices)

    def _account(self, a: Artifact, sign: float, devices: tuple[int, ...] | None = None) -> None:
        assert self._plan is not None
        if a.alloc is None:
            return  # the verifier pool's copies live in host memory, which the model does not price
        idx = self._index_cache.get(a)
        if idx is None:
            if devices is None:
                assert self._plan.program.cluster is not None
                devices = a.alloc.devices(self._plan.program.cluster)
            idx = self._index_cache[a] = np.asarray(devices, dtype=np.int64)
        share = self._plan.artifact_bytes.get(a, 0) / max(1, len(idx))
        self._held[idx] += sign * share
        if sign > 0:
            self._peak[idx] = np.maximum(self._peak[idx], self._held[idx])

    def memory(self) -> dict[int, float]:
        return {d: float(self._held[d]) for d in self._device_ids()}

    def peak_memory(self) -> dict[int, float]:
        return {d: float(self._peak[d]) for d in self._device_ids()}

    def _device_ids(self) -> tuple[int, ...]:
        """The plan's devices, without the verifier pool (its memory is the host's)."""
        return self._plan.model_devices if self._plan else ()


# -- rpeg-run's view ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SimOptions:
    """rpeg-run's options of the simulated backend."""

    jitter: float = cli_option(0.0, "multiplicative noise on node times (uniform: +-X, lognormal: sigma X)",
                               metavar="X")
    jitter_dist: str = cli_option("uniform", "the distribution of --jitter's noise", choices=DISTRIBUTIONS)
    seed: int = cli_option(0, "rpeg-run's --seed: the jitter's draws", cli=False)


def _check(o: SimOptions) -> None:
    if not math.isfinite(o.jitter) or o.jitter < 0:
        raise RpegError(None, f"--jitter {o.jitter}: give a finite jitter >= 0")


SPEC = BackendSpec(
    name="sim", help="a simulated clock from the annotated node times (the default)", options=SimOptions, check=_check,
    create=lambda o: SimBackend(jitter=o.jitter, distribution=o.jitter_dist, seed=o.seed))
