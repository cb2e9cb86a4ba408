"""The `rpegc` driver: mlir-opt-style pass pipelines over `.rpeg` modules (DESIGN.md Section 5).

Built on xDSL's opt main, so `-p`, `-o`, `--split-input-file`, `--verify-diagnostics`,
`--print-between-passes` and `--time-passes` behave as in xdsl-opt. rpegc adds the `.rpeg` (and `.json`)
frontends, `--emit=rpeg|mlir|json|dot`, the `-O` preset pipeline, `--summary`, `--explain` and `--gantt`.
Every user error is printed as `file:line:col: error: ...` with the source line and a caret, and exits 1;
outputs are written atomically and never over the input file.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile
import time
from typing import IO, Sequence

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from rpegc.core.errors import Loc, RpegError, render
from rpegc.registry import PASSES as _RPEGC_PASSES

EMITS = ("rpeg", "mlir", "json", "dot")
PRESET_PIPELINE = (
    "verify-wellformed,optimize,unroll{k=8},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
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


class RpegcMain(xDSLOptMain):
    """xDSL's opt main with rpegc's frontends, emitters and error reporting."""

    def __init__(self, args: Sequence[str] | None = None):
        self.sources: dict[str, str] = {}
        self.summary_programs: list = []
        try:
            super().__init__(description="rpegc: compile RL post-training pipelines (.rpeg)", args=args)
        except ArgSpecParseError as err:  # a BaseException in xDSL
            spec = self._raw_pipeline(args)
            raise UsageError(_spec_parse_error_text(spec, str(err))) from None
        except ValueError as err:
            spec = self._raw_pipeline(args)
            message = explain_pipeline_error(str(err), self._known_passes())
            raise pipeline_error(spec, message, locate_in_spec(spec, str(err))) from None

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
        arg_parser.add_argument("-O", dest="optimize_preset", action="store_true",
                                help=f"run the preset pipeline: {PRESET_PIPELINE}")
        arg_parser.add_argument("--summary", action="store_true", help="print a one-screen summary to stderr")
        arg_parser.add_argument("--explain", action="store_true",
                                help="print every operator's time terms and every device's memory to stderr")
        arg_parser.add_argument("--gantt", metavar="PATH", help="draw the schedule (PNG or SVG by extension)")

    def setup_pipeline(self):
        if self.args.optimize_preset:
            if self.args.passes:
                raise UsageError("error: -O runs a preset pipeline; do not combine it with -p")
            self.args.passes = PRESET_PIPELINE
        self.pipeline = PassPipeline.parse_spec(self.available_passes, self.args.passes, self._between_passes)
        self._pass_started = time.perf_counter()

    def _between_passes(self, previous: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        """xDSL's pipeline callback, writing to stderr (stdout carries the module) and in .rpeg form."""
        if self.args.time_passes and previous is not None:
            sys.stderr.write(f"Pass {previous.name} took {time.perf_counter() - self._pass_started} seconds\n")
        if not self.args.disable_verify:
            module.verify()
        if previous is not None and following is not None and self.args.print_between_passes:
            from rpegc.dialects.convert import module_to_program
            from rpegc.syntax.printer import print_program

            sys.stderr.write(f"// ----- IR after {previous.name} -----\n{print_program(module_to_program(module))}\n")
        self._pass_started = time.perf_counter()

    # -- input ----------------------------------------------------------------------------------------------
    def register_all_frontends(self):
        super().register_all_frontends()
        self.available_frontends["rpeg"] = self._parse_rpeg
        self.available_frontends["json"] = self._parse_json

    def _parse_rpeg(self, io: IO[bytes]) -> ModuleOp:
        from rpegc.dialects.convert import program_to_module
        from rpegc.syntax.parser import parse

        text = self._decode(io)
        return program_to_module(parse(text, self.get_input_name()))

    def _parse_json(self, io: IO[bytes]) -> ModuleOp:
        import json

        from rpegc.dialects.convert import program_to_module
        from rpegc.syntax.json_form import program_from_json

        text = self._decode(io)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise RpegError(Loc(self.get_input_name(), err.lineno, err.colno), f"invalid JSON: {err.msg}") from None
        return program_to_module(program_from_json(data, self.get_input_name()))

    def _decode(self, io: IO[bytes]) -> str:
        raw = io.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            col = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
            raise RpegError(Loc(self.get_input_name(), line, col), "the file is not valid UTF-8 text") from None
        text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark; columns count from after it
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
        return emit_program(program, self.args.emit)

    # -- main loop ------------------------------------------------------------------------------------------
    def run(self):
        chunks, extension = self.prepare_input()
        outputs: list[str] = []
        for i, (chunk, offset) in enumerate(chunks):
            try:
                module = self._parse_chunk_at(chunk, extension, offset)
                self.apply_passes(module)
                outputs.append(self.output_resulting_program(module))
            except (RpegError, DiagnosticException, ParseError) as err:
                text = self.render_error(err)
                if not self.args.verify_diagnostics:
                    raise UsageError(text) from None
                outputs.append(text + "\n")
            finally:
                chunk.close()
        self.write_output("// -----\n".join(outputs))
        self.after_output()

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

    def render_error(self, err: Exception) -> str:
        from rpegc.passes.program_pass import RpegPassError

        if isinstance(err, RpegPassError):
            return render(err.error, self.sources.get(err.error.loc.file))
        if isinstance(err, RpegError):
            return render(err, self.sources.get(err.loc.file))
        return f"{self.get_input_name()}: error: {err}"

    def write_output(self, text: str) -> None:
        if self.args.output_file is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        write_atomic(self.args.output_file, text, protect=self.args.input_file)

    def after_output(self) -> None:
        programs = self.summary_programs
        if not programs:
            return
        program = programs[-1]
        if self.args.summary or self.args.optimize_preset:
            from rpegc.summary import summary

            sys.stderr.write(summary(program))
        if self.args.explain:
            from rpegc.core.explain import explain
            from rpegc.passes.annotate_cost import program_hardware

            sys.stderr.write(explain(program, program_hardware(program)))
        if self.args.gantt:
            draw_gantt_checked(program, self.args.gantt)


def emit_program(program, emit: str) -> str:
    if emit == "rpeg":
        from rpegc.syntax.printer import print_program

        return print_program(program)
    if emit == "json":
        import json

        from rpegc.syntax.json_form import program_to_json

        return json.dumps(program_to_json(program), indent=1) + "\n"
    from rpegc.tools.dot import program_to_dot

    return program_to_dot(program)


def draw_gantt_checked(program, path: str) -> None:
    if program.exec is None or program.exec.schedule is None:
        raise UsageError("error: --gantt needs a scheduled module; run the pipeline through 'schedule'")
    from rpegc.tools.gantt import draw_gantt

    tmp = _tmp_path(path)
    try:
        draw_gantt(program, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    sys.stderr.write(f"wrote Gantt chart {path}\n")


def _tmp_path(path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"{path}: error: the output directory {directory} does not exist")
    base, ext = os.path.splitext(os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=ext, dir=directory)
    os.close(fd)
    return tmp


def write_atomic(path: str, text: str, protect: str | None = None) -> None:
    """Write `text` to `path` via a temporary file and rename; refuse to overwrite the input file."""
    if protect is not None and os.path.exists(path) and os.path.samefile(path, protect):
        raise UsageError(f"{path}: error: refusing to overwrite the input file; choose another -o path")
    tmp = _tmp_path(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _spec_parse_error_text(spec: str, message: str) -> str:
    """Reformat xDSL's pipeline parse error as `<pipeline>:1:col: error: ...` with a caret."""
    match = re.search(r"pass-pipeline:(\d+):(\d+)", message)
    col = int(match.group(2)) if match else 1  # xDSL already counts columns from 1
    reason = message.strip().splitlines()[-1].strip() if message.strip() else "malformed pipeline"
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
