"""Cost annotation of a lowered executable graph: node times T(x) and per-device memory
(paper Sec. V, App. D; spec 3, 5, 6). This is the semantics of the `annotate-cost` pass.

Op nodes get T_op, or their quantile-phase share (spec 5.3, [A17]); Comm nodes get T_xfer of
their stored payload; Reshard nodes get T_reshard of their model. Op times are computed once per
(vertex, plan): unrolled steps and quantile sub-nodes reuse them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from rpegc.core.ir.geometry import Alloc, replica_tier, span_tier
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.ir.errors import UNKNOWN_LOC, RpegError
from rpegc.core.ir.exec_graph import ExecFusion, ExecGraph, ExecNode, MemoryReport
from rpegc.core.ir.expr import evaluate
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.fused import FusedTime, fused_time, member_pipeline
from rpegc.core.cost.optime import OpTime, op_time
from rpegc.core.cost.params import param_count
from rpegc.core.ir.program import VERIFY, Program
from rpegc.core.cost.contention import (co_busy_stretch, devices_per_host, full_hosts, host_of, host_stretches,
                                        overlap_stretches, prices_overlaps, whole_ns)
from rpegc.core.cost.host import check_pools, link_alloc, pool_taken_cores, shared_devices, verify_node_time
from rpegc.core.cost.residency import DeviceMemory, OpPlacement, device_memory
from rpegc.core.cost.transfer import (comm_node_time, generation_phase_time, inference_phase_time, moves_weights,
                                      priced_node_time, reshard_node_time)
from rpegc.core.cost.work import check_role_kind
from rpegc.core.sched.microtasks import MemberPipeline
from rpegc.core.sched.schedule import schedule_exec


def annotate(p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> Program:
    """`p` with `time` on every exec node and `exec.memory` filled in. A node's time is what it runs for (a
    transfer's with its fixed [overhead] transfer, a device operator's stretched where the runtime's threads share
    its host's cores) plus the runtime's control round trip before it (`priced_times`); all 0 in the spec's model. A
    verify node, and a transfer into its pool, also get the devices whose host cores the pool shares (`shares`,
    cost/host.shared_devices), which the schedule reserves with the pool."""
    eg = _lowered_exec(p)
    _require_graph_and_cluster(p)
    if p.plan is not None and p.plan.fusions and not eg.fusions:  # priced apart, they would run apart too
        f = p.plan.fusions[0]
        raise RpegError(f.loc, f"the plan fuses {', '.join('@' + v for v in f.vertices)}, but the exec graph has no "
                               "exec.fusion; run fuse-stages after insert-reshard")
    check_pools(p, hw)
    shares = _pool_shares(eg, p, hw)
    times: dict[OpPlacement, OpTime] = {}
    runs = node_runs(p, hw, opts, times)
    eg = replace(eg, nodes=tuple(n.with_(shares=shares.get(n.id, ())) if n.alloc is None else n for n in eg.nodes))
    nodes = [n.with_(time=t) for n, t in zip(eg.nodes, priced_times(p, hw, eg, runs))]
    mem = device_memory(tuple(times), _models(p), dict(p.graph.staleness), p.cluster, p.workload, hw, opts,
                        fused_vertices(p))
    return replace(p, exec=replace(eg, nodes=tuple(nodes), memory=memory_report(mem)))


def node_runs(p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS,
              times: dict[OpPlacement, OpTime] | None = None) -> list[float]:
    """What each node of `p.exec` runs for, before the runtime's own costs (`priced_times`): an operator's T_op (its
    quantile phase's share; a fusion's member the fusion's time), a verify node's T_verify, a transfer's T_xfer or
    T_reshard. `times` collects each placed operator's OpTime."""
    eg = p.exec
    times = {} if times is None else times
    quantile_tokens = _quantile_tokens(p)
    runs: list[float] = []
    for node in eg.nodes:
        if node.kind == "op" and node.role == VERIFY:
            t = _verify_node_time(node, p, hw)
        elif node.kind == "op":
            placement = node_placement(node, p)
            if placement not in times:
                times[placement] = placement_time(p, placement, hw, opts)
            t = _op_node_time(node, times[placement], quantile_tokens, p)
        else:
            t = transfer_time(node, p, hw, opts)
        runs.append(float(t))
    fused = fusion_times(p, times)  # one command: one control round trip for all its members
    return [fused.get(n.id, t) for n, t in zip(eg.nodes, runs)]


def priced_times(p: Program, hw: Hardware, eg: ExecGraph, runs: Sequence[float]) -> list[float]:
    """Each node of `eg` as the schedule takes it, from what it runs for (`runs`): a device operator's time stretched
    by the cores computing beside it (`busy_factors`), and a device operator's or a verify node's on a host whose
    cores the plan takes, a transfer's fixed cost, every node's control round trip by its host's condition
    (core/cost/contention.py)."""
    conditions = host_conditions(p, hw, eg, runs)
    return _priced_with(hw, eg, runs, conditions, busy_factors(p, hw, eg, runs, conditions))


def _priced_with(hw: Hardware, eg: ExecGraph, runs: Sequence[float], conditions, busy: Sequence[float]) -> list[float]:
    """`priced_times` with each device operator's factor of the cores beside it given (`busy`); `conditions`:
    `host_conditions`."""
    hosts, full, k = conditions
    return [float(priced_node_time(t * b * k[h] if n.kind == "op" else t, hw, transfer=n.kind != "op",
                                   full=bool(full[h]), weights=moves_weights(n)))
            for n, t, h, b in zip(eg.nodes, runs, hosts, busy)]


def busy_factors(p: Program, hw: Hardware, eg: ExecGraph, runs: Sequence[float], conditions=None) -> list[float]:
    """Per node of `eg`, the factor of a device operator's time with the cores computing beside it on its host: its
    allocation's siblings (`co_busy_factor`); on a profile that prices overlaps (contention.prices_overlaps), the
    other operators and pools too that a first schedule, of the times with the siblings alone, overlaps with it
    (contention.overlap_stretches). 1 for other nodes. `conditions`: `host_conditions`, where the caller has them."""
    alone = [co_busy_factor(n, hw) if device_op(n) else 1.0 for n in eg.nodes]
    if not prices_overlaps(hw.overhead.co_run, hw.host_cores):
        return alone
    conditions = host_conditions(p, hw, eg, runs) if conditions is None else conditions
    first = _priced_with(hw, eg, runs, conditions, alone)
    sched = schedule_exec(replace(eg, nodes=tuple(n.with_(time=t) for n, t in zip(eg.nodes, first))), p.cluster)
    head = {m: f.members[0] for f in eg.fusions for m in f.members}
    counted = [head.get(n.id, n.id) == n.id for n in eg.nodes]
    computing = [(device_op(n) and c) or (n.kind == "op" and n.role == VERIFY) for n, c in zip(eg.nodes, counted)]
    cores = [n.pool if n.alloc is None else n.alloc.extent[2] for n in eg.nodes]
    out = np.ones((1, len(eg.nodes)))
    overlap_stretches(whole_ns([sched.start]), whole_ns([sched.finish]), np.array([conditions[0]], dtype=np.int64),
                      np.array([[c or 0 for c in cores]], dtype=np.int64), np.array([computing]),
                      np.array([[device_op(n) for n in eg.nodes]]), hw.host_cores, hw.overhead.co_busy,
                      hw.overhead.co_run, out)
    index = {n.id: i for i, n in enumerate(eg.nodes)}
    return [float(out[0, index[head.get(n.id, n.id)]]) for n in eg.nodes]  # a fusion's members: its first's


def co_busy_factor(n: ExecNode, hw: Hardware) -> float:
    """The factor of a device operator's time with its allocation's devices computing together on a host."""
    return float(co_busy_stretch(n.alloc.extent[2], hw.host_cores, hw.overhead.co_busy))


def host_conditions(p: Program, hw: Hardware, eg: ExecGraph, runs: Sequence[float]):
    """(each node's host, per host whether the plan's processes take all its cores, per host the factor of its
    operators' times, the device operators' and the verify nodes': contention.host_stretches)."""
    hosts, full = node_hosts(p, hw, eg)
    second = {m for f in eg.fusions for m in f.members[1:]}  # a fusion runs as one command
    counted = [n.id not in second for n in eg.nodes]
    return hosts, full, host_stretches(hosts, [t * computing_cores(n) for n, t in zip(eg.nodes, runs)], counted, full,
                                       hw.overhead.contention)


def computing_cores(n: ExecNode) -> int:
    """The cores an exec node computes on: an operator's devices, a verify node's pool processes; 0 for a transfer."""
    if n.kind != "op":
        return 0
    return n.alloc.size if device_op(n) else n.pool


def device_op(n: ExecNode) -> bool:
    return n.kind == "op" and n.role != VERIFY


def node_hosts(p: Program, hw: Hardware, eg: ExecGraph) -> tuple[list[int], np.ndarray]:
    """Each node's host (its first device's; a verifier pool's node's, the first node's) and, per host, whether the
    plan's processes take all its cores (core/cost/contention.py)."""
    c = p.cluster
    devices = {a: a.devices(c) for a in {n.alloc for n in eg.nodes if n.alloc is not None}}  # once per allocation
    hosts = [0 if n.alloc is None else host_of(min(devices[n.alloc]), c.gpus) for n in eg.nodes]
    used = {d for n in eg.nodes if device_op(n) for d in devices[n.alloc]}
    pools = _pool_sizes(eg)
    pool = pool_taken_cores(max(pools), hw.host_cores, c, used) if pools and hw.host_cores is not None else 0
    return hosts, full_hosts(devices_per_host(used, c.gpus, c.racks * c.nodes), pool, hw.host_cores)


def priced_round_trip(p: Program, hw: Hardware) -> float:
    """The control round trip the plan's exec nodes are priced with, on average (`Overhead.round_trip` by their
    hosts' condition)."""
    hosts, full = node_hosts(p, hw, _lowered_exec(p))
    return float(np.mean([hw.overhead.round_trip(bool(full[h])) for h in hosts])) if hosts else hw.overhead.node


def fused_vertices(p: Program) -> tuple[tuple[str, ...], ...]:
    """The vertices of each fusion of `p.exec` (every step repeats them: once each)."""
    if p.exec is None:
        return ()
    return tuple(dict.fromkeys(tuple(p.exec.node(m).vertex for m in f.members) for f in p.exec.fusions))


def fusion_times(p: Program, times: dict[OpPlacement, OpTime]) -> dict[str, float]:
    """T_op of every fusion of `p.exec` (docs/stage-fusion.md), for each of its member nodes: they occupy their
    devices together, from the fusion's start to its end. `times` holds every member's placement."""
    out: dict[str, float] = {}
    for f in p.exec.fusions:
        total = fusion_time(p, f, lambda n: times[node_placement(n, p)]).total
        out.update({m: total for m in f.members})
    return out


def fusion_time(p: Program, f: ExecFusion, time_of: Callable[[ExecNode], OpTime]) -> FusedTime:
    """The fused time of `f`, its members priced by `time_of`."""
    nodes = [p.exec.node(m) for m in f.members]
    times = tuple(time_of(n) for n in nodes)
    return fused_time(times, member_pipelines(p, nodes, times), f.stages)


def member_pipelines(p: Program, nodes: Sequence[ExecNode], times: Sequence[OpTime]) -> tuple[MemberPipeline, ...]:
    """The microtasks of each fused member node, priced `times` (its microbatches, its forward-equivalent passes)."""
    return tuple(member_pipeline(t, n.strategy.mb, p.workload.training(n.strategy.train).forward_equivalents)
                 for t, n in zip(times, nodes))


def transfer_time(node: ExecNode, p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> float:
    """T of a Comm node (its stored payload, spec 5.1) or a Reshard node (its model, spec 5.2)."""
    if node.kind == "comm":
        if node.src_alloc is None and node.alloc is None:
            raise RpegError(node.loc, f"comm node '{node.id}' lacks its source and destination allocations; rerun "
                                      "insert-comm")
        return comm_node_time(node.bytes, link_alloc(node.src_alloc), link_alloc(node.alloc), hw)
    if node.kind == "reshard":
        if node.alloc is None or node.model is None:
            raise RpegError(node.loc, f"reshard node '{node.id}' lacks its allocation or model; rerun insert-reshard")
        model = _model(p, node.model, node)
        return reshard_node_time(param_count(model.arch, model.kind), p.workload.s_b, node.alloc, hw, opts)
    raise RpegError(node.loc, f"exec node '{node.id}' has kind '{node.kind}', not one of op, comm, reshard")


def _pool_shares(eg: ExecGraph, p: Program, hw: Hardware) -> dict[str, tuple[int, ...]]:
    """Per verify node, the devices whose cores its pool shares, and per transfer into a pool those of the verify
    nodes it feeds (the pool's process receives it); none where the profile does not give the host's cores
    (check_pools has then refused every plan with a pool)."""
    if hw.host_cores is None:
        return {}
    by_size = {size: shared_devices(size, hw.host_cores, p) for size in _pool_sizes(eg)}  # once per size, not step
    out = {n.id: by_size[n.pool] for n in eg.nodes if n.kind == "op" and n.role == VERIFY and n.pool is not None}
    into: dict[str, set[int]] = {}
    for e in eg.edges:
        if e.dst in out:
            into.setdefault(e.src, set()).update(out[e.dst])
    for n in eg.nodes:
        if n.kind != "op" and n.alloc is None and n.id in into:
            out[n.id] = tuple(sorted(into[n.id]))
    return out


def _pool_sizes(eg: ExecGraph) -> set[int]:
    """The sizes of the verifier pools the graph's verify nodes run on."""
    return {n.pool for n in eg.nodes if n.kind == "op" and n.role == VERIFY and n.pool is not None}


def _verify_node_time(node: ExecNode, p: Program, hw: Hardware) -> float:
    if node.pool is None or node.model is None:
        raise RpegError(node.loc, f"verify node '{node.id}' has no pool; give vertex '{node.vertex}' one in the plan "
                                  f"('@{node.vertex} pool = N')")
    try:
        p.verifier(node.model)
    except KeyError:
        raise RpegError(node.loc, f"node '{node.id}' runs undeclared verifier '{node.model}'; declare it with "
                                  "rpeg.verifier") from None
    return verify_node_time(p, node.model, node.pool, hw)


def memory_report(mem: DeviceMemory) -> MemoryReport:
    """The exec graph's MemoryReport: every device of the cluster, by flat id."""
    def per_device(values):
        return tuple((d, float(v)) for d, v in enumerate(values))

    return MemoryReport(
        peak=per_device(mem.peak),
        persistent=per_device(mem.persistent),
        transient=per_device(mem.transient),
        m_eff=float(mem.m_eff),
        r_peak=float(mem.r_peak),
        feasible=mem.feasible,
    )


def placement_time(p: Program, placement: OpPlacement, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> OpTime:
    """T_op of one placed operator of `p` (tiers from its allocation in `p.cluster`)."""
    model = p.model(placement.model)
    s = placement.strategy
    tier = span_tier(placement.alloc)
    pp_tier = replica_tier(placement.alloc, s) if opts.pp_inter_tier == "replica" else tier
    return op_time(
        placement.role, model.arch, model.kind, p.workload,
        dp=s.dp, pp=s.pp, tp=s.tp, mb=s.mb, gpus_per_node=p.cluster.gpus,
        hw=hw, opts=opts, span_tier=tier, pp_tier=pp_tier, train=placement.training(p.workload), rope=model.rope,
    )


def program_placements(p: Program) -> tuple[OpPlacement, ...]:
    """The placed operators of `p`: from its exec graph when present, else from graph + plan."""
    _require_graph_and_cluster(p)
    if p.exec is not None:
        return tuple(dict.fromkeys(node_placement(n, p) for n in p.exec.nodes if n.kind == "op" and n.role != VERIFY))
    if p.plan is None:
        raise RpegError(p.graph.loc, "the module has no plan to cost; add an rpeg.plan or run optimize")
    out = []
    for v in p.graph.vertices:
        if v.role == VERIFY:
            continue
        try:
            pl = p.plan.placement(v.name)
        except KeyError:
            raise RpegError(p.plan.loc, f"the plan places no vertex '{v.name}'; add a placement for it") from None
        _check_inside(pl.alloc, p, pl.loc, f"vertex '{v.name}'")
        out.append(OpPlacement(v.name, v.role, v.model, pl.alloc, pl.strategy))
    return tuple(out)


def program_memory(p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> DeviceMemory:
    """Device memory of the placed operators of `p` (spec 6.5-6.6)."""
    return device_memory(program_placements(p), _models(p), dict(p.graph.staleness), p.cluster, p.workload, hw, opts,
                         fused_vertices(p))


def _lowered_exec(p: Program) -> ExecGraph:
    loc = p.graph.loc if p.graph is not None else UNKNOWN_LOC
    if p.exec is None:
        raise RpegError(loc, "annotate-cost needs an executable graph; run unroll, insert-comm and insert-reshard first")
    if not p.exec.lowered:
        raise RpegError(p.exec.loc, "annotate-cost needs a lowered executable graph; run insert-comm and insert-reshard first")
    return p.exec


def _require_graph_and_cluster(p: Program) -> None:
    if p.graph is None:
        raise RpegError(UNKNOWN_LOC, "costing needs the RPEG graph (staleness, quantiles); the module has none")
    if p.cluster is None:
        raise RpegError(p.graph.loc, "costing needs a cluster; add an rpeg.cluster to the module")


def _models(p: Program):
    return {m.name: m for m in p.models}


def _model(p: Program, name: str, node: ExecNode):
    try:
        return p.model(name)
    except KeyError:
        raise RpegError(node.loc, f"node '{node.id}' uses undeclared model '{name}'; declare it with rpeg.model") from None


def node_placement(node: ExecNode, p: Program) -> OpPlacement:
    """The placed operator an Op node runs (its allocation inside the cluster, its role fit for its model)."""
    if node.alloc is None or node.strategy is None or node.role is None or node.model is None:
        raise RpegError(node.loc, f"op node '{node.id}' has no allocation or strategy; give vertex '{node.vertex}' a placement in the plan")
    model = _model(p, node.model, node)
    check_role_kind(node.role, model.kind, node.loc)
    _check_inside(node.alloc, p, node.loc, f"op node '{node.id}'")
    return OpPlacement(node.vertex or node.id, node.role, node.model, node.alloc, node.strategy)


def _check_inside(alloc: Alloc, p: Program, loc, what: str) -> None:
    c = p.cluster
    bounds = (c.racks, c.nodes, c.gpus)
    if any(o < 0 or e < 1 or o + e > b for o, e, b in zip(alloc.origin, alloc.extent, bounds)):
        raise RpegError(
            loc,
            f"{what} is placed at origin {alloc.origin} extent {alloc.extent}, outside cluster @{c.name} "
            f"of {c.racks} x {c.nodes} x {c.gpus}; move or shrink the allocation",
        )


def _quantile_tokens(p: Program) -> tuple[float, ...]:
    return tuple(float(evaluate(q.tokens, p.workload.env)) for q in p.graph.quantiles)


def _op_node_time(node: ExecNode, t: OpTime, tokens: tuple[float, ...], p: Program):
    if node.phase is None:
        return t.T_op
    q = node.phase
    if not tokens or not 1 <= q <= len(tokens):
        raise RpegError(node.loc, f"node '{node.id}' is quantile phase {q}, but the graph declares {len(tokens)} quantiles; rerun split-quantiles")
    if node.role == "generation":
        previous = tokens[q - 2] if q > 1 else 0.0
        return generation_phase_time(t.prefill_time, t.decode_time, q, tokens[q - 1], previous, tokens[-1])
    fraction = node.fraction
    if fraction is None:
        fs = [qt.f for qt in p.graph.quantiles]
        fraction = fs[q - 1] - (fs[q - 2] if q > 1 else 0.0)
    return inference_phase_time(t.T_op, fraction)
