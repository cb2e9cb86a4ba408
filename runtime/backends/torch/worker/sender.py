"""A worker's commands on two threads: the source side of a transfer off the loop that runs operators.

The schedule reserves a Comm's destination only (spec 7, Def. A.11): its source goes on computing while the data
leaves. A worker that ran its sends in its one command loop would hold the source until its current operator ends
and the receiver is ready, which the plan does not price (the torch backend reserved both endpoints for that
reason, and a plan's order could then wait a whole operator for a transfer the schedule overlapped). So a worker
reads its commands on a thread of its own (`CommandRouter`) and runs a transfer's command on a rank outside the
transfer's destination (the backend sets its `sender`: it only sends) on a sender thread, beside the operator the main
loop runs; every other command keeps the main loop's order. The controller sends such a command only once the
transfer's predecessors completed (never chained behind an operator on the sending rank), so the data it makes is
there. What the two threads still share is the weights copies a command lays out anew on this rank before it runs:
weights installed by a command (no completion report) and an operator's prep that re-lays out its weights under the
copy's own label, and the copies a command lets go of: a training operator that takes its weights copy over as
its working copy (`take`, decided when no node left to issue reads the copy, though a send of it issued before may
not have run yet) and the copies freed before a command runs. The controller routes by where a copy will be once
such a command ran, so across the two threads the commands that touch one copy keep the order they came in: a send
waits until the main loop has run every earlier command that lays out a copy it reads (`lays_out`), and the main
loop waits before a command that lays out or lets go of a copy until every earlier send of it has ended (`frees`).
(Rows an operator's prep moves to its replicas are added beside the copy's own, and no transfer is routed from them:
routing.Holding.moved.)
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from rpegc.runtime.backends.torch.channel.commands import (Command, CommData, Fused, Install, NodeCommand, Op,
                                                          PrepWeights, Release, Transfer)


def _ops(cmd: Command) -> tuple[Op, ...]:
    return tuple(cmd.members) if isinstance(cmd, Fused) else (cmd,) if isinstance(cmd, Op) else ()


def lays_out(cmd: Command) -> frozenset[str]:
    """The weights copies (labels) a main-loop command lays out anew on this rank before it runs: an install's, an
    operator's prep re-laying out its weights under their own label (a fusion's members' too). A data prep only adds
    rows beside a copy's own, and the controller never sends a transfer from those (routing.Holding.moved)."""
    if isinstance(cmd, Install):
        return frozenset((cmd.label,))
    return frozenset(step.label for op in _ops(cmd) for step in op.prep if isinstance(step, PrepWeights))


def frees(cmd: Command) -> frozenset[str]:
    """The copies (labels) a main-loop command lets go of on this rank: a Release's, those freed before a node's
    command runs (`release`), and the weights copy a training operator takes over as its working copy (`take`)."""
    labels = set(cmd.labels) if isinstance(cmd, Release) else set()
    labels |= set(cmd.release) if isinstance(cmd, NodeCommand) else set()
    labels |= {op.weights for op in _ops(cmd) if op.take and op.weights is not None}
    return frozenset(labels)


def reads(cmd: Transfer) -> frozenset[str]:
    """The copies (labels) a transfer's command sends from."""
    return frozenset(cmd.sources) if isinstance(cmd, CommData) else frozenset((cmd.source,))


class CommandRouter:
    """Reads commands with `receive` on a reader thread: a `sender` command goes to `send` on the sender thread (in
    arrival order), every other one to `next` (the main loop). What `receive` raises (the controller is gone) is
    raised by `next`; `stop` ends both threads after the commands before it."""

    def __init__(self, receive: Callable[[], Command], send: Callable[[Command], None]):
        self._receive, self._send = receive, send
        self._main: queue.Queue[Any] = queue.Queue()
        self._sends: queue.Queue[Any] = queue.Queue()
        self._order = threading.Condition()
        # Commands read and run, per thread: each runs its own in arrival order, so "the k-th has ended" is a count.
        self._main_read = self._main_done = self._sends_read = self._sends_done = 0
        self._laid_out: dict[str, int] = {}  # label -> the main-loop command that last lays it out (1-based)
        self._read_by: dict[str, int] = {}  # label -> the send that last reads it (1-based)
        self._reader = threading.Thread(target=self._read, name="rpeg-commands", daemon=True)
        self._sender = threading.Thread(target=self._run_sends, name="rpeg-sender", daemon=True)

    def start(self) -> "CommandRouter":
        self._sender.start()
        self._reader.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                cmd = self._receive()
            except BaseException as e:  # SystemExit: the controller is gone; the main loop ends with it
                self._sends.put(None)
                self._main.put(e)
                return
            if isinstance(cmd, Transfer) and cmd.sender:
                self._sends.put((cmd, self._after_main(cmd)))
                continue
            if cmd.type == "stop":
                self._sends.put(None)
                self._sender.join()  # every send before the stop has ended before the main loop says bye
            self._main.put((cmd, self._after_sends(cmd)))
            if cmd.type == "stop":
                return

    def _after_main(self, send: Transfer) -> int:
        """Read a send: the main-loop commands that must have ended before it runs (a count)."""
        with self._order:
            self._sends_read += 1
            for label in reads(send):
                self._read_by[label] = self._sends_read
            return max((self._laid_out.get(label, 0) for label in reads(send)), default=0)

    def _after_sends(self, cmd: Command) -> int:
        """Read a main-loop command: the sends that must have ended before it runs (a count)."""
        with self._order:
            self._main_read += 1
            labels = lays_out(cmd)
            for label in labels:
                self._laid_out[label] = self._main_read
            return max((self._read_by.get(label, 0) for label in labels | frees(cmd)), default=0)

    def _run_sends(self) -> None:
        while (item := self._sends.get()) is not None:
            cmd, after = item
            with self._order:
                self._order.wait_for(lambda: self._main_done >= after)
            self._send(cmd)
            with self._order:
                self._sends_done += 1
                self._order.notify_all()

    def finished(self, cmd: Command) -> None:
        """The main loop ran `cmd` (sends waiting for it may go)."""
        with self._order:
            self._main_done += 1
            self._order.notify_all()

    def next(self) -> Command:
        """The main loop's next command (blocking), once the sends it must follow have ended."""
        item = self._main.get()
        if isinstance(item, BaseException):
            raise item
        cmd, after = item
        with self._order:
            self._order.wait_for(lambda: self._sends_done >= after)
        return cmd
