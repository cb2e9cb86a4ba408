"""Communication node insertion (lowering stage 2 and the transfer case of stage 4).

Paper: App. A-G stages 2 and 4, Def. A.8 payloads; docs/cost-model-spec.md 5.1 and 5.3 items 1 and 3.
Every data edge becomes a precedence edge (same allocation) or u -> Comm -> v (different allocation,
payload |a|s(a), or its phase share after split-quantiles). Every publication edge between different
allocations becomes u -> Comm -> v carrying the model's weights with the partial-overlap payload; a
Comm that already installs the same model version on the same destination allocation is reused.
Same-allocation publication edges are left for insert-reshard. A data Comm reads the producer's copy on the
source allocation (its phase on a phase edge, every phase of a split producer, else the whole container) and
writes what the consumer reads on the destination (its phase, else the whole container).
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.lower.edit import (
    NodeIds,
    dep,
    has_kind,
    lowering_input,
    out_of_order,
    place_before_consumers,
    unique_edges,
)
from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecNode
from rpegc.core.ir.errors import RpegError
from rpegc.core.lower.rules import (
    COMM,
    container_payload,
    data_action,
    data_bytes,
    phase_share,
    publication_action,
    publication_bytes,
    published_weights,
    weight_bytes,
)
from rpegc.core.ir.program import Program
from rpegc.core.ir.geometry import Alloc

PASS = "insert-comm"


def insert_comm(p: Program) -> Program:
    """Stage 2 and the transfer case of stage 4 of Alg. 4; run after split-quantiles."""
    g = lowering_input(p, PASS)
    if has_kind(g, "reshard"):
        raise out_of_order(g, PASS, "insert-reshard")
    if has_kind(g, "comm"):
        raise RpegError(g.loc, f"{PASS} already ran on this graph; run it once, after split-quantiles")
    nodes = {n.id: n for n in g.nodes}
    ids = NodeIds(g, "c")
    inserted: dict[str, list[ExecNode]] = {}
    installed: dict[tuple[str, int, Alloc], str] = {}  # (model, version, destination) -> Comm id
    edges: list[ExecEdge] = []
    for e in g.edges:
        u, v = nodes[e.src], nodes[e.dst]
        if e.kind == "data" and data_action(u.alloc, v.alloc) != COMM:
            edges.append(dep(u.id, v.id, e.loc))
        elif e.kind == "data":
            c = _data_comm(p, e, u, v, ids.fresh())
            inserted.setdefault(v.id, []).append(c)
            edges += [dep(u.id, c.id, e.loc), dep(c.id, v.id, e.loc)]
        elif e.kind == "pub" and publication_action(u.alloc, u.strategy, v.alloc, v.strategy) == COMM:
            model, version = published_weights(p, e.container, u)
            key = (model, version, v.alloc)
            if key not in installed:
                c = _weight_comm(p, e, u, v, model, version, ids.fresh())
                installed[key] = c.id
                inserted.setdefault(v.id, []).append(c)
                edges.append(dep(u.id, c.id, e.loc))
            edges.append(dep(installed[key], v.id, e.loc))
        else:
            edges.append(e)
    return replace(p, exec=replace(g, nodes=place_before_consumers(g.nodes, inserted), edges=unique_edges(edges)))


def _data_comm(p: Program, e: ExecEdge, u: ExecNode, v: ExecNode, node_id: str) -> ExecNode:
    share = phase_share(u, v)
    c = e.container
    if share is not None or u.phase is None:
        sent: tuple[DataRef, ...] = (DataRef(c, u.phase if share is not None else None),)
    else:
        sent = tuple(DataRef(c, q) for q in range(1, (u.nphases or 1) + 1))
    return ExecNode(
        id=node_id,
        kind="comm",
        step=v.step,
        order=v.order,
        container=e.container,
        alloc=v.alloc,
        src_alloc=u.alloc,
        bytes=data_bytes(container_payload(p, e.container, e.loc), share),
        fraction=share,
        data_in=sent,
        data_out=(DataRef(c, u.phase if share is not None else None),),
        loc=e.loc,
    )


def _weight_comm(
    p: Program, e: ExecEdge, u: ExecNode, v: ExecNode, model: str, version: int, node_id: str
) -> ExecNode:
    return ExecNode(
        id=node_id,
        kind="comm",
        step=v.step,
        order=v.order,
        model=model,
        container=e.container,
        alloc=v.alloc,
        src_alloc=u.alloc,
        bytes=publication_bytes(weight_bytes(p, model, e.loc), u.alloc, v.alloc),
        version_in=((model, version),),
        loc=e.loc,
    )
