"""The names inside a torch run's directory (--run-dir), what rpeg-run checks before it starts a run there, and the
lock a run holds on it. Kept apart from checkpoints/shard_files.py so that rpeg-run can read them without importing
torch.

A run directory belongs to one run at a time: the run holds an exclusive `flock` on RUN_DIR/.lock for its life (the
operating system releases it when the process ends, a crash included), and a second run there is refused. A fresh
run (no --resume) is refused where an earlier run left its state (checkpoints, final weights, metrics) unless
--overwrite says to replace it; exports never land inside the directory's managed paths.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from typing import Optional

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.metrics_log import FILE as METRICS

CHECKPOINT_DIR = "checkpoints"  # step-NNNNNN/ directories, each an index and its safetensors shards
FINAL = "final"  # the final weights, laid out like a checkpoint
WORKER_LOGS = "workers"  # one log per worker process
LOCK = ".lock"  # flock'ed by the run that owns the directory; holds its pid
MANAGED = (CHECKPOINT_DIR, FINAL, WORKER_LOGS)
STEP_NAME = re.compile(r"^step-(\d{6,})$")  # a complete checkpoint's directory (a .partial is not one)


class RunDirLock:
    """An exclusive lock on a run directory for one run's life (`acquire` ... `release`)."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._fd: Optional[int] = None

    def acquire(self) -> "RunDirLock":
        """Take the lock, or raise a one-line RpegError naming the process that holds it."""
        os.makedirs(self.run_dir, exist_ok=True)
        path = os.path.join(self.run_dir, LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RpegError(None, f"cannot lock the run directory {self.run_dir}: {e.strerror}") from None
            who = f" (process {holder})" if holder else ""
            raise RpegError(None, f"the run directory {self.run_dir} is in use by another rpeg-run{who}; wait for "
                                  "it to end, or choose another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def complete_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """(step, directory) of every complete checkpoint, oldest first (a .partial is not one)."""
    root = os.path.join(run_dir, CHECKPOINT_DIR)
    out = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        m = STEP_NAME.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def earlier_run(run_dir: str) -> list[str]:
    """What an earlier run left in `run_dir` that a fresh run there would replace (empty: nothing)."""
    found = []
    steps = complete_checkpoints(run_dir)
    if steps:
        found.append(f"{len(steps)} checkpoint(s)")
    if os.path.lexists(os.path.join(run_dir, FINAL)):
        found.append("final weights")
    if os.path.lexists(os.path.join(run_dir, METRICS)):
        found.append(METRICS)
    return found


def check_fresh_run(run_dir: str, overwrite: bool) -> None:
    """A fresh run (no --resume) in `run_dir`: refused where an earlier run left its state, unless `overwrite`."""
    left = earlier_run(run_dir)
    if left and not overwrite:
        raise RpegError(None, f"the run directory {run_dir} holds an earlier run ({', '.join(left)}); continue it "
                              f"with --resume {run_dir}, choose a new --run-dir, or add --overwrite to replace it")


def managed_path(path: str) -> Optional[str]:
    """The run directory whose managed paths (checkpoints, final weights, worker logs) `path` lies in or is, else
    None. A run directory is recognised by its lock file or its checkpoints directory."""
    here = os.path.realpath(path)
    if _is_run_dir(here):
        return here  # the run directory itself
    while os.path.dirname(here) != here:
        parent = os.path.dirname(here)
        if os.path.basename(here) in MANAGED and _is_run_dir(parent):
            return parent
        here = parent
    return None


def _is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, LOCK)) or os.path.isdir(os.path.join(path, CHECKPOINT_DIR))
