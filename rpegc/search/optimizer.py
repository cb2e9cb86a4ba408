"""OPTIMIZE (Alg. 1 and Alg. 7): the joint search over structures y = (ac, tau) and execution plans P.

Paper: Sec. VI, App. A-J. The outer loop enumerates Y_cand (S1, S2); each variant gets an equal share of
the budget (wall-clock: the remaining time split evenly over the remaining variants; evaluations: the
total split evenly), its first chain starts from the concurrent baseline, later chains from the elite set
(anneal.py). The best memory-feasible configuration over all variants is polished and returned. The
greedy and concurrent baselines (Sec. VIII-B) are evaluated on the structure as written (ac = 0, the
module's tau) for the gain figures, and can be returned instead of a search (`baseline=`); both are
evaluated in that variant during the search (the concurrent plan as the first seed, the greedy plan as an
extra evaluation), so the result is never worse than a feasible baseline.

Ablations (Table IV, App. B): A1 no response-length splitting, A2 no bounded asynchrony (tau = 0 only),
A3 fixed microbatch counts, A4 no pair moves, A5 no warm restarts, A6 uniform vertex selection, A7 no
polish, A8 hard memory rejection, A9 geometric cooling.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from rpegc.core.cost_options import CostOptions
from rpegc.core.errors import RpegError
from rpegc.core.hardware import Hardware, program_hardware
from rpegc.core.program import Program
from rpegc.search.anneal import Budget, SearchConfig, SearchState, polish, search_variant
from rpegc.search.baselines import BaselinePlan, concurrent_plan, greedy_plan
from rpegc.search.compact import Choice, Evaluation
from rpegc.search.directory import MB_FIXED, MB_TUNED
from rpegc.search.evaluator import EvalStats, Evaluator
from rpegc.search.objective import check_objective
from rpegc.search.space import Variant, base_structure, structural_candidates

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
}
BASELINES = ("none", "greedy", "concurrent")


@dataclass(frozen=True)
class OptimizeOptions:
    budget_s: float = 60.0  # wall-clock budget in seconds (0: none)
    evals: int = 0  # total uncached evaluations (0: none); split evenly over the structural variants
    seed: int = 0
    objective: str = "throughput"
    delta: float = 0.1
    taus: tuple[int, ...] = (0, 1)
    ac: bool = True
    steps: int = 8  # K_eval
    ablate: frozenset[str] = frozenset()
    baseline: str = "none"
    search: SearchConfig = SearchConfig()


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
    polish_evaluations: int = 0  # uncached evaluations of the final polish (on top of the budget)


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
    if options.steps < 1:
        raise RpegError(None, f"steps = {options.steps}: the evaluation horizon K_eval must be >= 1; e.g. steps=8")


def optimize(
    p: Program,
    options: OptimizeOptions = OptimizeOptions(),
    hw: Optional[Hardware] = None,
    cost: CostOptions = CostOptions(),
    on_round: Optional[Callable[[SearchState], None]] = None,
) -> OptimizeResult:
    """Search the best memory-feasible C = (G°, P) for `p` (its plan, if any, is replaced)."""
    check_options(options)
    start = time.perf_counter()
    structure = base_structure(p)
    if hw is None:
        hw = program_hardware(structure, what="optimize")
    ablate = options.ablate
    taus = (0,) if "A2" in ablate else options.taus
    evaluator = Evaluator(hw, cost, options.steps, split="A1" not in ablate,
                          mb_rule=MB_FIXED if "A3" in ablate else MB_TUNED)
    state = SearchState(evaluator, search_config(options), random.Random(options.seed), on_round=on_round)
    reference = _written_variant(structure, 0 if "A2" in ablate else None)
    greedy = _baseline(evaluator, reference, greedy_plan, options.baseline == "greedy")
    concurrent = _baseline(evaluator, reference, concurrent_plan, options.baseline == "concurrent")
    if options.baseline != "none":
        chosen = greedy if options.baseline == "greedy" else concurrent
        return _result(state, reference, chosen.choice, greedy, concurrent, start, (), options.baseline)
    variants = structural_candidates(structure, taus, options.ac)
    per_variant: list[tuple[str, Optional[Evaluation]]] = []
    spent: list[VariantStats] = []
    deadline = start + options.budget_s if options.budget_s > 0 else None
    first_error: Optional[RpegError] = None
    for i, variant in enumerate(variants):
        # Equal shares of what is left, so a variant that stops early leaves its rest to the others.
        left = len(variants) - i
        share_deadline = None
        if deadline is not None:
            share_deadline = time.perf_counter() + max(0.0, deadline - time.perf_counter()) / left
        max_evals = None
        if options.evals > 0:
            max_evals = -(-max(0, options.evals - evaluator.stats.evaluations) // left)
        try:
            seed = concurrent_plan(evaluator.compile(variant)).choice
        except RpegError as err:  # e.g. a vertex of this structure fits nowhere: skip the structure
            first_error = first_error or err
            per_variant.append((variant.label(), None))
            spent.append(VariantStats(variant.label(), None, 0, 0, 0, 0.0, skipped=True))
            continue
        budget = Budget(share_deadline, max_evals, evaluator.stats.evaluations)
        before = (evaluator.stats.evaluations, state.chains, state.rounds, time.perf_counter())
        # Each variant draws from its own stream, so its search does not depend on how many random numbers
        # the variants before it used: with an evaluation budget, a larger budget extends each variant's
        # chains instead of reshuffling them (only the shared elite set carries over).
        state.rng = random.Random(f"{options.seed}/{variant.label()}")
        if greedy is not None and variant.key == reference.key:  # C* never falls behind a baseline
            state.add_elite(variant, greedy.choice, state.evaluate(variant, [greedy.choice])[0])
        search_variant(state, variant, seed, budget)
        best = _best_of(state, variant)
        per_variant.append((variant.label(), best))
        spent.append(VariantStats(variant.label(), best, evaluator.stats.evaluations - before[0],
                                  state.chains - before[1], state.rounds - before[2], time.perf_counter() - before[3]))
    if state.best is None:
        if first_error is not None and not math.isfinite(state.min_r_peak):
            raise first_error  # no structure could be placed at all: say which vertex fits nowhere
        raise _infeasible(structure, state)
    best = state.best
    variant, choice = best.variant, best.choice
    searched = evaluator.stats.evaluations
    if state.config.polish:
        variant, choice = _polish_structures(state, variants, variant, choice)
    result = _result(state, variant, choice, greedy, concurrent, start, tuple(per_variant), "search")
    return replace(result, variant_stats=tuple(spent), polish_evaluations=evaluator.stats.evaluations - searched)


def _polish_structures(state: SearchState, variants: list[Variant], variant: Variant,
                       choice: Choice) -> tuple[Variant, Choice]:
    """Polish the best plan in its structure, then carry it to every structure with the same vertices (the
    same directories: only tau differs) and polish it there too; the best of them. A structure move that
    keeps the placement: a plan found under tau = 0 may be better under tau = 1 (issue 16: 11.9% in a
    measured case), and no annealing move crosses structures."""
    best_variant, best_choice = variant, polish(state, variant, choice)
    best_value = state.value(state.evaluator.evaluate_one(best_variant, best_choice))
    for other in variants:
        if other.key == variant.key or other.vertex_set != variant.vertex_set:
            continue
        moved = polish(state, other, best_choice)
        e = state.evaluator.evaluate_one(other, moved)
        if e.feasible and state.value(e) > best_value:
            best_variant, best_choice, best_value = other, moved, state.value(e)
    return best_variant, best_choice


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
    return BaselineResult(plan.name, plan.choice, evaluator.detailed(variant, plan.choice))


def _best_of(state: SearchState, variant: Variant) -> Optional[Evaluation]:
    """Best feasible evaluation seen for this variant (from the cache)."""
    best = None
    for (key, _), e in state.evaluator.known():
        if key == variant.key and e.feasible and (best is None or state.value(e) > state.value(best)):
            best = e
    return best


def _result(state: SearchState, variant: Variant, choice: Choice, greedy, concurrent, start: float,
            per_variant, source: str) -> OptimizeResult:
    cv = state.evaluator.compile(variant)
    e = state.evaluator.detailed(variant, choice)
    plan = cv.to_plan(choice)
    program = replace(variant.program, plan=plan)
    value = state.value(e)
    return OptimizeResult(
        program=program,
        variant=variant,
        choice=choice,
        evaluation=e,
        value=value,
        objective=state.config.objective,
        greedy=greedy,
        concurrent=concurrent,
        stats=state.evaluator.stats,
        seconds=time.perf_counter() - start,
        variants=per_variant,
        rounds=state.rounds,
        chains=state.chains,
        source=source,
    )


def _infeasible(structure: Program, state: SearchState) -> RpegError:
    c = structure.cluster
    peak = state.min_r_peak
    if math.isfinite(peak):
        found = f"the lowest peak found needs {peak:.2f}x the usable HBM of a GPU"
    else:
        found = "nothing was evaluated"
    return RpegError(
        structure.graph.loc,
        f"no memory-feasible plan found for graph @{structure.graph.name} on cluster @{c.name} "
        f"({c.num_devices} GPUs) within the search budget; {found} (r_peak = {peak:.3f}). Use more GPUs "
        "(racks, nodes or GPUs per node), a smaller batch B*R or shorter sequences (Lp, Lr), smaller models, "
        "or a larger search budget",
    )
