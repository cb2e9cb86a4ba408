"""Runtime traces: one JSON object per line (paper Sec. VII, "Execution verification"; Alg. 2 output).

A trace identifies the plan it ran by hash and records, per node, when it was dispatched, when it
started (its last worker began it) and finished (the last worker that ends it finished: every worker
of an op, the receivers of a transfer), the devices R(x) and worker ranks it held, the layout it ran with, the
parameter versions it consumed and produced per model, the bytes it moved and the artifacts it bound
and left; plus every install and release of an artifact, a record per completed RL step and a final
summary. `rpegc.runtime.verify` checks a trace against its plan.

Record types, in file order:

    {"type": "header", "format": "rpeg-trace/1", "plan_hash": str, "plan_file": str, "backend": str,
     "clock": "sim" | "wall", "steps": int, "plan_steps": int, "policy": "plan" | "alg2",
     "reserve": "destination" | "endpoints", "workers": {device: rank}, "options": {...}}
    {"type": "install", "artifact": label, "time": float}
    {"type": "node", "id": str, "kind": str, "step": int, "dispatch": float, "start": float,
     "finish": float, "devices": [int], "workers": [int], "strategy": [dp, pp, tp, mb] | null,
     "consumed": {model: version}, "produced": {model: version}, "bytes": int,
     "inputs": [label], "outputs": [label],                              // in completion order
     "microtasks": [[rank, stage, "F" | "B", microbatch, start, finish]], // optional: a fused member's, per rank
     "waited": float,  // optional: s the node's worker thread waited for a core while it ran (its ranks' most)
     "witness": [float]}  // optional: s of CPU time of each speed witness its workers and pool processes ran
    {"type": "release", "artifact": label, "time": float, "after": node id | null}
    {"type": "step", "step": int, "finish": float, "predicted_finish": float | null, "nodes": int}
    {"type": "summary", "steps": int, "nodes": int, "makespan": float,
     "predicted_makespan": float | null, "wall_s": float, "peak_memory": float}

Artifact labels are `rpegc.runtime.plan.Artifact.label`. Times are seconds on the backend clock.
The header's options of a torch run also record the host (`rpeg-run`): "local_workers" (worker
processes launched on this host), "host_cores" (the cores they share), "plan_nodes" (the cluster nodes the plan's
devices lie on) and "dist_backend" (gloo or nccl); `rpegc.runtime.report` labels a run with more local workers than
cores, or with the plan's nodes all launched on this host, oversubscribed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional, TextIO

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.inputs import read_input_text
from rpegc.outputs import PendingOutput
from rpegc.syntax import json_text

FORMAT = "rpeg-trace/1"


@dataclass(frozen=True)
class TraceHeader:
    plan_hash: str
    plan_file: str
    backend: str
    clock: str
    steps: int
    plan_steps: int
    policy: str
    reserve: str
    workers: dict[int, int]
    options: dict[str, Any] = field(default_factory=dict)
    first_step: int = 0  # > 0: resumed from a checkpoint; steps before it ran in an earlier trace


@dataclass(frozen=True)
class NodeRecord:
    id: str
    kind: str
    step: int
    dispatch: float
    start: float
    finish: float
    devices: tuple[int, ...]
    workers: tuple[int, ...]
    strategy: Optional[tuple[int, int, int, int]]
    consumed: tuple[tuple[str, int], ...]
    produced: tuple[tuple[str, int], ...]
    bytes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    line: int = 0  # line in the trace file (0: built in memory)
    # a fused member's microtasks as its workers ran them: (rank, stage, "F" | "B", microbatch, start, finish)
    microtasks: tuple[tuple[int, int, str, int, float, float], ...] = ()
    # s its worker thread was runnable but waited for a core while it ran (the most of its ranks'; None: not measured,
    # a simulated run, a fused member or a host without per-thread scheduler statistics)
    waited: Optional[float] = None
    # s of CPU time of each speed witness (runtime/speed_probe.witness_seconds) its ranks ran as they ended it, or a
    # verifier pool's processes as they ended their shares: how fast their cores ran (empty: none ran)
    witness: tuple[float, ...] = ()


@dataclass(frozen=True)
class ArtifactEvent:
    """An install (after=None, at launch) or a release (after: the completion that triggered it)."""

    kind: str  # "install" | "release"
    artifact: str
    time: float
    after: Optional[str] = None
    line: int = 0


@dataclass(frozen=True)
class StepRecord:
    step: int
    finish: float
    predicted_finish: Optional[float]
    nodes: int


@dataclass
class Trace:
    header: TraceHeader
    nodes: dict[str, NodeRecord]  # completion order
    events: list[ArtifactEvent]
    steps: list[StepRecord]
    summary: Optional[dict]
    file: str = "<trace>"

    @property
    def makespan(self) -> float:
        return max((r.finish for r in self.nodes.values()), default=0.0)


# ----------------------------------------------------------------------------------------------
# Records (the controller builds these dicts; files hold one per line)
# ----------------------------------------------------------------------------------------------


def header_record(h: TraceHeader) -> dict:
    return {
        "type": "header", "format": FORMAT, "plan_hash": h.plan_hash, "plan_file": h.plan_file,
        "backend": h.backend, "clock": h.clock, "steps": h.steps, "plan_steps": h.plan_steps,
        "policy": h.policy, "reserve": h.reserve, "workers": {str(d): w for d, w in h.workers.items()},
        "options": h.options, "first_step": h.first_step,
    }


def node_record(r: NodeRecord) -> dict:
    return {
        "type": "node", "id": r.id, "kind": r.kind, "step": r.step, "dispatch": r.dispatch, "start": r.start,
        "finish": r.finish, "devices": list(r.devices), "workers": list(r.workers),
        "strategy": list(r.strategy) if r.strategy is not None else None,
        "consumed": dict(r.consumed), "produced": dict(r.produced), "bytes": r.bytes,
        "inputs": list(r.inputs), "outputs": list(r.outputs),
        **({"microtasks": [list(t) for t in r.microtasks]} if r.microtasks else {}),
        **({"waited": r.waited} if r.waited is not None else {}),
        **({"witness": list(r.witness)} if r.witness else {}),
    }


def event_record(e: ArtifactEvent) -> dict:
    out: dict[str, Any] = {"type": e.kind, "artifact": e.artifact, "time": e.time}
    if e.kind == "release":
        out["after"] = e.after
    return out


def step_record(s: StepRecord) -> dict:
    return {"type": "step", "step": s.step, "finish": s.finish, "predicted_finish": s.predicted_finish,
            "nodes": s.nodes}


def trace_records(t: Trace) -> list[dict]:
    """The records of `t` in a valid file order (header, installs, nodes/releases/steps, summary)."""
    out = [header_record(t.header)]
    out += [event_record(e) for e in t.events if e.kind == "install"]
    out += [node_record(r) for r in t.nodes.values()]
    out += [event_record(e) for e in t.events if e.kind == "release"]
    out += [step_record(s) for s in t.steps]
    if t.summary is not None:
        out.append({"type": "summary", **t.summary})
    return out


class TraceWriter:
    """Appends records to a JSON-lines trace as they happen, into a temporary file beside `path`
    (rpegc/outputs.py): `close()` puts the finished trace at `path`, `discard()` drops it, so a run
    that stops with an error leaves no partial trace and an earlier trace at `path` intact. A FIFO or
    /dev/null is streamed to directly."""

    def __init__(self, path: str):
        self.path = path
        self._pending = PendingOutput(path, "the trace")
        try:
            self._f: Optional[TextIO] = open(self._pending.path, "w", encoding="utf-8")
        except OSError as e:
            self._pending.discard()
            raise self._pending.error(e.strerror or str(e)) from None

    def __call__(self, record: dict) -> None:
        assert self._f is not None
        try:
            text = json_text.dumps(record, separators=(",", ":"))
        except json_text.NonFiniteError as err:
            raise RpegError(Loc(self.path, 0, 0), f"cannot write a '{record.get('type')}' record: {err} "
                                                  "(a backend reported a NaN or infinite value)") from None
        try:
            self._f.write(text + "\n")
            self._f.flush()
        except OSError as e:
            raise self._pending.error(e.strerror or str(e)) from None

    def close(self) -> None:
        """The run completed: the trace becomes `path`."""
        if self._f is None:
            return
        f, self._f = self._f, None
        try:
            f.close()
        except OSError as e:
            self._pending.discard()
            raise self._pending.error(e.strerror or str(e)) from None
        self._pending.commit()

    def discard(self) -> None:
        """The run failed: no trace file."""
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError:
                pass  # being dropped anyway
        self._pending.discard()


def write_trace(t: Trace, path: str) -> None:
    w = TraceWriter(path)
    try:
        for r in trace_records(t):
            w(r)
    except BaseException:
        w.discard()
        raise
    w.close()


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


MAX_TRACE_BYTES = 4 << 30  # ~500 bytes a node: millions of nodes


def read_trace(path: str) -> Trace:
    lines = read_input_text(path, "the trace", MAX_TRACE_BYTES).splitlines()
    records = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        records.append((no, json_text.loads(line, path, line=no), line))
    return trace_from_records(records, path)


# The fields of each record type: (required, optional). Anything else in a record is an error.
FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "header": (("type", "format", "plan_hash", "plan_file", "backend", "clock", "steps", "plan_steps", "policy",
                "reserve", "workers"), ("options", "first_step")),
    "install": (("type", "artifact", "time"), ()),
    "release": (("type", "artifact", "time"), ("after",)),
    "node": (("type", "id", "kind", "step", "dispatch", "start", "finish", "devices", "workers", "consumed",
              "produced", "bytes"), ("strategy", "inputs", "outputs", "microtasks", "waited",
                                    "witness")),
    "step": (("type", "step", "finish", "nodes"), ("predicted_finish",)),
    "summary": (("type", "steps", "nodes", "makespan"), ("predicted_makespan", "wall_s", "peak_memory")),
}


def trace_from_records(records: list[tuple], file: str = "<trace>") -> Trace:
    """Validate and assemble (line, record) or (line, record, line text) tuples; a bad record raises
    RpegError at `file:line:col`, the column of the bad value when the line's text is given."""
    if not records:
        raise RpegError(Loc(file, 0, 0), "the trace is empty; it must start with a header record")
    header: Optional[TraceHeader] = None
    nodes: dict[str, NodeRecord] = {}
    events: list[ArtifactEvent] = []
    steps: list[StepRecord] = []
    summary = None
    for entry in records:
        line, rec = entry[0], entry[1]
        r = _Rec(file, line, rec, entry[2] if len(entry) > 2 else None)
        kind = r.text("type")
        if kind not in FIELDS:
            raise r.error(f"unknown record type '{kind}'; expected header, install, node, release, step or summary",
                          "type")
        if header is None and kind != "header":
            raise r.error("the first record must be the header ({\"type\": \"header\", ...})")
        r.known(*FIELDS[kind])
        if kind == "header":
            if header is not None:
                raise r.error("a second header; a trace describes one run")
            header = _read_header(r)
        elif kind == "node":
            n = _read_node(r)
            if n.id in nodes:
                raise r.error(f"node {n.id} is recorded twice (also on line {nodes[n.id].line}); each node runs once",
                              "id")
            nodes[n.id] = n
        elif kind in ("install", "release"):
            after = r.opt_str("after") if kind == "release" else None
            events.append(ArtifactEvent(kind, r.text("artifact"), r.time("time"), after, line))
        elif kind == "step":
            predicted = None if r.raw.get("predicted_finish") is None else r.time("predicted_finish")
            steps.append(StepRecord(r.integer("step"), r.time("finish"), predicted, r.integer("nodes")))
        elif kind == "summary":
            for key in ("steps", "nodes"):
                r.integer(key)
            for key in ("makespan", "predicted_makespan", "wall_s", "peak_memory"):
                if r.raw.get(key) is not None:
                    r.time(key)
            summary = {k: v for k, v in r.raw.items() if k != "type"}
    assert header is not None
    return Trace(header=header, nodes=nodes, events=events, steps=steps, summary=summary, file=file)


def _short(v: Any) -> str:
    """A bounded description of a JSON value for messages (a repr could be huge or deeply nested)."""
    if isinstance(v, (list, dict)):
        return f"a list of {len(v)}" if isinstance(v, list) else "an object"
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class _Rec:
    def __init__(self, file: str, line: int, raw: Any, text: Optional[str] = None):
        self.file, self.line, self.source = file, line, text
        if not isinstance(raw, dict):
            raise self.error("a trace record must be a JSON object")
        self.raw = raw

    def error(self, message: str, key: Optional[str] = None) -> RpegError:
        col = 1
        if key is not None and self.source is not None:
            col = json_text.locate(self.source, key)[1]
        return RpegError(Loc(self.file, self.line, col), message)

    def known(self, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
        kind = self.raw.get("type")
        for key in self.raw:
            if key not in required and key not in optional:
                raise self.error(f"unknown field '{key}' in a '{kind}' record; it has "
                                 f"{', '.join(required + optional)}", key)
        for key in required:
            if key not in self.raw:
                raise self.error(f"'{kind}' record lacks '{key}'")

    def get(self, key: str) -> Any:
        if key not in self.raw:
            raise self.error(f"'{self.raw.get('type', '?')}' record lacks '{key}'")
        return self.raw[key]

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise self.error(f"'{key}' must be a string, got {_short(v)}", key)
        return v

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        v = self.text(key)
        if v not in choices:
            raise self.error(f"'{key}' is '{v}'; expected {' or '.join(choices)}", key)
        return v

    def opt_str(self, key: str) -> Optional[str]:
        v = self.raw.get(key)
        if v is not None and not isinstance(v, str):
            raise self.error(f"'{key}' must be a string or null, got {_short(v)}", key)
        return v

    def integer(self, key: str, minimum: int = 0) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.error(f"'{key}' must be an integer >= {minimum}, got {_short(v)}", key)
        return v

    def time(self, key: str) -> float:
        """A finite, non-negative number (times, bytes of memory)."""
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise self.error(f"'{key}' must be a finite number >= 0, got {_short(v)}", key)
        return float(v)

    number = time

    def times(self, key: str) -> tuple[float, ...]:
        """An optional list of finite, non-negative numbers (empty where left out)."""
        v = self.raw.get(key, [])
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                                          or x < 0 for x in v):
            raise self.error(f"'{key}' must be a list of finite numbers >= 0", key)
        return tuple(float(x) for x in v)

    def ints(self, key: str, minimum: int = 0) -> tuple[int, ...]:
        v = self.get(key)
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < minimum for x in v):
            raise self.error(f"'{key}' must be a list of integers >= {minimum}", key)
        return tuple(v)

    def strs(self, key: str) -> tuple[str, ...]:
        v = self.raw.get(key, [])
        if not isinstance(v, list) or any(not isinstance(x, str) for x in v):
            raise self.error(f"'{key}' must be a list of strings", key)
        return tuple(v)

    def versions(self, key: str) -> tuple[tuple[str, int], ...]:
        v = self.get(key)
        if not isinstance(v, dict) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v.values()):
            raise self.error(f"'{key}' must be an object {{model: version}} with versions >= 0", key)
        return tuple(v.items())


def _read_header(r: _Rec) -> TraceHeader:
    if r.raw.get("format") != FORMAT:
        raise r.error(f"not an rpeg trace (format {_short(r.raw.get('format'))}, expected '{FORMAT}')", "format")
    workers = r.get("workers")
    if not isinstance(workers, dict):
        raise r.error("'workers' must be an object {device: rank}", "workers")
    wmap = {}
    for d, w in workers.items():
        if not d.isdigit() or isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise r.error("'workers' must map device ids to worker ranks (integers >= 0)", json_text.join("workers", d))
        wmap[int(d)] = w
    options = r.raw.get("options", {})
    if not isinstance(options, dict):
        raise r.error("'options' must be an object", "options")
    first_step = r.raw.get("first_step", 0)  # absent in traces written before resumes were recorded
    if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
        raise r.error("'first_step' must be a non-negative integer", "first_step")
    return TraceHeader(
        plan_hash=r.text("plan_hash"), plan_file=r.text("plan_file"), backend=r.text("backend"),
        clock=r.choice("clock", ("sim", "wall")), steps=r.integer("steps", 1), plan_steps=r.integer("plan_steps", 1),
        policy=r.choice("policy", ("plan", "alg2")), reserve=r.choice("reserve", ("destination", "endpoints")),
        workers=wmap, options=options, first_step=first_step,
    )


def _read_node(r: _Rec) -> NodeRecord:
    strategy = r.raw.get("strategy")
    if strategy is not None:
        if not isinstance(strategy, list) or len(strategy) != 4 or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in strategy):
            raise r.error("'strategy' must be [dp, pp, tp, mb] (integers >= 1) or null", "strategy")
        strategy = tuple(strategy)
    dispatch, start, finish = r.time("dispatch"), r.time("start"), r.time("finish")
    if finish < start:
        raise r.error(f"finish {finish!r} is before start {start!r}; a node ends after it starts", "finish")
    return NodeRecord(
        id=r.text("id"), kind=r.choice("kind", ("op", "comm", "reshard")), step=r.integer("step"), dispatch=dispatch,
        start=start, finish=finish, devices=r.ints("devices"), workers=r.ints("workers"),
        strategy=strategy,
        consumed=r.versions("consumed"), produced=r.versions("produced"), bytes=r.integer("bytes"),
        inputs=r.strs("inputs"), outputs=r.strs("outputs"), line=r.line, microtasks=_read_microtasks(r),
        waited=r.time("waited") if r.raw.get("waited") is not None else None, witness=r.times("witness"),
    )


def _read_microtasks(r: "_Rec") -> tuple[tuple[int, int, str, int, float, float], ...]:
    out = []
    for t in r.raw.get("microtasks", []) if isinstance(r.raw.get("microtasks", []), list) else [None]:
        ok = (isinstance(t, list) and len(t) == 6 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                          for x in (t[0], t[1], t[3]))
              and t[2] in ("F", "B") and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                             and math.isfinite(x) and x >= 0 for x in t[4:]) and t[5] >= t[4])
        if not ok:
            raise r.error("'microtasks' must be a list of [rank, stage, \"F\" or \"B\", microbatch, start, finish] "
                          "with finish >= start >= 0", "microtasks")
        out.append((t[0], t[1], t[2], t[3], float(t[4]), float(t[5])))
    return tuple(out)
