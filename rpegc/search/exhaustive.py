"""The exact optimum of a small instance: every plan of every structural variant, scored by the batched evaluator.

Issue 16, item 5 (an optimality check): for an instance whose plan space is small enough to enumerate, the best
memory-feasible configuration is known exactly, so the annealing's result can be compared with it. The
space is the optimizer's own (the same structural candidates, directories and objective, Sec. VI-A and
App. A-J), so "optimal" means optimal for `optimize` itself.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import Hardware
from rpegc.core.ir.program import Program
from rpegc.search.compact import Choice, CompactVariant
from rpegc.search.evaluator import Evaluator
from rpegc.search.space import Variant, base_structure, structural_candidates

CHUNK = 20_000  # plans per batched call: large enough to amortise the call, small enough for its arrays


@dataclass(frozen=True)
class Optimum:
    """The best feasible configuration of an enumerated space (raw throughput score, as `optimize` reports)."""

    score: float
    variant: Optional[Variant]
    choice: Optional[Choice]
    plans: int  # configurations enumerated over all variants
    feasible: int  # how many of them fit in memory


def _compiled(evaluator: Evaluator, p: Program, taus: tuple[int, ...], ac: bool) -> list[CompactVariant]:
    """The optimizer's structural variants of `p` that have plans (a vertex that fits nowhere leaves none)."""
    out = []
    for variant in structural_candidates(base_structure(p), taus, ac):
        try:
            out.append(evaluator.compile(variant))
        except RpegError:
            continue
    return out


def plan_count(p: Program, hw: Hardware, cost: CostOptions = CostOptions(), taus: tuple[int, ...] = (0, 1),
               ac: bool = True, steps: int = 8) -> int:
    """How many configurations `exhaustive_optimum` would evaluate (the product of directory sizes, summed)."""
    return sum(math.prod(len(d) for d in cv.dirs) for cv in _compiled(Evaluator(hw, cost, steps), p, taus, ac))


def exhaustive_optimum(p: Program, hw: Hardware, cost: CostOptions = CostOptions(), taus: tuple[int, ...] = (0, 1),
                       ac: bool = True, steps: int = 8, max_plans: int = 5_000_000) -> Optimum:
    """The highest-scoring memory-feasible configuration over the whole space (ties: the first in variant
    order and lexicographic directory order). Refuses a space of more than `max_plans` configurations."""
    evaluator = Evaluator(hw, cost, steps)
    compiled = _compiled(evaluator, p, taus, ac)
    count = sum(math.prod(len(d) for d in cv.dirs) for cv in compiled)
    if count > max_plans:
        raise RpegError(None, f"the plan space has {count:,} configurations, more than max_plans = {max_plans:,}; "
                              "enumerate a smaller instance (fewer GPUs or vertices)")
    best_score, best_variant, best_choice = -math.inf, None, None
    feasible = 0
    for cv in compiled:
        batched = evaluator.batched(cv.variant)
        grid = itertools.product(*(range(len(d)) for d in cv.dirs))
        while True:
            chunk = np.array(list(itertools.islice(grid, CHUNK)), dtype=np.int64)
            if not len(chunk):
                break
            r = batched.evaluate(chunk)
            feasible += int(r.feasible.sum())
            scores = np.where(r.feasible, r.score, -math.inf)
            i = int(np.argmax(scores))
            if scores[i] > best_score:
                best_score, best_variant, best_choice = float(scores[i]), cv.variant, tuple(int(x) for x in chunk[i])
    return Optimum(best_score, best_variant, best_choice, count, feasible)
