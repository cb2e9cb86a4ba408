"""A researcher's plugin package: one extra pass, registered through the `xdsl.universe` entry point.

`max-vertices{n=N}` fails with a located error when the graph has more than N vertices. rpegc finds it with no
change to rpegc itself (tests/test_driver_plugin.py).
"""

from dataclasses import dataclass

from xdsl.passes import ModulePass
from xdsl.universe import Universe

from rpegc.core.errors import RpegError
from rpegc.passes.program_pass import check


@dataclass(frozen=True)
class MaxVerticesPass(ModulePass):
    name = "max-vertices"
    n: int = 8

    def apply(self, ctx, op) -> None:
        def limit(p):
            if p.graph is not None and len(p.graph.vertices) > self.n:
                raise RpegError(p.graph.loc, f"graph @{p.graph.name} has {len(p.graph.vertices)} vertices, "
                                             f"more than max-vertices{{n={self.n}}} allows")

        check(self.name, op, limit)


UNIVERSE = Universe(all_passes={"max-vertices": lambda: MaxVerticesPass})
