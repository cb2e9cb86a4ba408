"""verify-wellformed: Def. A.2 (well-formed RPEG) and, when a plan is present, Def. A.5 and P1-P8 (App. A-J2a).

Every violation is reported, each at its own source location with what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.ir.errors import RpegError, RpegErrors
from rpegc.core.ir.program import Program
from rpegc.core.check.wellformed import check_program
from rpegc.core.ir.stages import PassStages
from rpegc.passes.program_pass import check


def verify_program(p: Program) -> None:
    if p.graph is None:
        raise RpegError(p.workload.loc, "the module has no rpeg.graph to verify; add 'rpeg.graph @name { ... }'")
    errors = check_program(p)
    if errors:
        raise RpegErrors(errors) if len(errors) > 1 else errors[0]


@dataclass(frozen=True)
class VerifyWellformedPass(ModulePass):
    name = "verify-wellformed"
    stages = PassStages()  # any stage: it only checks

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check(self.name, op, verify_program)
