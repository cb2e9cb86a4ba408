"""Timing helpers and a pool of persistent worker processes, shared by rpeg-calibrate and rpeg-validate.

Paper App. C-A2 (calibration measures effective parameters on the target system, warm) and Sec. VIII-A
(operator latency is measured and compared with the model). One worker process stands for one device:
on a CPU machine a process limited to one thread (`torch.set_num_threads(1)`), on a GPU machine the
process that owns `cuda:rank`. Workers join one torch.distributed group (gloo on CPU, NCCL on GPUs),
so collectives and send/recv between them are the ones the torch backend uses.

A timing keeps every warm repeat (`warmup` untimed calls first, so allocator growth, lazy
initialisation and cache misses of the first call do not enter it). rpeg-validate reports the median
of the repeats, as the paper does; rpeg-calibrate by default the median of a point's repeats pooled over
its rounds too, so the profile predicts the statistic validation measures (`--statistic min`: the
fastest repeat).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.controller.pinning import cores_to_pin, pin_main_thread

DEFAULT_TIMEOUT_S = 300.0  # a collective that waits longer than this has lost a peer
ERROR_GRACE_S = 5.0  # how long the other ranks may still answer after one rank failed


# "median" matches rpeg-validate (median of warm repeats), the paper's latency statistic. On this
# project's VM gloo collectives stall for a 4 ms timer tick in 10-25% of calls, so their fastest
# repeat is 2-3x their median; the minimum would make every multi-device prediction optimistic.
STATISTICS = ("median", "min")


def summarize(samples: Sequence[float], statistic: str) -> float:
    """One number for a point's repeats (STATISTICS)."""
    if statistic == "min":
        return float(min(samples))
    return float(statistics.median(samples))


def mape(predicted, measured) -> float:
    """Mean absolute percentage error as a fraction: mean(|p - m| / m)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.shape != m.shape or m.size == 0:
        raise RpegError(None, f"MAPE needs two equally long non-empty series, got {p.shape} and {m.shape}")
    if np.any(m <= 0):
        raise RpegError(None, "MAPE needs positive measured values; drop the zero or negative measurements")
    return float(np.mean(np.abs(p - m) / m))


@dataclass(frozen=True)
class Timing:
    """Seconds of each warm repeat and their median."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        """The fastest repeat: on a shared machine interference only ever adds time, so the minimum is
        the least disturbed estimate of a kernel's cost."""
        return min(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repeats were (0 = identical)."""
        return (max(self.samples) - min(self.samples)) / self.median if self.median > 0 else 0.0


def time_repeats(fn: Callable[[], Any], repeats: int, warmup: int = 1,
                 sync: Optional[Callable[[], None]] = None) -> Timing:
    """Call `fn` `warmup` times untimed, then `repeats` times, each timed alone.

    `sync` (e.g. `torch.cuda.synchronize`) runs before each clock read so asynchronous device work
    is inside the interval it belongs to.
    """
    if repeats < 1:
        raise RpegError(None, f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples))


def time_per_call(fn: Callable[[], Any], *, min_time: float = 0.02, repeats: int = 3, warmup: int = 1,
                  sync: Optional[Callable[[], None]] = None) -> Timing:
    """Seconds per call of a short `fn`: each repeat runs `fn` in a loop of at least `min_time` seconds.

    The loop length is chosen once from one warm call, so every repeat runs the same number of calls.
    """
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    single = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(100_000, int(min_time / single)))

    def loop() -> None:
        for _ in range(inner):
            fn()

    timing = time_repeats(loop, repeats, warmup=0, sync=sync)
    return Timing(tuple(s / inner for s in timing.samples))


# ---------------------------------------------------------------------------------------------------
# Worker pool


@dataclass
class WorkerContext:
    """What a function run in a worker sees: its rank, the world, its device and process groups."""

    rank: int
    world: int
    backend: str  # "gloo" or "nccl"
    device: Any  # torch.device
    core: Optional[int] = None  # the core its main thread is bound to (CPU workers), else None
    free: frozenset = frozenset()  # the cores the process was started with (its other threads' mask)
    _groups: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)  # what a tool keeps in this worker between `run` calls

    def repin(self) -> None:
        """Re-apply the core binding (after threads were created, e.g. by new process groups)."""
        if self.core is not None:
            pin_main_thread(self.core, self.free)

    @property
    def is_cuda(self) -> bool:
        return self.backend == "nccl"

    def sync(self) -> None:
        """Wait for this rank's queued device work (a no-op on CPU)."""
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def group(self, ranks: Sequence[int]):
        """The process group of `ranks` (None = the whole world).

        torch.distributed requires every rank of the world to create every group in the same order,
        members or not; functions run by `WorkerPool.run` execute on every rank, so calling this with
        the same arguments in the same order on every rank satisfies that.
        """
        import torch.distributed as dist

        key = tuple(sorted(ranks))
        if len(key) == self.world:
            return None
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key))
            self.repin()
        return self._groups[key]

    def barrier(self, ranks: Optional[Sequence[int]] = None) -> None:
        import torch
        import torch.distributed as dist

        # A tiny all-reduce instead of dist.barrier: NCCL's barrier guesses the device, this does not.
        flag = torch.zeros(1, device=self.device)
        dist.all_reduce(flag, group=self.group(ranks) if ranks is not None else None)
        self.sync()


def _worker_main(rank: int, world: int, init_file: str, backend: str, threads: int, timeout_s: float,
                 core: Optional[int], conn) -> None:
    import datetime

    import rpegc.runtime.backends.torch.worker.env  # noqa: F401  (before torch: the backend's workers' environment)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set by an earlier parallel region; harmless
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    free = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    ctx = WorkerContext(rank, world, backend, device, core, free)
    ctx.repin()
    conn.send(("ready", None))
    while True:
        message = conn.recv()
        if message is None:
            break
        fn, args = message
        try:
            conn.send(("ok", fn(ctx, *args)))
        except BaseException:  # report any failure to the parent; it raises a located error
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()
    conn.close()


def default_backend() -> str:
    """NCCL when CUDA devices are visible, else gloo."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def device_count(backend: str) -> int:
    """Devices of this machine: CUDA devices under NCCL, CPU cores (one single-threaded worker each) under gloo."""
    if backend == "nccl":
        import torch

        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class WorkerPool:
    """`world` persistent worker processes in one torch.distributed group.

    `run(fn, *args)` calls `fn(ctx, *args)` on every rank and returns the results in rank order;
    `fn` must be a module-level function (it is pickled by name). Use as a context manager, or call
    `close()`: workers are stopped and joined.
    """

    def __init__(self, world: int, backend: str = "gloo", threads: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
                 pin: bool = True):
        if world < 1:
            raise RpegError(None, f"a worker pool needs at least one worker, got {world}")
        if backend not in ("gloo", "nccl"):
            raise RpegError(None, f"unknown distributed backend '{backend}'; use gloo (CPU) or nccl (GPUs)")
        if backend == "nccl" and world > device_count("nccl"):
            raise RpegError(None, f"{world} NCCL workers need {world} CUDA devices, found {device_count('nccl')}; "
                            "lower --devices")
        import torch.multiprocessing as mp

        self.world, self.backend = world, backend
        # Bound to one core each when they fit (`pin`); `cores` says which, for the reports.
        self.cores = cores_to_pin(world, backend) if pin else None
        self._dir = tempfile.TemporaryDirectory(prefix="rpeg-pool-")
        init_file = os.path.join(self._dir.name, "init")
        ctx = mp.get_context("spawn")
        self._conns = []
        self._procs = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            core = self.cores[rank] if self.cores else None
            proc = ctx.Process(target=_worker_main, args=(rank, world, init_file, backend, threads, timeout_s, core, child),
                               daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._closed = False
        self._collect("start")

    def _collect(self, what: str) -> list:
        """One reply per rank. After the first failure the others get `ERROR_GRACE_S` to answer (a peer
        of a failed rank may wait in a collective forever); then the pool is torn down."""
        from multiprocessing.connection import wait

        results: dict[int, Any] = {}
        errors: list[str] = []
        pending = dict(enumerate(self._conns))
        while pending:
            ready = wait(list(pending.values()), timeout=ERROR_GRACE_S if errors else None)
            if not ready:
                errors.append(f"ranks {sorted(pending)} did not answer after the failure")
                break
            for rank in [r for r, c in pending.items() if c in ready]:
                conn = pending.pop(rank)
                try:
                    status, value = conn.recv()
                except EOFError:
                    status, value = "error", f"worker exited (exit code {self._procs[rank].exitcode})"
                if status == "error":
                    errors.append(f"rank {rank}: {value}")
                results[rank] = value
        if errors:
            self.close(force=True)
            raise RpegError(None, f"worker pool failed during {what}:\n" + "\n".join(errors))
        return [results[rank] for rank in range(self.world)]

    def run(self, fn: Callable[..., Any], *args: Any) -> list:
        if self._closed:
            raise RpegError(None, "the worker pool is closed; create a new one")
        for conn in self._conns:
            conn.send((fn, args))
        return self._collect(getattr(fn, "__name__", "a task"))

    def close(self, force: bool = False) -> None:
        """Stop the workers: politely (they leave the process group), or with `force` at once."""
        if self._closed:
            return
        self._closed = True
        for conn, proc in zip(self._conns, self._procs):
            if force:
                proc.terminate()
            elif proc.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    proc.terminate()
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._dir.cleanup()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)


class Progress:
    """A rich progress bar on stderr with one task of `total` steps (nothing when `quiet`)."""

    def __init__(self, total: int, quiet: bool, title: str = "measuring"):
        self._bar = None
        if not quiet:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn)

            self._bar = RichProgress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=Console(stderr=True))
            self._task = self._bar.add_task(title, total=total)
            self._bar.start()

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=what)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
