"""OPTIMIZE (Alg. 1 and Alg. 7): the joint search over structures y = (ac, tau) and execution plans P.

Paper: Sec. VI, App. A-J. The outer loop enumerates Y_cand (S1, S2). Beyond the paper, the budget goes to
the variants by promise (successive halving, halving.py) instead of evenly, the variants are searched in
worker processes on every core (workers.py), and the polish is part of the budget (`anneal.polish_reserve`:
a fifth, or the whole passes over the directories that half of it pays for). Each variant's first chains
start from the concurrent baseline and, in turn, from template plans (role-based layouts on blocks of devices,
templates.py), restarts from the elite set (anneal.py). The best memory-feasible
configuration over all variants is polished and returned. The greedy and concurrent baselines
(Sec. VIII-B) are evaluated on the structure as written (ac = 0, the module's tau) for the gain figures,
and can be returned instead of a search (`baseline=`); both are evaluated in that variant during the
search (the concurrent plan as the first seed, the greedy plan as an extra evaluation), so the result is
never worse than a feasible baseline.

Ablations (Table IV, App. B): A1 no response-length splitting, A2 no bounded asynchrony (tau = 0 only),
A3 fixed microbatch counts, A4 no pair moves, A5 no warm restarts, A6 uniform vertex selection, A7 no
polish, A8 hard memory rejection, A9 geometric cooling; beyond the paper's table, A10 no stage fusion.

Stage fusion is a plan-level choice (docs/stage-fusion.md): whether two training operators may fuse depends on the
placement (the same devices and layout, rules F1-F3), not on the structure y, so the evaluator decides it for every
plan it prices, exactly, by pricing the plan fused and apart and keeping the better (`compact.better`). The
baselines run their operators apart, as the systems they stand for do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.options import option
from rpegc.core.cost.hardware import Hardware, program_hardware
from rpegc.core.ir.program import VERIFY, Program
from rpegc.search.anneal import SearchConfig, SearchState, polish_reserve
from rpegc.search.baselines import BaselinePlan, concurrent_plan, greedy_plan
from rpegc.search.compact import Choice, Evaluation
from rpegc.search.directory import MB_FIXED, MB_TUNED, DirectoryRules
from rpegc.search.evaluator import EvalStats, Evaluator
from rpegc.search.halving import Board, anneal_variants, polish_best
from rpegc.search.objective import check_objective
from rpegc.search.space import Variant, base_structure, structural_candidates
from rpegc.search.workers import NOMINAL_RATE, LocalPool, ProcessPool, Problem, default_jobs

ABLATIONS = {
    "A1": "response-length splitting off",
    "A2": "bounded asynchrony off (tau = 0)",
    "A3": "fixed microbatch counts",
    "A4": "no donor-receiver pair moves",
    "A5": "no warm restarts",
    "A6": "uniform vertex selection",
    "A7": "no polish",
    "A8": "hard memory rejection",
    "A9": "geometric cooling",
    "A10": "no stage fusion",
}
BASELINES = ("none", "greedy", "concurrent")
PROCESS_MIN_EVALS = 20_000  # with jobs=0, smaller evaluation budgets are searched in this process
PROCESS_MIN_SECONDS = 5.0  # and shorter time budgets too


@dataclass(frozen=True)
class OptimizeOptions:
    """The search's options, declared once: the optimize pass spells each as a pipeline option with this default
    and help (passes/optimize.py), and `rpegc --list-passes` prints them."""

    budget_s: float = option(60, "wall-clock seconds for the search, the polish included (0: no time limit)")
    evals: int = option(0, "uncached evaluations, the polish included (0: no limit); with budget, whichever ends "
                           "first")
    seed: int = option(0, "random seed: the same seed and evaluation budget give the same plan")
    objective: str = option("throughput", "throughput (Score_pen, Eq. 5) or util (throughput x utilization, Eq. 6)")
    delta: float = option(0.1, "throughput loss that objective=util may trade for utilization")
    taus: tuple[int, ...] = option((0, 1), "staleness candidates per trainable model (S2)")
    ac: bool = option(True, "consider actor-critic parameter sharing (S1), where an actor and a critic exist")
    steps: int = option(8, "K_eval, the unrolled horizon plans are scored on (use the same k in unroll)")
    ablate: frozenset[str] = option(frozenset(), f"ablations {', '.join(ABLATIONS)} (Table IV's A1..A9, A10 no "
                                                 "stage fusion)")
    baseline: str = option("none", "none (search), or write the greedy or concurrent baseline plan instead")
    search: SearchConfig = option(SearchConfig(), "the annealing's schedule (not a pipeline option)")
    jobs: int = option(0, "worker processes (0: every core once the budget pays for starting them)")
    search_zero: bool = option(True, "choose each training vertex's ZeRO stage (false: the workload's, default 2)")
    search_recompute: bool = option(
        True, "choose each training vertex's activation recomputation (false: the workload's, default interval)")


@dataclass(frozen=True)
class BaselineResult:
    name: str
    choice: Choice
    evaluation: Evaluation


@dataclass(frozen=True)
class VariantStats:
    """What the search spent on one structural variant and the best feasible plan it saw there."""

    label: str
    best: Optional[Evaluation]
    evaluations: int  # uncached evaluations charged to this variant (its budget share)
    chains: int
    rounds: int
    seconds: float
    skipped: bool = False  # no plan could be placed for this structure


@dataclass(frozen=True)
class FusionOutcome:
    """Stage fusion in the chosen plan: the training vertices its placement lets fuse, and its price both ways."""

    enabled: bool  # fusion was a choice of this search (ablation A10 off)
    groups: tuple[tuple[str, ...], ...]  # the vertices of each fusion the placement allows
    fused: Optional[Evaluation]  # the plan priced with those fusions (None when there are none)
    apart: Evaluation  # the plan priced with every operator alone
    chosen: bool  # the plan runs them fused


@dataclass(frozen=True)
class OptimizeResult:
    program: Program  # G°(y*) with the chosen plan, ready for unroll and lowering
    variant: Variant
    choice: Choice
    evaluation: Evaluation  # reference evaluation with per-device peaks
    value: float  # objective value (Score_pen or Score_eff_pen)
    objective: str
    greedy: Optional[BaselineResult]
    concurrent: Optional[BaselineResult]
    stats: EvalStats
    seconds: float
    variants: tuple[tuple[str, Optional[Evaluation]], ...]  # best feasible per structural variant
    rounds: int = 0
    chains: int = 0
    source: str = "search"  # or "greedy" / "concurrent"
    variant_stats: tuple[VariantStats, ...] = ()
    polish_evaluations: int = 0  # uncached evaluations of the final polish (part of the budget)
    jobs: int = 1  # processes the search ran in
    fusion: Optional[FusionOutcome] = None
    hardware: Optional[Hardware] = None  # the profile it priced with (the summary says whose machine it is)


def parse_ablations(text: str) -> frozenset[str]:
    names = frozenset(x.strip().upper() for x in text.replace(";", ",").split(",") if x.strip())
    unknown = sorted(names - set(ABLATIONS))
    if unknown:
        raise RpegError(None, f"unknown ablation {', '.join(unknown)}; use a comma list of "
                              + ", ".join(f"{k} ({v})" for k, v in ABLATIONS.items()))
    return names


def search_config(options: OptimizeOptions) -> SearchConfig:
    a = options.ablate
    return replace(
        options.search,
        objective=options.objective,
        delta=options.delta,
        pair_moves=options.search.pair_moves and "A4" not in a,
        warm_restarts=options.search.warm_restarts and "A5" not in a,
        critical_path=options.search.critical_path and "A6" not in a,
        polish=options.search.polish and "A7" not in a,
        soft_memory=options.search.soft_memory and "A8" not in a,
        constant_temperature=options.search.constant_temperature and "A9" not in a,
    )


def check_options(options: OptimizeOptions) -> None:
    """Located nowhere: the caller (the pass) places option errors at the graph."""
    check_objective(options.objective, options.delta)
    if options.baseline not in BASELINES:
        raise RpegError(None, f"unknown baseline '{options.baseline}'; use baseline=none, greedy or concurrent")
    if options.budget_s < 0 or options.evals < 0:
        raise RpegError(None, "the search budget must be non-negative; give budget=<seconds> and/or evals=<count>")
    if options.baseline == "none" and options.budget_s <= 0 and options.evals <= 0:
        raise RpegError(None, "the search has no budget; give budget=<seconds> or evals=<count> (or both)")
    if options.jobs < 0:
        raise RpegError(None, f"jobs = {options.jobs}: give the number of worker processes (0: every core)")
    if options.steps < 1:
        raise RpegError(None, f"steps = {options.steps}: the evaluation horizon K_eval must be >= 1; e.g. steps=8")


@dataclass(frozen=True)
class Progress:
    """What the progress bar shows: uncached evaluations so far and the best feasible plan's evaluation."""

    evaluations: int
    best: Optional[Evaluation]


def optimize(
    p: Program,
    options: OptimizeOptions = OptimizeOptions(),
    hw: Optional[Hardware] = None,
    cost: CostOptions = CostOptions(),
    on_progress: Optional[Callable[[Progress], None]] = None,
) -> OptimizeResult:
    """Search the best memory-feasible C = (G°, P) for `p` (its plan, if any, is replaced)."""
    check_options(options)
    start = time.monotonic()
    structure = base_structure(p)
    if hw is None:
        hw = program_hardware(structure, what="optimize")
    ablate = options.ablate
    taus = (0,) if "A2" in ablate else options.taus
    split = "A1" not in ablate
    rules = DirectoryRules(MB_FIXED if "A3" in ablate else MB_TUNED, options.search_zero, options.search_recompute)
    fuse = "A10" not in ablate
    evaluator = Evaluator(hw, cost, options.steps, split=split, rules=rules, fuse=fuse)  # baselines and the report
    config = search_config(options)
    reference = _written_variant(structure, 0 if "A2" in ablate else None)
    greedy = _baseline(evaluator, reference, greedy_plan, options.baseline == "greedy")
    concurrent = _baseline(evaluator, reference, concurrent_plan, options.baseline == "concurrent")
    if options.baseline != "none":
        chosen = greedy if options.baseline == "greedy" else concurrent
        return _result(evaluator, config, reference, chosen.choice, greedy, concurrent, start, options.baseline)
    variants = tuple(structural_candidates(structure, taus, options.ac))
    board = Board(variants, config)
    problem = Problem(variants, hw, cost, options.steps, split, rules, config, options.seed, fuse)
    # C* never falls behind a baseline: the greedy plan is evaluated (and kept as an elite) in its variant.
    extra = {i: (greedy.choice,) for i, v in enumerate(variants) if greedy is not None and v.key == reference.key}
    end = start + options.budget_s if options.budget_s > 0 else None
    total = options.evals if options.evals > 0 else None
    pool = _pool(problem, options, board, on_progress)
    try:
        reserve = polish_reserve(config, _pass_cost(evaluator, reference), _expected_evals(options, pool.jobs))
        anneal_end = None if end is None else start + (1.0 - reserve) * options.budget_s
        anneal_evals = None if total is None else total - int(total * reserve)
        anneal_variants(pool, board, anneal_evals, anneal_end, extra,
                        on_report=None if on_progress is None else lambda b: on_progress(_progress(b)))
        polished = polish_best(pool, board, total, end) if config.polish else board.best()
    finally:
        pool.close()
    if polished is None:
        raise _no_plan(structure, board)
    i, choice, _ = polished
    result = _result(evaluator, config, variants[i], choice, greedy, concurrent, start, "search", board)
    return replace(result, variant_stats=_variant_stats(board), polish_evaluations=board.polish_stats.evaluations,
                   jobs=pool.jobs)


def _pool(problem: Problem, options: OptimizeOptions, board: Board, on_progress):
    """Worker processes for `jobs` (0: every core, when the budget is large enough to pay for starting them)."""
    jobs = options.jobs or default_jobs()
    if options.jobs == 0 and not _worth_processes(options):
        jobs = 1
    jobs = min(jobs, len(problem.variants))
    if jobs > 1:
        return ProcessPool(problem, jobs)
    return LocalPool(problem, None if on_progress is None else _round_progress(board, on_progress))


def _pass_cost(evaluator: Evaluator, variant: Variant) -> int:
    """Evaluations of one polish pass on the structure as written (its directory sizes summed; 0 if it has none)."""
    try:
        return sum(len(d) for d in evaluator.compile(variant).dirs)
    except RpegError:
        return 0


def _expected_evals(options: OptimizeOptions, jobs: int) -> float:
    """The evaluations a budget will pay for: its count, or its seconds at the nominal rate of each process."""
    by_time = options.budget_s * NOMINAL_RATE * jobs if options.budget_s > 0 else math.inf
    return min(by_time, options.evals if options.evals > 0 else math.inf)


def _round_progress(board: Board, on_progress: Callable[[Progress], None]) -> Callable[[SearchState], None]:
    """In this process, progress after every round: the running total and the best of the board and the round."""
    def on_round(state: SearchState) -> None:
        best = _progress(board).best
        if state.best is not None and (best is None or state.best.evaluation.score > best.score):
            best = state.best.evaluation
        on_progress(Progress(state.evaluator.stats.evaluations, best))
    return on_round


def _worth_processes(options: OptimizeOptions) -> bool:
    """Starting the workers takes about a second (spawn and import); budgets below these do not pay for it."""
    return ((options.evals == 0 or options.evals >= PROCESS_MIN_EVALS)
            and (options.budget_s == 0 or options.budget_s >= PROCESS_MIN_SECONDS))


def _progress(board: Board) -> Progress:
    found = board.best()
    return Progress(board.evaluations, None if found is None else found[2])


def _variant_stats(board: Board) -> tuple[VariantStats, ...]:
    return tuple(VariantStats(v.label(), None if r.best is None else r.best[1], r.stats.evaluations, r.chains,
                              r.rounds, r.seconds, skipped=r.skipped is not None)
                 for v, r in zip(board.variants, board.records))


def _no_plan(structure: Program, board: Board) -> RpegError:
    """No structure could be placed at all (say which vertex fits nowhere), or none fits in memory."""
    live = board.live()
    if not live:
        loc, message = board.records[0].skipped
        return RpegError(loc, message)
    return _infeasible(structure, min(board.records[i].min_r_peak for i in live))


def _written_variant(structure: Program, force_tau: Optional[int]) -> Variant:
    """The structure as the user wrote it (no sharing, the module's tau): the baselines' structure."""
    g = structure.graph
    tau = tuple((m.name, force_tau if force_tau is not None else g.tau(m.name)) for m in structure.models if m.trainable)
    return Variant(False, tau, replace(structure, graph=replace(g, staleness=tau)))


def _baseline(evaluator: Evaluator, variant: Variant, make: Callable, required: bool) -> Optional[BaselineResult]:
    """A baseline on the structure as written; None if it cannot be built (unless it was asked for)."""
    try:
        plan: BaselinePlan = make(evaluator.compile(variant))
    except RpegError:
        if required:
            raise
        return None
    return BaselineResult(plan.name, plan.choice, evaluator.detailed_apart(variant, plan.choice))


def _result(evaluator: Evaluator, config: SearchConfig, variant: Variant, choice: Choice, greedy, concurrent,
            start: float, source: str, board: Optional[Board] = None) -> OptimizeResult:
    e = evaluator.detailed(variant, choice) if source == "search" else evaluator.detailed_apart(variant, choice)
    program = replace(variant.program, plan=evaluator.compile(variant).to_plan(choice, fused=e.fused))
    fusion = _fusion_outcome(evaluator, variant, choice, e, source == "search")
    best_raw = max(board.best_raw if board else 0.0, e.score if e.feasible else 0.0)
    value = config.value(e, best_raw)
    stats, per_variant, rounds, chains = EvalStats(), (), 0, 0
    if board is not None:
        stats = board.stats()
        per_variant = tuple((v.label(), None if r.best is None else r.best[1]) for v, r in zip(board.variants, board.records))
        rounds, chains = sum(r.rounds for r in board.records), sum(r.chains for r in board.records)
    return OptimizeResult(
        program=program,
        variant=variant,
        choice=choice,
        evaluation=e,
        value=value,
        objective=config.objective,
        greedy=greedy,
        concurrent=concurrent,
        stats=stats,
        seconds=time.monotonic() - start,
        variants=per_variant,
        rounds=rounds,
        chains=chains,
        source=source,
        fusion=fusion,
        hardware=evaluator.hw,
    )


def _fusion_outcome(evaluator: Evaluator, variant: Variant, choice: Choice, chosen: Evaluation,
                    searched: bool) -> FusionOutcome:
    cv = evaluator.compile(variant)
    enabled = evaluator.fuse and searched
    possible = cv.fusion_groups(choice, *cv.placement(choice))
    fused = cv.evaluate_as(choice, possible) if possible else None
    groups = fused.fused if fused is not None else ()
    names = tuple(tuple(cv.vertices[v].name for v in g) for g in groups)
    return FusionOutcome(enabled, names, fused if groups else None, cv.evaluate_as(choice, ()), bool(chosen.fused))


def _infeasible(structure: Program, peak: float) -> RpegError:
    c = structure.cluster
    if math.isfinite(peak):
        found = f"the lowest peak found needs {peak:.2f}x the usable HBM of a GPU"
    else:
        found = "nothing was evaluated"
    return RpegError(
        structure.graph.loc,
        f"no memory-feasible plan found for graph @{structure.graph.name} on cluster @{c.name} "
        f"({c.num_devices} GPUs) within the search budget; {found} (r_peak = {peak:.3f}). Use more GPUs "
        "(racks, nodes or GPUs per node), a smaller batch B*R or shorter sequences (Lp, Lr), smaller models, "
        "or a larger search budget" + (" (and the first node's devices and its verifier pool's own processes must "
                                       "fit the profile's [host] cores)"
                                       if any(v.role == VERIFY for v in structure.graph.vertices) else ""),
    )
