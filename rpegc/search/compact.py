"""The compact form of a structural variant and its plain-Python reference evaluator.

Paper: App. A-J2c (Alg. 6 EVALUATECACHED: unroll, lower, schedule, score), built on App. A-F (Alg. 3),
A-G (Alg. 4), A-H (Alg. 5), A-I (Eq. 4-5) and Sec. V (cost model). docs/architecture.md, Data flow, the
one-implementation rule: every decision and number here comes from the `rpegc.core` functions the passes
use (`unroll`, `lower.rules`, `annotate.placement_time`, `transfer`, `residency.device_memory`,
`schedule.prepare_schedule/run_schedule`, `score`); only the graph bookkeeping is compact.

The compact form. The executable graph of a variant under a plan depends on the plan only through a few
discrete facts: which generation -> inference pairs are disjoint (quantile splitting), which publication
and pair Reshards reuse a Comm/Reshard that already installs the same version on the same devices (the
installed-node maps of insert-comm and insert-reshard), and whether a stage-3 pair edge that nothing else
implies is present. Those facts form the *pattern* of a plan (`CompactVariant.pattern`, a function of
which vertex allocations are equal or disjoint and which layouts agree). For each pattern one *superset*
graph is built once: every Comm/Reshard that some plan of the pattern needs is a node. Under a given plan,
a superset node that the plan does not need (a data edge between identical allocations, a publication or
pair edge that lowers to a bare precedence) is a *relay*: time 0, no reserved devices, the transfer kind
and the lowest order key. A relay only forwards its predecessors' finish time, exactly like the
precedence edge it stands for; it never changes device availability and sorts before every real node
with the same EST, so the list scheduler places the real nodes in the same order at the same times as on
the lowered graph (argument in tests/test_search_compact.py; tests/test_search_differential.py checks it
against the pass pipeline). Order keys reproduce the node order the lowering passes create (Comm and
Reshard nodes right before their consumer, in creation order), so the last tie-breaker agrees too.

Stage fusion (docs/stage-fusion.md) is a plan choice the evaluator makes exactly: where a placement lets training
vertices fuse (`fusion_groups`: fusion rules F1-F3 on pipelines, no path between them), the plan is priced fused and
apart and the better one is kept (`better`; `Evaluation.fused` says which). A fused pattern's superset is the unfused
one with each step's members made one unit, as `schedule.schedule_exec` makes them: the first member's node takes the
fusion's time and every member's predecessors, the others become relays right after it (their successors wait for
the unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Hashable, Optional, Sequence

import numpy as np

from rpegc.core.check.fusion_rules import path_between, same_stages
from rpegc.core.cost.fused import fuse_operators
from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.exec_graph import ExecNode
from rpegc.core.ir.expr import evaluate as evaluate_expr
from rpegc.core.cost.hardware import Hardware
from rpegc.core.lower.rules import (
    COMM,
    DEP,
    RESHARD,
    container_payload,
    data_action,
    data_bytes,
    disjoint,
    model_pairs,
    pair_action,
    phase_share,
    phase_shares,
    publication_action,
    publication_bytes,
    published_weights,
    weight_bytes,
)
from rpegc.core.cost.params import param_count
from rpegc.core.ir.program import VERIFY, Fuse, Placement, Plan, Pool, Program
from rpegc.core.ir.geometry import Alloc, Strategy, mask_devices
from rpegc.core.cost.contention import (co_busy_stretch, devices_per_host, full_hosts, host_of, host_stretches,
                                        overlap_stretches, prices_overlaps, whole_ns)
from rpegc.core.cost.host import cores_needed, pool_cores, pool_taken_cores
from rpegc.core.cost.residency import OpPlacement, device_memory
from rpegc.core.sched.list_scheduler import Schedule, device_sizes, prepare_schedule, run_schedule
from rpegc.core.sched.score import p_eff, score, score_pen, utilization
from rpegc.core.cost.transfer import (comm_node_time, generation_phase_time, inference_phase_time, priced_node_time,
                                      reshard_node_time)
from rpegc.core.lower.unroll import unroll
from rpegc.search.directory import VertexDirectory
from rpegc.search.space import Variant, ordered_vertices

Choice = tuple[int, ...]  # one directory index per vertex, in the variant's vertex order

# Superset node kinds: an operator, a data Comm, a publication Comm or Reshard, a pair Reshard, and a fused member
# that is not its fusion's first (always a relay: the first member's node runs the fusion).
OPERATOR, DATA_COMM, PUBLICATION, PAIR_RESHARD, FUSED_MEMBER = 0, 1, 2, 3, 4
WEIGHT_MOVES = (PUBLICATION, PAIR_RESHARD)  # the kinds that move a model's weights (transfer.moves_weights)
FusionGroups = tuple[tuple[int, ...], ...]  # vertex indices of each fusion, ascending
RELAY_KEY = (-1,)  # order key of a relay: below every real node
STRUCTURE_CACHE = 2048  # prepared scheduler structures kept per variant


@dataclass(frozen=True)
class Evaluation:
    """What EVALUATECACHED returns for one configuration (Alg. 6), plus what the report shows."""

    makespan: float
    score: float  # Eq. 4, tokens/s
    score_pen: float  # Eq. 5
    util: float  # Def. A.16 (A18)
    p_eff: float
    r_peak: float
    feasible: bool
    peak: Optional[tuple[float, ...]] = None  # per device, by flat id (the batched path leaves it out)
    fused: FusionGroups = ()  # the fusions the plan runs (vertex indices): where they paid, see `better`
    r_host: float = 0.0  # host cores the busiest host's devices (and pools) need / its cores (> 1: infeasible)

    @property
    def r_penalised(self) -> float:
        """What the search penalises (Eq. 5): the larger of the memory and the host-core ratio, so that a plan whose
        pools lack cores is steered off like one that lacks memory."""
        return max(self.r_peak, self.r_host)


def kept_over(feasible_a, pen_a, feasible_b, pen_b):
    """Whether a plan priced (feasible_a, Score_pen pen_a) is kept over the same plan priced (feasible_b, pen_b) (fused
    against apart): a memory-feasible one over an infeasible one, else the higher Score_pen (Eq. 5); a tie keeps b,
    the members apart. Elementwise on arrays (the batched path)."""
    return (feasible_a > feasible_b) | ((feasible_a == feasible_b) & (pen_a > pen_b))


def better(a: Evaluation, b: Evaluation) -> bool:
    """`kept_over` of two evaluations."""
    return bool(kept_over(a.feasible, a.score_pen, b.feasible, b.score_pen))


@dataclass(frozen=True)
class Superset:
    """One pattern's executable graph with every potential Comm/Reshard node (see module docstring)."""

    pattern: tuple
    kind: tuple[int, ...]  # OPERATOR, DATA_COMM, PUBLICATION, PAIR_RESHARD
    vertex: tuple[int, ...]  # the vertex whose allocation the node reserves (Op: its own; others: consumer)
    src: tuple[int, ...]  # DATA_COMM/PUBLICATION: source vertex; PAIR_RESHARD: the pair's first vertex; OPERATOR: -1
    phase: tuple[int, ...]  # OPERATOR: quantile phase q (1-based) or 0 for a whole operator
    fusion: tuple[Optional[tuple[int, ...]], ...]  # OPERATOR running a fusion: its vertices (None otherwise)
    role: tuple[str, ...]  # OPERATOR role ("" otherwise)
    nbytes: tuple[int, ...]  # DATA_COMM payload
    model: tuple[Optional[str], ...]  # PUBLICATION/PAIR_RESHARD: the model moved
    step: tuple[int, ...]
    key: tuple[tuple, ...]  # order key when the node is real (PUBLICATION: as a Comm)
    reshard_key: tuple[Optional[tuple], ...]  # PUBLICATION: order key when it lowers to a Reshard
    edges: tuple[tuple[int, int], ...]
    groups: tuple[Hashable, ...]
    names: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.kind)

    @property
    def is_transfer(self) -> tuple[bool, ...]:
        return tuple(k != OPERATOR for k in self.kind)


@dataclass(frozen=True)
class PubInstance:
    """One unrolled publication edge (in edge order): weights of `model` at `version` from u to v."""

    publisher: int  # vertex index of the training vertex
    consumer: int
    model: str
    version: int


@dataclass(frozen=True)
class PairInstance:
    """One stage-3 pair (u, v) of a trainable model at one step (insert-reshard visiting order)."""

    model: str
    u: int
    v: int
    step: int
    version: int  # the version a Reshard would install (v's version, else u's, else the step)
    producer: Optional[str]  # id of the training op producing that version (it precedes the Reshard)
    producer_implied: bool  # a path producer ->* v exists anyway


# Decisions of a pair instance in a pattern (besides ("pub" | "pair", index) for a reused Reshard).
ABSENT, NODE, DEP_NODE = 0, 1, 2


@dataclass
class CompactVariant:
    """A structural variant compiled for fast evaluation; build once, evaluate many plans."""

    variant: Variant
    dirs: tuple[VertexDirectory, ...]
    hw: Hardware
    opts: CostOptions
    steps: int
    split: bool = True
    fuse: bool = False  # price a plan fused too where its placement lets training vertices fuse
    _supersets: dict = field(default_factory=dict, repr=False)
    _reshard_times: dict = field(default_factory=dict, repr=False)
    _implied: dict = field(default_factory=dict, repr=False)
    _structures: dict = field(default_factory=dict, repr=False)
    _fused_times: dict = field(default_factory=dict, repr=False)
    _linked: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        p = self.program
        g = p.graph
        self.vertices = ordered_vertices(p)
        self.vindex = {v.name: i for i, v in enumerate(self.vertices)}
        if tuple(d.vertex for d in self.dirs) != tuple(v.name for v in self.vertices):
            raise ValueError("directories must follow the variant's vertex order")
        self.models = {m.name: m for m in p.models}
        self.trainable = {m.name for m in p.models if m.trainable}
        self.tau = dict(g.staleness)
        self.base = unroll(p, self.steps).exec  # the plan-independent G-bar
        self.shares = phase_shares(g)
        self.tokens = tuple(float(evaluate_expr(q.tokens, p.workload.env)) for q in g.quantiles)
        self.split_on = self.split and len(self.shares) >= 2
        roles = [v.role for v in self.vertices]
        pairs = []
        for e in g.data_edges:
            u, v = self.vindex[e.src], self.vindex[e.dst]
            if roles[u] == "generation" and roles[v] == "inference" and (u, v) not in pairs:
                pairs.append((u, v))
        self.phase_pairs = tuple(pairs) if self.split_on else ()
        self.pub_instances = self._pub_instances()
        self.pair_instances = self._pair_instances()
        self.relation_pairs = self._relation_pairs()
        self.num_devices = p.cluster.num_devices
        self.device_vertex = tuple(v.role != VERIFY for v in self.vertices)  # the others run on the host's pool
        self.host_cores = self.hw.host_cores
        self._phase_tables()
        self.fusion_pairs = self._fusion_pairs()
        self.pipelined = tuple(np.array([self._one_f_one_b(s) for s in d.strategies], dtype=bool)
                               if d.role == "training" else None for d in self.dirs)

    # --- compile-time facts ----------------------------------------------------------------------

    @property
    def program(self) -> Program:
        return self.variant.program

    def _pub_instances(self) -> tuple[PubInstance, ...]:
        p = self.program
        nodes = {n.id: n for n in self.base.nodes}
        out = []
        for e in self.base.edges:
            if e.kind == "pub":
                u, v = nodes[e.src], nodes[e.dst]
                model, version = published_weights(p, e.container, u)
                out.append(PubInstance(self.vindex[u.vertex], self.vindex[v.vertex], model, version))
        return tuple(out)

    def _pair_instances(self) -> tuple[PairInstance, ...]:
        """Pairs(m) of stage 3 per step, with the version and producer insert-reshard would use."""
        nodes = {n.id: n for n in self.base.nodes}
        producers = {(m, ver): n.id for n in self.base.nodes for m, ver in n.version_out}
        succ: dict[str, list[str]] = {}
        for e in self.base.edges:
            succ.setdefault(e.src, []).append(e.dst)
        ordered = [(v.name, v.model) for v in self.vertices]
        out = []
        for model, un, vn in model_pairs(ordered, self.trainable):
            for step in range(self.steps):
                u, v = nodes[f"{un}#{step}"], nodes[f"{vn}#{step}"]
                version = dict(v.version_in).get(model, dict(u.version_in).get(model, step))
                producer = producers.get((model, version))
                implied = producer is None or _reaches(succ, producer, v.id)
                out.append(PairInstance(model, self.vindex[un], self.vindex[vn], step, version, producer, implied))
        return tuple(out)

    def _relation_pairs(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """Vertex pairs whose (equality, layout equality on equal devices) can change the pattern, and
        those whose disjointness can (quantile pairs; stage-3 pairs of a model with tau > 0)."""
        pairs = set()
        disjoint_pairs = set(self.phase_pairs)
        destinations: dict[str, set[int]] = {}
        for e in self.pub_instances:
            pairs.add((e.publisher, e.consumer))
            destinations.setdefault(e.model, set()).add(e.consumer)
        for e in self.pair_instances:
            pairs.add((e.u, e.v))
            destinations.setdefault(e.model, set()).add(e.v)
            if self.tau.get(e.model, 0) > 0:
                disjoint_pairs.add((e.u, e.v))
        for group in destinations.values():  # keys of the installed-node maps
            pairs.update((a, b) for a in group for b in group)

        def norm(xs):
            return tuple(sorted({(min(a, b), max(a, b)) for a, b in xs if a != b}))

        return norm(pairs), norm(disjoint_pairs)

    def _phase_tables(self) -> None:
        """Per candidate: whole-operator time and quantile phase times, exactly as annotate computes them."""
        self.t_whole = [d.t_op for d in self.dirs]
        self.t_phase: list[Optional[np.ndarray]] = []
        for d in self.dirs:
            if not self.split_on or d.role not in ("generation", "inference"):
                self.t_phase.append(None)
                continue
            # Candidates share one OpTime object per (strategy, extent) over their origins (`directory`): keyed by
            # identity, since hashing an OpTime walks all its nested terms.
            rows: dict = {}
            for t in d.op_times:
                if id(t) not in rows:
                    rows[id(t)] = [self._phase_time(d.role, t, q) for q in range(1, len(self.shares) + 1)]
            self.t_phase.append(np.array([rows[id(t)] for t in d.op_times], dtype=np.float64).reshape(len(d), -1))

    def _phase_time(self, role: str, t, q: int) -> float:
        """Quantile phase q's time of an operator with core OpTime t, exactly as annotate computes it."""
        if role == "generation":
            previous = self.tokens[q - 2] if q > 1 else 0.0
            return float(generation_phase_time(t.prefill_time, t.decode_time, q, self.tokens[q - 1], previous,
                                               self.tokens[-1]))
        return float(inference_phase_time(t.T_op, self.shares[q - 1]))

    def _fusion_pairs(self) -> tuple[tuple[int, int], ...]:
        """Vertex pairs that may fuse wherever they are placed alike (rule F1: training vertices of two trainable
        models), ascending."""
        training = [i for i, v in enumerate(self.vertices) if v.role == "training" and v.model in self.trainable]
        return tuple((a, b) for k, a in enumerate(training) for b in training[k + 1:]
                     if self.vertices[a].model != self.vertices[b].model)

    def _one_f_one_b(self, s: Strategy) -> bool:
        """Rule F3, fused members train on the 1F1B schedule, with pipelines to fuse: with one stage there is no bubble
        for another member to fill, so a fusion could only add up their memory (the search does not price it)."""
        return s.pp >= 2 and self.program.workload.training(s.train).schedule == "1f1b"

    # --- per-plan facts ----------------------------------------------------------------------------

    def placement(self, choice: Choice) -> tuple[list[Alloc], list[Strategy]]:
        return [d.allocs[c] for d, c in zip(self.dirs, choice)], [d.strategies[c] for d, c in zip(self.dirs, choice)]

    def pattern(self, allocs: Sequence[Alloc], strats: Sequence[Strategy]) -> tuple:
        """The discrete facts that shape the lowered graph beyond relays (module docstring).

        Mirrors the installed-node maps of insert-comm (model, version, destination) and insert-reshard
        (model, version, destination, layout), which publication Reshards and pair Reshards share."""
        phase = tuple(disjoint(allocs[u], allocs[v]) for u, v in self.phase_pairs)
        comms: dict = {}
        reshards: dict = {}
        pub: list = []
        for i, e in enumerate(self.pub_instances):
            u, v = e.publisher, e.consumer
            action = publication_action(allocs[u], strats[u], allocs[v], strats[v])
            reuse = None
            if action == COMM:
                reuse = comms.setdefault((e.model, e.version, allocs[v]), i)
            elif action == RESHARD and e.model in self.trainable:
                reuse = reshards.setdefault((e.model, e.version, allocs[v], strats[v].layout()), ("pub", i))[1]
            pub.append(None if reuse == i else reuse)
        implied = self._implied.get(phase)
        if implied is None:
            implied = self._implied[phase] = implied_pairs(self, phase)
        pair: list = []
        for j, (e, imp) in enumerate(zip(self.pair_instances, implied)):
            u, v = e.u, e.v
            action = pair_action(self.tau.get(e.model, 0), allocs[u], strats[u], allocs[v], strats[v])
            relay = NODE if e.producer_implied else DEP_NODE
            if action == RESHARD:
                key = (e.model, e.version, allocs[v], strats[v].layout())
                target = reshards.setdefault(key, ("pair", j))
                pair.append(NODE if target == ("pair", j) else target)
            elif action == DEP or imp:
                pair.append(relay)
            else:
                pair.append(ABSENT)
        return (phase, tuple(pub), tuple(pair), ())

    def fusion_groups(self, choice: Choice, allocs: Sequence[Alloc], strats: Sequence[Strategy]) -> FusionGroups:
        """The training vertices this placement lets fuse (rules F1-F3): one group per allocation and layout holding
        two or more of them as 1F1B pipelines, each model once (a group where a model repeats does not fuse)."""
        groups: dict[tuple, list[int]] = {}
        for a, b in self.fusion_pairs:
            if (same_stages(allocs[a], strats[a], allocs[b], strats[b])
                    and self.pipelined[a][choice[a]] and self.pipelined[b][choice[b]]):
                members = groups.setdefault((allocs[a], strats[a].layout()), [])
                members += [v for v in (a, b) if v not in members]
        out = [tuple(sorted(g)) for g in groups.values()]
        return tuple(sorted(g for g in out if len({self.vertices[v].model for v in g}) == len(g)))

    def fused_pattern(self, pattern: tuple, groups: FusionGroups) -> tuple:
        """`pattern` with the fusions of `groups` whose members no path links in its graph (a fusion runs its
        members together, so neither may wait for the other)."""
        if not groups:
            return pattern
        key = (pattern, groups)
        ok = self._linked.get(key)
        if ok is None:
            ok = self._linked[key] = tuple(g for g in groups if not _linked(self.superset(pattern), self, g))
        return pattern[:3] + (ok,)

    def fused_time(self, group: tuple[int, ...], choice: Choice) -> float:
        """T_op of the fusion of the vertices `group` placed as `choice` says (core `fuse_operators`)."""
        entries = tuple((self.dirs[v], choice[v]) for v in group)
        key = tuple((id(d.op_times[c]), d.strategies[c]) for d, c in entries)  # OpTime objects live with `dirs`
        t = self._fused_times.get(key)
        if t is None:
            _, fused = fuse_operators(tuple(d.op_times[c] for d, c in entries),
                                      tuple(d.strategies[c] for d, c in entries), self.program.workload)
            t = self._fused_times[key] = fused.total
        return t

    def superset(self, pattern: tuple) -> Superset:
        s = self._supersets.get(pattern)
        if s is None:
            s = self._supersets[pattern] = build_superset(self, pattern)
        return s

    def reshard_time(self, model: str, alloc: Alloc) -> float:
        """T_reshard of `model` on `alloc` (depends on its size and tier only)."""
        key = (model, alloc.extent)
        t = self._reshard_times.get(key)
        if t is None:
            m = self.models[model]
            s_b = self.program.workload.s_b
            t = float(reshard_node_time(param_count(m.arch, m.kind), s_b, alloc, self.hw, self.opts))
            self._reshard_times[key] = t
        return t

    def weight_bytes(self, model: str) -> int:
        return weight_bytes(self.program, model)

    # --- reference evaluation ------------------------------------------------------------------------

    def node_runs(self, s: Superset, choice: Choice, allocs, strats, masks: list[int]):
        """Per superset node: (what it runs for, reserved bitmask, order key); relays get (None, 0, RELAY_KEY).
        `masks`: what each vertex's nodes hold (`held_masks`)."""
        runs: list[Optional[float]] = []  # what each node runs for; None: a relay
        reserved: list[int] = []
        keys: list[tuple] = []
        memo: dict = {}
        for i in range(s.n):
            kind, v = s.kind[i], s.vertex[i]
            if kind == OPERATOR:
                q, group = s.phase[i], s.fusion[i]
                if group is not None:
                    t = self.fused_time(group, choice)
                else:
                    t = float(self.t_whole[v][choice[v]]) if q == 0 else float(self.t_phase[v][choice[v], q - 1])
                runs.append(t)
                reserved.append(masks[v])
                keys.append(s.key[i])
                continue
            if kind == FUSED_MEMBER:
                runs.append(None)
                reserved.append(0)
                keys.append(RELAY_KEY)
                continue
            spec = (kind, s.src[i], v, s.nbytes[i], s.model[i])
            hit = memo.get(spec)
            if hit is None:
                hit = memo[spec] = self._transfer(kind, s.src[i], v, s.nbytes[i], s.model[i], allocs, strats)
            t, as_reshard = hit
            runs.append(t)
            reserved.append(0 if t is None else masks[v])
            keys.append(RELAY_KEY if t is None else (s.reshard_key[i] if as_reshard else s.key[i]))
        return runs, reserved, keys

    def _hosts(self, s: Superset, allocs) -> list[int]:
        """Each superset node's host (its vertex's allocation's first device's; a pool's the first node's)."""
        c = self.program.cluster
        host = [host_of(min(a.devices(c)), c.gpus) if on else 0 for a, on in zip(allocs, self.device_vertex)]
        return [host[v] for v in s.vertex]

    def _device_ops(self, s: Superset) -> list[bool]:
        return [k == OPERATOR and self.device_vertex[v] for k, v in zip(s.kind, s.vertex)]

    def _priced(self, s: Superset, choice: Choice, allocs, runs: list[Optional[float]],
                busy: Optional[Sequence[float]] = None) -> list[float]:
        """The superset's node times as `annotate.priced_times` makes the lowered graph's (a relay: 0); `busy`: each
        node's factor of the cores computing beside it (None: its allocation's siblings alone)."""
        hosts = self._hosts(s, allocs)
        cores = self._computing_cores(s, choice, allocs)
        core_s = [t * c if t is not None else 0.0 for t, c in zip(runs, cores)]
        full = self.full_hosts(choice)
        k = host_stretches(hosts, core_s, [t is not None for t in runs], full, self.hw.overhead.contention)
        if busy is None:
            alone = [float(co_busy_stretch(a.extent[2], self.host_cores, self.hw.overhead.co_busy)) if on else 1.0
                     for a, on in zip(allocs, self.device_vertex)]
            busy = [alone[v] for v in s.vertex]
        return [0.0 if t is None else
                float(priced_node_time(t * b * k[h] if kind == OPERATOR else t, self.hw, transfer=kind != OPERATOR,
                                       full=bool(full[h]), weights=kind in WEIGHT_MOVES))
                for t, h, kind, b in zip(runs, hosts, s.kind, busy)]

    def _computing_cores(self, s: Superset, choice: Choice, allocs) -> list[int]:
        """`annotate.computing_cores` of the superset's nodes: an operator's devices, a verify node's pool processes,
        0 for a transfer."""
        pool = self._pools(choice)
        return [(allocs[v].size if self.device_vertex[v] else pool[v]) if k == OPERATOR else 0
                for k, v in zip(s.kind, s.vertex)]

    def _pools(self, choice: Choice) -> list[int]:
        """Each vertex's pool processes under `choice` (0 for a device vertex)."""
        return [d.pools[c] if d.pools else 0 for d, c in zip(self.dirs, choice)]

    def _overlap_factors(self, s: Superset, choice: Choice, allocs, runs: list[Optional[float]],
                         sched: Schedule) -> np.ndarray:
        """`annotate.busy_factors` of the superset's nodes from their first schedule `sched`."""
        device_op = self._device_ops(s)
        pool = self._pools(choice)
        real = [t is not None for t in runs]
        computing = [r and k == OPERATOR for r, k in zip(real, s.kind)]
        cores = [allocs[v].extent[2] if self.device_vertex[v] else pool[v] for v in s.vertex]
        out = np.ones((1, s.n))
        overlap_stretches(whole_ns([sched.start]), whole_ns([sched.finish]), np.array([self._hosts(s, allocs)]),
                          np.array([cores], dtype=np.int64), np.array([computing]),
                          np.array([device_op]), self.host_cores, self.hw.overhead.co_busy,
                          self.hw.overhead.co_run, out)
        return out[0]

    def full_hosts(self, choice: Choice) -> np.ndarray:
        """Per host, whether the plan's processes take all its cores (contention.full_hosts)."""
        c = self.program.cluster
        devices = set(mask_devices(self.used_mask(choice)))
        pool = max((pool_taken_cores(d.pools[ch], self.host_cores, c, devices)
                    for d, ch, on in zip(self.dirs, choice, self.device_vertex)
                    if not on and self.host_cores is not None), default=0)
        return full_hosts(devices_per_host(devices, c.gpus, c.racks * c.nodes), pool, self.host_cores)

    def held_masks(self, choice: Choice) -> list[int]:
        """Per vertex, the resources its nodes hold: a device vertex its allocation; a pool its resource and, of the
        devices whose cores it shares (its directory mask), those the plan uses (cost/host.shared_devices)."""
        masks = [d.masks[c] for d, c in zip(self.dirs, choice)]
        if all(self.device_vertex):
            return masks
        keep = self.used_mask(choice) | (1 << self.num_devices)
        return [m if on else m & keep for m, on in zip(masks, self.device_vertex)]

    def used_mask(self, choice: Choice) -> int:
        """The devices the plan's device vertices use, as a bitmask (a pool's mask is the cores it shares)."""
        used = 0
        for d, c, on in zip(self.dirs, choice, self.device_vertex):
            if on:
                used |= d.masks[c]
        return used

    def _transfer(self, kind, u, v, nbytes, model, allocs, strats) -> tuple[Optional[float], bool]:
        """(time, lowers-to-Reshard) of a Comm/Reshard superset node, (None, False) for a relay."""
        a_u, a_v = allocs[u], allocs[v]
        if kind == DATA_COMM:
            if data_action(a_u, a_v) != COMM:
                return None, False
            return float(comm_node_time(nbytes, a_u, a_v, self.hw)), False
        if kind == PUBLICATION:
            action = publication_action(a_u, strats[u], a_v, strats[v])
            if action == COMM:
                payload = publication_bytes(self.weight_bytes(model), a_u, a_v)
                return float(comm_node_time(payload, a_u, a_v, self.hw)), False
            if action == RESHARD and model in self.trainable:
                return self.reshard_time(model, a_v), True
            return None, False
        action = pair_action(self.tau.get(model, 0), a_u, strats[u], a_v, strats[v])
        if action == RESHARD:
            return self.reshard_time(model, a_v), True
        return None, False

    def memory(self, allocs, strats, fused: FusionGroups = ()):
        p = self.program
        ops = tuple(OpPlacement(v.name, v.role, v.model, a, s)
                    for v, a, s, on in zip(self.vertices, allocs, strats, self.device_vertex) if on)
        names = tuple(tuple(self.vertices[v].name for v in g) for g in fused)
        return device_memory(ops, self.models, self.tau, p.cluster, p.workload, self.hw, self.opts, names)

    def schedule(self, choice: Choice, fused: FusionGroups = ()) -> tuple[Superset, list[float], list[int], Schedule]:
        """The schedule of `choice` with the fusions `fused` (those its pattern allows: `Superset.pattern[3]`)."""
        allocs, strats = self.placement(choice)
        s = self.superset(self.fused_pattern(self.pattern(allocs, strats), fused))
        masks = self.held_masks(choice)
        runs, reserved, keys = self.node_runs(s, choice, allocs, strats, masks)
        structure = self._prepared(s, masks, reserved, keys)
        times = self._priced(s, choice, allocs, runs)
        sched = run_schedule(structure, times)
        if prices_overlaps(self.hw.overhead.co_run, self.host_cores):  # one more step of the fixed point
            times = self._priced(s, choice, allocs, runs, self._overlap_factors(s, choice, allocs, runs, sched))
            sched = run_schedule(structure, times)
        return s, times, reserved, sched

    def _prepared(self, s: Superset, masks: list[int], reserved: list[int], keys: list[tuple]):
        """`schedule.prepare_schedule`, reused across plans with the same graph and device overlaps (`masks`: what each
        vertex holds, `held_masks`).

        Beyond the superset, the prepared structure depends on which nodes are relays and which order
        keys they use, and on the overlap structure of the vertex allocations (its device atoms); only
        the reserved-set sizes (for busy time) change with the allocations themselves."""
        key = (s.pattern, tuple(map(id, keys)), venn_cells(masks))
        structure = self._structures.get(key)
        if structure is None:
            structure = prepare_schedule(s.is_transfer, reserved, s.edges, s.groups, keys, s.names, self.num_devices)
            if len(self._structures) >= STRUCTURE_CACHE:
                self._structures.pop(next(iter(self._structures)))
            self._structures[key] = structure
            return structure
        return replace(structure, sizes=device_sizes(reserved, self.num_devices))

    def evaluate(self, choice: Choice) -> Evaluation:
        """The reference path: one configuration, core functions only; fused too where it may and pays."""
        allocs, strats = self.placement(choice)
        apart = self.evaluate_as(choice, ())
        groups = self.fusion_groups(choice, allocs, strats) if self.fuse else ()
        if not groups:
            return apart
        fused = self.evaluate_as(choice, groups)
        return fused if fused.fused and better(fused, apart) else apart

    def evaluate_as(self, choice: Choice, fused: FusionGroups) -> Evaluation:
        """`choice` priced with the fusions `fused` that its pattern allows (none: the members apart)."""
        allocs, strats = self.placement(choice)
        s, _, _, sched = self.schedule(choice, fused)
        groups = s.pattern[3]
        mem = self.memory(allocs, strats, groups)
        r_host = self.host_ratio(choice)
        return replace(self._evaluation(sched.makespan, sched.busy, sched.op_time, mem.r_peak,
                                        mem.feasible and r_host <= 1.0, mem.peak, groups), r_host=r_host)

    def host_ratio(self, choice: Choice) -> float:
        """Host cores the plan needs on its busiest host (its devices there and, on the first node, its largest pool's
        own cores: cost/host.cores_needed, pool_cores) over the cores a host has; 0 where the profile does not give
        them."""
        if self.host_cores is None:
            return 0.0
        c = self.program.cluster
        pools = max((pool_cores(d.pools[ch], self.host_cores, c)[0]
                     for d, ch, on in zip(self.dirs, choice, self.device_vertex) if not on), default=0)
        per_host = devices_per_host(mask_devices(self.used_mask(choice)), c.gpus, c.racks * c.nodes)
        return float(cores_needed(per_host, pools)) / self.host_cores

    def cores_fit(self, choice: Choice) -> bool:
        return self.host_ratio(choice) <= 1.0

    def _evaluation(self, makespan, busy, op_time, r_peak, feasible, peak, fused: FusionGroups = ()) -> Evaluation:
        w = self.program.workload
        raw = score(makespan, self.steps, w.B, w.R, w.Lp, w.Lr)
        return Evaluation(
            makespan=float(makespan),
            score=float(raw),
            score_pen=float(score_pen(raw, r_peak)),
            util=float(utilization(busy, self.num_devices, makespan)),
            p_eff=float(p_eff(op_time, makespan)),
            r_peak=float(r_peak),
            feasible=bool(feasible),
            peak=tuple(np.asarray(peak, dtype=np.float64).tolist()),
            fused=fused,
        )

    def critical_weights(self, choice: Choice, fused: FusionGroups = ()) -> np.ndarray:
        """Per vertex: its Op time on the critical path of the schedule (A-J2f single-vertex kernel); a fusion's
        time counts for its first member."""
        s, times, reserved, sched = self.schedule(choice, fused)
        preds: list[list[int]] = [[] for _ in range(s.n)]
        for a, b in s.edges:
            preds[b].append(a)
        weights = np.zeros(len(self.vertices))
        x = max(range(s.n), key=lambda i: (sched.finish[i], -i))
        seen = set()
        while x is not None and x not in seen:
            seen.add(x)
            if s.kind[x] == OPERATOR:
                weights[s.vertex[x]] += times[x]
            start = sched.start[x]
            if start <= 0.0:
                break
            x = _blocker(x, start, preds[x], sched, reserved)
        return weights

    # --- plans ----------------------------------------------------------------------------------------

    def to_plan(self, choice: Choice, name: str = "opt", fused: FusionGroups = ()) -> Plan:
        p = self.program
        allocs, strats = self.placement(choice)
        placements = tuple(Placement(v.name, a, s)
                           for v, a, s, on in zip(self.vertices, allocs, strats, self.device_vertex) if on)
        pools = tuple(Pool(v.name, d.pools[c]) for v, d, c, on in zip(self.vertices, self.dirs, choice, self.device_vertex)
                      if not on)
        fusions = tuple(Fuse(tuple(self.vertices[v].name for v in g)) for g in fused)
        return Plan(name, p.graph.name, p.cluster.name, placements, fusions=fusions, pools=pools)

    def choice_of(self, plan: Plan) -> Optional[Choice]:
        """The directory indices of an existing plan, None if some placement is not a candidate."""
        out = []
        for v, d in zip(self.vertices, self.dirs):
            try:
                if v.role == VERIFY:
                    i = d.pool_index(plan.pool(v.name).size)
                    if i is None:
                        return None
                    out.append(i)
                    continue
                pl = plan.placement(v.name)
            except KeyError:
                return None
            i = d.index(pl.alloc, pl.strategy)
            if i is None:
                return None
            out.append(i)
        return tuple(out)


def venn_cells(masks: Sequence[int]) -> frozenset:
    """The non-empty cells of the Venn diagram of device sets, as the member index sets covering them."""
    cells: list[tuple[int, tuple[int, ...]]] = []
    union = 0
    for i, m in enumerate(masks):
        refined = []
        for cell, members in cells:
            inside, outside = cell & m, cell & ~m
            if inside:
                refined.append((inside, members + (i,)))
            if outside:
                refined.append((outside, members))
        if m & ~union:
            refined.append((m & ~union, (i,)))
        union |= m
        cells = refined
    return frozenset(members for _, members in cells)


def _blocker(x: int, start: float, preds: list[int], sched: Schedule, reserved: list[int]) -> Optional[int]:
    """The node whose finish fixed x's start: a predecessor, else a node that held one of x's devices."""
    for u in preds:
        if sched.finish[u] == start:
            return u
    mask = reserved[x]
    best = None
    for u, f in enumerate(sched.finish):
        if f == start and reserved[u] & mask and sched.start[u] <= start:
            best = u
    return best


# --- superset construction: mirrors split-quantiles, insert-comm and insert-reshard ---------------------


@dataclass(frozen=True)
class _Split:
    """The unrolled graph after stage 1 (quantiles._split): op sub-nodes and the re-attached edge list."""

    ops: tuple[ExecNode, ...]
    first: dict
    last: dict
    edges: tuple[tuple[str, str, str, Optional[str]], ...]


def split_stage(cv: CompactVariant, phase_bits: tuple[bool, ...]) -> _Split:
    g = cv.base
    vindex = cv.vindex
    phased_pairs = {pair for pair, bit in zip(cv.phase_pairs, phase_bits) if bit}
    by_id = {n.id: n for n in g.nodes}

    def is_phase_edge(e) -> bool:
        if e.kind != "data":
            return False
        u, v = by_id[e.src], by_id[e.dst]
        return u.kind == "op" and v.kind == "op" and (vindex[u.vertex], vindex[v.vertex]) in phased_pairs

    phased = [e for e in g.edges if is_phase_edge(e)]
    split_ids = {e.src for e in phased} | {e.dst for e in phased}
    ops: list[ExecNode] = []
    edges: list[tuple[str, str, str, Optional[str]]] = []
    for n in g.nodes:
        if n.id not in split_ids:
            ops.append(n)
            continue
        phases = [
            n.with_(id=f"{n.id}.q{q}", phase=q, nphases=len(cv.shares), fraction=share)
            for q, share in enumerate(cv.shares, start=1)
        ]
        ops += phases
        edges += [(a.id, b.id, "dep", None) for a, b in zip(phases, phases[1:])]
    first: dict[tuple[str, int], ExecNode] = {}
    last: dict[tuple[str, int], ExecNode] = {}
    for n in ops:
        key = (n.vertex, n.step)
        first.setdefault(key, n)
        last[key] = n
    phased_set = set(phased)
    for e in g.edges:
        if e in phased_set:
            edges += [(f"{e.src}.q{q}", f"{e.dst}.q{q}", e.kind, e.container) for q in range(1, len(cv.shares) + 1)]
        else:
            u, v = by_id[e.src], by_id[e.dst]
            edges.append((last[(u.vertex, u.step)].id, first[(v.vertex, v.step)].id, e.kind, e.container))
    return _Split(tuple(ops), first, last, tuple(dict.fromkeys(edges)))  # unique_edges keeps the first


def implied_pairs(cv: CompactVariant, phase_bits: tuple[bool, ...]) -> tuple[bool, ...]:
    """Per stage-3 pair instance: does a path last(u) ->* first(v) exist without the pair edge?

    Then a bare pair edge adds no precedence and its presence is irrelevant to the schedule."""
    sp = split_stage(cv, phase_bits)
    succ: dict[str, list[str]] = {}
    for src, dst, _, _ in sp.edges:
        succ.setdefault(src, []).append(dst)
    out = []
    for e in cv.pair_instances:
        un, vn = cv.vertices[e.u].name, cv.vertices[e.v].name
        out.append(_reaches(succ, sp.last[(un, e.step)].id, sp.first[(vn, e.step)].id))
    return tuple(out)


def _reaches(succ: dict[str, list[str]], a: str, b: str) -> bool:
    stack, seen = [a], {a}
    while stack:
        for y in succ.get(stack.pop(), ()):
            if y == b:
                return True
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return False


def _linked(s: Superset, cv: CompactVariant, group: tuple[int, ...]) -> bool:
    """Whether a path joins two members of `group` in some step of the superset `s` (unfused)."""
    index = {name: i for i, name in enumerate(s.names)}
    return any(path_between(s.edges, [index[f"{cv.vertices[v].name}#{step}"] for v in group]) is not None
               for step in range(cv.steps))


def build_superset(cv: CompactVariant, pattern: tuple) -> Superset:
    phase_bits, pub_reuse, pair_decisions, fused = pattern
    p = cv.program
    vindex = cv.vindex
    sp = split_stage(cv, phase_bits)
    ops, first, last, edges1 = sp.ops, sp.first, sp.last, sp.edges

    b = _Builder()
    op_index: dict[str, int] = {}
    node_of: dict[str, ExecNode] = {}
    for i, n in enumerate(ops):
        op_index[n.id] = i
        node_of[n.id] = n
        group = ("chain", n.vertex, n.step) if n.role == "generation" and n.phase is not None else ("node", i)
        b.add(OPERATOR, vindex[n.vertex], -1, n.phase or 0, n.role, 0, None, n.step,
              (n.step, n.order, i, 2, 0, 0), None, group, n.id)

    # Stages 2 and 4 (insert-comm, and insert-reshard on publication edges), in edge order.
    pub_node: dict[int, int] = {}
    k = 0
    for pos, (src, dst, kind, container) in enumerate(edges1):
        u, v = node_of[src], node_of[dst]
        ui, vi = op_index[src], op_index[dst]
        if kind == "data":
            nbytes = data_bytes(container_payload(p, container), phase_share(u, v))
            c = b.add(DATA_COMM, vindex[v.vertex], vindex[u.vertex], 0, "", nbytes, None, v.step,
                      (v.step, v.order, vi, 0, pos, 0), None, None, f"comm {src}->{dst}")
            b.edge(ui, c)
            b.edge(c, vi)
        elif kind == "pub":
            e = cv.pub_instances[k]
            reuse = pub_reuse[k]
            if reuse is not None:
                b.edge(pub_node[reuse], vi)
            else:
                c = b.add(PUBLICATION, e.consumer, e.publisher, 0, "", 0, e.model, v.step,
                          (v.step, v.order, vi, 0, pos, 0), (v.step, v.order, vi, 1, 0, pos), None,
                          f"pub {src}->{dst}")
                pub_node[k] = c
                b.edge(ui, c)
                b.edge(c, vi)
            k += 1
        else:
            b.edge(ui, vi)

    # Stage 3 (insert-reshard pair edges): per pair and step, after every publication edge.
    pair_node: dict[int, int] = {}
    producer_index = {n.id: op_index[last[(n.vertex, n.step)].id] for n in cv.base.nodes}
    for j, (e, decision) in enumerate(zip(cv.pair_instances, pair_decisions)):
        u = last[(cv.vertices[e.u].name, e.step)]
        v = first[(cv.vertices[e.v].name, e.step)]
        ui, vi = op_index[u.id], op_index[v.id]
        if decision == ABSENT:
            continue
        if isinstance(decision, tuple):  # a Reshard already installs this version: reuse it
            target = pub_node[decision[1]] if decision[0] == "pub" else pair_node[decision[1]]
            b.edge(ui, vi)
            b.edge(target, vi)
            continue
        key = (v.step, v.order, vi, 1, 1, j)
        c = b.add(PAIR_RESHARD, e.v, e.u, 0, "", 0, e.model, v.step, key, key, None, f"pair {u.id}->{v.id}")
        pair_node[j] = c
        b.edge(ui, c)
        b.edge(c, vi)
        if decision == NODE and e.producer is not None:
            b.edge(producer_index[e.producer], c)
    for group in fused:
        for step in range(cv.steps):
            b.fuse([op_index[f"{cv.vertices[v].name}#{step}"] for v in group], group)
    return b.build(pattern)


_COLUMNS = ("kind", "vertex", "src", "phase", "role", "nbytes", "model", "step", "key", "reshard_key", "groups",
            "names", "fusion")


class _Builder:
    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in _COLUMNS}
        self.edges: list[tuple[int, int]] = []

    def add(self, kind, vertex, src, phase, role, nbytes, model, step, key, reshard_key, group, name) -> int:
        i = len(self.cols["kind"])
        group = group if group is not None else ("node", i)
        for col, value in zip(
            _COLUMNS, (kind, vertex, src, phase, role, nbytes, model, step, key, reshard_key, group, name, None)
        ):
            self.cols[col].append(value)
        return i

    def edge(self, a: int, b: int) -> None:
        self.edges.append((a, b))

    def fuse(self, members: list[int], group: tuple[int, ...]) -> None:
        """One step's fused members as one unit (`schedule.schedule_exec`): the first runs the fusion and waits for
        every member's predecessors; each other member becomes a relay right after it."""
        head, others = members[0], set(members[1:])
        self.cols["fusion"][head] = group
        for m in others:
            self.cols["kind"][m] = FUSED_MEMBER
        self.edges = [(a, head if b in others else b) for a, b in self.edges] + [(head, m) for m in members[1:]]

    def build(self, pattern: tuple) -> Superset:
        c = self.cols
        return Superset(
            pattern=pattern,
            kind=tuple(c["kind"]),
            vertex=tuple(c["vertex"]),
            src=tuple(c["src"]),
            phase=tuple(c["phase"]),
            fusion=tuple(c["fusion"]),
            role=tuple(c["role"]),
            nbytes=tuple(c["nbytes"]),
            model=tuple(c["model"]),
            step=tuple(c["step"]),
            key=tuple(c["key"]),
            reshard_key=tuple(c["reshard_key"]),
            edges=tuple(dict.fromkeys(self.edges)),
            groups=tuple(c["groups"]),
            names=tuple(c["names"]),
        )
