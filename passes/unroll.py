"""unroll{k=N}: Alg. 3 (App. A-F, Def. A.6/A.7): per-step copies of every vertex and data edge, publication
edges from step s_m(k) = k - tau(m) - 1, ordered-update edges between successive trainings of a model, and the
parameter version every consumer reads (max(0, k - tau(m))) and every training produces (k + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.options import option
from rpegc.core.lower.unroll import MAX_STEPS, unroll
from rpegc.core.ir.stages import CYCLIC, UNROLLED, PassStages
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class UnrollPass(ModulePass):
    name = "unroll"
    stages = PassStages(needs=CYCLIC, produces=UNROLLED, does="unrolls the cyclic graph")
    k: int = option(2, "K_eval: the RL steps to unroll")

    def check_options(self, where=None) -> None:
        if self.k < 1:
            raise RpegError(None, f"unroll needs K_eval >= 1 steps, got k={self.k}; use e.g. unroll{{k=8}}")
        if self.k > MAX_STEPS:
            raise RpegError(None, f"unroll{{k={self.k}}} asks for more than {MAX_STEPS} steps; use e.g. unroll{{k=8}}")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, lambda p: unroll(p, self.k))
