"""Graph realization (paper Sec. VII, Alg. 2 line 1 "RealizeAndValidate"; docs/architecture.md, Runtime).

Loads a lowered exec plan without xDSL (`.json` through `rpegc.syntax.json_form`, otherwise the text
form through `rpegc.syntax.parser`) and builds a `RunPlan`: the executable DAG as plain arrays
(nodes in a topological order, predecessors, successors), the devices every node occupies, and the
artifacts every node reads and writes, as the lowering bound them in the plan (`data_in`/`data_out`,
`version_in`/`version_out`), each located on an allocation:

- data artifacts  D(container, step, phase, allocation): an Op reads and writes them on its
  allocation; a data Comm reads them on its source and writes them on its destination;
- weight copies   W(model, version, allocation): version 0 is installed at launch wherever it is read,
  a training Op writes version k + 1 on its allocation, a weight Comm or a Reshard reads the version
  it names on its source and writes it on its destination.

Validation: the bindings agree with the graph (an Op binds exactly the containers its vertex receives
over data edges and writes, a transfer moves one container or one version, phases exist), and every
input is produced by an ancestor in the DAG (else the plan could read a version or a container before
it exists). Any violation is a located error; the runtime derives nothing the plan does not say.

Consistency (`_check_program`, for the JSON and the text form alike): the nodes' steps run up to
steps-1 exactly, every node's time, start and finish are finite and >= 0 with finish >= start,
payloads are >= 0, and the memory and schedule reports hold finite, non-negative numbers.

Plan hash (`rpeg-plan-hash/3`): sha256 of a canonical JSON of everything a run depends on — the
workload, the models, the cluster shape and hardware, staleness budgets, every node's structure,
placement (allocation, layout, microbatches), payload, versions, data bindings, predicted time, start and finish
(exact float values), every edge with its kind, the memory and schedule reports, (for a scheduled
plan) the planned execution order, and every fusion's members and microtask orders. Any change to the plan, a
re-annotation included, gives another hash, so a trace verifies only against the very plan it ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Optional

from rpegc.core.check.exec_numbers import check_exec
from rpegc.core.check.wellformed import check_program
from rpegc.core.cost.contention import host_of
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.ir.errors import Loc, RpegError, RpegErrors
from rpegc.inputs import MAX_MODULE_BYTES, read_input_text
from rpegc.core.ir.exec_graph import DataRef, ExecNode, microtask_text
from rpegc.core.lower.rules import container_payload, data_bytes, data_read, data_written, phase_shares, weight_bytes
from rpegc.core.ir.program import VERIFY, Program
from rpegc.core.cost.host import alloc_devices, check_pool_transfers
from rpegc.core.ir.geometry import Alloc

HASH_FORMAT = "rpeg-plan-hash/3"
POOL_LABEL = "@pool"  # where an artifact of the host's verifier pool lives
_ARCH_KEYS = ("layers", "hidden", "ffn", "vocab", "heads", "kv_heads")


@dataclass(frozen=True)
class Artifact:
    """Something a node reads or writes that lives on an allocation until it is released."""

    kind: str  # "data" | "weights"
    name: str  # container (data) or model (weights)
    index: int  # step (data) or version (weights)
    phase: Optional[int]  # quantile phase of a data artifact; None: the whole container
    alloc: Optional[Alloc]  # None: the host's verifier pool (cost/host.py)

    @property
    def label(self) -> str:
        """Stable text form used in traces: `data %Y#3.q2 @(0,1,0)+(1,1,4)`, `weights @actor v2 @...`, `data %Y#3
        @pool` (the verifier pool)."""
        where = (POOL_LABEL if self.alloc is None else
                 f"@({','.join(map(str, self.alloc.origin))})+({','.join(map(str, self.alloc.extent))})")
        if self.kind == "data":
            phase = f".q{self.phase}" if self.phase is not None else ""
            return f"data %{self.name}#{self.index}{phase} {where}"
        return f"weights @{self.name} v{self.index} {where}"


@dataclass(frozen=True)
class RunNode:
    """One executable node with everything the controller and the backends need."""

    index: int  # position in RunPlan.nodes (a topological order)
    node: ExecNode
    devices: tuple[int, ...]  # allocation (Op) or destination allocation (Comm/Reshard), flat ids
    src_devices: tuple[int, ...]  # source allocation of a Comm/Reshard; () for Op nodes
    preds: tuple[int, ...]
    succs: tuple[int, ...]
    inputs: tuple[Artifact, ...]  # bound inputs: guaranteed present when all predecessors completed
    outputs: tuple[Artifact, ...]

    @property
    def id(self) -> str:
        return self.node.id

    @property
    def kind(self) -> str:
        return self.node.kind

    @property
    def step(self) -> int:
        return self.node.step

    @property
    def is_transfer(self) -> bool:
        return self.node.kind != "op"


@dataclass(frozen=True)
class RunPlan:
    program: Program
    file: str
    hash: str
    steps: int  # K_run: steps executed (nodes with step < steps)
    plan_steps: int  # K_eval of the plan
    nodes: tuple[RunNode, ...]  # topological order
    index: dict[str, int]
    producers: dict[Artifact, tuple[int, ...]]
    consumers: dict[Artifact, tuple[int, ...]]
    initial: tuple[Artifact, ...]  # version-0 weight copies installed at launch
    retained: frozenset  # artifacts kept to the end: final weights, graph outputs
    artifact_bytes: dict[Artifact, int]
    tau: dict[str, int]
    scheduled: bool  # every node has a planned start and finish
    devices: tuple[int, ...] = field(default=())  # every device some node occupies, ascending
    first_step: int = 0  # > 0: a resumed run; the steps before it ran earlier (`from_step`)

    def node(self, node_id: str) -> RunNode:
        return self.nodes[self.index[node_id]]

    @property
    def model_devices(self) -> tuple[int, ...]:
        """The devices that run models: `devices` without the verifier pool's (the one id past the cluster's)."""
        return tuple(d for d in self.devices if d < self.program.cluster.num_devices)

    @property
    def nodes_used(self) -> int:
        """The cluster's nodes its model devices lie on (each a host of its own to the cost model)."""
        return len({host_of(d, self.program.cluster.gpus) for d in self.model_devices})

    @property
    def predicted_makespan(self) -> Optional[float]:
        if not self.scheduled or not self.nodes:
            return None
        return max(n.node.finish for n in self.nodes)  # type: ignore[type-var]

    def fusion_groups(self) -> tuple[tuple[int, ...], ...]:
        """The node indices of every fusion this plan runs (docs/stage-fusion.md): its members run as one unit, from
        one start to one finish. A fusion's members are one step's, so a plan of some steps runs all or none."""
        fusions = self.program.exec.fusions if self.program.exec is not None else ()
        return tuple(tuple(self.index[m] for m in f.members) for f in fusions if all(m in self.index for m in f.members))

    def pred_ids(self) -> dict[str, tuple[str, ...]]:
        """Each node's predecessors, by node id."""
        return {n.id: tuple(self.nodes[i].id for i in n.preds) for n in self.nodes}

    def restrict(self, steps: int) -> "RunPlan":
        """The same plan run for fewer steps (a prefix of the unrolled horizon)."""
        plan = build_run_plan(self.program, steps=steps, file=self.file)
        return plan.from_step(self.first_step) if self.first_step else plan

    def from_step(self, step: int) -> "RunPlan":
        """The nodes of steps >= `step`, with their dependencies among themselves: what a run resumed
        from a checkpoint at `step` executes. What they read from earlier steps is initial (installed
        from the checkpoint); only weights may be, data never crosses a step."""
        keep = [n for n in self.nodes if n.step >= step]
        if not keep:
            raise RpegError(None, f"no node of step >= {step} is left to run")
        new_index = {n.index: i for i, n in enumerate(keep)}

        def remap(ids) -> tuple[int, ...]:
            return tuple(new_index[i] for i in ids if i in new_index)

        nodes = tuple(dataclasses.replace(n, index=new_index[n.index], preds=remap(n.preds), succs=remap(n.succs))
                      for n in keep)
        producers = {a: remap(p) for a, p in self.producers.items() if remap(p)}
        consumers = {a: remap(c) for a, c in self.consumers.items() if remap(c)}
        initial: dict[Artifact, None] = {}
        for n in nodes:
            for a in n.inputs:
                # a Reshard in place (reads and writes the same copy) re-lays it out, it does not make it
                if not [i for i in producers.get(a, ()) if a not in nodes[i].inputs]:
                    if a.kind != "weights":
                        raise RpegError(n.node.loc, f"{n.id} reads {a.label}, made before step {step}; data never "
                                        "crosses a step, so this plan cannot be resumed at this step")
                    initial[a] = None
        return dataclasses.replace(
            self, nodes=nodes, index={n.id: n.index for n in nodes}, producers=producers, consumers=consumers,
            initial=tuple(initial), first_step=step,
        )


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load_program(path: str) -> Program:
    """Read a module from `path`: JSON form when it ends in .json, else the `.rpeg` text form."""
    text = read_input_text(path, "the plan file", MAX_MODULE_BYTES)
    if path.endswith(".json"):
        from rpegc.syntax.json_form import program_from_text

        return program_from_text(text, path)
    try:
        from rpegc.syntax.parser import parse
    except ImportError as e:  # the text parser needs lark; the JSON form needs nothing
        raise RpegError(
            Loc(path, 0, 0), f"cannot read the text form ({e}); give the plan as JSON (rpegc --emit=json)"
        ) from None
    return parse(text, path)


def load_plan(path: str, steps: Optional[int] = None) -> RunPlan:
    """The plan in file `path`, checked as rpegc checks what it reads (verify-wellformed's Def. A.2, A.5 and P1-P8,
    and the hardware profile annotate-cost reads) before the runtime's own checks (`build_run_plan`)."""
    p = load_program(path)
    if p.graph is not None:
        errors = check_program(p)
        if errors:
            raise RpegErrors(errors) if len(errors) > 1 else errors[0]
    if p.cluster is not None:
        load_hardware(p.cluster.hardware, p.cluster.loc)
    return build_run_plan(p, steps=steps, file=path)


# ----------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------


def _check_program(p: Program) -> None:
    where = p.exec.loc if p.exec is not None else Loc(p.file, 0, 0)
    if p.exec is None:
        raise RpegError(where, "the module has no exec.graph; compile it first: unroll{k=..}, split-quantiles, "
                               "insert-comm, insert-reshard, fuse-stages, annotate-cost, schedule")
    if not p.exec.lowered:
        raise RpegError(where, "the exec graph is not lowered (no Comm/Reshard insertion yet); run insert-comm and "
                               "insert-reshard before executing it")
    if p.cluster is None:
        raise RpegError(where, "the module has no rpeg.cluster; the runtime needs it to bind nodes to devices")
    if p.graph is None:
        raise RpegError(where, "the module has no rpeg.graph; keep the steady-state graph in the module, the runtime "
                               "reads containers and staleness budgets from it")
    if not p.exec.nodes:
        raise RpegError(where, "the exec graph has no nodes; nothing to run")
    check_exec(p)
    check_pool_transfers(p.exec)  # a node without an allocation is the verifier pool's, or an error
    for n in p.exec.nodes:
        if n.kind == "op" and n.role == VERIFY:
            if n.pool is None or n.vertex is None:
                raise RpegError(n.loc, f"verify node {n.id} needs its vertex and its pool (`pool = N`)")
            continue
        if n.kind == "op" and (n.strategy is None or n.vertex is None):
            raise RpegError(n.loc, f"op node {n.id} needs its vertex and its parallel strategy (dp, pp, tp, mb)")
        if n.alloc is not None:
            _check_inside(n, n.alloc, p)
        if n.src_alloc is not None:
            _check_inside(n, n.src_alloc, p)


def _check_inside(n: ExecNode, a: Alloc, p: Program) -> None:
    c = p.cluster
    assert c is not None
    for o, e, size in zip(a.origin, a.extent, (c.racks, c.nodes, c.gpus)):
        if o < 0 or e < 1 or o + e > size:
            raise RpegError(
                n.loc,
                f"node {n.id}: allocation at {a.origin} extent {a.extent} does not fit in cluster {c.name} "
                f"({c.racks} x {c.nodes} x {c.gpus}); fix the plan",
            )


def build_run_plan(p: Program, steps: Optional[int] = None, file: Optional[str] = None) -> RunPlan:
    """RealizeAndValidate: the executable form of a lowered plan, for the first `steps` RL steps."""
    _check_program(p)
    g = p.exec
    assert g is not None and p.graph is not None and p.cluster is not None
    if steps is None:
        steps = g.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= g.steps:
        raise RpegError(
            g.loc,
            f"cannot run {steps} steps: the plan was unrolled for {g.steps} step(s) and the runtime executes "
            f"exactly the compiled plan; choose 1..{g.steps} or recompile with unroll{{k={steps}}}",
        )
    kept = [n for n in g.nodes if n.step < steps]
    pos: dict[str, int] = {}
    for n in g.nodes:
        if n.id in pos:
            raise RpegError(n.loc, f"node id {n.id} is used twice; every exec node needs a unique id")
        pos[n.id] = len(pos)
    kept_ids = {n.id for n in kept}
    preds: dict[str, set[str]] = {n.id: set() for n in kept}
    for e in g.edges:
        for end in (e.src, e.dst):
            if end not in pos:
                raise RpegError(e.loc, f"edge {e.src} -> {e.dst} refers to unknown node '{end}'")
        if e.kind != "dep":
            raise RpegError(e.loc, f"edge {e.src} -> {e.dst} is a {e.kind} edge; lowering must leave only dep edges")
        if e.src == e.dst:
            raise RpegError(e.loc, f"node {e.src} depends on itself; remove the self-edge")
        if e.dst in kept_ids:
            if e.src not in kept_ids:
                raise RpegError(
                    e.loc,
                    f"node {e.dst} (step {g.node(e.dst).step}) depends on {e.src} of a later step; a prefix of "
                    "the steps cannot run on its own, run all steps",
                )
            preds[e.dst].add(e.src)
    order = _topological(kept, preds, pos)
    index = {n.id: i for i, n in enumerate(order)}
    pred_idx = [tuple(sorted(index[u] for u in preds[n.id])) for n in order]
    succ_lists: list[list[int]] = [[] for _ in order]
    for v, ps in enumerate(pred_idx):
        for u in ps:
            succ_lists[u].append(v)
    ancestors = _ancestors(pred_idx)
    bound = _bind_artifacts(p, order, ancestors)
    devices = [alloc_devices(n.alloc, p.cluster) for n in order]
    src_devices = [alloc_devices(n.src_alloc, p.cluster) if n.kind != "op" else () for n in order]
    nodes = tuple(
        RunNode(
            index=i,
            node=n,
            devices=devices[i],
            src_devices=src_devices[i],
            preds=pred_idx[i],
            succs=tuple(succ_lists[i]),
            inputs=bound.inputs[i],
            outputs=bound.outputs[i],
        )
        for i, n in enumerate(order)
    )
    used = sorted({d for ds in devices for d in ds} | {d for ds in src_devices for d in ds})
    return RunPlan(
        program=p,
        file=file or p.file,
        hash=plan_hash(p),
        steps=steps,
        plan_steps=g.steps,
        nodes=nodes,
        index=index,
        producers=bound.producers,
        consumers=bound.consumers,
        initial=bound.initial,
        retained=bound.retained,
        artifact_bytes=bound.bytes,
        tau={m.name: p.graph.tau(m.name) for m in p.models},
        scheduled=all(n.start is not None and n.finish is not None for n in order),
        devices=tuple(used),
    )


def _topological(nodes: list[ExecNode], preds: dict[str, set[str]], pos: dict[str, int]) -> list[ExecNode]:
    """Kahn's algorithm; ties go to the lower (step, order, position in the module)."""
    import heapq

    by_id = {n.id: n for n in nodes}
    left = {n.id: len(preds[n.id]) for n in nodes}
    succs: dict[str, list[str]] = {n.id: [] for n in nodes}
    for v, ps in preds.items():
        for u in ps:
            succs[u].append(v)
    key = lambda i: (by_id[i].step, by_id[i].order, pos[i])  # noqa: E731
    heap = [(key(i), i) for i, c in left.items() if c == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, u = heapq.heappop(heap)
        out.append(by_id[u])
        for v in succs[u]:
            left[v] -= 1
            if left[v] == 0:
                heapq.heappush(heap, (key(v), v))
    if len(out) < len(nodes):
        stuck = [i for i, c in left.items() if c > 0]
        first = by_id[stuck[0]]
        raise RpegError(
            first.loc,
            f"the exec graph has a dependency cycle through {', '.join(stuck[:6])}"
            f"{', ...' if len(stuck) > 6 else ''}; remove an edge so it is acyclic",
        )
    return out


def _ancestors(preds: list[tuple[int, ...]]) -> list[int]:
    """Bitset of all ancestors of every node (nodes are in topological order)."""
    anc = [0] * len(preds)
    for v, ps in enumerate(preds):
        a = 0
        for u in ps:
            a |= anc[u] | (1 << u)
        anc[v] = a
    return anc


@dataclass
class _Bound:
    inputs: list[tuple[Artifact, ...]]
    outputs: list[tuple[Artifact, ...]]
    producers: dict[Artifact, tuple[int, ...]]
    consumers: dict[Artifact, tuple[int, ...]]
    initial: tuple[Artifact, ...]
    retained: frozenset
    bytes: dict[Artifact, int]


def _bind_artifacts(p: Program, order: list[ExecNode], ancestors: list[int]) -> _Bound:
    """Every node's inputs and outputs as the plan binds them, each input guaranteed by an ancestor."""
    assert p.graph is not None
    shares = phase_shares(p.graph)
    for n in order:
        _check_bindings(p, n, len(shares))
    inputs = [_inputs(n) for n in order]
    outputs = [_outputs(n) for n in order]
    producers: dict[Artifact, list[int]] = {}
    for i, outs in enumerate(outputs):
        for a in outs:
            producers.setdefault(a, []).append(i)
    initial: dict[Artifact, None] = {}
    consumers: dict[Artifact, list[int]] = {}
    for i, n in enumerate(order):
        for a in inputs[i]:
            consumers.setdefault(a, []).append(i)
            if a.kind == "weights" and a.index == 0:
                initial[a] = None  # the initial checkpoint is installed at launch wherever it is read (Alg. 2 l. 2)
                continue
            makers = [u for u in producers.get(a, []) if u != i]
            if not makers:
                raise RpegError(n.loc, f"node {n.id} reads {_what(a)} on {_where(a.alloc)}, but no node writes or "
                                       f"delivers it there; the plan lacks {_missing(a)}")
            if not any((ancestors[i] >> u) & 1 for u in makers):
                raise RpegError(n.loc, f"node {n.id} reads {a.label}, but no predecessor produces it (made by "
                                       f"{', '.join(order[u].id for u in makers)}); add a dependency so it cannot "
                                       "run first")
    sizes: dict[Artifact, int] = {}
    for i, n in enumerate(order):
        for a in inputs[i] + outputs[i]:
            if a not in sizes and (a in producers or a in initial):
                sizes[a] = _artifact_bytes(p, a, shares, n.loc)
    return _Bound(
        inputs=inputs,
        outputs=outputs,
        producers={a: tuple(v) for a, v in producers.items()},
        consumers={a: tuple(dict.fromkeys(v)) for a, v in consumers.items()},
        initial=tuple(initial),
        retained=_retained(p, order, outputs),
        bytes=sizes,
    )


def _inputs(n: ExecNode) -> tuple[Artifact, ...]:
    """An Op reads on its allocation; a Comm or Reshard reads on its source allocation."""
    where = n.alloc if n.kind == "op" else n.src_alloc
    data = tuple(Artifact("data", d.container, n.step, d.phase, where) for d in n.data_in)  # type: ignore[arg-type]
    return data + tuple(Artifact("weights", m, v, None, where) for m, v in n.version_in)  # type: ignore[arg-type]


def _outputs(n: ExecNode) -> tuple[Artifact, ...]:
    """Everything lands on the node's allocation: an Op's data and new version, a transfer's copies."""
    data = tuple(Artifact("data", d.container, n.step, d.phase, n.alloc) for d in n.data_out)  # type: ignore[arg-type]
    versions = n.version_out if n.kind == "op" else n.version_in
    return data + tuple(Artifact("weights", m, v, None, n.alloc) for m, v in versions)  # type: ignore[arg-type]


def _check_bindings(p: Program, n: ExecNode, phases: int) -> None:
    """The bindings the lowering wrote agree with the graph: an Op binds exactly the containers its vertex
    receives over data edges and writes, a transfer moves one thing, phases exist."""
    graph = p.graph
    assert graph is not None
    for refs in (n.data_in, n.data_out, n.version_in, n.version_out):
        if len(set(refs)) != len(refs):
            raise RpegError(n.loc, f"node {n.id} binds {_shown(next(x for i, x in enumerate(refs) if x in refs[:i]))} "
                                   "twice; keep one")
    for d in n.data_in + n.data_out:
        if d.phase is not None and d.phase > phases:
            raise RpegError(n.loc, f"node {n.id} binds %{d.container} phase {d.phase}, but graph @{graph.name} has "
                                   f"{phases} quantile phase(s)")
    if n.kind == "op":
        _check_op_bindings(p, n)
        return
    if n.kind == "reshard" or n.version_in:
        _moved_version(n)
        if n.data_in or n.data_out:
            raise RpegError(n.loc, f"{n.kind} node {n.id} moves weights; it binds no data")
    else:
        if n.container is None:
            raise RpegError(n.loc, f"comm node {n.id} moves neither a container nor a model's weights")
        if not n.data_in or not n.data_out:
            raise RpegError(n.loc, f"comm node {n.id} moves %{n.container} but binds no copy to "
                                   f"{'read' if not n.data_in else 'write'}; {_RECOMPILE}")
        other = {d.container for d in n.data_in + n.data_out} - {n.container}
        if other:
            raise RpegError(n.loc, f"comm node {n.id} moves %{n.container} but binds %{sorted(other)[0]}")


def _check_op_bindings(p: Program, n: ExecNode) -> None:
    graph = p.graph
    assert graph is not None
    try:
        v = graph.vertex(n.vertex)  # type: ignore[arg-type]
    except KeyError:
        raise RpegError(n.loc, f"op node {n.id} runs vertex @{n.vertex}, which graph @{graph.name} does not declare"
                        ) from None
    received, written = set(data_read(graph, v)), set(data_written(graph, v))
    for what, bound, expected in (("reads", n.data_in, received), ("writes", n.data_out, written)):
        got = {d.container for d in bound}
        if got - expected:
            raise RpegError(n.loc, f"op node {n.id} {what} %{sorted(got - expected)[0]}, which vertex @{v.name} "
                                   f"does not {'receive over a data edge' if what == 'reads' else 'write'}")
        if expected - got:
            raise RpegError(n.loc, f"op node {n.id} binds no copy of %{sorted(expected - got)[0]} that vertex "
                                   f"@{v.name} {'receives' if what == 'reads' else 'writes'}; {_RECOMPILE}")


_RECOMPILE = ("the lowering writes every node's reads and writes; recompile the plan (unroll, split-quantiles, "
              "insert-comm, insert-reshard)")


def _artifact_bytes(p: Program, a: Artifact, shares: tuple[float, ...], loc: Loc) -> int:
    """A container's payload |a|s(a) (its phase share for a phase), a model's N_m s_b."""
    if a.kind == "weights":
        return weight_bytes(p, a.name, loc)
    return data_bytes(container_payload(p, a.name, loc), shares[a.phase - 1] if a.phase is not None else None)


def _shown(x) -> str:
    if isinstance(x, DataRef):
        return f"%{x.container}" + (f" phase {x.phase}" if x.phase is not None else "")
    return f"@{x[0]} version {x[1]}"


def _what(a: Artifact) -> str:
    if a.kind == "weights":
        return f"version {a.index} of @{a.name}"
    return f"%{a.name} of step {a.index}" + (f" (phase {a.phase})" if a.phase is not None else "")


def _missing(a: Artifact) -> str:
    if a.kind == "weights":
        return "a publication Comm/Reshard (run insert-comm, insert-reshard)"
    return "a Comm for that data edge (run insert-comm)"


def _moved_version(n: ExecNode) -> tuple[str, int]:
    if len(n.version_in) != 1:
        raise RpegError(n.loc, f"{n.kind} node {n.id} must name exactly one model version it moves (`@m version v`)")
    m, version = n.version_in[0]
    if n.model is not None and n.model != m:
        raise RpegError(n.loc, f"{n.kind} node {n.id} moves @{n.model} but names a version of @{m}")
    return m, version


def _retained(p: Program, order: list[ExecNode], outputs: list[tuple[Artifact, ...]]) -> frozenset:
    """The final version of every trained model and the graph's declared outputs stay until shutdown."""
    assert p.graph is not None
    final: dict[str, Artifact] = {}
    keep = set()
    for i, n in enumerate(order):
        for a in outputs[i]:
            if a.kind == "weights" and n.kind == "op" and (a.name not in final or a.index > final[a.name].index):
                final[a.name] = a
            if a.kind == "data" and a.name in p.graph.outputs:
                keep.add(a)
    return frozenset(keep | set(final.values()))


def _where(a: Optional[Alloc]) -> str:
    if a is None:
        return "no devices"
    return f"devices at {a.origin} extent {a.extent}"


# ----------------------------------------------------------------------------------------------
# Hash
# ----------------------------------------------------------------------------------------------


def _alloc_key(a: Optional[Alloc]):
    return None if a is None else [list(a.origin), list(a.extent)]


def _strategy_key(s):
    return None if s is None else [s.dp, s.pp, s.tp, s.mb]


def plan_hash(p: Program) -> str:
    """sha256 (hex) of the canonical structure of `p` that a run depends on (see the module docstring)."""
    g = p.exec
    if g is None:
        raise RpegError(Loc(p.file, 0, 0), "the module has no exec.graph to hash")
    nodes = sorted(g.nodes, key=lambda n: n.id)
    scheduled = all(n.start is not None and n.finish is not None for n in g.nodes)
    planned_order = None
    if scheduled:
        topo = {n.id: i for i, n in enumerate(g.nodes)}
        planned_order = [n.id for n in sorted(g.nodes, key=lambda n: (n.start, n.finish, topo[n.id]))]
    w = p.workload
    m, s = g.memory, g.schedule
    doc = {
        "format": HASH_FORMAT,
        "workload": [w.B, w.R, w.Lp, w.Lr, w.dtype] + ([w.oversample] if w.oversample != 1 else []),
        "models": sorted([x.name, x.kind, x.trainable, [getattr(x.arch, k) for k in _ARCH_KEYS]] for x in p.models),
        "graph": g.graph,
        "steps": g.steps,
        "lowered": g.lowered,
        "cluster": [p.cluster.racks, p.cluster.nodes, p.cluster.gpus, p.cluster.hardware] if p.cluster else None,
        "staleness": sorted([m_, t] for m_, t in p.graph.staleness) if p.graph else None,
        "nodes": [
            [n.id, n.kind, n.step, n.order, n.vertex, n.role, n.model, n.container, n.phase, n.nphases,
             _alloc_key(n.alloc), _strategy_key(n.strategy), _alloc_key(n.src_alloc), _strategy_key(n.src_strategy),
             n.bytes, n.fraction, sorted([m_, v] for m_, v in n.version_in), sorted([m_, v] for m_, v in n.version_out),
             [[d.container, d.phase] for d in n.data_in], [[d.container, d.phase] for d in n.data_out],
             n.time, n.start, n.finish]
            for n in nodes
        ],
        "edges": sorted({(e.src, e.dst, e.kind, e.container or "") for e in g.edges}),
        "memory": None if m is None else [sorted(m.peak), sorted(m.persistent), sorted(m.transient), m.m_eff,
                                          m.r_peak, m.feasible],
        "schedule": None if s is None else [s.makespan, s.score, s.score_pen, s.util, s.p_eff],
        "planned_order": planned_order,
    }
    if p.verifiers:  # what a verify vertex runs and its stated time; absent without one, so other hashes stay
        doc["verifiers"] = sorted([v.name, v.fn, v.per_response] for v in p.verifiers)
        doc["pools"] = sorted([n.id, n.pool] for n in g.nodes if n.pool is not None)
        shared = sorted([n.id, list(n.shares)] for n in g.nodes if n.shares)
        if shared:  # the devices the pool's nodes hold besides it; absent where none, so other hashes stay
            doc["shares"] = shared
    if g.fusions:  # the fused microtask schedule (Sec. VII); absent from an unfused plan, whose hash stays as it was
        doc["fusions"] = [[f.id, list(f.members), [[microtask_text(t) for t in order] for order in f.stages]]
                          for f in g.fusions]
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
