"""A run's hold on its run directory: locked for the run's life, a fresh run refused where an earlier run left
its state (unless told to replace it), and on --resume the checkpoint the run continues from, under this plan or
any other of the same run (the workers reshard on load).
"""

from __future__ import annotations

from typing import Callable, Optional

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.checkpoints.run_dir import RunDirLock, check_fresh_run
from rpegc.runtime.plan import RunPlan


class RunClaim:
    """The run directory `run_dir` (None: a run without one) of one run, and the checkpoint it resumes from."""

    def __init__(self, run_dir: Optional[str], resume: bool, overwrite: bool):
        self.run_dir, self.resume, self.overwrite = run_dir, resume, overwrite
        self._lock = RunDirLock(run_dir) if run_dir else None
        self.resume_dir: Optional[str] = None  # the checkpoint resumed from
        self.resume_index: Optional[dict] = None  # and its index

    def claim(self) -> None:
        """Lock the run directory for this run's life (once), before its state is read or replaced; a fresh run
        does not replace an earlier run's state unless told to (run_dir.py)."""
        if self._lock is None or self._lock.held:
            return
        self._lock.acquire()
        if not self.resume:
            try:
                check_fresh_run(self.run_dir, self.overwrite)
            except RpegError:
                self.release()
                raise

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def resumed_plan(self, plan: RunPlan, identity: Callable[[RunPlan], dict]) -> RunPlan:
        """The plan from the last checkpoint's step on (its index is kept); the checkpoint must record the same
        run `identity` (program, seed, options)."""
        assert self.run_dir is not None
        try:
            path, index = ckpt.find_resume_checkpoint(self.run_dir, identity(plan), plan)
        except BaseException:
            self.release()
            raise
        self.resume_dir, self.resume_index = path, index
        return ckpt.resume_plan(plan, index["step"])

    def last_checkpoint_step(self) -> Optional[int]:
        found = ckpt.complete_checkpoints(self.run_dir) if self.run_dir else []
        return found[-1][0] if found else None

    @property
    def resume_step(self) -> int:
        return self.resume_index["step"] if self.resume_index else 0

    def resumed_metrics(self) -> dict[int, dict]:
        """The per-step metrics the resumed checkpoint recorded."""
        return {int(k): v for k, v in (self.resume_index or {}).get("metrics", {}).items()}
