"""Program -> text: the canonical `.rpeg` writer (docs/architecture.md, IR: rpegc prints what it parses).

Writes the syntax read by rpegc/syntax/parser.py for every stage (App. A-A..A-D: workload, models, G°,
cluster, plan; App. A-F..A-H: the exec graph). Output is deterministic, aligned where it helps a reader,
and `parse(print_program(p)) == p` holds (source locations are not part of equality). Floats print with
`repr`, so they re-parse to the identical value. Lines are built as lists and joined once, so exec
graphs with thousands of nodes print fast.

Implied rather than written, to keep the text short: an op node's vertex when it is the part of its id
before '#' (so an op node always has a vertex), and a weights container's dims (always empty). A model's
`preset` is printed only when it names a known preset (rpegc.core.ir.presets), the only kind the reader accepts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Iterable, Optional

from rpegc.core.ir import presets
from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecFusion, ExecGraph, ExecNode, MemoryReport, microtask_text
from rpegc.core.ir.expr import Expr
from rpegc.core.ir.program import (ARCH_FLAGS, ARCH_SIZES, HEAD_DIM, Graph, Model, Plan, Program, Verifier, Workload,
                                   arch_flag_default)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy

_EDGE_WORDS = {"data": "exec.data", "pub": "exec.publish", "order": "exec.order", "dep": "exec.dep"}
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.#$]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INDENT = "  "


def print_program(p: Program) -> str:
    """The whole module as `.rpeg` text, ending in a newline."""
    lines: list[str] = [_workload(p.workload)]
    lines += _models(p.models)
    lines += _verifiers(p.verifiers)
    if p.graph is not None:
        lines += _graph(p.graph)
    if p.cluster is not None:
        lines.append(_cluster(p.cluster))
    if p.plan is not None:
        lines += _plan(p.plan)
    if p.exec is not None:
        lines += exec_graph_lines(p.exec)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Tokens


def sym(name: str) -> str:
    """`@name`, quoted (`@"a b"`) when the name is not a bare identifier."""
    return "@" + _quote_name(name)


def ctr(name: str) -> str:
    """`%name`, quoted like `sym`."""
    return "%" + _quote_name(name)


def _quote_name(name: str) -> str:
    return name if _BARE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _word(s: str) -> str:
    """A bare word value (kind, dtype) when it is one, else a quoted string (the parser accepts both)."""
    return s if _NAME.fullmatch(s) else _string(s)


def fmt_float(x: float) -> str:
    """A float text that re-parses to the identical value: `repr`, or the shortest exponent form when
    that is much shorter (8.6e10 rather than 86000000000.0); `inf`, `-inf` and `nan` as written."""
    x = float(x)
    text = repr(x)
    if not math.isfinite(x):
        return text
    for digits in range(1, 18):
        short = format(x, f".{digits}g")
        if float(short) == x:
            break
    if "e" in short:
        mantissa, exponent = short.split("e")
        short = f"{mantissa}e{int(exponent)}"
    elif "." not in short:
        short += ".0"  # an integral value still reads as a float
    if len(short) + 3 < len(text):
        return short
    return text


def _expr(e: Expr) -> str:
    return str(e)


def _pad(items: list[str]) -> list[str]:
    width = max((len(s) for s in items), default=0)
    return [s.ljust(width) for s in items]


def _attr_dict(pairs: Iterable[tuple[str, Optional[str]]]) -> str:
    return "{" + ", ".join(k if v is None else f"{k} = {v}" for k, v in pairs) + "}"


def _names(names: Iterable[str], sigil=ctr) -> str:
    return ", ".join(sigil(n) for n in names)


def _triple(t: tuple[int, int, int]) -> str:
    return f"({t[0]}, {t[1]}, {t[2]})"


def _alloc(word: str, a: Alloc) -> str:
    return f"{word} {_triple(a.origin)} extent {_triple(a.extent)}"


def _strategy_flat(s: Strategy) -> str:
    train = "".join(f" {k} = {v}" for k, v in s.train.items())
    return f"dp = {s.dp} pp = {s.pp} tp = {s.tp} mb = {s.mb}{train}"


def _strategy_tuple(word: str, s: Strategy) -> str:
    return f"{word} (dp = {s.dp}, pp = {s.pp}, tp = {s.tp}, mb = {s.mb})"


def _versions(entries: tuple[tuple[str, int], ...]) -> str:
    return "{" + ", ".join(f"{sym(m)} = {v}" for m, v in entries) + "}"


def _bindings(versions: tuple[tuple[str, int], ...], data: tuple[DataRef, ...]) -> str:
    """`{@actor = 0, %Y phase 2}`, or "" when the node binds nothing."""
    if not versions and not data:
        return ""
    entries = [f"{sym(m)} = {v}" for m, v in versions]
    i = 0
    while i < len(data):
        d, j = data[i], i + 1
        while (j < len(data) and d.phase is not None and data[j].container == d.container
               and data[j].phase == d.phase + (j - i)):
            j += 1
        if j - i > 1:
            entries.append(f"{ctr(d.container)} phases {d.phase} to {data[j - 1].phase}")
        else:
            entries.append(ctr(d.container) + (f" phase {d.phase}" if d.phase is not None else ""))
        i = j
    return "{" + ", ".join(entries) + "}"


# ---------------------------------------------------------------------------------------------------
# Workload, models, cluster


def _workload(w: Workload) -> str:
    train = "".join(f", {k} = {v}" for k, v in w.train.items())
    drawn = f", oversample = {w.oversample}" if w.oversample != 1 else ""
    return (f"rpeg.workload {{B = {w.B}, R = {w.R}, Lp = {w.Lp}, Lr = {w.Lr}, dtype = {_word(w.dtype)}{drawn}"
            f"{train}}}")


def _model_attrs(m: Model) -> list[tuple[str, Optional[str]]]:
    base = presets.lookup(m.preset) if m.preset is not None else None
    pairs: list[tuple[str, Optional[str]]] = []
    if m.hf is not None:
        pairs.append(("hf", _string(m.hf)))  # the reader takes the architecture from its config.json
    elif base is not None:
        pairs.append(("arch", _string(m.preset)))
        # A preset with overrides (e.g. a shallower llama) prints only what differs.
        pairs += [(f, str(getattr(m.arch, f))) for f in ARCH_SIZES if getattr(m.arch, f) != getattr(base, f)]
        pairs += [(HEAD_DIM, str(m.arch.head_size))] if m.arch.head_size != base.head_size else []
        pairs += [(f, str(getattr(m.arch, f)).lower()) for f in ARCH_FLAGS if getattr(m.arch, f) != getattr(base, f)]
    else:
        pairs += [(f, str(getattr(m.arch, f))) for f in ARCH_SIZES]
        pairs += [(HEAD_DIM, str(m.arch.head_size))] if m.arch.head_size else []
        pairs += [(f, str(getattr(m.arch, f)).lower()) for f in ARCH_FLAGS
                  if getattr(m.arch, f) != arch_flag_default(f)]
    pairs.append(("kind", _word(m.kind)))
    if m.trainable:
        pairs.append(("trainable", None))
    return pairs


def _models(models: tuple[Model, ...]) -> list[str]:
    heads = _pad([f"rpeg.model {sym(m.name)}" for m in models])
    return [f"{h} {_attr_dict(_model_attrs(m))}" for h, m in zip(heads, models)]


def _verifiers(verifiers: tuple[Verifier, ...]) -> list[str]:
    heads = _pad([f"rpeg.verifier {sym(v.name)}" for v in verifiers])
    return [f"{h} {_attr_dict(_verifier_attrs(v))}" for h, v in zip(heads, verifiers)]


def _verifier_attrs(v: Verifier) -> list[tuple[str, Optional[str]]]:
    attrs: list[tuple[str, Optional[str]]] = [("fn", _string(v.fn))]
    if v.per_response is not None:
        attrs.append(("per_response", fmt_float(v.per_response)))
    return attrs


def _cluster(c: Cluster) -> str:
    return (
        f"rpeg.cluster {sym(c.name)} {{racks = {c.racks}, nodes = {c.nodes}, gpus = {c.gpus}, "
        f"hardware = {_string(c.hardware)}}}"
    )


# ---------------------------------------------------------------------------------------------------
# The graph


def _graph(g: Graph) -> list[str]:
    out = [f"rpeg.graph {sym(g.name)} {{"]
    names = _pad([ctr(c.name) for c in g.containers])
    for name, c in zip(names, g.containers):
        if c.is_weights:
            body = f"rpeg.weights {sym(c.model or '')}"
        else:
            body = f"rpeg.container {c.elem}[{', '.join(_expr(d) for d in c.dims)}]"
        if c.bytes_per_elem is not None:
            body += f" {{bytes = {c.bytes_per_elem}}}"
        out.append(f"{INDENT}{name} = {body}")
    if g.inputs:
        out.append(f"{INDENT}rpeg.input {_names(g.inputs)}")
    if g.outputs:
        out.append(f"{INDENT}rpeg.output {_names(g.outputs)}")
    v_names = _pad([sym(v.name) for v in g.vertices])
    roles = _pad([v.role for v in g.vertices])
    models = _pad([sym(v.model) for v in g.vertices])
    for name, role, model, v in zip(v_names, roles, models, g.vertices):
        out.append(
            f"{INDENT}rpeg.vertex {name} {role} {model} reads({_names(v.reads)}) writes({_names(v.writes)})"
        )
    for word, edges in (("rpeg.data", g.data_edges), ("rpeg.publish", g.pub_edges)):
        for e in edges:
            out.append(f"{INDENT}{word} {sym(e.src)} -> {sym(e.dst)} ({ctr(e.container)})")
    if g.staleness:
        out.append(f"{INDENT}rpeg.staleness {_versions(g.staleness)}")
    if g.quantiles:
        qs = ", ".join(f"({fmt_float(q.f)}, {_expr(q.tokens)})" for q in g.quantiles)
        out.append(f"{INDENT}rpeg.quantiles [{qs}]")
    if g.algorithm is not None:
        out.append(f"{INDENT}rpeg.algorithm {g.algorithm}")
    out.append("}")
    return out


def _plan(p: Plan) -> list[str]:
    out = [f"rpeg.plan {sym(p.name)} for {sym(p.graph)} on {sym(p.cluster)} {{"]
    names = _pad([sym(pl.vertex) for pl in p.placements] + [sym(pool.vertex) for pool in p.pools])
    for name, pl in zip(names, p.placements):
        out.append(f"{INDENT}{name} {_alloc('at', pl.alloc)} {_strategy_flat(pl.strategy)}")
    for name, pool in zip(names[len(p.placements):], p.pools):
        out.append(f"{INDENT}{name} pool = {pool.size}")
    out += [f"{INDENT}rpeg.fuse ({', '.join(sym(v) for v in f.vertices)})" for f in p.fusions]
    out.append("}")
    return out


# ---------------------------------------------------------------------------------------------------
# The exec graph


def exec_graph_lines(g: ExecGraph) -> list[str]:
    """The `exec.graph` block as lines (also used to print an exec graph on its own)."""
    head = f"exec.graph {sym(g.graph)} steps = {g.steps}" + (" lowered" if g.lowered else "") + " {"
    out = [head]
    out += [INDENT + node_line(n) for n in g.nodes]
    out += [INDENT + edge_line(e) for e in g.edges]
    out += [INDENT + fusion_line(f) for f in g.fusions]
    if g.memory is not None:
        out += [INDENT + line for line in _memory_lines(g.memory)]
    if g.schedule is not None:
        s = g.schedule
        out.append(
            f"{INDENT}exec.schedule {{makespan = {fmt_float(s.makespan)}, score = {fmt_float(s.score)}, "
            f"score_pen = {fmt_float(s.score_pen)}, util = {fmt_float(s.util)}, p_eff = {fmt_float(s.p_eff)}}}"
        )
    out.append("}")
    return out


def fusion_line(f: ExecFusion) -> str:
    stages = ", ".join("[" + ", ".join(microtask_text(t) for t in order) + "]" for order in f.stages)
    return f"exec.fusion {sym(f.id)} ({', '.join(sym(m) for m in f.members)}) stages [{stages}]"


def _default_vertex(node: ExecNode) -> Optional[str]:
    return node.id.split("#", 1)[0] if node.kind == "op" else None


def node_line(n: ExecNode) -> str:
    """One `exec.op` / `exec.comm` / `exec.reshard` line; optional fields are omitted when unset."""
    parts = [f"exec.{n.kind}", sym(n.id)]
    head = []
    if n.vertex is not None and n.vertex != _default_vertex(n):
        head += ["vertex", sym(n.vertex)]
    if n.role is not None:
        head.append(n.role)
    steps = ["step", str(n.step), "order", str(n.order)]
    model_clause: list[str] = []
    version_clause: list[str] = []
    if n.kind == "op":
        # An op reads as "<role> @<model> step k order i": what runs first, then when.
        if n.model is not None:
            head.append(sym(n.model))
        parts += head + steps
    else:
        parts += steps + head
        if n.model is not None:
            model_clause = (["weights"] if n.kind == "comm" else []) + [sym(n.model)]
            if len(n.version_in) == 1 and n.version_in[0][0] == n.model:
                version_clause = ["version", str(n.version_in[0][1])]
    if n.phase is not None:
        parts += ["phase", str(n.phase)]
    if n.nphases is not None:
        parts += ["of", str(n.nphases)]
    if n.fraction is not None:
        parts += ["fraction", fmt_float(n.fraction)]
    if n.container is not None:
        parts.append(f"({ctr(n.container)})")
    parts += model_clause + version_clause
    if n.kind == "comm":
        if n.src_alloc is not None:
            parts.append(_alloc("from", n.src_alloc))
        if n.alloc is not None:
            parts.append(_alloc("to", n.alloc))
    else:
        if n.alloc is not None:
            parts.append(_alloc("at", n.alloc))
        if n.src_alloc is not None:
            parts.append(_alloc("from", n.src_alloc))
    if n.src_strategy is not None:
        parts.append(_strategy_tuple("from", n.src_strategy))
    if n.strategy is not None:
        parts.append(_strategy_tuple("to", n.strategy) if n.kind == "reshard" else _strategy_flat(n.strategy))
    if n.pool is not None:
        parts.append(f"pool = {n.pool}")
    if n.shares:
        parts.append(f"shares = [{', '.join(str(d) for d in n.shares)}]")
    if n.bytes != 0 or n.kind != "op":
        parts.append(f"bytes = {n.bytes}")
    reads = _bindings((), n.data_in) if version_clause else _bindings(n.version_in, n.data_in)
    writes = _bindings(n.version_out, n.data_out)
    if reads:
        parts += ["reads", reads]
    if writes:
        parts += ["writes", writes]
    annot = [(k, fmt_float(v)) for k, v in (("time", n.time), ("start", n.start), ("finish", n.finish)) if v is not None]
    if annot:
        parts.append(_attr_dict(annot))
    return " ".join(parts)


def edge_line(e: ExecEdge) -> str:
    line = f"{_EDGE_WORDS[e.kind]} {sym(e.src)} -> {sym(e.dst)}"
    return line + (f" ({ctr(e.container)})" if e.container is not None else "")


def _memory_lines(m: MemoryReport) -> list[str]:
    out = [
        f"exec.memory {{m_eff = {fmt_float(m.m_eff)}, r_peak = {fmt_float(m.r_peak)}, "
        f"feasible = {'true' if m.feasible else 'false'}}}"
    ]
    series = {"peak": m.peak, "persistent": m.persistent, "transient": m.transient}
    devices = [tuple(d for d, _ in values) for values in series.values()]
    if devices[0] == devices[1] == devices[2]:
        # The usual case: one line per device with all three values.
        for i, dev in enumerate(devices[0]):
            vals = ", ".join(f"{k} = {fmt_float(series[k][i][1])}" for k in series)
            out.append(f"exec.device {dev} {{{vals}}}")
    else:
        for key, values in series.items():
            out += [f"exec.device {dev} {{{key} = {fmt_float(v)}}}" for dev, v in values]
    return out
