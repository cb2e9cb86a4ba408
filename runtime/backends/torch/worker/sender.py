"""A worker's commands on two threads: the source side of a transfer off the loop that runs operators.

The schedule reserves a Comm's destination only (spec 7, Def. A.11): its source goes on computing while the data
leaves. A worker that ran its sends in its one command loop would hold the source until its current operator ends
and the receiver is ready, which the plan does not price (the torch backend reserved both endpoints for that
reason, and a plan's order could then wait a whole operator for a transfer the schedule overlapped). So a worker
reads its commands on a thread of its own (`CommandRouter`) and runs a transfer's command on a rank outside the
transfer's destination (the backend marks it `SENDER`: it only sends) on a sender thread, beside the operator the main
loop runs; every other command keeps the main loop's order. The controller sends such a command only once the
transfer's predecessors completed (never chained behind an operator on the sending rank), so the data it sends is
there; weights installed by a command (no completion report) are waited for (`AHEAD_OF_SENDS`).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

SENDER = "sender"  # a command field: this rank only sends the transfer's data (runs on the sender thread)
# Commands whose result a later send may read without the controller waiting for them: weights installed at the start
# or from a checkpoint on resume (a node's command reports its completion, and a transfer is sent only after the nodes
# that make its data completed). A send waits until the main loop has run every one that came before it.
AHEAD_OF_SENDS = ("install",)


class CommandRouter:
    """Reads commands with `receive` on a reader thread: a `SENDER` command goes to `send` on the sender thread (in
    arrival order), every other one to `next` (the main loop). What `receive` raises (the controller is gone) is
    raised by `next`; `stop` ends both threads after the commands before it."""

    def __init__(self, receive: Callable[[], dict], send: Callable[[dict], None]):
        self._receive, self._send = receive, send
        self._main: queue.Queue[Any] = queue.Queue()
        self._sends: queue.Queue[Any] = queue.Queue()
        self._ahead = threading.Condition()
        self._ahead_queued = self._ahead_done = 0  # AHEAD_OF_SENDS commands read, and run by the main loop
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
            if cmd.get(SENDER):
                self._sends.put((cmd, self._ahead_queued))
                continue
            if cmd["type"] in AHEAD_OF_SENDS:
                with self._ahead:
                    self._ahead_queued += 1
            if cmd["type"] == "stop":
                self._sends.put(None)
                self._sender.join()  # every send before the stop has ended before the main loop says bye
            self._main.put(cmd)
            if cmd["type"] == "stop":
                return

    def _run_sends(self) -> None:
        while (item := self._sends.get()) is not None:
            cmd, ahead = item
            with self._ahead:
                self._ahead.wait_for(lambda: self._ahead_done >= ahead)
            self._send(cmd)

    def finished(self, cmd: dict) -> None:
        """The main loop ran `cmd` (sends waiting for it may go)."""
        if cmd["type"] in AHEAD_OF_SENDS:
            with self._ahead:
                self._ahead_done += 1
                self._ahead.notify_all()

    def next(self) -> dict:
        """The main loop's next command (blocking)."""
        item = self._main.get()
        if isinstance(item, BaseException):
            raise item
        return item
