"""Giving freed host memory back to the operating system at the phase boundaries of a command.

On the CPU torch allocates tensors with the C library's malloc. glibc keeps freed memory in its heap for reuse and
returns it to the system only from the heap's top, so a phase that frees many tensors of assorted sizes (a
training forward's recomputed segments, a parameter's float32 gradient copy, a decode step's logits) leaves the
resident size near its high-water mark, and the next phase starts from there: measured on the 43.7M-parameter
bench model (bench/memory_runs.py), the resident size before a training backward pass was 184 MB above what the
process held live. `malloc_trim(0)` returns every free page of the heap (madvise), costs about 10 us when there is
little to return, and measured no slowdown of a step. Setting glibc's mmap threshold low instead (every large
tensor its own mapping, returned on free) lowered the peaks as much but made steps ~30% slower (page faults).

CUDA memory belongs to torch's caching allocator, which the peak meter reads directly
(`peak_memory.PeakMeter`); this touches only host memory, and does nothing where the C library has no malloc_trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Optional


def _malloc_trim() -> Optional[Callable[[int], int]]:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()


def release_freed() -> None:
    """Return the host memory freed since the last call to the operating system (glibc), else nothing."""
    if _TRIM is not None:
        _TRIM(0)
