"""Builders shared by the unroll and lowering tests: the PPO RPEG of App. A-D as plain dataclasses,
plans on a single node, small graph utilities, and hypothesis strategies for random well-formed
graphs with random plans. Two tests pin the PPO builder and the cycle check themselves."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional

from hypothesis import strategies as st

from rpegc.core.exec_graph import ExecGraph, ExecNode
from rpegc.core.expr import BinOp, Num, Sym
from rpegc.core.params import param_count
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
from rpegc.core.wellformed import check_graph

WORKLOAD = Workload(B=8, R=2, Lp=4, Lr=12, dtype="bf16")
CLUSTER = Cluster("c", racks=1, nodes=1, gpus=8, hardware="h100")
B, R, LP, LR = Sym("B"), Sym("R"), Sym("Lp"), Sym("Lr")
BR = BinOp("*", B, R)

MODELS = (
    Model("actor", "policy", True, PRESETS["tiny"]),
    Model("ref", "reference", False, PRESETS["tiny"]),
    Model("critic", "critic", True, PRESETS["tiny-4l"]),
    Model("reward", "reward", False, PRESETS["tiny-4l"]),
)

CONTAINERS = (
    Container("W_actor", "weights", model="actor"),
    Container("W_ref", "weights", model="ref"),
    Container("W_critic", "weights", model="critic"),
    Container("W_reward", "weights", model="reward"),
    Container("X", "tokens", (B, LP)),
    Container("Y", "tokens", (BR, BinOp("+", LP, LR))),
    Container("logp", "logprobs", (BR, LR)),
    Container("ref_logp", "logprobs", (BR, LR)),
    Container("r", "rewards", (BR,)),
    Container("v", "values", (BR, LR)),
)

VERTICES = (
    Vertex("gen", "generation", "actor", ("W_actor", "X"), ("Y", "logp")),
    Vertex("ref_inf", "inference", "ref", ("W_ref", "Y"), ("ref_logp",)),
    Vertex("reward_inf", "inference", "reward", ("W_reward", "Y"), ("r",)),
    Vertex("critic_inf", "inference", "critic", ("W_critic", "Y"), ("v",)),
    Vertex("train_actor", "training", "actor", ("W_actor", "Y", "logp", "ref_logp", "r", "v"), ("W_actor",)),
    Vertex("train_critic", "training", "critic", ("W_critic", "Y", "ref_logp", "r", "v"), ("W_critic",)),
)

DATA_EDGES = (
    Edge("gen", "ref_inf", "Y"),
    Edge("gen", "reward_inf", "Y"),
    Edge("gen", "critic_inf", "Y"),
    Edge("ref_inf", "train_actor", "ref_logp"),
    Edge("ref_inf", "train_critic", "ref_logp"),
    Edge("reward_inf", "train_actor", "r"),
    Edge("reward_inf", "train_critic", "r"),
    Edge("critic_inf", "train_actor", "v"),
    Edge("critic_inf", "train_critic", "v"),
)
PUB_EDGES = (Edge("train_actor", "gen", "W_actor"), Edge("train_critic", "critic_inf", "W_critic"))

ORDER = {"gen": 0, "ref_inf": 1, "reward_inf": 2, "critic_inf": 3, "train_actor": 4, "train_critic": 5}


def ppo_graph(staleness: dict[str, int] | None = None, quantiles: Iterable[tuple[float, int]] = ()) -> Graph:
    return Graph(
        name="ppo",
        containers=CONTAINERS,
        inputs=("X", "W_ref", "W_reward"),
        outputs=(),
        vertices=VERTICES,
        data_edges=DATA_EDGES,
        pub_edges=PUB_EDGES,
        staleness=tuple((staleness or {}).items()),
        quantiles=tuple(Quantile(f, Num(t)) for f, t in quantiles),
    )


def gpus(*ids: int) -> Alloc:
    """A contiguous range of GPUs of the single node of CLUSTER."""
    assert list(ids) == list(range(ids[0], ids[0] + len(ids)))
    return Alloc((0, 0, ids[0]), (1, 1, len(ids)))


def strat(dp: int = 1, pp: int = 1, tp: int = 1, mb: int = 1) -> Strategy:
    return Strategy(dp, pp, tp, mb)


def plan_of(placements: dict[str, tuple[Alloc, Strategy]]) -> Plan:
    return Plan("p", "ppo", "c", tuple(Placement(v, a, s) for v, (a, s) in placements.items()))


def ppo_program(
    placements: Optional[dict[str, tuple[Alloc, Strategy]]] = None,
    staleness: dict[str, int] | None = None,
    quantiles: Iterable[tuple[float, int]] = (),
) -> Program:
    plan = plan_of(placements) if placements is not None else None
    return Program(WORKLOAD, MODELS, ppo_graph(staleness, quantiles), CLUSTER, plan)


def colocated(alloc: Alloc = None, s: Strategy = None) -> dict[str, tuple[Alloc, Strategy]]:
    """Every PPO vertex on the same devices with the same layout."""
    return {v.name: (alloc or gpus(0, 1), s or strat(dp=2)) for v in VERTICES}


def weight_bytes_of(model: str) -> int:
    m = next(m for m in MODELS if m.name == model)
    return param_count(m.arch, m.kind) * WORKLOAD.s_b


def node(g: ExecGraph, node_id: str) -> ExecNode:
    return g.node(node_id)


def edge_set(g: ExecGraph, kind: str | None = None) -> set[tuple[str, str]]:
    return {(e.src, e.dst) for e in g.edges if kind is None or e.kind == kind}


def succs(g: ExecGraph, node_id: str) -> set[str]:
    return {e.dst for e in g.edges if e.src == node_id}


def preds(g: ExecGraph, node_id: str) -> set[str]:
    return {e.src for e in g.edges if e.dst == node_id}


def is_acyclic(node_ids: Iterable[str], edges: Iterable[tuple[str, str]]) -> bool:
    ids = list(node_ids)
    indegree = {n: 0 for n in ids}
    out: dict[str, list[str]] = {n: [] for n in ids}
    for s, d in edges:
        out[s].append(d)
        indegree[d] += 1
    ready = [n for n in ids if indegree[n] == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for d in out[n]:
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    return seen == len(ids)


def with_plan(p: Program, placements: dict[str, tuple[Alloc, Strategy]]) -> Program:
    return replace(p, plan=plan_of(placements))


# The builder matches App. A-D: 6 vertices, 9 data edges, 2 publication edges, 4 models (2 trainable).
def test_ppo_builder_matches_appendix_d():
    g = ppo_graph()
    assert len(g.vertices) == 6 and len(g.data_edges) == 9 and len(g.pub_edges) == 2
    assert {m.name for m in MODELS if m.trainable} == {"actor", "critic"}
    assert not any(e.src == "gen" and e.dst.startswith("train") for e in g.data_edges)


def test_is_acyclic_detects_cycles():
    assert is_acyclic("abc", [("a", "b"), ("b", "c")])
    assert not is_acyclic("abc", [("a", "b"), ("b", "c"), ("c", "a")])


# --- Hypothesis strategies: random well-formed graphs, plans and staleness maps ---------------

# Data container shapes with their element counts under WORKLOAD, computed by hand.
_W = WORKLOAD
DATA_SHAPES = (
    ((B, LP), _W.B * _W.Lp),
    ((BR, BinOp("+", LP, LR)), _W.B * _W.R * (_W.Lp + _W.Lr)),
    ((BR, LR), _W.B * _W.R * _W.Lr),
    ((BR,), _W.B * _W.R),
)
RANDOM_CLUSTER = Cluster("c", racks=1, nodes=2, gpus=4, hardware="h100")
LAYOUTS = ((1, 1, 1), (2, 1, 1), (1, 1, 2), (1, 2, 1), (2, 1, 2))
QUANTILE_SETS = ((), ((1.0, 12),), ((0.5, 6), (1.0, 12)), ((0.2, 3), (0.55, 7), (1.0, 12)))
_INFERENCE_MODELS = ("actor", "critic", "ref", "reward")
_MODEL_OF = {m.name: m for m in MODELS}


@st.composite
def random_allocs(draw) -> Alloc:
    n0 = draw(st.integers(0, RANDOM_CLUSTER.nodes - 1))
    g0 = draw(st.integers(0, RANDOM_CLUSTER.gpus - 1))
    en = draw(st.integers(1, RANDOM_CLUSTER.nodes - n0))
    eg = draw(st.integers(1, RANDOM_CLUSTER.gpus - g0))
    return Alloc((0, n0, g0), (1, en, eg))


@st.composite
def random_strategies(draw) -> Strategy:
    dp, pp, tp = draw(st.sampled_from(LAYOUTS))
    return Strategy(dp, pp, tp, draw(st.integers(1, 4)))


@st.composite
def random_programs(draw, with_plan: bool = True) -> tuple[Program, dict[str, int]]:
    """A well-formed RPEG (checked with check_graph) with a random plan, tau map and quantiles.

    Returns the program and the element count of every data container (computed independently)."""
    n_front = draw(st.integers(1, 5))
    front = []
    for i in range(n_front):
        role = draw(st.sampled_from(("generation", "inference")))
        model = "actor" if role == "generation" else draw(st.sampled_from(_INFERENCE_MODELS))
        front.append((f"v{i}", role, model))
    used_trainable = sorted({m for _, _, m in front if _MODEL_OF[m].trainable})
    extra = [m for m in ("actor", "critic") if m not in used_trainable and draw(st.booleans())]
    trainers = [(f"t_{m}", "training", m) for m in used_trainable + extra]
    names = [v for v, _, _ in front] + [t for t, _, _ in trainers]
    edges = [(names[i], names[j]) for i in range(n_front) for j in range(i + 1, len(names)) if draw(st.booleans())]
    shapes = {f"d_{v}": draw(st.sampled_from(DATA_SHAPES)) for v, _, _ in front}
    reads: dict[str, list[str]] = {}
    writes: dict[str, list[str]] = {}
    for v, role, model in front + trainers:
        reads[v] = [f"W_{model}"] + (["X"] if role == "generation" else [])
        writes[v] = [f"W_{model}"] if role == "training" else [f"d_{v}"]
    for u, v in edges:
        reads[v].append(f"d_{u}")
    vertices = [Vertex(v, role, model, tuple(reads[v]), tuple(writes[v])) for v, role, model in front + trainers]
    vertices = draw(st.permutations(vertices))
    models_used = sorted({m for _, _, m in front + trainers})
    containers = [Container(f"W_{m}", "weights", model=m) for m in models_used]
    containers += [Container("X", "tokens", (B, LP))]
    containers += [Container(name, "values", dims) for name, (dims, _) in shapes.items()]
    read_all = {a for r in reads.values() for a in r}
    written_all = {a for w in writes.values() for a in w}
    graph = Graph(
        name="g",
        containers=tuple(c for c in containers if c.name in read_all | written_all),
        inputs=tuple(sorted(read_all - written_all)),
        outputs=tuple(sorted(written_all - read_all)),
        vertices=tuple(vertices),
        data_edges=tuple(Edge(u, v, f"d_{u}") for u, v in edges),
        pub_edges=tuple(Edge(f"t_{m}", v, f"W_{m}") for v, _, m in front if _MODEL_OF[m].trainable),
        staleness=tuple((m, draw(st.integers(0, 3))) for _, _, m in trainers),
        quantiles=tuple(Quantile(f, Num(t)) for f, t in draw(st.sampled_from(QUANTILE_SETS))),
    )
    plan = None
    if with_plan:
        plan = Plan(
            "p",
            "g",
            "c",
            tuple(Placement(v.name, draw(random_allocs()), draw(random_strategies())) for v in vertices),
        )
    p = Program(WORKLOAD, MODELS, graph, RANDOM_CLUSTER, plan)
    errors = check_graph(p)
    assert not errors, [str(e) for e in errors]
    return p, {name: count for name, (_, count) in shapes.items()}
