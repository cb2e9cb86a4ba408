"""The JSON form of a Program (`rpegc --emit=json`, the runtime's plan input).

Paper: Sec. VII ("graph realization": the runtime reads the lowered, annotated plan) and docs/architecture.md,
Data flow to IR. The JSON form carries exactly what the text form carries, so
`program_from_json(program_to_json(p)) == p`; source locations are not stored (they never take part
in equality). No xDSL: the runtime loads plans through this module.

Schema (every key is always written unless marked "optional"; `null` stands for "not set"):

    {
      "format": "rpegc-program", "format_version": 1,
      "workload": {"B": int, "R": int, "Lp": int, "Lr": int, "dtype": "bf16" | "fp16" | "fp32", "train"?: TRAIN,
                   "oversample"?: int},
      "models": [{"name": str, "kind": MODEL_KIND, "trainable": bool, "preset": str | null,
                  "arch": {"layers", "hidden", "ffn", "vocab", "heads", "kv_heads": int,
                           "gated", "qkv_bias", "tied", "norms": bool},
                  "hf"?: str}],
                  // reading: "arch" may be left out when "preset" names a known preset, or with "hf";
                  // an arch's absent flag is its preset's, else the spec's form (program.Arch)
                  // (a checkpoint directory: the arch is its config.json's; a given "arch" must agree)
      "verifiers"?: [{"name": str, "fn": str, "per_response"?: number}],
                  // rpeg.verifier: reward functions of response text run on host CPU processes; "fn" is what
                  // the runtime calls, "per_response" the seconds of one call on one process (> 0; absent:
                  // the hardware profile's calibration); written only when the module declares one
      "rpeg_graph": null | {            // the cyclic steady-state graph G°
          "name": str,
          "containers": [{"name": str, "elem": ELEMENT_KIND | "weights", "dims": [EXPR],
                          "model": str | null, "bytes_per_elem": int | null}],
          "inputs": [str], "outputs": [str],
          "vertices": [{"name": str, "role": ROLE, "model": str, "reads": [str], "writes": [str]}],
                                        // "model": a device vertex's model; a "verify" vertex's verifier
          "data_edges": [{"src": str, "dst": str, "container": str}],
          "pub_edges":  [{"src": str, "dst": str, "container": str}],
          "staleness": {model: int},          // tau(m); models not listed have tau = 0
          "quantiles": [{"f": float, "tokens": EXPR}], "algorithm"?: "ppo" | "grpo" | "dpo"},
      "cluster": null | {"name": str, "racks": int, "nodes": int, "gpus": int, "hardware": str},
      "plan": null | {"name": str, "graph": str, "cluster": str,
                      "placements": [{"vertex": str, "origin": [r, n, g], "extent": [r, n, g],
                                      "dp": int, "pp": int, "tp": int, "mb": int, "train"?: TRAIN}],
                                      // the device vertices' placements (a verify vertex has a pool instead)
                      "pools"?: [{"vertex": str, "size": int}],  // a verify vertex's host worker processes (>= 1)
                      "fusions"?: [[str]]},     // rpeg.fuse: training vertices run as one fused operator

      // only for a module with an exec.graph (the unrolled / lowered DAG):
      "graph": str,                     // name of the RPEG the DAG was unrolled from
      "steps": int,                     // K_eval
      "lowered": bool,
      "nodes": [{
          "id": str, "kind": "op" | "comm" | "reshard", "vertex": str | null, "step": int,
          "phase": int | null, "role": ROLE | null, "model": str | null,
          "devices": [int] | null,      // flat ids (rack*N_n + node)*N_g + gpu of the allocation
                                        // (Op: sigma(v); Comm/Reshard: destination); null: unplaced, or
                                        // on the host (a verify Op; a Comm to the host's pool)
          "dp": int | null, "pp": int | null, "tp": int | null, "mb": int | null,
                                        // Op: its plan; Reshard: the target layout; else null (a verify Op too)
          "train": TRAIN,               // optional: an Op's training fields, when its placement states any
          "bytes": int,                 // Comm/Reshard payload, 0 for Op nodes
          "version_in": {model: int},   // Op: version read per model; Comm/Reshard: version moved
          "version_out": {model: int},  // training Op: version produced (k + 1)
          "data_in": [{"container": str, "phase": int | null}],   // containers of the node's step it reads
          "data_out": [{"container": str, "phase": int | null}],  // ... and writes (Op: on its allocation;
                                        // Comm: read on the source, written on the destination)
          "order": int,                 // topological index of the RPEG vertex (Comm/Reshard: consumer's)
          "container": str,             // optional: Comm's container
          "fraction": float,            // optional: quantile phase share f_q - f_{q-1}
          "nphases": int,               // optional: Q of a phase sub-node
          "pool": int,                  // optional: a verify Op's host worker processes (its Pool's size)
          "shares": [int],              // optional: on the host's pool (a verify Op, a Comm into it): the
                                        // devices whose host cores the pool shares (reserved with it)
          "alloc": {"origin": [r, n, g], "extent": [r, n, g]},       // optional (see "devices")
          "src_alloc": {"origin": [...], "extent": [...]},          // optional: Comm/Reshard source
                                        // (absent on a Comm from the host's pool)
          "src_strategy": {"dp": int, "pp": int, "tp": int, "mb": int},  // optional: Reshard source layout
          "time": float, "start": float, "finish": float             // optional: annotate-cost, schedule
      }],
      "edges": [[src_id, dst_id]],
      "edge_attrs": [{"kind": "data" | "pub" | "order" | "dep", "container": str | null}],
                                        // optional, one per edge; absent: every edge is a plain "dep"
      "memory": {"peak": {device: bytes}, "persistent": {device: bytes}, "transient": {device: bytes},
                 "m_eff": float, "r_peak": float, "feasible": bool},            // optional
      "schedule": {"makespan": float, "score": float, "score_pen": float,
                   "util": float, "p_eff": float},                               // optional
      "fusions": [{"id": str, "members": [node_id], "stages": [[MICROTASK]]}]  // optional: exec.fusion
    }

ROLE is "generation", "inference", "training" or "verify" (a reward function on host CPU processes: its vertex
names a verifier, has a plan pool instead of a placement, and its Op nodes have no devices and no strategy).
TRAIN is an object of the training fields stated (rpegc/core/ir/training.py), each optional, at least one:
{"precision": "mixed" | "fp32", "zero": 0 | 1 | 2, "recompute": "none" | "interval" | "full",
"schedule": "1f1b" | "gpipe"}; written only when a field is stated.
MICROTASK is a fused member's forward or backward of a microbatch on the stage whose list holds it, as in the text
syntax: "F1.3" is member 1's forward of microbatch 3, "B0.2" member 0's backward of microbatch 2.
EXPR is a size expression in the text syntax, e.g. "B*R" or "(Lp + Lr)/2". When reading, a node
may give "devices" without "alloc": the allocation is rebuilt from the device box (the module's
cluster is needed); given both, they must agree. Unknown keys are errors.

The published JSON Schema of this form is `rpegc-program.schema.json` beside this module (package
data; draft 2020-12). The reader below is hand-written (the runtime must not need jsonschema, whose
`rpds-py` dependency is compiled) and is kept equal to the schema by tests/test_json_schema.py:
every schema violation is rejected at the same key path. Strictness: the text must be strict JSON
(`rpegc.syntax.json_text.loads`: no NaN/Infinity, no number that overflows a double, nesting at most
64 deep); integers are at most 2^53 - 1; times (time, start, finish), memory bytes, m_eff, r_peak,
makespan, util and p_eff are finite and >= 0, fractions and quantile shares in (0, 1], a verifier's
per_response finite and > 0, pool sizes >= 1. Beyond the schema the reader checks node ids are unique,
edge endpoints exist, the edges are acyclic, finish >= start, and that the last step of the nodes is
steps-1 (whether a verifier, a pool or a role fits its vertex is verify-wellformed's check). Every error
names the key path and the line and column of the value, e.g.
`plan.json:1292:13: error: at nodes[17].bytes: expected an integer >= 0, got -1`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import (
    EDGE_KINDS,
    NODE_KINDS,
    DataRef,
    ExecEdge,
    ExecFusion,
    ExecGraph,
    ExecNode,
    MemoryReport,
    ScheduleReport,
    microtask_of,
    microtask_text,
)
from rpegc.core.ir.expr import Expr
from rpegc.syntax import json_text
from rpegc.core.ir.hf_config import hf_arch
from rpegc.core.ir.presets import lookup as lookup_preset
from rpegc.syntax.parser import parse_expr
from rpegc.core.ir.algorithms import algorithm_family, algorithm_names
from rpegc.core.ir.program import (ARCH_FLAGS, ARCH_SIZES, HEAD_DIM, DTYPE_BYTES, ELEMENT_KINDS, MODEL_KINDS, ROLES,
                                   Arch, Container, Edge, Fuse, Graph, Model, Placement, Plan, Pool, Program,
                                   Quantile, Verifier, Vertex, Workload, arch_flag_default)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy, coords
from rpegc.core.ir.training import CHOICES as TRAIN_CHOICES, FIELDS as TRAIN_FIELDS, TrainSpec

FORMAT = "rpegc-program"
FORMAT_VERSION = 1
SCHEMA_FILE = "rpegc/syntax/rpegc-program.schema.json"  # the published JSON Schema of this form (package data)
MAX_INT = 2**53 - 1  # the integers every JSON reader reads exactly (I-JSON, RFC 7493)
_STRATEGY_KEYS = ("dp", "pp", "tp", "mb")


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def program_to_json(p: Program) -> dict:
    """The JSON-ready dict of `p` (see the module docstring for the schema)."""
    out: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "workload": {"B": p.workload.B, "R": p.workload.R, "Lp": p.workload.Lp, "Lr": p.workload.Lr,
                     "dtype": p.workload.dtype, **_train_json(p.workload.train),
                     **({"oversample": p.workload.oversample} if p.workload.oversample != 1 else {})},
        "models": [_model_json(m) for m in p.models],
        **({"verifiers": [_verifier_json(v) for v in p.verifiers]} if p.verifiers else {}),
        "rpeg_graph": _graph_json(p.graph) if p.graph is not None else None,
        "cluster": _cluster_json(p.cluster) if p.cluster is not None else None,
        "plan": _plan_json(p.plan) if p.plan is not None else None,
    }
    if p.exec is not None:
        out.update(_exec_json(p.exec, p.cluster))
    return out


def _model_json(m: Model) -> dict:
    return {
        "name": m.name,
        "kind": m.kind,
        "trainable": m.trainable,
        "preset": m.preset,
        "arch": {**{k: getattr(m.arch, k) for k in ARCH_SIZES + ARCH_FLAGS},
                 **({HEAD_DIM: m.arch.head_size} if m.arch.head_size else {})},
        **({"hf": m.hf} if m.hf is not None else {}),
    }


def _verifier_json(v: Verifier) -> dict:
    return {"name": v.name, "fn": v.fn, **({"per_response": v.per_response} if v.per_response is not None else {})}


def _graph_json(g: Graph) -> dict:
    return {
        "name": g.name,
        "containers": [
            {"name": c.name, "elem": c.elem, "dims": [str(d) for d in c.dims], "model": c.model,
             "bytes_per_elem": c.bytes_per_elem}
            for c in g.containers
        ],
        "inputs": list(g.inputs),
        "outputs": list(g.outputs),
        "vertices": [
            {"name": v.name, "role": v.role, "model": v.model, "reads": list(v.reads), "writes": list(v.writes)}
            for v in g.vertices
        ],
        "data_edges": [{"src": e.src, "dst": e.dst, "container": e.container} for e in g.data_edges],
        "pub_edges": [{"src": e.src, "dst": e.dst, "container": e.container} for e in g.pub_edges],
        "staleness": {m: tau for m, tau in g.staleness},
        "quantiles": [{"f": q.f, "tokens": str(q.tokens)} for q in g.quantiles],
        **({"algorithm": g.algorithm} if g.algorithm is not None else {}),
    }


def _cluster_json(c: Cluster) -> dict:
    return {"name": c.name, "racks": c.racks, "nodes": c.nodes, "gpus": c.gpus, "hardware": c.hardware}


def _plan_json(plan: Plan) -> dict:
    return {
        "name": plan.name,
        "graph": plan.graph,
        "cluster": plan.cluster,
        "placements": [
            {"vertex": pl.vertex, "origin": list(pl.alloc.origin), "extent": list(pl.alloc.extent),
             **_strategy_json(pl.strategy)}
            for pl in plan.placements
        ],
        **({"pools": [{"vertex": pool.vertex, "size": pool.size} for pool in plan.pools]} if plan.pools else {}),
        **({"fusions": [list(f.vertices) for f in plan.fusions]} if plan.fusions else {}),
    }


def _alloc_json(a: Alloc) -> dict:
    return {"origin": list(a.origin), "extent": list(a.extent)}


def _strategy_json(s: Optional[Strategy]) -> dict:
    if s is None:
        return {k: None for k in _STRATEGY_KEYS}
    return {"dp": s.dp, "pp": s.pp, "tp": s.tp, "mb": s.mb, **_train_json(s.train)}


def _train_json(t: TrainSpec) -> dict:
    """{"train": {stated fields}}, or nothing when no field is stated."""
    return {"train": dict(t.items())} if not t.empty else {}


def _exec_json(g: ExecGraph, cluster: Optional[Cluster]) -> dict:
    out: dict[str, Any] = {
        "graph": g.graph,
        "steps": g.steps,
        "lowered": g.lowered,
        "nodes": [_node_json(n, cluster) for n in g.nodes],
        "edges": [[e.src, e.dst] for e in g.edges],
    }
    if any(e.kind != "dep" or e.container is not None for e in g.edges):
        out["edge_attrs"] = [{"kind": e.kind, "container": e.container} for e in g.edges]
    if g.memory is not None:
        m = g.memory
        out["memory"] = {
            "peak": {str(d): b for d, b in m.peak},
            "persistent": {str(d): b for d, b in m.persistent},
            "transient": {str(d): b for d, b in m.transient},
            "m_eff": m.m_eff,
            "r_peak": m.r_peak,
            "feasible": m.feasible,
        }
    if g.schedule is not None:
        s = g.schedule
        out["schedule"] = {"makespan": s.makespan, "score": s.score, "score_pen": s.score_pen,
                           "util": s.util, "p_eff": s.p_eff}
    if g.fusions:
        out["fusions"] = [{"id": f.id, "members": list(f.members),
                           "stages": [[microtask_text(t) for t in order] for order in f.stages]} for f in g.fusions]
    return out


def _node_json(n: ExecNode, cluster: Optional[Cluster]) -> dict:
    devices = list(n.alloc.devices(cluster)) if n.alloc is not None and cluster is not None else None
    out: dict[str, Any] = {
        "id": n.id,
        "kind": n.kind,
        "vertex": n.vertex,
        "step": n.step,
        "phase": n.phase,
        "role": n.role,
        "model": n.model,
        "devices": devices,
        **_strategy_json(n.strategy),
        "bytes": n.bytes,
        "version_in": dict(n.version_in),
        "version_out": dict(n.version_out),
        "data_in": [_data_ref_json(d) for d in n.data_in],
        "data_out": [_data_ref_json(d) for d in n.data_out],
        "order": n.order,
    }
    optional = {
        "container": n.container,
        "fraction": n.fraction,
        "nphases": n.nphases,
        "pool": n.pool,
        "shares": list(n.shares) if n.shares else None,
        "alloc": _alloc_json(n.alloc) if n.alloc is not None else None,
        "src_alloc": _alloc_json(n.src_alloc) if n.src_alloc is not None else None,
        "src_strategy": _strategy_json(n.src_strategy) if n.src_strategy is not None else None,
        "time": n.time,
        "start": n.start,
        "finish": n.finish,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _data_ref_json(d: DataRef) -> dict:
    return {"container": d.container, "phase": d.phase}


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


class _Reader:
    """Typed access to decoded JSON; every failure is an RpegError naming the key path and, when the
    text is known, the line and column of the value (`rpegc.syntax.json_text.locate`)."""

    def __init__(self, file: str, text: Optional[str] = None):
        self.file = file
        self.text = text
        self.loc = Loc(file, 0, 0)

    def error(self, path: str, message: str) -> RpegError:
        where = f"at {path}: " if path else ""
        loc = self.loc
        if self.text is not None:
            line, col = json_text.locate(self.text, path)
            loc = Loc(self.file, line, col)
        return RpegError(loc, f"{where}{message}")

    def at(self, path: str) -> Loc:
        """The location of the value at `path` (file:0:0 without the text)."""
        if self.text is None:
            return self.loc
        return Loc(self.file, *json_text.locate(self.text, path))

    def element_locs(self, path: str, count: int) -> list[Loc]:
        """The location of each of the `count` elements of the list at `path`."""
        locs = json_text.element_locs(self.text, path, self.file) if self.text is not None else []
        return locs if len(locs) == count else [self.loc] * count

    def obj(self, value: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.error(path, f"expected an object, got {_kind(value)}")
        for key in required:
            if key not in value:
                raise self.error(path, f"missing key '{key}'; add it (see {SCHEMA_FILE})")
        allowed = set(required) | set(optional)
        for key in value:
            if key not in allowed:
                raise self.error(
                    _join(path, key), f"unknown key '{key}'; expected one of {', '.join(sorted(allowed))}"
                )
        return value

    def int_(self, value: Any, path: str, minimum: Optional[int] = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(path, f"expected an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.error(path, f"expected an integer >= {minimum}, got {value}")
        if value > MAX_INT:
            raise self.error(path, f"the integer {value} is too large; integers are at most 2^53 - 1 = {MAX_INT}")
        return value

    def float_(self, value: Any, path: str, minimum: Optional[float] = None, positive: bool = False,
               maximum: Optional[float] = None) -> float:
        """A finite number; with `minimum`: >= minimum, `positive`: > 0, `maximum`: <= maximum."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(path, f"expected a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise self.error(path, f"expected a finite number, got {value}")
        if minimum is not None and value < minimum:
            raise self.error(path, f"expected a number >= {minimum:g}, got {value!r}")
        if positive and value <= 0:
            raise self.error(path, f"expected a number > 0, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.error(path, f"expected a number <= {maximum:g}, got {value!r}")
        return value

    def bool_(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, f"expected true or false, got {_kind(value)}")
        return value

    def str_(self, value: Any, path: str, choices: Optional[tuple[str, ...]] = None) -> str:
        if not isinstance(value, str):
            raise self.error(path, f"expected a string, got {_kind(value)}")
        if choices is not None and value not in choices:
            raise self.error(path, f"'{value}' is not one of {', '.join(choices)}")
        return value

    def list_(self, value: Any, path: str) -> list:
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {_kind(value)}")
        return value

    def items(self, o: dict, key: str, path: str, read: Callable[[Any, str], Any]) -> list:
        """Read every element of the optional list `o[key]` (absent: empty)."""
        where = _join(path, key)
        return [read(x, f"{where}[{i}]") for i, x in enumerate(self.list_(o.get(key, []), where))]

    def opt(self, value: Any, path: str, read: Callable[[Any, str], Any]) -> Any:
        return None if value is None else read(value, path)

    def triple(self, value: Any, path: str, minimum: int) -> tuple[int, int, int]:
        if not isinstance(value, list) or len(value) != 3:
            raise self.error(path, f"expected a list of 3 integers, got {_kind(value)}")
        return tuple(self.int_(v, f"{path}[{i}]", minimum) for i, v in enumerate(value))  # type: ignore[return-value]

    def version_map(self, value: Any, path: str) -> tuple[tuple[str, int], ...]:
        if not isinstance(value, dict):
            raise self.error(path, f"expected an object {{model: version}}, got {_kind(value)}")
        return tuple((m, self.int_(v, _join(path, m), 0)) for m, v in value.items())

    def expr(self, value: Any, path: str) -> Expr:
        text = self.str_(value, path)
        try:
            return parse_expr(text)
        except RpegError as e:
            raise self.error(path, f"bad size expression '{text}': {e.message}") from None


def _join(path: str, key: str) -> str:
    return json_text.join(path, key)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "an object"


def program_to_text(p: Program) -> str:
    """The JSON form as text (`rpegc --emit=json`); a NaN or an infinity in it is an error naming where."""
    try:
        return json_text.dumps(program_to_json(p), indent=1) + "\n"
    except json_text.NonFiniteError as err:
        raise RpegError(Loc(p.file, 0, 0), f"cannot emit JSON: {err}; the module holds a NaN or infinite value "
                                           "there (check the inputs of the pass that computed it)") from None


def program_from_text(text: str, file: str) -> Program:
    """Read the JSON form from its text: strict JSON (`json_text.loads`), every error located at its
    key path and its line and column in `text`."""
    return program_from_json(json_text.loads(text, file), file, text)


def program_from_json(d: dict, file: str, text: Optional[str] = None) -> Program:
    """Rebuild a Program from `program_to_json`'s dict; malformed input raises RpegError (key path, and
    line and column when the `text` it was decoded from is given)."""
    r = _Reader(file, text)
    exec_keys = ("graph", "steps", "lowered", "nodes", "edges")
    top = r.obj(
        d,
        "",
        ("workload", "models"),
        ("format", "format_version", "verifiers", "rpeg_graph", "cluster", "plan", "edge_attrs", "memory", "schedule",
         "fusions") + exec_keys,
    )
    if "format" in top and top["format"] != FORMAT:
        raise r.error("format", f"expected '{FORMAT}', got {_kind(top['format'])}; this is not an rpegc program")
    version = top.get("format_version", FORMAT_VERSION)
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise r.error("format_version", f"unsupported version {_kind(version)}; this rpegc reads {FORMAT_VERSION}")
    workload = _read_workload(r, top["workload"])
    models = tuple(_read_model(r, m, f"models[{i}]") for i, m in enumerate(r.list_(top["models"], "models")))
    verifiers = tuple(r.items(top, "verifiers", "", lambda v, p: _read_verifier(r, v, p)))
    graph = r.opt(top.get("rpeg_graph"), "rpeg_graph", lambda v, p: _read_graph(r, v, p))
    cluster = r.opt(top.get("cluster"), "cluster", lambda v, p: _read_cluster(r, v, p))
    plan = r.opt(top.get("plan"), "plan", lambda v, p: _read_plan(r, v, p))
    exec_graph = None
    if any(k in top for k in exec_keys):
        for key in ("graph", "steps", "nodes", "edges"):
            if key not in top:
                raise r.error("", f"missing key '{key}': a module with exec nodes needs graph, steps, nodes and edges")
        exec_graph = _read_exec(r, top, cluster)
    elif any(k in top for k in ("edge_attrs", "memory", "schedule", "fusions")):
        raise r.error(
            "", "'edge_attrs', 'memory', 'schedule' and 'fusions' belong to an exec graph; add 'graph', 'steps', "
            "'nodes', 'edges'"
        )
    return Program(workload=workload, models=models, graph=graph, cluster=cluster, plan=plan, exec=exec_graph,
                   file=file, verifiers=verifiers)


def _read_workload(r: _Reader, v: Any) -> Workload:
    o = r.obj(v, "workload", ("B", "R", "Lp", "Lr"), ("dtype", "train", "oversample"))
    return Workload(
        B=r.int_(o["B"], "workload.B", 1),
        R=r.int_(o["R"], "workload.R", 1),
        Lp=r.int_(o["Lp"], "workload.Lp", 1),
        Lr=r.int_(o["Lr"], "workload.Lr", 1),
        dtype=r.str_(o.get("dtype", "bf16"), "workload.dtype", tuple(DTYPE_BYTES)),
        loc=r.loc,
        train=_read_train(r, o, "workload"),
        oversample=r.int_(o.get("oversample", 1), "workload.oversample", 1),
    )


def _read_model(r: _Reader, v: Any, path: str) -> Model:
    o = r.obj(v, path, ("name", "kind", "trainable"), ("preset", "arch", "hf"))
    preset = r.opt(o.get("preset"), _join(path, "preset"), r.str_)
    hf = r.opt(o.get("hf"), _join(path, "hf"), r.str_)
    given = None
    if o.get("arch") is not None:
        a = r.obj(o["arch"], _join(path, "arch"), ARCH_SIZES, ARCH_FLAGS + (HEAD_DIM,))
        base = lookup_preset(preset) if preset is not None else None
        flags = {f: r.bool_(a[f], f"{path}.arch.{f}") if f in a else
                 (getattr(base, f) if base is not None else arch_flag_default(f)) for f in ARCH_FLAGS}
        head = r.int_(a[HEAD_DIM], f"{path}.arch.{HEAD_DIM}", 1) if HEAD_DIM in a else 0
        given = Arch(**{k: r.int_(a[k], f"{path}.arch.{k}", 1) for k in ARCH_SIZES}, **flags, head_size=head)
    if hf is not None:
        try:
            arch = hf_arch(hf)
        except RpegError as e:
            raise r.error(_join(path, "hf"), e.message) from None
        if given is not None and given != arch:
            raise r.error(_join(path, "arch"), f"differs from the config.json of hf = \"{hf}\" ({arch})")
    elif given is not None:
        arch = given
    elif preset is not None and lookup_preset(preset) is not None:
        arch = lookup_preset(preset)
    else:
        raise r.error(path, "missing key 'arch'; give the architecture or a known 'preset' name")
    return Model(
        name=r.str_(o["name"], _join(path, "name")),
        kind=r.str_(o["kind"], _join(path, "kind"), MODEL_KINDS),
        trainable=r.bool_(o["trainable"], _join(path, "trainable")),
        arch=arch,
        preset=preset,
        hf=hf,
        loc=r.loc,
    )


def _read_verifier(r: _Reader, v: Any, path: str) -> Verifier:
    """A host reward function (rpeg.verifier); whether its `fn` resolves is the runtime's check."""
    o = r.obj(v, path, ("name", "fn"), ("per_response",))
    per_response = None
    if "per_response" in o:  # absent: the hardware profile's calibrated time (null is not a number: an error)
        per_response = r.float_(o["per_response"], _join(path, "per_response"), positive=True)
    return Verifier(
        name=r.str_(o["name"], _join(path, "name")),
        fn=r.str_(o["fn"], _join(path, "fn")),
        per_response=per_response,
        loc=r.at(path),  # verify-wellformed's errors about the verifier point at it in the file
    )


def _read_edge(r: _Reader, v: Any, path: str) -> Edge:
    o = r.obj(v, path, ("src", "dst", "container"))
    return Edge(
        src=r.str_(o["src"], _join(path, "src")),
        dst=r.str_(o["dst"], _join(path, "dst")),
        container=r.str_(o["container"], _join(path, "container")),
        loc=r.loc,
    )


def _read_container(r: _Reader, v: Any, path: str) -> Container:
    o = r.obj(v, path, ("name", "elem"), ("dims", "model", "bytes_per_elem"))
    return Container(
        name=r.str_(o["name"], _join(path, "name")),
        elem=r.str_(o["elem"], _join(path, "elem"), ELEMENT_KINDS + ("weights",)),
        dims=tuple(r.items(o, "dims", path, r.expr)),
        model=r.opt(o.get("model"), _join(path, "model"), r.str_),
        bytes_per_elem=r.opt(o.get("bytes_per_elem"), _join(path, "bytes_per_elem"), lambda x, p: r.int_(x, p, 1)),
        loc=r.loc,
    )


def _read_vertex(r: _Reader, v: Any, path: str) -> Vertex:
    o = r.obj(v, path, ("name", "role", "model"), ("reads", "writes"))
    return Vertex(
        name=r.str_(o["name"], _join(path, "name")),
        role=r.str_(o["role"], _join(path, "role"), ROLES),
        model=r.str_(o["model"], _join(path, "model")),
        reads=tuple(r.items(o, "reads", path, r.str_)),
        writes=tuple(r.items(o, "writes", path, r.str_)),
        loc=r.loc,
    )


def _read_quantile(r: _Reader, v: Any, path: str) -> Quantile:
    o = r.obj(v, path, ("f", "tokens"))
    return Quantile(f=r.float_(o["f"], _join(path, "f"), positive=True, maximum=1.0),
                    tokens=r.expr(o["tokens"], _join(path, "tokens")), loc=r.loc)


def _read_graph(r: _Reader, v: Any, path: str) -> Graph:
    o = r.obj(
        v, path, ("name", "containers", "vertices"),
        ("inputs", "outputs", "data_edges", "pub_edges", "staleness", "quantiles", "algorithm"),
    )
    staleness = o.get("staleness", {})
    if not isinstance(staleness, dict):
        raise r.error(_join(path, "staleness"), f"expected an object {{model: tau}}, got {_kind(staleness)}")
    edge = lambda x, p: _read_edge(r, x, p)  # noqa: E731
    return Graph(
        name=r.str_(o["name"], _join(path, "name")),
        containers=tuple(r.items(o, "containers", path, lambda x, p: _read_container(r, x, p))),
        inputs=tuple(r.items(o, "inputs", path, r.str_)),
        outputs=tuple(r.items(o, "outputs", path, r.str_)),
        vertices=tuple(r.items(o, "vertices", path, lambda x, p: _read_vertex(r, x, p))),
        data_edges=tuple(r.items(o, "data_edges", path, edge)),
        pub_edges=tuple(r.items(o, "pub_edges", path, edge)),
        staleness=tuple((m, r.int_(t, f"{path}.staleness.{m}", 0)) for m, t in staleness.items()),
        quantiles=tuple(r.items(o, "quantiles", path, lambda x, p: _read_quantile(r, x, p))),
        loc=r.loc,
        staleness_loc=r.loc,
        quantiles_loc=r.loc,
        algorithm=r.opt(o.get("algorithm"), _join(path, "algorithm"), lambda x, p: _algorithm(r, x, p)),
        algorithm_loc=r.loc,
    )



def _algorithm(r: _Reader, value: Any, path: str) -> str:
    """A graph's algorithm: a built-in one or a plugin's (core/ir/algorithms.py)."""
    name = r.str_(value, path)
    if algorithm_family(name) is None:
        r.str_(name, path, algorithm_names())  # the error naming the choices
    return name


def _read_cluster(r: _Reader, v: Any, path: str) -> Cluster:
    o = r.obj(v, path, ("name", "racks", "nodes", "gpus", "hardware"))
    cluster = Cluster(
        name=r.str_(o["name"], _join(path, "name")),
        racks=r.int_(o["racks"], _join(path, "racks"), 1),
        nodes=r.int_(o["nodes"], _join(path, "nodes"), 1),
        gpus=r.int_(o["gpus"], _join(path, "gpus"), 1),
        hardware=r.str_(o["hardware"], _join(path, "hardware")),
        loc=r.loc,
    )
    problem = cluster.size_problem()
    if problem:
        raise r.error(path, problem)
    return cluster


def _read_strategy(r: _Reader, o: dict, path: str, required: bool) -> Optional[Strategy]:
    values = {k: o.get(k) for k in _STRATEGY_KEYS}
    if all(x is None for x in values.values()) and not required:
        if o.get("train") is not None:
            raise r.error(_join(path, "train"), "training fields need a strategy: give dp, pp, tp and mb too")
        return None
    missing = [k for k, x in values.items() if x is None]
    if missing:
        raise r.error(path, f"{', '.join(missing)} missing: give all of dp, pp, tp, mb (or none of them)")
    return Strategy(**{k: r.int_(x, _join(path, k), 1) for k, x in values.items()}, train=_read_train(r, o, path))


def _read_train(r: _Reader, o: dict, path: str) -> TrainSpec:
    """The optional "train" object of a workload, placement or node (module docstring: TRAIN)."""
    if o.get("train") is None:
        return TrainSpec()
    tp = _join(path, "train")
    t = r.obj(o["train"], tp, (), TRAIN_FIELDS)
    if not t:
        raise r.error(tp, "an empty training object; leave \"train\" out or state a field")
    values: dict[str, Any] = {}
    for key, x in t.items():
        kp = _join(tp, key)
        if key == "zero":
            values[key] = r.int_(x, kp, 0)
            if values[key] not in TRAIN_CHOICES[key]:
                raise r.error(kp, f"expected a ZeRO stage 0, 1 or 2, got {values[key]}")
        else:
            values[key] = r.str_(x, kp, TRAIN_CHOICES[key])
    return TrainSpec(**values)


def _read_alloc(r: _Reader, v: Any, path: str) -> Alloc:
    o = r.obj(v, path, ("origin", "extent"))
    return _box(r, o, path)


def _box(r: _Reader, o: dict, path: str) -> Alloc:
    return Alloc(origin=r.triple(o["origin"], _join(path, "origin"), 0),
                 extent=r.triple(o["extent"], _join(path, "extent"), 1))


def _read_plan(r: _Reader, v: Any, path: str) -> Plan:
    o = r.obj(v, path, ("name", "graph", "cluster", "placements"), ("pools", "fusions"))
    placements = []
    for i, x in enumerate(r.list_(o["placements"], _join(path, "placements"))):
        pp = f"{path}.placements[{i}]"
        po = r.obj(x, pp, ("vertex", "origin", "extent") + _STRATEGY_KEYS, ("train",))
        alloc = _box(r, po, pp)
        placements.append(
            Placement(vertex=r.str_(po["vertex"], _join(pp, "vertex")), alloc=alloc,
                      strategy=_read_strategy(r, po, pp, required=True), loc=r.loc)
        )
    return Plan(
        name=r.str_(o["name"], _join(path, "name")),
        graph=r.str_(o["graph"], _join(path, "graph")),
        cluster=r.str_(o["cluster"], _join(path, "cluster")),
        placements=tuple(placements),
        loc=r.loc,
        fusions=tuple(_read_fuse(r, f, fp) for f, fp in _listed(r, o.get("fusions", []), _join(path, "fusions"))),
        pools=tuple(r.items(o, "pools", path, lambda x, p: _read_pool(r, x, p))),
    )


def _read_pool(r: _Reader, v: Any, path: str) -> Pool:
    """A verify vertex's placement: `size` worker processes on the host (`@v pool = N`)."""
    o = r.obj(v, path, ("vertex", "size"))
    return Pool(vertex=r.str_(o["vertex"], _join(path, "vertex")), size=r.int_(o["size"], _join(path, "size"), 1),
                loc=r.at(path))


def _read_fuse(r: _Reader, v: Any, path: str) -> Fuse:
    names = tuple(r.str_(x, xp) for x, xp in _listed(r, v, path))
    if len(names) < 2:
        raise r.error(path, f"a fusion names at least two training vertices, got {len(names)}")
    return Fuse(names, loc=r.loc)


def _listed(r: _Reader, v: Any, path: str) -> list[tuple[Any, str]]:
    """The elements of list `v` with their paths."""
    return [(x, f"{path}[{i}]") for i, x in enumerate(r.list_(v, path))]


def _read_fusion(r: _Reader, v: Any, path: str, node_ids: set[str]) -> ExecFusion:
    o = r.obj(v, path, ("id", "members", "stages"))
    members = []
    for m, mp in _listed(r, o["members"], _join(path, "members")):
        name = r.str_(m, mp)
        if name not in node_ids:
            raise r.error(mp, f"unknown node id '{name}'; a fusion's members are nodes of 'nodes'")
        members.append(name)
    if len(members) < 2:
        raise r.error(_join(path, "members"), f"a fusion has at least two members, got {len(members)}")
    stages = []
    for s, (order, sp) in enumerate(_listed(r, o["stages"], _join(path, "stages"))):
        tasks = []
        for t, tp in _listed(r, order, sp):
            try:
                tasks.append(microtask_of(r.str_(t, tp), s))
            except ValueError:
                raise r.error(tp, f"expected a microtask such as \"F0.1\" (member 0's forward of microbatch 1), "
                                  f"got {_kind(t)}") from None
        stages.append(tuple(tasks))
    return ExecFusion(r.str_(o["id"], _join(path, "id")), tuple(members), tuple(stages), loc=r.at(path))


_NODE_REQUIRED = ("id", "kind", "step")
_NODE_OPTIONAL = (
    "vertex", "phase", "role", "model", "devices", "dp", "pp", "tp", "mb", "train", "bytes", "version_in", "version_out",
    "data_in", "data_out", "order", "container", "fraction", "nphases", "pool", "shares", "alloc", "src_alloc",
    "src_strategy", "time", "start", "finish",
)


def _read_node(r: _Reader, v: Any, path: str, cluster: Optional[Cluster], loc: Optional[Loc] = None) -> ExecNode:
    o = r.obj(v, path, _NODE_REQUIRED, _NODE_OPTIONAL)
    node_id = r.str_(o["id"], _join(path, "id"))
    alloc = r.opt(o.get("alloc"), _join(path, "alloc"), lambda x, p: _read_alloc(r, x, p))
    devices = o.get("devices")
    if devices is not None:
        ids = tuple(r.int_(x, f"{path}.devices[{i}]", 0) for i, x in enumerate(r.list_(devices, _join(path, "devices"))))
        alloc = _check_devices(r, ids, alloc, cluster, _join(path, "devices"))
    src_strategy = None
    if o.get("src_strategy") is not None:
        sp = _join(path, "src_strategy")
        src_strategy = _read_strategy(r, r.obj(o["src_strategy"], sp, _STRATEGY_KEYS), sp, required=True)
    opt_time = lambda key: r.opt(o.get(key), _join(path, key), lambda x, p: r.float_(x, p, minimum=0.0))  # noqa: E731
    opt_int = lambda key, low: r.opt(o.get(key), _join(path, key), lambda x, p: r.int_(x, p, low))  # noqa: E731
    opt_str = lambda key, choices=None: r.opt(  # noqa: E731
        o.get(key), _join(path, key), lambda x, p: r.str_(x, p, choices)
    )
    start, finish = opt_time("start"), opt_time("finish")
    if start is not None and finish is not None and finish < start:
        raise r.error(_join(path, "finish"), f"finish {finish!r} is before start {start!r}; a node ends after it starts")
    return ExecNode(
        id=node_id,
        kind=r.str_(o["kind"], _join(path, "kind"), NODE_KINDS),
        step=r.int_(o["step"], _join(path, "step"), 0),
        order=r.int_(o.get("order", 0), _join(path, "order"), 0),
        vertex=opt_str("vertex"),
        role=opt_str("role", ROLES),
        model=opt_str("model"),
        container=opt_str("container"),
        phase=opt_int("phase", 1),
        nphases=opt_int("nphases", 1),
        pool=opt_int("pool", 1),
        shares=tuple(r.int_(x, f"{path}.shares[{i}]", 0)
                     for i, x in enumerate(r.list_(o.get("shares", []), _join(path, "shares")))),
        alloc=alloc,
        strategy=_read_strategy(r, o, path, required=False),
        src_alloc=r.opt(o.get("src_alloc"), _join(path, "src_alloc"), lambda x, p: _read_alloc(r, x, p)),
        src_strategy=src_strategy,
        bytes=r.int_(o.get("bytes", 0), _join(path, "bytes"), 0),
        fraction=r.opt(o.get("fraction"), _join(path, "fraction"),
                       lambda x, p: r.float_(x, p, positive=True, maximum=1.0)),
        version_in=r.version_map(o.get("version_in", {}), _join(path, "version_in")),
        version_out=r.version_map(o.get("version_out", {}), _join(path, "version_out")),
        data_in=_read_data_refs(r, o, "data_in", path),
        data_out=_read_data_refs(r, o, "data_out", path),
        time=opt_time("time"),
        start=start,
        finish=finish,
        loc=loc or r.loc,
    )


def _read_data_refs(r: _Reader, o: dict, key: str, path: str) -> tuple[DataRef, ...]:
    refs = r.items(o, key, path, lambda x, p: _read_data_ref(r, x, p))
    for i, d in enumerate(refs):
        if d in refs[:i]:
            raise r.error(f"{_join(path, key)}[{i}]", f"%{d.container}"
                          + (f" phase {d.phase}" if d.phase is not None else "") + " is bound twice; keep one")
    return tuple(refs)


def _read_data_ref(r: _Reader, v: Any, path: str) -> DataRef:
    o = r.obj(v, path, ("container",), ("phase",))
    return DataRef(r.str_(o["container"], _join(path, "container")),
                   r.opt(o.get("phase"), _join(path, "phase"), lambda x, p: r.int_(x, p, 1)))


def _check_devices(
    r: _Reader, ids: tuple[int, ...], alloc: Optional[Alloc], cluster: Optional[Cluster], path: str
) -> Alloc:
    """The allocation the flat ids describe; it must agree with an explicit "alloc"."""
    if cluster is None:
        if alloc is None:
            raise r.error(path, "flat device ids need the module's 'cluster' to be read; add the cluster or give 'alloc'")
        return alloc
    if alloc is not None:
        if ids != alloc.devices(cluster):
            raise r.error(path, f"the device list disagrees with 'alloc' {alloc.origin} extent {alloc.extent}; "
                                "fix one of them (or drop 'devices')")
        return alloc
    if not ids:
        raise r.error(path, "an empty device list describes no allocation; give at least one device or null")
    n = cluster.num_devices
    bad = [d for d in ids if d >= n]
    if bad:
        raise r.error(path, f"device {bad[0]} is outside cluster {cluster.name} ({n} devices)")
    points = [coords(d, cluster) for d in ids]
    origin = tuple(min(c[i] for c in points) for i in range(3))
    extent = tuple(max(c[i] for c in points) - origin[i] + 1 for i in range(3))
    box = Alloc(origin=origin, extent=extent)  # type: ignore[arg-type]
    if box.devices(cluster) != ids:
        raise r.error(path, "the devices do not form a contiguous box listed in rack, node, gpu order; "
                            "an allocation is D(origin, extent) (Def. A.4)")
    return box


def _read_exec(r: _Reader, top: dict, cluster: Optional[Cluster]) -> ExecGraph:
    raw_nodes = r.list_(top["nodes"], "nodes")
    # Later errors about a node or an edge (passes, the runtime) point at it in the file.
    node_locs = r.element_locs("nodes", len(raw_nodes))
    nodes = tuple(_read_node(r, v, f"nodes[{i}]", cluster, node_locs[i]) for i, v in enumerate(raw_nodes))
    seen: set[str] = set()
    for i, n in enumerate(nodes):
        if n.id in seen:
            raise r.error(f"nodes[{i}].id", f"node id '{n.id}' is used twice; node ids must be unique")
        seen.add(n.id)
    raw_edges = r.list_(top["edges"], "edges")
    attrs = r.list_(top["edge_attrs"], "edge_attrs") if "edge_attrs" in top else None
    if attrs is not None and len(attrs) != len(raw_edges):
        raise r.error("edge_attrs", f"has {len(attrs)} entries but 'edges' has {len(raw_edges)}; give one per edge")
    edges = []
    edge_locs = r.element_locs("edges", len(raw_edges))
    for i, e in enumerate(raw_edges):
        path = f"edges[{i}]"
        if not isinstance(e, list) or len(e) != 2:
            raise r.error(path, f"expected [src_id, dst_id], got {_kind(e)}")
        src, dst = r.str_(e[0], f"{path}[0]"), r.str_(e[1], f"{path}[1]")
        for j, end in enumerate((src, dst)):
            if end not in seen:
                raise r.error(f"{path}[{j}]", f"unknown node id '{end}'; declare it in 'nodes' or remove the edge")
        kind, container = "dep", None
        if attrs is not None:
            ap = f"edge_attrs[{i}]"
            ao = r.obj(attrs[i], ap, ("kind",), ("container",))
            kind = r.str_(ao["kind"], _join(ap, "kind"), EDGE_KINDS)
            container = r.opt(ao.get("container"), _join(ap, "container"), r.str_)
        edges.append(ExecEdge(src=src, dst=dst, kind=kind, container=container, loc=edge_locs[i]))
    steps = r.int_(top["steps"], "steps", 1)
    _check_steps(r, nodes, steps)
    _check_acyclic(r, nodes, edges)
    return ExecGraph(
        graph=r.str_(top["graph"], "graph"),
        steps=steps,
        nodes=nodes,
        edges=tuple(edges),
        lowered=r.bool_(top.get("lowered", False), "lowered"),
        memory=r.opt(top.get("memory"), "memory", lambda v, p: _read_memory(r, v, p)),
        schedule=r.opt(top.get("schedule"), "schedule", lambda v, p: _read_schedule(r, v, p)),
        fusions=tuple(_read_fusion(r, f, fp, seen) for f, fp in _listed(r, top.get("fusions", []), "fusions")),
        loc=r.at("steps"),
    )


def _check_steps(r: _Reader, nodes: tuple[ExecNode, ...], steps: int) -> None:
    """The nodes' steps run up to steps-1 exactly (a module without nodes has no steps to check)."""
    if not nodes:
        return
    present = {n.step for n in nodes}
    for i, n in enumerate(nodes):
        if n.step >= steps:
            raise r.error(f"nodes[{i}].step", f"node {n.id} is in step {n.step}, but 'steps' is {steps} "
                                              f"(steps 0..{steps - 1}); fix the step or 'steps'")
    last = max(present)
    if last != steps - 1:
        raise r.error("steps", f"'steps' is {steps}, but the nodes end at step {last} (they cover {last + 1} "
                               "step(s)); set 'steps' to the steps the nodes were unrolled for")


def _check_acyclic(r: _Reader, nodes: tuple[ExecNode, ...], edges: list[ExecEdge]) -> None:
    """The exec graph is a DAG (Kahn's algorithm); a cycle is reported at one of its edges."""
    succs: dict[str, list[int]] = {n.id: [] for n in nodes}
    indegree = {n.id: 0 for n in nodes}
    for i, e in enumerate(edges):
        succs[e.src].append(i)
        indegree[e.dst] += 1
    ready = [i for i, d in indegree.items() if d == 0]
    while ready:
        u = ready.pop()
        for i in succs[u]:
            v = edges[i].dst
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    left = {i for i, d in indegree.items() if d > 0}
    if not left:
        return
    # Every node left has a predecessor left: walk back until a node repeats to name one cycle.
    preds: dict[str, int] = {}
    for i, e in enumerate(edges):
        if e.src in left and e.dst in left:
            preds.setdefault(e.dst, i)
    cycle: list[str] = []
    at = next(iter(sorted(left)))
    while at not in cycle:
        cycle.append(at)
        at = edges[preds[at]].src
    cycle = cycle[cycle.index(at):][::-1]
    first = preds[cycle[0]]
    text = " -> ".join(cycle + [cycle[0]])
    raise r.error(f"edges[{first}]", f"the exec graph has a dependency cycle {text}; remove an edge so it is acyclic")


def _device_map(r: _Reader, v: Any, path: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(v, dict):
        raise r.error(path, f"expected an object {{device: bytes}}, got {_kind(v)}")
    out = []
    for key, b in v.items():
        if not re.fullmatch(r"[0-9]+", key):
            raise r.error(_join(path, key), f"'{key}' is not a flat device id (a non-negative integer)")
        out.append((int(key), r.float_(b, _join(path, key), minimum=0.0)))
    return tuple(out)


def _read_memory(r: _Reader, v: Any, path: str) -> MemoryReport:
    o = r.obj(v, path, ("peak", "persistent", "transient", "m_eff", "r_peak", "feasible"))
    return MemoryReport(
        peak=_device_map(r, o["peak"], _join(path, "peak")),
        persistent=_device_map(r, o["persistent"], _join(path, "persistent")),
        transient=_device_map(r, o["transient"], _join(path, "transient")),
        m_eff=r.float_(o["m_eff"], _join(path, "m_eff"), minimum=0.0),
        r_peak=r.float_(o["r_peak"], _join(path, "r_peak"), minimum=0.0),
        feasible=r.bool_(o["feasible"], _join(path, "feasible")),
    )


def _read_schedule(r: _Reader, v: Any, path: str) -> ScheduleReport:
    keys = ("makespan", "score", "score_pen", "util", "p_eff")
    o = r.obj(v, path, keys)
    signed = ("score", "score_pen")  # a score may be negative; the times and ratios may not
    return ScheduleReport(**{k: r.float_(o[k], _join(path, k), minimum=None if k in signed else 0.0) for k in keys})
