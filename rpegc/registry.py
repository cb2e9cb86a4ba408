"""The one lazy registry of rpegc's dialects and passes.

It is exported under the `xdsl.universe` entry point (pyproject.toml), so `xdsl-opt` finds the passes, and a
researcher's package registers its own passes the same way — the `rpegc` driver reads the multiverse, never
this table directly. Factories import their module only when the pass or dialect is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Callable

from xdsl.ir import Dialect
from xdsl.passes import ModulePass
from xdsl.universe import Universe


def _lazy(module: str, attr: str) -> Callable[[], object]:
    return lambda: getattr(import_module(module), attr)


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "verify-wellformed": _lazy("rpegc.passes.verify_wellformed", "VerifyWellformedPass"),
    "share-actor-critic": _lazy("rpegc.passes.share_actor_critic", "ShareActorCriticPass"),
    "optimize": _lazy("rpegc.passes.optimize", "OptimizePass"),
    "unroll": _lazy("rpegc.passes.unroll", "UnrollPass"),
    "split-quantiles": _lazy("rpegc.passes.split_quantiles", "SplitQuantilesPass"),
    "insert-comm": _lazy("rpegc.passes.insert_comm", "InsertCommPass"),
    "insert-reshard": _lazy("rpegc.passes.insert_reshard", "InsertReshardPass"),
    "fuse-stages": _lazy("rpegc.passes.fuse_stages", "FuseStagesPass"),
    "annotate-cost": _lazy("rpegc.passes.annotate_cost", "AnnotateCostPass"),
    "schedule": _lazy("rpegc.passes.schedule", "SchedulePass"),
}

DIALECTS: dict[str, Callable[[], Dialect]] = {
    "rpeg": _lazy("rpegc.dialects.rpeg", "RPEG"),
    "exec": _lazy("rpegc.dialects.exec", "EXEC"),
}

UNIVERSE = Universe(all_dialects=DIALECTS, all_passes=PASSES)
