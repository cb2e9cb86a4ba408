"""What a worker really held at its peak, beside the cost model's prediction of its device (spec 6.6; issue 32,
item 5): the run summary prints both per worker and warns where they differ by more than `TOLERANCE` and `FLOOR`.

On a GPU the peak is torch's own accounting (`torch.cuda.max_memory_allocated`, reset when the worker is ready).
On the CPU it is what the C heap held allocated at its most (`host_memory.HeapMeter`: torch allocates tensors with
malloc) above what it held when the worker was ready: the interpreter, torch and the process groups are the start-up
size, not the plan's. Beside it the resident high-water mark (VmHWM of /proc/self/status, reset to the resident
size by writing 5 to /proc/self/clear_refs) above the resident size then, which adds what glibc keeps of freed
memory and the pages the interpreter and libraries touch. Where neither exists nothing is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rpegc.runtime.backends.torch.worker.host_memory import HeapMeter

TOLERANCE = 0.15  # |measured / predicted - 1| above which the summary warns ...
# ... when the difference is also above what a worker process grows by on its own: torch's kernels paged in on
# first use, the allocator's arenas, gloo's buffers (23-45 MiB measured on tiny-model runs that hold ~1 MiB)
FLOOR = 64 << 20
_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_bytes(field: str) -> Optional[int]:
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


class PeakMeter:
    """The peak bytes a process holds above its size at `start`, on `device` (module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline: Optional[int] = None  # GPU: allocated bytes at the start
        self.heap: Optional[HeapMeter] = None
        self.resident_base: Optional[int] = None

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        self.heap = HeapMeter().start()
        try:
            with open(_CLEAR_REFS, "w", encoding="ascii") as f:
                f.write("5")  # the high-water mark starts again from the resident size
        except OSError:
            return
        self.resident_base = _status_bytes("VmRSS")

    def peak(self) -> Optional[int]:
        """Bytes allocated above the start-up size at the highest point since `start` (None: not measured here)."""
        if self.device.type == "cuda":
            if self.baseline is None:
                return None
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline)
        if self.heap is None or not self.heap.available:
            return None
        return max(0, (self.heap.peak() or 0) - (self.heap.base or 0))

    def resident(self) -> Optional[int]:
        """The resident high-water mark above the resident size at `start` (CPU only; None: not measured)."""
        if self.resident_base is None:
            return None
        hwm = _status_bytes("VmHWM")
        return None if hwm is None else max(0, hwm - self.resident_base)


@dataclass(frozen=True)
class WorkerPeak:
    rank: int
    device: int  # the plan's flat device id
    predicted: float  # the cost model's peak(d), bytes
    measured: Optional[int]  # bytes above the start-up size; None where nothing was measured
    resident: Optional[int] = None  # CPU: the resident high-water mark above the start-up size, beside it

    @property
    def ratio(self) -> Optional[float]:
        return self.measured / self.predicted if self.measured is not None and self.predicted > 0 else None

    @property
    def off(self) -> bool:
        if self.measured is None:
            return False
        return abs(self.measured - self.predicted) > max(TOLERANCE * self.predicted, FLOOR)


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def peak_lines(peaks: list[WorkerPeak], what: str) -> list[str]:
    """The summary's lines: each worker's measured peak beside the prediction, and a warning for those more than
    TOLERANCE and FLOOR off. `what` names the measurement (resident memory or the GPU allocator)."""
    measured = [p for p in peaks if p.measured is not None]
    if not measured:
        return []
    lines = [f"memory per worker ({what} above start-up, measured vs the cost model's peak):"]
    for p in measured:
        assert p.measured is not None
        ratio = f"{p.ratio:.2f}x" if p.ratio is not None else "n/a"
        resident = f"; {_mib(p.resident)} resident" if p.resident is not None else ""
        lines.append(f"  worker {p.rank} (device {p.device}): {_mib(p.measured)} measured, {_mib(p.predicted)} "
                     f"predicted ({ratio}{resident})")
    off = [p for p in measured if p.off]
    if off:
        worst = max(off, key=lambda p: abs((p.ratio or 1.0) - 1.0))
        lines.append(f"warning: {len(off)} of {len(measured)} workers differ from the predicted peak by more than "
                     f"{TOLERANCE:.0%} and {_mib(FLOOR)} (worst: worker {worst.rank}, {worst.ratio:.2f}x); the cost "
                     f"model does not describe what this run holds")
    return lines
