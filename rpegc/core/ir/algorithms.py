"""The RL algorithms a graph may name (`rpeg.algorithm NAME`), each with the family whose graph shape it has.

The compiler checks a graph against its family's shape (check/wellformed.py): PPO samples rollouts and trains a
critic, GRPO samples rollouts without one, DPO trains on given pairs. GRPO's variants are GRPO-shaped; the torch
backend gives each its settings (runtime/backends/torch/rl/algorithms/). A plugin (a module of the entry-point group
`rpegc.rl`) may add an algorithm of one of the families: it registers it with the torch backend's
`register_algorithm`, which declares its name here. Whoever meets a name it does not know imports the plugins
first (`algorithm_family`), the compiler included.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any, Mapping, Optional

from rpegc.core.ir.errors import RpegError

FAMILIES = ("ppo", "grpo", "dpo")
PLUGIN_GROUP = "rpegc.rl"  # plugins: modules that register algorithms, estimators and losses when imported
BUILT_IN = {"ppo": "ppo", "grpo": "grpo", "dpo": "dpo", "dr_grpo": "grpo", "dapo": "grpo", "gspo": "grpo",
            "rloo": "grpo", "reinforce_pp": "grpo", "reinforce_pp_baseline": "grpo"}
# The registry: the built-in names and those plugins declared (process-wide, as entry points are)
_FAMILY_OF: dict[str, str] = dict(BUILT_IN)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def declare_algorithm(name: str, family: str) -> None:
    """Let graphs name algorithm `name`, of the graph shape of `family`."""
    if not _NAME.match(name):
        raise RpegError(None, f"an algorithm's name is an identifier, got '{name}'")
    if family not in FAMILIES:
        raise RpegError(None, f"algorithm '{name}' has family '{family}'; use one of {', '.join(FAMILIES)}")
    if _FAMILY_OF.get(name, family) != family:
        raise RpegError(None, f"algorithm '{name}' is already registered, of the family {_FAMILY_OF[name]}")
    _FAMILY_OF[name] = family


def registered(table: Mapping[str, Any], name: str) -> bool:
    """Whether `name` is in the registry `table`, the plugins imported first when it is not (every registry of the
    group, here and in the torch backend, looks a name up so: a worker process may meet a plugin's name first)."""
    if name not in table:
        load_plugins()
    return name in table


def algorithm_family(name: str) -> Optional[str]:
    """The family of algorithm `name` (None: no built-in algorithm and no plugin's has that name)."""
    return _FAMILY_OF[name] if registered(_FAMILY_OF, name) else None


def algorithm_names() -> tuple[str, ...]:
    """The names graphs may use now (the built-in ones, then those of the plugins imported so far)."""
    return tuple(_FAMILY_OF)


def load_plugins() -> None:
    """Import every module of the entry-point group `rpegc.rl` not imported yet: each process, the workers included,
    does so when it meets a name it does not know. A broken plugin is a one-line error."""
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except (Exception, SystemExit) as e:
            raise RpegError(None, f"the RL plugin {ep.name} ({ep.value}) failed to load: {type(e).__name__}: {e}") \
                from None
