"""The batched evaluator: many plans of one structural variant in one call, with numpy.

Paper: App. A-J2c (EVALUATECACHED) and A-H (Alg. 5); DESIGN.md Sec. 3 (the compact array form). Same
semantics as `compact.CompactVariant.evaluate`, vectorised across configurations:

- Plans are grouped by pattern (see `compact`); each group shares one superset graph, so all of its
  configurations have the same nodes and edges and differ only in node times, reserved devices, relays and
  tie-break keys. Groups are padded to one node count and scheduled together.
- Node times are table look-ups and the core's array forms (`transfer.comm_node_time_at` at the tier of
  `geometry.span_tier_index`; the lowering decisions `rules.publication_codes` and `pair_codes`;
  the payload `rules.publication_bytes_of`), bit-identical to the scalar path.
- Alg. 5 runs on all configurations at once. Each step selects one node per configuration, so every
  configuration finishes after exactly N steps. The ready set is kept as one slot per chain of a chain
  cover of the superset DAG: a node can be ready only when it heads its chain, so each step inspects
  C (chains) slots instead of N nodes. Devices are kept as one availability per vertex allocation
  ("class"); a node reserves the allocation of one vertex, and since availability only grows, the
  availability of a class is the maximum over its atoms, updated with the overlap relation of the plans.
  Selection uses the core tie-breakers: smallest EST, then transfers first, larger downstream rank
  (generation chains share the head's rank), lower order key.
- Device memory is `residency.device_memory_arrays`, the core's form for many configurations.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import numpy as np

from rpegc.core.ir.geometry import pairwise_overlaps, span_tier_index
from rpegc.core.lower.rules import (ACTIONS, COMM, DEP, RESHARD, is_shadow, pair_codes, pairwise_same,
                                    publication_bytes_of, publication_codes)
from rpegc.core.cost.memory import op_memory
from rpegc.core.cost.residency import OpTerms, device_memory_arrays
from rpegc.core.sched.list_scheduler import topological_order
from rpegc.core.sched.score import p_eff, score, score_pen, utilization
from rpegc.core.cost.transfer import comm_node_time_at
from rpegc.search.compact import DATA_COMM, OPERATOR, PUBLICATION, CompactVariant, Superset

_INF = np.inf
_TERMS = ("train_state", "copy", "transient", "transient_with_copy")
_COMM, _DEP, _RESHARD = (ACTIONS.index(a) for a in (COMM, DEP, RESHARD))
_BIG = np.iinfo(np.int64).max // 4
PATTERN_CACHE = 1 << 16
KEEP_PLANS = 4096  # schedules kept for critical paths: a chain's restart point is usually a recent plan


@dataclass(frozen=True)
class BatchResult:
    """Per configuration (arrays of length B, `peak` is B x devices)."""

    makespan: np.ndarray
    score: np.ndarray
    score_pen: np.ndarray
    util: np.ndarray
    p_eff: np.ndarray
    r_peak: np.ndarray
    feasible: np.ndarray
    peak: np.ndarray

    def __len__(self) -> int:
        return len(self.makespan)


def mask_words(masks, ndev: int) -> np.ndarray:
    """Device bitmasks (Python ints) as rows of little-endian uint64 words, for vectorised set tests."""
    n = (ndev + 63) // 64
    data = b"".join(m.to_bytes(8 * n, "little") for m in masks)
    return np.frombuffer(data, dtype="<u8").reshape(len(masks), n)


@dataclass(frozen=True)
class _Graph:
    """A superset prepared for the vectorised scheduler."""

    n: int
    succ: np.ndarray  # (N+1) x D successor table, padded with the dummy node N
    npred: np.ndarray  # (N+1,), dummy has a huge count so it never becomes ready
    levels: tuple[np.ndarray, ...]  # node indices by height (sinks first) for downstream ranks
    groups: tuple[np.ndarray, ...]  # generation phase chains sharing the head's rank
    chain: np.ndarray  # (N+1,) chain of each node
    next_in_chain: np.ndarray  # (N+1,), dummy N after the last node of a chain
    heads: np.ndarray  # (C,) first node of each chain
    is_op: np.ndarray  # (N,) bool
    pos_comm: np.ndarray  # (N,) order-key rank when real (PUBLICATION: as a Comm)
    pos_reshard: np.ndarray  # (N,) PUBLICATION: order-key rank as a Reshard
    op_cols: dict  # (vertex, phase) -> node columns
    transfer_cols: dict  # (kind, src, dst, nbytes, model) -> node columns
    vertex: np.ndarray  # (N,) class (vertex allocation) of each node
    preds: tuple[tuple[int, ...], ...]  # per node, its predecessors in edge order (the critical-path walk)


@dataclass(frozen=True)
class Allocations:
    """The vertex allocations of B configurations (V vertices each) and the relations between them."""

    origin: np.ndarray  # B x V x 3
    extent: np.ndarray  # B x V x 3
    size: np.ndarray  # B x V devices
    layout: np.ndarray  # B x V x 3 (P_d, P_p, P_t)
    overlap: np.ndarray  # B x V x V device overlap counts
    same: np.ndarray  # B x V x V: the same allocation
    same_layout: np.ndarray  # B x V x V: the same layout

    def rows(self, sel) -> "Allocations":
        """The configurations `sel` (an index or mask over B)."""
        return Allocations(*(getattr(self, f.name)[sel] for f in fields(self)))


class BatchEvaluator:
    """Evaluates arrays of plans (B x V directory indices) of one compiled variant."""

    def __init__(self, cv: CompactVariant):
        self.cv = cv
        p = cv.program
        self.V = len(cv.vertices)
        self.ndev = cv.num_devices
        self.cluster = p.cluster
        self._graphs: dict = {}
        self.origin = [np.array([a.origin for a in d.allocs], dtype=np.int64) for d in cv.dirs]
        self.extent = [np.array([a.extent for a in d.allocs], dtype=np.int64) for d in cv.dirs]
        self.size = [d.sizes for d in cv.dirs]
        self.layout = [np.array([s.layout() for s in d.strategies], dtype=np.int64) for d in cv.dirs]
        self.devmask = [self._device_rows(d) for d in cv.dirs]
        self.words = [mask_words(d.masks, self.ndev) for d in cv.dirs]  # the masks as uint64 words, per vertex
        self._memory_tables()
        self._reshard_tables: dict = {}
        self._pattern_of: dict = {}  # relations row (bytes) -> pattern: a pattern is a function of the relations
        self._kept: dict = {}  # choice -> its schedule, for the last KEEP_PLANS plans evaluated with keep

    # --- static tables ---------------------------------------------------------------------------

    def _device_rows(self, d) -> np.ndarray:
        rows = np.zeros((len(d), self.ndev), dtype=bool)
        for i, m in enumerate(d.masks):
            bits = np.frombuffer(m.to_bytes((self.ndev + 7) // 8, "little"), dtype=np.uint8)
            rows[i] = np.unpackbits(bits, bitorder="little")[: self.ndev].astype(bool)
        return rows

    def _memory_tables(self) -> None:
        """Per vertex, the memory terms of every directory entry (`residency.OpTerms`, by the core's calls)."""
        cv = self.cv
        wl = cv.program.workload
        self.mem = []
        for v, d in zip(cv.vertices, cv.dirs):
            m = cv.models[v.model]
            entries = [OpTerms.of(op_memory(v.role, m.arch, m.kind, wl, dp=s.dp, pp=s.pp, tp=s.tp, mb=s.mb,
                                            opts=cv.opts), s, wl.s_b, cv.opts) for s in d.strategies]
            self.mem.append(OpTerms(*(np.concatenate([getattr(e, f) for e in entries]) for f in _TERMS)))

    def _reshard_table(self, model: str, v: int) -> np.ndarray:
        key = (model, v)
        t = self._reshard_tables.get(key)
        if t is None:
            t = np.array([self.cv.reshard_time(model, a) for a in self.cv.dirs[v].allocs])
            self._reshard_tables[key] = t
        return t

    # --- evaluation ----------------------------------------------------------------------------------

    def evaluate(self, choices, keep: bool = False) -> BatchResult:
        """With `keep`, the schedules of this batch are kept for `critical_weights` (the last KEEP_PLANS)."""
        ch = np.asarray(choices, dtype=np.int64).reshape(-1, self.V)
        B = len(ch)
        allocs = self._allocs(ch)
        busy = np.empty(B)
        op_time = np.empty(B)
        keys, inverse = self._patterns(ch, allocs)
        parts = []
        groups = [(np.nonzero(inverse == g)[0], self._graph(self.cv.superset(key))) for g, key in enumerate(keys)]
        memo = self._transfer_times(groups, ch, allocs)
        for rows, G in groups:
            T, cls, prio, bz, ot = self._node_arrays(G, rows, ch, allocs, memo)
            busy[rows], op_time[rows] = bz, ot
            parts.append((rows, G, T, cls, prio))
        makespan = np.empty(B)
        overlap = self._class_overlap(allocs)
        for bucket in _buckets(parts):
            rows = np.concatenate([p[0] for p in bucket])
            sub, k = [], 0
            for r, G, T, cls, prio in bucket:
                sub.append((np.arange(k, k + len(r)), G, T, cls, prio))
                k += len(r)
            out = _run(_stack(sub, len(rows), self.V), overlap[rows], self.V, record=keep)
            makespan[rows] = out[0] if keep else out
            if keep:
                self._keep(ch, sub, rows, out[1], out[2], overlap)
        peak = self._memory(ch)
        cv = self.cv
        m_eff = cv.hw.M_eff
        r_peak = peak.max(axis=1) / m_eff
        w = cv.program.workload
        raw = score(makespan, cv.steps, w.B, w.R, w.Lp, w.Lr)
        return BatchResult(
            makespan=makespan,
            score=raw,
            score_pen=score_pen(raw, r_peak),
            util=utilization(busy, cv.num_devices, makespan),
            p_eff=p_eff(op_time, makespan),
            r_peak=r_peak,
            feasible=np.all(peak <= m_eff, axis=1),
            peak=peak,
        )

    def _keep(self, ch, sub, rows, start, finish, overlap) -> None:
        for local, G, T, cls, _ in sub:
            for i, k in enumerate(local):
                r = rows[k]
                self._kept[tuple(ch[r].tolist())] = (G, T[i], cls[i], start[k], finish[k], overlap[r])
        while len(self._kept) > KEEP_PLANS:  # the oldest first (dicts keep insertion order)
            del self._kept[next(iter(self._kept))]

    def critical_weights(self, choice) -> Optional[np.ndarray]:
        """`CompactVariant.critical_weights` of a plan of a recent batch evaluated with `keep`, from its kept
        schedule (the same walk on the same superset schedule, so the same weights); None for other plans."""
        kept = self._kept.get(tuple(choice))
        if kept is None:
            return None
        G, T, cls, start, finish, overlap = kept
        n = G.n
        start, finish, cls = start[:n], finish[:n], cls[:n]
        starts, finishes = start.tolist(), finish.tolist()
        weights = np.zeros(self.V)
        x: Optional[int] = int(np.argmax(finish))  # the latest finish, the lowest index among ties
        seen = set()
        while x is not None and x not in seen:
            seen.add(x)
            if G.is_op[x]:
                weights[G.vertex[x]] += T[x]
            s = starts[x]
            if s <= 0.0:
                break
            blocker = next((u for u in G.preds[x] if finishes[u] == s), None)
            if blocker is None:  # the last node that held one of x's devices and finished at its start
                held = np.nonzero((finish == s) & overlap[cls[x]][cls] & (start <= s))[0]
                blocker = int(held[-1]) if len(held) else None
            x = blocker
        return weights

    def _allocs(self, ch: np.ndarray) -> Allocations:
        V = self.V
        origin = np.stack([self.origin[v][ch[:, v]] for v in range(V)], axis=1)
        extent = np.stack([self.extent[v][ch[:, v]] for v in range(V)], axis=1)
        layout = np.stack([self.layout[v][ch[:, v]] for v in range(V)], axis=1)
        size = np.stack([self.size[v][ch[:, v]] for v in range(V)], axis=1)
        return Allocations(origin=origin, extent=extent, size=size, layout=layout,
                           overlap=pairwise_overlaps(origin, extent),
                           same=pairwise_same(np.concatenate([origin, extent], axis=2)),
                           same_layout=pairwise_same(layout))

    # --- patterns ------------------------------------------------------------------------------------

    def _patterns(self, ch: np.ndarray, allocs: Allocations):
        """Pattern of every configuration, grouped.

        A pattern depends only on which vertex allocations are equal or disjoint and which layouts on equal
        devices are equal (`CompactVariant.relation_pairs`), so configurations are grouped by those
        relations and `CompactVariant.pattern` runs once per group, on its first configuration."""
        equal, apart = (np.array(x, dtype=np.int64).reshape(-1, 2) for x in self.cv.relation_pairs)
        same = allocs.same[:, equal[:, 0], equal[:, 1]]
        relations = np.concatenate(
            [same, same & allocs.same_layout[:, equal[:, 0], equal[:, 1]],
             allocs.overlap[:, apart[:, 0], apart[:, 1]] == 0], axis=1)
        unique, first, inverse = np.unique(relations, axis=0, return_index=True, return_inverse=True)
        keys: list = []
        index: dict = {}
        group = np.empty(len(first), dtype=np.int64)
        if len(self._pattern_of) > PATTERN_CACHE:
            self._pattern_of.clear()
        for g, row in enumerate(first):
            relation = unique[g].tobytes()
            key = self._pattern_of.get(relation)
            if key is None:
                key = self._pattern_of[relation] = self.cv.pattern(*self.cv.placement(tuple(int(x) for x in ch[row])))
            group[g] = index.setdefault(key, len(keys))
            if group[g] == len(keys):
                keys.append(key)
        return keys, group[inverse.reshape(-1)]

    # --- node times ----------------------------------------------------------------------------------

    def _graph(self, s: Superset) -> _Graph:
        g = self._graphs.get(s.pattern)
        if g is None:
            g = self._graphs[s.pattern] = prepare_graph(s)
        return g

    def _comm_time(self, allocs: Allocations, payload, u: int, v: int) -> np.ndarray:
        """`transfer.comm_node_time` of every configuration's allocations of u and v."""
        org, ext = allocs.origin, allocs.extent
        tier = span_tier_index(org[:, u].T, ext[:, u].T, org[:, v].T, ext[:, v].T)
        return comm_node_time_at(payload, tier, allocs.size[:, u], allocs.size[:, v], self.cv.hw)

    def _transfer(self, allocs: Allocations, ch: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, relay, as_reshard) of one kind of Comm/Reshard superset node, per configuration."""
        kind, u, v, nbytes, model = spec
        B = len(ch)
        no = np.zeros(B, dtype=bool)
        if kind == DATA_COMM:
            relay = allocs.same[:, u, v]
            return np.where(relay, 0.0, self._comm_time(allocs, nbytes, u, v)), relay, no
        same, same_lay = allocs.same[:, u, v], allocs.same_layout[:, u, v]
        if kind == PUBLICATION:
            act = publication_codes(same, same_lay)
            wb = self.cv.weight_bytes(model)
            n_max = np.maximum(allocs.size[:, u], allocs.size[:, v])
            payload = publication_bytes_of(wb, n_max, allocs.overlap[:, u, v])
            comm = self._comm_time(allocs, payload, u, v)
            trainable = model in self.cv.trainable
            resh = self._reshard_table(model, v)[ch[:, v]] if trainable else np.zeros(B)
            is_resh = (act == _RESHARD) & trainable
            relay = (act == _DEP) | ((act == _RESHARD) & (not trainable))
            return np.where(act == _COMM, comm, np.where(is_resh, resh, 0.0)), relay, is_resh
        act = pair_codes(is_shadow(self.cv.tau.get(model, 0), allocs.overlap[:, u, v]), same, same_lay)
        resh = self._reshard_table(model, v)[ch[:, v]]
        is_resh = act == _RESHARD
        return np.where(is_resh, resh, 0.0), ~is_resh, is_resh

    # --- the vectorised list scheduler ---------------------------------------------------------------

    def _transfer_times(self, groups, ch: np.ndarray, allocs: Allocations) -> dict:
        """Per transfer spec, its node times on the rows of the groups that have it (batch-length arrays,
        valid at those rows): a spec is computed once however many groups share it."""
        users: dict = {}
        for rows, G in groups:
            for spec in G.transfer_cols:
                users.setdefault(spec, []).append(rows)
        memo: dict = {}
        B = len(ch)
        for spec, parts in users.items():
            sel = np.concatenate(parts)
            if len(sel) == B:
                memo[spec] = self._transfer(allocs, ch, spec)
                continue
            out = self._transfer(allocs.rows(sel), ch[sel], spec)
            full = tuple(np.zeros(B, dtype=x.dtype) for x in out)
            for f, x in zip(full, out):
                f[sel] = x
            memo[spec] = full
        return memo

    def _node_arrays(self, G: _Graph, rows: np.ndarray, ch_all: np.ndarray, allocs_all: Allocations, memo: dict):
        """Times, reserved classes and tie-break priorities of one pattern group, the batch's `rows` (plus busy
        and op time). Operator and transfer times are computed once per batch in `memo`."""
        cv = self.cv
        B, N, V = len(rows), G.n, self.V
        T = np.zeros((B, N + 1))
        relay = np.zeros((B, N), dtype=bool)
        pos = np.broadcast_to(G.pos_comm, (B, N)).copy()
        for (v, q), cols in G.op_cols.items():
            t = memo.get((v, q))
            if t is None:
                t = memo[(v, q)] = cv.t_whole[v][ch_all[:, v]] if q == 0 else cv.t_phase[v][ch_all[:, v], q - 1]
            T[:, cols] = t[rows][:, None]
        for spec, cols in G.transfer_cols.items():
            t, r, as_resh = (x[rows] for x in memo[spec])
            T[:, cols] = t[:, None]
            relay[:, cols] = r[:, None]
            if as_resh.any():
                pos[:, cols] = np.where(as_resh[:, None], G.pos_reshard[cols][None, :], pos[:, cols])
        pos[relay] = -1
        cls = np.broadcast_to(np.append(G.vertex, V), (B, N + 1)).copy()
        cls[:, :N][relay] = V
        # Downstream ranks (Def. A.13) level by level, then generation chains take the head's rank.
        rank = np.zeros((B, N + 1))
        for idx in G.levels:
            rank[:, idx] = T[:, idx] + rank[:, G.succ[idx]].max(axis=2)
        for grp in G.groups:
            rank[:, grp] = rank[:, grp].max(axis=1)[:, None]
        kind = np.broadcast_to(G.is_op.astype(np.int64), (B, N))
        order = np.lexsort((pos, -rank[:, :N], kind), axis=-1)
        prio = np.empty((B, N), dtype=np.int64)
        np.put_along_axis(prio, order, np.arange(N)[None, :], axis=1)
        sizes = np.append(allocs_all.size[rows], np.zeros((B, 1), dtype=np.int64), axis=1)
        busy = (T[:, :N] * np.take_along_axis(sizes, cls[:, :N], axis=1)).sum(axis=1)
        op_time = T[:, :N][:, G.is_op].sum(axis=1)
        return T[:, :N], cls[:, :N], prio, busy, op_time

    @staticmethod
    def _class_overlap(allocs: Allocations) -> np.ndarray:
        """B x (V+1) x (V+1): allocations sharing a device; class V (relays) reserves nothing."""
        B, V = allocs.overlap.shape[:2]
        out = np.zeros((B, V + 1, V + 1), dtype=bool)
        out[:, :V, :V] = allocs.overlap > 0
        return out

    # --- device memory -------------------------------------------------------------------------------

    def _memory(self, ch: np.ndarray) -> np.ndarray:
        """`residency.device_memory_arrays` of every configuration: peak per device (B x devices)."""
        cv = self.cv
        masks = tuple(self.devmask[v][ch[:, v]] for v in range(self.V))
        terms = tuple(OpTerms(*(getattr(self.mem[v], f)[ch[:, v]] for f in _TERMS)) for v in range(self.V))
        return device_memory_arrays(tuple(v.role for v in cv.vertices), tuple(v.model for v in cv.vertices), masks,
                                    terms, cv.models, cv.tau).peak


@dataclass(frozen=True)
class _Rows:
    """Every pattern group padded to one node count and stacked: per-row graph tables for `_run`.

    A group with fewer nodes gets isolated relays (no edges, no devices, time 0) on one extra chain; they
    are scheduled at some step without touching anything. Node index N is the dummy: padding of successor
    lists and the end of every chain; it never becomes ready."""

    T: np.ndarray  # B x (N+1)
    cls: np.ndarray  # B x (N+1), class V = no devices
    prio: np.ndarray  # B x (N+1)
    succ: np.ndarray  # B x (N+1) x D
    npred: np.ndarray  # B x (N+1)
    chain: np.ndarray  # B x (N+1)
    nxt: np.ndarray  # B x (N+1)
    heads: np.ndarray  # B x C


STEP_ROWS = 100  # a scheduler step costs about as much as 100 rows of work in it (measured, bench/eval_throughput)


def _buckets(parts):
    """Pattern groups by node count into runs of `_run`, so that short graphs do not run the steps of long
    ones more than it pays: a run costs about N_max * (STEP_ROWS + rows), and the split of the groups sorted by
    node count into consecutive runs that minimises the total is found by dynamic programming."""
    parts = sorted(parts, key=lambda x: x[1].n)
    rows = np.cumsum([0] + [len(p[0]) for p in parts])
    best = [0.0] + [np.inf] * len(parts)  # best[j]: cost of the first j groups
    cut = [0] * (len(parts) + 1)
    for j in range(1, len(parts) + 1):
        n = parts[j - 1][1].n  # the longest graph of a run ending at group j
        for i in range(j):
            cost = best[i] + n * (STEP_ROWS + rows[j] - rows[i])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets, j = [], len(parts)
    while j > 0:
        buckets.append(parts[cut[j]:j])
        j = cut[j]
    return buckets[::-1]


def _stack(parts, B: int, V: int) -> _Rows:
    N = max(G.n for _, G, _, _, _ in parts)
    C = max(len(G.heads) + (G.n < N) for _, G, _, _, _ in parts)
    D = max(G.succ.shape[1] for _, G, _, _, _ in parts)
    out = _Rows(
        T=np.zeros((B, N + 1)),
        cls=np.full((B, N + 1), V, dtype=np.int64),
        prio=np.full((B, N + 1), _BIG, dtype=np.int64),
        succ=np.full((B, N + 1, D), N, dtype=np.int64),
        npred=np.zeros((B, N + 1), dtype=np.int64),
        chain=np.zeros((B, N + 1), dtype=np.int64),
        nxt=np.full((B, N + 1), N, dtype=np.int64),
        heads=np.full((B, C), N, dtype=np.int64),
    )
    for rows, G, T, cls, prio in parts:
        n, c = G.n, len(G.heads)
        remap = np.arange(G.n + 1)
        remap[n] = N  # the group's dummy becomes the common dummy
        out.T[rows, :n] = T
        out.cls[rows, :n] = cls
        out.prio[rows, :n] = prio
        out.succ[rows, :n, : G.succ.shape[1]] = remap[G.succ[:n]]
        out.npred[rows, :n] = G.npred[:n]
        out.chain[rows, :n] = G.chain[:n]
        out.nxt[rows, :n] = remap[G.next_in_chain[:n]]
        out.heads[rows, :c] = G.heads
        if n < N:
            out.chain[rows, n:N] = c
            out.nxt[rows, n:N] = np.arange(n + 1, N + 1)
            out.heads[rows, c] = n
            out.prio[rows, n:N] = np.arange(n, N)
    out.npred[:, N] = 1 << 30  # never reaches 0 (int32 in _run)
    return out


def _run(R: _Rows, overlap: np.ndarray, V: int, record: bool = False):
    """Alg. 5 on B configurations at once; returns the makespans (and with `record`, every node's start and
    finish, B x (N+1), for `critical_weights`).

    Chain slots are laid out C x B so the per-step reductions run along contiguous rows. The selected node
    is found through its priority: among the slots with the minimal EST the smallest priority wins, and
    priorities are unique per configuration, so `by_prio` maps it back to the node. Index tables are
    int32 and flat (node index + row offset) to keep the working set small."""
    B, N1 = R.T.shape
    N = N1 - 1
    D = R.succ.shape[2]
    i32 = np.int32
    rows = np.arange(B, dtype=i32)
    row_n = rows * i32(N1)
    row_v = rows * i32(V + 1)
    ready = np.zeros(B * N1)
    npred = R.npred.astype(i32).reshape(-1)
    T_f = R.T.reshape(-1)
    cls_f = (R.cls + row_v[:, None]).astype(i32).reshape(-1)  # flat index into class availability
    prio_f = R.prio.reshape(-1)
    by_prio = np.zeros((B, N1), dtype=i32)
    np.put_along_axis(by_prio, R.prio[:, :N], (np.arange(N)[None, :] + row_n[:, None]).astype(i32), axis=1)
    by_prio_f = by_prio.reshape(-1)
    succ_f = (R.succ + row_n[:, None, None]).astype(i32).reshape(B * N1, D)  # successor flat indices
    chain_f = (R.chain * B + rows[:, None]).astype(i32).reshape(-1)  # flat slot index of each node
    nxt_f = (R.nxt + row_n[:, None]).astype(i32).reshape(-1)
    # Availability only grows and every time is >= 0, so max(avail, f * overlap) updates exactly the
    # classes that share a device with the selected node (f * 0 = 0 never wins, f * 1 = f).
    over_f = overlap.reshape(B * (V + 1), V + 1).astype(np.float64)
    hidx = np.ascontiguousarray((R.heads + row_n[:, None]).T, dtype=i32)  # C x B flat node indices
    head_rt = np.where(npred[hidx] == 0, 0.0, _INF)
    head_cls = cls_f[hidx]
    head_pr = prio_f[hidx]
    avail = np.zeros((B, V + 1))
    avail_f = avail.reshape(-1)
    head_rt_f, head_cls_f, head_pr_f = (x.reshape(-1) for x in (head_rt, head_cls, head_pr))
    makespan = np.zeros(B)
    start_f = np.zeros(B * N1) if record else None
    finish_f = np.zeros(B * N1) if record else None
    for _ in range(N):
        est = np.maximum(head_rt, avail_f.take(head_cls))
        m = est.min(axis=0)
        pmin = head_pr.min(axis=0, where=est == m, initial=_BIG)
        vf = by_prio_f.take(pmin + row_n)
        jf = chain_f.take(vf)
        f = m + T_f.take(vf)
        np.maximum(makespan, f, out=makespan)
        if record:
            start_f[vf] = m
            finish_f[vf] = f
        np.maximum(avail, over_f.take(cls_f.take(vf), axis=0) * f[:, None], out=avail)
        Sf = succ_f.take(vf, axis=0)
        ready[Sf] = np.maximum(ready.take(Sf), f[:, None])
        left = npred.take(Sf) - 1
        npred[Sf] = left
        newly = np.nonzero(left == 0)
        if len(newly[0]):
            wf = Sf[newly]
            head_rt_f[chain_f.take(wf)] = ready.take(wf)
        wf = nxt_f.take(vf)
        head_rt_f[jf] = np.where(npred.take(wf) == 0, ready.take(wf), _INF)
        head_cls_f[jf] = cls_f.take(wf)
        head_pr_f[jf] = prio_f.take(wf)
    if record:
        return makespan, start_f.reshape(B, N1), finish_f.reshape(B, N1)
    return makespan


def prepare_graph(s: Superset) -> _Graph:
    """Successor table, height levels, rank groups, a chain cover and order-key ranks of a superset."""
    n = s.n
    succs: list[list[int]] = [[] for _ in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in s.edges:
        succs[a].append(b)
        preds[b].append(a)
    D = max(1, max((len(x) for x in succs), default=1))
    succ = np.full((n + 1, D), n, dtype=np.int64)
    for i, x in enumerate(succs):
        succ[i, : len(x)] = x
    npred = np.array([len(x) for x in preds] + [1 << 40], dtype=np.int64)
    topo = topological_order(n, succs, [len(p) for p in preds])
    height = [0] * n
    for v in reversed(topo):
        height[v] = 1 + max((height[w] for w in succs[v]), default=-1)
    by_height: dict[int, list[int]] = {}
    for v in range(n):
        by_height.setdefault(height[v], []).append(v)
    levels = tuple(np.array(by_height[h], dtype=np.int64) for h in sorted(by_height))
    members: dict = {}
    for i, grp in enumerate(s.groups):
        members.setdefault(grp, []).append(i)
    groups = tuple(np.array(m, dtype=np.int64) for m in members.values() if len(m) > 1)
    chain, nxt, heads = _chain_cover(n, topo, succs, preds)
    keys = sorted(set(s.key) | {k for k in s.reshard_key if k is not None})
    rank_of = {k: i for i, k in enumerate(keys)}
    pos_comm = np.array([rank_of[k] for k in s.key], dtype=np.int64)
    pos_reshard = np.array([rank_of[k] if k is not None else rank_of[s.key[i]] for i, k in enumerate(s.reshard_key)],
                           dtype=np.int64)
    op_cols: dict = {}
    transfer_cols: dict = {}
    for i in range(n):
        if s.kind[i] == OPERATOR:
            op_cols.setdefault((s.vertex[i], s.phase[i]), []).append(i)
        else:
            transfer_cols.setdefault((s.kind[i], s.src[i], s.vertex[i], s.nbytes[i], s.model[i]), []).append(i)
    return _Graph(
        n=n,
        succ=succ,
        npred=npred,
        levels=levels,
        groups=groups,
        chain=chain,
        next_in_chain=nxt,
        heads=heads,
        is_op=np.array([k == OPERATOR for k in s.kind]),
        pos_comm=pos_comm,
        pos_reshard=pos_reshard,
        op_cols={k: np.array(v) for k, v in op_cols.items()},
        transfer_cols={k: np.array(v) for k, v in transfer_cols.items()},
        vertex=np.array(s.vertex, dtype=np.int64),
        preds=tuple(tuple(p) for p in preds),
    )


def _chain_cover(n: int, topo: list[int], succs, preds):
    """Greedy cover of the DAG by chains (each node's chain successor is one of its descendants).

    Only nodes heading their chain can be ready, so the scheduler scans one slot per chain."""
    reach = [0] * n  # bitset of descendants
    for v in reversed(topo):
        r = 0
        for w in succs[v]:
            r |= reach[w] | (1 << w)
        reach[v] = r
    tails: list[int] = []
    chain = np.full(n + 1, -1, dtype=np.int64)
    nxt = np.full(n + 1, n, dtype=np.int64)
    heads: list[int] = []
    rank = {v: i for i, v in enumerate(topo)}
    for v in topo:
        best = -1
        direct = set(preds[v])
        for c, t in enumerate(tails):
            if t in direct and (best < 0 or tails[best] not in direct or rank[t] > rank[tails[best]]):
                best = c
        if best < 0:
            for c, t in enumerate(tails):
                if reach[t] >> v & 1 and (best < 0 or rank[t] > rank[tails[best]]):
                    best = c
        if best < 0:
            heads.append(v)
            tails.append(v)
            chain[v] = len(tails) - 1
        else:
            nxt[tails[best]] = v
            tails[best] = v
            chain[v] = best
    chain[n] = 0
    return chain, nxt, np.array(heads, dtype=np.int64)
