"""Candidate directories X_cand(v) with isolated memory filtering and estimated-time order.

Paper: Sec. VI-B, App. A-J2a (Def. A.18, P1-P8) and A-J2f ("the directory contains all valid strategy
tuples satisfying P1-P8, filtered by per-vertex memory feasibility ... and sorted by estimated execution
time"). Legal (allocation, strategy) pairs come from `rpegc.core.check.candidates.enumerate_candidates`; this
module prices them with the core cost model (`annotate.placement_time`, `residency.device_memory`) and
keeps the ones whose operator fits on its devices when it runs alone.

A training vertex's entries also choose how it trains (core/ir/training.py): its ZeRO stage and its activation
recomputation are plan choices (issue 32: they trade memory for time), each searched unless the rules fix it to the
workload's (the ablation switches `search_zero`, `search_recompute` of optimize); precision and pipeline schedule are
the program's (the workload's, or the input plan's placement of the vertex). Of the choices at one (allocation,
strategy) only those no other choice dominates are kept (no slower, no more optimizer state, no larger transient):
ZeRO 0 loses to ZeRO 1 where P_d > 1 (the same traffic, Adam over a shard), recomputation every c layers to every
layer (the same work, fewer bytes held) whenever a layer saves more than its input, and at P_d = 1 the ZeRO stage is
no choice at all (it is left to the workload).

Time and isolated memory depend on the strategy and the allocation's shape only (homogeneous devices), so
they are computed once per (strategy, extent) and shared by every aligned origin. A directory depends on
the vertex (role, model) and not on tau, so staleness variants reuse it (A-J2i); `DirectoryCache` keys
directories by vertex, so actor-critic sharing reuses those of the vertices it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from rpegc.core.cost.annotate import placement_time
from rpegc.core.check.candidates import check_directory_size, enumerate_candidates
from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.optime import OpTime
from rpegc.core.ir.program import VERIFY, Program, Vertex
from rpegc.core.cost.host import pool_cores, pool_device, pool_sizes, search_alloc, verify_node_time
from rpegc.core.ir.training import RECOMPUTES, ZERO_STAGES, TrainSpec
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy, alloc_mask, device_mask
from rpegc.core.cost.residency import OpPlacement, device_memory

# Ablation A3: microbatch counts fixed to P_p (generation, inference) and 2 P_p (training) (App. B).
MB_TUNED = "tuned"
MB_FIXED = "fixed"


@dataclass(frozen=True)
class DirectoryRules:
    """What a directory enumerates beyond P1-P8: the microbatch rule (ablation A3) and the training fields the search
    chooses (the others are the workload's)."""

    mb_rule: str = MB_TUNED
    zero: bool = True  # search the ZeRO stage of training operators
    recompute: bool = True  # search their activation recomputation


@dataclass(frozen=True)
class VertexDirectory:
    """X_cand(v): legal, individually memory-feasible choices of one vertex, fastest first."""

    vertex: str
    role: str
    model: str
    allocs: tuple[Alloc, ...]
    strategies: tuple[Strategy, ...]
    op_times: tuple[OpTime, ...]  # core OpTime per candidate (shared objects across origins)
    t_op: np.ndarray  # T_op per candidate, float64, non-decreasing
    isolated_peak: np.ndarray  # r_peak of the operator alone on its allocation
    sizes: np.ndarray  # |sigma| per candidate (int64)
    masks: tuple[int, ...]  # device bitmask per candidate (flat ids, `geometry.alloc_mask`)
    by_strategy: tuple[tuple[int, ...], ...]  # candidate indices grouped by (dp, pp, tp, mb), first-seen order
    strategy_of: np.ndarray  # group index per candidate
    best_infeasible_r_peak: float = 0.0  # smallest isolated r_peak among dropped candidates (diagnostics)
    dropped: int = 0
    pools: tuple[int, ...] = ()  # a verify vertex's candidates: the pool size of each (cost/host.py); () otherwise

    def __len__(self) -> int:
        return len(self.allocs)

    def pool_index(self, size: int) -> Optional[int]:
        """Position of a verify vertex's pool of `size` processes, None if it is not a candidate."""
        return self.pools.index(size) if size in self.pools else None

    def index(self, alloc: Alloc, strategy: Strategy) -> Optional[int]:
        """Position of (alloc, strategy) in the directory, None if it is not a candidate."""
        for i, (a, s) in enumerate(zip(self.allocs, self.strategies)):
            if a == alloc and s == strategy:
                return i
        return None


@dataclass
class DirectoryCache:
    """Directories keyed by vertex (name, role, model), so variants share those of the vertices they have in
    common: staleness variants all of them, actor-critic sharing all but the trainers'. All programs asked for
    are variants of one structure (the same workload, cluster and models)."""

    hw: Hardware
    opts: CostOptions
    rules: DirectoryRules = DirectoryRules()
    _cache: dict = field(default_factory=dict)

    def directories(self, p: Program, vertices: tuple[Vertex, ...]) -> tuple[VertexDirectory, ...]:
        return tuple(self._directory(p, v) for v in vertices)

    def _directory(self, p: Program, v: Vertex) -> VertexDirectory:
        if v.role == VERIFY:  # a verifier, not a model
            key: tuple = (v.name, v.role, v.model)
        else:
            m = p.model(v.model)
            key = (v.name, v.role, v.model, m.kind, m.arch)
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = build_directory(p, v, self.hw, self.opts, self.rules)
        return d


def pool_directory(p: Program, v: Vertex, hw: Hardware) -> VertexDirectory:
    """A verify vertex's candidates: its pool sizes (cost/host.py), fastest first, each at the pool's stand-in
    allocation with the pool's resource bit and the bits of the devices whose cores it shares (`pool_cores`: the
    same for every plan; a shared device the plan leaves empty reserves nothing another node needs), and no device
    memory."""
    sizes = pool_sizes(p, hw)
    times = [verify_node_time(p, v.model, size, hw) for size in sizes]
    order = sorted(range(len(sizes)), key=lambda i: (times[i], i))
    alloc, strategy, k = search_alloc(p.cluster), Strategy(1, 1, 1, 1), len(sizes)
    return VertexDirectory(
        vertex=v.name, role=v.role, model=v.model, allocs=(alloc,) * k, strategies=(strategy,) * k,
        op_times=(None,) * k, t_op=np.array([times[i] for i in order], dtype=np.float64),
        isolated_peak=np.zeros(k), sizes=np.ones(k, dtype=np.int64),
        masks=tuple(_pool_mask(sizes[i], hw.host_cores, p.cluster) for i in order), by_strategy=(tuple(range(k)),),
        strategy_of=np.zeros(k, dtype=np.int64), pools=tuple(sizes[i] for i in order))


def _pool_mask(size: int, host_cores: int, cluster: Cluster) -> int:
    return device_mask((pool_device(cluster), *pool_cores(size, host_cores, cluster)[1]))


def _price(p: Program, v: Vertex, a: Alloc, s: Strategy, models, hw: Hardware, opts: CostOptions):
    """(T_op, isolated r_peak, (T_op, S, A)) of `v` under (a, s) alone on its devices."""
    placement = OpPlacement(v.name, v.role, v.model, a, s)
    t = placement_time(p, placement, hw, opts)
    mem = device_memory((placement,), models, {}, p.cluster, p.workload, hw, opts)
    i = int(np.argmax(mem.peak))
    return t, mem.r_peak, (float(t.T_op), float(mem.persistent[i]), float(mem.transient[i]))


def _undominated(strategies: list[Strategy], a: Alloc, priced: dict, price) -> list[Strategy]:
    """The strategies no other of the list dominates (no slower, no more persistent or transient memory, better in
    one; of equal ones the first), each priced once per (strategy, extent) into `priced`."""
    for s in strategies:
        if (s, a.extent) not in priced:
            priced[(s, a.extent)] = price(s)
    if len(strategies) == 1:
        return strategies
    terms = [priced[(s, a.extent)][2] for s in strategies]
    return [s for i, s in enumerate(strategies)
            if not any(all(o <= x for o, x in zip(terms[j], terms[i])) and (terms[j] != terms[i] or j < i)
                       for j in range(len(strategies)) if j != i)]


def fixed_microbatch(role: str, pp: int) -> int:
    """A3: mb = 1 without a pipeline, P_p for generation/inference, 2 P_p for training."""
    if pp == 1:
        return 1
    return 2 * pp if role == "training" else pp


def training_choices(v: Vertex, s: Strategy, p: Program, rules: DirectoryRules) -> list[Strategy]:
    """`s` with each training the search may choose for a training vertex (module docstring), in a fixed order (of
    choices that price alike, `_undominated` keeps the first); the strategy itself for a serving vertex. Precision and schedule are the input plan's placement of the vertex, if it
    states them (the workload's otherwise)."""
    if v.role != "training":
        return [s]
    placed = {pl.vertex: pl for pl in p.plan.placements} if p.plan is not None else {}
    written = placed[v.name].strategy.train if v.name in placed else TrainSpec()
    zeros = ZERO_STAGES[::-1] if rules.zero and s.dp > 1 else (None,)  # a tie keeps the most sharded stage
    recomputes = RECOMPUTES if rules.recompute else (None,)
    return [replace(s, train=TrainSpec(precision=written.precision, zero=z, recompute=r, schedule=written.schedule))
            for z in zeros for r in recomputes]


def build_directory(
    p: Program, v: Vertex, hw: Hardware, opts: CostOptions, rules: DirectoryRules = DirectoryRules(),
    memory_filter: bool = True
) -> VertexDirectory:
    """X_cand(v) sorted by T_op (ties keep the core enumeration order).

    `memory_filter=False` keeps every legal choice (to evaluate arbitrary legal plans). A verify vertex's choices are
    its pool sizes (`pool_directory`)."""
    if v.role == VERIFY:
        return pool_directory(p, v, hw)
    if p.cluster is None:
        raise RpegError(p.graph.loc if p.graph else None, "the optimizer needs an rpeg.cluster to place vertices on")
    model = p.model(v.model)
    check_directory_size(model, p.workload, p.cluster, v.name)  # before building anything
    raw = enumerate_candidates(model, p.workload, p.cluster)
    if rules.mb_rule == MB_FIXED:
        raw = [(a, s) for a, s in raw if s.mb == fixed_microbatch(v.role, s.pp)]
    models = {m.name: m for m in p.models}
    priced: dict[tuple[Strategy, tuple[int, int, int]], tuple[OpTime, float, tuple]] = {}
    choices: dict[Strategy, list[Strategy]] = {}
    keep: list[tuple[float, int, Alloc, Strategy, OpTime, float]] = []
    best_bad = float("inf")
    dropped = 0
    for i, (a, base) in enumerate(raw):
        if base not in choices:
            choices[base] = training_choices(v, base, p, rules)
        for s in _undominated(choices[base], a, priced, lambda s, a=a: _price(p, v, a, s, models, hw, opts)):
            t, r_peak, _ = priced[(s, a.extent)]
            if memory_filter and r_peak > 1.0:
                best_bad = min(best_bad, r_peak)
                dropped += 1
                continue
            keep.append((float(t.T_op), i, a, s, t, r_peak))
    if not keep and not dropped:
        raise RpegError(
            v.loc,
            f"vertex @{v.name} ({v.role} of @{v.model}) has no legal execution choice (P1-P8) on cluster "
            f"@{p.cluster.name}; check that the batch B admits a data-parallel degree and the model's layer "
            "count a pipeline split, or change the cluster shape",
        )
    if not keep:
        raise RpegError(
            v.loc,
            f"vertex @{v.name} ({v.role} of @{v.model}) has no execution choice that fits in GPU memory on cluster "
            f"@{p.cluster.name} even when it runs alone (best peak {best_bad:.2f}x of usable HBM); use more GPUs "
            "per node or nodes, a smaller batch B*R or shorter sequences, or a smaller model",
        )
    keep.sort(key=lambda x: (x[0], x[1]))
    groups: dict[Strategy, list[int]] = {}
    for j, item in enumerate(keep):
        groups.setdefault(item[3], []).append(j)
    group_index = {s: g for g, s in enumerate(groups)}
    return VertexDirectory(
        vertex=v.name,
        role=v.role,
        model=v.model,
        allocs=tuple(x[2] for x in keep),
        strategies=tuple(x[3] for x in keep),
        op_times=tuple(x[4] for x in keep),
        t_op=np.array([x[0] for x in keep], dtype=np.float64),
        isolated_peak=np.array([x[5] for x in keep], dtype=np.float64),
        sizes=np.array([x[2].size for x in keep], dtype=np.int64),
        masks=tuple(alloc_mask(x[2], p.cluster) for x in keep),
        by_strategy=tuple(tuple(g) for g in groups.values()),
        strategy_of=np.array([group_index[x[3]] for x in keep], dtype=np.int64),
        best_infeasible_r_peak=best_bad if dropped else 0.0,
        dropped=dropped,
    )
