"""Host memory: giving freed memory back to the operating system at the phase boundaries of a command, and the
peak of what the C heap holds allocated (`HeapMeter`).

On the CPU torch allocates tensors with the C library's malloc. glibc keeps freed memory in its heap for reuse and
returns it to the system only from the heap's top, so a phase that frees many tensors of assorted sizes (a
training forward's recomputed segments, a parameter's float32 gradient copy, a decode step's logits) leaves the
resident size near its high-water mark, and the next phase starts from there: measured on the 43.7M-parameter
bench model (bench/memory_runs.py), the resident size before a training backward pass was 184 MB above what the
process held live. `malloc_trim(0)` returns every free page of the heap (madvise), costs about 10 us when there is
little to return; but the next phase faults the pages in again, zeroed, which costs a run's every command (a few MiB
of a small model's) and a larger model's every training forward (hundreds of MiB), so a phase returns its freed memory
only when there is much of it (`TRIM_MIN_FREE`) and the host is short of memory (`LOW_AVAILABLE`): a worker's
resident size holds its peak and the freed memory it keeps for reuse, as a GPU's reserved memory does. Setting
glibc's mmap threshold low instead (every large tensor its own mapping, returned on free) lowered the peaks as much
but made steps ~30% slower (page faults).

CUDA memory belongs to torch's caching allocator, which the peak meter reads directly
(`peak_memory.PeakMeter`); this touches only host memory, and does nothing where the C library has no malloc_trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Callable, Optional

# How often HeapMeter reads the heap. An operator measured alone (rpeg-validate --isolated) is read every 0.2 ms, so
# the short-lived pieces of a tiny model's operator are seen. A run is read every 5 ms: reading a worker's heap
# every 0.2 ms made a step of the 134M-parameter bench/scale.py model 20% slower (the reading thread's wake-ups and
# GIL hand-overs: a thread that only slept cost half of it, and reading without the GIL, compiled, no less), every
# 1 ms 10%, every 5 ms 3%, with the same peak to 0.1 MiB.
OPERATOR_SAMPLE_S = 2e-4
RUN_SAMPLE_S = 5e-3


def _libc_function(name: str) -> Optional[Callable]:
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name) if lib else None
    except (OSError, AttributeError):  # not glibc
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


_TRIM = _libc_function("malloc_trim")
_MALLINFO2 = _libc_function("mallinfo2")
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def heap_in_use() -> Optional[int]:
    """Bytes the C heap holds allocated now (glibc: every arena's allocated chunks and the mmapped ones), or None
    where the C library cannot say."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


class HeapMeter:
    """The most bytes the C heap held allocated (`heap_in_use`) since `start` or `reset`, read every `period_s` by a
    daemon thread. On the CPU torch allocates tensors with malloc, so this is what the process's tensors, gloo's
    buffers and the interpreter's large objects weigh, whichever thread allocates or frees them, and not the freed
    memory glibc keeps for reuse (which the resident size holds). torch's profiler counts tensor bytes too but
    misses the frees made on other threads (gloo's, after a collective), so it overcounts a process that
    communicates. The sampler runs whenever the main thread releases the GIL, as torch's kernels do; a peak shorter
    than `period_s` between two reads can be missed."""

    def __init__(self, period_s: float = RUN_SAMPLE_S) -> None:
        self.period_s = period_s
        self.base = heap_in_use()
        self._max = self.base or 0
        self._lock = threading.Lock()  # a read and its update of _max, against a reset between them
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def available(self) -> bool:
        return self.base is not None

    def start(self) -> "HeapMeter":
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._sample, name="heap-meter", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.period_s)

    def _read(self) -> int:
        with self._lock:
            self._max = max(self._max, heap_in_use() or 0)
            return self._max

    def reset(self) -> None:
        """Start a new high-water mark from what the heap holds now."""
        with self._lock:
            self._max = heap_in_use() or 0

    def peak(self) -> Optional[int]:
        """The most bytes held since the last reset (or the start), this moment included."""
        return self._read() if self.available else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


# What the heap must hold free before `release_freed` returns it. Trimming less is not worth its cost: the pages
# given back fault in again, zeroed, when the next command allocates them, and a small model's run returns and
# re-faults a few MiB at every command (on the demo's arithmetic GRPO a trim at every command made the steady step
# ~12% slower: 0.054 against 0.048 s/step). Freed memory below this stays in the heap, where malloc reuses it.
TRIM_MIN_FREE = 64 << 20
# Below this share of its RAM available the host is short of memory, and the heap's free pages go back to it. Above
# it they stay for the next phase, as torch's CUDA caching allocator keeps its freed blocks until an allocation
# fails: returning a 24M-parameter Llama's ~300 MiB of freed activations before every training forward and letting
# them fault in again made the forward 0.3 s (~30%) slower (bench/trl_side_by_side.py's llama-large, one thread).
LOW_AVAILABLE = 0.25


def host_available() -> Optional[float]:
    """The share of this host's RAM available (psutil: Linux's MemAvailable over MemTotal, the total the memory check
    shares among the workers), or None where it cannot be read (~20 us)."""
    import psutil

    try:
        vm = psutil.virtual_memory()
        return vm.available / vm.total
    except (OSError, AttributeError, ZeroDivisionError):
        return None


def release_freed(available: Callable[[], Optional[float]] = host_available) -> None:
    """Return the host memory freed since the last call to the operating system (glibc) when the heap holds at least
    TRIM_MIN_FREE bytes free and the host is short of memory (`available()` below LOW_AVAILABLE). A condition that
    cannot be read (the C library does not say what it holds free, or the host what it has available) counts as met."""
    if _TRIM is None:
        return
    if _MALLINFO2 is not None and _MALLINFO2().fordblks < TRIM_MIN_FREE:
        return
    share = available()
    if share is not None and share >= LOW_AVAILABLE:
        return
    _TRIM(0)
