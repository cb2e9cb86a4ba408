"""The batched evaluator: many plans of one structural variant in one call, with numpy.

Paper: App. A-J2c (EVALUATECACHED) and A-H (Alg. 5); DESIGN.md Sec. 3 (the compact array form). Same
semantics as `compact.CompactVariant.evaluate`, vectorised across configurations:

- Plans are grouped by pattern (see `compact`); each group shares one superset graph, so all of its
  configurations have the same nodes and edges and differ only in node times, reserved devices, relays and
  tie-break keys.
- Node times are table look-ups and vectorised copies of the core formulas (`transfer.comm_time` with the
  tier of `collectives.span_tier`, `lowering_rules.publication_bytes` as exact integer rounding), written
  to give bit-identical results.
- Alg. 5 runs on all configurations at once. Each step selects one node per configuration, so every
  configuration finishes after exactly N steps. The ready set is kept as one slot per chain of a chain
  cover of the superset DAG: a node can be ready only when it heads its chain, so each step inspects
  C (chains) slots instead of N nodes. Devices are kept as one availability per vertex allocation
  ("class"); a node reserves the allocation of one vertex, and since availability only grows, the
  availability of a class is the maximum over its atoms, updated with the overlap relation of the plans.
  Selection uses the core tie-breakers: smallest EST, then transfers first, larger downstream rank
  (generation chains share the head's rank), lower order key.
- Device memory is `residency.device_memory` vectorised over configurations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rpegc.core.memory import FROZEN, NONE, SHADOW, TRAINING, copy_bytes, training_state_bytes, transient_bytes
from rpegc.core.memory import op_memory
from rpegc.core.score import p_eff, score, score_pen, utilization
from rpegc.search.compact import DC, OP, PC, PR, CompactVariant, Superset

_INF = np.inf
_BIG = np.iinfo(np.int64).max // 4


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
    pos_comm: np.ndarray  # (N,) order-key rank when real (PC: as a Comm)
    pos_reshard: np.ndarray  # (N,) PC: order-key rank as a Reshard
    op_cols: dict  # (vertex, phase) -> node columns
    transfer_cols: dict  # (kind, src, dst, nbytes, model) -> node columns
    vertex: np.ndarray  # (N,) class (vertex allocation) of each node


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
        self._memory_tables()
        self._reshard_tables: dict = {}

    # --- static tables ---------------------------------------------------------------------------

    def _device_rows(self, d) -> np.ndarray:
        rows = np.zeros((len(d), self.ndev), dtype=bool)
        for i, m in enumerate(d.masks):
            bits = np.frombuffer(m.to_bytes((self.ndev + 7) // 8, "little"), dtype=np.uint8)
            rows[i] = np.unpackbits(bits, bitorder="little")[: self.ndev].astype(bool)
        return rows

    def _memory_tables(self) -> None:
        """Per candidate the scalars of `residency.device_memory`, computed by the same core calls."""
        cv = self.cv
        wl = cv.program.workload
        self.mem = []
        for v, d in zip(cv.vertices, cv.dirs):
            m = cv.models[v.model]
            ts, cp, a_no, a_copy = (np.empty(len(d)) for _ in range(4))
            for i, s in enumerate(d.strategies):
                mem = op_memory(v.role, m.arch, m.kind, wl, dp=s.dp, pp=s.pp, tp=s.tp, mb=s.mb, opts=cv.opts)
                ts[i] = training_state_bytes(mem.W_shard, s.dp)
                cp[i] = copy_bytes(mem.W_shard, wl.s_b)
                both = transient_bytes(mem, np.array([False, True]), cv.opts)
                a_no[i], a_copy[i] = both[0], both[1]
            self.mem.append((ts, cp, a_no, a_copy))

    def _reshard_table(self, model: str, v: int) -> np.ndarray:
        key = (model, v)
        t = self._reshard_tables.get(key)
        if t is None:
            t = np.array([self.cv.reshard_time(model, a) for a in self.cv.dirs[v].allocs])
            self._reshard_tables[key] = t
        return t

    # --- evaluation ----------------------------------------------------------------------------------

    def evaluate(self, choices) -> BatchResult:
        ch = np.asarray(choices, dtype=np.int64).reshape(-1, self.V)
        B = len(ch)
        A = self._allocs(ch)
        makespan = np.empty(B)
        busy = np.empty(B)
        op_time = np.empty(B)
        keys, inverse = self._patterns(ch, A)
        for g, key in enumerate(keys):
            rows = np.nonzero(inverse == g)[0]
            sub = {k: x[rows] for k, x in A.items()}
            ms, bz, ot = self._schedule(self.cv.superset(key), ch[rows], sub)
            makespan[rows], busy[rows], op_time[rows] = ms, bz, ot
        peak = self._memory(ch, A)
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

    def _allocs(self, ch: np.ndarray) -> dict:
        V = self.V
        A = {
            "org": np.stack([self.origin[v][ch[:, v]] for v in range(V)], axis=1),  # B x V x 3
            "ext": np.stack([self.extent[v][ch[:, v]] for v in range(V)], axis=1),
            "size": np.stack([self.size[v][ch[:, v]] for v in range(V)], axis=1),  # B x V
            "lay": np.stack([self.layout[v][ch[:, v]] for v in range(V)], axis=1),
        }
        org, ext = A["org"], A["ext"]
        lo = np.maximum(org[:, :, None, :], org[:, None, :, :])
        hi = np.minimum((org + ext)[:, :, None, :], (org + ext)[:, None, :, :])
        A["ovl"] = np.prod(np.maximum(0, hi - lo), axis=3)  # B x V x V device overlap counts
        A["same"] = np.all(org[:, :, None, :] == org[:, None, :, :], axis=3) & np.all(
            ext[:, :, None, :] == ext[:, None, :, :], axis=3)
        A["lay_eq"] = np.all(A["lay"][:, :, None, :] == A["lay"][:, None, :, :], axis=3)
        return A

    # --- patterns ------------------------------------------------------------------------------------

    def _patterns(self, ch: np.ndarray, A: dict):
        """Pattern of every configuration (vectorised `CompactVariant.pattern`), grouped."""
        cv = self.cv
        B = len(ch)
        cols: list[np.ndarray] = []
        phase = [A["ovl"][:, u, v] == 0 for u, v in cv.phase_pairs]
        cols += phase
        reuse_cols: list[list[np.ndarray]] = []
        for slot in cv.pub_slots:
            u = slot.publisher
            act = [self._pub_action(A, u, c) for c in slot.consumers]
            trainable = slot.model in cv.trainable
            per = []
            for j, c in enumerate(slot.consumers):
                found = np.full(B, -1)
                for i in range(j - 1, -1, -1):  # the first match wins: scan backwards, keep overwriting
                    c2 = slot.consumers[i]
                    same = A["same"][:, c2, c]
                    hit = ((act[j] == 0) & (act[i] == 0) & same) | (
                        trainable & (act[j] == 2) & (act[i] == 2) & same & A["lay_eq"][:, c2, c])
                    found = np.where(hit, i, found)
                per.append(found)
            reuse_cols.append(per)
            cols += per
        phase_rows = np.stack(phase, axis=1) if phase else np.zeros((B, 0), dtype=bool)
        present_cols = []
        uniq_phase, phase_inv = np.unique(phase_rows, axis=0, return_inverse=True)
        phase_inv = phase_inv.reshape(-1)
        implied = np.zeros((B, len(cv.stage3)), dtype=bool)
        for k, row in enumerate(uniq_phase):
            bits = tuple(bool(x) for x in row)
            imp = cv._implied.get(bits)
            if imp is None:
                from rpegc.search.compact import implied_pairs

                imp = cv._implied[bits] = implied_pairs(cv, bits)
            implied[phase_inv == k] = imp
        for k, (m, u, v, _) in enumerate(cv.stage3):
            present_cols.append(implied[:, k] | (self._pair_action(A, cv.tau.get(m, 0), u, v) != 0))
        cols += present_cols
        table = np.stack([c.astype(np.int64) for c in cols], axis=1) if cols else np.zeros((B, 0), dtype=np.int64)
        uniq, inverse = np.unique(table, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        keys = []
        P, R = len(phase), sum(len(s.consumers) for s in cv.pub_slots)
        for row in uniq:
            ph = tuple(bool(x) for x in row[:P])
            reuse, k = [], P
            for s in cv.pub_slots:
                reuse.append(tuple(None if x < 0 else int(x) for x in row[k:k + len(s.consumers)]))
                k += len(s.consumers)
            present = tuple(bool(x) for x in row[P + R:])
            keys.append((ph, tuple(reuse), present))
        return keys, inverse

    @staticmethod
    def _pub_action(A: dict, u: int, v: int) -> np.ndarray:
        """publication_action: 0 COMM (other devices), 1 DEP (same layout), 2 RESHARD."""
        same = A["same"][:, u, v]
        return np.where(~same, 0, np.where(A["lay_eq"][:, u, v], 1, 2))

    @staticmethod
    def _pair_action(A: dict, tau: int, u: int, v: int) -> np.ndarray:
        """pair_action: 0 NONE, 1 DEP, 2 RESHARD."""
        same = A["same"][:, u, v]
        shadow = (tau > 0) & (A["ovl"][:, u, v] == 0)
        return np.where(shadow, 0, np.where(same, np.where(A["lay_eq"][:, u, v], 0, 2), 1))

    # --- node times ----------------------------------------------------------------------------------

    def _graph(self, s: Superset) -> _Graph:
        g = self._graphs.get(s.pattern)
        if g is None:
            g = self._graphs[s.pattern] = prepare_graph(s)
        return g

    def _span_tier(self, A: dict, u: int, v: int) -> np.ndarray:
        """collectives.span_tier of sigma(u) ∪ sigma(v) as TIERS indices."""
        org, ext = A["org"], A["ext"]
        rack = (org[:, u, 0] != org[:, v, 0]) | (ext[:, u, 0] > 1) | (ext[:, v, 0] > 1)
        node = (org[:, u, 1] != org[:, v, 1]) | (ext[:, u, 1] > 1) | (ext[:, v, 1] > 1)
        return np.where(rack, 2, np.where(node, 1, 0))

    def _comm_time(self, A: dict, payload, u: int, v: int) -> np.ndarray:
        """transfer.comm_node_time, elementwise: alpha + payload / min(n_u, n_v) * beta."""
        tier = self._span_tier(A, u, v)
        alpha = np.asarray(self.cv.hw.alpha_p2p)[tier]
        beta = np.asarray(self.cv.hw.beta_p2p)[tier]
        n = np.minimum(A["size"][:, u], A["size"][:, v])
        return alpha + payload / n * beta

    def _transfer(self, A: dict, ch: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, relay, as_reshard) of one kind of Comm/Reshard superset node, per configuration."""
        kind, u, v, nbytes, model = spec
        B = len(ch)
        no = np.zeros(B, dtype=bool)
        if kind == DC:
            relay = A["same"][:, u, v]
            return np.where(relay, 0.0, self._comm_time(A, nbytes, u, v)), relay, no
        if kind == PC:
            act = self._pub_action(A, u, v)
            wb = self.cv.weight_bytes(model)
            n_max = np.maximum(A["size"][:, u], A["size"][:, v])
            payload = _round_ratio(wb * (n_max - A["ovl"][:, u, v]), n_max)
            comm = self._comm_time(A, payload, u, v)
            trainable = model in self.cv.trainable
            resh = self._reshard_table(model, v)[ch[:, v]] if trainable else np.zeros(B)
            is_resh = (act == 2) & trainable
            relay = (act == 1) | ((act == 2) & (not trainable))
            return np.where(act == 0, comm, np.where(is_resh, resh, 0.0)), relay, is_resh
        act = self._pair_action(A, self.cv.tau.get(model, 0), u, v)
        resh = self._reshard_table(model, v)[ch[:, v]]
        is_resh = act == 2
        return np.where(is_resh, resh, 0.0), ~is_resh, is_resh

    # --- the vectorised list scheduler ---------------------------------------------------------------

    def _schedule(self, s: Superset, ch: np.ndarray, A: dict):
        cv = self.cv
        G = self._graph(s)
        B, N, V = len(ch), G.n, self.V
        T = np.zeros((B, N + 1))
        relay = np.zeros((B, N), dtype=bool)
        pos = np.broadcast_to(G.pos_comm, (B, N)).copy()
        for (v, q), cols in G.op_cols.items():
            t = cv.t_whole[v][ch[:, v]] if q == 0 else cv.t_phase[v][ch[:, v], q - 1]
            T[:, cols] = t[:, None]
        for spec, cols in G.transfer_cols.items():
            t, r, as_resh = self._transfer(A, ch, spec)
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
        prio = np.empty((B, N + 1), dtype=np.int64)
        np.put_along_axis(prio[:, :N], order, np.arange(N)[None, :], axis=1)
        prio[:, N] = _BIG
        ms = _run(G, T, cls, prio, self._class_overlap(A), V)
        sizes = np.append(A["size"], np.zeros((B, 1), dtype=np.int64), axis=1)
        busy = (T[:, :N] * np.take_along_axis(sizes, cls[:, :N], axis=1)).sum(axis=1)
        op_time = T[:, :N][:, G.is_op].sum(axis=1)
        return ms, busy, op_time

    @staticmethod
    def _class_overlap(A: dict) -> np.ndarray:
        """B x (V+1) x (V+1): allocations sharing a device; class V (relays) reserves nothing."""
        B, V = A["ovl"].shape[:2]
        out = np.zeros((B, V + 1, V + 1), dtype=bool)
        out[:, :V, :V] = A["ovl"] > 0
        return out

    # --- device memory -------------------------------------------------------------------------------

    def _memory(self, ch: np.ndarray, A: dict) -> np.ndarray:
        """`residency.device_memory` for every configuration: peak per device (B x devices)."""
        cv = self.cv
        B, n = len(ch), self.ndev
        masks = [self.devmask[v][ch[:, v]] for v in range(self.V)]
        terms = [tuple(t[ch[:, v]] for t in self.mem[v]) for v in range(self.V)]
        residency: dict[str, np.ndarray] = {}
        persistent = np.zeros((B, n))
        for name in dict.fromkeys(v.model for v in cv.vertices):
            model = cv.models[name]
            tau = cv.tau.get(name, 0)
            train_state = np.zeros((B, n))
            copy_state = np.zeros((B, n))
            in_training = np.zeros((B, n), dtype=bool)
            for i, v in enumerate(cv.vertices):
                if v.model == name and v.role == "training":
                    in_training |= masks[i]
                    train_state = np.where(masks[i], np.maximum(train_state, terms[i][0][:, None]), train_state)
            res = np.where(in_training, TRAINING, NONE)
            for i, v in enumerate(cv.vertices):
                if v.model != name or v.role not in ("generation", "inference"):
                    continue
                copy_state = np.where(masks[i], np.maximum(copy_state, terms[i][1][:, None]), copy_state)
                if model.trainable:
                    if tau <= 0:
                        continue
                    allowed = ~np.any(in_training & masks[i], axis=1)
                    code = SHADOW
                else:
                    allowed = np.ones(B, dtype=bool)
                    code = FROZEN
                res = np.where(masks[i] & (res == NONE) & allowed[:, None], code, res)
            state = np.where(res == TRAINING, train_state,
                             np.where((res == SHADOW) | (res == FROZEN), copy_state, 0.0))
            residency[name] = res
            persistent = persistent + state
        transient = np.zeros((B, n))
        for i, v in enumerate(cv.vertices):
            res = residency[v.model]
            holds = (res == SHADOW) | (res == FROZEN)
            a = np.where(holds, terms[i][3][:, None], terms[i][2][:, None])
            transient = np.where(masks[i] & (a > transient), a, transient)
        return persistent + transient


def _round_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """round(Fraction(num, den)) elementwise on integers: half to even, as Python's round."""
    q, r = np.divmod(num, den)
    twice = 2 * r
    up = (twice > den) | ((twice == den) & (q % 2 == 1))
    return q + up


def _run(G: _Graph, T: np.ndarray, cls: np.ndarray, prio: np.ndarray, overlap: np.ndarray, V: int) -> np.ndarray:
    """Alg. 5 on B configurations at once; returns the makespans."""
    B, N1 = T.shape
    N = N1 - 1
    C = len(G.heads)
    rows = np.arange(B)
    row_n = rows * N1
    row_v = rows * (V + 1)
    row_c = rows * C
    ready = np.zeros((B, N1))
    npred = np.broadcast_to(G.npred, (B, N1)).copy()
    ready_f, npred_f = ready.reshape(-1), npred.reshape(-1)
    T_f, cls_f, prio_f = T.reshape(-1), cls.reshape(-1), prio.reshape(-1)
    over_f = overlap.reshape(B * (V + 1), V + 1)
    head = np.broadcast_to(G.heads, (B, C)).copy()
    hidx = head + row_n[:, None]
    head_rt = np.where(npred_f[hidx] == 0, 0.0, _INF)
    head_cls = cls_f[hidx] + row_v[:, None]  # flat index into class availability
    head_pr = prio_f[hidx]
    avail = np.zeros((B, V + 1))
    avail_f = avail.reshape(-1)
    head_f, head_rt_f, head_cls_f, head_pr_f = (x.reshape(-1) for x in (head, head_rt, head_cls, head_pr))
    makespan = np.zeros(B)
    succ, chain, nxt = G.succ, G.chain, G.next_in_chain
    for _ in range(N):
        est = np.maximum(head_rt, avail_f[head_cls])
        m = est.min(axis=1)
        j = np.where(est == m[:, None], head_pr, _BIG).argmin(axis=1)
        jf = j + row_c
        v = head_f[jf]
        vf = v + row_n
        f = m + T_f[vf]
        np.maximum(makespan, f, out=makespan)
        c = head_cls_f[jf] - row_v
        np.maximum(avail, f[:, None], out=avail, where=over_f[row_v + c])
        S = succ[v]
        Sf = S + row_n[:, None]
        ready_f[Sf] = np.maximum(ready_f[Sf], f[:, None])
        left = npred_f[Sf] - 1
        npred_f[Sf] = left
        newly = left == 0
        if newly.any():
            bi, di = np.nonzero(newly)
            w = S[bi, di]
            head_rt[bi, chain[w]] = ready_f[w + row_n[bi]]
        w = nxt[v]
        wf = w + row_n
        head_f[jf] = w
        head_rt_f[jf] = np.where(npred_f[wf] == 0, ready_f[wf], _INF)
        head_cls_f[jf] = cls_f[wf] + row_v
        head_pr_f[jf] = prio_f[wf]
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
    topo = _topological(n, succs, preds)
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
        if s.kind[i] == OP:
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
        is_op=np.array([k == OP for k in s.kind]),
        pos_comm=pos_comm,
        pos_reshard=pos_reshard,
        op_cols={k: np.array(v) for k, v in op_cols.items()},
        transfer_cols={k: np.array(v) for k, v in transfer_cols.items()},
        vertex=np.array(s.vertex, dtype=np.int64),
    )


def _topological(n: int, succs, preds) -> list[int]:
    left = [len(p) for p in preds]
    order = [v for v in range(n) if left[v] == 0]
    i = 0
    while i < len(order):
        for w in succs[order[i]]:
            left[w] -= 1
            if left[w] == 0:
                order.append(w)
        i += 1
    if len(order) != n:
        raise ValueError("superset graph has a cycle")
    return order


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
