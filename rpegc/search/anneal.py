"""Plan search for one structural variant: multi-start simulated annealing and the final polish.

Paper: Sec. VI-C..F, App. A-J2e..A-J2j, Alg. 1 (lines 5-31, 34) and Alg. 7. Per round, K_x = 6 proposals
come from the donor-receiver pair kernel (probability p_pair = 0.28) or the single-vertex kernel (vertex
from the critical path with probability 0.6, else uniform; strategy uniform from X_cand(v), then a
uniform aligned origin). The best proposal is accepted with min(1, exp(Delta / (|S| t))) (Eq. 8-9);
t is constant within a chain (t_init for a variant's first chain, t_warm for warm restarts from the elite
set); a chain ends after w_stag = 10 consecutive rejections. The elite set keeps the top K_elite = 3
feasible plans per vertex set and is shared by staleness variants. Memory is a soft penalty (Eq. 5) during
the search; the incumbent C* only ever holds memory-feasible configurations. Polish is deterministic
greedy coordinate descent over X_cand(v), vertex by vertex, until a full pass changes nothing; then, beyond
the paper, two-vertex moves (each pair of vertices, each moved to one of its best single moves), and the
descent again while they improve.

Every mechanism has a switch in `SearchConfig` for the ablations of Table IV (A4-A9).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from rpegc.search.compact import Choice, CompactVariant, Evaluation
from rpegc.search.evaluator import Evaluator
from rpegc.search.objective import objective_value
from rpegc.search.space import Variant

IDLE_CHAINS = 3  # chains in a row without one uncached evaluation: the neighbourhood is exhausted
CRITICAL_CACHE = 4096


@dataclass(frozen=True)
class SearchConfig:
    k_x: int = 6  # proposals per round (S_n, K_x)
    p_pair: float = 0.28
    p_cp: float = 0.6
    w_stag: int = 10
    k_elite: int = 3
    # The paper gives no values (only t_warm > t_init). A relative loss of t is accepted with probability 1/e.
    # Measured over six workloads x 5 seeds (bench/results/search_temperature.csv): with 0.005/0.01 most
    # chains end after w_stag rejections next to their seed, so plans that need a few worse intermediate
    # steps (e.g. moving generation off the trainers' GPUs under tau = 1) are found only by luck; 0.01/0.05
    # raised the mean result by 6% (up to 17%) and the worst seed by up to 18%; 0.02/0.1 had about the same
    # mean, but its chains wander off good basins on small budgets (worst seed up to 11% lower).
    t_init: float = 0.01
    t_warm: float = 0.05
    gamma: float = 0.95  # A9 geometric cooling factor per round
    t_min: float = 1e-4
    objective: str = "throughput"
    delta: float = 0.1
    pair_moves: bool = True  # A4 off: no donor-receiver moves
    warm_restarts: bool = True  # A5 off: restarts from the concurrent seed at t_init
    critical_path: bool = True  # A6 off: uniform vertex selection
    polish: bool = True  # A7 off: no final polish
    soft_memory: bool = True  # A8 off: hard rejection of out-of-memory plans
    constant_temperature: bool = True  # A9 off: geometric cooling within a chain
    max_polish_passes: int = 50
    pair_polish: bool = True  # two-vertex moves in the polish once single moves stop improving
    pair_top: int = 8  # per vertex: the best single moves the pair pass combines


@dataclass
class Incumbent:
    variant: Variant
    choice: Choice
    evaluation: Evaluation


@dataclass
class Budget:
    """A variant's share: a deadline (perf_counter) and/or a number of uncached evaluations."""

    deadline: Optional[float]
    max_evals: Optional[int]
    start_evals: int

    def exhausted(self, evaluator: Evaluator) -> bool:
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return True
        return self.max_evals is not None and evaluator.stats.evaluations - self.start_evals >= self.max_evals


@dataclass
class SearchState:
    """What all chains of a run share: evaluator, RNG, incumbent C*, elite sets, Score_star."""

    evaluator: Evaluator
    config: SearchConfig
    rng: random.Random
    best: Optional[Incumbent] = None
    best_raw: float = 0.0  # best raw score among feasible configurations (Score_star, A19)
    min_r_peak: float = math.inf
    elites: dict = field(default_factory=dict)  # vertex set -> [(value, choice)], best first
    rounds: int = 0
    chains: int = 0
    on_round: Optional[Callable[["SearchState"], None]] = None
    _critical: dict = field(default_factory=dict)

    # --- objective and bookkeeping ---------------------------------------------------------------

    def value(self, e: Evaluation) -> float:
        c = self.config
        return objective_value(e.score, e.util, e.r_peak, c.objective, self.best_raw, c.delta, hard=not c.soft_memory)

    def observe(self, variant: Variant, choices: list[Choice], evals: list[Evaluation]) -> None:
        """Alg. 1 line 24: update Score_star and C* from every evaluated feasible configuration."""
        for c, e in zip(choices, evals):
            self.min_r_peak = min(self.min_r_peak, e.r_peak)
            if not e.feasible:
                continue
            self.best_raw = max(self.best_raw, e.score)
            if self.best is None or self.value(e) > self.value(self.best.evaluation):
                self.best = Incumbent(variant, c, e)

    def evaluate(self, variant: Variant, choices: list[Choice]) -> list[Evaluation]:
        evals = self.evaluator.evaluate(variant, choices)
        self.observe(variant, choices, evals)
        return evals

    def add_elite(self, variant: Variant, choice: Choice, e: Evaluation) -> None:
        if not e.feasible:
            return
        elite = self.elites.setdefault(variant.vertex_set, [])
        if any(c == choice for _, c in elite):
            return
        elite.append((self.value(e), choice))
        elite.sort(key=lambda x: -x[0])
        del elite[self.config.k_elite:]

    def critical_weights(self, cv: CompactVariant, choice: Choice) -> np.ndarray:
        key = (cv.variant.key, choice)
        w = self._critical.get(key)
        if w is None:
            if len(self._critical) >= CRITICAL_CACHE:
                self._critical.clear()
            w = self._critical[key] = cv.critical_weights(choice)
        return w


# --- proposal kernels (App. A-J2f) -----------------------------------------------------------------


def propose(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    c = state.config
    if c.pair_moves and len(current) > 1 and state.rng.random() < c.p_pair:
        proposals = pair_kernel(state, cv, current)
        if proposals:
            return proposals
    return single_kernel(state, cv, current)


def single_kernel(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    rng, c = state.rng, state.config
    v = None
    if c.critical_path and rng.random() < c.p_cp:
        w = state.critical_weights(cv, current)
        if w.sum() > 0:
            v = _weighted(rng, w)
    if v is None:
        v = rng.randrange(len(current))
    d = cv.dirs[v]
    out = []
    for _ in range(c.k_x):
        group = d.by_strategy[rng.randrange(len(d.by_strategy))]
        out.append(_replace(current, v, group[rng.randrange(len(group))]))
    return out


def pair_kernel(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    """Donor by GPU count, receiver among overlapping allocations; the donor shrinks inside its block and
    the receiver is resampled among choices touching the freed devices. Empty when the donor cannot shrink."""
    rng, c = state.rng, state.config
    dirs = cv.dirs
    sizes = [int(d.sizes[x]) for d, x in zip(dirs, current)]
    u = _weighted(rng, np.array(sizes, dtype=float))
    mu = dirs[u].masks[current[u]]
    others = [w for w in range(len(current)) if w != u]
    receivers = [w for w in others if dirs[w].masks[current[w]] & mu] or others
    w = receivers[rng.randrange(len(receivers))]
    du, dw = dirs[u], dirs[w]
    smaller = [i for i in range(len(du)) if du.sizes[i] < sizes[u]]
    donor = [i for i in smaller if not du.masks[i] & ~mu] or smaller
    if not donor:
        return []
    out = []
    for _ in range(c.k_x):
        cu = donor[rng.randrange(len(donor))]
        freed = mu & ~du.masks[cu]
        receive = [i for i in range(len(dw)) if dw.masks[i] & freed] or list(range(len(dw)))
        cw = receive[rng.randrange(len(receive))]
        out.append(_replace(_replace(current, u, cu), w, cw))
    return out


def _replace(choice: Choice, v: int, c: int) -> Choice:
    return choice[:v] + (c,) + choice[v + 1:]


def _weighted(rng: random.Random, w: np.ndarray) -> int:
    x = rng.random() * float(w.sum())
    acc = 0.0
    for i, wi in enumerate(w):
        acc += float(wi)
        if x < acc:
            return i
    return int(np.nonzero(w)[0][-1])


def accept(rng: random.Random, s: float, s_new: float, t: float) -> bool:
    """Eq. 9: improvements always, a loss with probability exp((S' - S) / (|S| t))."""
    if s_new == -math.inf:
        return False
    if s_new > s:
        return True
    if s == -math.inf or s == 0.0:
        return False
    return rng.random() < math.exp((s_new - s) / (abs(s) * t))


# --- chains ----------------------------------------------------------------------------------------


def search_variant(state: SearchState, variant: Variant, seed: Choice, budget: Budget) -> None:
    """Alg. 1 lines 4-31 for one structural candidate."""
    cv = state.evaluator.compile(variant)
    cfg = state.config
    first = True
    idle = 0
    while not budget.exhausted(state.evaluator) and idle < IDLE_CHAINS:
        elite = state.elites.get(variant.vertex_set, [])
        if first or not cfg.warm_restarts or not elite:
            current, t = seed, cfg.t_init
        else:
            current, t = elite[state.rng.randrange(len(elite))][1], cfg.t_warm
        first = False
        before = state.evaluator.stats.evaluations
        run_chain(state, cv, current, t, budget)
        state.chains += 1
        idle = idle + 1 if state.evaluator.stats.evaluations == before else 0


def run_chain(state: SearchState, cv: CompactVariant, current: Choice, t: float, budget: Budget) -> None:
    variant, cfg = cv.variant, state.config
    e_cur = state.evaluate(variant, [current])[0]
    state.add_elite(variant, current, e_cur)
    rejected = cached = 0
    # A chain also ends after w_stag rounds in a row whose proposals were all evaluated before: on a plateau
    # of equal values every move is accepted (Eq. 9 with Delta = 0), and in a small space whose plans are all
    # cached an evaluation budget would never run out.
    while not budget.exhausted(state.evaluator) and rejected < cfg.w_stag and cached < cfg.w_stag:
        proposals = propose(state, cv, current)
        before = state.evaluator.stats.evaluations
        evals = state.evaluate(variant, proposals)
        cached = cached + 1 if state.evaluator.stats.evaluations == before else 0
        values = [state.value(e) for e in evals]
        i = max(range(len(values)), key=lambda k: (values[k], -k))
        if accept(state.rng, state.value(e_cur), values[i], t):
            current, e_cur = proposals[i], evals[i]
            rejected = 0
        else:
            rejected += 1
        state.add_elite(variant, current, e_cur)
        if not cfg.constant_temperature:
            t = max(cfg.t_min, cfg.gamma * t)
        state.rounds += 1
        if state.on_round is not None:
            state.on_round(state)


# --- polish (App. A-J2j) -----------------------------------------------------------------------------


def polish(state: SearchState, variant: Variant, choice: Choice) -> Choice:
    """Greedy coordinate descent: per vertex in fixed order, the best strictly improving feasible choice; when
    a whole pass changes nothing, a pass of two-vertex moves (`pair_pass`), and again until neither improves."""
    cv = state.evaluator.compile(variant)
    current = choice
    for _ in range(state.config.max_polish_passes):
        current, improved = single_pass(state, cv, current)
        if not improved and state.config.pair_polish:
            current, improved = pair_pass(state, cv, current)
        if not improved:
            break
    return current


def single_pass(state: SearchState, cv: CompactVariant, current: Choice) -> tuple[Choice, bool]:
    """One pass over the vertices, each moved to its best strictly improving feasible choice."""
    variant, improved = cv.variant, False
    for v, d in enumerate(cv.dirs):
        candidates = [_replace(current, v, c) for c in range(len(d))]
        evals = state.evaluate(variant, candidates)
        best = _best_improvement(state, state.evaluator.evaluate_one(variant, current), candidates, evals)
        if best is not None:
            current, improved = best, True
    return current, improved


def pair_pass(state: SearchState, cv: CompactVariant, current: Choice) -> tuple[Choice, bool]:
    """The best strictly improving feasible two-vertex move among every pair of vertices, each moved to one of
    its `pair_top` best single moves by objective value (memory-penalised: a move that overflows alone may fit
    with its partner's). Local optima of single moves are often two moves from better plans (issue 16: a
    two-vertex change improved 41 of 47 suboptimal results of enumerated instances)."""
    variant, k = cv.variant, state.config.pair_top
    tops = []
    for v, d in enumerate(cv.dirs):
        others = [c for c in range(len(d)) if c != current[v]]
        evals = state.evaluate(variant, [_replace(current, v, c) for c in others])  # cached by the single pass
        ranked = sorted(range(len(others)), key=lambda i: (-state.value(evals[i]), i))
        tops.append([others[i] for i in ranked[:k]])
    candidates = [_replace(_replace(current, u, a), w, b)
                  for u in range(len(tops)) for w in range(u + 1, len(tops)) for a in tops[u] for b in tops[w]]
    evals = state.evaluate(variant, candidates)
    best = _best_improvement(state, state.evaluator.evaluate_one(variant, current), candidates, evals)
    return (current, False) if best is None else (best, True)


def _best_improvement(state: SearchState, e_cur: Evaluation, candidates: list[Choice],
                      evals: list[Evaluation]) -> Optional[Choice]:
    best_value, best = state.value(e_cur), None
    for cand, e in zip(candidates, evals):
        if e.feasible and state.value(e) > best_value:
            best_value, best = state.value(e), cand
    return best
