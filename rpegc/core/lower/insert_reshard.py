"""Weight redistribution (lowering stage 3 and the reshard case of stage 4); completes lowering.

Paper: App. A-G stage 3 (Pairs(m), Def. A.10 shadow pairs) and stage 4; docs/cost-model-spec.md 5.2-5.3.
Per step, each consecutive pair (u, v) of a trainable model in topological order of G° gets nothing
(shadow pair, or same devices and layout), u -> Reshard -> v (same devices, other layout, payload
N_m s_b) or a bare u -> v (different devices). Publication edges that insert-comm left (same devices)
become a precedence edge (same layout) or a Reshard (other layout), reusing a Reshard that already
installs the same version on the same devices and layout. Ordered-update edges become precedence
edges. Afterwards every edge is a "dep" edge and the graph is marked lowered.
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.lower.edit import Endpoints, NodeIds, dep, lowering_input, place_before_consumers, unique_edges
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.lower.rules import (
    COMM,
    DEP,
    RESHARD,
    model_pairs,
    pair_action,
    publication_action,
    published_weights,
    weight_bytes,
)
from rpegc.core.ir.program import Program
from rpegc.core.ir.geometry import Alloc

PASS = "insert-reshard"


def insert_reshard(p: Program) -> Program:
    """Stage 3 and the reshard case of stage 4 of Alg. 4; needs insert-comm first; sets `lowered`."""
    g = lowering_input(p, PASS)
    nodes = {n.id: n for n in g.nodes}
    _require_comm_inserted(g, nodes)
    trainable = {m.name for m in p.models if m.trainable}
    ids = NodeIds(g, "r")
    inserted: dict[str, list[ExecNode]] = {}
    installed: dict[tuple[str, int, Alloc, tuple[int, int, int]], str] = {}
    edges: list[ExecEdge] = []
    for e in g.edges:
        u, v = nodes[e.src], nodes[e.dst]
        if e.kind != "pub":
            edges.append(dep(u.id, v.id, e.loc))
            continue
        model, version = published_weights(p, e.container, u)
        if model not in trainable or publication_action(u.alloc, u.strategy, v.alloc, v.strategy) == DEP:
            edges.append(dep(u.id, v.id, e.loc))
            continue
        key = (model, version, v.alloc, v.strategy.layout())
        if key not in installed:
            r = _reshard(p, u, v, model, version, ids.fresh(), e.loc)
            installed[key] = r.id
            inserted.setdefault(v.id, []).append(r)
            edges.append(dep(u.id, r.id, e.loc))
        edges.append(dep(installed[key], v.id, e.loc))
    edges += _pair_edges(p, g, trainable, ids, inserted, installed)
    lowered = replace(g, nodes=place_before_consumers(g.nodes, inserted), edges=unique_edges(edges), lowered=True)
    return replace(p, exec=lowered)


def _require_comm_inserted(g: ExecGraph, nodes: dict[str, ExecNode]) -> None:
    for e in g.edges:
        u, v = nodes[e.src], nodes[e.dst]
        crosses = e.kind == "pub" and publication_action(u.alloc, u.strategy, v.alloc, v.strategy) == COMM
        if e.kind == "data" or crosses:
            raise RpegError(
                e.loc,
                f"{PASS} needs insert-comm first: the {e.kind} edge {e.src} -> {e.dst} has not been "
                f"lowered; run insert-comm before {PASS}",
            )


def _producers(g: ExecGraph) -> dict[tuple[str, int], str]:
    """(model, version) -> id of the training op that produces that version."""
    return {(m, ver): n.id for n in g.nodes for m, ver in n.version_out}


def _pair_edges(
    p: Program,
    g: ExecGraph,
    trainable: set[str],
    ids: NodeIds,
    inserted: dict[str, list[ExecNode]],
    installed: dict[tuple[str, int, Alloc, tuple[int, int, int]], str],
) -> list[ExecEdge]:
    ends = Endpoints(g)
    producers = _producers(g)
    vertices = sorted({(n.order, n.vertex, n.model) for n in g.nodes if n.kind == "op"})
    edges = []
    for model, u_vertex, v_vertex in model_pairs([(vx, m) for _, vx, m in vertices], trainable):
        tau = p.graph.tau(model) if p.graph is not None else 0
        for step in range(g.steps):
            if (u_vertex, step) not in ends or (v_vertex, step) not in ends:
                continue
            u, v = ends.last(u_vertex, step), ends.first(v_vertex, step)
            action = pair_action(tau, u.alloc, u.strategy, v.alloc, v.strategy)
            if action == DEP:
                edges.append(dep(u.id, v.id, v.loc))
            elif action == RESHARD:
                version = dict(v.version_in).get(model, dict(u.version_in).get(model, step))
                key = (model, version, v.alloc, v.strategy.layout())
                if key in installed:  # a publication already installs this version in v's layout
                    edges += [dep(u.id, v.id, v.loc), dep(installed[key], v.id, v.loc)]
                    continue
                r = _reshard(p, u, v, model, version, ids.fresh(), v.loc)
                installed[key] = r.id
                inserted.setdefault(v.id, []).append(r)
                edges += [dep(u.id, r.id, v.loc), dep(r.id, v.id, v.loc)]
                # Under staleness u may have read an older version than v needs: the Reshard moves v's
                # version, so it must also wait for the training op that produces it.
                if (model, version) in producers:
                    edges.append(dep(producers[(model, version)], r.id, v.loc))
    return edges


def _reshard(p: Program, u: ExecNode, v: ExecNode, model: str, version: int, node_id: str, loc: Loc) -> ExecNode:
    return ExecNode(
        id=node_id,
        kind="reshard",
        step=v.step,
        order=v.order,
        model=model,
        alloc=v.alloc,
        strategy=v.strategy.bare(),  # a layout: the operators' training fields stay with them
        src_alloc=u.alloc,
        src_strategy=u.strategy.bare(),
        bytes=weight_bytes(p, model, loc),
        version_in=((model, version),),
        loc=loc,
    )
