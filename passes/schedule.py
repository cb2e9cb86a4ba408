"""schedule: the greedy list scheduler of Alg. 5 (App. A-H) and the scores of Eq. 4-6 (App. A-I).

Writes `start`/`finish` on every node and `exec.schedule` (makespan, score, score_pen, util, p_eff).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.ir.stages import LOWERED, PassStages
from rpegc.core.sched.schedule import schedule_program
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class SchedulePass(ModulePass):
    name = "schedule"
    stages = PassStages(needs=LOWERED, needs_times=True, then=("fuse-stages", "annotate-cost"), trim=True)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, schedule_program)
