"""Conversion between the plain `Program` dataclasses and an xDSL `ModuleOp` of the rpeg/exec dialects.

Paper: Sec. IV-A and App. A-A..A-G (the concepts); docs/architecture.md, Data flow to IR (the xDSL IR carries what
passes read and print; `rpegc/core` computes on the dataclasses). `module_to_program` inverts
`program_to_module` exactly, source locations included; passes read a Program with
`module_to_program`, compute with `rpegc.core`, and write the result back with `replace_module`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional

from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    Builtin,
    BytesAttr,
    DenseArrayBase,
    FloatAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc, RpegError
from rpegc.core.ir.gc_pause import without_gc
from rpegc.core.ir.exec_graph import (DataRef, ExecEdge, ExecFusion, ExecGraph, ExecNode, MemoryReport, ScheduleReport,
                                      microtask_of, microtask_text)
from rpegc.core.ir.program import (Container, Edge, Fuse, Graph, Model, Placement, Plan, Pool, Program, Quantile,
                                   Verifier, Vertex, Workload)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.ir.training import NO_TRAIN_SPEC, TrainSpec
from rpegc.dialects import exec as ex
from rpegc.dialects import rpeg
from rpegc.dialects.attrs import (
    AllocAttr,
    ArchAttr,
    ExprAttr,
    I64Attr,
    ModelIntAttr,
    QuantileAttr,
    StrategyAttr,
    TrainAttr,
    expr_attr,
    i64_attr,
    int_of,
    loc_from,
    location_attr,
    text,
)

FILE_ATTR = "rpeg.file"  # module attribute holding Program.file


def make_context() -> Context:
    """A Context with the builtin, rpeg and exec dialects, e.g. for parsing `--emit=mlir` output."""
    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(rpeg.RPEG)
    ctx.load_dialect(ex.EXEC)
    return ctx


def loc_of(op: Operation) -> Loc:
    """The source position of `op`, or of its closest located ancestor."""
    current: Optional[Operation] = op
    while current is not None:
        loc = loc_from(current.location)
        if loc != UNKNOWN_LOC:
            return loc
        current = current.parent_op()
    return UNKNOWN_LOC


# --- Program -> ops ---------------------------------------------------------------------------


@without_gc
def program_to_module(p: Program) -> ModuleOp:
    return ModuleOp(program_ops(p), attributes={FILE_ATTR: StringAttr(p.file)})


def replace_module(module: ModuleOp, p: Program, before: Optional[Program] = None) -> None:
    """Replace the body of `module` in place by the ops of `p` (a ModulePass mutates its module).

    `before` is the Program read from `module`: a graph, cluster, plan or exec graph of `p` that is the very
    object `before` holds keeps its op, untouched (a pass that only adds an exec graph would otherwise rebuild
    every container of the graph, ~60 us each).
    """
    kept = _unchanged_sections(module, p, before) if before is not None else {}
    block = module.body.block
    for op in reversed(list(block.ops)):
        if op in kept.values():
            block.detach_op(op)
        else:
            block.erase_op(op)
    block.add_ops(_Builder().program_ops(p, kept))
    module.attributes[FILE_ATTR] = StringAttr(p.file)


def _unchanged_sections(module: ModuleOp, p: Program, before: Program) -> dict[type[Operation], Operation]:
    """The module's single-instance ops (graph, cluster, plan, exec graph) whose section `p` holds unchanged."""
    same = {
        rpeg.GraphOp: p.graph is before.graph,
        rpeg.ClusterOp: p.cluster is before.cluster,
        rpeg.PlanOp: p.plan is before.plan,
        ex.ExecGraphOp: p.exec is before.exec,
    }
    return {type(op): op for op in module.ops if same.get(type(op), False)}


def program_ops(p: Program) -> list[Operation]:
    """The top-level ops of `p`: workload, models, verifiers, graph, cluster, plan, exec graph."""
    return _Builder().program_ops(p)


def _int(v: int) -> I64Attr:
    return i64_attr(v)


def _float(v: float) -> FloatAttr:
    return FloatAttr(float(v), f64)


def _str(value: Optional[str]) -> Optional[StringAttr]:
    return None if value is None else StringAttr(value)


def _names(names: Iterable[str]) -> ArrayAttr[StringAttr]:
    return ArrayAttr(tuple(StringAttr(n) for n in names))


def _region(ops: list[Operation]) -> Region:
    return Region(Block(ops))


class _Builder:
    """Builds the ops of one Program, sharing the immutable attributes that recur.

    Building an xDSL attribute verifies it (microseconds each); exec graphs repeat the same
    locations, symbols, allocations and strategies across thousands of nodes, so one instance per
    conversion memoises them. No state outlives a call.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[str, object], Attribute] = {}

    def _shared(self, kind: str, key: object, make) -> Attribute:
        attr = self._memo.get((kind, key))
        if attr is None:
            attr = self._memo[(kind, key)] = make(key)
        return attr

    def float_attr(self, value: float) -> FloatAttr:
        value = float(value)
        # Keyed by the exact bits: 0.0 == -0.0 and nan != nan would defeat a plain float key.
        return self._shared("float", value.hex(), lambda _: _float(value))  # type: ignore[return-value]

    def loc(self, loc: Loc) -> Attribute:
        return self._shared("loc", loc, location_attr)

    def sym(self, name: Optional[str]) -> Optional[SymbolRefAttr]:
        return None if name is None else self._shared("sym", name, SymbolRefAttr)  # type: ignore[return-value]

    def alloc(self, a: Optional[Alloc]) -> Optional[AllocAttr]:
        return None if a is None else self._shared("alloc", a, AllocAttr.from_alloc)  # type: ignore[return-value]

    def strategy(self, s: Optional[Strategy]) -> Optional[StrategyAttr]:
        if s is None:
            return None
        return self._shared("strategy", s, StrategyAttr.from_strategy)  # type: ignore[return-value]

    def model_ints(self, pairs: tuple[tuple[str, int], ...]) -> Optional[ArrayAttr[ModelIntAttr]]:
        """A (model, int) list, or None when empty (the property is then omitted)."""
        if not pairs:
            return None
        return self._shared(  # type: ignore[return-value]
            "model_ints", pairs, lambda ps: ArrayAttr(tuple(ModelIntAttr.from_pair(p) for p in ps))
        )

    def data_refs(self, refs: tuple[DataRef, ...]) -> Optional[ArrayAttr[ex.DataRefAttr]]:
        """A node's data bindings, or None when it has none (the property is then omitted)."""
        if not refs:
            return None
        return self._shared(  # type: ignore[return-value]
            "data_refs", refs, lambda rs: ArrayAttr(tuple(ex.DataRefAttr.from_ref(r) for r in rs))
        )

    def op(
        self,
        cls: type[Operation],
        loc: Loc,
        props: dict[str, Attribute | None],
        regions: Iterable[Region] = (),
        extra: dict[str, Attribute] | None = None,
    ) -> Operation:
        """Build `cls` directly (Operation.create skips the slower keyword builder); None props are omitted."""
        # In MLIR's order (a sorted dictionary), so a module reads back from mlir-opt identical to the letter.
        properties = {k: props[k] for k in sorted(props) if props[k] is not None}
        return cls.create(
            properties=properties,
            attributes=dict(sorted(extra.items())) if extra else {},
            location=self.loc(loc),  # type: ignore[arg-type]
            regions=list(regions),
        )

    def program_ops(self, p: Program, kept: Optional[dict[type[Operation], Operation]] = None) -> list[Operation]:
        """The ops of `p`, taking a section's op from `kept` (by op class) where it holds one."""
        kept = kept or {}
        ops: list[Operation] = [self.workload_op(p.workload)]
        ops.extend(self.model_op(m) for m in p.models)
        ops.extend(self.verifier_op(v) for v in p.verifiers)
        if p.graph is not None:
            ops.append(kept.get(rpeg.GraphOp) or self.graph_op(p.graph))
        if p.cluster is not None:
            ops.append(kept.get(rpeg.ClusterOp) or self.cluster_op(p.cluster))
        if p.plan is not None:
            ops.append(kept.get(rpeg.PlanOp) or self.plan_op(p.plan))
        if p.exec is not None:
            ops.append(kept.get(ex.ExecGraphOp) or self.exec_graph_op(p.exec))
        return ops

    def workload_op(self, w: Workload) -> Operation:
        props = {"B": _int(w.B), "R": _int(w.R), "Lp": _int(w.Lp), "Lr": _int(w.Lr), "dtype": StringAttr(w.dtype),
                 "train": _train(w.train), "oversample": _int(w.oversample) if w.oversample != 1 else None}
        return self.op(rpeg.WorkloadOp, w.loc, props)

    def model_op(self, m: Model) -> Operation:
        props = {
            "ident": StringAttr(m.name),
            "kind": StringAttr(m.kind),
            "arch": ArchAttr.from_arch(m.arch),
            "trainable": UnitAttr() if m.trainable else None,
            "preset": _str(m.preset),
            "hf": _str(m.hf),
        }
        return self.op(rpeg.ModelOp, m.loc, props)

    def verifier_op(self, v: Verifier) -> Operation:
        props = {
            "ident": StringAttr(v.name),
            "fn": StringAttr(v.fn),
            "per_response": None if v.per_response is None else _float(v.per_response),
        }
        return self.op(rpeg.VerifierOp, v.loc, props)

    def graph_op(self, g: Graph) -> Operation:
        body: list[Operation] = [self.container_op(c) for c in g.containers]
        if g.inputs:
            body.append(self.op(rpeg.InputOp, g.loc, {"containers": _names(g.inputs)}))
        if g.outputs:
            body.append(self.op(rpeg.OutputOp, g.loc, {"containers": _names(g.outputs)}))
        body.extend(self.vertex_op(v) for v in g.vertices)
        body.extend(self.edge_op(rpeg.DataOp, e) for e in g.data_edges)
        body.extend(self.edge_op(rpeg.PublishOp, e) for e in g.pub_edges)
        # An empty list is kept when it has a known position: the user wrote it, printing keeps it.
        if g.staleness or g.staleness_loc != UNKNOWN_LOC:
            entries = ArrayAttr(tuple(ModelIntAttr.from_pair(p) for p in g.staleness))
            body.append(self.op(rpeg.StalenessOp, g.staleness_loc, {"entries": entries}))
        if g.quantiles or g.quantiles_loc != UNKNOWN_LOC:
            entries = ArrayAttr(tuple(self.quantile_attr(q) for q in g.quantiles))
            body.append(self.op(rpeg.QuantilesOp, g.quantiles_loc, {"entries": entries}))
        if g.algorithm is not None:
            body.append(self.op(rpeg.AlgorithmOp, g.algorithm_loc, {"algorithm": StringAttr(g.algorithm)}))
        return self.op(rpeg.GraphOp, g.loc, {"ident": StringAttr(g.name)}, [_region(body)])

    def container_op(self, c: Container) -> Operation:
        props: dict[str, Attribute | None] = {
            "ident": StringAttr(c.name),
            "dims": ArrayAttr(tuple(expr_attr(d) for d in c.dims)) if c.dims else None,
            "model": self.sym(c.model),
            "bytes_per_elem": None if c.bytes_per_elem is None else _int(c.bytes_per_elem),
        }
        if c.is_weights:
            return self.op(rpeg.WeightsOp, c.loc, props)
        props["elem"] = StringAttr(c.elem)
        return self.op(rpeg.ContainerOp, c.loc, props)

    def vertex_op(self, v: Vertex) -> Operation:
        props = {
            "ident": StringAttr(v.name),
            "role": StringAttr(v.role),
            "model": self.sym(v.model),
            "reads": _names(v.reads),
            "writes": _names(v.writes),
        }
        return self.op(rpeg.VertexOp, v.loc, props)

    def edge_op(self, cls: type[Operation], e: Edge) -> Operation:
        props = {"src": self.sym(e.src), "dst": self.sym(e.dst), "container": StringAttr(e.container)}
        return self.op(cls, e.loc, props)

    def quantile_attr(self, q: Quantile) -> QuantileAttr:
        return QuantileAttr(_float(q.f), expr_attr(q.tokens), self.loc(q.loc))

    def cluster_op(self, c: Cluster) -> Operation:
        props = {
            "ident": StringAttr(c.name),
            "racks": _int(c.racks),
            "nodes": _int(c.nodes),
            "gpus": _int(c.gpus),
            "hardware": StringAttr(c.hardware),
        }
        return self.op(rpeg.ClusterOp, c.loc, props)

    def plan_op(self, p: Plan) -> Operation:
        places = [
            self.op(
                rpeg.PlaceOp,
                pl.loc,
                {"vertex": self.sym(pl.vertex), "alloc": self.alloc(pl.alloc), "strategy": self.strategy(pl.strategy),
                 "train": _train(pl.strategy.train)},
            )
            for pl in p.placements
        ]
        places += [self.op(rpeg.PoolOp, pool.loc, {"vertex": self.sym(pool.vertex), "size": _int(pool.size)})
                   for pool in p.pools]
        places += [self.op(rpeg.FuseOp, f.loc, {"vertices": ArrayAttr(tuple(self.sym(v) for v in f.vertices))})
                   for f in p.fusions]
        props = {"ident": StringAttr(p.name), "graph": self.sym(p.graph), "cluster": self.sym(p.cluster)}
        return self.op(rpeg.PlanOp, p.loc, props, [_region(places)])

    def exec_graph_op(self, g: ExecGraph) -> Operation:
        body: list[Operation] = [self.node_op(n) for n in g.nodes]
        body.extend(self.exec_edge_op(e) for e in g.edges)
        if g.memory is not None:
            body.append(self.memory_op(g.memory, g.loc))
        if g.schedule is not None:
            keys = ("makespan", "score", "score_pen", "util", "p_eff")
            body.append(self.op(ex.ScheduleOp, g.loc, {k: _float(getattr(g.schedule, k)) for k in keys}))
        body.extend(self.fusion_op(f) for f in g.fusions)
        props = {
            "graph": self.sym(g.graph),
            "steps": _int(g.steps),
            "lowered": UnitAttr() if g.lowered else None,
        }
        return self.op(ex.ExecGraphOp, g.loc, props, [_region(body)])

    def fusion_op(self, f: ExecFusion) -> Operation:
        stages = ArrayAttr(tuple(ArrayAttr(tuple(StringAttr(microtask_text(t)) for t in order)) for order in f.stages))
        props = {"ident": StringAttr(f.id), "members": ArrayAttr(tuple(self.sym(m) for m in f.members)),
                 "stages": stages}
        return self.op(ex.FusionOp, f.loc, props)

    def node_op(self, n: ExecNode) -> Operation:
        cls = ex.NODE_OPS.get(n.kind)
        if cls is None:
            raise RpegError(n.loc, f"exec node '{n.id}' has kind '{n.kind}'; use one of {', '.join(ex.NODE_OPS)}")
        props = {
            "ident": StringAttr(n.id),
            "step": _int(n.step),
            "order": _int(n.order),
            "vertex": self.sym(n.vertex),
            "role": _str(n.role),
            "model": self.sym(n.model),
            "container": _str(n.container),
            "phase": None if n.phase is None else _int(n.phase),
            "nphases": None if n.nphases is None else _int(n.nphases),
            "alloc": self.alloc(n.alloc),
            "strategy": self.strategy(n.strategy),
            "train": None if n.strategy is None else _train(n.strategy.train),
            "src_alloc": self.alloc(n.src_alloc),
            "src_strategy": self.strategy(n.src_strategy),
            "bytes": _int(n.bytes) if n.bytes else None,
            "pool": None if n.pool is None else _int(n.pool),
            "shares": ArrayAttr([_int(d) for d in n.shares]) if n.shares else None,
            "fraction": None if n.fraction is None else self.float_attr(n.fraction),
            "version_in": self.model_ints(n.version_in),
            "version_out": self.model_ints(n.version_out),
            "data_in": self.data_refs(n.data_in),
            "data_out": self.data_refs(n.data_out),
        }
        results = {
            key: self.float_attr(value)
            for key, value in (("time", n.time), ("start", n.start), ("finish", n.finish))
            if value is not None
        }
        return self.op(cls, n.loc, props, extra=results)

    def exec_edge_op(self, e: ExecEdge) -> Operation:
        cls = ex.EDGE_OPS.get(e.kind)
        if cls is None:
            raise RpegError(
                e.loc, f"exec edge {e.src} -> {e.dst} has kind '{e.kind}'; use one of {', '.join(ex.EDGE_OPS)}"
            )
        props = {"src": self.sym(e.src), "dst": self.sym(e.dst), "container": _str(e.container)}
        return self.op(cls, e.loc, props)

    def memory_op(self, m: MemoryReport, loc: Loc) -> Operation:
        props: dict[str, Attribute | None] = {}
        for key in ("peak", "persistent", "transient"):
            pairs: tuple[tuple[int, float], ...] = getattr(m, key)
            props[f"{key}_devices"] = DenseArrayBase.from_list(i64, [int(d) for d, _ in pairs])
            props[key] = ArrayAttr(tuple(self.float_attr(v) for _, v in pairs))
        props["m_eff"] = _float(m.m_eff)
        props["r_peak"] = _float(m.r_peak)
        props["feasible"] = BoolAttr.from_bool(bool(m.feasible))
        return self.op(ex.MemoryOp, loc, props)


# --- ops -> Program ---------------------------------------------------------------------------


@without_gc
def module_to_program(m: ModuleOp) -> Program:
    """The Program held by a module built by `program_to_module` (or parsed and verified)."""
    workload: Optional[Workload] = None
    models: list[Model] = []
    verifiers: list[Verifier] = []
    found: dict[str, object] = {}
    for op in m.ops:
        if isinstance(op, rpeg.WorkloadOp):
            _check_single(op, "rpeg.workload", workload is not None)
            workload = _workload(op)
        elif isinstance(op, rpeg.ModelOp):
            models.append(_model(op))
        elif isinstance(op, rpeg.VerifierOp):
            verifiers.append(_verifier(op))
        elif isinstance(op, (rpeg.GraphOp, rpeg.ClusterOp, rpeg.PlanOp, ex.ExecGraphOp)):
            _check_single(op, op.name, op.name in found)
            found[op.name] = _TOP_LEVEL_READERS[type(op)](op)
        else:
            raise RpegError(
                loc_of(op),
                f"unexpected op '{op.name}' at module level; a module holds only rpeg.workload, "
                "rpeg.model, rpeg.verifier, rpeg.graph, rpeg.cluster, rpeg.plan and exec.graph",
            )
    if workload is None:
        raise RpegError(UNKNOWN_LOC, "the module has no rpeg.workload; add one (B, R, Lp, Lr, dtype)")
    file_attr = m.attributes.get(FILE_ATTR)
    return Program(
        workload=workload,
        models=tuple(models),
        graph=found.get("rpeg.graph"),  # type: ignore[arg-type]
        cluster=found.get("rpeg.cluster"),  # type: ignore[arg-type]
        plan=found.get("rpeg.plan"),  # type: ignore[arg-type]
        exec=found.get("exec.graph"),  # type: ignore[arg-type]
        file=text(file_attr) if isinstance(file_attr, (StringAttr, BytesAttr)) else "<input>",
        verifiers=tuple(verifiers),
    )


def _check_single(op: Operation, what: str, seen: bool) -> None:
    if seen:
        raise RpegError(loc_of(op), f"a module holds at most one {what}; remove or merge the extra one")


def _names_of(attr: ArrayAttr) -> tuple[str, ...]:
    return tuple(text(a) for a in attr.data)


def _opt_sym(attr: Optional[SymbolRefAttr]) -> Optional[str]:
    return None if attr is None else attr.string_value()


def _opt_int(attr: Optional[I64Attr]) -> Optional[int]:
    return None if attr is None else int_of(attr)


def _opt_text(attr) -> Optional[str]:
    return None if attr is None else text(attr)


def _fl(attr: FloatAttr) -> float:
    return attr.value.data


def _workload(op: rpeg.WorkloadOp) -> Workload:
    return Workload(int_of(op.B), int_of(op.R), int_of(op.Lp), int_of(op.Lr), op.dtype.data, loc=loc_from(op.location),
                    train=_spec(op.train), oversample=1 if op.oversample is None else int_of(op.oversample))


def _train(t: TrainSpec) -> Optional[TrainAttr]:
    """The property of stated training fields, or None (omitted) when none is stated."""
    return None if t.empty else TrainAttr.from_spec(t)


def _spec(attr: Optional[TrainAttr]) -> TrainSpec:
    return NO_TRAIN_SPEC if attr is None else attr.to_spec()


def _with_train(s: Strategy, attr: Optional[TrainAttr]) -> Strategy:
    return s if attr is None else replace(s, train=attr.to_spec())


def _model(op: rpeg.ModelOp) -> Model:
    return Model(
        name=text(op.ident),
        kind=op.kind.data,
        trainable=op.trainable is not None,
        arch=op.arch.to_arch(),
        preset=_opt_text(op.preset),
        hf=_opt_text(op.hf),
        loc=loc_from(op.location),
    )


def _verifier(op: rpeg.VerifierOp) -> Verifier:
    return Verifier(
        name=text(op.ident),
        fn=text(op.fn),
        per_response=_opt_float(op.per_response),
        loc=loc_from(op.location),
    )


def _graph(op: rpeg.GraphOp) -> Graph:
    containers: list[Container] = []
    inputs: list[str] = []
    outputs: list[str] = []
    vertices: list[Vertex] = []
    data_edges: list[Edge] = []
    pub_edges: list[Edge] = []
    staleness: tuple[tuple[str, int], ...] = ()
    quantiles: tuple[Quantile, ...] = ()
    staleness_loc = quantiles_loc = algorithm_loc = UNKNOWN_LOC
    algorithm = None
    for child in op.body.block.ops:
        if isinstance(child, (rpeg.ContainerOp, rpeg.WeightsOp)):
            containers.append(_container(child))
        elif isinstance(child, rpeg.InputOp):
            inputs.extend(_names_of(child.containers))
        elif isinstance(child, rpeg.OutputOp):
            outputs.extend(_names_of(child.containers))
        elif isinstance(child, rpeg.VertexOp):
            vertices.append(_vertex(child))
        elif isinstance(child, rpeg.DataOp):
            data_edges.append(_edge(child))
        elif isinstance(child, rpeg.PublishOp):
            pub_edges.append(_edge(child))
        elif isinstance(child, rpeg.StalenessOp):
            staleness += tuple(e.to_pair() for e in child.entries.data)
            staleness_loc = loc_from(child.location)
        elif isinstance(child, rpeg.QuantilesOp):
            quantiles += tuple(_quantile(q) for q in child.entries.data)
            quantiles_loc = loc_from(child.location)
        elif isinstance(child, rpeg.AlgorithmOp):
            algorithm, algorithm_loc = child.algorithm.data, loc_from(child.location)
        else:
            raise RpegError(loc_of(child), f"'{child.name}' cannot appear inside rpeg.graph; move it out")
    return Graph(
        name=text(op.ident),
        containers=tuple(containers),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        vertices=tuple(vertices),
        data_edges=tuple(data_edges),
        pub_edges=tuple(pub_edges),
        staleness=staleness,
        quantiles=quantiles,
        loc=loc_from(op.location),
        staleness_loc=staleness_loc,
        quantiles_loc=quantiles_loc,
        algorithm=algorithm,
        algorithm_loc=algorithm_loc,
    )


def _container(op: rpeg.ContainerFields) -> Container:
    dims: tuple[ExprAttr, ...] = () if op.dims is None else op.dims.data
    return Container(
        name=text(op.ident),
        elem=op.elem.data if isinstance(op, rpeg.ContainerOp) else "weights",
        dims=tuple(d.to_expr() for d in dims),
        model=_opt_sym(op.model),
        bytes_per_elem=_opt_int(op.bytes_per_elem),
        loc=loc_from(op.location),
    )


def _vertex(op: rpeg.VertexOp) -> Vertex:
    return Vertex(
        name=text(op.ident),
        role=op.role.data,
        model=op.model.string_value(),
        reads=_names_of(op.reads),
        writes=_names_of(op.writes),
        loc=loc_from(op.location),
    )


def _edge(op: rpeg.EdgeFields) -> Edge:
    return Edge(op.src.string_value(), op.dst.string_value(), text(op.container), loc=loc_from(op.location))


def _quantile(q: QuantileAttr) -> Quantile:
    return Quantile(_fl(q.f), q.tokens.to_expr(), loc=loc_from(q.loc))


def _cluster(op: rpeg.ClusterOp) -> Cluster:
    return Cluster(
        name=text(op.ident),
        racks=int_of(op.racks),
        nodes=int_of(op.nodes),
        gpus=int_of(op.gpus),
        hardware=text(op.hardware),
        loc=loc_from(op.location),
    )


def _plan(op: rpeg.PlanOp) -> Plan:
    placements: list[Placement] = []
    fusions: list[Fuse] = []
    pools: list[Pool] = []
    for child in op.body.block.ops:
        if isinstance(child, rpeg.FuseOp):
            fusions.append(Fuse(tuple(v.string_value() for v in child.vertices.data), loc=loc_from(child.location)))
            continue
        if isinstance(child, rpeg.PoolOp):
            pools.append(Pool(child.vertex.string_value(), int_of(child.size), loc=loc_from(child.location)))
            continue
        if not isinstance(child, rpeg.PlaceOp):
            raise RpegError(loc_of(child), f"'{child.name}' cannot appear inside rpeg.plan; use rpeg.place, "
                                           "rpeg.pool or rpeg.fuse")
        placements.append(
            Placement(
                child.vertex.string_value(),
                child.alloc.to_alloc(),
                _with_train(child.strategy.to_strategy(), child.train),
                loc=loc_from(child.location),
            )
        )
    return Plan(
        name=text(op.ident),
        graph=op.graph.string_value(),
        cluster=op.cluster.string_value(),
        placements=tuple(placements),
        loc=loc_from(op.location),
        fusions=tuple(fusions),
        pools=tuple(pools),
    )


_NODE_KINDS = {cls: kind for kind, cls in ex.NODE_OPS.items()}
_EDGE_KINDS = {cls: kind for kind, cls in ex.EDGE_OPS.items()}


def _exec_graph(op: ex.ExecGraphOp) -> ExecGraph:
    nodes: list[ExecNode] = []
    edges: list[ExecEdge] = []
    memory: Optional[MemoryReport] = None
    schedule: Optional[ScheduleReport] = None
    fusions: list[ExecFusion] = []
    for child in op.body.block.ops:
        kind = type(child)
        if kind in _NODE_KINDS:
            nodes.append(_node(child, _NODE_KINDS[kind]))  # type: ignore[arg-type]
        elif kind in _EDGE_KINDS:
            edges.append(_exec_edge(child, _EDGE_KINDS[kind]))  # type: ignore[arg-type]
        elif isinstance(child, ex.MemoryOp):
            memory = _memory(child)
        elif isinstance(child, ex.ScheduleOp):
            schedule = _schedule(child)
        elif isinstance(child, ex.FusionOp):
            fusions.append(_fusion(child))
        else:
            raise RpegError(loc_of(child), f"'{child.name}' cannot appear inside exec.graph; move it out")
    return ExecGraph(
        graph=op.graph.string_value(),
        steps=int_of(op.steps),
        nodes=tuple(nodes),
        edges=tuple(edges),
        lowered=op.lowered is not None,
        memory=memory,
        schedule=schedule,
        fusions=tuple(fusions),
        loc=loc_from(op.location),
    )


def _fusion(op: ex.FusionOp) -> ExecFusion:
    stages = tuple(tuple(microtask_of(t.data, s) for t in order.data) for s, order in enumerate(op.stages.data))
    return ExecFusion(text(op.ident), tuple(m.string_value() for m in op.members.data), stages,
                      loc=loc_from(op.location))


def _opt_float(attr: Optional[Attribute]) -> Optional[float]:
    return attr.value.data if isinstance(attr, FloatAttr) else None


def _pairs(attr: Optional[ArrayAttr]) -> tuple[tuple[str, int], ...]:
    return () if attr is None else tuple(a.to_pair() for a in attr.data)


def _refs(attr: Optional[ArrayAttr]) -> tuple[DataRef, ...]:
    return () if attr is None else tuple(a.to_ref() for a in attr.data)


def _node(op: ex.NodeFields, kind: str) -> ExecNode:
    # Reading `op.properties` directly avoids one accessor call per field on large graphs.
    props = op.properties
    role = props.get("role")
    alloc, src_alloc = props.get("alloc"), props.get("src_alloc")
    strategy, src_strategy = props.get("strategy"), props.get("src_strategy")
    nbytes = props.get("bytes")
    attrs = op.attributes
    return ExecNode(
        id=text(props["ident"]),
        kind=kind,
        step=int_of(props["step"]),
        order=int_of(props["order"]),
        vertex=_opt_sym(props.get("vertex")),
        role=None if role is None else role.data,
        model=_opt_sym(props.get("model")),
        container=_opt_text(props.get("container")),
        phase=_opt_int(props.get("phase")),
        nphases=_opt_int(props.get("nphases")),
        alloc=None if alloc is None else alloc.to_alloc(),
        strategy=None if strategy is None else _with_train(strategy.to_strategy(), props.get("train")),
        src_alloc=None if src_alloc is None else src_alloc.to_alloc(),
        src_strategy=None if src_strategy is None else src_strategy.to_strategy(),
        bytes=0 if nbytes is None else int_of(nbytes),
        pool=_opt_int(props.get("pool")),
        shares=() if props.get("shares") is None else tuple(int_of(d) for d in props["shares"].data),
        fraction=_opt_float(props.get("fraction")),
        version_in=_pairs(props.get("version_in")),
        version_out=_pairs(props.get("version_out")),
        data_in=_refs(props.get("data_in")),
        data_out=_refs(props.get("data_out")),
        time=_opt_float(attrs.get("time")),
        start=_opt_float(attrs.get("start")),
        finish=_opt_float(attrs.get("finish")),
        loc=loc_from(op.location),
    )


def _exec_edge(op: ex.EdgeFields, kind: str) -> ExecEdge:
    props = op.properties
    return ExecEdge(
        src=props["src"].string_value(),
        dst=props["dst"].string_value(),
        kind=kind,
        container=_opt_text(props.get("container")),
        loc=loc_from(op.location),
    )


def _device_pairs(devices: DenseArrayBase, values: ArrayAttr[FloatAttr]) -> tuple[tuple[int, float], ...]:
    return tuple(zip(devices.get_values(), (v.value.data for v in values.data)))


def _memory(op: ex.MemoryOp) -> MemoryReport:
    return MemoryReport(
        peak=_device_pairs(op.peak_devices, op.peak),
        persistent=_device_pairs(op.persistent_devices, op.persistent),
        transient=_device_pairs(op.transient_devices, op.transient),
        m_eff=_fl(op.m_eff),
        r_peak=_fl(op.r_peak),
        feasible=bool(op.feasible.value.data),
    )


def _schedule(op: ex.ScheduleOp) -> ScheduleReport:
    return ScheduleReport(
        makespan=_fl(op.makespan),
        score=_fl(op.score),
        score_pen=_fl(op.score_pen),
        util=_fl(op.util),
        p_eff=_fl(op.p_eff),
    )


_TOP_LEVEL_READERS = {
    rpeg.GraphOp: _graph,
    rpeg.ClusterOp: _cluster,
    rpeg.PlanOp: _plan,
    ex.ExecGraphOp: _exec_graph,
}
