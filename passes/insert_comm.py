"""insert-comm: lowering stage 2 and the transfer case of stage 4 (App. A-G, Alg. 4): Comm nodes for data
edges between different allocations and for weight publications between different allocations (partial-overlap
payload), reusing an existing installation of the same version.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.lower.insert_comm import insert_comm
from rpegc.core.ir.stages import UNROLLED, PassStages, before
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class InsertCommPass(ModulePass):
    name = "insert-comm"
    stages = PassStages(needs=UNROLLED, order=(  # before itself: once
        before("insert-comm", "{name} already ran in this pipeline; run each lowering pass once"),))

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, insert_comm)
