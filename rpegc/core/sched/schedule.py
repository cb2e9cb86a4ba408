"""Schedule an annotated executable graph and score it (the `schedule` pass's semantics).

Paper: App. A-H (Alg. 5) and A-I (Eq. 4-6); docs/cost-model-spec.md Section 7. Builds the scheduler's
arrays from an `ExecGraph` whose nodes all carry `time`, runs `rpegc.core.sched.list_scheduler`, and writes
`start`/`finish` on every node plus a `ScheduleReport` with makespan, score, memory-penalised score,
utilization and effective parallelism.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import NODE_KINDS, ExecGraph, ExecNode, ScheduleReport
from rpegc.core.ir.program import Program
from rpegc.core.cost.host import check_pool_transfers, pool_device
from rpegc.core.ir.geometry import Alloc, Cluster, alloc_mask, device_mask
from rpegc.core.sched.list_scheduler import Schedule, greedy_schedule
from rpegc.core.sched.score import p_eff, score, score_pen, utilization


def _check_alloc(node: ExecNode, alloc: Alloc, cluster: Cluster) -> None:
    dims = (cluster.racks, cluster.nodes, cluster.gpus)
    for o, e, size in zip(alloc.origin, alloc.extent, dims):
        if o < 0 or e < 1 or o + e > size:
            raise RpegError(
                node.loc,
                f"node {node.id}: allocation at {alloc.origin} extent {alloc.extent} does not fit in "
                f"cluster {cluster.name} ({cluster.racks} x {cluster.nodes} x {cluster.gpus}); "
                "change the plan's origin or extent",
            )


def _reserved_mask(node: ExecNode, cluster: Cluster) -> int:
    """Op: its allocation sigma(v); Comm/Reshard: the destination allocation (Def. A.11); a verify node and a transfer
    into its pool: the pool's resource (cost/host.py), a verify node also the devices whose cores it shares."""
    if node.kind not in NODE_KINDS:
        raise RpegError(node.loc, f"node {node.id} has unknown kind '{node.kind}'; use one of {', '.join(NODE_KINDS)}")
    if node.alloc is None:  # the verifier pool, on the host (check_pool_transfers allowed no other)
        for d in node.shares:
            if not 0 <= d < cluster.gpus:
                raise RpegError(node.loc, f"node {node.id} shares device {d}, which is not one of the first node's "
                                          f"{cluster.gpus} devices of cluster {cluster.name}; share one of "
                                          f"0..{cluster.gpus - 1}")
        return device_mask((pool_device(cluster), *node.shares))
    _check_alloc(node, node.alloc, cluster)
    return alloc_mask(node.alloc, cluster)


def rank_group(node: ExecNode, index: int) -> tuple:
    """Phase sub-nodes of one generation chain (same vertex and step) share the chain head's rank."""
    if node.kind == "op" and node.role == "generation" and node.phase is not None:
        return ("chain", node.vertex, node.step)
    return ("node", index)


def schedule_exec(graph: ExecGraph, cluster: Cluster) -> Schedule:
    """Run Alg. 5 on an annotated exec graph; node i of the result is `graph.nodes[i]`. The members of a fusion are
    one unit of the schedule (they run together on the same devices, for the fusion's time): the first stands for
    all, their edges are its edges, and the others get its start and finish."""
    check_pool_transfers(graph)
    head = {m: f.members[0] for f in graph.fusions for m in f.members}
    units = [n for n in graph.nodes if head.get(n.id, n.id) == n.id]
    sched = _schedule_units(graph, units, head, cluster)
    if len(units) == len(graph.nodes):
        return sched
    unit = {n.id: i for i, n in enumerate(units)}
    at = [unit[head.get(n.id, n.id)] for n in graph.nodes]
    members: list[list[int]] = [[] for _ in units]
    for i, u in enumerate(at):
        members[u].append(i)
    return replace(sched, start=tuple(sched.start[u] for u in at), finish=tuple(sched.finish[u] for u in at),
                   order=tuple(i for u in sched.order for i in members[u]))


def _schedule_units(graph: ExecGraph, nodes: list[ExecNode], head: dict[str, str], cluster: Cluster) -> Schedule:
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.id in index:
            raise RpegError(node.loc, f"node id {node.id} is used twice; give every exec node a unique id")
        index[node.id] = i
        if node.time is None:
            raise RpegError(
                node.loc, f"node {node.id} has no time; run annotate-cost before schedule (or give it `time = ...`)"
            )
        if not (math.isfinite(node.time) and node.time >= 0.0):
            raise RpegError(node.loc, f"node {node.id} has time {node.time}; times must be finite and non-negative")
    edges = []
    for e in graph.edges:
        src, dst = head.get(e.src, e.src), head.get(e.dst, e.dst)
        for end in (src, dst):
            if end not in index:
                raise RpegError(
                    e.loc, f"edge {e.src} -> {e.dst} refers to unknown node {end}; declare it or remove the edge"
                )
        if src != dst:
            edges.append((index[src], index[dst]))
    return greedy_schedule(
        times=[n.time for n in nodes],
        is_transfer=[n.kind != "op" for n in nodes],
        reserved=[_reserved_mask(n, cluster) for n in nodes],
        edges=edges,
        groups=[rank_group(n, i) for i, n in enumerate(nodes)],
        order_keys=[(n.step, n.order) for n in nodes],
        names=[n.id for n in nodes],
        devices=cluster.num_devices,
    )


def schedule_program(p: Program) -> Program:
    """Return `p` with start/finish on every exec node and `exec.schedule` filled in."""
    if p.exec is None:
        raise RpegError(None, "the module has no executable graph; run unroll and the lowering passes before schedule")
    if p.cluster is None:
        raise RpegError(p.exec.loc, "the module has no cluster; declare `rpeg.cluster` so devices can be reserved")
    graph = p.exec
    if not graph.nodes:
        raise RpegError(graph.loc, "the executable graph has no nodes; nothing to schedule")
    sched = schedule_exec(graph, p.cluster)
    if sched.makespan <= 0.0:
        raise RpegError(graph.loc, "every node has time 0, so the makespan is 0; run annotate-cost before schedule")
    w = p.workload
    raw = score(sched.makespan, graph.steps, w.B, w.R, w.Lp, w.Lr)
    r_peak = graph.memory.r_peak if graph.memory is not None else 1.0
    report = ScheduleReport(
        makespan=sched.makespan,
        score=raw,
        score_pen=score_pen(raw, r_peak),
        util=utilization(sched.busy, p.cluster.num_devices, sched.makespan),
        p_eff=p_eff(sched.op_time, sched.makespan),
    )
    nodes = tuple(
        n.with_(start=sched.start[i], finish=sched.finish[i]) for i, n in enumerate(graph.nodes)
    )
    return replace(p, exec=replace(graph, nodes=nodes, schedule=report))
