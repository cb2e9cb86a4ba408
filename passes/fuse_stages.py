"""fuse-stages: stage fusion, training operators interleaved as one fused microtask schedule (Sec. II, IV-B;
docs/stage-fusion.md).

For every `rpeg.fuse (@a, @b, ...)` of the plan and every step, an `exec.fusion` runs the members' training Op nodes
of that step as one operator: each pipeline stage of their shared devices interleaves the members' forward and
backward microtasks in the order recorded (a list schedule under each member's 1F1B bound, priced with the cost
model's per-microbatch terms; `hardware=...` and the cost options as for annotate-cost). Runs after insert-reshard.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from rpegc.core.lower.fuse_stages import fuse_stages
from rpegc.core.ir.program import Program
from rpegc.core.ir.stages import LOWERED, PassStages, before
from rpegc.passes.program_pass import CostModelPass, transform


@dataclass(frozen=True)
class FuseStagesPass(CostModelPass):
    name = "fuse-stages"
    stages = PassStages(needs=LOWERED,
                        order=(before("annotate-cost", "{name} changes what {other} prices; run it before {other}"),))

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        def run(p: Program) -> Program:
            if p.plan is None or not p.plan.fusions:  # nothing to fuse: no hardware needed (e.g. no cluster yet)
                return p
            return fuse_stages(p, self.program_hardware(p), self.cost_options())

        transform(self.name, op, run)
