"""Editing an ExecGraph during lowering: pass preconditions, placements, phase endpoints, new nodes.

Paper: App. A-G, Alg. 4. The lowering stages run as three separate passes in a fixed order
(split-quantiles, insert-comm, insert-reshard); this module holds what they share, so each pass file
contains only its own stage rules. Its order checks guard the passes where they run without the driver (the API,
xdsl-opt): the driver refuses the same orders before anything runs, from the passes' declarations
(rpegc/core/ir/stages.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.program import VERIFY, Plan, Program
from rpegc.core.ir.stages import LOWERING_ORDER


def lowering_input(p: Program, pass_name: str) -> ExecGraph:
    """The unrolled graph of `p` with every Op node placed; errors say which pass to run first."""
    if p.exec is None:
        raise RpegError(
            p.graph.loc if p.graph else None,
            f"{pass_name} needs an unrolled graph; run unroll{{k=...}} before {pass_name}",
        )
    if p.plan is None:
        raise RpegError(
            p.exec.loc,
            f"{pass_name} needs an execution plan; add an rpeg.plan for graph @{p.exec.graph} "
            f"(or run optimize) before {pass_name}",
        )
    if p.exec.lowered:
        raise RpegError(
            p.exec.loc,
            f"{pass_name} cannot run on a graph that insert-reshard already lowered; "
            f"the lowering passes run once, in the order {LOWERING_ORDER}",
        )
    _check_edges(p.exec)
    return _placed(p.exec, p.plan)


def out_of_order(g: ExecGraph, pass_name: str, must_precede: str) -> RpegError:
    return RpegError(
        g.loc,
        f"{pass_name} must run before {must_precede}, which already ran on this graph; "
        f"run the lowering passes once, in the order {LOWERING_ORDER}",
    )


def has_kind(g: ExecGraph, kind: str) -> bool:
    return any(n.kind == kind for n in g.nodes)


def _check_edges(g: ExecGraph) -> None:
    ids = {n.id for n in g.nodes}
    for e in g.edges:
        for end in (e.src, e.dst):
            if end not in ids:
                raise RpegError(e.loc, f"edge {e.src} -> {e.dst} refers to unknown node '{end}'; declare the node")


def _placed(g: ExecGraph, plan: Plan) -> ExecGraph:
    """Fill sigma, Pi and mb from the plan into Op nodes unrolled before the plan was attached."""
    placements = {pl.vertex: pl for pl in plan.placements}
    pools = {pool.vertex: pool for pool in plan.pools}
    nodes = []
    for n in g.nodes:
        if n.kind == "op" and n.role == VERIFY:
            if n.pool is None and n.vertex not in pools:
                raise RpegError(plan.loc, f"plan @{plan.name} has no pool for verify vertex @{n.vertex}; add "
                                          f"'@{n.vertex} pool = N'")
            n = n if n.pool is not None else n.with_(pool=pools[n.vertex].size)
        elif n.kind == "op" and (n.alloc is None or n.strategy is None):
            pl = placements.get(n.vertex)
            if pl is None:
                raise RpegError(
                    plan.loc,
                    f"plan @{plan.name} has no placement for vertex @{n.vertex}; add "
                    f"'@{n.vertex} at (r, n, g) extent (er, en, eg) dp = .. pp = .. tp = .. mb = ..'",
                )
            n = n.with_(alloc=n.alloc or pl.alloc, strategy=n.strategy or pl.strategy)
        nodes.append(n)
    return replace(g, nodes=tuple(nodes))


class Endpoints:
    """Which sub-node of an unrolled vertex an edge attaches to: incoming edges enter the first
    quantile phase, outgoing edges leave the last one; an unsplit Op node is both."""

    def __init__(self, g: ExecGraph):
        self._first: dict[tuple[str, int], ExecNode] = {}
        self._last: dict[tuple[str, int], ExecNode] = {}
        for n in g.nodes:
            if n.kind != "op":
                continue
            key = (n.vertex, n.step)
            phase = n.phase or 0
            if key not in self._first or phase < (self._first[key].phase or 0):
                self._first[key] = n
            if key not in self._last or phase > (self._last[key].phase or 0):
                self._last[key] = n

    def first(self, vertex: str, step: int) -> ExecNode:
        return self._first[(vertex, step)]

    def last(self, vertex: str, step: int) -> ExecNode:
        return self._last[(vertex, step)]

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._first


class NodeIds:
    """Fresh ids "<prefix><N>" numbered from 0 in creation order, skipping ids already in the graph."""

    def __init__(self, g: ExecGraph, prefix: str):
        self._taken = {n.id for n in g.nodes}
        self._prefix = prefix
        self._next = 0

    def fresh(self) -> str:
        while f"{self._prefix}{self._next}" in self._taken:
            self._next += 1
        node_id = f"{self._prefix}{self._next}"
        self._taken.add(node_id)
        return node_id


def dep(src: str, dst: str, loc: Loc) -> ExecEdge:
    return ExecEdge(src, dst, kind="dep", loc=loc)


def place_before_consumers(nodes: Iterable[ExecNode], inserted: dict[str, list[ExecNode]]) -> tuple[ExecNode, ...]:
    """Put each new Comm/Reshard node just before the first node it feeds, so printed graphs read in order."""
    out: list[ExecNode] = []
    for n in nodes:
        out += inserted.get(n.id, [])
        out.append(n)
    return tuple(out)


def unique_edges(edges: Iterable[ExecEdge]) -> tuple[ExecEdge, ...]:
    """Drop repeated (src, dst, kind, container) edges, keeping the first; duplicate deps collapse."""
    seen = set()
    out = []
    for e in edges:
        key = (e.src, e.dst, e.kind, e.container)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return tuple(out)
