"""SIGINT / SIGTERM during a run (issue 14, item 3): the first signal stops the run cleanly, a second one
kills at once.

`stop_on_signals(backend)` installs the handlers for the duration of a run. The first signal tells the
backend (`backend.interrupt()`, if it has one: stop fast, no final weights) and raises `Interrupted`
in the main thread, which unwinds the controller; its `finally` shuts the backend down (workers told to
stop, killed after a short grace, the fork server reaped). A second signal while that happens calls
`backend.kill_now()` and exits the process with 128 + signal at once.

`interrupted_line` is the one line rpeg-run prints: the signal, the last completed step, and how to
resume (the exact command) or why nothing can be resumed.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol, Sequence

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised in the main thread by the first SIGINT/SIGTERM (a BaseException, like KeyboardInterrupt:
    `except Exception` handlers on the way do not swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Stoppable(Protocol):
    def interrupt(self) -> None:
        """The first signal: stop dispatching; workers finish or drop what they run."""

    def kill_now(self) -> None:
        """A second signal: kill every process at once."""


@contextmanager
def stop_on_signals(backend: Stoppable) -> Iterator[None]:
    """Handlers for SIGINT and SIGTERM while the block runs; the previous handlers come back after it."""
    state = {"seen": None}

    def handler(signum, frame):
        if state["seen"] is not None:
            backend.kill_now()
            os._exit(128 + signum)
        state["seen"] = signum
        backend.interrupt()
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass(frozen=True)
class RunState:
    """What the interruption line reports: the last completed step (None: none yet), the plan's steps,
    the run directory (None: nothing resumable) and its newest complete checkpoint step (None: none)."""

    last_step: Optional[int]
    first_step: int
    total_steps: int
    run_dir: Optional[str]
    checkpoint_step: Optional[int]


def resume_command(plan: str, argv: Sequence[str], run_dir: str) -> str:
    """`rpeg-run PLAN --backend torch --resume RUN_DIR` plus the options of `argv` that the run's identity
    depends on (seed, RL settings, prompts, reward, steps, checkpointing, parallel implementation), and the
    experiment trackers it logs to."""
    keep = ("--seed", "--lr", "--rl-config", "--rl", "--reward", "--data", "--task", "--steps", "--checkpoint-every",
            "--keep-checkpoints", "--tp-impl", "--dist-backend", "--policy", "--reserve", "--log")
    words = ["rpeg-run", plan, "--backend", "torch", "--resume", run_dir]
    args = list(argv)
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in keep:
            if eq:
                words += [name, value]
            elif i + 1 < len(args):
                words += [name, args[i + 1]]
    return " ".join(shlex.quote(w) for w in words)


def interrupted_line(name: str, state: RunState, plan: str, argv: Sequence[str]) -> str:
    """The one line printed after an interruption."""
    last = state.total_steps - 1  # a resumed plan still counts every step of the run
    if state.last_step is None:
        where = f"before step {state.first_step} completed (steps {state.first_step}..{last})"
    else:
        where = f"after step {state.last_step} (steps {state.first_step}..{last})"
    head = f"rpeg-run: interrupted by {name} {where}"
    if state.run_dir is None:
        return f"{head}; nothing can be resumed (no run directory): rerun with --run-dir DIR to make the run resumable"
    if state.checkpoint_step is None:
        return f"{head}; no checkpoint was written yet in {state.run_dir}, so nothing can be resumed: rerun the command"
    return (f"{head}, the last checkpoint resumes at step {state.checkpoint_step}; "
            f"resume with: {resume_command(plan, argv, state.run_dir)}")


def print_interrupted(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
