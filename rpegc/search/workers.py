"""Where the variant searches run: in this process, or in worker processes on every core (`jobs=`).

Beyond the paper (Sec. VIII-D runs the search on six cores without saying how). Each structural variant's
search lives in one worker for the whole run — its compiled directories, evaluation cache and chains stay
there — and the optimizer sends it tasks (anneal for a share of the budget, polish a plan) and gets back
small reports: choices, evaluations, elites and counters, never the cache. A variant's search depends only
on its own random stream (the run's seed and the variant's label), the shares it is given and what the
reports gave back between rungs (Score_star and the elite sets), so with an evaluation budget the result
is the same for every `jobs`.

Workers are started with the `spawn` method: the optimizer also runs inside rpeg-run, whose torch threads
make `fork` unsafe. A worker that dies is an error naming it; a worker never outlives the search.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
import traceback
from dataclasses import dataclass, replace
from typing import Callable, Optional

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.cost.hardware import Hardware
from rpegc.search.anneal import Budget, SearchConfig, SearchState, VariantSearch, affordable, polish
from rpegc.search.baselines import concurrent_plan
from rpegc.search.templates import template_seeds
from rpegc.search.carry import Carried, carried_choices, placements_of
from rpegc.search.compact import Choice, Evaluation
from rpegc.search.directory import DirectoryRules
from rpegc.search.evaluator import EvalStats, Evaluator
from rpegc.search.space import Variant

NOMINAL_RATE = 6000.0  # evaluations per second a worker assumes before it has measured its own (64 GPUs: ~6,400)
Elites = tuple[tuple[float, Choice], ...]


@dataclass(frozen=True)
class Problem:
    """What every worker needs to search any variant of one optimize call."""

    variants: tuple[Variant, ...]
    hw: Hardware
    cost: CostOptions
    steps: int
    split: bool
    rules: DirectoryRules
    config: SearchConfig
    seed: int
    fuse: bool = True  # stage fusion where a placement allows it (ablation A10 turns it off)


@dataclass(frozen=True)
class AnnealTask:
    index: int  # of the variant in Problem.variants
    max_evals: Optional[int]  # this share's uncached evaluations (None: until the deadline)
    best_raw: float  # Score_star over every variant so far
    elites: Elites  # the elite set of the variant's vertex set, merged over its variants
    extra: tuple[Choice, ...] = ()  # plans evaluated first and kept as elites (the greedy baseline)
    carried: tuple[tuple[Carried, ...], ...] = ()  # the same, from other vertex sets' plans (carry.py)


@dataclass(frozen=True)
class PolishTask:
    index: int
    choice: Choice
    max_evals: Optional[int]
    best_raw: float


@dataclass(frozen=True)
class Report:
    """A task's outcome. `best` is the variant's best feasible plan so far; the counters are the task's."""

    index: int
    best: Optional[tuple[Choice, Evaluation]]
    best_raw: float
    min_r_peak: float
    elites: Elites
    stats: EvalStats
    chains: int
    rounds: int
    seconds: float
    exhausted: bool = False
    polished: Optional[tuple[Choice, Evaluation]] = None  # a polish task's plan
    placements: tuple[Carried, ...] = ()  # of `best`, for the variants with other vertices (only with carry)
    skipped: Optional[tuple[Optional[Loc], str]] = None  # the variant could not be seeded: why


class Worker:
    """The searches of the variants one process owns."""

    def __init__(self, problem: Problem, on_round: Optional[Callable[[SearchState], None]] = None):
        self.problem = problem
        self.on_round = on_round
        self.evaluator = Evaluator(problem.hw, problem.cost, problem.steps, split=problem.split, rules=problem.rules,
                                   keep_schedules=problem.config.critical_path, fuse=problem.fuse)
        self.searches: dict[int, VariantSearch] = {}
        self.reported: dict[int, tuple[int, int]] = {}  # per variant: chains and rounds reported so far
        self.templated: set[int] = set()  # variants whose template seeds were made (templates.py)
        self.rate = NOMINAL_RATE  # measured evaluations per wall second of this worker's annealing

    def search(self, i: int) -> VariantSearch:
        s = self.searches.get(i)
        if s is None:
            p = self.problem
            variant = p.variants[i]
            seed = concurrent_plan(self.evaluator.compile(variant)).choice
            # Each variant draws from its own stream, so its search does not depend on which other variants
            # share this process or how many random numbers they used.
            rng = random.Random(f"{p.seed}/{variant.label()}")
            state = SearchState(self.evaluator, p.config, rng, on_round=self.on_round)
            s = self.searches[i] = VariantSearch(state, variant, seed)
            self.reported[i] = (0, 0)
        return s

    def anneal(self, tasks: list[AnnealTask], deadline: Optional[float]) -> list[Report]:
        """The tasks in order; with a deadline, each gets an equal part of the time left."""
        return [self._anneal(t, _part(deadline, len(tasks) - k)) for k, t in enumerate(tasks)]

    def polish_all(self, tasks: list[PolishTask], deadline: Optional[float]) -> list[Report]:
        return [self.polish(t, _part(deadline, len(tasks) - k)) for k, t in enumerate(tasks)]

    def _anneal(self, task: AnnealTask, deadline: Optional[float]) -> Report:
        start, before = time.monotonic(), self._counters()
        try:
            s = self.search(task.index)
        except RpegError as err:  # e.g. a vertex of this structure fits nowhere: skip the structure
            return Report(task.index, None, task.best_raw, float("inf"), (), EvalStats(), 0, 0, 0.0,
                          exhausted=True, skipped=(err.loc, err.message))
        st = s.state
        self._sync(st, s.variant, task.best_raw, task.elites)
        budget = Budget(deadline, task.max_evals, self.evaluator.stats.evaluations)
        carried = [c for plan in task.carried for c in carried_choices(s.cv, plan)]
        for choice in affordable(st, s.variant, [*task.extra, *carried], budget):  # paid from the share
            st.add_elite(s.variant, choice, st.evaluate(s.variant, [choice])[0])
        if self.problem.config.templates and task.index not in self.templated:
            # in the variant's first share that pays for them: a variant that survives halving gets larger shares
            seeds = template_seeds(st, s.cv, budget, self.problem.config.template_share)
            if seeds is not None:
                self.templated.add(task.index)
                s.add_seeds(seeds)
        s.run(budget, self._expected(task.max_evals, deadline))
        seconds = time.monotonic() - start
        done = self.evaluator.stats.evaluations - before[0]
        if seconds > 0.05 and done > 0:
            self.rate = done / seconds
        return self._report(task.index, st, before, start, exhausted=s.exhausted)

    def polish(self, task: PolishTask, deadline: Optional[float]) -> Report:
        start, before = time.monotonic(), self._counters()
        s = self.search(task.index)
        st = s.state
        self._sync(st, s.variant, task.best_raw, ())
        choice = polish(st, s.variant, task.choice, Budget(deadline, task.max_evals, self.evaluator.stats.evaluations))
        e = st.evaluate(s.variant, [choice])[0]
        return replace(self._report(task.index, st, before, start), polished=(choice, e))

    def _expected(self, max_evals: Optional[int], deadline: Optional[float]) -> float:
        """Evaluations the share will probably pay for: what sizes the population."""
        by_time = float("inf") if deadline is None else max(0.0, deadline - time.monotonic()) * self.rate
        return min(by_time, float("inf") if max_evals is None else float(max_evals))

    def _sync(self, st: SearchState, variant: Variant, best_raw: float, elites: Elites) -> None:
        st.best_raw = max(st.best_raw, best_raw)
        if elites:
            st.elites[variant.vertex_set] = list(elites)

    def _counters(self) -> tuple[int, int, float]:
        s = self.evaluator.stats
        return s.evaluations, s.hits, s.seconds

    def _report(self, i: int, st: SearchState, before, start: float, exhausted: bool = False) -> Report:
        s = self.evaluator.stats
        stats = EvalStats(s.evaluations - before[0], s.hits - before[1], s.seconds - before[2])
        best = (st.best.choice, st.best.evaluation) if st.best is not None else None
        carry = best is not None and self.problem.config.carry
        placements = placements_of(self.searches[i].cv, best[0]) if carry else ()
        chains, rounds = self.reported[i]
        self.reported[i] = (st.chains, st.rounds)
        vertex_set = self.problem.variants[i].vertex_set
        return Report(i, best, st.best_raw, st.min_r_peak, tuple(st.elites.get(vertex_set, ())),
                      stats, st.chains - chains, st.rounds - rounds, time.monotonic() - start, exhausted,
                      placements=placements)


# --- pools ---------------------------------------------------------------------------------------------------


class LocalPool:
    """All variants in this process (jobs = 1, or budgets too small to pay for starting processes)."""

    jobs = 1

    def __init__(self, problem: Problem, on_round: Optional[Callable[[SearchState], None]] = None):
        self.worker = Worker(problem, on_round)

    def anneal(self, tasks: list[AnnealTask], deadline: Optional[float]) -> list[Report]:
        return self.worker.anneal(tasks, deadline)

    def polish(self, tasks: list[PolishTask], deadline: Optional[float]) -> list[Report]:
        return self.worker.polish_all(tasks, deadline)

    def close(self) -> None:
        pass


class ProcessPool:
    """One worker process per job; variant i lives in worker i mod jobs."""

    def __init__(self, problem: Problem, jobs: int):
        self.jobs = jobs
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        try:
            for k in range(jobs):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=serve, args=(child, problem), name=f"rpegc-search-{k}", daemon=True)
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise

    def anneal(self, tasks: list[AnnealTask], deadline: Optional[float]) -> list[Report]:
        return self._scatter("anneal", tasks, deadline)

    def polish(self, tasks: list[PolishTask], deadline: Optional[float]) -> list[Report]:
        return self._scatter("polish", tasks, deadline)

    def _scatter(self, kind: str, tasks: list, deadline: Optional[float]) -> list[Report]:
        """Each worker's tasks go to it in one message; the reports come back in task order."""
        mine: dict[int, list] = {}
        for t in tasks:
            mine.setdefault(t.index % self.jobs, []).append(t)
        for k, ts in mine.items():
            try:
                self.conns[k].send((kind, ts, deadline))
            except OSError:  # the worker died before the send (a broken pipe), or while it ran
                raise self._died(k) from None
        reports: dict[int, Report] = {}
        for k in mine:
            for r in self._receive(k):
                reports[r.index] = r
        return [reports[t.index] for t in tasks]

    def _receive(self, k: int) -> list[Report]:
        try:
            status, payload = self.conns[k].recv()
        except (EOFError, OSError):
            raise self._died(k) from None
        if status != "ok":
            raise RpegError(None, f"optimize: search worker {k} failed:\n{payload}")
        return payload

    def _died(self, k: int) -> RpegError:
        self.procs[k].join(timeout=5)
        return RpegError(None, f"optimize: search worker {k} died (exit code {self.procs[k].exitcode}); "
                               "run again with jobs=1 to search in this process")

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop", None, None))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()


def serve(conn, problem: Problem) -> None:
    """A worker process: run the tasks it is sent until told to stop (or its parent goes away)."""
    worker = Worker(problem)
    while True:
        try:
            kind, tasks, deadline = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if kind == "stop":
            return
        try:
            if kind == "anneal":
                out = worker.anneal(tasks, deadline)
            else:
                out = worker.polish_all(tasks, deadline)
            conn.send(("ok", out))
        except Exception:  # a bug in the search: give the coordinator the trace instead of dying silently
            conn.send(("error", traceback.format_exc()))


def _part(deadline: Optional[float], left: int) -> Optional[float]:
    """An equal part of the time to `deadline` for the next of `left` tasks."""
    if deadline is None:
        return None
    now = time.monotonic()
    return now + max(0.0, deadline - now) / left


def default_jobs() -> int:
    """Every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
