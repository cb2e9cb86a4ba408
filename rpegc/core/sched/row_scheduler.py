"""Greedy list scheduling (paper Alg. 5, App. A-H) of many configurations, one row each, compiled with numba.

The array form of `list_scheduler`, for the optimizer's batched evaluator (`rpegc.search.batched`), which
prepares per configuration a padded superset graph: node times, reserved classes, one unique priority per
node that encodes the tie-breakers (Comm/Reshard first, larger downstream rank, lower order key), the
successor table and a chain cover of the DAG (a node can be ready only when it heads its chain, so a step
inspects one slot per chain). Devices are one availability per class (a vertex allocation), raised for
every class that shares a device with the selected node's. The float operations are those of
`list_scheduler` (EST = max of ready time and availability, finish = EST + T), so makespans are
bit-identical (tests/test_search_differential.py).

Why compiled: a schedule is N dependent selections per configuration. Run as numpy steps in lockstep across
the rows, each step cost ~40 array calls whatever the batch size, ~18 ms per batch of a 220-node graph, so the
annealing's rounds of 20-60 plans ran at 400-2,000 plans per second; per row in numba the same batch takes
~0.07 us per row and node (bench/results/eval_throughput.csv for the whole search).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def schedule_rows(T, cls, prio, succ, npred, chain, nxt, heads, overlap, start, finish, makespan):  # pragma: no cover
    """Every row b: pick, N times, among the chain heads whose predecessors are done the one with the
    smallest earliest start time max(ready, availability of its class), then the smallest priority; it
    finishes at EST + T and raises the availability of every class that shares a device with its own.

    Arrays (N = nodes incl. padding; index N is the dummy that ends every chain and pads `succ`):
    T (B x N+1) float, cls/prio/npred/chain/nxt (B x N+1) int, succ (B x N+1 x D) int, heads (B x C) int,
    overlap (B x V+1 x V+1) bool. Writes start/finish (B x N+1; unused when of size 0) and makespan (B)."""
    B, N1 = T.shape
    N = N1 - 1
    C = heads.shape[1]
    D = succ.shape[2]
    K = overlap.shape[1]
    record = start.shape[0] > 0
    ready = np.empty(N1)
    left = np.empty(N1, dtype=np.int64)
    avail = np.empty(K)
    head = np.empty(C, dtype=np.int64)
    head_rt = np.empty(C)  # per chain slot: its head's ready time (inf while it waits for predecessors)
    head_cls = np.empty(C, dtype=np.int64)
    head_pr = np.empty(C, dtype=np.int64)
    for b in range(B):
        ready[:] = 0.0
        left[:] = npred[b]
        avail[:] = 0.0
        for c in range(C):
            h = heads[b, c]
            head[c] = h
            head_rt[c] = 0.0 if h != N and left[h] == 0 else np.inf
            head_cls[c] = cls[b, h]
            head_pr[c] = prio[b, h]
        ms = 0.0
        for _ in range(N):
            best, best_est, best_pr = -1, np.inf, 0
            for c in range(C):
                if head[c] == N:
                    continue
                e = max(head_rt[c], avail[head_cls[c]])
                p = head_pr[c]
                if best < 0 or e < best_est or (e == best_est and p < best_pr):
                    best, best_est, best_pr = c, e, p
            v = head[best]
            f = best_est + T[b, v]
            ms = max(ms, f)
            if record:
                start[b, v] = best_est
                finish[b, v] = f
            k = head_cls[best]
            for u in range(K):
                if overlap[b, k, u] and f > avail[u]:
                    avail[u] = f
            for d in range(D):
                s = succ[b, v, d]
                if s == N:
                    continue
                ready[s] = max(ready[s], f)
                left[s] -= 1
                if left[s] == 0:
                    head_rt[chain[b, s]] = ready[s]
            w = nxt[b, v]
            head[best] = w
            head_rt[best] = ready[w] if w != N and left[w] == 0 else np.inf
            head_cls[best] = cls[b, w]
            head_pr[best] = prio[b, w]
        makespan[b] = ms


@njit(cache=True, nogil=True)
def downstream_ranks(T, succ, by_height, group_of, groups, rank):  # pragma: no cover
    """Def. A.13 per row: rank(x) = T(x) + the largest rank of x's successors (0 for sinks), nodes taken by
    height so successors come first; then the nodes of a generation chain (`group_of` >= 0) all take the
    largest rank in their chain (computed from the ranks before this step, as for the reference path).

    T, rank: B x N; succ: (N+1) x D padded with N; by_height, group_of: (N,)."""
    B, N = T.shape
    D = succ.shape[1]
    top = np.empty(max(groups, 1))
    for b in range(B):
        for x in by_height:
            r = 0.0
            for d in range(D):
                s = succ[x, d]
                if s != N and rank[b, s] > r:
                    r = rank[b, s]
            rank[b, x] = T[b, x] + r
        if groups:
            top[:] = -np.inf
            for x in range(N):
                g = group_of[x]
                if g >= 0 and rank[b, x] > top[g]:
                    top[g] = rank[b, x]
            for x in range(N):
                g = group_of[x]
                if g >= 0:
                    rank[b, x] = top[g]
