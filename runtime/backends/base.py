"""The interface between the completion-driven controller and an execution backend (paper Sec. VII,
Table III; docs/architecture.md, Runtime).

A backend owns the persistent workers (one per device) and the physical work; the controller owns
the plan, readiness, resource sets, versions and releases. The contract is asynchronous so that real
worker processes fit it: `submit` starts a node and returns at once, `wait` blocks until at least one
submitted node has finished and returns every completion that is available, with start and finish
times on the backend's clock (seconds since `start`). The controller never looks at predicted times
to decide when to dispatch; completions alone drive it.

Lifecycle, as `rpegc.runtime.controller.run` calls it:

    workers = backend.start(plan)            # launch persistent workers once: {device: worker rank}
    backend.install(artifact, devices)       # the initial checkpoint (version 0) where it is read
    backend.submit(dispatch)                 # -> run_op / transfer / reshard by node kind
    backend.chain(dispatch, after)           # "plan" policy: start a node behind running predecessors, if it can
    completions = backend.wait()             # >= 1 Completion, in any order
    backend.release(artifact, devices)       # an artifact no remaining node consumes
    backend.memory()                         # bytes held per device now (for the summary)
    backend.shutdown()                       # stop workers (always called, also after an error)

`rpeg-run` knows a backend by its `BackendSpec` (registered under the entry-point group `rpegc.backends`,
runtime/backends/__init__.py): its name, its own command-line options as a dataclass, how to build it from
them, and the files those options make it read and write (checked against each other before anything runs);
the spec is light, so rpeg-run lists every backend's options without importing any backend's code. Around
the run, rpeg-run asks the backend what the trace header records (`header_options`), how it stops on a
signal (`stop_signals`), where it can be resumed from (`run_dir`, `last_checkpoint_step`) and what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

from rpegc.core.ir.errors import RpegError
from rpegc.outputs import Output
from rpegc.runtime.backends.options import add_declared_options
from rpegc.runtime.plan import Artifact, RunNode, RunPlan

RESERVE_RULES = ("destination", "endpoints")


def _no_checks(options: Any) -> None:
    return None


def _no_files(options: Any) -> list:
    return []


@dataclass(frozen=True)
class BackendSpec:
    """A backend as rpeg-run sees it before loading it. `options` is a frozen dataclass with one field per
    option the backend adds to rpeg-run, each declared with its help and flag (`options.cli_option`), plus `seed`,
    rpeg-run's own; `add_options` declares them on an argument group (None: from the fields, `declare`), each
    option's destination named as its field; `check` range-checks their values before anything is loaded; `create`
    builds the backend from an instance of `options`."""

    name: str
    help: str
    options: type
    create: Callable[[Any], "Backend"]
    add_options: Optional[Callable[[argparse._ArgumentGroup], None]] = None
    check: Callable[[Any], None] = _no_checks
    inputs: Callable[[Any], list[str]] = _no_files  # files the options make it read: never written over
    outputs: Callable[[Any], list[Output]] = _no_files  # what the options make it write (besides the trace)

    def declare(self, group: argparse._ArgumentGroup) -> None:
        """The backend's options on `group`: its own `add_options`, else one per `cli_option` field."""
        if self.add_options is not None:
            self.add_options(group)
        else:
            add_declared_options(group, self.options)


@dataclass(frozen=True)
class Dispatch:
    """One node handed to a backend: what to run, where, with which inputs and parameter versions."""

    node: RunNode  # node.node is the ExecNode: kind, vertex/role/model, strategy, alloc, bytes, ...
    reserved: tuple[int, ...]  # R(x): devices held exclusively until completion
    workers: tuple[int, ...]  # worker ranks of `node.devices` (Op: the invocation's worker group)
    src_workers: tuple[int, ...]  # worker ranks of the source allocation of a Comm/Reshard
    inputs: tuple[Artifact, ...]  # artifacts to bind: present, or left by a predecessor it is chained after
    outputs: tuple[Artifact, ...]  # artifacts the node leaves behind on completion
    versions_in: tuple[tuple[str, int], ...]  # parameter version to read per model
    versions_out: tuple[tuple[str, int], ...]  # parameter version produced per model (training)
    # Inputs no node handed to the backend after this one reads: the backend may let this node take them over
    # (their workers run earlier readers' commands first) instead of keeping them intact for later readers.
    last_reads: tuple[Artifact, ...] = ()

    @property
    def id(self) -> str:
        return self.node.id


@dataclass(frozen=True)
class Completion:
    """A finished node as the backend measured it."""

    node: str  # node id
    start: float  # seconds on the backend clock
    finish: float
    bytes: int = 0  # bytes actually moved (Comm/Reshard), 0 for Op nodes
    versions_in: tuple[tuple[str, int], ...] = ()  # versions the workers actually read
    versions_out: tuple[tuple[str, int], ...] = ()  # versions the workers actually produced
    microtasks: tuple[tuple[int, int, str, int, float, float], ...] = ()  # a fused member's (trace.NodeRecord)
    waited: Optional[float] = None  # s its worker thread waited for a core while it ran (trace.NodeRecord)
    witness: tuple[float, ...] = ()  # s of each speed witness its workers and pool processes ran (trace.NodeRecord)


class BackendError(RpegError):
    """The backend could not run a node (a worker failed, an input was missing, a bad setting)."""


class Backend(ABC):
    """Execution backend. Subclasses implement the abstract methods; `submit` routes by node kind."""

    name: str = "backend"
    clock: str = "wall"  # "wall" (real seconds) or "sim" (simulated seconds)
    run_dir: Optional[str] = None  # where the run keeps what outlives it (checkpoints, logs); None: nowhere
    checkpoint_every: int = 0  # checkpoint every N steps into run_dir (0: never; core/cost/checkpoint.py prices them)
    # R(x) of a transfer when the user does not choose: Table III reserves both endpoints of a
    # transfer; the scheduler (spec 7) only its destination.
    default_reserve: str = "endpoints"

    @abstractmethod
    def start(self, plan: RunPlan) -> dict[int, int]:
        """Launch persistent workers for every device the plan uses; returns {device: worker rank}."""

    @abstractmethod
    def install(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        """Load a parameter copy (the initial checkpoint, version 0) onto `devices` before dispatch starts."""

    def submit(self, d: Dispatch) -> None:
        """Start `d` asynchronously; its Completion comes back from `wait`."""
        kind = d.node.kind
        if kind == "op":
            self.run_op(d)
        elif kind == "comm":
            self.transfer(d)
        else:
            self.reshard(d)

    def submit_fused(self, ds: tuple[Dispatch, ...]) -> None:
        """Start the members `ds` of one fusion (exec.fusion) as one operator: they start together and their
        Completions, one per member, come back together. A backend that cannot refuses the plan in `start`."""
        raise BackendError(ds[0].node.node.loc, f"the {self.name} backend does not run fused operators "
                                                "(exec.fusion); compile the plan without fuse-stages")

    def chain(self, d: Dispatch, after: tuple[str, ...]) -> bool:
        """Start `d` now although its predecessors `after` (node ids, submitted or chained) may not have finished,
        if this backend guarantees that `d` starts (its last worker begins it) only after each of them finished;
        False, with nothing started, if it cannot. The default cannot."""
        return False

    @abstractmethod
    def run_op(self, d: Dispatch) -> None:
        """Run a model invocation (generation, inference or training) on its worker group."""

    @abstractmethod
    def transfer(self, d: Dispatch) -> None:
        """Send a container (or a phase of it) or a weights version from the source to the destination."""

    @abstractmethod
    def reshard(self, d: Dispatch) -> None:
        """Redistribute a weights version on one allocation from the source layout to the target layout."""

    @abstractmethod
    def wait(self) -> list[Completion]:
        """Block until at least one submitted node finished; return all completions available now."""

    @abstractmethod
    def release(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        """Free an artifact (data or a parameter copy) that no remaining node consumes."""

    @abstractmethod
    def now(self) -> float:
        """Seconds since `start` on the backend clock."""

    def memory(self) -> dict[int, float]:
        """Bytes held per device right now (artifacts and parameter copies); empty if unknown."""
        return {}

    def peak_memory(self) -> dict[int, float]:
        """Largest `memory()` seen per device during the run; empty if unknown."""
        return {}

    def prepare(self, plan: RunPlan) -> RunPlan:
        """The plan this backend will run, e.g. only the steps after a checkpoint when resuming."""
        return plan

    def step_metrics(self, step: int) -> dict[str, float]:
        """What the backend measured in RL step `step` (e.g. the mean reward); empty if nothing."""
        return {}

    def step_done(self, step: int, finish: float) -> None:
        """RL step `step` completed at `finish` on the backend clock (every node of it finished)."""

    def header_options(self, plan: RunPlan) -> dict:
        """What the trace header records about a run of `plan` on this backend (host, effective settings)."""
        return {}

    def stop_signals(self) -> ContextManager:
        """Around the run: how SIGINT/SIGTERM stop it. The default keeps Python's (Ctrl-C raises at once)."""
        return contextlib.nullcontext()

    def last_checkpoint_step(self) -> Optional[int]:
        """The step of the newest complete checkpoint in `run_dir`, where a resumed run starts; None: none."""
        return None

    def memory_summary(self) -> list[str]:
        """Lines on the memory the run really held per device beside the cost model's prediction; [] for none."""
        return []

    def cpu_summary(self, contention_priced: bool = False) -> list[str]:
        """Lines on where the run's host cores went (its processes' threads); [] for none. `contention_priced`: the
        profile prices what the runtime's threads take from the operators ([overhead] contention)."""
        return []

    def checkpoint_write_seconds(self) -> list[float]:
        """Per checkpoint written so far, the seconds its slowest worker spent writing it; [] for none."""
        return []

    def checkpoint_commit_seconds(self) -> list[float]:
        """Per checkpoint written so far, the seconds the controller spent committing it once written; [] for none."""
        return []

    def run_notes(self) -> list[str]:
        """Lines printed after the run: what it did that its plan does not price, its reward function's failures; []
        for nothing."""
        return []

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers. Called once, also when the run failed."""
