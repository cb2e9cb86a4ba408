"""Unrolling the cyclic RPEG G° into the finite DAG G-bar over K_eval steps.

Paper: App. A-F (Def. A.6 publisher selection, Def. A.7 unrolled graph, Alg. 3, Lemma A.1,
ordered-update edges t_m,k-1 -> t_m,k). The result is stored in `Program.exec` as an ExecGraph whose
Op nodes are "<vertex>#<k>" and whose edges are typed "data", "pub" and "order"; the lowering passes
(split_quantiles.py, insert_comm.py, insert_reshard.py) later turn them into Comm/Reshard nodes and "dep" edges.
Changing tau and unrolling again is all bounded asynchrony takes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.program import VERIFY, Container, Graph, Model, Plan, Program, Vertex
from rpegc.core.check.wellformed import topological_order
from rpegc.core.lower.rules import data_read, data_written


def publisher_step(k: int, tau: int) -> Optional[int]:
    """s_m(k) = k - tau(m) - 1 (Def. A.6); None for early steps k <= tau, which use the initial weights."""
    return k - tau - 1 if k > tau else None


def consumed_version(k: int, tau: int) -> int:
    """Parameter version a step-k consumer of a model with budget tau reads: max(0, k - tau)."""
    return max(0, k - tau)


def unroll(p: Program, k: int) -> Program:
    """Alg. 3: replicate vertices and data edges per step, wire publication and ordered-update edges."""
    graph = _check_unrollable(p, k)
    models = {m.name: m for m in p.models}
    containers = {c.name: c for c in graph.containers}
    order = {name: i for i, name in enumerate(topological_order(graph))}
    vertices = sorted(graph.vertices, key=lambda v: order[v.name])
    verifiers = {f.name for f in p.verifiers}
    for v in vertices:
        if v.role == VERIFY:
            if v.model not in verifiers:
                raise RpegError(v.loc, f"verify vertex @{v.name} runs unknown verifier '@{v.model}'; declare it with "
                                       "rpeg.verifier")
        else:
            _model_of(v, models)
    nodes = tuple(
        _op_node(v, step, order[v.name], graph, models, containers, p.plan) for step in range(k) for v in vertices
    )
    edges: list[ExecEdge] = []
    for step in range(k):
        edges += _data_edges(graph, step)
        edges += _pub_edges(graph, step, models)
        edges += _order_edges(vertices, step, models)
    exec_graph = ExecGraph(graph=graph.name, steps=k, nodes=nodes, edges=tuple(edges), loc=graph.loc)
    return replace(p, exec=exec_graph)


# The exec graph grows linearly in K (each pass is linear in its size, bench/unroll_scaling.py), but its
# constant is large: the lowering pipeline takes ~30-40 ms of one core per step of examples/ppo-8gpu.rpeg
# (six vertices, 26 exec nodes per step after lowering), so K = 256 takes ~10 s and K = 1024 ~30-40 s. The
# paper evaluates K_eval = 8 steps and the score converges within a few; these bounds keep the lowering of
# a graph of up to 16 vertices within seconds.
MAX_STEPS = 256
MAX_OP_NODES = 4096  # K x |V|: op nodes of the unrolled graph, before quantile phases and communication


def _check_unrollable(p: Program, k: int) -> Graph:
    if p.graph is None:
        raise RpegError(None, "there is no rpeg.graph to unroll; add the steady-state graph to the module")
    if p.exec is not None:
        raise RpegError(
            p.exec.loc,
            f"graph @{p.graph.name} is already unrolled; unroll the cyclic graph only once "
            "(drop the exec section or change tau in the rpeg.graph and unroll that)",
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RpegError(p.graph.loc, f"unroll needs K_eval >= 1 steps, got k={k}; use e.g. unroll{{k=8}}")
    if k > MAX_STEPS:
        raise RpegError(p.graph.loc, f"unroll{{k={k}}} asks for more than {MAX_STEPS} steps; the score converges "
                                     "within a few steps (the paper uses K_eval = 8), use e.g. unroll{k=8}")
    ops = k * len(p.graph.vertices)
    if ops > MAX_OP_NODES:
        raise RpegError(p.graph.loc, f"unroll{{k={k}}} of graph @{p.graph.name} ({len(p.graph.vertices)} vertices) "
                                     f"would build {ops} op nodes, more than the limit of {MAX_OP_NODES}; use at most "
                                     f"k={MAX_OP_NODES // len(p.graph.vertices)} (the paper uses K_eval = 8)")
    for model, tau in p.graph.staleness:
        if tau < 0:
            raise RpegError(
                p.graph.staleness_loc, f"staleness of @{model} is {tau}; a staleness budget must be >= 0"
            )
    return p.graph


def _model_of(v: Vertex, models: dict[str, Model]) -> Model:
    if v.model not in models:
        raise RpegError(v.loc, f"vertex @{v.name} invokes unknown model '@{v.model}'; declare it with rpeg.model")
    return models[v.model]


def _op_node(
    v: Vertex,
    step: int,
    order: int,
    graph: Graph,
    models: dict[str, Model],
    containers: dict[str, Container],
    plan: Optional[Plan],
) -> ExecNode:
    alloc = strategy = pool = None
    if plan is not None and v.role == VERIFY:
        pool = _pool(plan, v).size
    elif plan is not None:
        placement = _placement(plan, v)
        alloc, strategy = placement.alloc, placement.strategy
    trains = v.role == "training" and models[v.model].trainable
    return ExecNode(
        id=f"{v.name}#{step}",
        kind="op",
        step=step,
        order=order,
        vertex=v.name,
        role=v.role,
        model=v.model,
        alloc=alloc,
        strategy=strategy,
        pool=pool,
        version_in=_versions_read(v, step, graph, models, containers),
        version_out=((v.model, step + 1),) if trains else (),
        data_in=tuple(DataRef(c) for c in data_read(graph, v)),
        data_out=tuple(DataRef(c) for c in data_written(graph, v)),
        loc=v.loc,
    )


def _placement(plan: Plan, v: Vertex):
    try:
        return plan.placement(v.name)  # indexed: K x |V| lookups stay linear
    except KeyError:
        pass
    raise RpegError(
        plan.loc,
        f"plan @{plan.name} has no placement for vertex @{v.name}; add "
        f"'@{v.name} at (r, n, g) extent (er, en, eg) dp = .. pp = .. tp = .. mb = ..'",
    )


def _pool(plan: Plan, v: Vertex):
    try:
        return plan.pool(v.name)
    except KeyError:
        pass
    raise RpegError(plan.loc, f"plan @{plan.name} has no pool for verify vertex @{v.name}; add '@{v.name} pool = N'")


def _versions_read(
    v: Vertex, step: int, graph: Graph, models: dict[str, Model], containers: dict[str, Container]
) -> tuple[tuple[str, int], ...]:
    """Version of every model whose weights container the vertex reads.

    A training vertex reads its own model at version k, the output of t_m,k-1 that the ordered-update
    edge carries; every other reader of a trainable model reads max(0, k - tau(m)); frozen models: 0."""
    versions: dict[str, int] = {}
    for name in v.reads:
        c = containers.get(name)
        if c is None or not c.is_weights or c.model is None:
            continue
        model = models.get(c.model)
        if model is None or not model.trainable:
            versions[c.model] = 0
        elif v.role == "training" and v.model == c.model:
            versions[c.model] = step
        else:
            versions[c.model] = consumed_version(step, graph.tau(c.model))
    return tuple(versions.items())


def _data_edges(graph: Graph, step: int) -> list[ExecEdge]:
    return [
        ExecEdge(f"{e.src}#{step}", f"{e.dst}#{step}", kind="data", container=e.container, loc=e.loc)
        for e in graph.data_edges
    ]


def _pub_edges(graph: Graph, step: int, models: dict[str, Model]) -> list[ExecEdge]:
    """(u, s_m(k)) -> (v, k) with m = mu(u); early steps k <= tau(m) get no edge (Alg. 3 l.12-19)."""
    edges = []
    for e in graph.pub_edges:
        try:
            m = graph.vertex(e.src).model
            graph.vertex(e.dst)
        except KeyError as missing:
            raise RpegError(
                e.loc, f"publication edge refers to unknown vertex '@{missing.args[0]}'; declare it with rpeg.vertex"
            ) from None
        source = publisher_step(step, graph.tau(m))
        if source is not None:
            edges.append(ExecEdge(f"{e.src}#{source}", f"{e.dst}#{step}", kind="pub", container=e.container, loc=e.loc))
    return edges


def _order_edges(vertices: list[Vertex], step: int, models: dict[str, Model]) -> list[ExecEdge]:
    """t_m,k-1 -> t_m,k for every training vertex of a trainable model: updates of one optimizer state stay ordered."""
    if step == 0:
        return []
    return [
        ExecEdge(f"{v.name}#{step - 1}", f"{v.name}#{step}", kind="order", loc=v.loc)
        for v in vertices
        if v.role == "training" and models[v.model].trainable
    ]
