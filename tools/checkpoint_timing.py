"""The [host] checkpoint terms of a profile: what one worker's checkpoint write costs (core/cost/checkpoint.py).

Writes float32 shard files of a few shapes (one tensor of a few sizes; many small tensors) with the torch backend's
own writer (`write_shard_file`: safetensors, SHA-256, fsync) into a scratch directory beside the profile (a run
directory usually sits on the same disk), keeps each shape's fastest of `repeats` (the machine's usual speed, as the
kernels'), and fits t = t_file + tensors * t_tensor + bytes / rate by least squares, a term that fits below 0 left
out. On a host of two cores or more, `disk_rate` times the part of the writes a node's workers do not do in parallel:
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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.report import host_cores
from rpegc.runtime.backends.torch.checkpoints.shard_files import write_shard_file
from rpegc.runtime.backends.torch.controller.pinning import cores_to_pin

# (tensors, bytes of float32 data) per file: the bytes' term from one large tensor, the tensors' from many small ones
SHAPES = ((1, 4 << 10), (1, 1 << 20), (1, 8 << 20), (64, 256 << 10), (256, 1 << 20))
REPEATS = 3
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


def time_write(directory: str, tensors: int, nbytes: int) -> float:
    """Seconds one shard file of `tensors` float32 tensors, `nbytes` in all, takes to write (serialise, hash, write,
    fsync)."""
    n = nbytes // 4 // tensors
    data = {f"t{i}": (t, ((0,), (n,)), (n,)) for i, t in enumerate(torch.rand(tensors, n))}
    path = os.path.join(directory, "probe.safetensors")
    t0 = time.perf_counter()
    write_shard_file(path, data)
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds


def fit_writes(shapes, seconds) -> WriteFit:
    """t = t_file + tensors * t_tensor + bytes / rate through (shape, seconds) points: least squares in relative
    error, the fixed terms clipped at 0 (and the others refitted without them)."""
    a = np.array([[1.0, t, b] for t, b in shapes])
    y = np.asarray(seconds, float)
    keep = [0, 1, 2]
    while True:
        coef = np.zeros(3)
        coef[keep] = np.linalg.lstsq(a[:, keep] / y[:, None], np.ones_like(y), rcond=None)[0]
        negative = [k for k in keep if coef[k] < 0 and k != 2]
        if not negative:
            break
        keep.remove(negative[0])
    if coef[2] <= 0:
        raise RpegError(None, f"checkpoint writes of {[b for _, b in shapes]} bytes took {list(y)} s: the time does "
                              "not grow with the bytes; the disk's speed changed during the measurement, calibrate "
                              "again")
    pred = a @ coef
    return WriteFit(float(coef[0]), float(coef[1]), float(1 / coef[2]), len(y), float(np.mean(np.abs(pred - y) / y)))


def measure_writes(where: Path, shapes=SHAPES, repeats: int = REPEATS) -> WriteFit:
    """Each shape's fastest of `repeats` writes in a scratch directory under `where`, fitted."""
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".rpeg-write-probe-", dir=where) as d:
        best = [min(time_write(d, t, b) for _ in range(repeats)) for t, b in shapes]
    return fit_writes(shapes, best)


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
    repeats = 1 if quick else REPEATS
    fit = measure_writes(where, repeats=repeats)
    shapes = ", ".join(f"{t} x {b // t >> 10} KiB" for t, b in SHAPES)
    return [f"checkpoint_file = {fit.file_s:.6g}    # s per shard file; least squares (relative error) of the fastest "
            f"of {repeats} writes of tensors {shapes} (the backend's writer, fsync) under {where}, MAPE {fit.mape:.1%}",
            f"checkpoint_tensor = {fit.tensor_s:.6g}    # s per tensor of a file; same fit",
            f"checkpoint_rate = {fit.rate:.6g}    # B/s = {fit.rate / 1e6:.4g} MB/s; same fit",
            *disk_lines(where, *(QUICK_DISK if quick else (DISK_BYTES, DISK_ROUNDS)))]


def disk_lines(where: Path, nbytes: int = DISK_BYTES, rounds: int = DISK_ROUNDS) -> list[str]:
    rate = disk_rate(where, nbytes, rounds)
    if rate is None:
        return [f"# checkpoint_disk_rate left out: {host_cores()} core(s), or two writers of {nbytes >> 20} MiB "
                "took no longer than one"]
    return [f"checkpoint_disk_rate = {rate:.6g}    # B/s = {rate / 1e6:.4g} MB/s the node's writers share: two "
            f"processes' {nbytes >> 20} MiB (write, fsync) against one's, medians of {rounds} rounds"]
