"""insert-reshard: lowering stage 3 and the reshard case of stage 4 (App. A-G, Def. A.10, Alg. 4): Reshard
nodes between consecutive invocations of a trainable model on the same devices with another layout; shadow
pairs get nothing. Completes lowering: afterwards every edge is a plain dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.lower.insert_reshard import insert_reshard
from rpegc.core.ir.stages import LOWERED, UNROLLED, PassStages, after
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class InsertReshardPass(ModulePass):
    name = "insert-reshard"
    stages = PassStages(needs=UNROLLED, produces=LOWERED,
                        order=(after("insert-comm", "{name} needs {other} first; the lowering order is {lowering}"),))

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, insert_reshard)
