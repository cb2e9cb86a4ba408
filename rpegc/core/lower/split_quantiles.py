"""Response-length-aware sub-node splitting of generation and downstream inference (lowering stage 1).

Paper: App. A-G stage 1, Def. A.9 and Alg. 4 lines 3-6; docs/cost-model-spec.md 5.3 item 4.
A generation Op node with a data edge to an inference Op node on disjoint devices becomes Q
sub-nodes "<vertex>#<k>.q<i>" chained on its devices (phase 1 includes the prefill); each such
inference node likewise. Generation phase q feeds inference phase q (the data edge is copied per
phase; insert-comm scales its payload by the phase share). Nothing is split on shared devices.
Data bindings follow: a sub-node writes its phase of each container; a reader fed by a phase edge reads
its phase; a reader of a split producer through another edge reads every phase on the same devices (its
dependency on the last phase makes them all present) and the whole container elsewhere (the Comm that
insert-comm adds gathers the phases); a reader of an unsplit producer reads the whole container.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from rpegc.core.lower.edit import Endpoints, dep, has_kind, lowering_input, out_of_order, unique_edges
from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.errors import RpegError
from rpegc.core.lower.rules import DEP, data_action, is_phase_pair, phase_shares
from rpegc.core.ir.program import Program

PASS = "split-quantiles"


def split_quantiles(p: Program, enabled: bool = True) -> Program:
    """Stage 1 of Alg. 4; returns `p` unchanged when disabled, without quantiles or with Q = 1."""
    g = lowering_input(p, PASS)
    if has_kind(g, "comm") or has_kind(g, "reshard"):
        raise out_of_order(g, PASS, "insert-comm")
    if any(n.phase is not None for n in g.nodes):
        raise RpegError(g.loc, f"{PASS} already ran on this graph; run it once, right after unroll")
    if not enabled or p.graph is None:
        return p
    shares = phase_shares(p.graph)
    if len(shares) < 2:
        return p  # Q = 1 is the monolithic operator (Def. A.9)
    return replace(p, exec=_split(g, shares))


def phase_edges(g: ExecGraph) -> list[ExecEdge]:
    """Data edges generation -> inference between disjoint allocations: the edges that get phases."""
    nodes = {n.id: n for n in g.nodes}
    return [e for e in g.edges if e.kind == "data" and _is_phase_edge(nodes[e.src], nodes[e.dst])]


def _is_phase_edge(src: ExecNode, dst: ExecNode) -> bool:
    return src.kind == "op" and dst.kind == "op" and is_phase_pair(src.role, src.alloc, dst.role, dst.alloc)


def _split(g: ExecGraph, shares: tuple[float, ...]) -> ExecGraph:
    to_phase = phase_edges(g)
    split_ids = {e.src for e in to_phase} | {e.dst for e in to_phase}
    by_id = {n.id: n for n in g.nodes}
    reads = _Reads(split_ids, {(e.dst, e.container) for e in to_phase},
                   {(e.dst, e.container): by_id[e.src] for e in g.edges if e.kind == "data"}, len(shares))
    nodes: list[ExecNode] = []
    chains: list[ExecEdge] = []
    for n in g.nodes:
        if n.id not in split_ids:
            nodes.append(n.with_(data_in=reads.of(n, None)))
            continue
        phases = _phases(n, shares, reads)
        nodes += phases
        chains += [dep(a.id, b.id, n.loc) for a, b in zip(phases, phases[1:])]
    split = replace(g, nodes=tuple(nodes))
    ends = Endpoints(split)
    edges = list(chains)
    phased = set(to_phase)
    for e in g.edges:
        src, dst = by_id[e.src], by_id[e.dst]
        if e in phased:
            edges += [replace(e, src=f"{e.src}.q{q}", dst=f"{e.dst}.q{q}") for q in range(1, len(shares) + 1)]
        else:
            edges.append(replace(e, src=_out_end(src, ends).id, dst=_in_end(dst, ends).id))
    return replace(split, edges=unique_edges(edges))


@dataclass(frozen=True)
class _Reads:
    """The data a node reads once its producers are split."""

    split_ids: set[str]
    phased: set[tuple[str, str]]  # (reader id, container) of the phase edges
    producer: dict[tuple[str, str], ExecNode]  # (reader id, container) -> the producer
    q_count: int

    def of(self, n: ExecNode, phase: Optional[int]) -> tuple[DataRef, ...]:
        out: list[DataRef] = []
        for d in n.data_in:
            u = self.producer.get((n.id, d.container))
            if (n.id, d.container) in self.phased:
                out.append(DataRef(d.container, phase))
            elif u is not None and u.id in self.split_ids and data_action(u.alloc, n.alloc) == DEP:
                out += [DataRef(d.container, q) for q in range(1, self.q_count + 1)]
            else:
                out.append(d)
        return tuple(out)


def _phases(n: ExecNode, shares: tuple[float, ...], reads: _Reads) -> list[ExecNode]:
    q_count = len(shares)
    return [
        n.with_(id=f"{n.id}.q{q}", phase=q, nphases=q_count, fraction=share, data_in=reads.of(n, q),
                data_out=tuple(DataRef(d.container, q) for d in n.data_out))
        for q, share in enumerate(shares, start=1)
    ]


def _out_end(n: ExecNode, ends: Endpoints) -> ExecNode:
    return ends.last(n.vertex, n.step) if n.kind == "op" else n


def _in_end(n: ExecNode, ends: Endpoints) -> ExecNode:
    return ends.first(n.vertex, n.step) if n.kind == "op" else n
