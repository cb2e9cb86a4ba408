"""Execution backends of `rpeg-run`: the interface (base.py), the simulated backend (sim.py) and the torch
backend (torch/: worker processes that train for real). Backends are found through the entry-point group
`rpegc.backends`, as passes are found through `xdsl.universe`: each entry names a `BackendSpec`, and a
researcher's package adds a backend the same way (tests/plugin)."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.base import BackendSpec

GROUP = "rpegc.backends"


# Cached: rpeg-run asks three times (its options, their checks, the construction), a scan of the installed
# packages' entry points costs ~15 ms, and what is installed does not change while a process runs.
@functools.cache
def backend_specs() -> dict[str, BackendSpec]:
    """Every registered backend by name (the first registration of a name wins), in name order; a plugin
    that cannot be loaded or names no BackendSpec is a one-line error naming it."""
    found: dict[str, BackendSpec] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        if ep.name in found:
            continue
        try:
            spec = ep.load()
        except Exception as e:  # a broken plugin must not take rpeg-run down with a traceback
            raise RpegError(None, f"backend '{ep.name}' ({ep.value}, entry point group {GROUP}) cannot be loaded: "
                                  f"{type(e).__name__}: {e}") from None
        if not isinstance(spec, BackendSpec) or spec.name != ep.name:
            raise RpegError(None, f"entry point '{ep.name}' of group {GROUP} ({ep.value}) must name a BackendSpec "
                                  f"called '{ep.name}'")
        found[ep.name] = spec
    if not found:
        raise RpegError(None, f"no backend is registered under the entry point group {GROUP}; reinstall rpegc "
                              "(pip install -e .)")
    return found
