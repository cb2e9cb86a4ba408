"""The `rpegc` driver: mlir-opt-style pass pipelines over `.rpeg` modules (DESIGN.md Section 5).

Built on xDSL's opt main, so `-p`, `-o`, `--split-input-file`, `--verify-diagnostics`,
`--print-between-passes` and `--time-passes` behave as in xdsl-opt. rpegc adds the `.rpeg` (and `.json`)
frontends, `--emit=rpeg|mlir|json|dot`, the `-O` preset pipeline, `--summary`, `--explain` and `--gantt`.
Every user error is printed as `file:line:col: error: ...` with the source line and a caret, and exits 1;
outputs are written atomically and never over the input file.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from typing import IO, Sequence

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from rpegc.core.errors import Loc, RpegError, render

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
            raise pipeline_error(spec, str(err), locate_in_spec(spec, str(err))) from None

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
        super().setup_pipeline()

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
        if self.args.input_file is not None and not os.path.isfile(self.args.input_file):
            raise UsageError(f"{self.args.input_file}: error: cannot read the input file (no such file)")
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
    col = int(match.group(2)) + 1 if match else 1
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
