"""The processes a torch run leaves behind, found and ended: multiprocessing's fork server and its
descendants (an interrupted launch can leave a forked worker nobody holds)."""

from __future__ import annotations

import os
from typing import Optional


def forkserver_pid() -> Optional[int]:
    """The pid of this process's multiprocessing fork server, if one runs."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def stop_forkserver() -> None:
    """End this process's fork server and reap it (its workers are already gone); a later launch in the
    same process starts a new one."""
    from multiprocessing import forkserver

    import signal

    pid = forkserver_pid()
    if pid is None:
        return
    # An interruption in the middle of a launch can leave the server reading a half-sent request (it then
    # never sees its parent's EOF) and a forked worker nobody holds: end them by signal, then reap.
    for child in descendants(pid) + [pid]:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    try:
        forkserver._forkserver._stop()
    except (OSError, ChildProcessError):
        pass


def descendants(pid: int) -> list[int]:
    """Every descendant of `pid` (psutil), or none if psutil is missing or `pid` is gone."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []
