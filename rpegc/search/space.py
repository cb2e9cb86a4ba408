"""Structural candidates y = (ac, tau) and the RPEG G°(y) each one determines.

Paper: Sec. VI-A and App. A-J1b (S1 applicability of actor-critic sharing, S2 staleness candidate sets,
Def. A.19 Y_cand). Actor-critic sharing is the graph transformation `rpegc.core.lower.share_actor_critic`; the staleness
budget is written into the graph, so unrolling the variant is all asynchrony takes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Program
from rpegc.core.lower.share_actor_critic import share_actor_critic, sharing_applicable
from rpegc.core.check.wellformed import topological_order


@dataclass(frozen=True)
class Variant:
    """One structural candidate: the sharing flag, tau per trainable model, and the program G°(y) (no plan)."""

    ac: bool
    tau: tuple[tuple[str, int], ...]
    program: Program

    @property
    def key(self) -> tuple:
        return (self.ac, self.tau)

    @property
    def vertex_set(self) -> tuple:
        """What the elite set and the directory cache key on: variants differing only in tau share it."""
        return tuple(sorted((v.name, v.role, v.model) for v in self.program.graph.vertices))

    def label(self) -> str:
        taus = ", ".join(f"{m}={t}" for m, t in self.tau) or "-"
        return f"ac={int(self.ac)} tau({taus})"


def base_structure(p: Program) -> Program:
    """The module's structure without plan or unrolled graph: what the optimizer transforms and places."""
    if p.graph is None:
        raise RpegError(p.workload.loc, "optimize needs an rpeg.graph; add the steady-state graph to the module")
    if p.cluster is None:
        raise RpegError(p.graph.loc, "optimize needs an rpeg.cluster to place the graph on; add one to the module")
    if p.exec is not None:
        raise RpegError(
            p.exec.loc, "optimize runs on the cyclic graph, before unroll; move optimize{...} before unroll in the pipeline"
        )
    return replace(p, plan=None, exec=None)


def structural_candidates(p: Program, taus: tuple[int, ...] = (0, 1), ac: bool = True) -> list[Variant]:
    """Y_cand in a fixed order: ac = 0 before ac = 1, then tau tuples in lexicographic order (S1, S2)."""
    if not taus or any(t < 0 for t in taus):
        raise RpegError(p.graph.loc if p.graph else None, f"staleness candidates must be >= 0, got {list(taus)}; e.g. taus=0,1")
    base = base_structure(p)
    choices = [False] + ([True] if ac and sharing_applicable(base) else [])
    out = []
    for shared in choices:
        structure = share_actor_critic(base) if shared else base
        trainable = [m.name for m in structure.models if m.trainable]
        for combo in itertools.product(sorted(set(taus)), repeat=len(trainable)):
            tau = tuple(zip(trainable, combo))
            graph = replace(structure.graph, staleness=tau)
            out.append(Variant(shared, tau, replace(structure, graph=graph)))
    return out


def ordered_vertices(p: Program):
    """Vertices of G° in the topological order unroll uses (ties by declaration order)."""
    order = {name: i for i, name in enumerate(topological_order(p.graph))}
    return tuple(sorted(p.graph.vertices, key=lambda v: order[v.name]))
