"""The [host] checkpoint terms of a profile: what one worker's checkpoint write costs (core/cost/checkpoint.py).

Writes float32 shard files of a few shapes (one tensor of a few sizes; many small tensors) as a run's workers and
controller write a checkpoint's parts (checkpoints/exports.py), in a scratch run directory beside the profile (a run
directory usually sits on the same disk): each file with the torch backend's own writer (`write_shard_file`:
safetensors, SHA-256, fsync) into a fresh pending checkpoint directory and its report sealed for the control channel,
both timed; then, timed apart, what the run's controller does once a checkpoint's parts are in: the index written, the
directory committed and the checkpoints beyond the run's default two pruned (its file-system work the next write's
fsync meets in a run too). It takes each shape's median of `repeats` (a write's usual time: the disk's times spread,
the fastest is a lucky one), and fits t = t_file + tensors * t_tensor + bytes / rate by least squares, a term that
fits below 0 left out; the commits are fitted as t = t_commit + tensors * t_commit_tensor (the index lists every
tensor's shards: `checkpoint_commit`, `checkpoint_commit_tensor`; on the 2-core VM a tiny PPO's commit took ~2.7 ms
in a run, of which the index 1.3, the rename 0.3 and the pruning 1.1). The copies a worker
keeps of a stale model's versions for later checkpoints (`holdings.kept_copy`) are timed on the same tensors, fitted
as t = tensors * t_keep_tensor + bytes / keep_rate.

On a host of two cores or more, `disk_rate` times the part of the writes a node's workers do not do in parallel:
DISK_BYTES written and fsynced by one process, then by two at once (each on a core of its own, started together every
round), the median of DISK_ROUNDS rounds each, interleaved (the fastest of two writers' rounds is the one where they
overlapped least); the second writer's extra time is its bytes at the disk's shared rate. The scratch directory is
deleted afterwards.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.report import host_cores
from rpegc.outputs import PendingDirectory
from rpegc.runtime.backends.torch.channel.messages import new_secret, seal
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.controller.options import KEEP_CHECKPOINTS
from rpegc.runtime.backends.torch.controller.pinning import cores_to_pin
from rpegc.runtime.backends.torch.worker.holdings import kept_copy

# (tensors, bytes of float32 data) per file: the bytes' term from one large tensor, the tensors' from many small ones
SHAPES = ((1, 4 << 10), (1, 1 << 20), (1, 8 << 20), (64, 256 << 10), (256, 1 << 20))
REPEATS = 5
QUICK_REPEATS = 3  # rpeg-calibrate --quick's
DISK_BYTES = 32 << 20
DISK_ROUNDS = 10
QUICK_DISK = (4 << 20, 3)  # (bytes, rounds) of rpeg-calibrate --quick's disk probe
# A writer process of the disk probe (no torch: it starts in ~30 ms): a write of its bytes, fsynced, per line read.
_WRITER = """
import os, sys, time
path, data = sys.argv[1], os.urandom(int(sys.argv[2]))
for _ in sys.stdin:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    print(time.perf_counter() - t0, flush=True)
"""


@dataclass(frozen=True)
class WriteFit:
    file_s: float  # t_file: s per file beside its tensors and bytes
    tensor_s: float  # t_tensor: s per tensor
    rate: float  # B/s
    points: int
    mape: float
    commit_s: float = 0.0  # the controller's commit of a checkpoint (index, rename, pruning): its fixed part
    commit_tensor_s: float = 0.0  # and its part per tensor the index lists


class CheckpointProbe:
    """Checkpoint parts written into a scratch run directory as a run writes them (the module docstring)."""

    def __init__(self, run_dir: str):
        self.run_dir, self.step = run_dir, 0
        self.secret = new_secret()

    def part(self, tensors: int, nbytes: int) -> tuple[float, float]:
        """Seconds a worker's part of `tensors` float32 tensors, `nbytes` in all, takes (its shard file: serialise,
        hash, write, fsync; and its sealed report), and seconds the controller's commit of it takes."""
        data = {k: (t, ((0,), tuple(t.shape)), tuple(t.shape)) for k, t in probe_tensors(tensors, nbytes).items()}
        self.step += 1
        pending = PendingDirectory(ckpt.checkpoint_path(self.run_dir, self.step), "the probe checkpoint")
        t0 = time.perf_counter()
        report = ckpt.write_shard_file(os.path.join(pending.path, ckpt.shard_file(0)), data)
        seal(self.secret, "res", "worker-0", self.step, {"type": "done", "export": self.step, **report, "rank": 0,
                                                         "node": None, "start": 0.0, "finish": 0.0, "mem": 0})
        seconds = time.perf_counter() - t0
        ckpt.commit_checkpoint(pending, [report], self.run_dir, KEEP_CHECKPOINTS, step=self.step)
        return seconds, time.perf_counter() - t0 - seconds


def _fit(a: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, float]:
    """Coefficients of y ~ a @ coef by least squares in relative error, the fixed terms (all columns but the last,
    the bytes') clipped at 0 and the others refitted without them; and the mean relative error."""
    last = a.shape[1] - 1
    keep = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep] / y[:, None], np.ones_like(y), rcond=None)[0]
        negative = [k for k in keep if coef[k] < 0 and k != last]
        if not negative:
            break
        keep.remove(negative[0])
    if coef[last] <= 0:
        raise RpegError(None, f"{what} of {[int(b) for b in a[:, last]]} bytes took {list(y)} s: the time does not "
                              "grow with the bytes; the machine's speed changed during the measurement, calibrate "
                              "again")
    return coef, float(np.mean(np.abs(a @ coef - y) / y))


def fit_writes(shapes, seconds) -> WriteFit:
    """t = t_file + tensors * t_tensor + bytes / rate through (shape, seconds) points (`_fit`)."""
    coef, mape = _fit(np.array([[1.0, t, b] for t, b in shapes]), np.asarray(seconds, float), "checkpoint writes")
    return WriteFit(float(coef[0]), float(coef[1]), float(1 / coef[2]), len(seconds), mape)


def fit_copies(shapes, seconds) -> tuple[float, float]:
    """(t_keep_tensor, keep_rate) of t = tensors * t_keep_tensor + bytes / keep_rate through (shape, seconds)
    points (`_fit`)."""
    coef, _ = _fit(np.array([[t, b] for t, b in shapes], float), np.asarray(seconds, float), "kept copies")
    return float(coef[0]), float(1 / coef[1])


def probe_tensors(tensors: int, nbytes: int) -> dict[str, torch.Tensor]:
    """`tensors` float32 tensors of `nbytes` in all, as a probe writes or copies them."""
    n = nbytes // 4 // tensors
    return {f"t{i}": t for i, t in enumerate(torch.rand(tensors, n))}


def time_copy(tensors: int, nbytes: int) -> float:
    """Seconds a worker's copy of a kept version of `tensors` float32 tensors, `nbytes` in all, takes."""
    data = probe_tensors(tensors, nbytes)
    t0 = time.perf_counter()
    kept_copy(data)
    return time.perf_counter() - t0


def measure_copies(shapes=SHAPES, repeats: int = REPEATS) -> tuple[float, float]:
    """Each shape's median of `repeats` kept copies, fitted."""
    return fit_copies(shapes, [statistics.median(time_copy(t, b) for _ in range(repeats)) for t, b in shapes])


def measure_writes(where: Path, shapes=SHAPES, repeats: int = REPEATS) -> WriteFit:
    """Each shape's median of `repeats` parts written in a scratch run directory under `where`, fitted, with the
    median of their commits."""
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".rpeg-write-probe-", dir=where) as d:
        probe = CheckpointProbe(d)
        timed = [[probe.part(t, b) for _ in range(repeats)] for t, b in shapes]
    fit = fit_writes(shapes, [statistics.median(w for w, _ in parts) for parts in timed])
    commit_s, commit_tensor_s = fit_commits(shapes, [statistics.median(c for _, c in parts) for parts in timed])
    return replace(fit, commit_s=commit_s, commit_tensor_s=commit_tensor_s)


def fit_commits(shapes, seconds) -> tuple[float, float]:
    """(t_commit, t_commit_tensor) >= 0 of t = t_commit + tensors * t_commit_tensor through (shape, seconds) points, in
    relative error; the median alone where the tensors' term would fit below 0."""
    y = np.asarray(seconds, float)
    a = np.array([[1.0, t] for t, _ in shapes]) / y[:, None]
    coef = np.linalg.lstsq(a, np.ones_like(y), rcond=None)[0]
    if (coef < 0).any():
        return float(np.median(y)), 0.0
    return float(coef[0]), float(coef[1])


def _writers(directory: str, count: int, nbytes: int) -> list[subprocess.Popen]:
    """`count` writer processes, the i-th bound to the i-th core this process may use (as CPU workers are)."""
    cores = cores_to_pin(count, "gloo")
    procs = []
    for i in range(count):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, os.path.join(directory, f"disk-{i}"), str(nbytes)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if cores is not None:
            os.sched_setaffinity(proc.pid, {cores[i]})
        procs.append(proc)
    return procs


def time_together(procs: list[subprocess.Popen]) -> float:
    """Seconds the slowest of `procs` took for one write, all asked at once."""
    try:
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
        times = [proc.stdout.readline() for proc in procs]
    except BrokenPipeError:
        times = [""]
    if not all(times):
        raise RpegError(None, "a writer of the checkpoint disk probe exited (is the disk full?); its error is above")
    return max(float(t) for t in times)


def shared_rate(one: float, two: float, nbytes: int) -> Optional[float]:
    """The disk's shared rate from one writer's time and two writers' (the slower): the second's bytes took the extra
    time; None where two writers took no measurably longer (< 5 %) than one, so the writes run in parallel."""
    extra = two - one
    return nbytes / extra if extra > 0.05 * one else None


def disk_rate(where: Path, nbytes: int = DISK_BYTES, rounds: int = DISK_ROUNDS) -> Optional[float]:
    """[host] checkpoint_disk_rate under `where` (module docstring); None on one core or where writes do not share."""
    if host_cores() < 2:
        return None
    where.mkdir(parents=True, exist_ok=True)
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix=".rpeg-disk-probe-", dir=where) as d:
        groups = {k: _writers(d, k, nbytes) for k in times}
        try:
            for _ in range(rounds):
                for k, procs in groups.items():
                    times[k].append(time_together(procs))
        finally:
            for procs in groups.values():
                for proc in procs:
                    proc.stdin.close()
                    proc.wait()
    return shared_rate(statistics.median(times[1]), statistics.median(times[2]), nbytes)


def checkpoint_lines(where: Path, quick: bool = False) -> list[str]:
    """The [host] table's checkpoint keys, with how they were measured (`quick`: one write a shape, a 4 MiB disk
    probe of three rounds)."""
    repeats = QUICK_REPEATS if quick else REPEATS
    fit = measure_writes(where, repeats=repeats)
    keep_tensor, keep_rate = measure_copies(repeats=repeats)
    shapes = ", ".join(f"{t} x {b // t >> 10} KiB" for t, b in SHAPES)
    return [f"checkpoint_file = {fit.file_s:.6g}    # s per shard file; least squares (relative error) of the medians "
            f"of {repeats} checkpoint parts of tensors {shapes} (the backend's writer, fsync, the sealed report; "
            f"committed and pruned as a run does) under {where}, MAPE {fit.mape:.1%}",
            f"checkpoint_tensor = {fit.tensor_s:.6g}    # s per tensor of a file; same fit",
            f"checkpoint_rate = {fit.rate:.6g}    # B/s = {fit.rate / 1e6:.4g} MB/s; same fit",
            f"checkpoint_keep_tensor = {keep_tensor:.6g}    # s per tensor of a kept version's copy; least squares "
            f"(relative error) of the medians of {repeats} copies of the same tensors",
            f"checkpoint_keep_rate = {keep_rate:.6g}    # B/s = {keep_rate / 1e6:.4g} MB/s; same fit",
            f"checkpoint_commit = {fit.commit_s:.6g}    # s per checkpoint of the controller's commit once its parts "
            f"are in (index, rename, pruning to {KEEP_CHECKPOINTS}): least squares (relative error) of the medians of "
            "the parts' commits above",
            f"checkpoint_commit_tensor = {fit.commit_tensor_s:.6g}    # s per tensor the index lists; same fit",
            *disk_lines(where, *(QUICK_DISK if quick else (DISK_BYTES, DISK_ROUNDS)))]


def disk_lines(where: Path, nbytes: int = DISK_BYTES, rounds: int = DISK_ROUNDS) -> list[str]:
    rate = disk_rate(where, nbytes, rounds)
    if rate is None:
        return [f"# checkpoint_disk_rate left out: {host_cores()} core(s), or two writers of {nbytes >> 20} MiB "
                "took no longer than one"]
    return [f"checkpoint_disk_rate = {rate:.6g}    # B/s = {rate / 1e6:.4g} MB/s the node's writers share: two "
            f"processes' {nbytes >> 20} MiB (write, fsync) against one's, medians of {rounds} rounds"]
