"""The `rpegc` driver: mlir-opt-style pass pipelines over `.rpeg` modules (docs/architecture.md, Passes and the driver).

Built on xDSL's opt main, so `-p`, `-o` and `--split-input-file` behave as in xdsl-opt. rpegc adds the `.rpeg`
(and `.json`) frontends, `--emit=rpeg|mlir|json|dot`, the `-O` preset pipeline, `--summary`, `--explain`,
`--gantt`, `--list-passes`, and mlir-opt's `--verify-diagnostics` (rpegc/diagnostics.py), `--time-passes` report
and `--print-ir-after-all|change|failure` dumps.
Every user error is printed as `file:line:col: error: ...` with the source line and a caret, and exits 1;
outputs are checked before the run and written as rpegc/outputs.py says (atomically, never over an input).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Optional, Sequence

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.arg_spec import ArgSpec, PipelineLexer, SpecTokenKind, parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from rpegc.core.ir import stages
from rpegc.core.ir.errors import Loc, RpegError, render, utf8_text
from rpegc.outputs import GANTT_FORMATS, Output, OutputError, Outputs, check_outputs
from rpegc.passes.program_pass import option_error, pass_message
from rpegc.registry import PASSES as _RPEGC_PASSES
from rpegc.tools.dot import DETAILS as DOT_DETAILS

EMITS = ("rpeg", "mlir", "json", "dot")
PRESET_PIPELINE = (
    "verify-wellformed,optimize,unroll{k=8},split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule"
)


class UsageError(Exception):
    """A bad command line (options, pipeline, files): printed as a located error, exit code 1."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def pipeline_error(spec: str, message: str, col: int) -> UsageError:
    """A located error inside the `-p` pipeline string, with a caret under the offending part."""
    return UsageError(f"<pipeline>:1:{col}: error: {message}\n{spec}\n{' ' * (col - 1)}^")


def explain_pipeline_error(message: str, known: list[str]) -> str:
    """xDSL's pipeline errors, reworded to say what to change."""
    unknown = re.match(r"Unrecognized passes: \[(.*)\]", message)
    if unknown:
        names = re.findall(r"'([^']*)'", unknown.group(1))
        hints = []
        for name in names:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"unknown pass '{name}'" + (f"; did you mean '{close[0]}'?" if close else ""))
        ours = [k for k in known if k in _RPEGC_PASSES]
        return "; ".join(hints) + f" (rpegc passes: {', '.join(ours)})"
    bad_type = re.match(r"Incompatible types: given \((.*),\), expected <class '(\w+)'>", message)
    if bad_type:
        return f"pass option value {bad_type.group(1)} is not of type {bad_type.group(2)}; write e.g. k=8 or flag=true"
    bad_arg = re.match(r'Provided arguments \[(.*)\] not found in expected arguments \[(.*)\]', message)
    if bad_arg:
        return f"unknown pass option {bad_arg.group(1)}; the pass accepts {bad_arg.group(2) or 'no options'}"
    return message


def locate_in_spec(spec: str, message: str) -> int:
    """Column of the first name quoted in xDSL's pipeline error message (1-based), else 1."""
    for name in re.findall(r"['\"]([\w\-]+)['\"]", message):
        idx = spec.find(name)
        if idx >= 0:
            return idx + 1
    return 1


@dataclass
class PassRef:
    """One pass of the `-p` string with the 1-based columns of its name, option names and values."""

    name: str
    col: int
    options: dict[str, tuple[int, int]] = field(default_factory=dict)  # normalized key -> (key col, value col)


def scan_pipeline(spec: str) -> Optional[list[PassRef]]:
    """The passes of `spec` with their columns, found with xDSL's own pipeline lexer. Raises UsageError for
    what xDSL accepts silently (an empty pipeline, a trailing comma, an option given twice); returns None
    for a spec xDSL itself rejects, so that its (reworded) error is reported."""
    if not spec.strip():
        raise pipeline_error(spec, "empty pass pipeline; give at least one pass, e.g. -p 'verify-wellformed' "
                                   "(or leave -p out to only parse and print)", 1)
    lexer = PipelineLexer(spec)
    tokens = []
    try:
        while True:
            tok = lexer.lex()
            tokens.append(tok)
            if tok.kind is SpecTokenKind.EOF:
                break
    except ArgSpecParseError:
        return None
    K = SpecTokenKind
    refs: list[PassRef] = []
    i = 0

    def col(j: int) -> int:
        return tokens[j].span.start + 1

    while True:
        if tokens[i].kind is not K.IDENT:
            return None
        ref = PassRef(tokens[i].span.text, col(i))
        refs.append(ref)
        i += 1
        if tokens[i].kind is K.L_BRACE:
            i += 1
            while tokens[i].kind is not K.R_BRACE:
                if tokens[i].kind is not K.IDENT:
                    return None
                key, key_at = tokens[i].span.text, i
                i += 1
                value_col = col(key_at)
                if tokens[i].kind is K.EQUALS:
                    i += 1
                    value_col = col(i)
                    while tokens[i].kind in (K.NUMBER, K.IDENT, K.STRING_LIT):
                        i += 1
                        if tokens[i].kind is not K.COMMA:
                            break
                        i += 1
                norm = key.replace("-", "_")
                if norm in ref.options:
                    first = ref.options[norm][0]
                    raise pipeline_error(spec, f"option '{key}' of {ref.name} is given twice (first at column "
                                               f"{first}); give each option once", col(key_at))
                ref.options[norm] = (col(key_at), value_col)
                if tokens[i].kind is K.SPACE:
                    i += 1
                elif tokens[i].kind is not K.R_BRACE:
                    return None
            i += 1
        if tokens[i].kind is K.EOF:
            return refs
        if tokens[i].kind is not K.COMMA:
            return None
        if tokens[i + 1].kind is K.EOF:
            raise pipeline_error(spec, "trailing comma in the pass pipeline; remove it or add a pass after it", col(i))
        i += 1


def check_pass_options(spec: str, refs: list[PassRef], available, where: Loc) -> None:
    """Type and range checks of every pass option, each located at its value in the `-p` string."""
    for ref, arg in zip(refs, parse_pipeline(spec)):
        if arg.name not in available:
            continue  # xDSL reports unknown passes
        cls = available[arg.name]()
        fields = {f.name for f in dataclasses.fields(cls)}
        options = arg.normalize_parameter_names().parameters
        singles = {}
        for key, values in options.items():
            key_col, value_col = ref.options[key]
            if key not in fields:
                message = explain_pipeline_error(
                    f'Provided arguments ["{key}"] not found in expected arguments '
                    f'[{", ".join(chr(34) + f + chr(34) for f in sorted(fields) if f != "name")}]', [])
                raise pipeline_error(spec, message, key_col)
            try:
                singles[key] = cls.from_spec(ArgSpec(arg.name, {key: values}))
            except ValueError as err:
                raise pipeline_error(spec, explain_pipeline_error(str(err), []), value_col) from None
        try:
            whole = cls.from_spec(arg)
        except ValueError as err:
            raise pipeline_error(spec, explain_pipeline_error(str(err), []), ref.col) from None
        failure = option_error(whole, where)
        if failure is None:
            continue
        # Blame the option that fails the same way on its own; an error of the combination points at the pass.
        for key, one in singles.items():
            err = option_error(one, where)
            if err is not None and err.message == failure.message:
                raise pipeline_error(spec, pass_message(one, err), ref.options[key][1])
        raise pipeline_error(spec, pass_message(whole, failure), ref.col)


def check_pass_order(spec: str, refs: list[PassRef], program, available) -> None:
    """Reject a pipeline whose passes cannot run in this order on this module, at the offending pass. Each pass
    class's `stages` declaration (rpegc/core/ir/stages.py) says what it needs and leaves; `available` maps pass
    names to factories of their classes."""
    walk = stages.start(program)
    for ref in refs:
        decl = getattr(available[ref.name](), "stages", None) if ref.name in available else None
        if not isinstance(decl, stages.PassStages):
            return  # a pass that declares nothing may change anything: stop checking
        fail = stages.refusal(decl, ref.name, walk)
        if fail is not None:
            raise pipeline_error(spec, fail, ref.col)
        walk = stages.advance(decl, ref.name, ref.col, walk)


class RpegcMain(xDSLOptMain):
    """xDSL's opt main with rpegc's frontends, emitters and error reporting."""

    def __init__(self, args: Sequence[str] | None = None):
        self.sources: dict[str, str] = {}
        self.summary_programs: list = []
        self._argv = args
        try:
            super().__init__(description="rpegc: compile RL post-training pipelines (.rpeg)", args=args)
        except ArgSpecParseError as err:  # a BaseException in xDSL
            spec = self._raw_pipeline(args)
            raise UsageError(_spec_parse_error_text(spec, str(err))) from None
        except ValueError as err:
            spec = self._raw_pipeline(args)
            message = explain_pipeline_error(str(err), self._known_passes())
            raise pipeline_error(spec, message, locate_in_spec(spec, str(err))) from None

    def _pipeline_given(self) -> bool:
        argv = list(sys.argv[1:] if self._argv is None else self._argv)
        return any(a in ("-p", "--passes") or a.startswith("--passes=") or (a.startswith("-p") and len(a) > 2
                                                                             and not a.startswith("--"))
                   for a in argv)

    def _known_passes(self) -> list[str]:
        from xdsl.universe import Universe

        return sorted(Universe.get_multiverse().all_passes)

    @staticmethod
    def _raw_pipeline(args: Sequence[str] | None) -> str:
        argv = list(sys.argv[1:] if args is None else args)
        for i, a in enumerate(argv):
            if a in ("-p", "--passes") and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith("--passes="):
                return a.split("=", 1)[1]
            if a.startswith("-p") and len(a) > 2:
                return a[2:]
        return ""

    # -- command line -------------------------------------------------------------------------------------
    def register_all_arguments(self, arg_parser: argparse.ArgumentParser):
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument("--emit", choices=EMITS, default="rpeg", help="output form (default: rpeg text)")
        arg_parser.add_argument("--dot-detail", choices=DOT_DETAILS, default="auto",
                                help="--emit=dot: 'full' draws every exec node, 'summary' merges a vertex's phases "
                                     "and a step's transfers per route, 'auto' (default) summarises above 60 nodes")
        arg_parser.add_argument("-O", dest="optimize_preset", action="store_true",
                                help=f"run the preset pipeline: {PRESET_PIPELINE}")
        arg_parser.add_argument("--summary", action="store_true", help="print a one-screen summary to stderr")
        arg_parser.add_argument("--explain", action="store_true",
                                help="print every operator's time terms and every device's memory to stderr")
        arg_parser.add_argument("--gantt", metavar="PATH", help="draw the schedule (PNG or SVG by extension)")
        arg_parser.add_argument("--print-ir-after-all", action="store_true",
                                help="print the module (.rpeg text) to stderr after every pass, with MLIR's header")
        arg_parser.add_argument("--print-ir-after-change", action="store_true",
                                help="as --print-ir-after-all, only after the passes that changed the module")
        arg_parser.add_argument("--print-ir-after-failure", action="store_true",
                                help="print the module to stderr after a pass that failed")
        arg_parser.add_argument("--list-passes", action="store_true",
                                help="list rpegc's passes with their paper sections and options, then exit")
        arg_parser.add_argument("--all-passes", action="store_true",
                                help="with --list-passes: also name xDSL's own passes")
        self._describe_self(arg_parser)

    def _describe_self(self, arg_parser: argparse.ArgumentParser) -> None:
        """rpegc's version line, and `-p`/`-t` help without xDSL's ~150 passes and targets."""
        from rpegc.version import version_line

        for action in arg_parser._actions:
            if action.dest == "passes":
                action.help = ("comma-separated pass pipeline, e.g. -p 'verify-wellformed,unroll{k=8}'; "
                               "rpegc --list-passes lists the passes and their options")
            elif action.dest == "verify_diagnostics":
                action.help = ("check the diagnostics against the input's `// expected-error @+N {{text}}` comments "
                               "(mlir-opt's meaning): exit 0 only if they match exactly")
            elif action.dest == "target":
                action.help = "xDSL printer for --emit=mlir (default mlir)"
            elif action.dest == "print_debuginfo":
                # Source positions are how rpegc locates errors: --emit=mlir keeps them as loc(...).
                action.default = True
                action.help = "print op locations as MLIR's loc(...) in --emit=mlir (always on)"
            elif action.dest == "version":
                action.version_format = version_line("rpegc").replace("{", "{{").replace("}", "}}")

    def setup_pipeline(self):
        given = self._pipeline_given()
        if self.args.optimize_preset:
            if self.args.passes or given:
                raise UsageError("error: -O runs a preset pipeline; do not combine it with -p")
            self.args.passes = PRESET_PIPELINE
        self.pass_refs: Optional[list[PassRef]] = None
        if given or self.args.passes:
            self.pass_refs = scan_pipeline(self.args.passes)
            if self.pass_refs is not None:
                check_pass_options(self.args.passes, self.pass_refs, self.available_passes,
                                   Loc(self.args.input_file or "<stdin>", 0, 0))
        self.pipeline = PassPipeline.parse_spec(self.available_passes, self.args.passes, self._between_passes)
        self._pass_started = time.perf_counter()
        self.timings: list[tuple[str, float]] = []  # --time-passes: (what, wall seconds), in order
        self._next_pass: ModulePass | None = None  # the pass that runs now (the one a failure names)
        self._verified: set[Operation] = set()  # the top-level ops verified after the last pass
        self._last_ir: Optional[str] = None  # --print-ir-after-change/failure: the module as the last pass left it

    def _between_passes(self, previous: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        """xDSL's pipeline callback, writing to stderr (stdout carries the module) and in .rpeg form."""
        if previous is not None:
            self.timings.append((previous.name, time.perf_counter() - self._pass_started))
        if not self.args.disable_verify:
            self._verify(previous, module)
        args = self.args
        if args.print_ir_after_all or args.print_ir_after_change or args.print_ir_after_failure or \
                args.print_between_passes:
            text = _module_text(module)
            dump = previous is not None and (
                args.print_ir_after_all or (args.print_between_passes and following is not None)
                or (args.print_ir_after_change and text != self._last_ir))
            if dump:
                sys.stderr.write(ir_dump_header(previous) + "\n" + text + "\n")
            self._last_ir = text
        self._next_pass = following
        self._pass_started = time.perf_counter()

    def _verify(self, previous: ModulePass | None, module: ModuleOp) -> None:
        """Verify the module as the last pass left it. rpegc's own passes keep an unchanged top-level op as it is
        and never change one in place (passes/program_pass.py), so after one of them only the ops it built anew
        are verified; after any other pass (a plugin's, xDSL's) the whole module is."""
        if previous is None or not _is_rpegc_pass(previous):
            module.verify()
        else:
            module.verify(verify_nested_ops=False)
            for op in module.ops:
                if op not in self._verified:
                    op.verify()
        self._verified = set(module.ops)

    def apply_passes(self, prog: ModuleOp):
        try:
            super().apply_passes(prog)
        except BaseException:
            if self.args.print_ir_after_failure and self._next_pass is not None and self._last_ir is not None:
                sys.stderr.write(ir_dump_header(self._next_pass, failed=True) + "\n" + self._last_ir + "\n")
            raise

    # -- input ----------------------------------------------------------------------------------------------
    def register_all_frontends(self):
        super().register_all_frontends()
        self.available_frontends["rpeg"] = self._parse_rpeg
        self.available_frontends["json"] = self._parse_json
        self.available_frontends["mlir"] = self._parse_mlir

    def _parse_rpeg(self, io: IO[bytes]) -> ModuleOp:
        from rpegc.dialects.convert import program_to_module
        from rpegc.syntax.parser import parse

        text = self._decode(io)
        return program_to_module(checked(parse(text, self.get_input_name())))

    def _parse_json(self, io: IO[bytes]) -> ModuleOp:
        from rpegc.dialects.convert import program_to_module
        from rpegc.syntax.json_form import program_from_text

        return program_to_module(checked(program_from_text(self._decode(io), self.get_input_name())))

    def _parse_mlir(self, io: IO[bytes]) -> ModuleOp:  # the MLIR form's verifiers check what it holds
        from rpegc.dialects.mlir_form import parse_mlir

        return parse_mlir(self.ctx, self._decode(io), self.get_input_name(), implicit_module=not self.args.no_implicit_module)

    def _decode(self, io: IO[bytes]) -> str:
        text = utf8_text(io.read(), self.get_input_name(), "the file is not valid UTF-8 text")
        self.sources[self.get_input_name()] = text
        return text

    def get_input_name(self):
        return self.args.input_file or "<stdin>"

    # -- output ---------------------------------------------------------------------------------------------
    def output_resulting_program(self, prog: ModuleOp) -> str:
        if self.args.emit == "mlir":
            return super().output_resulting_program(prog)
        from rpegc.dialects.convert import module_to_program

        program = module_to_program(prog)
        self.summary_programs.append(program)
        return emit_program(program, self.args.emit, self.args.dot_detail)

    # -- main loop ------------------------------------------------------------------------------------------
    def run(self):
        if self.args.list_passes:
            from rpegc.pass_catalog import list_passes

            sys.stdout.write(list_passes(self.available_passes, everything=self.args.all_passes))
            return
        if self.args.all_passes:
            raise UsageError("error: --all-passes goes with --list-passes")
        self.check_outputs()  # before anything runs, so a bad output path costs no compile and writes nothing
        chunks, extension = self.prepare_input()
        outputs: list[str] = []
        failures: list[str] = []  # --verify-diagnostics
        for i, (chunk, offset) in enumerate(chunks):
            found: list = []
            try:
                started = time.perf_counter()
                module = self._parse_chunk_at(chunk, extension, offset)
                self.timings.append(("parse", time.perf_counter() - started))
                if self.pass_refs:
                    from rpegc.dialects.convert import module_to_program

                    check_pass_order(self.args.passes, self.pass_refs, module_to_program(module),
                                     self.available_passes)
                self._pass_started = time.perf_counter()
                self.apply_passes(module)
                started = time.perf_counter()
                outputs.append(self.output_resulting_program(module))
                self.timings.append(("output", time.perf_counter() - started))
            except (RpegError, DiagnosticException, ParseError) as err:
                if not self.args.verify_diagnostics:
                    raise UsageError(self.render_error(err)) from None
                found = self._diagnostics(err)
            finally:
                chunk.close()
            if self.args.verify_diagnostics:
                from rpegc.diagnostics import expectations, verify

                name = self.get_input_name()
                failures += verify(found, expectations(self.sources.get(name, ""), name), name)
        if failures:
            raise UsageError("\n".join(failures))
        try:
            self.write_outputs("// -----\n".join(outputs))
        except OutputError as err:
            raise UsageError(str(err)) from None
        if self.args.time_passes:
            sys.stderr.write(timing_report(self.timings))

    def _parse_chunk_at(self, chunk: IO[bytes], extension: str, offset: int) -> ModuleOp:
        if extension == "rpeg" and offset:
            # Keep line numbers of split chunks relative to the whole file.
            from io import BytesIO

            chunk = BytesIO(b"\n" * offset + chunk.read())
        return self.parse_chunk(chunk, extension, offset)

    def prepare_input(self):
        path = self.args.input_file
        if path is not None and not os.path.isfile(path):
            why = "it is a directory" if os.path.isdir(path) else "no such file"
            raise UsageError(f"{path}: error: cannot read the input file ({why})")
        try:
            return super().prepare_input()
        except ValueError as err:
            raise UsageError(f"{self.get_input_name()}: error: {err}; use a .rpeg, .json or .mlir file "
                             "or choose a frontend with -f") from None

    def _diagnostics(self, err: Exception) -> list:
        """What a failed chunk reported, as diagnostics to verify against its expectations."""
        from rpegc.diagnostics import Diagnostic, diagnostics
        from rpegc.passes.program_pass import RpegPassError

        if isinstance(err, RpegPassError):
            return diagnostics(err.error)
        if isinstance(err, RpegError):
            return diagnostics(err)
        message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        return [Diagnostic("error", Loc(self.get_input_name(), 0, 0), message)]

    def render_error(self, err: Exception) -> str:
        from rpegc.passes.program_pass import RpegPassError

        if isinstance(err, RpegPassError):
            return render(err.error, self.sources.get(err.error.loc.file))
        if isinstance(err, RpegError):
            return render(err, self.sources.get(err.loc.file))
        return f"{self.get_input_name()}: error: {err}"

    def check_outputs(self) -> None:
        """-o and --gantt: writable, not the input, not each other, --gantt with a chart extension."""
        wanted = []
        if self.args.output_file is not None:
            wanted.append(Output(self.args.output_file, "the output"))
        if self.args.gantt is not None:
            wanted.append(Output(self.args.gantt, "the Gantt chart", suffixes=GANTT_FORMATS))
        try:
            check_outputs(wanted, inputs=[self.args.input_file] if self.args.input_file else [])
        except OutputError as err:
            raise UsageError(str(err)) from None

    def write_outputs(self, text: str) -> None:
        """The module (to -o or stdout), the reports on stderr and the Gantt chart; -o and --gantt are
        committed together, so a run whose chart fails leaves no module file either."""
        program = self.summary_programs[-1] if self.summary_programs else None
        if self.args.gantt and (program is None or program.exec is None or program.exec.schedule is None):
            raise UsageError("error: --gantt needs a scheduled module; run the pipeline through 'schedule'")
        with Outputs() as files:
            if self.args.output_file is not None:
                with open(files.open(self.args.output_file, "the output"), "w", encoding="utf-8") as f:
                    f.write(text)
            elif not self.args.explain:  # --explain without -o: the explanation only
                sys.stdout.write(text)
                sys.stdout.flush()
            self.print_reports(program)
            if self.args.gantt:
                from rpegc.tools.gantt import draw_gantt

                draw_gantt(program, files.open(self.args.gantt, "the Gantt chart"))
        if self.args.gantt:
            sys.stderr.write(f"wrote Gantt chart {self.args.gantt}\n")

    def print_reports(self, program) -> None:
        if program is None:
            return
        if self.args.summary or self.args.optimize_preset:
            from rpegc.summary import summary

            sys.stderr.write(summary(program))
        if self.args.explain:
            from rpegc.core.cost.explain import explain
            from rpegc.core.cost.hardware import program_hardware
            from rpegc.passes.program_pass import CostModelPass

            # Explained as the pipeline priced it: the options and hardware of its last pricing pass
            # (annotate-cost or optimize), else the spec's options and the cluster's profile.
            pricing = [p for p in self.pipeline.passes if isinstance(p, CostModelPass)]
            if pricing:
                last = pricing[-1]
                sys.stderr.write(explain(program, last.program_hardware(program), last.cost_options()))
            else:
                sys.stderr.write(explain(program, program_hardware(program)))


def _is_rpegc_pass(p: ModulePass) -> bool:
    """`p` is one of rpegc's own passes (not a plugin's class under the same name)."""
    factory = _RPEGC_PASSES.get(p.name)
    return factory is not None and type(p) is factory()


def checked(program):
    """A module as read, after the exec-graph checks every reader applies (rpegc.core.check.exec_numbers)."""
    from rpegc.core.check.exec_numbers import check_exec

    check_exec(program)
    return program


def _module_text(module: ModuleOp) -> str:
    from rpegc.dialects.convert import module_to_program
    from rpegc.syntax.printer import print_program

    return print_program(module_to_program(module))


def ir_dump_header(p: ModulePass, failed: bool = False) -> str:
    """mlir-opt's header of an IR dump (`--mlir-print-ir-after-*`); unlike `// -----`, no split marker."""
    return f"// -----// IR Dump After {type(p).__name__}{' Failed' if failed else ''} ({p.name}) //----- //"


def timing_report(timings: list[tuple[str, float]]) -> str:
    """MLIR's `--mlir-timing` report: wall time per pass (summed over split-input chunks, in first-run order)
    with its share of the total, then the total."""
    per: dict[str, float] = {}
    for name, seconds in timings:
        per[name] = per.get(name, 0.0) + seconds
    total = sum(per.values())
    rule = "===" + "-" * 73 + "==="
    lines = [rule, "... Execution time report ...".center(len(rule)).rstrip(), rule,
             f"  Total Execution Time: {total:.4f} seconds", "", "  ----Wall Time----  ----Name----"]
    for name, seconds in per.items():
        lines.append(f"  {seconds:8.4f} ({100 * seconds / total if total else 0.0:5.1f}%)  {name}")
    lines.append(f"  {total:8.4f} (100.0%)  Total")
    return "\n".join(lines) + "\n"


def emit_program(program, emit: str, dot_detail: str = "auto") -> str:
    if emit == "rpeg":
        from rpegc.syntax.printer import print_program

        return print_program(program)
    if emit == "json":
        from rpegc.syntax.json_form import program_to_text

        try:
            return program_to_text(program)
        except RpegError as err:
            raise UsageError(f"error: {err.message}") from None
    from rpegc.tools.dot import program_to_dot

    return program_to_dot(program, dot_detail)


def _spec_parse_error_text(spec: str, message: str) -> str:
    """Reformat xDSL's pipeline parse error as `<pipeline>:1:col: error: ...` with a caret."""
    match = re.search(r"pass-pipeline:(\d+):(\d+)", message)
    col = int(match.group(2)) if match else 1  # xDSL already counts columns from 1
    reason = message.strip().splitlines()[-1].strip() if message.strip() else "malformed pipeline"
    value = re.search(r"([A-Za-z0-9_-]+)=([^\s{},=]*)$", spec[: col - 1])
    if value is not None and reason.startswith("Unknown token") and col - 1 < len(spec):
        start = value.start(2)
        end = re.search(r"[\s}]|$", spec[start:])
        text = spec[start: start + end.start()] if end else spec[start:]
        return pipeline_error(spec, f"malformed pass pipeline: the value of {value.group(1)} is not a name or a "
                                    f"number; a path or other text needs quotes: {value.group(1)}=\"{text}\"",
                              start + 1).text
    return pipeline_error(spec, f"malformed pass pipeline: {reason}", col).text


def main(argv: Sequence[str] | None = None) -> int:
    try:
        RpegcMain(argv).run()
    except UsageError as err:
        sys.stderr.write(err.text.rstrip("\n") + "\n")
        return 1
    except RpegError as err:
        sys.stderr.write(render(err, None) + "\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("rpegc: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as err:  # a bug in rpegc, not bad input: say so without a wall of traceback
        if os.environ.get("RPEGC_DEBUG"):
            raise
        sys.stderr.write(f"rpegc: internal error: {type(err).__name__}: {err}\n"
                         "(this is a bug in rpegc; rerun with RPEGC_DEBUG=1 for the traceback)\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
