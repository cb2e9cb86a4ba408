"""Pause Python's cyclic garbage collector while a large module is built.

Parsing a module, and converting it to and from the xDSL form, allocates millions of small objects (parse
tree nodes, tokens, dataclasses, attributes) and frees none. Each collection traverses every live tracked
object, and collections come every few hundred allocations, so with the collector on, parse time grew
faster than the input (measured: 2.4x per doubling of a 10k-80k container file; bench/parse_scaling.py).
None of these structures needs the cycle collector (reference counting frees them), so it is paused.
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state after (nesting is fine)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn: F) -> F:
    """`fn` run with the cyclic collector paused (see gc_paused)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
