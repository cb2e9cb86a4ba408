"""A researcher's plugin package: one extra pass, registered through the `xdsl.universe` entry point, and one
extra rpeg-run backend, registered through `rpegc.backends`.

`max-vertices{n=N}` fails with a located error when the graph has more than N vertices, on any stage;
`max-comms{n=N}` likewise when the lowered module has more than N Comm nodes, and declares that it needs a lowered
module, so the driver refuses it before the lowering (rpegc/core/ir/stages.py); `retype-in-place` edits
the graph's first container op in place into one that does not verify (a plugin may edit ops in place, so the
driver verifies the whole module after it) and declares no stages, so the driver checks no pass order after it;
`--backend slow-sim
--slowdown X` is the sim backend with every node X times slower. rpegc finds both with no change to rpegc
itself (tests/test_driver_plugin.py).
"""

import argparse
from dataclasses import dataclass

from xdsl.passes import ModulePass
from xdsl.universe import Universe

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.stages import LOWERED, PassStages
from rpegc.passes.program_pass import check
from rpegc.runtime.backends.base import BackendSpec
from rpegc.runtime.backends.sim import SimBackend


@dataclass(frozen=True)
class MaxVerticesPass(ModulePass):
    name = "max-vertices"
    stages = PassStages()  # runs on any stage and leaves it as it is
    n: int = 8

    def apply(self, ctx, op) -> None:
        def limit(p):
            if p.graph is not None and len(p.graph.vertices) > self.n:
                raise RpegError(p.graph.loc, f"graph @{p.graph.name} has {len(p.graph.vertices)} vertices, "
                                             f"more than max-vertices{{n={self.n}}} allows")

        check(self.name, op, limit)


@dataclass(frozen=True)
class MaxCommsPass(ModulePass):
    name = "max-comms"
    stages = PassStages(needs=LOWERED)  # counts the Comm nodes that the lowering inserts
    n: int = 8

    def apply(self, ctx, op) -> None:
        def limit(p):
            comms = sum(node.kind == "comm" for node in p.exec.nodes)
            if comms > self.n:
                raise RpegError(p.exec.loc, f"exec graph @{p.exec.graph} has {comms} Comm nodes, more than "
                                            f"max-comms{{n={self.n}}} allows")

        check(self.name, op, limit)


@dataclass(frozen=True)
class RetypeInPlacePass(ModulePass):
    name = "retype-in-place"

    def apply(self, ctx, op) -> None:
        from xdsl.dialects.builtin import StringAttr

        from rpegc.dialects import rpeg

        container = next(o for o in op.walk() if isinstance(o, rpeg.ContainerOp))
        container.properties["bytes_per_elem"] = StringAttr("two")


UNIVERSE = Universe(all_passes={"max-vertices": lambda: MaxVerticesPass, "max-comms": lambda: MaxCommsPass,
                                "retype-in-place": lambda: RetypeInPlacePass})


class SlowSim(SimBackend):
    name = "slow-sim"

    def __init__(self, slowdown: float, seed: int):
        super().__init__(seed=seed)
        self.slowdown = slowdown

    def factor(self, node_id: str) -> float:
        return self.slowdown * super().factor(node_id)


@dataclass(frozen=True)
class SlowSimOptions:
    slowdown: float = 1.0
    seed: int = 0


def _slow_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--slowdown", type=float, default=1.0, metavar="X", help="every node takes X times longer")


def _slow_check(o: SlowSimOptions) -> None:
    if not o.slowdown > 0:
        raise RpegError(None, f"--slowdown {o.slowdown}: give a factor > 0")


BACKEND = BackendSpec(name="slow-sim", help="the sim backend, every node --slowdown times slower",
                      options=SlowSimOptions, add_options=_slow_options, check=_slow_check,
                      create=lambda o: SlowSim(o.slowdown, o.seed))
