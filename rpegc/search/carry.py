"""A plan carried across actor-critic sharing: a structure move that keeps the placement.

Beyond the paper, which searches every structural candidate y of Y_cand (Sec. VI-A, S1) on its own. With
sharing, the actor's and the critic's trainers become one vertex; without it, the shared trainer is two
again; every other vertex keeps its name. So a placement found under one sharing choice is a start under
the other: `carried_choices` maps a plan's placements onto a compiled variant's directories. A vertex takes
the placement of the vertex of the same name, else that of each vertex with the same role (one carried plan
per such vertex, at most MAX_CARRIED plans); an (allocation, strategy) pair that is not among the vertex's
candidates falls back to its fastest candidate on the same allocation, and a vertex with neither carries
nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

from rpegc.core.ir.geometry import Alloc, Strategy
from rpegc.search.compact import Choice, CompactVariant
from rpegc.search.directory import VertexDirectory

MAX_CARRIED = 4


@dataclass(frozen=True)
class Carried:
    """One vertex's placement in a plan of another structural variant."""

    vertex: str
    role: str
    alloc: Alloc
    strategy: Strategy


def placements_of(cv: CompactVariant, choice: Choice) -> tuple[Carried, ...]:
    allocs, strats = cv.placement(choice)
    return tuple(Carried(v.name, v.role, a, s) for v, a, s in zip(cv.vertices, allocs, strats))


def carried_choices(cv: CompactVariant, plan: tuple[Carried, ...]) -> list[Choice]:
    """The plans of `cv`'s variant that keep the placements of `plan` (none if a vertex cannot keep one)."""
    options = []
    for v, d in zip(cv.vertices, cv.dirs):
        sources = [c for c in plan if c.vertex == v.name] or [c for c in plan if c.role == v.role]
        picks = list(dict.fromkeys(i for i in (_candidate(d, c) for c in sources) if i is not None))
        if not picks:
            return []
        options.append(picks)
    return [tuple(c) for c in itertools.islice(itertools.product(*options), MAX_CARRIED)]


def _candidate(d: VertexDirectory, c: Carried) -> Optional[int]:
    """The directory index of the carried placement, or of the fastest candidate on its allocation."""
    exact = d.index(c.alloc, c.strategy)
    if exact is not None:
        return exact
    return next((i for i, a in enumerate(d.allocs) if a == c.alloc), None)
