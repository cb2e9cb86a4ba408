"""The batched evaluator: many plans of one structural variant in one call, with numpy and a compiled scheduler.

Paper: App. A-J2c (EVALUATECACHED) and A-H (Alg. 5); docs/architecture.md, Data flow (the compact array form). Same
semantics as `compact.CompactVariant.evaluate`, vectorised across configurations:

- Plans are grouped by pattern (see `compact`); each group shares one superset graph, so all of its
  configurations have the same nodes and edges and differ only in node times, reserved devices, relays and
  tie-break keys. Groups are padded to one node count and scheduled together.
- Node times are table look-ups and the core's array forms (`transfer.comm_node_time_at` at the tier of
  `geometry.span_tier_index`; the lowering decisions `rules.publication_codes` and `pair_codes`;
  the payload `rules.publication_bytes_of`), bit-identical to the scalar path.
- Alg. 5 runs per configuration in a compiled loop (`row_scheduler.schedule_rows`) over the padded
  superset graph of its group. The ready set is kept as one slot per chain of a chain cover of the
  superset DAG: a node can be ready only when it heads its chain, so each step inspects C (chains) slots
  instead of N nodes. Devices are kept as one availability per vertex allocation ("class"); a node
  reserves the allocation of one vertex, and since availability only grows, the availability of a class is
  the maximum over its atoms, updated with the overlap relation of the plan. Selection uses the core
  tie-breakers: smallest EST, then transfers first, larger downstream rank (generation chains share the
  head's rank; `row_scheduler.downstream_ranks`), lower order key, encoded as one unique priority.
- Device memory is `residency.device_peaks`, the core's form for many configurations (the rules of
  `device_memory_arrays` once per set of operators covering a device, not once per device).
- Stage fusion (`compact`): the plans whose placement lets training vertices fuse are evaluated a second time as
  fused patterns, and each keeps the better of its two evaluations (`compact.better`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import numpy as np

from rpegc.core.ir.geometry import pairwise_overlaps, span_tier_index
from rpegc.core.ir.program import VERIFY
from rpegc.core.lower.rules import (ACTIONS, COMM, DEP, RESHARD, data_codes, is_shadow, pair_codes, pairwise_same,
                                    publication_bytes_of, publication_codes)
from rpegc.core.cost.host import cores_needed, pool_cores
from rpegc.core.cost.memory import op_memory
from rpegc.core.cost.residency import OpTerms, device_peaks
from rpegc.core.sched.list_scheduler import topological_order
from rpegc.core.sched.row_scheduler import downstream_ranks, schedule_rows
from rpegc.core.sched.score import p_eff, score, score_pen, utilization
from rpegc.core.cost.contention import (co_busy_stretch, full_hosts, host_stretches, overlap_stretches, prices_overlaps,
                                        whole_ns)
from rpegc.core.cost.transfer import comm_node_time_at, priced_node_time
from rpegc.search.compact import (DATA_COMM, FUSED_MEMBER, OPERATOR, PUBLICATION, WEIGHT_MOVES, CompactVariant,
                                  FusionGroups, Superset, kept_over)

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
    fused: tuple[FusionGroups, ...]  # per configuration, the fusions it runs (compact.Evaluation.fused)
    r_host: np.ndarray  # host-core ratio (compact.Evaluation.r_host)

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
    by_height: np.ndarray  # (N,) node indices by height, sinks first: each after its successors
    group_of: np.ndarray  # (N,) generation phase chain sharing the head's rank (its index), -1 for none
    groups: int  # number of such chains
    chain: np.ndarray  # (N+1,) chain of each node
    next_in_chain: np.ndarray  # (N+1,), dummy N after the last node of a chain
    heads: np.ndarray  # (C,) first node of each chain
    is_op: np.ndarray  # (N,) bool
    moves_weights: np.ndarray  # (N,) bool: a publication or a pair Reshard (transfer.moves_weights)
    pos_comm: np.ndarray  # (N,) order-key rank when real (PUBLICATION: as a Comm)
    pos_reshard: np.ndarray  # (N,) PUBLICATION: order-key rank as a Reshard
    sources: tuple  # what sets node times: (vertex, phase) of operators, (kind, src, dst, nbytes, model) of transfers
    source: np.ndarray  # (N,) index into `sources` of each node
    vertex: np.ndarray  # (N,) class (vertex allocation) of each node
    preds: tuple[tuple[int, ...], ...]  # per node, its predecessors in edge order (the critical-path walk)


@dataclass(frozen=True)
class Allocations:
    """The vertex allocations of B configurations (V vertices each) and the relations between them."""

    origin: np.ndarray  # B x V x 3
    extent: np.ndarray  # B x V x 3
    size: np.ndarray  # B x V devices
    held: np.ndarray  # B x V devices a vertex's nodes hold: its allocation's; a pool's, the used devices it shares
    words: np.ndarray  # B x V x words: what they hold as bitmask words (`CompactVariant.held_masks`)
    layout: np.ndarray  # B x V x 3 (P_d, P_p, P_t)
    overlap: np.ndarray  # B x V x V device overlap counts
    same: np.ndarray  # B x V x V: the same allocation
    same_layout: np.ndarray  # B x V x V: the same layout

    def rows(self, sel) -> "Allocations":
        """The configurations `sel` (an index or mask over B)."""
        return Allocations(*(getattr(self, f.name)[sel] for f in fields(self)))


@dataclass(frozen=True)
class _Sources:
    """Node times of a batch by source (B x sources), the columns named by `col`; a transfer's relay and
    Reshard flags alongside (False for operators)."""

    t: np.ndarray
    relay: np.ndarray
    as_reshard: np.ndarray
    col: dict

    def at(self, G: "_Graph", rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The index of the rows `rows` and the nodes of pattern group `G` into the source arrays (rows x nodes)."""
        cols = np.array([self.col[key] for key in G.sources], dtype=np.int64)[G.source]
        return rows[:, None], cols[None, :]


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
        # the masks as uint64 words, per vertex; one bit more than the devices: a verifier pool's (cost/host.py)
        self.words = [mask_words(d.masks, self.ndev + 1) for d in cv.dirs]
        self.devmask = [self._device_rows(w) for w in self.words]  # a pool's rows: the devices whose cores it shares
        # the vertices that hold device memory (a verifier pool does not), and each one's place among them
        self.device_vertices = [v for v, on in enumerate(cv.device_vertex) if on]
        self.device_index = {v: i for i, v in enumerate(self.device_vertices)}
        self.pool_own = [np.array([pool_cores(s, cv.host_cores, p.cluster)[0] for s in d.pools] if d.pools
                                  else (0,) * len(d), dtype=np.int64) for d in cv.dirs]  # cost/host.pool_cores
        self._memory_tables()
        self._reshard_tables: dict = {}
        self._pattern_of: dict = {}  # relations row (bytes) -> pattern: a pattern is a function of the relations
        self._kept: dict = {}  # choice -> its schedule, for the last KEEP_PLANS plans evaluated with keep

    # --- static tables ---------------------------------------------------------------------------

    def _device_rows(self, words: np.ndarray) -> np.ndarray:
        """The device masks of a directory as rows of booleans (entries x devices), from their uint64 words."""
        bits = np.unpackbits(words.astype("<u8").view(np.uint8), axis=1, bitorder="little")
        return bits[:, : self.ndev].astype(bool)

    def _memory_tables(self) -> None:
        """Per vertex, the memory terms of every directory entry (`residency.OpTerms`, by the core's calls), once
        per strategy: they do not depend on where the operator runs, and a strategy has many origins."""
        cv = self.cv
        wl = cv.program.workload
        self.mem = []
        for v, d in zip(cv.vertices, cv.dirs):
            if v.role == VERIFY:  # host processes: no device memory
                self.mem.append(OpTerms(*(np.zeros(len(d)) for _ in _TERMS)))
                continue
            m = cv.models[v.model]
            strategies = list(dict.fromkeys(d.strategies))
            terms = [OpTerms.of(op_memory(v.role, m.arch, m.kind, wl, dp=s.dp, pp=s.pp, tp=s.tp, mb=s.mb,
                                          train=wl.training(s.train) if v.role == "training" else None,
                                          opts=cv.opts), wl.s_b, cv.opts) for s in strategies]
            per_strategy = OpTerms(*(np.concatenate([getattr(e, f) for e in terms]) for f in _TERMS))
            index = {s: i for i, s in enumerate(strategies)}
            entry = np.array([index[s] for s in d.strategies], dtype=np.int64)
            self.mem.append(OpTerms(*(getattr(per_strategy, f)[entry] for f in _TERMS)))

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
        allocs = self._allocs(ch)
        result, kept = self._evaluate(ch, allocs, None, keep)
        rows = self._may_fuse(ch, allocs)
        groups = [self.cv.fusion_groups(c, *self.cv.placement(c)) for c in (tuple(ch[r].tolist()) for r in rows)]
        if len(rows):
            fused, kept_fused = self._evaluate(ch[rows], allocs.rows(rows), groups, keep)
            wins = np.array([bool(f) for f in fused.fused]) & kept_over(
                fused.feasible, fused.score_pen, result.feasible[rows], result.score_pen[rows])
            result = _merge(result, fused, rows[wins], wins)
            won = {tuple(ch[r].tolist()) for r in rows[wins]}
            kept.update((k, v) for k, v in kept_fused.items() if k in won)
        self._kept.update(kept)
        while len(self._kept) > KEEP_PLANS:  # the oldest first (dicts keep insertion order)
            del self._kept[next(iter(self._kept))]
        return result

    def _may_fuse(self, ch: np.ndarray, allocs: Allocations) -> np.ndarray:
        """The rows where some pair of `CompactVariant.fusion_pairs` is placed alike on 1F1B (their fusion groups
        are not empty)."""
        cv = self.cv
        some = np.zeros(len(ch), dtype=bool)
        if not cv.fuse:
            return np.nonzero(some)[0]
        for a, b in cv.fusion_pairs:
            some |= (allocs.same[:, a, b] & allocs.same_layout[:, a, b] & cv.pipelined[a][ch[:, a]]
                     & cv.pipelined[b][ch[:, b]])
        return np.nonzero(some)[0]

    def _evaluate(self, ch: np.ndarray, allocs: Allocations, fused: Optional[list[FusionGroups]], keep: bool):
        """The configurations `ch`, with the fusions `fused` (per row; None: apart), and their schedules when `keep`."""
        B = len(ch)
        busy = np.empty(B)
        op_time = np.empty(B)
        keys, inverse = self._patterns(ch, allocs)
        if fused is not None:
            keys, inverse = self._fused_patterns(keys, inverse, fused)
        kept: dict = {}
        parts = []
        groups = [(np.nonzero(inverse == g)[0], self._graph(self.cv.superset(key))) for g, key in enumerate(keys)]
        src = self._source_times(groups, ch, allocs)
        hosts, full = self._hosts(ch, allocs)
        overlap = self._class_overlap(allocs)
        pools = self._pools(ch)
        for rows, G in groups:
            T, cls, prio, bz, ot = self._node_arrays(G, rows, src, allocs, pools, hosts, full)
            busy[rows], op_time[rows] = bz, ot
            parts.append((rows, G, T, cls, prio))
        if prices_overlaps(self.cv.hw.overhead.co_run, self.cv.host_cores):  # one more step of the fixed point
            parts = self._overlap_priced(parts, pools, allocs, src, hosts, full, overlap, busy, op_time)
        makespan = np.empty(B)
        for bucket in _buckets(parts):
            rows, sub = _local(bucket)
            out = _run(_stack(sub, len(rows), self.V), overlap[rows], record=keep)
            makespan[rows] = out[0] if keep else out
            if keep:
                _keep(kept, ch, sub, rows, out[1], out[2], overlap)
        groups = [key[3] for key in keys]
        peak = self._memory(ch, groups, inverse)
        cv = self.cv
        m_eff = cv.hw.M_eff
        r_peak = peak.max(axis=1) / m_eff
        w = cv.program.workload
        raw = score(makespan, cv.steps, w.B, w.R, w.Lp, w.Lr)
        r_host = self._host_ratio(ch)
        return BatchResult(
            makespan=makespan,
            score=raw,
            score_pen=score_pen(raw, r_peak),
            util=utilization(busy, cv.num_devices, makespan),
            p_eff=p_eff(op_time, makespan),
            r_peak=r_peak,
            feasible=np.all(peak <= m_eff, axis=1) & (r_host <= 1.0),
            peak=peak,
            fused=tuple(groups[g] for g in inverse),
            r_host=r_host,
        ), kept

    def _host_ratio(self, ch: np.ndarray) -> np.ndarray:
        """`CompactVariant.host_ratio` of every configuration (cost/host.cores_needed on arrays: per host the devices
        any vertex uses, plus on the first node the largest pool's own cores; the busiest host's over a host's
        cores)."""
        cv, c = self.cv, self.cluster
        if cv.host_cores is None:
            return np.zeros(len(ch))
        pools = np.zeros(len(ch), dtype=np.int64)
        for v, on in enumerate(cv.device_vertex):
            if not on:
                pools = np.maximum(pools, self.pool_own[v][ch[:, v]])
        per_host = self._used_devices(ch).reshape(len(ch), c.racks * c.nodes, c.gpus).sum(axis=2)
        return cores_needed(per_host, pools) / cv.host_cores

    def _used_devices(self, ch: np.ndarray) -> np.ndarray:
        """`CompactVariant.used_mask` of every configuration, as rows of booleans (B x devices)."""
        used = np.zeros((len(ch), self.ndev), dtype=bool)
        for v, on in enumerate(self.cv.device_vertex):
            if on:
                used |= self.devmask[v][ch[:, v]]
        return used

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
        words, held = self._held(ch, size)
        return Allocations(origin=origin, extent=extent, size=size, held=held, words=words, layout=layout,
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

    def _fused_patterns(self, keys: list, inverse: np.ndarray, fused: list[FusionGroups]):
        """The patterns of rows whose plain pattern is keys[inverse[r]] run with the fusions fused[r] (those the
        pattern allows: `CompactVariant.fused_pattern`), grouped."""
        out: list = []
        index: dict = {}
        combined = np.empty(len(inverse), dtype=np.int64)
        for r, (g, groups) in enumerate(zip(inverse, fused)):
            key = self.cv.fused_pattern(keys[g], groups)
            combined[r] = index.setdefault(key, len(out))
            if combined[r] == len(out):
                out.append(key)
        return out, combined

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
            relay = data_codes(allocs.same[:, u, v]) == _DEP
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

    def _source_times(self, groups, ch: np.ndarray, allocs: Allocations) -> "_Sources":
        """The time of every node source (operator (vertex, phase), transfer spec) of the batch's groups, per
        configuration: a source is computed once however many groups share it (a transfer spec only on the
        rows of the groups that have it; elsewhere its columns are zero and never read)."""
        users: dict = {}
        for rows, G in groups:
            for key in G.sources:
                users.setdefault(key, []).append(rows)
        B = len(ch)
        col = {key: k for k, key in enumerate(users)}
        t = np.zeros((B, len(col)))
        relay = np.zeros((B, len(col)), dtype=bool)
        as_resh = np.zeros((B, len(col)), dtype=bool)
        cv = self.cv
        for key, k in col.items():
            if key[0] == "relay":  # a fused member after the first: its fusion's first member runs it
                relay[:, k] = True
                continue
            sel = np.concatenate(users[key])
            if key[0] == "fused":  # a fusion's first member: the fusion's time on the rows of the groups fusing it
                t[sel, k] = self._fused_times(key[1], ch[sel])
                continue
            if len(key) == 2:  # an operator: (vertex, phase), phase 0 the whole op
                v, q = key
                t[:, k] = cv.t_whole[v][ch[:, v]] if q == 0 else cv.t_phase[v][ch[:, v], q - 1]
                continue
            if len(sel) == B:
                t[:, k], relay[:, k], as_resh[:, k] = self._transfer(allocs, ch, key)
            else:
                t[sel, k], relay[sel, k], as_resh[sel, k] = self._transfer(allocs.rows(sel), ch[sel], key)
        return _Sources(t, relay, as_resh, col)

    def _hosts(self, ch: np.ndarray, allocs: Allocations) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """Per configuration, each vertex's host (B x V: its allocation's first device's; a pool's the first node's)
        and whether the plan's processes take all of each host's cores (B x hosts: `CompactVariant.full_hosts`);
        (None, None) where the profile prices both conditions alike (no contention, one round trip: a GPU profile's)."""
        cv = self.cv
        oh = cv.hw.overhead
        if not oh.contention and oh.round_trip(True) == oh.round_trip(False):
            return None, None
        c = self.cluster
        hosts = self._vertex_hosts(allocs)
        used = self._used_devices(ch)
        pool = np.zeros(len(ch), dtype=np.int64)  # cost/host.pool_taken_cores: a pool's rows are the devices it shares
        for v, on in enumerate(cv.device_vertex):
            if not on:
                pool = np.maximum(pool, self.pool_own[v][ch[:, v]] + (self.devmask[v][ch[:, v]] & ~used).sum(axis=1))
        per_host = used.reshape(len(ch), c.racks * c.nodes, c.gpus).sum(axis=2)
        return hosts, full_hosts(per_host, pool, cv.host_cores)

    def _pools(self, ch: np.ndarray) -> np.ndarray:
        """Each configuration's pool processes per vertex (B x V; 0 for a device vertex)."""
        return np.stack([np.asarray(d.pools, dtype=np.int64)[ch[:, v]] if d.pools else np.zeros(len(ch), np.int64)
                         for v, d in enumerate(self.cv.dirs)], axis=1)

    def _overlap_priced(self, parts, pools: np.ndarray, allocs: Allocations, src: "_Sources", hosts, full, overlap,
                        busy, op_time):
        """`parts` (rows, G, T, cls, prio) with every device operator's time priced with the cores that their first
        schedule computes beside it (`CompactVariant._overlap_factors`; `pools`: `_pools`); `busy` and `op_time`
        rewritten."""
        out = []
        vertex_hosts = self._vertex_hosts(allocs)
        device_vertex = np.asarray(self.cv.device_vertex)
        for bucket in _buckets(parts):
            rows, sub = _local(bucket)
            _, start, finish = _run(_stack(sub, len(rows), self.V), overlap[rows], record=True)
            for (r, G, *_), (local, *_) in zip(bucket, sub):
                relay = src.relay[src.at(G, r)]
                on_device = device_vertex[G.vertex]
                cores = np.where(on_device, allocs.extent[r][:, G.vertex, 2], pools[r][:, G.vertex])
                factors = np.ones((len(r), G.n))
                overlap_stretches(whole_ns(start[local, :G.n]), whole_ns(finish[local, :G.n]),
                                  vertex_hosts[r][:, G.vertex], cores, G.is_op & ~relay,
                                  np.repeat([G.is_op & on_device], len(r), axis=0), self.cv.host_cores,
                                  self.cv.hw.overhead.co_busy, self.cv.hw.overhead.co_run, factors)
                T, cls, prio, busy[r], op_time[r] = self._node_arrays(G, r, src, allocs, pools, hosts, full, factors)
                out.append((r, G, T, cls, prio))
        return out

    def _vertex_hosts(self, allocs: Allocations) -> np.ndarray:
        """Each vertex's host per configuration (B x V): its allocation's first device's; a pool's the first node's."""
        c = self.cluster
        return np.where(self.cv.device_vertex, allocs.origin[:, :, 0] * c.nodes + allocs.origin[:, :, 1], 0)

    def _priced(self, G: _Graph, runs: np.ndarray, relay: np.ndarray, extent: np.ndarray, size: np.ndarray,
                pools: np.ndarray, hosts_v: Optional[np.ndarray], full: Optional[np.ndarray],
                factors: Optional[np.ndarray] = None) -> np.ndarray:
        """`CompactVariant._priced` of one pattern group's rows: what each node runs for (`runs`, B x N) as the
        schedule takes it (the rows' allocations' `extent`, B x V x 3, and `size`, their `pools`, `hosts_v`: B x V;
        `full`: B x hosts; `factors`: B x N, each node's factor of the cores computing beside it, None: its siblings'
        alone)."""
        cv = self.cv
        oh = cv.hw.overhead
        device_op = G.is_op & np.asarray(cv.device_vertex)[G.vertex]
        stretched = runs
        if factors is not None:
            stretched = np.where(device_op, runs * factors, runs)
        elif oh.co_busy:
            busy = co_busy_stretch(extent[:, :, 2], cv.host_cores, oh.co_busy)  # per vertex, then per node
            stretched = np.where(device_op, runs * busy[:, G.vertex], runs)
        if full is None:  # no host's condition changes a price (`_hosts`)
            return np.where(relay, 0.0, priced_node_time(stretched, cv.hw, transfer=~G.is_op, weights=G.moves_weights))
        hosts = hosts_v[:, G.vertex]
        if oh.contention:  # the operators of a full host, a device's and a pool's (`annotate.computing_cores`)
            cores = np.where(device_op, size[:, G.vertex], pools[:, G.vertex])
            core_s = np.where(G.is_op & ~relay, runs * cores, 0.0)
            k = host_stretches(hosts, core_s, ~relay, full, oh.contention)
            stretched = np.where(G.is_op, stretched * np.take_along_axis(k, hosts, axis=1), stretched)
        t = priced_node_time(stretched, cv.hw, transfer=~G.is_op, full=np.take_along_axis(full, hosts, axis=1),
                             weights=G.moves_weights)
        return np.where(relay, 0.0, t)

    def _node_arrays(self, G: _Graph, rows: np.ndarray, src: "_Sources", allocs_all: Allocations, pools: np.ndarray,
                     hosts: Optional[np.ndarray], full: Optional[np.ndarray], factors: Optional[np.ndarray] = None):
        """Times, reserved classes and tie-break priorities of one pattern group, the batch's `rows` (plus busy
        and op time), from the batch's source times, pools (`_pools`) and hosts (`_hosts`); `factors`: `_priced`'s."""
        B, N, V = len(rows), G.n, self.V
        at = src.at(G, rows)
        relay = src.relay[at]
        conditions = (hosts[rows], full[rows]) if full is not None else (None, None)
        T = self._priced(G, src.t[at], relay, allocs_all.extent[rows], allocs_all.size[rows], pools[rows], *conditions,
                         factors)
        pos = np.where(src.as_reshard[at], G.pos_reshard, G.pos_comm)
        pos[relay] = -1
        cls = np.where(relay, V, G.vertex)
        # Downstream ranks (Def. A.13), then generation chains take the head's rank.
        rank = np.empty((B, N))
        downstream_ranks(T, G.succ, G.by_height, G.group_of, G.groups, rank)
        order = np.lexsort((pos, -rank, np.broadcast_to(G.is_op, (B, N))), axis=-1)  # transfers first
        prio = np.empty((B, N), dtype=np.int64)
        np.put_along_axis(prio, order, np.arange(N)[None, :], axis=1)
        sizes = np.append(allocs_all.held[rows], np.zeros((B, 1), dtype=np.int64), axis=1)
        busy = (T * np.take_along_axis(sizes, cls, axis=1)).sum(axis=1)
        op_time = T[:, G.is_op].sum(axis=1)
        return T, cls, prio, busy, op_time

    def _fused_times(self, group: tuple[int, ...], ch: np.ndarray) -> np.ndarray:
        """`CompactVariant.fused_time` of `group` on every row of `ch` (once per distinct placement of its members)."""
        entries, inverse = np.unique(ch[:, list(group)], axis=0, return_inverse=True)
        times = np.empty(len(entries))
        for i, row in enumerate(entries):
            choice = [0] * self.V
            for v, c in zip(group, row):
                choice[v] = int(c)
            times[i] = self.cv.fused_time(group, tuple(choice))
        return times[inverse.reshape(-1)]

    def _held(self, ch: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`CompactVariant.held_masks` of every configuration as words (B x V x words), and how many devices each
        vertex holds (B x V: a device vertex its allocation's size, a pool the used devices whose cores it shares)."""
        V = self.V
        words = np.stack([self.words[v][ch[:, v]] for v in range(V)], axis=1)
        held = size.copy()
        pools = [v for v, on in enumerate(self.cv.device_vertex) if not on]
        if pools:
            used = np.bitwise_or.reduce(words[:, [v for v in range(V) if v not in pools], :], axis=1)
            keep = used | mask_words([1 << self.ndev], self.ndev + 1)[0]
            for v in pools:
                words[:, v, :] &= keep
                held[:, v] = self._device_rows(words[:, v, :]).sum(axis=1)
        return words, held

    @staticmethod
    def _class_overlap(allocs: Allocations) -> np.ndarray:
        """B x (V+1) x (V+1): vertices whose held sets meet (a device of both allocations; the pools' resource, or a
        device whose core a pool shares); class V (relays) reserves nothing."""
        B, V = allocs.size.shape
        words = allocs.words
        out = np.zeros((B, V + 1, V + 1), dtype=bool)
        out[:, :V, :V] = np.any(words[:, :, None, :] & words[:, None, :, :], axis=3)
        return out

    # --- device memory -------------------------------------------------------------------------------

    def _memory(self, ch: np.ndarray, groups: list[FusionGroups], inverse: np.ndarray) -> np.ndarray:
        """`residency.device_peaks` of every configuration: peak per device (B x devices); row r runs the fusions
        groups[inverse[r]] (once per distinct set of fusions)."""
        cv = self.cv
        peak = np.empty((len(ch), self.ndev))
        for fused in dict.fromkeys(groups):
            rows = np.nonzero(np.array([groups[g] == fused for g in inverse], dtype=bool))[0]
            sub = ch[rows]
            on, at = self.device_vertices, self.device_index
            masks = tuple(self.devmask[v][sub[:, v]] for v in on)
            terms = tuple(OpTerms(*(getattr(self.mem[v], f)[sub[:, v]] for f in _TERMS)) for v in on)
            peak[rows] = device_peaks(tuple(cv.vertices[v].role for v in on), tuple(cv.vertices[v].model for v in on),
                                      masks, terms, cv.models, cv.tau,
                                      tuple(tuple(at[v] for v in g) for g in fused))
        return peak


def _keep(kept: dict, ch, sub, rows, start, finish, overlap) -> None:
    """Each configuration's schedule of one run of `_run`, by its choice."""
    for local, G, T, cls, _ in sub:
        for i, k in enumerate(local):
            r = rows[k]
            kept[tuple(ch[r].tolist())] = (G, T[i], cls[i], start[k], finish[k], overlap[r])


def _merge(apart: BatchResult, fused: BatchResult, rows: np.ndarray, wins: np.ndarray) -> BatchResult:
    """`apart` with the rows `rows` taken from `fused` (its rows where `wins`)."""
    out = {}
    for f in fields(BatchResult):
        if f.name == "fused":
            continue
        column = getattr(apart, f.name).copy()
        column[rows] = getattr(fused, f.name)[wins]
        out[f.name] = column
    runs = list(apart.fused)
    for r, groups in zip(rows, (g for g, w in zip(fused.fused, wins) if w)):
        runs[r] = groups
    return BatchResult(**out, fused=tuple(runs))


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


# A run's fixed cost (stacking the tables, the call) is about that of 30 rows of its steps: ~0.5 ms, and a row costs
# ~0.07 us per node in `row_scheduler.schedule_rows` (64-GPU workload).
STEP_ROWS = 30


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


def _local(bucket):
    """The batch's rows of a bucket of pattern groups, and the groups with their rows numbered within it."""
    rows = np.concatenate([p[0] for p in bucket])
    sub, k = [], 0
    for r, G, T, cls, prio in bucket:
        sub.append((np.arange(k, k + len(r)), G, T, cls, prio))
        k += len(r)
    return rows, sub


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
    out.npred[:, N] = 1 << 30  # never reaches 0: the dummy never becomes ready
    return out


def _run(R: _Rows, overlap: np.ndarray, record: bool = False):
    """Alg. 5 on B configurations (`row_scheduler.schedule_rows`); returns the makespans (and with `record`,
    every node's start and finish, B x (N+1), for `critical_weights`)."""
    B, N1 = R.T.shape
    makespan = np.empty(B)
    shape = (B, N1) if record else (0, 0)
    start, finish = np.zeros(shape), np.zeros(shape)
    schedule_rows(R.T, R.cls, R.prio, R.succ, R.npred, R.chain, R.nxt, R.heads, overlap, start, finish, makespan)
    if record:
        return makespan, start, finish
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
    by_height = np.array(sorted(range(n), key=lambda v: height[v]), dtype=np.int64)
    members: dict = {}
    for i, grp in enumerate(s.groups):
        members.setdefault(grp, []).append(i)
    group_of = np.full(n, -1, dtype=np.int64)
    chains_of_rank = [m for m in members.values() if len(m) > 1]
    for g, m in enumerate(chains_of_rank):
        group_of[m] = g
    chain, nxt, heads = _chain_cover(n, topo, succs, preds)
    keys = sorted(set(s.key) | {k for k in s.reshard_key if k is not None})
    rank_of = {k: i for i, k in enumerate(keys)}
    pos_comm = np.array([rank_of[k] for k in s.key], dtype=np.int64)
    pos_reshard = np.array([rank_of[k] if k is not None else rank_of[s.key[i]] for i, k in enumerate(s.reshard_key)],
                           dtype=np.int64)
    index: dict = {}
    source = np.array([index.setdefault(_source_key(s, i), len(index)) for i in range(n)], dtype=np.int64)
    is_op = np.array([k == OPERATOR for k in s.kind], dtype=bool)
    return _Graph(
        n=n,
        succ=succ,
        npred=npred,
        by_height=by_height,
        group_of=group_of,
        groups=len(chains_of_rank),
        chain=chain,
        next_in_chain=nxt,
        heads=heads,
        is_op=is_op,
        moves_weights=np.array([k in WEIGHT_MOVES for k in s.kind], dtype=bool),
        pos_comm=pos_comm,
        pos_reshard=pos_reshard,
        sources=tuple(index),
        source=source,
        vertex=np.array(s.vertex, dtype=np.int64),
        preds=tuple(tuple(p) for p in preds),
    )


def _source_key(s: Superset, i: int) -> tuple:
    """What sets node i's time: ("fused", vertices) for a fusion's first member, ("relay",) for its other members,
    (vertex, phase) for an operator, (kind, src, dst, nbytes, model) for a transfer."""
    if s.kind[i] == OPERATOR:
        return ("fused", s.fusion[i]) if s.fusion[i] is not None else (s.vertex[i], s.phase[i])
    if s.kind[i] == FUSED_MEMBER:
        return ("relay",)
    return (s.kind[i], s.src[i], s.vertex[i], s.nbytes[i], s.model[i])


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
