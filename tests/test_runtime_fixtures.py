"""Hand-built programs for the runtime and JSON-form tests: a PPO-shaped graph lowered by the core
passes (unroll, split-quantiles, insert-comm, insert-reshard), synthetic node times, Alg. 5 schedule.

The cost model is not used on purpose: these tests exercise the runtime, whose only input from
annotate-cost is the per-node `time`.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Optional

from rpegc.core.comm import insert_comm
from rpegc.core.exec_graph import ExecGraph
from rpegc.core.expr import BinOp, Num, Sym
from rpegc.core.presets import PRESETS
from rpegc.core.program import (
    Alloc,
    Cluster,
    Container,
    Edge,
    Graph,
    Model,
    Placement,
    Plan,
    Program,
    Quantile,
    Strategy,
    Vertex,
    Workload,
)
from rpegc.core.quantiles import split_quantiles
from rpegc.core.reshard import insert_reshard
from rpegc.core.schedule_program import schedule_program
from rpegc.core.unroll import unroll

VERTICES = ("gen", "ref_inf", "critic_inf", "reward_inf", "train_actor", "train_critic")


def ppo_graph(tau_actor: int = 0, tau_critic: int = 0, quantiles: bool = False) -> Graph:
    B, R, Lp, Lr = Sym("B"), Sym("R"), Sym("Lp"), Sym("Lr")
    BR = BinOp("*", B, R)
    c = [
        Container("X", "tokens", (B, Lp)),
        Container("Y", "tokens", (BR, BinOp("+", Lp, Lr))),
        Container("logp", "logprobs", (BR, Lr)),
        Container("ref_logp", "logprobs", (BR, Lr)),
        Container("values", "values", (BR, Lr)),
        Container("rewards", "rewards", (BR,), bytes_per_elem=4),
        Container("W_actor", "weights", model="actor"),
        Container("W_ref", "weights", model="ref"),
        Container("W_critic", "weights", model="critic"),
        Container("W_reward", "weights", model="reward"),
    ]
    v = [
        Vertex("gen", "generation", "actor", ("W_actor", "X"), ("Y", "logp")),
        Vertex("ref_inf", "inference", "ref", ("W_ref", "Y"), ("ref_logp",)),
        Vertex("critic_inf", "inference", "critic", ("W_critic", "Y"), ("values",)),
        Vertex("reward_inf", "inference", "reward", ("W_reward", "Y"), ("rewards",)),
        Vertex("train_actor", "training", "actor",
               ("W_actor", "Y", "logp", "ref_logp", "values", "rewards"), ("W_actor",)),
        Vertex("train_critic", "training", "critic", ("W_critic", "Y", "values", "rewards"), ("W_critic",)),
    ]
    d = [
        Edge("gen", "ref_inf", "Y"), Edge("gen", "critic_inf", "Y"), Edge("gen", "reward_inf", "Y"),
        Edge("gen", "train_actor", "Y"), Edge("gen", "train_actor", "logp"),
        Edge("ref_inf", "train_actor", "ref_logp"), Edge("critic_inf", "train_actor", "values"),
        Edge("reward_inf", "train_actor", "rewards"), Edge("gen", "train_critic", "Y"),
        Edge("critic_inf", "train_critic", "values"), Edge("reward_inf", "train_critic", "rewards"),
    ]
    pub = [Edge("train_actor", "gen", "W_actor"), Edge("train_critic", "critic_inf", "W_critic")]
    q = ()
    if quantiles:
        q = (Quantile(0.5, BinOp("/", Lr, Num(4))), Quantile(0.85, BinOp("/", Lr, Num(2))), Quantile(1.0, Lr))
    return Graph(
        name="ppo", containers=tuple(c), inputs=("X", "W_ref", "W_reward"), outputs=(),
        vertices=tuple(v), data_edges=tuple(d), pub_edges=tuple(pub),
        staleness=(("actor", tau_actor), ("critic", tau_critic)), quantiles=q,
    )


def ppo_models() -> tuple[Model, ...]:
    tiny = PRESETS["tiny"]
    return (
        Model("actor", "policy", True, tiny, preset="tiny"),
        Model("ref", "reference", False, tiny, preset="tiny"),
        Model("critic", "critic", True, tiny, preset="tiny"),
        Model("reward", "reward", False, tiny, preset="tiny"),
    )


def ppo_program(
    placements: dict[str, tuple[tuple[int, int, int], tuple[int, int, int], Strategy]],
    cluster: Cluster,
    tau_actor: int = 0,
    tau_critic: int = 0,
    quantiles: bool = False,
) -> Program:
    plan = Plan("p", "ppo", cluster.name, tuple(
        Placement(name, Alloc(o, e), s) for name, (o, e, s) in placements.items()
    ))
    return Program(
        workload=Workload(B=64, R=2, Lp=32, Lr=96),
        models=ppo_models(),
        graph=ppo_graph(tau_actor, tau_critic, quantiles),
        cluster=cluster,
        plan=plan,
    )


def lower(p: Program, k: int) -> Program:
    return insert_reshard(insert_comm(split_quantiles(unroll(p, k))))


def synthetic_time(node_id: str, kind: str, nbytes: int, fraction: Optional[float], zero_every: int = 0) -> float:
    """A deterministic pseudo-random duration per node (seconds); some transfers may take 0 s."""
    h = int(hashlib.sha256(node_id.encode()).hexdigest()[:8], 16)
    if zero_every and kind != "op" and h % zero_every == 0:
        return 0.0
    if kind == "op":
        t = 1.0 + (h % 1000) / 250.0
        return t * (fraction if fraction is not None else 1.0)
    return 0.01 + nbytes * 1e-9 + (h % 100) / 1000.0


def annotate(p: Program, zero_every: int = 0) -> Program:
    g = p.exec
    nodes = tuple(n.with_(time=synthetic_time(n.id, n.kind, n.bytes, n.fraction, zero_every)) for n in g.nodes)
    return replace(p, exec=replace(g, nodes=nodes))


def scheduled(p: Program, k: int, zero_every: int = 0) -> Program:
    return schedule_program(annotate(lower(p, k), zero_every))


S = Strategy


def colocated_plan(tau: int = 0) -> Program:
    """Everything on one 8-GPU node; the actor's serving and training layouts differ (Reshards)."""
    cl = Cluster("c8", 1, 1, 8, "gh200")
    all8 = ((0, 0, 0), (1, 1, 8))
    return ppo_program({
        "gen": (*all8, S(8, 1, 1, 1)),
        "ref_inf": (*all8, S(8, 1, 1, 1)),
        "critic_inf": (*all8, S(4, 1, 2, 1)),
        "reward_inf": (*all8, S(8, 1, 1, 1)),
        "train_actor": (*all8, S(4, 1, 2, 1)),
        "train_critic": (*all8, S(4, 1, 2, 1)),
    }, cl, tau_actor=tau, tau_critic=tau)


def disaggregated_plan(tau: int = 1, quantiles: bool = True) -> Program:
    """Generation, inference and training on disjoint GPUs of a 2 x 2 x 4 cluster (Comm nodes, phases)."""
    cl = Cluster("c16", 2, 2, 4, "gh200")
    return ppo_program({
        "gen": ((0, 0, 0), (1, 1, 4), S(4, 1, 1, 1)),
        "ref_inf": ((0, 1, 0), (1, 1, 2), S(2, 1, 1, 1)),
        "critic_inf": ((0, 1, 2), (1, 1, 2), S(2, 1, 1, 1)),
        "reward_inf": ((0, 1, 2), (1, 1, 2), S(1, 1, 2, 1)),
        "train_actor": ((1, 0, 0), (1, 1, 4), S(2, 1, 2, 1)),
        "train_critic": ((1, 1, 0), (1, 1, 4), S(4, 1, 1, 1)),
    }, cl, tau_actor=tau, tau_critic=0, quantiles=quantiles)


def big_plan(k: int = 8) -> Program:
    """2,048 GPUs (16 racks x 32 nodes x 4 GPUs): large allocations, asynchronous actor."""
    cl = Cluster("c2048", 16, 32, 4, "gh200")
    return ppo_program({
        "gen": ((0, 0, 0), (8, 32, 4), S(512, 1, 2, 1)),
        "ref_inf": ((8, 0, 0), (2, 32, 4), S(128, 1, 2, 1)),
        "critic_inf": ((10, 0, 0), (2, 32, 4), S(128, 1, 2, 1)),
        "reward_inf": ((10, 0, 0), (2, 32, 4), S(64, 1, 4, 1)),
        "train_actor": ((12, 0, 0), (2, 32, 4), S(64, 2, 2, 2)),
        "train_critic": ((14, 0, 0), (2, 32, 4), S(64, 2, 2, 2)),
    }, cl, tau_actor=1, tau_critic=1, quantiles=True)


def random_program(
    kinds: list[str],
    allocs: list[tuple[int, int, int, int]],
    times: list[float],
    edges: list[tuple[int, int]],
    steps: list[int],
) -> Program:
    """A lowered exec graph drawn by hypothesis: Op nodes of unconnected vertices, weight Comm and
    Reshard nodes moving version 0 of a frozen model, arbitrary dependency edges (i < j), times
    that may be 0. Node i has allocation (0, n, g) extent (1, en, eg) from `allocs[i]`."""
    from rpegc.core.exec_graph import ExecEdge, ExecNode

    cl = Cluster("c8", 1, 2, 4, "gh200")
    count = len(kinds)
    vertices = tuple(Vertex(f"v{i}", "inference", "m", ("W_m",), ()) for i in range(count))
    graph = Graph("g", (Container("W_m", "weights", model="m"),), (), (), vertices, (), ())
    nodes = []
    for i, kind in enumerate(kinds):
        n0, g0, en, eg = allocs[i]
        alloc = Alloc((0, n0, g0), (1, en, eg))
        src = Alloc((0, 1 - n0 if en == 1 else 0, 0), (1, 1, 4))
        if kind == "op":
            nodes.append(ExecNode(f"v{i}#{steps[i]}", "op", steps[i], i, vertex=f"v{i}", role="inference",
                                  model="m", alloc=alloc, strategy=Strategy(en * eg, 1, 1, 1),
                                  version_in=(("m", 0),), time=times[i]))
        else:
            nodes.append(ExecNode(f"x{i}", kind, steps[i], i, model="m", alloc=alloc,
                                  src_alloc=alloc if kind == "reshard" else src, bytes=1000,
                                  version_in=(("m", 0),), time=times[i]))
    exec_graph = ExecGraph("g", max(steps) + 1, tuple(nodes),
                           tuple(ExecEdge(nodes[a].id, nodes[b].id) for a, b in edges), lowered=True)
    p = Program(Workload(8, 1, 16, 16), (Model("m", "reference", False, PRESETS["tiny"], "tiny"),),
                graph=graph, cluster=cl, exec=exec_graph)
    return schedule_program(p)
