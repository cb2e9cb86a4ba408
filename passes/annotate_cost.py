"""annotate-cost: local evaluation Phi(G-hat) (Sec. V, App. C-D; docs/cost-model-spec.md).

Sets `time` on every exec node and the per-device memory report (peak, persistent, transient, M_eff, r_peak,
feasibility). The hardware profile is the cluster's (`hardware = "gh200"` or a path), unless `hardware=...`
overrides it. Every reconstructed formula of spec Section 9 can be switched to its alternative with the option
of the same name as in `rpegc.core.cost.options.CostOptions` (`optimize` takes the same options).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from rpegc.core.cost.annotate import annotate
from rpegc.core.ir.program import Program
from rpegc.core.ir.stages import LOWERED, PassStages
from rpegc.passes.program_pass import CostModelPass, transform


@dataclass(frozen=True)
class AnnotateCostPass(CostModelPass):
    name = "annotate-cost"
    stages = PassStages(needs=LOWERED, gives_times=True, then=("fuse-stages",))

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        def run(p: Program) -> Program:
            return annotate(p, self.program_hardware(p), self.cost_options())

        transform(self.name, op, run)
