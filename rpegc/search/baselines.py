"""The greedy and concurrent baselines (Sec. VIII-B) and the SA seed (Alg. 1 line 7, App. A-J2h).

- greedy: every invocation runs on the full GPU set with its fastest strategy there, so the scheduler runs
  the invocations one after another. "Feasible" is isolated feasibility (the directory's filter); when the
  co-resident state of the models then does not fit, the plan is repaired deterministically by switching,
  one vertex at a time, to the full-set candidate that lowers the peak most. It may still be infeasible
  (the paper reports such baselines as OOM).
- concurrent: vertices are grouped by depth in the within-step data DAG (a group has no data dependency
  inside it and can run in parallel); each group partitions the device space into disjoint allocations,
  choosing the sizes that minimise the group's estimated time max_v T_op(v), then aligned first-fit
  packing. The estimated step time is the sum over groups. If the joint plan does not fit in memory, group
  partitions are exchanged for the next best ones while that lowers the peak.
Both only use directory entries, so their plans are legal (P1-P8).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional

from rpegc.core.cost.host import pool_cores
from rpegc.search.compact import Choice, CompactVariant

OPTIONS_PER_GROUP = 24
MAX_SIZE_TUPLES = 200_000


@dataclass(frozen=True)
class BaselinePlan:
    name: str
    choice: Choice
    estimated_time: float  # the heuristic's own estimate (sum of group maxima of T_op)


def host_allowed(cv: CompactVariant) -> int:
    """The devices a baseline may use: on every node the first as many as its host has cores (a device's worker
    takes one: cost/host.cores_needed), and on the first node fewer by the host cores a verifier pool of one process
    takes for its own (cost/host.pool_cores; the node's last GPUs give theirs up), at least one per node. All where
    the profile does not give the host's cores."""
    everything = (1 << cv.num_devices) - 1
    if cv.host_cores is None:
        return everything
    cluster = cv.program.cluster
    gpus = cluster.gpus
    own = pool_cores(1, cv.host_cores, cluster)[0] if not all(cv.device_vertex) else 0
    allowed = 0
    for host in range(cluster.racks * cluster.nodes):
        keep = max(1, min(gpus, cv.host_cores - (own if host == 0 else 0)))
        allowed |= ((1 << keep) - 1) << (host * gpus)
    return allowed


def greedy_plan(cv: CompactVariant) -> BaselinePlan:
    """Fastest full-GPU-set choice per vertex (largest allocation if none covers every GPU; within the devices that
    leave the verifier pools their host cores, `host_allowed`)."""
    allowed = host_allowed(cv)
    options = []
    for d in cv.dirs:
        inside = [i for i in range(len(d)) if not d.masks[i] & ~allowed] or list(range(len(d)))
        full = int(max(d.sizes[i] for i in inside))
        options.append([i for i in inside if d.sizes[i] == full])
    choice = [opts[0] for opts in options]
    choice = fit_pools(cv, _repair_memory(cv, choice, options))
    total = sum(float(d.t_op[c]) for d, c in zip(cv.dirs, choice))
    return BaselinePlan("greedy", tuple(choice), total)


def fit_pools(cv: CompactVariant, choice: list[int]) -> list[int]:
    """Each verifier pool (cost/host.py) at the fastest size the host's cores leave beside the devices, else its
    smallest (the plan is then infeasible; the search moves devices off the first node)."""
    for v, on in enumerate(cv.device_vertex):
        if on:
            continue
        d = cv.dirs[v]
        fits = [c for c in range(len(d)) if cv.cores_fit(tuple(choice[:v]) + (c,) + tuple(choice[v + 1:]))]
        choice[v] = fits[0] if fits else min(range(len(d)), key=lambda c: d.pools[c])
    return choice


def concurrency_groups(cv: CompactVariant) -> list[list[int]]:
    """Vertices grouped by longest data-edge path from a source (vertex indices, topological order); verify vertices
    are in none."""
    g = cv.program.graph
    depth = {v.name: 0 for v in cv.vertices}
    for v in cv.vertices:  # topological order
        for e in g.data_edges:
            if e.src == v.name:
                depth[e.dst] = max(depth[e.dst], depth[v.name] + 1)
    groups: dict[int, list[int]] = {}
    for i, (v, on) in enumerate(zip(cv.vertices, cv.device_vertex)):
        if on:  # a verifier pool shares no devices with anyone: it is sized after the devices (fit_pools)
            groups.setdefault(depth[v.name], []).append(i)
    return [groups[k] for k in sorted(groups)]


def concurrent_plan(cv: CompactVariant) -> BaselinePlan:
    """Disjoint allocations inside each concurrency group, sizes minimising the estimated step time."""
    per_group = [_group_options(cv, members) for members in concurrency_groups(cv)]
    choice = [0] * len(cv.vertices)
    for options in per_group:
        for v, c in options[0][1]:
            choice[v] = c
    choice = fit_pools(cv, _repair_groups(cv, choice, per_group))
    estimate = sum(max(float(cv.dirs[v].t_op[choice[v]]) for v, _ in options[0][1]) for options in per_group)
    return BaselinePlan("concurrent", tuple(choice), estimate)


def _group_options(cv: CompactVariant, members: list[int]) -> list[tuple[float, tuple[tuple[int, int], ...]]]:
    """Up to OPTIONS_PER_GROUP packable disjoint assignments (inside `host_allowed`), best estimated group time first."""
    n_dev = host_allowed(cv).bit_count()
    best_by_size: list[dict[int, int]] = []  # per member: size -> strategy group with the smallest T_op
    for v in members:
        d = cv.dirs[v]
        sizes: dict[int, int] = {}
        for g, idx in enumerate(d.by_strategy):
            size = int(d.sizes[idx[0]])
            if size not in sizes or d.t_op[idx[0]] < d.t_op[d.by_strategy[sizes[size]][0]]:
                sizes[size] = g
        best_by_size.append(sizes)
    size_lists = [sorted(s) for s in best_by_size]
    while math.prod(len(x) for x in size_lists) > MAX_SIZE_TUPLES:
        widest = max(range(len(size_lists)), key=lambda i: len(size_lists[i]))
        by_time = sorted(size_lists[widest], key=lambda s: cv.dirs[members[widest]].t_op[
            cv.dirs[members[widest]].by_strategy[best_by_size[widest][s]][0]])
        size_lists[widest] = sorted(by_time[: len(by_time) // 2 or 1])
    tuples = []
    for sizes in itertools.product(*size_lists):
        if sum(sizes) > n_dev:
            continue
        t = max(float(cv.dirs[v].t_op[cv.dirs[v].by_strategy[best_by_size[k][s]][0]])
                for k, (v, s) in enumerate(zip(members, sizes)))
        tuples.append((t, sum(sizes), sizes))
    tuples.sort()
    options = []
    for t, _, sizes in tuples:
        packed = _pack(cv, members, [best_by_size[k][s] for k, s in enumerate(sizes)])
        if packed is not None:
            options.append((t, packed))
            if len(options) >= OPTIONS_PER_GROUP:
                break
    if not options:  # the members do not fit side by side: they share devices and run one after another
        fastest = tuple((v, 0) for v in members)
        options.append((sum(float(cv.dirs[v].t_op[0]) for v in members), fastest))
    return options


def _pack(cv: CompactVariant, members: list[int], groups: list[int]) -> Optional[tuple[tuple[int, int], ...]]:
    """Aligned first fit, largest allocation first; None if the blocks do not fit side by side."""
    sizes = [int(cv.dirs[v].sizes[cv.dirs[v].by_strategy[g][0]]) for v, g in zip(members, groups)]
    order = sorted(range(len(members)), key=lambda k: (-sizes[k], k))
    used = ((1 << cv.num_devices) - 1) & ~host_allowed(cv)  # what the pools' cores rule out counts as taken
    picks: dict[int, int] = {}
    for k in order:
        d = cv.dirs[members[k]]
        for c in d.by_strategy[groups[k]]:
            if not d.masks[c] & used:
                used |= d.masks[c]
                picks[members[k]] = c
                break
        else:
            return None
    return tuple((v, picks[v]) for v in members)


def _r_peak(cv: CompactVariant, choice) -> float:
    allocs, strats = cv.placement(tuple(choice))
    return cv.memory(allocs, strats).r_peak


def _repair_memory(cv: CompactVariant, choice: list[int], options: list[list[int]]) -> list[int]:
    """Per-vertex coordinate descent on r_peak until the plan fits or nothing lowers the peak."""
    current = _r_peak(cv, choice)
    while current > 1.0:
        best = (current, None, None)
        for v, opts in enumerate(options):
            for alt in opts:
                trial = list(choice)
                trial[v] = alt
                r = _r_peak(cv, trial)
                if r < best[0]:
                    best = (r, v, alt)
        if best[1] is None:
            break
        choice[best[1]] = best[2]
        current = best[0]
    return choice


def _repair_groups(cv: CompactVariant, choice: list[int], per_group) -> list[int]:
    """Exchange whole-group partitions for later (slower) ones while that lowers the peak."""
    current = _r_peak(cv, choice)
    while current > 1.0:
        best = (current, None)
        for options in per_group:
            for _, assignment in options[1:]:
                trial = list(choice)
                for v, c in assignment:
                    trial[v] = c
                r = _r_peak(cv, trial)
                if r < best[0]:
                    best = (r, trial)
        if best[1] is None:
            break
        current, choice = best
    return choice
