"""The budget across structural variants by promise: successive halving over Y_cand, then the polish.

Beyond the paper, which gives every structural candidate (Alg. 1, outer loop over Y_cand) an equal share.
The annealing budget is spent in rungs: every variant gets a share in the first rung, then the better half
(by the best feasible objective value each has found; variants without a feasible plan by their lowest
peak) continues, halving down to `SearchConfig.final_variants` (two) — for six variants the rungs hold 6,
3 and 2 of them, each rung an equal part of what is left. A variant keeps its chains between rungs, so a
later share extends its search. Between rungs the variants exchange Score_star and the elite sets of their
vertex set (the paper shares the elites by staleness variants), and from the second rung on a variant gets
the best plan of each other vertex set, carried across actor-critic sharing with its placement (carry.py),
as candidate elites; nothing else, so a variant's search is the same whichever process runs it. A variant
whose neighbourhood is exhausted takes no further share; what it leaves goes to the others. Then the
polish (`anneal.polish_reserve` of the budget, plus whatever the annealing left) runs on the best plan in
its own variant and, with what that leaves, in the variants with the same vertices (the same placement
under another tau).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from rpegc.search.anneal import SearchConfig
from rpegc.search.compact import Choice, Evaluation
from rpegc.search.evaluator import EvalStats
from rpegc.search.workers import AnnealTask, Elites, PolishTask, Report
from rpegc.search.space import Variant


def rung_sizes(n: int, last: int = 2) -> list[int]:
    """Variants per rung: n, then halving (rounded up) down to `last` (two: both cores stay busy to the end,
    and the last rung does not bet everything on one structure)."""
    sizes = [n]
    while sizes[-1] > last:
        sizes.append(max(last, -(-sizes[-1] // 2)))
    return sizes


def shares(total: int, k: int) -> list[int]:
    """`total` evaluations split over k tasks, the remainder to the first ones."""
    return [total // k + (i < total % k) for i in range(k)]


@dataclass
class VariantRecord:
    """What the coordinator knows of one variant, from its reports."""

    best: Optional[tuple[Choice, Evaluation]] = None
    min_r_peak: float = math.inf
    stats: EvalStats = field(default_factory=EvalStats)
    chains: int = 0
    rounds: int = 0
    seconds: float = 0.0
    exhausted: bool = False
    skipped: Optional[tuple] = None  # (loc, message) when the structure could not be seeded
    placements: tuple = ()  # of `best` (carry.Carried), to carry it to the variants with other vertices
    seeded: bool = False  # its extra plans (the greedy baseline) were sent


@dataclass
class Board:
    """The coordinator's view of the search: per variant what it found, Score_star and the elite sets."""

    variants: tuple[Variant, ...]
    config: SearchConfig
    records: list[VariantRecord] = field(init=False)
    best_raw: float = 0.0
    elites: dict = field(default_factory=dict)  # vertex set -> elites, best first
    polish_stats: EvalStats = field(default_factory=EvalStats)

    def __post_init__(self) -> None:
        self.records = [VariantRecord() for _ in self.variants]

    def value(self, e: Evaluation) -> float:
        return self.config.value(e, self.best_raw)

    def stats(self) -> EvalStats:
        """Every variant's counters and the polish's, summed."""
        total = EvalStats()
        for r in self.records:
            total.add(r.stats)
        total.add(self.polish_stats)
        return total

    @property
    def evaluations(self) -> int:
        return self.stats().evaluations

    def absorb(self, reports: list[Report], polish: bool = False) -> None:
        for rep in reports:
            rec = self.records[rep.index]
            rec.skipped = rep.skipped
            rec.exhausted = rec.exhausted or rep.exhausted
            if rep.best is not None and (rec.best is None or self.value(rep.best[1]) > self.value(rec.best[1])):
                rec.best, rec.placements = rep.best, rep.placements
            rec.min_r_peak = min(rec.min_r_peak, rep.min_r_peak)
            (self.polish_stats if polish else rec.stats).add(rep.stats)
            rec.chains += rep.chains
            rec.rounds += rep.rounds
            rec.seconds += rep.seconds
            self.best_raw = max(self.best_raw, rep.best_raw)
            if rep.elites:
                self._merge_elites(self.variants[rep.index].vertex_set, rep.elites)

    def _merge_elites(self, vertex_set, elites: Elites) -> None:
        merged: dict[Choice, float] = dict((c, v) for v, c in self.elites.get(vertex_set, ()))
        for v, c in elites:
            merged[c] = max(v, merged.get(c, -math.inf))
        ranked = sorted(((v, c) for c, v in merged.items()), key=lambda x: (-x[0], x[1]))
        self.elites[vertex_set] = tuple(ranked[: self.config.k_elite])

    def promise(self, i: int) -> tuple:
        """Sort key, best first: a feasible plan's value, else the lowest peak (then the variant order)."""
        rec = self.records[i]
        if rec.best is not None:
            return (0, -self.value(rec.best[1]), i)
        return (1, rec.min_r_peak, i)

    def carried(self, i: int) -> tuple:
        """For variant i, the placements of the best plan of each other vertex set (a structure move across
        actor-critic sharing, carry.py)."""
        best: dict[tuple, int] = {}
        for j in self.live():
            vs = self.variants[j].vertex_set
            if vs != self.variants[i].vertex_set and self.records[j].best is not None:
                if vs not in best or self.promise(j) < self.promise(best[vs]):
                    best[vs] = j
        return tuple(self.records[j].placements for j in best.values())

    def live(self) -> list[int]:
        return [i for i, r in enumerate(self.records) if r.skipped is None]

    def best(self) -> Optional[tuple[int, Choice, Evaluation]]:
        ranked = sorted((i for i in self.live() if self.records[i].best is not None), key=self.promise)
        if not ranked:
            return None
        i = ranked[0]
        return (i, *self.records[i].best)


def anneal_variants(pool, board: Board, max_evals: Optional[int], deadline: Optional[float],
                    extra: dict[int, tuple[Choice, ...]], on_report: Optional[Callable[[Board], None]] = None) -> None:
    """The annealing phase: rungs of successive halving until the budget is spent."""
    sizes = rung_sizes(len(board.variants), board.config.final_variants)
    alive = list(range(len(board.variants)))
    for r, size in enumerate(sizes):
        if r:  # skipped variants are known after the first rung
            alive = sorted(board.live(), key=board.promise)[:size]
        active = [i for i in alive if not board.records[i].exhausted]
        left = None if max_evals is None else max_evals - board.evaluations
        if not active or (left is not None and left <= 0) or (deadline is not None and time.monotonic() >= deadline):
            break
        rungs_left = len(sizes) - r
        rung_end = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / rungs_left
        parts = [None] * len(active) if left is None else shares(left // rungs_left if rungs_left > 1 else left,
                                                                 len(active))
        tasks = []
        for i, n in zip(active, parts):
            rec = board.records[i]
            carried = board.carried(i) if r and board.config.carry else ()
            tasks.append(AnnealTask(i, n, board.best_raw, board.elites.get(board.variants[i].vertex_set, ()),
                                    () if rec.seeded else extra.get(i, ()), carried))
            rec.seeded = True
        board.absorb(pool.anneal(tasks, rung_end))
        if on_report is not None:
            on_report(board)


def polish_best(pool, board: Board, max_evals: Optional[int], deadline: Optional[float]) -> Optional[tuple[int, Choice, Evaluation]]:
    """The polish of the best plan, first in its own variant with the whole polish budget, then, with what that
    leaves, its result in the variants with the same vertices (a structure move that keeps the placement: a
    plan found under tau = 0 may be better under tau = 1), in parallel with equal shares. The best feasible
    result, or the unpolished plan.

    In this order because one pass of the polish costs the sum of the directory sizes (~12,000 evaluations at
    128 GPUs): split evenly, a small budget pays for less than a pass in each variant (the 13B strong-scaling
    plan at 128 GPUs reached 139K tokens/s with 17,600 evaluations of polish split over two variants, 150-158K
    with them spent on one)."""
    found = board.best()
    if found is None:
        return None
    i = found[0]
    best = _better(board, found, _polish(pool, board, [i], found[1], max_evals, deadline))
    siblings = [j for j in board.live() if j != i and board.variants[j].vertex_set == board.variants[i].vertex_set]
    if siblings:
        best = _better(board, best, _polish(pool, board, siblings, best[1], max_evals, deadline))
    return best


def _polish(pool, board: Board, targets: list[int], choice: Choice, max_evals: Optional[int],
            deadline: Optional[float]) -> list[Report]:
    """`choice` polished in each of `targets` with equal shares of what the budget has left; a target whose
    share is nothing is left out (evaluating the plan there would already exceed the budget)."""
    left = None if max_evals is None else max(0, max_evals - board.evaluations)
    parts = [None] * len(targets) if left is None else shares(left, len(targets))
    tasks = [PolishTask(j, choice, n, board.best_raw) for j, n in zip(targets, parts) if n is None or n > 0]
    if not tasks:
        return []
    reports = pool.polish(tasks, deadline)
    board.absorb(reports, polish=True)
    return reports


def _better(board: Board, best: tuple[int, Choice, Evaluation], reports: list[Report]) -> tuple[int, Choice, Evaluation]:
    for rep in reports:
        c, e = rep.polished
        if e.feasible and board.value(e) > board.value(best[2]):
            best = (rep.index, c, e)
    return best
