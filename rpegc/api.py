"""rpegc's public Python API: what `import rpegc` gives (re-exported by rpegc/__init__.py).

Programs are plain dataclasses (`Program` and what it holds); every function takes and returns them. The
compiler functions run the same passes as `rpegc -p ...`, so their options are the pass options under the same
names, checked the same way (`rpegc --list-passes` lists them): `optimize(p, evals=3000, seed=0)` is
`-p 'optimize{evals=3000 seed=0}'`. Bad input raises `RpegError` (a located error: `.loc.file`, `.loc.line`,
`.message`; `str()` is the one-line `file:line:col: error: ...`).

    import rpegc
    p = rpegc.load("examples/ppo.rpeg")
    p = rpegc.optimize(p, evals=3000, seed=0)          # the search: a new plan (and structure)
    p = rpegc.schedule(rpegc.lower(p, k=8))            # unroll, lower, annotate-cost, schedule
    print(p.exec.schedule.makespan, rpegc.to_text(p))

Heavy modules (xDSL, the search) are imported when a function needs them, so `import rpegc` stays cheap for
the runtime, which never needs xDSL.
"""

from __future__ import annotations

from typing import Union

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.program import Program
from rpegc.inputs import MAX_MODULE_BYTES, read_input_text

ProgramOrText = Union[Program, str]


# --- reading and writing -----------------------------------------------------------------------------------

def parse(text: str, filename: str = "<string>") -> Program:
    """A module in the `.rpeg` text form."""
    from rpegc.syntax.parser import parse as parse_text

    return parse_text(text, filename)


def load(path: str) -> Program:
    """A module from a file: `.json` (the JSON form), `.mlir` (the generic MLIR form), else `.rpeg` text."""
    text = read_input_text(path, "the module", MAX_MODULE_BYTES)
    from rpegc.core.check.exec_numbers import check_exec

    if path.endswith(".mlir"):
        program = from_mlir(text, path)
    else:
        program = from_json(text, path) if path.endswith(".json") else parse(text, path)
    check_exec(program)
    return program


def to_text(program: Program) -> str:
    """The `.rpeg` text form (what `rpegc` prints)."""
    from rpegc.syntax.printer import print_program

    return print_program(program)


def to_json(program: Program) -> str:
    """The JSON form (`rpegc --emit=json`, schema in docs/language.md)."""
    from rpegc.syntax.json_form import program_to_text

    return program_to_text(program)


def from_json(text: str, filename: str = "<string>") -> Program:
    from rpegc.syntax.json_form import program_from_text

    return program_from_text(text, filename)


def to_mlir(program: Program) -> str:
    """The generic MLIR form of the rpeg/exec dialects (`rpegc --emit=mlir`), which mlir-opt and xdsl-opt read."""
    from rpegc.dialects.convert import program_to_module
    from rpegc.dialects.mlir_form import print_mlir

    return print_mlir(program_to_module(program))


def from_mlir(text: str, filename: str = "<string>") -> Program:
    """A Program from MLIR text: `to_mlir`'s, or what mlir-opt or xdsl-opt printed of it."""
    from xdsl.utils.exceptions import ParseError, VerifyException

    from rpegc.dialects.convert import make_context, module_to_program
    from rpegc.dialects.mlir_form import parse_mlir

    try:
        module = parse_mlir(make_context(), text, filename)
        module.verify()
    except (ParseError, VerifyException) as e:  # e.g. `B = 512 : i32` where the dialect wants an i64
        raise RpegError(Loc(filename, 0, 0), f"not an rpegc MLIR module: {str(e).strip().splitlines()[-1]}") from None
    return module_to_program(module)


# --- compiling ---------------------------------------------------------------------------------------------

def run_pipeline(program: ProgramOrText, pipeline: str, filename: str = "<string>") -> Program:
    """`program` (a Program or `.rpeg` text) through the pass pipeline `pipeline`, written as for `rpegc -p`
    (e.g. "verify-wellformed,unroll{k=8}"); any pass of the xDSL multiverse, plugins included."""
    from xdsl.passes import PassPipeline
    from xdsl.universe import Universe
    from xdsl.utils.exceptions import ArgSpecParseError

    from rpegc.dialects.convert import make_context, module_to_program, program_to_module
    from rpegc.passes.program_pass import RpegPassError, option_error, pass_message

    p = parse(program, filename) if isinstance(program, str) else program
    passes = Universe.get_multiverse().all_passes
    try:
        steps = PassPipeline.parse_spec(passes, pipeline)
    except (ArgSpecParseError, ValueError) as e:
        raise RpegError(Loc("<pipeline>", 1, 1), f"bad pass pipeline {pipeline!r}: {e}") from None
    for step in steps.passes:
        err = option_error(step, Loc(p.file, 0, 0))
        if err is not None:
            raise RpegError(Loc("<pipeline>", 1, 1), pass_message(step, err))
    module = program_to_module(p)
    try:
        steps.apply(make_context(), module)
    except RpegPassError as e:
        raise e.error from None
    return module_to_program(module)


def pass_spec(name: str, options: dict) -> str:
    """`name{a=1 b="x"}` from keyword options (tuples as comma lists, booleans as true/false)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (tuple, list)):
            return ",".join(str(x) for x in v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(v)

    body = " ".join(f"{k}={value(v)}" for k, v in options.items())
    return f"{name}{{{body}}}" if body else name


def optimize(program: ProgramOrText, **options) -> Program:
    """The `optimize` pass (Sec. VI): a new plan, staleness and actor-critic sharing; options as the pass's
    (budget, evals, seed, jobs, objective, taus, ac, steps, ablate, baseline, hardware and the cost options)."""
    return run_pipeline(program, "verify-wellformed," + pass_spec("optimize", {"summary": False, **options}))


def lower(program: ProgramOrText, k: int = 8, split: bool = True) -> Program:
    """Unroll K steps and lower: `unroll{k}`, `split-quantiles`, `insert-comm`, `insert-reshard`."""
    return run_pipeline(program, f"verify-wellformed,unroll{{k={k}}},{pass_spec('split-quantiles', {'enable': split})},"
                                 "insert-comm,insert-reshard")


def schedule(program: ProgramOrText, **cost_options) -> Program:
    """Node times, memory and the schedule of a lowered module: `annotate-cost{...}` (cost options and
    `hardware`, as the pass) then `schedule`."""
    return run_pipeline(program, pass_spec("annotate-cost", cost_options) + ",schedule")


def explain(program: ProgramOrText, hardware: str = "", **cost_options) -> str:
    """`rpegc --explain`: every operator's time terms and every device's memory, with a feasibility verdict."""
    from rpegc.core.cost.options import cost_options as checked_options
    from rpegc.core.cost.explain import explain as explain_program
    from rpegc.core.cost.hardware import program_hardware

    p = parse(program) if isinstance(program, str) else program
    return explain_program(p, program_hardware(p, hardware), checked_options(cost_options))


__all__ = [
    "CostOptions", "Program", "RpegError", "explain", "from_json", "from_mlir", "load", "lower", "optimize",
    "parse", "pass_spec", "run_pipeline", "schedule", "to_json", "to_mlir", "to_text",
]
