"""Greedy list scheduling of the executable DAG on plain arrays (paper Alg. 5, App. A-H; spec 7).

Both the `schedule` pass (through `rpegc.core.sched.schedule`) and the optimizer's compact
evaluator call this module, so they get identical start/finish times and makespans; `row_scheduler` is its
array form for the batched evaluator (many configurations per call, the same float operations).

Algorithm (Definitions A.11-A.14):
- rank(v) = T(v) + max rank(successor), empty max = 0 (downstream rank, Def. A.13);
  every member of a rank group (the phase sub-nodes of one generation chain) uses the group's
  largest rank, which is the chain head's rank because ranks only decrease along a chain.
- avail(d) = 0 for every device; repeatedly select, among ready nodes, the smallest
  EST(v) = max(max finish of predecessors, max avail(d) over the reserved set of v) (Def. A.14).
  Ties: Comm/Reshard before Op, then larger (inherited) rank, then the lower RPEG order key
  (so unrolled steps keep the same relative order), then the lower node index.
- s(v) = EST(v), f(v) = s(v) + T(v), avail(d) = f(v) for every reserved d; MS = max f.

Implementation: a min-heap with lazy deletion (EST only grows while a node waits, so a popped entry
whose EST went up is pushed back): O(N log N + E) plus one re-push each time a waiting node's device
is taken by another node first. A popped entry that is still current has the true minimum EST, and
equal ESTs are ordered by the tie-breakers in the heap key, so this is exactly Alg. 5. Devices are compressed into "atoms": maximal
device sets that every reserved set either contains whole or misses, so all devices of an atom
always have the same avail and one number per atom suffices. Reserved sets are Python-int bitsets.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Optional, Sequence

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.geometry import DeviceSet, device_mask


@dataclass(frozen=True)
class ScheduleStructure:
    """Everything about a DAG that does not depend on the node times; reusable across time maps."""

    n: int
    succs: tuple[tuple[int, ...], ...]
    npred: tuple[int, ...]
    reverse_topo: tuple[int, ...]
    sources: tuple[int, ...]
    kind: tuple[int, ...]  # 0: Comm/Reshard, 1: Op (the first tie-breaker sorts ascending)
    pos: tuple[int, ...]  # rank of (order key, index): the last tie-breakers as one int
    node_atoms: tuple[tuple[int, ...], ...]
    num_atoms: int
    sizes: tuple[int, ...]  # |reserved(v)|, for busy device-seconds
    groups: tuple[tuple[int, ...], ...]  # rank groups with two or more members


@dataclass(frozen=True)
class Schedule:
    start: tuple[float, ...]
    finish: tuple[float, ...]
    makespan: float
    order: tuple[int, ...]  # node indices in the order the scheduler placed them
    busy: float  # sum over nodes of T(v) * |reserved(v)|: device-seconds busy (A18)
    op_time: float  # sum of T over Op nodes (numerator of P_eff)


def topological_order(
    n: int, succs: Sequence[Sequence[int]], npred: Sequence[int], names: Optional[Sequence[str]] = None
) -> list[int]:
    """Kahn's order of nodes 0..n-1; a cycle is an RpegError naming the nodes involved or blocked by it."""
    left = list(npred)
    order = [v for v in range(n) if left[v] == 0]
    i = 0
    while i < len(order):
        for w in succs[order[i]]:
            left[w] -= 1
            if left[w] == 0:
                order.append(w)
        i += 1
    if len(order) < n:
        stuck = [v for v in range(n) if left[v] > 0]
        shown = ", ".join(names[v] if names else str(v) for v in stuck[:6])
        raise RpegError(
            None,
            f"the executable graph has a dependency cycle (nodes involved or blocked by it: {shown}"
            f"{', ...' if len(stuck) > 6 else ''}); remove an edge so that the graph is acyclic"
        )
    return order


def _atoms(masks: Sequence[int]) -> list[int]:
    """Partition the union of `masks` into atoms: cells of their Venn diagram."""
    atoms: list[int] = []
    for m in masks:
        rest = m
        refined = []
        for a in atoms:
            inside = a & m
            if inside:
                refined.append(inside)
                rest &= ~a
            outside = a & ~m
            if outside:
                refined.append(outside)
        if rest:
            refined.append(rest)
        atoms = refined
    return atoms


def _masks(reserved: Sequence[DeviceSet]) -> list[int]:
    # Many nodes share one allocation, so convert each distinct tuple once.
    cache: dict[tuple, int] = {}
    out = []
    for r in reserved:
        if isinstance(r, int):
            out.append(device_mask(r))
        elif isinstance(r, tuple):
            m = cache.get(r)
            if m is None:
                m = cache[r] = device_mask(r)
            out.append(m)
        else:
            out.append(device_mask(r))
    return out


def device_sizes(masks: Sequence[int], devices: Optional[int] = None) -> tuple[int, ...]:
    """|reserved(v)| in devices, for busy device-seconds: bits at and above `devices` are not devices (a host's
    verifier pool, cost/host.py) and count nothing."""
    if devices is None:
        return tuple(m.bit_count() for m in masks)
    below = (1 << devices) - 1
    return tuple((m & below).bit_count() for m in masks)


def prepare_schedule(
    is_transfer: Sequence[bool],
    reserved: Sequence[DeviceSet],
    edges: Iterable[tuple[int, int]],
    groups: Optional[Sequence[Hashable]] = None,
    order_keys: Optional[Sequence] = None,
    names: Optional[Sequence[str]] = None,
    devices: Optional[int] = None,
) -> ScheduleStructure:
    """Precompute the time-independent part of Alg. 5.

    is_transfer[v]: Comm/Reshard (True) or Op (False). reserved[v]: its reserved devices (Op: its
    allocation; Comm/Reshard: the destination allocation), as a bitmask or iterable of ids.
    edges: (u, v) precedence pairs (duplicates allowed). groups[v]: rank-group id (None: every node
    alone). order_keys[v]: any comparable key, lower is scheduled first on ties (None: the index).
    names are used only in error messages. devices: resources at and above this bit are not devices (a host's
    verifier pool, cost/host.py): they hold their nodes as a device does, but count no busy device-seconds.
    """
    n = len(is_transfer)
    if len(reserved) != n or (groups is not None and len(groups) != n) or (
        order_keys is not None and len(order_keys) != n
    ):
        raise ValueError("is_transfer, reserved, groups and order_keys must have one entry per node")
    pairs = dict.fromkeys(edges)  # drop duplicate edges, keep a deterministic order
    for u, v in pairs:
        if not (0 <= u < n and 0 <= v < n):
            raise RpegError(None, f"edge ({u}, {v}) refers to a node index outside 0..{n - 1}")
        if u == v:
            label = names[u] if names else str(u)
            raise RpegError(None, f"node {label} depends on itself; remove the self-edge")
    succs: list[list[int]] = [[] for _ in range(n)]
    npred = [0] * n
    for u, v in pairs:
        succs[u].append(v)
        npred[v] += 1
    topo = topological_order(n, succs, npred, names)

    masks = _masks(reserved)
    distinct = list(dict.fromkeys(m for m in masks if m))
    atoms = _atoms(distinct)
    atoms_of = {m: tuple(i for i, a in enumerate(atoms) if a & m) for m in distinct}
    node_atoms = tuple(atoms_of[m] if m else () for m in masks)

    keys = order_keys if order_keys is not None else range(n)
    by_key = sorted(range(n), key=lambda v: (keys[v], v))
    pos = [0] * n
    for p, v in enumerate(by_key):
        pos[v] = p

    members: dict = {}
    if groups is not None:
        for v, g in enumerate(groups):
            members.setdefault(g, []).append(v)
    return ScheduleStructure(
        n=n,
        succs=tuple(tuple(s) for s in succs),
        npred=tuple(npred),
        reverse_topo=tuple(reversed(topo)),
        sources=tuple(v for v in range(n) if npred[v] == 0),
        kind=tuple(0 if t else 1 for t in is_transfer),
        pos=tuple(pos),
        node_atoms=node_atoms,
        num_atoms=len(atoms),
        sizes=device_sizes(masks, devices),
        groups=tuple(tuple(g) for g in members.values() if len(g) > 1),
    )


def downstream_ranks(structure: ScheduleStructure, times: Sequence[float]) -> list[float]:
    """rank(v) = T(v) + max rank(successor), then group members take the group's largest rank."""
    rank = [0.0] * structure.n
    succs = structure.succs
    for v in structure.reverse_topo:
        best = 0.0
        for w in succs[v]:
            r = rank[w]
            if r > best:
                best = r
        rank[v] = times[v] + best
    for group in structure.groups:
        head = max(rank[v] for v in group)
        for v in group:
            rank[v] = head
    return rank


def _check_times(structure: ScheduleStructure, times: Sequence[float]) -> None:
    if len(times) != structure.n:
        raise ValueError(f"expected {structure.n} node times, got {len(times)}")
    if structure.n and (not math.isfinite(sum(times)) or min(times) < 0.0):
        raise RpegError(None, "node times must be finite and non-negative; fix the time map (annotate-cost)")


def run_schedule(structure: ScheduleStructure, times: Sequence[float]) -> Schedule:
    """Alg. 5 on a prepared structure with time map `times` (seconds, one per node)."""
    _check_times(structure, times)
    n = structure.n
    rank = downstream_ranks(structure, times)
    succs, kind, pos, node_atoms = structure.succs, structure.kind, structure.pos, structure.node_atoms
    npred = list(structure.npred)
    ready = [0.0] * n
    avail = [0.0] * structure.num_atoms
    start = [0.0] * n
    finish = [0.0] * n
    order = []
    # Heap entries (EST, kind, -rank, pos, v): tuple order is exactly the selection order; pos is
    # unique, so v never takes part in a comparison.
    heap = [(0.0, kind[v], -rank[v], pos[v], v) for v in structure.sources]
    heapq.heapify(heap)
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    while heap:
        entry = heap[0]
        v = entry[4]
        est = ready[v]
        atoms = node_atoms[v]
        for a in atoms:
            t = avail[a]
            if t > est:
                est = t
        if est > entry[0]:
            replace(heap, (est, entry[1], entry[2], entry[3], v))
            continue
        pop(heap)
        f = est + times[v]
        start[v] = est
        finish[v] = f
        order.append(v)
        for a in atoms:
            avail[a] = f
        for w in succs[v]:
            if f > ready[w]:
                ready[w] = f
            npred[w] -= 1
            if npred[w] == 0:
                e = ready[w]
                for a in node_atoms[w]:
                    t = avail[a]
                    if t > e:
                        e = t
                push(heap, (e, kind[w], -rank[w], pos[w], w))
    sizes = structure.sizes
    busy = 0.0
    op_time = 0.0
    for v in range(n):
        busy += times[v] * sizes[v]
        if kind[v]:
            op_time += times[v]
    return Schedule(
        start=tuple(start),
        finish=tuple(finish),
        makespan=max(finish, default=0.0),
        order=tuple(order),
        busy=busy,
        op_time=op_time,
    )


def greedy_schedule(
    times: Sequence[float],
    is_transfer: Sequence[bool],
    reserved: Sequence[DeviceSet],
    edges: Iterable[tuple[int, int]],
    groups: Optional[Sequence[Hashable]] = None,
    order_keys: Optional[Sequence] = None,
    names: Optional[Sequence[str]] = None,
    devices: Optional[int] = None,
) -> Schedule:
    """One-shot `prepare_schedule` + `run_schedule`."""
    return run_schedule(prepare_schedule(is_transfer, reserved, edges, groups, order_keys, names, devices), times)
