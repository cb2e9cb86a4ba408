"""Text -> Program: the `.rpeg` reader (grammar in rpeg.lark, docs/architecture.md, IR).

Builds the dataclasses of rpegc/core/ir/program.py (App. A-A..A-D: workload, models, the cyclic graph G°,
cluster, plan) and rpegc/core/ir/exec_graph.py (App. A-F..A-H: the unrolled / lowered / scheduled graph),
stamping a `Loc` on every located object. Everything that goes wrong with the input text is an
`RpegError` at the offending token; independent problems (one per statement, unresolved references)
are collected and raised together as `RpegErrors`. Well-formedness (Def. A.2) and plan legality
(P1-P8) are checked elsewhere (rpegc/core/check/wellformed.py, plan_rules.py).
"""

from __future__ import annotations

import bisect
import difflib
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Optional, Union

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from rpegc.core.ir import presets
from rpegc.core.ir.hf_config import hf_arch
from rpegc.core.ir.errors import Loc, RpegError, RpegErrors
from rpegc.core.ir.gc_pause import without_gc
from rpegc.core.ir.exec_graph import (DataRef, ExecEdge, ExecFusion, ExecGraph, ExecNode, MemoryReport, Microtask,
                                      ScheduleReport, microtask_of)
from rpegc.core.ir.expr import SYMBOLS, BinOp, Expr, Num, Sym
from rpegc.core.ir.algorithms import algorithm_family, algorithm_names
from rpegc.core.ir.program import (ARCH_FLAGS, ARCH_SIZES, HEAD_DIM, DTYPE_BYTES, ELEMENT_KINDS, MODEL_KINDS, ROLES,
                                   VERIFY, Arch, Container, Edge, Fuse, Graph, Model, Placement, Plan, Pool, Program,
                                   Quantile, Verifier, Vertex, Workload)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.ir.training import CHOICES as TRAIN_CHOICES, FIELDS as TRAIN_FIELDS, TrainSpec

EDGE_KEYWORDS = {"exec.data": "data", "exec.publish": "pub", "exec.order": "order", "exec.dep": "dep"}
NODE_KEYWORDS = {"exec.op": "op", "exec.comm": "comm", "exec.reshard": "reshard"}
MEMORY_KEYS = ("m_eff", "r_peak", "feasible")
DEVICE_KEYS = ("peak", "persistent", "transient")
SCHEDULE_KEYS = ("makespan", "score", "score_pen", "util", "p_eff")
ANNOTATION_KEYS = ("time", "start", "finish")

# Human words for the named terminals of rpeg.lark (syntax error messages).
_TERMINAL_WORDS = {
    "SYMBOL": "an @symbol",
    "CONTAINER": "a %container",
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a decimal number",
    "STRING": 'a quoted "string"',
    "$END": "end of input",
}
_MAX_EXPECTED = 12
MAX_EXPR_DEPTH = 200
# Sizes (batch, lengths, cluster shape, architecture, parallel degrees, allocations, steps) above this
# describe no real system; bounding them keeps the checks that enumerate divisors instant.
MAX_SIZE = 2**40
MAX_OVERSAMPLE = 64  # dynamic sampling's draws per step, in units of B (DAPO's recipes draw about 3)
MAX_INT64 = 2**63 - 1  # the module's integers are MLIR's i64


@functools.cache
def _lark() -> Lark:
    return Lark.open(
        "rpeg.lark",
        rel_to=__file__,
        parser="lalr",
        cache=True,
        propagate_positions=True,
        maybe_placeholders=True,
        start=["start", "expr_only"],
    )


@without_gc
def parse(text: str, file: str = "<input>") -> Program:
    """Parse one `.rpeg` module. Raises RpegError (or RpegErrors) for any bad input, never anything else."""
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark (editors on Windows write one)
    try:
        tree = _lark().parse(text, start="start")
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    # Any other LarkError is a bug in the grammar or the parser, not bad input: it is not caught here.
    return _Builder(file).program(tree)


def parse_expr(text: str, file: str = "<expr>") -> Expr:
    """Parse one size expression (e.g. "B*R" or "(Lp + Lr)/2") with the module grammar's own rule."""
    try:
        tree = _lark().parse(text, start="expr_only")
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    builder = _Builder(file)
    try:
        return builder.size_expr(tree.children[0])
    except _StatementError:
        raise builder.errors[0] from None


# ---------------------------------------------------------------------------------------------------
# Syntax errors


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        term = _lark().get_terminal(name)
    except KeyError:
        return name.lower()
    if isinstance(term.pattern, PatternStr):
        return f"'{term.pattern.value}'"
    return name.lower()


def _expected_words(names) -> list[str]:
    words = sorted({_describe_terminal(n) for n in names})
    # Keywords in quotes first, then the kinds of token ("a name", ...), both alphabetical.
    return sorted(words, key=lambda w: (not w.startswith("'"), w))


def _join_expected(words: list[str]) -> str:
    if not words:
        return "nothing more"
    if len(words) > _MAX_EXPECTED:
        words = words[:_MAX_EXPECTED] + ["..."]
    if len(words) == 1:
        return words[0]
    return "one of " + ", ".join(words)


def _did_you_mean(found: str, words: list[str]) -> str:
    keywords = [w.strip("'") for w in words if w.startswith("'") and len(w) > 3]
    close = difflib.get_close_matches(found, keywords, n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def _found_text(text: str, pos: int) -> str:
    """The word starting at `pos`, for messages: up to the next space or punctuation, at most 24 chars."""
    end = pos
    while end < len(text) and end - pos < 24 and not text[end].isspace() and text[end] not in "{}()[],=":
        end += 1
    word = text[pos:end] if end > pos else text[pos : pos + 1]
    return word if word.isprintable() else repr(word)[1:-1]


def _acceptable(err: UnexpectedInput, fallback) -> set[str]:
    """The terminals that would really continue the parse here. The LALR table's lookahead set is wider
    (states are shared between contexts), so ask lark's interactive parser and fall back to the table."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            accepted = interactive.accepts()
        except Exception:  # lark internals; the table's set is still a correct, if wider, answer
            accepted = None
        if accepted:
            return set(accepted)
    return set(fallback or ())


def _glued_number(tok: Token, text: str) -> Optional[tuple[str, int]]:
    """`1.5` or `2e9` where only an integer fits lexes as INT `1` then `.5` / `e9`; return the whole
    number and its column so the message can name it."""
    start = tok.start_pos
    if tok.type not in ("FLOAT", "NAME") or start is None or start == 0 or not text[start - 1].isdigit():
        return None
    begin = start
    while begin > 0 and text[begin - 1].isdigit():
        begin -= 1
    return text[begin : tok.end_pos], (tok.column or 1) - (start - begin)


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> RpegError:
    if isinstance(err, UnexpectedToken):
        tok = err.token
        words = _expected_words(_acceptable(err, err.expected))
        if tok.type == "$END":
            line = getattr(tok, "end_line", None) or max(1, text.count("\n") + 1)
            col = getattr(tok, "end_column", None) or 1
            return RpegError(
                Loc(file, line, col), f"unexpected end of input; expected {_join_expected(words)}"
            )
        glued = _glued_number(tok, text)
        if glued is not None:
            number, col = glued
            return RpegError(Loc(file, tok.line or 1, col), f"'{number}' is not an integer; write a whole number here")
        found = str(tok.value)
        what = _TERMINAL_WORDS.get(tok.type)
        shown = f"{what[what.index(' ') + 1:]} '{found}'" if what else f"'{found}'"
        msg = f"unexpected {shown}; expected {_join_expected(words)}{_did_you_mean(found, words)}"
        return RpegError(Loc(file, tok.line or 1, tok.column or 1), msg)
    if isinstance(err, UnexpectedCharacters):
        words = _expected_words(_acceptable(err, err.allowed))
        found = _found_text(text, err.pos_in_stream)
        msg = f"unexpected '{found}'; expected {_join_expected(words)}{_did_you_mean(found, words)}"
        return RpegError(Loc(file, err.line or 1, err.column or 1), msg)
    return RpegError(Loc(file, getattr(err, "line", 1) or 1, getattr(err, "column", 1) or 1), f"syntax error: {err}")


# ---------------------------------------------------------------------------------------------------
# Building the Program


class _StatementError(Exception):
    """Stops building one statement; the error is already recorded."""


@dataclass
class _Attr:
    key: str
    loc: Loc  # of the key: unknown and repeated keys point here
    kind: str  # "number" (INT/FLOAT/NAME, maybe negated), "string", "flag"
    token: Optional[Token] = None
    negative: bool = False
    value_loc: Optional[Loc] = None  # of the value: bad values point here

    @property
    def at(self) -> Loc:
        return self.value_loc or self.loc


@dataclass
class _GraphParts:
    name: str
    loc: Loc
    containers: list[Container] = field(default_factory=list)
    inputs: list[tuple[str, Loc]] = field(default_factory=list)
    outputs: list[tuple[str, Loc]] = field(default_factory=list)
    vertices: list[Vertex] = field(default_factory=list)
    data_edges: list[Edge] = field(default_factory=list)
    pub_edges: list[Edge] = field(default_factory=list)
    staleness: Optional[tuple[tuple[tuple[str, int], ...], Loc]] = None
    quantiles: Optional[tuple[tuple[Quantile, ...], Loc]] = None
    algorithm: Optional[tuple[str, Loc]] = None
    # Every container / vertex / model reference with where it was written, resolved at the end.
    container_refs: list[tuple[str, Loc]] = field(default_factory=list)
    vertex_refs: list[tuple[str, Loc]] = field(default_factory=list)
    model_refs: list[tuple[str, Loc]] = field(default_factory=list)
    verifier_refs: list[tuple[str, Loc]] = field(default_factory=list)  # what verify vertices run


Ref = tuple[str, Loc]


@dataclass
class _ExecParts:
    steps: int
    nodes: list[ExecNode] = field(default_factory=list)
    edges: list[ExecEdge] = field(default_factory=list)
    node_locs: dict[str, Loc] = field(default_factory=dict)
    refs: dict[str, list[Ref]] = field(
        default_factory=lambda: {"node": [], "model": [], "vertex": [], "container": []}
    )
    memory: Optional[tuple[tuple[float, float, bool], Loc]] = None
    devices: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: {k: [] for k in DEVICE_KEYS})
    device_seen: dict[tuple[int, str], Loc] = field(default_factory=dict)
    first_device: Optional[Loc] = None
    schedule: Optional[tuple[ScheduleReport, Loc]] = None
    fusions: list[ExecFusion] = field(default_factory=list)
    fusion_locs: dict[str, Loc] = field(default_factory=dict)


class _Builder:
    def __init__(self, file: str):
        self.file = file
        self.errors: list[RpegError] = []
        # Names of every definition statement, built or not: a reference to a definition that had its
        # own error is not reported again as unknown.
        self.declared: dict[str, set[str]] = {"model": set(), "verifier": set(), "container": set(), "vertex": set(),
                                              "exec node": set()}
        self.saw_workload = False

    # -- locations and errors -------------------------------------------------------------------

    def loc(self, node: Union[Tree, Token]) -> Loc:
        if isinstance(node, Token):
            return Loc(self.file, node.line or 1, node.column or 1)
        meta = node.meta
        if getattr(meta, "empty", True):
            return Loc(self.file, 1, 1)
        return Loc(self.file, meta.line, meta.column)

    def fail(self, loc: Loc, message: str):
        self.errors.append(RpegError(loc, message))
        raise _StatementError()

    def report(self, loc: Loc, message: str) -> None:
        self.errors.append(RpegError(loc, message))

    # -- the module -----------------------------------------------------------------------------

    def program(self, tree: Tree) -> Program:
        workloads: list[Workload] = []
        models: list[Model] = []
        model_locs: dict[str, Loc] = {}
        verifiers: list[Verifier] = []
        graphs: list[_GraphParts] = []
        clusters: list[Cluster] = []
        plans: list[tuple[Plan, Ref, Ref, list[Ref]]] = []
        execs: list[tuple[ExecGraph, dict]] = []
        for item in tree.children:
            try:
                if item.data == "workload":
                    self.once(workloads, item, "rpeg.workload")
                    self.saw_workload = True
                    workloads.append(self.workload(item))
                elif item.data == "model":
                    self.declare("model", item.children[0])
                    model = self.model(item)
                    if model.name in model_locs:
                        self.fail(
                            model.loc,
                            f"model @{model.name} is defined twice (first at {model_locs[model.name]}); "
                            "rename one of them",
                        )
                    model_locs[model.name] = model.loc
                    models.append(model)
                elif item.data == "verifier":
                    self.declare("verifier", item.children[0])
                    verifier = self.verifier(item)
                    if verifier.name in model_locs:
                        self.fail(verifier.loc, f"@{verifier.name} is defined twice (first at "
                                                f"{model_locs[verifier.name]}); rename one of them")
                    model_locs[verifier.name] = verifier.loc
                    verifiers.append(verifier)
                elif item.data == "graph":
                    self.once(graphs, item, "rpeg.graph")
                    graphs.append(self.graph(item))
                elif item.data == "cluster":
                    self.once(clusters, item, "rpeg.cluster")
                    clusters.append(self.cluster(item))
                elif item.data == "plan":
                    self.once(plans, item, "rpeg.plan")
                    plans.append(self.plan(item))
                elif item.data == "exec_graph":
                    self.once(execs, item, "exec.graph")
                    execs.append(self.exec_graph(item))
            except _StatementError:
                continue

        model_names = {m.name for m in models}
        verifier_names = {v.name for v in verifiers}
        graph = self.finish_graph(graphs[0], model_names, verifier_names) if graphs else None
        cluster = clusters[0] if clusters else None
        plan = self.finish_plan(plans[0], graph, cluster) if plans else None
        exec_graph = self.finish_exec(execs[0], model_names | verifier_names, graph) if execs else None
        if not self.saw_workload:
            # At the first statement, not at 1:1: a chunk of --split-input-file starts further down.
            first = self.loc(tree.children[0]) if tree.children else Loc(self.file, 1, 1)
            self.report(
                first,
                "the module has no rpeg.workload; add one, e.g. "
                "`rpeg.workload {B = 512, R = 1, Lp = 128, Lr = 384, dtype = bf16}`",
            )
        if self.errors:
            errors = sorted(self.errors, key=lambda e: (e.loc.line, e.loc.col))
            raise errors[0] if len(errors) == 1 else RpegErrors(errors)
        return Program(
            workload=workloads[0],
            models=tuple(models),
            graph=graph,
            cluster=cluster,
            plan=plan,
            exec=exec_graph,
            file=self.file,
            verifiers=tuple(verifiers),
        )

    def declare(self, what: str, tok: Token) -> None:
        body = str(tok)[1:]
        if not body.startswith('"'):
            self.declared[what].add(body)
        else:
            try:
                self.declared[what].add(json.loads(body, strict=False))
            except ValueError:
                pass  # reported where the definition is built

    def once(self, seen: list, item: Tree, what: str) -> None:
        if seen:
            first = seen[0]
            first_loc = first.loc if hasattr(first, "loc") else first[0].loc
            self.fail(self.loc(item), f"a module holds at most one {what} (the first is at {first_loc}); remove this one")

    # -- names ----------------------------------------------------------------------------------

    def name(self, tok: Token) -> str:
        """The name of an @symbol or %container token, unquoting @"..." forms."""
        body = str(tok)[1:]
        if body.startswith('"'):
            try:
                return json.loads(body, strict=False)
            except ValueError:
                self.fail(self.loc(tok), f"bad escape in quoted name {tok}; use \\\" \\\\ \\n or \\uXXXX")
        return body

    def string(self, tok: Token) -> str:
        try:
            return json.loads(str(tok), strict=False)
        except ValueError:
            self.fail(self.loc(tok), f"bad escape in string {tok}; use \\\" \\\\ \\n or \\uXXXX")

    def refs(self, tree: Optional[Tree]) -> list[Ref]:
        if tree is None:
            return []
        return [(self.name(t), self.loc(t)) for t in tree.children]

    # -- numbers --------------------------------------------------------------------------------

    def int_of(self, tree: Tree, what: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
        """A signed_int / neg_int tree; `minimum`/`maximum` give a located error naming `what`."""
        tok = tree.children[0]
        value = -self.int_token(tok) if tree.data == "neg_int" else self.int_token(tok)
        self.check_min(value, minimum, what, self.loc(tree))
        self.check_max(value, maximum, what, self.loc(tree))
        return value

    def int_token(self, tok: Token) -> int:
        try:
            value = int(tok)
        except ValueError:  # Python refuses to convert integers of more than ~4300 digits
            self.fail(self.loc(tok), f"the integer {str(tok)[:20]}... has {len(tok)} digits, too many; use a smaller number")
        if value > MAX_INT64:
            self.fail(self.loc(tok), f"the integer {value} does not fit in 64 bits (at most 2^63 - 1 = {MAX_INT64})")
        return value

    def check_max(self, value: int, maximum: Optional[int], what: str, loc: Loc) -> None:
        if maximum is not None and value > maximum:
            self.fail(loc, f"{what} = {value} is larger than any real system (at most {maximum}); use a smaller value")

    def check_min(self, value: int, minimum: Optional[int], what: str, loc: Loc) -> None:
        if minimum is None or value >= minimum:
            return
        if minimum == 1:
            self.fail(loc, f"{what} must be a positive integer, found {value}")
        if minimum == 0:
            self.fail(loc, f"{what} must not be negative, found {value}")
        self.fail(loc, f"{what} must be at least {minimum}, found {value}")

    def number_float(self, tree: Tree, what: str) -> float:
        tok = tree.children[0]
        text = str(tok)
        if tok.type == "NAME" and text not in ("inf", "nan"):
            self.fail(self.loc(tree), f"{what} must be a number, found '{text}'")
        value = float(text)  # decimal text of any length; too large becomes inf, as in Python
        return -value if tree.data == "neg_number" else value

    def number_text(self, tree: Tree) -> str:
        return ("-" if tree.data == "neg_number" else "") + str(tree.children[0])

    # -- attribute dictionaries -----------------------------------------------------------------

    def attrs(self, tree: Optional[Tree], what: str, allowed: tuple[str, ...]) -> dict[str, _Attr]:
        """`{key = value, flag}` as a dict; unknown or repeated keys are errors naming `what`."""
        out: dict[str, _Attr] = {}
        if tree is None:
            return out
        for attr in tree.children:
            if attr is None:
                continue
            key_tok, value = attr.children
            key = str(key_tok)
            loc = self.loc(key_tok)
            if key not in allowed:
                hint = _close(key, allowed)
                self.fail(loc, f"unknown attribute '{key}' in {what}{hint}; expected one of {', '.join(allowed)}")
            if key in out:
                self.fail(loc, f"attribute '{key}' is given twice in {what}; keep one")
            if value is None:
                out[key] = _Attr(key, loc, "flag")
            elif isinstance(value, Token):
                out[key] = _Attr(key, loc, "string", value, value_loc=self.loc(value))
            else:
                out[key] = _Attr(key, loc, "number", value.children[0], value.data == "neg_number", self.loc(value))
        return out

    def need(self, attrs: dict[str, _Attr], key: str, what: str, loc: Loc, example: str) -> _Attr:
        if key not in attrs:
            self.fail(loc, f"{what} needs '{key}', e.g. `{example}`")
        return attrs[key]

    def attr_int(self, a: _Attr, what: str, minimum: Optional[int] = 1, maximum: Optional[int] = None) -> int:
        if a.kind != "number" or a.token.type != "INT":
            self.fail(a.at, f"'{a.key}' of {what} must be an integer, found {self.attr_text(a)}")
        value = -self.int_token(a.token) if a.negative else self.int_token(a.token)
        self.check_min(value, minimum, f"'{a.key}' of {what}", a.at)
        self.check_max(value, maximum, f"'{a.key}' of {what}", a.at)
        return value

    def attr_float(self, a: _Attr, what: str) -> float:
        text = str(a.token) if a.token is not None else ""
        if a.kind != "number" or (a.token.type == "NAME" and text not in ("inf", "nan")):
            self.fail(a.at, f"'{a.key}' of {what} must be a number, found {self.attr_text(a)}")
        value = float(text)
        return -value if a.negative else value

    def attr_bool(self, a: _Attr, what: str) -> bool:
        if a.kind == "flag":
            return True
        if a.kind == "number" and not a.negative and str(a.token) in ("true", "false"):
            return str(a.token) == "true"
        self.fail(a.at, f"'{a.key}' of {what} must be true or false, found {self.attr_text(a)}")

    def attr_word(self, a: _Attr, what: str, choices: tuple[str, ...]) -> str:
        """A bare-name value out of `choices` (kind, dtype); a quoted string is accepted too."""
        if a.kind == "string":
            value = self.string(a.token)
        elif a.kind == "number" and a.token.type in ("NAME", "WORD_1F1B") and not a.negative:
            value = str(a.token)
        else:
            self.fail(a.at, f"'{a.key}' of {what} must be one of {', '.join(choices)}, found {self.attr_text(a)}")
        if value not in choices:
            self.fail(a.at, f"unknown {a.key} '{value}' in {what}{_close(value, choices)}; expected one of {', '.join(choices)}")
        return value

    def attr_text_value(self, a: _Attr, what: str) -> str:
        """A quoted string (a bare name is accepted too), e.g. arch or hardware."""
        if a.kind == "string":
            return self.string(a.token)
        if a.kind == "number" and a.token.type == "NAME" and not a.negative:
            return str(a.token)
        self.fail(a.at, f"'{a.key}' of {what} must be a quoted string, found {self.attr_text(a)}")

    def attr_text(self, a: _Attr) -> str:
        if a.kind == "flag":
            return "no value"
        return ("-" if a.negative else "") + str(a.token)

    # -- top-level statements -------------------------------------------------------------------

    def workload(self, item: Tree) -> Workload:
        loc = self.loc(item)
        what = "rpeg.workload"
        attrs = self.attrs(item.children[0], what, ("B", "R", "Lp", "Lr", "dtype", "oversample") + TRAIN_FIELDS)
        example = "rpeg.workload {B = 512, R = 1, Lp = 128, Lr = 384, dtype = bf16}"
        values = {k: self.attr_int(self.need(attrs, k, what, loc, example), what, maximum=MAX_SIZE) for k in SYMBOLS}
        dtype = self.attr_word(attrs["dtype"], what, tuple(DTYPE_BYTES)) if "dtype" in attrs else "bf16"
        train = {}
        for key in TRAIN_FIELDS:
            if key in attrs:
                a = attrs[key]
                train[key] = (self.train_choice(key, self.attr_int(a, what, minimum=None), a.at, what) if key == "zero"
                              else self.attr_word(a, what, TRAIN_CHOICES[key]))
        oversample = self.attr_int(attrs["oversample"], what, maximum=MAX_OVERSAMPLE) if "oversample" in attrs else 1
        return Workload(values["B"], values["R"], values["Lp"], values["Lr"], dtype, loc=loc, train=TrainSpec(**train),
                        oversample=oversample)

    def model(self, item: Tree) -> Model:
        sym, attr_tree = item.children
        name = self.name(sym)
        loc = self.loc(item)
        what = f"model @{name}"
        attrs = self.attrs(attr_tree, what, ("arch", "hf", "kind", "trainable") + ARCH_SIZES + (HEAD_DIM,) + ARCH_FLAGS)
        kind_attr = self.need(attrs, "kind", what, loc, f"rpeg.model @{name} {{arch = \"llama2-7b\", kind = policy}}")
        kind = self.attr_word(kind_attr, what, MODEL_KINDS)
        trainable = self.attr_bool(attrs["trainable"], what) if "trainable" in attrs else False
        fields: dict = {k: self.attr_int(attrs[k], what, maximum=MAX_SIZE) for k in ARCH_SIZES if k in attrs}
        if HEAD_DIM in attrs:  # Arch.head_size: a head dimension other than hidden / heads
            fields["head_size"] = self.attr_int(attrs[HEAD_DIM], what, maximum=MAX_SIZE)
        for flag in ARCH_FLAGS:  # what the network has beyond [PF]'s count (program.Arch); absent: the spec's form
            if flag in attrs:
                fields[flag] = self.attr_bool(attrs[flag], what)
        preset = None
        if "hf" in attrs:
            directory = self.attr_text_value(attrs["hf"], what)
            given = [k for k in ("arch",) + ARCH_SIZES + (HEAD_DIM,) + ARCH_FLAGS if k in attrs]
            if given:
                self.fail(attrs[given[0]].at, f"{what} reads its architecture from hf = \"{directory}\"; "
                                              f"drop {', '.join(given)}")
            try:
                arch = hf_arch(directory, attrs["hf"].at)
            except RpegError as e:
                self.fail(attrs["hf"].at, e.message)
            return Model(name, kind, trainable, arch, hf=directory, loc=loc)
        if "arch" in attrs:
            preset = self.attr_text_value(attrs["arch"], what)
            base = presets.lookup(preset)
            if base is None:
                self.fail(
                    attrs["arch"].at,
                    f"unknown arch preset '{preset}'{_close(preset, presets.names())}; "
                    f"known presets: {', '.join(presets.names())} (or give layers, hidden, ffn, vocab, heads)",
                )
            values = {k: getattr(base, k) for k in ARCH_SIZES + ARCH_FLAGS + ("head_size",)}
            values.update(fields)
        else:
            missing = [k for k in ARCH_SIZES[:-1] if k not in fields]
            if missing:
                self.fail(
                    loc,
                    f"{what} needs {', '.join(missing)} (kv_heads defaults to heads), or a preset "
                    f"arch = \"...\" out of {', '.join(presets.names())}",
                )
            values = dict(fields)
            values.setdefault("kv_heads", values["heads"])
        return Model(name, kind, trainable, Arch(**values), preset=preset, loc=loc)

    def verifier(self, item: Tree) -> Verifier:
        sym, attr_tree = item.children
        name = self.name(sym)
        loc = self.loc(item)
        what = f"verifier @{name}"
        attrs = self.attrs(attr_tree, what, ("fn", "per_response"))
        fn_attr = self.need(attrs, "fn", what, loc, f'rpeg.verifier @{name} {{fn = "math"}}')
        fn = self.attr_text_value(fn_attr, what)
        per_response = None
        if "per_response" in attrs:
            per_response = self.attr_float(attrs["per_response"], what)
            if not (math.isfinite(per_response) and per_response > 0):
                self.fail(attrs["per_response"].at, f"per_response of {what} is the seconds one call takes, a positive "
                                                    f"number; found {self.attr_text(attrs['per_response'])}")
        return Verifier(name, fn, per_response, loc=loc)

    def cluster(self, item: Tree) -> Cluster:
        sym, attr_tree = item.children
        name = self.name(sym)
        loc = self.loc(item)
        what = f"cluster @{name}"
        attrs = self.attrs(attr_tree, what, ("racks", "nodes", "gpus", "hardware"))
        example = f'rpeg.cluster @{name} {{racks = 1, nodes = 2, gpus = 4, hardware = "gh200"}}'
        sizes = {
            k: self.attr_int(self.need(attrs, k, what, loc, example), what, maximum=MAX_SIZE)
            for k in ("racks", "nodes", "gpus")
        }
        hardware = self.attr_text_value(self.need(attrs, "hardware", what, loc, example), what)
        cluster = Cluster(name, sizes["racks"], sizes["nodes"], sizes["gpus"], hardware, loc=loc)
        problem = cluster.size_problem()
        if problem:
            self.report(loc, problem)
        return cluster

    # -- the graph ------------------------------------------------------------------------------

    def graph(self, item: Tree) -> _GraphParts:
        sym, *body = item.children
        parts = _GraphParts(self.name(sym), self.loc(item))
        defined: dict[str, dict[str, Loc]] = {"container": {}, "vertex": {}}
        for stmt in body:
            try:
                self.graph_statement(stmt, parts, defined)
            except _StatementError:
                continue
        return parts

    def define(self, defined: dict[str, dict[str, Loc]], what: str, sigil: str, name: str, loc: Loc) -> None:
        table = defined[what]
        if name in table:
            self.fail(loc, f"{what} {sigil}{name} is defined twice (first at {table[name]}); rename one of them")
        table[name] = loc

    def graph_statement(self, stmt: Tree, parts: _GraphParts, defined: dict) -> None:
        loc = self.loc(stmt)
        kind = stmt.data
        if kind in ("container", "weights", "vertex"):
            self.declare("vertex" if kind == "vertex" else "container", stmt.children[0])
        if kind == "container":
            ctr_tok, elem_tok, dims_tree, attr_tree = stmt.children
            name = self.name(ctr_tok)
            elem = str(elem_tok)
            if elem == "weights":
                self.fail(self.loc(elem_tok), f"write weights as `%{name} = rpeg.weights @model`")
            if elem not in ELEMENT_KINDS:
                self.fail(
                    self.loc(elem_tok),
                    f"unknown element kind '{elem}'{_close(elem, ELEMENT_KINDS)}; "
                    f"expected one of {', '.join(ELEMENT_KINDS)}",
                )
            dims = tuple(self.size_expr(e) for e in dims_tree.children if e is not None)
            bytes_per = self.container_bytes(attr_tree, name)
            self.define(defined, "container", "%", name, loc)
            parts.containers.append(Container(name, elem, dims, None, bytes_per, loc=loc))
        elif kind == "weights":
            ctr_tok, model_tok, attr_tree = stmt.children
            name = self.name(ctr_tok)
            model = self.name(model_tok)
            bytes_per = self.container_bytes(attr_tree, name)
            self.define(defined, "container", "%", name, loc)
            parts.model_refs.append((model, self.loc(model_tok)))
            parts.containers.append(Container(name, "weights", (), model, bytes_per, loc=loc))
        elif kind in ("input", "output"):
            refs = self.refs(stmt.children[0])
            parts.container_refs.extend(refs)
            (parts.inputs if kind == "input" else parts.outputs).extend(refs)
        elif kind == "vertex":
            v_tok, role_tok, model_tok, reads_tree, writes_tree = stmt.children
            name = self.name(v_tok)
            role = str(role_tok)
            if role not in ROLES:
                self.fail(
                    self.loc(role_tok),
                    f"unknown role '{role}'{_close(role, ROLES)} of vertex @{name}; expected one of {', '.join(ROLES)}",
                )
            model = self.name(model_tok)
            reads, writes = self.refs(reads_tree), self.refs(writes_tree)
            self.define(defined, "vertex", "@", name, loc)
            (parts.verifier_refs if role == VERIFY else parts.model_refs).append((model, self.loc(model_tok)))
            parts.container_refs.extend(reads + writes)
            parts.vertices.append(
                Vertex(name, role, model, tuple(n for n, _ in reads), tuple(n for n, _ in writes), loc=loc)
            )
        elif kind in ("data_edge", "pub_edge"):
            src_tok, dst_tok, ctr_tok = stmt.children
            src, dst, ctr = self.name(src_tok), self.name(dst_tok), self.name(ctr_tok)
            parts.vertex_refs += [(src, self.loc(src_tok)), (dst, self.loc(dst_tok))]
            parts.container_refs.append((ctr, self.loc(ctr_tok)))
            edges = parts.data_edges if kind == "data_edge" else parts.pub_edges
            edges.append(Edge(src, dst, ctr, loc=loc))
        elif kind == "staleness":
            if parts.staleness is not None:
                self.fail(loc, f"rpeg.staleness is given twice in graph @{parts.name} (first at {parts.staleness[1]}); merge them")
            entries, locs = self.sym_dict(stmt.children[0], "staleness budget", "rpeg.staleness")
            parts.model_refs.extend((m, l) for (m, _), l in zip(entries, locs))
            parts.staleness = (tuple(entries), loc)
        elif kind == "algorithm":
            if parts.algorithm is not None:
                self.fail(loc, f"rpeg.algorithm is given twice in graph @{parts.name} (first at {parts.algorithm[1]}); "
                          "keep one")
            name = str(stmt.children[0])
            if algorithm_family(name) is None:
                names = algorithm_names()
                self.fail(self.loc(stmt.children[0]), f"unknown algorithm '{name}'{_close(name, names)}; "
                          f"use one of {', '.join(names)} (or one a plugin of the entry-point group rpegc.rl "
                          "registers)")
            parts.algorithm = (name, loc)
        elif kind == "quantiles":
            if parts.quantiles is not None:
                self.fail(loc, f"rpeg.quantiles is given twice in graph @{parts.name} (first at {parts.quantiles[1]}); merge them")
            qs = []
            for q in stmt.children:
                if q is None:
                    continue
                f_tree, tokens_tree = q.children
                qs.append(Quantile(self.number_float(f_tree, "a quantile fraction"), self.size_expr(tokens_tree), loc=self.loc(q)))
            parts.quantiles = (tuple(qs), loc)

    def container_bytes(self, attr_tree: Optional[Tree], name: str) -> Optional[int]:
        what = f"container %{name}"
        attrs = self.attrs(attr_tree, what, ("bytes",))
        return self.attr_int(attrs["bytes"], what) if "bytes" in attrs else None

    def sym_dict(self, tree: Tree, value_what: str, what: str) -> tuple[list[tuple[str, int]], list[Loc]]:
        """`{@m = n, ...}` with non-negative values; a repeated key is an error."""
        entries: list[tuple[str, int]] = []
        locs: list[Loc] = []
        seen: set[str] = set()
        for entry in tree.children:
            if entry is None:
                continue
            sym_tok, value_tree = entry.children
            key = self.name(sym_tok)
            if key in seen:
                self.fail(self.loc(sym_tok), f"@{key} appears twice in {what}; keep one")
            seen.add(key)
            entries.append((key, self.int_of(value_tree, f"the {value_what} of @{key}", minimum=0)))
            locs.append(self.loc(sym_tok))
        return entries, locs

    def bindings(
        self, tree: Tree, what: str, refs: dict[str, list[Ref]]
    ) -> tuple[tuple[tuple[str, int], ...], tuple[DataRef, ...]]:
        """`{@m = version, %c, %c phase q, ...}`: the weights and the data a node reads or writes; a repeated
        entry is an error."""
        versions: list[tuple[str, int]] = []
        data: list[DataRef] = []
        seen: dict[object, Loc] = {}
        for entry in tree.children:
            if entry is None:
                continue
            tok, *values = entry.children
            name, loc = self.name(tok), self.loc(tok)
            keys: list[object] = []
            if entry.data == "sym_entry":
                keys.append(("@", name))
                versions.append((name, self.int_of(values[0], f"the version of @{name} in the {what}", minimum=0)))
                refs["model"].append((name, loc))
            else:
                phases = [self.int_of(v, f"the phase of %{name} in the {what}", minimum=1) for v in values if v is not None]
                if len(phases) == 2:
                    if phases[1] <= phases[0]:
                        self.fail(loc, f"`%{name} phases {phases[0]} to {phases[1]}` in the {what} is an empty or "
                                       "one-phase range; write `phases a to b` with a < b, or `phase a`")
                    phases = list(range(phases[0], phases[1] + 1))
                keys += [DataRef(name, q) for q in phases] or [DataRef(name)]
                data += keys  # type: ignore[arg-type]
                refs["container"].append((name, loc))
            for key in keys:
                if key in seen:
                    shown = (f"@{name}" if isinstance(key, tuple) else
                             f"%{name}" + (f" phase {key.phase}" if key.phase is not None else ""))  # type: ignore[attr-defined]
                    self.fail(loc, f"{shown} appears twice in the {what} (first at {seen[key]}); keep one")
                seen[key] = loc
        return tuple(versions), tuple(data)

    def size_expr(self, tree: Tree) -> Expr:
        return self.expr(tree, 0)

    def expr(self, tree: Tree, depth: int) -> Expr:
        # Expressions are recursive trees; a bound keeps printing and evaluating them within Python's stack.
        if depth > MAX_EXPR_DEPTH:
            self.fail(self.loc(tree), f"size expression nests more than {MAX_EXPR_DEPTH} operations deep; simplify it")
        kind = tree.data
        if kind == "num":
            return Num(self.int_token(tree.children[0]))
        if kind == "neg_num":
            return Num(-self.int_token(tree.children[0]))
        if kind == "sym":
            tok = tree.children[0]
            if str(tok) not in SYMBOLS:
                self.fail(
                    self.loc(tok),
                    f"unknown symbol '{tok}' in size expression{_close(str(tok), SYMBOLS)}; "
                    f"sizes are written over {', '.join(SYMBOLS)} and integers",
                )
            return Sym(str(tok))
        op = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[kind]
        lhs, rhs = tree.children
        return BinOp(op, self.expr(lhs, depth + 1), self.expr(rhs, depth + 1))

    def finish_graph(self, parts: _GraphParts, model_names: set[str], verifier_names: set[str]) -> Graph:
        containers = {c.name for c in parts.containers}
        vertices = {v.name for v in parts.vertices}
        self.resolve(parts.container_refs, containers, "container", "%", f"graph @{parts.name}", "rpeg.container")
        self.resolve(parts.vertex_refs, vertices, "vertex", "@", f"graph @{parts.name}", "rpeg.vertex")
        self.resolve(parts.model_refs, model_names, "model", "@", "the module", "rpeg.model")
        self.resolve(parts.verifier_refs, verifier_names, "verifier", "@", "the module", "rpeg.verifier")
        staleness, staleness_loc = parts.staleness if parts.staleness else ((), None)
        quantiles, quantiles_loc = parts.quantiles if parts.quantiles else ((), None)
        extra = {}
        if staleness_loc is not None:
            extra["staleness_loc"] = staleness_loc
        if quantiles_loc is not None:
            extra["quantiles_loc"] = quantiles_loc
        if parts.algorithm is not None:
            extra["algorithm"], extra["algorithm_loc"] = parts.algorithm
        return Graph(
            name=parts.name,
            containers=tuple(parts.containers),
            inputs=tuple(n for n, _ in parts.inputs),
            outputs=tuple(n for n, _ in parts.outputs),
            vertices=tuple(parts.vertices),
            data_edges=tuple(parts.data_edges),
            pub_edges=tuple(parts.pub_edges),
            staleness=staleness,
            quantiles=quantiles,
            loc=parts.loc,
            **extra,
        )

    def resolve(self, refs: list[Ref], known: set[str], what: str, sigil: str, scope: str, how: str) -> None:
        ordered: Optional[_SortedNames] = None  # sorted once, when the first unknown name needs a hint
        hints = 0
        for name, loc in refs:
            if name not in known and name not in self.declared.get(what, ()):
                if ordered is None:
                    ordered = _SortedNames(known)
                hint = _close(name, ordered, sigil) if hints < _MAX_HINTS else ""
                hints += 1
                self.report(
                    loc,
                    f"unknown {what} {sigil}{name}{hint}: {scope} defines no such {what}; "
                    f"define it with {how} or fix the name",
                )

    # -- the plan -------------------------------------------------------------------------------

    def plan(self, item: Tree) -> tuple[Plan, Ref, Ref, list[Ref]]:
        name_tok, graph_tok, cluster_tok, *body = item.children
        placements: list[Placement] = []
        pools: list[Pool] = []
        fusions: list[Fuse] = []
        vertex_refs: list[Ref] = []
        seen: dict[str, Loc] = {}
        for p in body:
            if p.data == "fuse":
                fusions.append(self.fuse(p, vertex_refs))
                continue
            try:
                if p.data == "pool":
                    v_tok, size_tree = p.children
                    vertex, loc = self.name(v_tok), self.loc(p)
                    size = self.int_of(size_tree, f"pool of @{vertex}", minimum=1, maximum=MAX_SIZE)
                    if vertex in seen:
                        self.fail(loc, f"vertex @{vertex} is placed twice (first at {seen[vertex]}); keep one placement")
                    seen[vertex] = loc
                    vertex_refs.append((vertex, self.loc(v_tok)))
                    pools.append(Pool(vertex, size, loc=loc))
                    continue
                v_tok, origin_tree, extent_tree, strat_tree = p.children
                vertex = self.name(v_tok)
                loc = self.loc(p)
                origin = self.triple(origin_tree, "origin", f"@{vertex}", minimum=0)
                extent = self.triple(extent_tree, "extent", f"@{vertex}", minimum=1)
                strategy = self.strategy(strat_tree, f"the plan of @{vertex}")
                if vertex in seen:
                    self.fail(loc, f"vertex @{vertex} is placed twice (first at {seen[vertex]}); keep one placement")
                seen[vertex] = loc
                vertex_refs.append((vertex, self.loc(v_tok)))
                placements.append(Placement(vertex, Alloc(origin, extent), strategy, loc=loc))
            except _StatementError:
                continue
        plan = Plan(self.name(name_tok), self.name(graph_tok), self.name(cluster_tok), tuple(placements),
                    loc=self.loc(item), fusions=tuple(fusions), pools=tuple(pools))
        return plan, (plan.graph, self.loc(graph_tok)), (plan.cluster, self.loc(cluster_tok)), vertex_refs

    def fuse(self, tree: Tree, vertex_refs: list[Ref]) -> Fuse:
        """`rpeg.fuse (@a, @b, ...)`: its vertices, each once (whether they may fuse is a plan rule)."""
        names: list[str] = []
        for tok in tree.children:
            name = self.name(tok)
            if name in names:
                self.report(self.loc(tok), f"rpeg.fuse names @{name} twice; name each vertex once")
            names.append(name)
            vertex_refs.append((name, self.loc(tok)))
        return Fuse(tuple(names), loc=self.loc(tree))

    def triple(self, tree: Tree, what: str, owner: str, minimum: int) -> tuple[int, int, int]:
        """`(rack, node, gpu)`; messages read e.g. "origin node of @gen must not be negative"."""
        a, b, c = (
            self.int_of(t, f"{what} {dim} of {owner}", minimum, MAX_SIZE)
            for t, dim in zip(tree.children, ("rack", "node", "gpu"))
        )
        return (a, b, c)

    def strategy(self, tree: Tree, what: str) -> Strategy:
        sizes = [t for t in tree.children if not (isinstance(t, Tree) and t.data == "train_field")]
        dp, pp, tp, mb = (
            self.int_of(t, f"{key} of {what}", minimum=1, maximum=MAX_SIZE)
            for t, key in zip(sizes, ("dp", "pp", "tp", "mb"))
        )
        fields = [t for t in tree.children if isinstance(t, Tree) and t.data == "train_field"]
        return Strategy(dp, pp, tp, mb, self.train_fields(fields, what) if fields else TrainSpec())

    def train_fields(self, trees: list[Tree], what: str) -> TrainSpec:
        """`zero = 1 recompute = full ...` after a strategy (training.TrainSpec), each key once."""
        values: dict[str, object] = {}
        given: dict[str, Loc] = {}
        for t in trees:
            key_tok, value = t.children
            key, loc = str(key_tok), self.loc(key_tok)
            if key in given:
                self.fail(loc, f"'{key}' is given twice in {what} (first at {given[key]}); keep one")
            given[key] = loc
            if key == "zero":
                if not isinstance(value, Tree):
                    self.fail(self.loc(value), f"'zero' of {what} must be a ZeRO stage 0, 1 or 2, found {value}")
                values[key] = self.train_choice(key, self.int_of(value, f"zero of {what}"), self.loc(value), what)
            else:
                text = (("-" if value.data == "neg_int" else "") + str(value.children[0]) if isinstance(value, Tree)
                        else str(value))
                values[key] = self.train_choice(key, text, self.loc(value), what)
        return TrainSpec(**values)

    def train_choice(self, key: str, value, loc: Loc, what: str):
        """`value` of training field `key` if it is one of its choices, else a located error."""
        choices = TRAIN_CHOICES[key]
        if value not in choices:
            words = [str(c) for c in choices]
            self.fail(loc, f"unknown {key} '{value}' in {what}{_close(str(value), words)}; expected one of "
                           f"{', '.join(words)}")
        return value

    def finish_plan(self, parts, graph: Optional[Graph], cluster: Optional[Cluster]) -> Plan:
        plan, (graph_name, graph_loc), (cluster_name, cluster_loc), vertex_refs = parts
        if graph is None:
            self.report(graph_loc, f"plan @{plan.name} is for graph @{graph_name}, but the module has no rpeg.graph; add it")
        elif graph.name != graph_name:
            self.report(graph_loc, f"unknown graph @{graph_name}: the module's graph is @{graph.name}; write `for @{graph.name}`")
        else:
            self.resolve(vertex_refs, {v.name for v in graph.vertices}, "vertex", "@", f"graph @{graph.name}", "rpeg.vertex")
        if cluster is None:
            self.report(cluster_loc, f"plan @{plan.name} runs on cluster @{cluster_name}, but the module has no rpeg.cluster; add it")
        elif cluster.name != cluster_name:
            self.report(cluster_loc, f"unknown cluster @{cluster_name}: the module's cluster is @{cluster.name}; write `on @{cluster.name}`")
        return plan

    # -- the exec graph -------------------------------------------------------------------------

    def exec_graph(self, item: Tree) -> tuple[ExecGraph, dict]:
        name_tok, steps_tree, lowered_tree, *body = item.children
        parts = _ExecParts(steps=self.int_of(steps_tree, "steps of exec.graph", minimum=1, maximum=MAX_SIZE))
        for stmt in body:
            try:
                self.exec_statement(stmt, parts)
            except _StatementError:
                continue
        memory = None
        if parts.memory is not None:
            (m_eff, r_peak, feasible), _ = parts.memory
            memory = MemoryReport(
                peak=tuple(parts.devices["peak"]),
                persistent=tuple(parts.devices["persistent"]),
                transient=tuple(parts.devices["transient"]),
                m_eff=m_eff,
                r_peak=r_peak,
                feasible=feasible,
            )
        elif parts.first_device is not None:
            self.report(parts.first_device, "exec.device needs an exec.memory line in the same exec.graph, e.g. "
                        "`exec.memory {m_eff = 8.6e10, r_peak = 0.71, feasible = true}`")
        graph = ExecGraph(
            graph=self.name(name_tok),
            steps=parts.steps,
            nodes=tuple(parts.nodes),
            edges=tuple(parts.edges),
            lowered=lowered_tree is not None,
            memory=memory,
            schedule=parts.schedule[0] if parts.schedule else None,
            fusions=tuple(parts.fusions),
            loc=self.loc(item),
        )
        parts.refs["graph"] = [(graph.graph, self.loc(name_tok))]
        return graph, parts.refs

    def exec_statement(self, stmt: Tree, parts: "_ExecParts") -> None:
        kind = stmt.data
        loc = self.loc(stmt)
        if kind == "exec_node":
            self.declare("exec node", stmt.children[1])
            node = self.exec_node(stmt, parts.refs)
            if node.id in parts.node_locs:
                self.fail(loc, f"exec node @{node.id} is defined twice (first at {parts.node_locs[node.id]}); node ids are unique")
            parts.node_locs[node.id] = loc
            parts.nodes.append(node)
        elif kind == "exec_edge":
            parts.edges.append(self.exec_edge(stmt, parts.refs))
        elif kind == "exec_memory":
            if parts.memory is not None:
                self.fail(loc, f"exec.memory is given twice (first at {parts.memory[1]}); keep one")
            attrs = self.attrs(stmt.children[0], "exec.memory", MEMORY_KEYS)
            example = "exec.memory {m_eff = 8.6e10, r_peak = 0.71, feasible = true}"
            m_eff, r_peak, feasible = (self.need(attrs, k, "exec.memory", loc, example) for k in MEMORY_KEYS)
            values = (self.attr_float(m_eff, "exec.memory"), self.attr_float(r_peak, "exec.memory"),
                      self.attr_bool(feasible, "exec.memory"))
            parts.memory = (values, loc)
        elif kind == "exec_device":
            self.exec_device(stmt, parts)
        elif kind == "exec_fusion":
            fusion = self.exec_fusion(stmt, parts.refs)
            if fusion.id in parts.fusion_locs:
                self.fail(loc, f"exec fusion @{fusion.id} is defined twice (first at {parts.fusion_locs[fusion.id]}); "
                               "fusion ids are unique")
            parts.fusion_locs[fusion.id] = loc
            parts.fusions.append(fusion)
        elif kind == "exec_schedule":
            if parts.schedule is not None:
                self.fail(loc, f"exec.schedule is given twice (first at {parts.schedule[1]}); keep one")
            attrs = self.attrs(stmt.children[0], "exec.schedule", SCHEDULE_KEYS)
            example = "exec.schedule {makespan = 12.5, score = 1.2e5, score_pen = 1.2e5, util = 0.61, p_eff = 3.2}"
            values = [self.attr_float(self.need(attrs, k, "exec.schedule", loc, example), "exec.schedule") for k in SCHEDULE_KEYS]
            parts.schedule = (ScheduleReport(*values), loc)

    def exec_device(self, stmt: Tree, parts: "_ExecParts") -> None:
        """`exec.device d {peak = .., persistent = .., transient = ..}`: appends to the report's series
        in line order; a device may come back on a later line for a series it has not given yet."""
        dev_tree, attr_tree = stmt.children
        dev = self.int_of(dev_tree, "the device id", minimum=0)
        what = f"exec.device {dev}"
        attrs = self.attrs(attr_tree, what, DEVICE_KEYS)
        if not attrs:
            self.fail(self.loc(stmt), f"{what} gives no value; write e.g. `{what} {{peak = 6.1e10, persistent = 2.0e10, transient = 4.1e10}}`")
        values = {k: self.attr_float(a, what) for k, a in attrs.items()}
        for key, value in values.items():
            if (dev, key) in parts.device_seen:
                self.fail(attrs[key].loc, f"device {dev} has two {key} values (first at {parts.device_seen[(dev, key)]}); keep one")
        for key, value in values.items():
            parts.device_seen[(dev, key)] = attrs[key].loc
            parts.devices[key].append((dev, value))
        parts.first_device = parts.first_device or self.loc(stmt)

    def exec_fusion(self, stmt: Tree, refs: dict[str, list[Ref]]) -> ExecFusion:
        """`exec.fusion @id (@member, ...) stages [[F0.0, ...], ...]` (what the order means is checked later)."""
        id_tok, *rest = stmt.children
        member_toks = [t for t in rest if isinstance(t, Token)]
        members = tuple(self.name(t) for t in member_toks)
        refs["node"] += [(m, self.loc(t)) for m, t in zip(members, member_toks)]
        stage_trees = [t for t in rest if isinstance(t, Tree)]
        stages = tuple(tuple(self.microtask(t, s) for t in tree.children if t is not None)
                       for s, tree in enumerate(stage_trees))
        return ExecFusion(self.name(id_tok), members, stages, loc=self.loc(stmt))

    def microtask(self, tok: Token, stage: int) -> Microtask:
        """`F1.3` in the list of stage `stage`: member 1's forward of microbatch 3 there."""
        t = microtask_of(str(tok), stage)  # the grammar's MICROTASK has its form
        if max(t.member, t.micro) > MAX_SIZE:
            self.fail(self.loc(tok), f"microtask {tok} counts above {MAX_SIZE}")
        return t

    def exec_node(self, stmt: Tree, refs: dict[str, list[Ref]]) -> ExecNode:
        kw_tree, id_tok, *clauses = stmt.children
        kind = NODE_KEYWORDS[str(kw_tree.children[0])]
        node_id = self.name(id_tok)
        loc = self.loc(stmt)
        what = f"exec.{kind} @{node_id}"
        given: dict[str, Loc] = {}
        values: dict = {}

        def put(clause: Tree, key: str, value) -> None:
            cloc = self.loc(clause)
            if key in given:
                self.fail(cloc, f"{what} gives {_CLAUSE_WORDS[key]} twice (first at {given[key]}); keep one")
            given[key] = cloc
            values[key] = value

        for c in clauses:
            kind_c = c.data
            args = c.children
            if kind_c == "c_vertex":
                put(c, "vertex", self.name(args[0]))
                refs["vertex"].append((values["vertex"], self.loc(args[0])))
            elif kind_c == "c_role":
                role = str(args[0])
                if role not in ROLES:
                    self.fail(self.loc(c), f"unknown role '{role}'{_close(role, ROLES)} in {what}; expected one of {', '.join(ROLES)}")
                put(c, "role", role)
            elif kind_c == "c_model":
                put(c, "model", self.name(args[0]))
                refs["model"].append((values["model"], self.loc(args[0])))
            elif kind_c == "c_step":
                put(c, "step", self.int_of(args[0], f"step of {what}", minimum=0))
            elif kind_c == "c_order":
                put(c, "order", self.int_of(args[0], f"order of {what}", minimum=0))
            elif kind_c == "c_phase":
                put(c, "phase", self.int_of(args[0], f"phase of {what}", minimum=1))
            elif kind_c == "c_nphases":
                put(c, "nphases", self.int_of(args[0], f"phase count of {what}", minimum=1))
            elif kind_c == "c_fraction":
                put(c, "fraction", self.number_float(args[0], f"fraction of {what}"))
            elif kind_c == "c_container":
                put(c, "container", self.name(args[0]))
                refs["container"].append((values["container"], self.loc(args[0])))
            elif kind_c == "c_version":
                put(c, "version_in", self.int_of(args[0], f"version of {what}", minimum=0))
            elif kind_c in ("c_reads", "c_writes"):
                reads = kind_c == "c_reads"
                word = "reads" if reads else "writes"
                if word in given:
                    self.fail(self.loc(c), f"{what} gives '{word}' twice (first at {given[word]}); keep one")
                given[word] = self.loc(c)
                versions, data = self.bindings(args[0], f"{word} of {what}", refs)
                if versions:
                    put(c, "version_in" if reads else "version_out", versions)
                if data:
                    put(c, "data_in" if reads else "data_out", data)
            elif kind_c == "c_alloc":
                put(c, "alloc", self.alloc(args, what, "allocation"))
            elif kind_c == "c_src_alloc":
                put(c, "src_alloc", self.alloc(args, what, "source allocation"))
            elif kind_c == "c_strategy":
                put(c, "strategy", self.strategy(args[0], what))
            elif kind_c == "c_src_strategy":
                put(c, "src_strategy", self.strategy(args[0], f"the source layout of {what}"))
            elif kind_c == "c_bytes":
                put(c, "bytes", self.int_of(args[0], f"bytes of {what}", minimum=0))
            elif kind_c == "c_pool":
                put(c, "pool", self.int_of(args[0], f"pool of {what}", minimum=1, maximum=MAX_SIZE))
            elif kind_c == "c_shares":
                put(c, "shares", tuple(self.int_of(a, f"a device {what} shares", minimum=0, maximum=MAX_SIZE)
                                       for a in args))
            elif kind_c == "c_annot":
                attrs = self.attrs(args[0], what, ANNOTATION_KEYS)
                for key, a in attrs.items():
                    put(c, key, self.attr_float(a, what))

        for key in ("step", "order"):
            if key not in values:
                self.fail(loc, f"{what} needs '{key} N'")
        if isinstance(values.get("version_in"), int):
            if "model" not in values:
                self.fail(given["version_in"], f"'version' in {what} needs the model it moves, e.g. `weights @actor version 1`")
            values["version_in"] = ((values["model"], values["version_in"]),)
        if kind == "op" and "vertex" not in values:
            values["vertex"] = node_id.split("#", 1)[0]
            refs["vertex"].append((values["vertex"], self.loc(id_tok)))
        return ExecNode(id=node_id, kind=kind, loc=loc, **values)

    def alloc(self, args: list[Tree], what: str, which: str) -> Alloc:
        origin = self.triple(args[0], f"{which} origin", what, minimum=0)
        extent = self.triple(args[1], f"{which} extent", what, minimum=1)
        return Alloc(origin, extent)

    def exec_edge(self, stmt: Tree, refs: dict[str, list[Ref]]) -> ExecEdge:
        kw_tree, src_tok, dst_tok, ctr_tok = stmt.children
        kind = EDGE_KEYWORDS[str(kw_tree.children[0])]
        src, dst = self.name(src_tok), self.name(dst_tok)
        refs["node"] += [(src, self.loc(src_tok)), (dst, self.loc(dst_tok))]
        container = None
        if ctr_tok is not None:
            container = self.name(ctr_tok)
            refs["container"].append((container, self.loc(ctr_tok)))
        return ExecEdge(src, dst, kind, container, loc=self.loc(stmt))

    def finish_exec(self, parts: tuple[ExecGraph, dict], model_names: set[str], graph: Optional[Graph]) -> ExecGraph:
        exec_graph, refs = parts
        scope = f"exec.graph @{exec_graph.graph}"
        self.resolve(refs["node"], {n.id for n in exec_graph.nodes}, "exec node", "@", scope, "exec.op/comm/reshard")
        self.resolve(refs["model"], model_names, "model", "@", "the module", "rpeg.model")
        # Vertices and containers are checked against the graph only when the module carries one (an
        # exec module may be printed without its source graph).
        if graph is not None:
            name, loc = refs["graph"][0]
            if name != graph.name:
                self.report(loc, f"unknown graph @{name}: the module's graph is @{graph.name}; write `exec.graph @{graph.name}`")
            self.resolve(refs["vertex"], {v.name for v in graph.vertices}, "vertex", "@", f"graph @{graph.name}", "rpeg.vertex")
            self.resolve(refs["container"], {c.name for c in graph.containers}, "container", "%", f"graph @{graph.name}", "rpeg.container")
        return exec_graph


_CLAUSE_WORDS = {
    "vertex": "'vertex @v'",
    "role": "a role",
    "model": "a model",
    "step": "'step'",
    "order": "'order'",
    "phase": "'phase'",
    "nphases": "'of' (phase count)",
    "fraction": "'fraction'",
    "container": "a container",
    "version_in": "the version read ('version' / 'reads')",
    "version_out": "'writes'",
    "data_in": "the data read ('reads')",
    "data_out": "the data written ('writes')",
    "alloc": "an allocation ('at' / 'to')",
    "src_alloc": "a source allocation ('from')",
    "strategy": "a layout (dp/pp/tp/mb)",
    "src_strategy": "a source layout ('from (dp = ...)')",
    "bytes": "'bytes'",
    "pool": "'pool'",
    "shares": "'shares'",
    "time": "'time'",
    "start": "'start'",
    "finish": "'finish'",
}


# "Did you mean" compares `word` with at most this many names (difflib costs O(len^2) per name): the
# names next to `word` in sorted order, which share its longest prefixes. And one check of references
# gives hints to its first _MAX_HINTS unknown names only. A module with 100k names and 100k unknown
# references so costs O(n log n), not O(n^2) (it took 71 s for 20k of each; now under 2 s).
_MAX_SUGGESTION_CANDIDATES = 64
_MAX_HINTS = 100


class _SortedNames(list):
    """Names in sorted order, so that the names near a word are found by bisection."""

    def __init__(self, names):
        super().__init__(sorted({str(n) for n in names}))

    def near(self, word: str) -> list[str]:
        if len(self) <= _MAX_SUGGESTION_CANDIDATES:
            return list(self)
        i = bisect.bisect_left(self, word)
        half = _MAX_SUGGESTION_CANDIDATES // 2
        lo = max(0, min(i - half, len(self) - _MAX_SUGGESTION_CANDIDATES))
        return self[lo:lo + _MAX_SUGGESTION_CANDIDATES]


def _close(word: str, choices, sigil: str = "") -> str:
    """'; did you mean X?' when a choice is close to `word`, else ''."""
    ordered = choices if isinstance(choices, _SortedNames) else _SortedNames(choices)
    names = ordered.near(word)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.7)
    return f" (did you mean {sigil}{close[0]}?)" if close else ""
