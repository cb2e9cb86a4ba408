"""Before any worker builds a model: does every worker's share of the plan fit its device? (issue 14,
item 3)

The estimate is the cost model's own (`rpegc.core.cost.annotate.program_memory`, the function annotate-cost
fills `exec.memory` with: models, optimizer state, activations and KV cache per device), computed once from the
plan's program whether or not it was annotated (`plan_memory`; the run's description holds it). A worker's
capacity is its share of this host's RAM on CPU (gloo: every locally launched worker runs here) or its GPU's
memory under NCCL (`torch.cuda.mem_get_info`). The worst device (largest estimate / capacity) that does not fit
makes the run refuse with an error naming the device, the bytes, the vertices and models with the largest shares,
and the ways out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from rpegc.core.ir.errors import RpegError

if TYPE_CHECKING:
    from rpegc.core.cost.residency import DeviceMemory

SHOWN = 3  # largest shares named in the error
FIXES = ("use a bigger cluster, more dp/tp/pp for the largest vertices, or a smaller model "
         "(or run anyway with --no-memory-check)")


@dataclass(frozen=True)
class Share:
    what: str  # "@vertex (activations, KV cache)" or "@model (resident weights, optimizer state)"
    bytes: float


@dataclass(frozen=True)
class DeviceNeed:
    device: int  # flat device id of the plan
    rank: int  # its worker
    estimate: float  # the cost model's peak(d), bytes
    capacity: float  # bytes this worker may use
    where: str  # what the capacity is, for the message
    shares: tuple[Share, ...]  # largest first


def gib(b: float) -> str:
    """Bytes for a person: GiB, or MiB below 1 GiB."""
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def host_capacity(workers: int, total: Optional[int] = None) -> tuple[list[float], str]:
    """Every local CPU worker's share of this host's RAM."""
    if total is None:
        import psutil

        total = psutil.virtual_memory().total
    return [total / workers] * workers, f"its share of this host's {gib(total)} RAM among {workers} workers"


def gpu_capacity(workers: int) -> tuple[list[float], str]:
    """Every NCCL worker's GPU (rank r on cuda:r): the memory free there now."""
    import torch

    return [float(torch.cuda.mem_get_info(r)[0]) for r in range(workers)], "free memory of its GPU"


def plan_memory(program) -> DeviceMemory:
    """The cost model's memory of every device of `program`'s plan (what annotate-cost writes as `exec.memory`)."""
    from rpegc.core.cost.annotate import program_memory
    from rpegc.core.cost.hardware import program_hardware

    return program_memory(program, program_hardware(program))


def predicted_peaks(mem: DeviceMemory, devices: tuple[int, ...]) -> dict[int, float]:
    """The cost model's peak(d) of every device of the plan, bytes (what the run summary holds measurements to)."""
    return {d: float(mem.peak[d]) for d in devices}


def device_needs(mem: DeviceMemory, devices: tuple[int, ...], capacities: list[float],
                 where: str) -> list[DeviceNeed]:
    """The cost model's peak of every device of the plan, with its largest shares, against its capacity."""
    out = []
    for rank, d in enumerate(devices):
        shares = [Share(f"@{m} (resident weights, optimizer state)", float(s[d]))
                  for m, s in mem.persistent_by_model.items() if s[d] > 0]
        owner = int(mem.transient_owner[d])
        if owner >= 0:
            shares.append(Share(f"@{mem.ops[owner].vertex} (activations, KV cache, working weights)",
                                float(mem.transient[d])))
        shares.sort(key=lambda s: -s.bytes)
        out.append(DeviceNeed(d, rank, float(mem.peak[d]), capacities[rank], where, tuple(shares)))
    return out


def worst(needs: list[DeviceNeed]) -> Optional[DeviceNeed]:
    """The device that overshoots most (largest estimate / capacity), if any does not fit."""
    over = [n for n in needs if n.estimate > n.capacity]
    return max(over, key=lambda n: n.estimate / max(n.capacity, 1.0)) if over else None


def refusal(n: DeviceNeed, total: int) -> str:
    shares = ", ".join(f"{s.what} {gib(s.bytes)}" for s in n.shares[:SHOWN])
    more = f" ({total - 1} other device(s) do not fit either)" if total > 1 else ""
    return (f"device {n.device} (worker {n.rank}) needs an estimated {gib(n.estimate)} ({n.estimate:.0f} bytes) "
            f"but has {gib(n.capacity)} ({n.capacity:.0f} bytes, {n.where}){more}; largest shares: {shares}; "
            f"{FIXES}")


def check_memory(mem: DeviceMemory, devices: tuple[int, ...], dist_backend: str,
                 capacity: Optional[Callable[[int], tuple[list[float], str]]] = None) -> dict[int, float]:
    """Raise RpegError if some worker's share of the plan does not fit its device; else the cost model's peak(d)
    of every device, bytes (as `predicted_peaks`)."""
    if capacity is None:
        capacity = gpu_capacity if dist_backend == "nccl" else host_capacity
    caps, where = capacity(len(devices))
    needs = device_needs(mem, devices, caps, where)
    bad = worst(needs)
    if bad is not None:
        raise RpegError(None, refusal(bad, sum(1 for n in needs if n.estimate > n.capacity)))
    return {n.device: n.estimate for n in needs}
