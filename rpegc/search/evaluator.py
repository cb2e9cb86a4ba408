"""EVALUATECACHED (Alg. 6, App. A-J2c): compiled variants, the evaluation cache and its statistics.

A configuration C = (G°(y), P) is identified by the variant key (ac, tau) and its placement: for each
vertex (in the variant's vertex order) the allocation origin and extent and (dp, pp, tp, mb). Within a run
a directory index names exactly one such placement, so the cache key is (variant key, directory indices).
Only cache misses count as evaluations (the paper's budget unit). Misses of one call are evaluated by the
plain-Python reference path when there are few of them and by the numpy batched path otherwise; both give
identical results (tests/test_search_differential.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import Hardware
from rpegc.search.batched import BatchEvaluator
from rpegc.search.compact import Choice, CompactVariant, Evaluation
from rpegc.search.directory import DirectoryCache, DirectoryRules
from rpegc.search.space import Variant, ordered_vertices

# Misses per call from which the batched path is cheaper than the reference path: on the 64-GPU workload the
# reference path takes ~1.3 ms a plan, the batched path ~1.9 ms for two and ~2.7 ms for eight.
BATCH_THRESHOLD = 2


@dataclass
class EvalStats:
    evaluations: int = 0  # cache misses (full evaluations)
    hits: int = 0
    seconds: float = 0.0  # time spent evaluating misses

    @property
    def hit_rate(self) -> float:
        total = self.evaluations + self.hits
        return self.hits / total if total else 0.0

    def add(self, other: "EvalStats") -> None:
        self.evaluations += other.evaluations
        self.hits += other.hits
        self.seconds += other.seconds

    @property
    def rate(self) -> float:
        return self.evaluations / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Evaluator:
    hw: Hardware
    opts: CostOptions
    steps: int = 8
    split: bool = True
    rules: DirectoryRules = DirectoryRules()
    batch_threshold: int = BATCH_THRESHOLD
    keep_schedules: bool = False  # keep each batch's schedules for `critical_weights` (the search's kernels)
    fuse: bool = False  # price plans fused too where their placement lets training vertices fuse (stage fusion)
    stats: EvalStats = field(default_factory=EvalStats)
    _dirs: DirectoryCache = field(init=False)
    _compiled: dict = field(default_factory=dict, repr=False)
    _batched: dict = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._dirs = DirectoryCache(self.hw, self.opts, self.rules)

    def compile(self, variant: Variant) -> CompactVariant:
        cv = self._compiled.get(variant.key)
        if cv is None:
            p = variant.program
            dirs = self._dirs.directories(p, ordered_vertices(p))
            cv = self._compiled[variant.key] = CompactVariant(variant, dirs, self.hw, self.opts, self.steps, self.split,
                                                            self.fuse)
        return cv

    def batched(self, variant: Variant) -> BatchEvaluator:
        be = self._batched.get(variant.key)
        if be is None:
            be = self._batched[variant.key] = BatchEvaluator(self.compile(variant))
        return be

    def cached(self, variant: Variant, choice: Choice):
        return self._cache.get((variant.key, choice))

    def evaluate(self, variant: Variant, choices: Sequence[Choice]) -> list[Evaluation]:
        """Evaluations of `choices` (in order); only cache misses are computed and counted."""
        key = variant.key
        out: list = [None] * len(choices)
        missing: dict[Choice, list[int]] = {}
        for i, c in enumerate(choices):
            hit = self._cache.get((key, c))
            if hit is not None:
                out[i] = hit
                self.stats.hits += 1
            else:
                missing.setdefault(c, []).append(i)
        if missing:
            todo = list(missing)
            start = time.perf_counter()
            results = self._compute(variant, todo)
            self.stats.seconds += time.perf_counter() - start
            self.stats.evaluations += len(todo)
            for c, e in zip(todo, results):
                self._cache[(key, c)] = e
                for i in missing[c]:
                    out[i] = e
            self.stats.hits += sum(len(ix) - 1 for ix in missing.values())
        return out

    def evaluate_one(self, variant: Variant, choice: Choice) -> Evaluation:
        return self.evaluate(variant, [choice])[0]

    def _compute(self, variant: Variant, todo: list[Choice]) -> list[Evaluation]:
        if len(todo) < self.batch_threshold:
            cv = self.compile(variant)
            return [cv.evaluate(c) for c in todo]
        r = self.batched(variant).evaluate(np.array(todo, dtype=np.int64), keep=self.keep_schedules)
        return [
            Evaluation(float(r.makespan[i]), float(r.score[i]), float(r.score_pen[i]), float(r.util[i]),
                       float(r.p_eff[i]), float(r.r_peak[i]), bool(r.feasible[i]), fused=r.fused[i],
                       r_host=float(r.r_host[i]))
            for i in range(len(todo))
        ]

    def critical_weights(self, variant: Variant, choice: Choice) -> np.ndarray:
        """Per vertex, its Op time on the critical path: from the last batch's kept schedule when the plan was
        in it (the same weights, without scheduling it again), else by the reference path."""
        be = self._batched.get(variant.key)
        w = be.critical_weights(choice) if be is not None else None
        if w is not None:
            return w
        known = self.cached(variant, choice)
        return self.compile(variant).critical_weights(choice, () if known is None else known.fused)

    def detailed(self, variant: Variant, choice: Choice) -> Evaluation:
        """The reference evaluation with per-device peaks (for reports), not counted or cached."""
        return self.compile(variant).evaluate(choice)

    def detailed_apart(self, variant: Variant, choice: Choice) -> Evaluation:
        """`detailed` with no fusion: the plan's operators each run alone."""
        return self.compile(variant).evaluate_as(choice, ())

    def known(self) -> Iterable[tuple[tuple, Evaluation]]:
        return self._cache.items()
