"""Typed attributes shared by the `rpeg` and `exec` dialects (all spelled `#rpeg.*`).

Paper: App. A-A..A-D (size expressions over B, R, Lp, Lr; allocations D(o, delta), Def. A.4;
strategies (P_d, P_p, P_t, mb), Def. A.5; model architectures, spec 1.1) and Def. A.9 (quantiles).
Every value an op carries is one of these typed attributes or a builtin one, never a string that
is parsed later. Attributes whose parameters are plain integers print compactly
(`#rpeg.alloc<(0, 0, 0), (1, 8, 4)>`) and parse back with xDSL's Parser.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    BytesAttr,
    CallSiteLoc,
    FileLineColLoc,
    FloatAttr,
    FusedLoc,
    IntAttr,
    IntegerAttr,
    LocationAttr,
    NameLoc,
    StringAttr,
    SymbolRefAttr,
    UnknownLoc,
    i64,
)
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc
from rpegc.core.ir.expr import SYMBOLS, BinOp, Expr, Num, Sym
from rpegc.core.ir.program import ARCH_FLAGS, ARCH_SIZES, HEAD_DIM, Arch
from rpegc.core.ir.geometry import Alloc, Strategy
from rpegc.core.ir.training import CHOICES as TRAIN_CHOICES, FIELDS as TRAIN_FIELDS, TrainSpec

# xDSL prints a non-ASCII StringAttr with hex escapes, and its lexer reads such a literal back as a
# BytesAttr. Free-text values (names, paths) therefore accept both; `text()` decodes either.
Text = StringAttr | BytesAttr

BINARY_OPS = ("+", "-", "*", "/")

# An integer an op carries is MLIR's builtin `512 : i64` (xDSL's own `#builtin.int<512>` has no MLIR
# spelling: mlir-opt rejects it). Integers inside rpeg attributes print in the attribute's own syntax.
I64Attr = IntegerAttr[I64]


def i64_attr(value: int) -> I64Attr:
    return IntegerAttr(int(value), i64)


def int_of(attr: I64Attr) -> int:
    return attr.value.data


def text(attr: StringAttr | BytesAttr) -> str:
    """The Python string of a StringAttr, or of the BytesAttr xDSL parses non-ASCII text into."""
    data = attr.data
    return data.decode("utf-8") if isinstance(data, bytes) else data


def parse_text(parser: AttrParser) -> str:
    literal = parser.parse_optional_str_literal()
    if literal is not None:
        return literal
    return parser.parse_bytes_literal(" (a quoted string)").decode("utf-8")


def _print_ints(printer: Printer, values: tuple[int, ...]) -> None:
    printer.print_string("(" + ", ".join(str(v) for v in values) + ")")


def _parse_ints(parser: AttrParser) -> tuple[int, ...]:
    return tuple(parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_integer))


def _print_keyed_ints(printer: Printer, keys: tuple[str, ...], values: tuple[int, ...]) -> None:
    with printer.in_angle_brackets():
        printer.print_string(", ".join(f"{k} = {v}" for k, v in zip(keys, values)))


def _parse_keyed_ints(parser: AttrParser, keys: tuple[str, ...]) -> list[IntAttr]:
    values: list[IntAttr] = []
    with parser.in_angle_brackets():
        for i, key in enumerate(keys):
            if i:
                parser.parse_punctuation(",")
            parser.parse_keyword(key)
            parser.parse_punctuation("=")
            values.append(IntAttr(parser.parse_integer(allow_boolean=False)))
    return values


def location_attr(loc: Loc) -> LocationAttr:
    """MLIR's native location of a source position: `loc("file":line:col)`, or `loc(unknown)`."""
    if loc == UNKNOWN_LOC:
        return UnknownLoc()
    return FileLineColLoc(StringAttr(loc.file), IntAttr(loc.line), IntAttr(loc.col))


def loc_from(location: Attribute | None) -> Loc:
    """The source position of an MLIR location; a name, call-site or fused location gives its first file
    position (mlir-opt keeps ours as they are, but a user's file may carry any kind)."""
    if isinstance(location, FileLineColLoc):
        return Loc(text(location.filename), location.line.data, location.column.data)
    if isinstance(location, NameLoc):
        return loc_from(location.location)
    if isinstance(location, CallSiteLoc):
        return loc_from(location.callee)
    if isinstance(location, FusedLoc):
        for inner in location.locations.data:
            found = loc_from(inner)
            if found != UNKNOWN_LOC:
                return found
    return UNKNOWN_LOC


class ExprAttr(ParametrizedAttribute):
    """Base of the size-expression attributes: `#rpeg.num`, `#rpeg.sym` and `#rpeg.binop`."""

    def to_expr(self) -> Expr:
        raise NotImplementedError(type(self).__name__)


@irdl_attr_definition
class NumAttr(ExprAttr):
    """An integer literal of a size expression: `#rpeg.num<4>`."""

    name = "rpeg.num"
    value: IntAttr

    def to_expr(self) -> Expr:
        return Num(self.value.data)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.value.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[IntAttr]:
        with parser.in_angle_brackets():
            return (IntAttr(parser.parse_integer(allow_boolean=False)),)


@irdl_attr_definition
class SymAttr(ExprAttr):
    """A workload symbol of a size expression: `#rpeg.sym<Lp>`."""

    name = "rpeg.sym"
    symbol: StringAttr

    def to_expr(self) -> Expr:
        return Sym(self.symbol.data)

    def verify(self) -> None:
        if self.symbol.data not in SYMBOLS:
            raise VerifyException(
                f"#rpeg.sym: unknown symbol '{self.symbol.data}'; use one of {', '.join(SYMBOLS)}"
            )

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.symbol.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[StringAttr]:
        with parser.in_angle_brackets():
            return (StringAttr(parser.parse_identifier(" (one of B, R, Lp, Lr)")),)


@irdl_attr_definition
class BinOpAttr(ExprAttr):
    """`lhs op rhs` of a size expression: `#rpeg.binop<"*", #rpeg.sym<B>, #rpeg.sym<R>>`."""

    name = "rpeg.binop"
    op: StringAttr
    lhs: ExprAttr
    rhs: ExprAttr

    def to_expr(self) -> Expr:
        return BinOp(self.op.data, self.lhs.to_expr(), self.rhs.to_expr())

    def verify(self) -> None:
        if self.op.data not in BINARY_OPS:
            raise VerifyException(
                f"#rpeg.binop: unknown operator '{self.op.data}'; use one of {' '.join(BINARY_OPS)}"
            )


def expr_attr(e: Expr) -> ExprAttr:
    if isinstance(e, Num):
        return NumAttr(IntAttr(int(e.value)))
    if isinstance(e, Sym):
        return SymAttr(StringAttr(e.name))
    return BinOpAttr(StringAttr(e.op), expr_attr(e.lhs), expr_attr(e.rhs))


@irdl_attr_definition
class AllocAttr(ParametrizedAttribute):
    """A device allocation D(o, delta): `#rpeg.alloc<(rack, node, gpu), (racks, nodes, gpus)>`."""

    name = "rpeg.alloc"
    origin_r: IntAttr
    origin_n: IntAttr
    origin_g: IntAttr
    extent_r: IntAttr
    extent_n: IntAttr
    extent_g: IntAttr

    @staticmethod
    def from_alloc(a: Alloc) -> AllocAttr:
        return AllocAttr(*(IntAttr(int(v)) for v in (*a.origin, *a.extent)))

    def to_alloc(self) -> Alloc:
        v = tuple(p.data for p in self.parameters)
        return Alloc(v[:3], v[3:])

    def print_parameters(self, printer: Printer) -> None:
        v = tuple(p.data for p in self.parameters)
        with printer.in_angle_brackets():
            _print_ints(printer, v[:3])
            printer.print_string(", ")
            _print_ints(printer, v[3:])

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[IntAttr]:
        with parser.in_angle_brackets():
            origin = _parse_ints(parser)
            parser.parse_punctuation(",")
            extent = _parse_ints(parser)
        if len(origin) != 3 or len(extent) != 3:
            parser.raise_error("#rpeg.alloc expects (rack, node, gpu) origin and extent triples")
        return [IntAttr(v) for v in (*origin, *extent)]


@irdl_attr_definition
class StrategyAttr(ParametrizedAttribute):
    """A parallel strategy: `#rpeg.strategy<dp = 16, pp = 1, tp = 2, mb = 1>`."""

    name = "rpeg.strategy"
    KEYS: ClassVar[tuple[str, ...]] = ("dp", "pp", "tp", "mb")
    dp: IntAttr
    pp: IntAttr
    tp: IntAttr
    mb: IntAttr

    @staticmethod
    def from_strategy(s: Strategy) -> StrategyAttr:
        return StrategyAttr(IntAttr(int(s.dp)), IntAttr(int(s.pp)), IntAttr(int(s.tp)), IntAttr(int(s.mb)))

    def to_strategy(self) -> Strategy:
        return Strategy(self.dp.data, self.pp.data, self.tp.data, self.mb.data)

    def print_parameters(self, printer: Printer) -> None:
        _print_keyed_ints(printer, self.KEYS, tuple(p.data for p in self.parameters))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[IntAttr]:
        return _parse_keyed_ints(parser, cls.KEYS)


@irdl_attr_definition
class TrainAttr(ParametrizedAttribute):
    """The training fields a workload or a training placement states (`training.TrainSpec`), only those stated:
    `#rpeg.train<zero = 1, recompute = "full">`. An unstated field is stored as "" (-1 for zero)."""

    name = "rpeg.train"
    precision: StringAttr
    zero: IntAttr
    recompute: StringAttr
    schedule: StringAttr

    @staticmethod
    def from_spec(t: TrainSpec) -> TrainAttr:
        return TrainAttr(StringAttr(t.precision or ""), IntAttr(-1 if t.zero is None else int(t.zero)),
                         StringAttr(t.recompute or ""), StringAttr(t.schedule or ""))

    def to_spec(self) -> TrainSpec:
        return TrainSpec(**{k: v for k, v in self._values().items() if v not in ("", -1)})

    def _values(self) -> dict[str, object]:
        return dict(zip(TRAIN_FIELDS, (p.data for p in self.parameters)))

    def verify(self) -> None:
        for k, v in self._values().items():
            if v not in ("", -1) and v not in TRAIN_CHOICES[k]:
                raise VerifyException(f"#rpeg.train: {k} = {v!r} is not one of "
                                      f"{', '.join(str(c) for c in TRAIN_CHOICES[k])}")

    def print_parameters(self, printer: Printer) -> None:
        shown = [f"{k} = {v}" if k == "zero" else f'{k} = "{v}"' for k, v in self._values().items()
                 if v not in ("", -1)]
        printer.print_string("<" + ", ".join(shown) + ">")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        values: dict[str, object] = {}

        def entry() -> None:
            key = parser.parse_identifier(" (a training field)")
            if key not in TRAIN_FIELDS or key in values:
                parser.raise_error(f"#rpeg.train: unexpected or repeated field '{key}'; fields: {', '.join(TRAIN_FIELDS)}")
            parser.parse_punctuation("=")
            values[key] = parser.parse_integer(allow_boolean=False) if key == "zero" else parse_text(parser)

        parser.parse_comma_separated_list(parser.Delimiter.ANGLE, entry)
        return [StringAttr(str(values.get("precision", ""))), IntAttr(int(values.get("zero", -1))),
                StringAttr(str(values.get("recompute", ""))), StringAttr(str(values.get("schedule", "")))]


@irdl_attr_definition
class ArchAttr(ParametrizedAttribute):
    """A model architecture: `#rpeg.arch<layers = 32, hidden = 4096, ..., kv_heads = 32, gated = 1, qkv_bias = 0,
    tied = 0, norms = 1, qk_norm = 0, post_norms = 0, head_dim = 0>` (the flags of program.Arch as 1 or 0; head_dim its head_size,
    0 for hidden / heads)."""

    name = "rpeg.arch"
    KEYS: ClassVar[tuple[str, ...]] = ARCH_SIZES + ARCH_FLAGS + (HEAD_DIM,)
    layers: IntAttr
    hidden: IntAttr
    ffn: IntAttr
    vocab: IntAttr
    heads: IntAttr
    kv_heads: IntAttr
    gated: IntAttr
    qkv_bias: IntAttr
    tied: IntAttr
    norms: IntAttr
    qk_norm: IntAttr
    post_norms: IntAttr
    head_dim: IntAttr

    @staticmethod
    def from_arch(a: Arch) -> ArchAttr:
        return ArchAttr(*(IntAttr(int(getattr(a, k))) for k in ARCH_SIZES + ARCH_FLAGS), IntAttr(a.head_size))

    def to_arch(self) -> Arch:
        values = dict(zip(self.KEYS, (p.data for p in self.parameters)))
        return Arch(**{k: values[k] for k in ARCH_SIZES}, **{k: bool(values[k]) for k in ARCH_FLAGS},
                    head_size=values[HEAD_DIM])

    def print_parameters(self, printer: Printer) -> None:
        _print_keyed_ints(printer, self.KEYS, tuple(p.data for p in self.parameters))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[IntAttr]:
        return _parse_keyed_ints(parser, cls.KEYS)


@irdl_attr_definition
class ModelIntAttr(ParametrizedAttribute):
    """An integer per model: a staleness bound tau(m) or a parameter version, `#rpeg.model_int<@actor = 1>`."""

    name = "rpeg.model_int"
    model: SymbolRefAttr
    value: IntAttr

    @staticmethod
    def from_pair(pair: tuple[str, int]) -> ModelIntAttr:
        return ModelIntAttr(SymbolRefAttr(pair[0]), IntAttr(int(pair[1])))

    def to_pair(self) -> tuple[str, int]:
        return (self.model.string_value(), self.value.data)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_attribute(self.model)
            printer.print_string(f" = {self.value.data}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[SymbolRefAttr, IntAttr]:
        with parser.in_angle_brackets():
            model = SymbolRefAttr(parser.parse_symbol_name())
            parser.parse_punctuation("=")
            value = parser.parse_integer(allow_boolean=False)
        return model, IntAttr(value)


@irdl_attr_definition
class QuantileAttr(ParametrizedAttribute):
    """One point (f, tokens) of the response-length quantiles (Def. A.9), with its own source position."""

    name = "rpeg.quantile"
    f: FloatAttr
    tokens: ExprAttr
    loc: LocationAttr
