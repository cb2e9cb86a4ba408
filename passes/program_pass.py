"""What every rpegc pass shares: run a `rpegc/core` function on the module's plain-data form.

A pass converts the xDSL module to a `Program`, applies one core function, and writes the result back into the
same ModuleOp (a ModulePass mutates its module): a top-level op whose section the function left unchanged is kept
as it is, every other one is built anew, and no op is ever changed in place (the driver relies on that to verify
only the new ones between passes, see `rpegc/cli.py`). User errors from the core (`RpegError`) become
`RpegPassError`, an xDSL `PassFailedException` that still carries the located error so the driver can print
the source line and a caret.

A pass with options may define `check_options(self, where)`: it raises RpegError for a bad option value
before anything runs (`where` is the input's location, against which relative paths resolve). The driver
calls it once per option given on its own, so the error points at that option's value in the `-p` string.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Optional

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.options import option
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.cost.hardware import Hardware, program_hardware
from rpegc.core.ir.gc_pause import without_gc
from rpegc.core.ir.program import Program


class RpegPassError(PassFailedException):
    """A pass failed on bad input; `error` holds the located RpegError(s)."""

    def __init__(self, pass_name: str, error: RpegError):
        super().__init__(str(error))
        self.pass_name = pass_name
        self.error = error


def read_program(module: ModuleOp) -> Program:
    from rpegc.dialects.convert import module_to_program

    return module_to_program(module)


@without_gc  # a pass builds the whole module again: see rpegc/core/ir/gc_pause.py
def transform(pass_name: str, module: ModuleOp, fn: Callable[[Program], Program]) -> Program:
    """Apply `fn` to the module's Program and write the result back; returns the new Program."""
    from rpegc.dialects.convert import replace_module

    before = read_program(module)
    try:
        result = fn(before)
    except RpegError as err:
        raise RpegPassError(pass_name, err) from None
    replace_module(module, result, before)
    return result


@without_gc
def check(pass_name: str, module: ModuleOp, fn: Callable[[Program], None]) -> None:
    """Run a check that does not change the module."""
    try:
        fn(read_program(module))
    except RpegError as err:
        raise RpegPassError(pass_name, err) from None


def option_error(instance, where: Loc) -> Optional[RpegError]:
    """What the pass's `check_options` says of its options (None: nothing); an error located in a file the options
    name (e.g. a bad hardware profile) is raised at once."""
    check = getattr(instance, "check_options", None)
    if check is None:
        return None
    try:
        check(where)
    except RpegError as err:
        if err.loc.line > 0:
            raise
        return err
    return None


def pass_message(instance, err: RpegError) -> str:
    """`err`'s message, prefixed with the pass name unless it starts with it."""
    return err.message if err.message.startswith(instance.name) else f"{instance.name}: {err.message}"


def check_hardware(name_or_path: str, where) -> None:
    """A `hardware=...` pass option names a loadable profile (relative paths as the pass resolves them)."""
    if name_or_path:
        from rpegc.core.cost.hardware import load_hardware

        load_hardware(name_or_path, where)


@dataclass(frozen=True)
class CostModelPass(ModulePass, CostOptions):
    """A pass that prices plans (annotate-cost, optimize): its options are the fields of `CostOptions`,
    inherited, so both passes take the same ones under the same names and defaults, plus `hardware`, a
    profile that overrides the cluster's."""

    hardware: str = option("", "hardware profile (a name such as gh200, or a TOML path) instead of the cluster's")

    def __post_init__(self) -> None:
        """Nothing at construction: `check_options` checks the values, so the driver can locate a bad one."""

    def cost_options(self) -> CostOptions:
        return CostOptions(**{f.name: getattr(self, f.name) for f in fields(CostOptions)})

    def program_hardware(self, p: Program) -> Hardware:
        return program_hardware(p, self.hardware, self.name)

    def check_options(self, where=None) -> None:
        self.cost_options()
        check_hardware(self.hardware, where)

