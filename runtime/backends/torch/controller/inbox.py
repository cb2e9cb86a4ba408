"""The controller's receiving side of the control channel (messages.py): worker reports, checked and queued
for the main thread. Over the store (`StoreInbox`: a thread blocks in the store's `res` queue) when workers
were launched elsewhere; over one pipe per worker (`PipeInbox`) when the backend forked them."""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from rpegc.core.ir.errors import error_line
from rpegc.runtime.backends.base import BackendError
from rpegc.runtime.backends.torch.channel.messages import Endpoint, read_link

INBOX_WAIT = timedelta(days=1)  # the inbox thread's blocking wait; it ends by the controller's eof message


def warn(line: str) -> None:
    print(f"rpeg-run: warning: {line}", file=sys.stderr, flush=True)


class StoreInbox:
    """Worker reports: a thread blocks in the store's `res` queue (on its own client connection, so the
    main thread's sends never wait behind it), checks each report (`Endpoint.receive`: the unauthentic
    are dropped and logged) and hands it to the main thread through a queue.Queue."""

    def __init__(self, host: str, port: int, secret: bytes):
        client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        self.endpoint = Endpoint(client, secret, "controller-inbox", warn)
        self.reports: queue.Queue = queue.Queue()
        self.failure: Optional[str] = None
        self.thread = threading.Thread(target=self._run, name="rpeg-inbox", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                env = self.endpoint.receive("res", INBOX_WAIT)
            except (RuntimeError, TimeoutError) as e:
                try:
                    self.endpoint.store.check(["res"])  # only timed out: keep waiting
                    continue
                except Exception:
                    self.failure = error_line(e)
                    return
            if env.msg["type"] == "eof":
                if env.sender == "controller":
                    return
                continue
            self.reports.put(env.msg)

    def get(self, timeout: float) -> Optional[dict]:
        """The next report, or None after `timeout` seconds without one."""
        try:
            return self.reports.get(timeout=timeout)
        except queue.Empty:
            if self.failure is not None:
                raise BackendError(None, f"the control channel failed: {self.failure}") from None
            return None

    def close(self, sender: Endpoint) -> None:
        """End the thread: `sender` (the controller's endpoint) pushes the eof message it waits for."""
        if self.thread.is_alive() and self.failure is None:
            try:
                sender.push("res", {"type": "eof"})
            except Exception:
                pass
            self.thread.join(timeout=5.0)


class PipeInbox:
    """Reports of forked workers, each over its own pipe (messages.py): the controller's thread waits on all
    of them at once (`multiprocessing.connection.wait`, no polling thread, no store hop). A pipe that
    closes (its worker died) is dropped; `_check_workers` then says which worker and how."""

    def __init__(self, links: dict[int, Any], endpoint: Endpoint):
        self.links = dict(links)
        self.endpoint = endpoint
        self.reports: collections.deque = collections.deque()

    def get(self, timeout: float) -> Optional[dict]:
        """The next report, or None after `timeout` seconds without one."""
        from multiprocessing.connection import wait as wait_any

        if not self.reports:
            if not self.links:
                time.sleep(timeout)
                return None
            for link in wait_any(list(self.links.values()), timeout):
                try:
                    env = self.endpoint.accept("res", read_link(link, "res"))
                except EOFError:
                    self.links = {r: c for r, c in self.links.items() if c is not link}
                    continue
                if env is not None:
                    self.reports.append(env.msg)
        return self.reports.popleft() if self.reports else None

    def close(self, sender: Endpoint) -> None:
        for link in self.links.values():
            link.close()
        self.links = {}
