"""split-quantiles: lowering stage 1 (App. A-G, Def. A.9): response-length phase sub-nodes for a generation
vertex and its downstream inference vertices when they run on disjoint devices. `enable=false` turns it off
(ablation A1).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.ir.options import option
from rpegc.core.lower.split_quantiles import split_quantiles
from rpegc.core.ir.stages import UNROLLED, PassStages, before
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class SplitQuantilesPass(ModulePass):
    name = "split-quantiles"
    stages = PassStages(needs=UNROLLED, order=(
        before("insert-comm", "{name} must run before {other}; the lowering order is {lowering}"),))
    enable: bool = option(True, "split phases where they pay off; false: never (ablation A1)")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, lambda p: split_quantiles(p, self.enable))
