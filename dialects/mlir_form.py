"""The MLIR text form of an rpeg/exec module, as LLVM's mlir-opt and xDSL's xdsl-opt both read and write it.

Paper: none (tooling; docs/architecture.md, IR). rpegc prints the generic form with builtin `N : i64` integers and
MLIR's op locations `loc("file":line:col)`, which `mlir-opt --allow-unregistered-dialect` parses and re-prints.
Reading mlir-opt's output back needs two things xDSL's parser lacks: with `--mlir-print-debuginfo`, mlir-opt
writes `loc(#loc3)` in the ops and defines `#loc3 = loc(...)` after the module, and MLIR resolves such
location aliases late (`parse_mlir` reads those definitions first); and both printers escape a non-ASCII file
name (`loc("d\\C3\\BCr.rpeg":3:1)`), which xDSL's location parser refuses (`_Parser` reads it).
"""

from __future__ import annotations

import re
from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, LocationAttr, ModuleOp, NameLoc, NoneAttr, StringAttr
from xdsl.ir import Attribute
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.mlir_lexer import MLIRTokenKind

# A top-level location alias definition, as mlir-opt prints them at the end of a file.
_LOCATION_ALIAS = re.compile(r"^(#[A-Za-z_$.][\w$.-]*)[ \t]*=[ \t]*(loc\(.*\))[ \t]*$", re.MULTILINE)


def print_mlir(module: ModuleOp) -> str:
    """The generic MLIR form of `module`, op locations included."""
    out = StringIO()
    Printer(stream=out, print_debuginfo=True).print_op(module)
    return out.getvalue() + "\n"


def parse_mlir(ctx: Context, text: str, filename: str, implicit_module: bool = True) -> ModuleOp:
    """Parse MLIR text (rpegc's, xdsl-opt's or mlir-opt's output); location aliases may be defined after use.
    Raises xDSL's ParseError, located in `text`."""
    aliases, text = _location_aliases(ctx, text, filename)
    parser = _Parser(ctx, text, filename)
    parser.attribute_aliases.update(aliases)
    return parser.parse_module(implicit_module)


def _location_aliases(ctx: Context, text: str, filename: str) -> tuple[dict[str, Attribute], str]:
    """The location aliases defined at top level, and `text` with their definitions blanked (same length, so
    every later error keeps its line and column)."""
    aliases: dict[str, Attribute] = {}
    pieces: list[str] = []
    done = line = 0
    for match in _LOCATION_ALIAS.finditer(text):
        line += text.count("\n", done, match.start())
        col = match.start(2) - match.start()
        # The value parsed at its own line and column: an error in it is located where the user sees it.
        parser = _Parser(ctx, "\n" * line + " " * col + match.group(2), filename)
        parser.attribute_aliases = aliases
        location = parser.parse_optional_location()
        if location is None:
            parser.raise_error("expected a location")
        aliases[match.group(1)] = location
        pieces.append(text[done:match.start()])
        pieces.append(" " * (match.end() - match.start()))
        done = match.end()
    pieces.append(text[done:])
    return aliases, "".join(pieces)


class _Parser(Parser):
    """xDSL's parser, also reading a location whose file name has escaped non-ASCII bytes (a bytes token)."""

    def _parse_location(self) -> LocationAttr:
        if self._current_token.kind is not MLIRTokenKind.BYTES_LIT:
            return super()._parse_location()
        raw = self.parse_bytes_literal()
        try:
            name = StringAttr(raw.decode("utf-8"))
        except UnicodeDecodeError:
            self.raise_error("a location's file name must be UTF-8 text")
        if self.parse_optional_punctuation(":") is None:
            return NameLoc(name, NoneAttr())
        line = self.parse_integer(False, False)
        self.parse_punctuation(":")
        col = self.parse_integer(False, False)
        return FileLineColLoc(name, IntAttr(line), IntAttr(col))
