"""Plan search for one structural variant: simulated annealing with chains in lockstep, and the polish.

Paper: Sec. VI-C..F, App. A-J2e..A-J2j, Alg. 1 (lines 5-31, 34) and Alg. 7. Per round, K_x = 6 proposals
come from the donor-receiver pair kernel (probability p_pair = 0.28) or the single-vertex kernel (vertex
from the critical path with probability 0.6, else uniform; strategy uniform from X_cand(v), then a
uniform aligned origin). The best proposal is accepted with min(1, exp(Delta / (|S| t))) (Eq. 8-9);
t is constant within a chain (t_init for a variant's first chains, t_warm for warm restarts from the elite
set); a chain ends after w_stag = 10 consecutive rejections. The elite set keeps the top K_elite = 3
feasible plans per vertex set and is shared by staleness variants. Memory is a soft penalty (Eq. 5) during
the search; the incumbent C* only ever holds memory-feasible configurations. Polish is deterministic
greedy coordinate descent over X_cand(v), vertex by vertex, until a full pass changes nothing; then, beyond
the paper, two-vertex moves (each pair of vertices, each moved to one of its best single moves), and the
descent again while they improve, all within its share of the budget.

Beyond the paper, the chains of a variant run as a population in lockstep (`VariantSearch`): every round
evaluates the proposals of all chains in one batch (the numpy path), and the critical paths the
single-vertex kernel needs come from the batched schedules. An optional two-vertex kernel
(`double_kernel`, `p_double`) moves a vertex and one that shares devices with it.

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

CRITICAL_CACHE = 4096
IDLE_CHAINS = 3  # fewest chain ends in a row without an unseen proposal that exhaust a variant


@dataclass(frozen=True)
class SearchConfig:
    k_x: int = 6  # proposals per round (S_n, K_x)
    p_pair: float = 0.28
    p_cp: float = 0.6
    # Of the rounds without a pair move, a two-vertex move (`double_kernel`). Off: measured on Table X at 128
    # GPUs (6 seeds x 300,000 evaluations) 0.2 found the best basin in 1 of 6 seeds, without it 2 of 6
    # (bench/README.md, "Stability").
    p_double: float = 0.0
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
    chains: int = 64  # most chains a variant's population runs in lockstep (VariantSearch)
    chain_rounds: int = 40  # rounds a chain should get: one chain per k_x * chain_rounds evaluations of a share
    # Of the budget, kept for the final polish: at least polish_share, more to pay for up to `polish_passes` whole
    # passes over every vertex's directory within polish_share_max (`polish_reserve`). One pass costs the sum of
    # the directory sizes (~12,000 evaluations at 128 GPUs); at budgets of a few passes the polish gains more
    # than annealing (13B strong scaling at 128 GPUs, 29,369 evaluations, 3 seeds: median 148.9K tokens/s with a
    # fifth kept, 158.4K with half), below one pass it does not (Table X at 64 GPUs, 3,000 and 10,000
    # evaluations, 6 seeds: medians 5% lower with half kept). bench/README.md, "Budget sweep".
    polish_share: float = 0.2
    polish_share_max: float = 0.5
    polish_passes: int = 2
    final_variants: int = 2  # structural variants in the last rung of successive halving (halving.py)
    pair_polish: bool = True  # two-vertex moves in the polish once single moves stop improving
    pair_top: int = 8  # per vertex: the best single moves the pair pass combines
    # From the second rung, each variant gets the best plans of the other vertex sets as candidate elites
    # (carry.py). Off: it helped on Table X at 64 GPUs (6 seeds, medians at 10,000 / 30,000 evaluations
    # 107.6K / 109.1K -> 108.2K / 109.3K, worst seed at 30,000 95.8K -> 106.7K) but on 13B strong scaling at
    # 128 GPUs (30,000 evaluations) 2 of 6 seeds reached the 158K basin with it, 4 of 6 without: a carried plan
    # better than a variant's early elites draws its restarts into the other structure's basin.
    carry: bool = False
    # Beyond the paper: chains also start from the template plans (templates.py), made in a variant's first
    # share that pays for one whole pass of their descent, with template_share of it (at least that pass).
    # Table X, 8 seeds x 60 s: CV 1.39% / 3.00% without them at 128 / 256 GPUs (two basins each), 0.00% / 0.01%
    # with them; at 64 GPUs and 30,000 evaluations the median went from 106.5K to 111.4K (bench/README.md).
    templates: bool = True
    template_share: float = 0.25

    def value(self, e: Evaluation, best_raw: float) -> float:
        """The search objective of an evaluation, given Score_star (`best_raw`)."""
        return objective_value(e.score, e.util, e.r_penalised, self.objective, best_raw, self.delta,
                               hard=not self.soft_memory)


@dataclass
class Incumbent:
    variant: Variant
    choice: Choice
    evaluation: Evaluation


@dataclass
class Budget:
    """A share of the search: a deadline (`time.monotonic`, the same clock in every worker process) and/or a
    number of uncached evaluations counted from `start_evals`."""

    deadline: Optional[float]
    max_evals: Optional[int]
    start_evals: int

    def exhausted(self, evaluator: Evaluator) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        left = self.left(evaluator)
        return left is not None and left <= 0

    def part(self, share: float, evaluator: Evaluator) -> "Budget":
        """The first `share` of what is left of this budget (time and evaluations)."""
        now = time.monotonic()
        deadline = None if self.deadline is None else now + share * max(0.0, self.deadline - now)
        left = self.left(evaluator)
        return Budget(deadline, None if left is None else int(share * left), evaluator.stats.evaluations)

    def left(self, evaluator: Evaluator) -> Optional[int]:
        """Uncached evaluations left, None without an evaluation limit."""
        if self.max_evals is None:
            return None
        return self.max_evals - (evaluator.stats.evaluations - self.start_evals)


UNLIMITED = Budget(None, None, 0)


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
        return self.config.value(e, self.best_raw)

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
            w = self._critical[key] = self.evaluator.critical_weights(cv.variant, choice)
        return w


# --- proposal kernels (App. A-J2f) -----------------------------------------------------------------


def propose(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    c, rng = state.config, state.rng
    if c.pair_moves and len(current) > 1 and rng.random() < c.p_pair:
        proposals = pair_kernel(state, cv, current)
        if proposals:
            return proposals
    if c.p_double > 0 and len(current) > 1 and rng.random() < c.p_double:
        return double_kernel(state, cv, current)
    return single_kernel(state, cv, current)


def single_kernel(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    rng, c = state.rng, state.config
    v = _vertex(state, cv, current)
    return [_replace(current, v, _draw(rng, cv.dirs[v])) for _ in range(c.k_x)]


def double_kernel(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    """Beyond the paper: two vertices at once, the first chosen as by the single-vertex kernel, the second
    among the vertices whose allocations share a device with it (any other if none does), each drawn as the
    single-vertex kernel draws. Local optima of single moves are often two moves from better plans (issue
    16: a two-vertex change improved 41 of 47 suboptimal results of enumerated instances)."""
    rng, c, dirs = state.rng, state.config, cv.dirs
    v = _vertex(state, cv, current)
    mv = dirs[v].masks[current[v]]
    others = [w for w in range(len(current)) if w != v]
    near = [w for w in others if dirs[w].masks[current[w]] & mv] or others
    w = near[rng.randrange(len(near))]
    return [_replace(_replace(current, v, _draw(rng, dirs[v])), w, _draw(rng, dirs[w])) for _ in range(c.k_x)]


def _vertex(state: SearchState, cv: CompactVariant, current: Choice) -> int:
    """A vertex from the critical path with probability p_cp (by its op time there), else uniform."""
    rng, c = state.rng, state.config
    if c.critical_path and rng.random() < c.p_cp:
        w = state.critical_weights(cv, current)
        if w.sum() > 0:
            return _weighted(rng, w)
    return rng.randrange(len(current))


def _draw(rng: random.Random, d) -> int:
    """A strategy uniformly from X_cand(v), then one of its aligned origins uniformly."""
    group = d.by_strategy[rng.randrange(len(d.by_strategy))]
    return group[rng.randrange(len(group))]


def pair_kernel(state: SearchState, cv: CompactVariant, current: Choice) -> list[Choice]:
    """Donor by GPU count, receiver among overlapping allocations; the donor shrinks inside its block and
    the receiver is resampled among choices touching the freed devices. Empty when the donor cannot shrink."""
    rng, c = state.rng, state.config
    dirs = cv.dirs
    words = state.evaluator.batched(cv.variant).words  # per vertex, its candidates' device masks
    sizes = [int(d.sizes[x]) for d, x in zip(dirs, current)]
    u = _weighted(rng, np.array(sizes, dtype=float))
    mu = dirs[u].masks[current[u]]
    others = [w for w in range(len(current)) if w != u]
    receivers = [w for w in others if dirs[w].masks[current[w]] & mu] or others
    w = receivers[rng.randrange(len(receivers))]
    wu, ww = words[u], words[w]
    smaller = dirs[u].sizes < sizes[u]
    inside = ~np.any(wu & ~wu[current[u]], axis=1)
    donor = np.nonzero(smaller & inside)[0]
    if not len(donor):
        donor = np.nonzero(smaller)[0]
    if not len(donor):
        return []
    out = []
    for _ in range(c.k_x):
        cu = int(donor[rng.randrange(len(donor))])
        freed = wu[current[u]] & ~wu[cu]
        receive = np.nonzero(np.any(ww & freed, axis=1))[0]
        cw = int(receive[rng.randrange(len(receive))]) if len(receive) else rng.randrange(len(ww))
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


# --- chains in lockstep ------------------------------------------------------------------------------


@dataclass
class Chain:
    """One annealing chain of a population: its current plan, temperature and stagnation counters."""

    current: Choice
    e_cur: Evaluation
    t: float
    rejected: int = 0  # rounds in a row whose best proposal was rejected
    cached: int = 0  # rounds in a row whose proposals had all been evaluated before
    fresh: bool = False  # some proposal of this chain had not been evaluated before

    def ended(self, cfg: SearchConfig) -> bool:
        # A chain also ends after w_stag rounds in a row whose proposals were all cached: on a plateau of
        # equal values every move is accepted (Eq. 9 with Delta = 0), and in a small space whose plans are all
        # cached an evaluation budget would never run out.
        return self.rejected >= cfg.w_stag or self.cached >= cfg.w_stag


class VariantSearch:
    """Alg. 1 lines 4-31 for one structural candidate, with the chains run in lockstep.

    Beyond the paper: a population of chains advances together, and every round the K_x proposals of all of
    them are evaluated in one call, so the misses go to the batched evaluator in batches of tens to hundreds
    (on the 64-GPU workload the reference path scores a plan in ~1.3 ms, the batched path a batch of 64 in
    ~8 ms; bench/results/eval_throughput.csv). Each chain follows the paper's rules on its own: the best of its K_x
    proposals is accepted by Eq. 9 at its temperature, and it ends after w_stag rejections, when it is
    restarted at once from the elite set (t_warm) so the population stays full. The first chains start from
    the seeds at t_init, in turn: the concurrent plan, then what `add_seeds` added (templates.py; seeds added
    later restart the worst chains). The population grows with the budget (`population`): one chain per
    `k_x * chain_rounds` evaluations of a share, at most `SearchConfig.chains`, so a small budget still runs
    long chains. The search of a variant ends when its budget is spent or when its neighbourhood is exhausted:
    w_stag rounds in a row in which all chains together proposed fewer than K_x unseen plans, or a
    population's worth of chains in a row (at least IDLE_CHAINS) that ended without one."""

    def __init__(self, state: SearchState, variant: Variant, seed: Choice):
        self.state = state
        self.variant = variant
        self.cv = state.evaluator.compile(variant)
        self.seeds = [seed]  # where the first population's chains start, in turn (add_seeds)
        self.chains: list[Chain] = []
        self.idle_rounds = 0
        self.idle_ends = 0  # chains in a row that ended without one unseen proposal

    @property
    def exhausted(self) -> bool:
        return self.idle_rounds >= self.state.config.w_stag or self.idle_ends >= max(IDLE_CHAINS, len(self.chains))

    def run(self, budget: Budget, expected_evals: float) -> None:
        """Advance the population until `budget` is spent or the neighbourhood is exhausted."""
        self._grow(population(self.state.config, expected_evals))
        while not budget.exhausted(self.state.evaluator) and not self.exhausted:
            self.round(budget)

    def add_seeds(self, choices: list[Choice]) -> None:
        """More starting points (templates.py), best first. Before the first population they are its chains'
        starts after the concurrent seed, in turn; once the population runs, each restarts one of the chains
        whose current plans are worse than it, the worst first, at t_init."""
        new = [c for c in choices if c not in self.seeds]
        self.seeds.extend(new)
        if not self.chains:
            return
        st = self.state
        worst_first = sorted(range(len(self.chains)), key=lambda j: (st.value(self.chains[j].e_cur), j))
        for choice, j in zip(new, worst_first):
            e = st.evaluate(self.variant, [choice])[0]
            if st.value(e) > st.value(self.chains[j].e_cur):
                self.chains[j] = self._chain(choice, e, st.config.t_init)

    def _grow(self, n: int) -> None:
        initial = self.state.rounds == 0  # the first population starts from the seeds; later growth from elites
        while len(self.chains) < n:
            self.chains.append(self._start(initial))

    def _start(self, first: bool) -> Chain:
        st, cfg = self.state, self.state.config
        elite = st.elites.get(self.variant.vertex_set, [])
        if first or not cfg.warm_restarts or not elite:
            current, t = self.seeds[len(self.chains) % len(self.seeds) if first else 0], cfg.t_init
        else:
            current, t = elite[st.rng.randrange(len(elite))][1], cfg.t_warm
        return self._chain(current, st.evaluate(self.variant, [current])[0], t)

    def _chain(self, current: Choice, e: Evaluation, t: float) -> Chain:
        self.state.add_elite(self.variant, current, e)
        self.state.chains += 1
        return Chain(current, e, t)

    def round(self, budget: Budget) -> None:
        """One round of every chain: propose, evaluate all proposals at once, accept or reject per chain.
        When the budget cannot pay for all of them, the round keeps a prefix (`affordable`)."""
        st, variant = self.state, self.variant
        batch: list[Choice] = []
        spans: list[tuple[int, int]] = []  # per chain: its proposals batch[a:b]
        for chain in self.chains:
            proposals = propose(st, self.cv, chain.current)
            spans.append((len(batch), len(batch) + len(proposals)))
            batch.extend(proposals)
        batch = affordable(st, variant, batch, budget)
        unseen = [st.evaluator.cached(variant, p) is None for p in batch]
        evals = st.evaluate(variant, batch)
        values = [st.value(e) for e in evals]
        # A round is idle when its chains together found fewer unseen plans than one chain proposes.
        self.idle_rounds = 0 if sum(unseen) >= st.config.k_x else self.idle_rounds + 1
        for j, (a, b) in enumerate(spans):
            b = min(b, len(batch))
            if a < b:
                self._step(j, batch[a:b], evals[a:b], values[a:b], not any(unseen[a:b]))
        st.rounds += 1
        if st.on_round is not None:
            st.on_round(st)

    def _step(self, j: int, proposals, evals, values, seen_before: bool) -> None:
        st, cfg, chain = self.state, self.state.config, self.chains[j]
        chain.cached = chain.cached + 1 if seen_before else 0
        chain.fresh = chain.fresh or not seen_before
        i = max(range(len(values)), key=lambda k: (values[k], -k))
        if accept(st.rng, st.value(chain.e_cur), values[i], chain.t):
            chain.current, chain.e_cur = proposals[i], evals[i]
            chain.rejected = 0
        else:
            chain.rejected += 1
        st.add_elite(self.variant, chain.current, chain.e_cur)
        if not cfg.constant_temperature:
            chain.t = max(cfg.t_min, cfg.gamma * chain.t)
        if chain.ended(cfg):
            self.idle_ends = 0 if chain.fresh else self.idle_ends + 1
            self.chains[j] = self._start(False)


def polish_reserve(cfg: SearchConfig, pass_cost: int, expected_evals: float) -> float:
    """The share of a budget of `expected_evals` evaluations kept for the polish, whose passes cost `pass_cost`:
    the whole passes (at most polish_passes) that polish_share_max of it pays for, at least polish_share."""
    if not cfg.polish:
        return 0.0
    if pass_cost <= 0 or expected_evals <= 0 or math.isinf(expected_evals):
        return cfg.polish_share
    passes = min(cfg.polish_passes, int(cfg.polish_share_max * expected_evals // pass_cost))
    return max(cfg.polish_share, passes * pass_cost / expected_evals)


def population(cfg: SearchConfig, expected_evals: float) -> int:
    """Chains of a population that expects `expected_evals` evaluations: enough rounds per chain first."""
    return max(1, min(cfg.chains, int(expected_evals // (cfg.k_x * cfg.chain_rounds))))


# --- polish (App. A-J2j) -----------------------------------------------------------------------------


def polish(state: SearchState, variant: Variant, choice: Choice, budget: Budget = UNLIMITED) -> Choice:
    """Greedy coordinate descent: per vertex in fixed order, the best strictly improving feasible choice; when
    a whole pass changes nothing, a pass of two-vertex moves (`pair_pass`), and again until neither improves
    or `budget` is spent (a vertex or pair pass the budget cannot pay for whole is cut to what it can)."""
    cv = state.evaluator.compile(variant)
    current = choice
    for _ in range(state.config.max_polish_passes):
        current, improved = single_pass(state, cv, current, budget)
        if not improved and state.config.pair_polish:
            current, improved = pair_pass(state, cv, current, budget)
        if not improved or budget.exhausted(state.evaluator):
            break
    return current


def single_pass(state: SearchState, cv: CompactVariant, current: Choice,
                budget: Budget = UNLIMITED) -> tuple[Choice, bool]:
    """One pass over the vertices, each moved to its best strictly improving feasible choice."""
    variant, improved = cv.variant, False
    for v, d in enumerate(cv.dirs):
        if budget.exhausted(state.evaluator):
            break
        candidates = affordable(state, variant, [_replace(current, v, c) for c in range(len(d))], budget)
        evals = state.evaluate(variant, candidates)
        best = _best_improvement(state, state.evaluator.evaluate_one(variant, current), candidates, evals)
        if best is not None:
            current, improved = best, True
    return current, improved


def pair_pass(state: SearchState, cv: CompactVariant, current: Choice,
              budget: Budget = UNLIMITED) -> tuple[Choice, bool]:
    """The best strictly improving feasible two-vertex move among every pair of vertices, each moved to one of
    its `pair_top` best single moves by objective value (memory-penalised: a move that overflows alone may fit
    with its partner's). Local optima of single moves are often two moves from better plans (issue 16: a
    two-vertex change improved 41 of 47 suboptimal results of enumerated instances). The single moves ranked
    are those evaluated already (by the single pass before it)."""
    variant, k = cv.variant, state.config.pair_top
    tops = []
    for v, d in enumerate(cv.dirs):
        others = [(c, state.evaluator.cached(variant, _replace(current, v, c))) for c in range(len(d)) if c != current[v]]
        ranked = sorted((x for x in others if x[1] is not None), key=lambda x: (-state.value(x[1]), x[0]))
        tops.append([c for c, _ in ranked[:k]])
    candidates = [_replace(_replace(current, u, a), w, b)
                  for u in range(len(tops)) for w in range(u + 1, len(tops)) for a in tops[u] for b in tops[w]]
    candidates = affordable(state, variant, candidates, budget)
    evals = state.evaluate(variant, candidates)
    best = _best_improvement(state, state.evaluator.evaluate_one(variant, current), candidates, evals)
    return (current, False) if best is None else (best, True)


def affordable(state: SearchState, variant: Variant, candidates: list[Choice], budget: Budget) -> list[Choice]:
    """The longest prefix of `candidates` whose unseen plans the budget's evaluations left can pay for."""
    left = budget.left(state.evaluator)
    if left is None:
        return candidates
    fresh: set[Choice] = set()
    for i, c in enumerate(candidates):
        if c not in fresh and state.evaluator.cached(variant, c) is None:
            if len(fresh) >= left:
                return candidates[:i]
            fresh.add(c)
    return candidates


def _best_improvement(state: SearchState, e_cur: Evaluation, candidates: list[Choice],
                      evals: list[Evaluation]) -> Optional[Choice]:
    best_value, best = state.value(e_cur), None
    for cand, e in zip(candidates, evals):
        if e.feasible and state.value(e) > best_value:
            best_value, best = state.value(e), cand
    return best
