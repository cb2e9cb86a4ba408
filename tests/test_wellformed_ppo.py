"""The PPO and GRPO graphs of App. A-D built as dataclasses (Tables VII-IX), and that they are well-formed.

Other test files import `ppo_program`, `grpo_program` and the small edit helpers from here, so every
declaration carries its own source line: a test can assert exactly where an error points.
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.errors import Loc
from rpegc.core.expr import BinOp, Num, Sym
from rpegc.core.plan_rules import check_plan
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
from rpegc.core.wellformed import check_graph, topological_order

FILE = "ppo.rpeg"


def loc(line: int) -> Loc:
    return Loc(FILE, line, 1)


def _mul(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = BinOp("*", out, x)
    return out


B, R, LP, LR = Sym("B"), Sym("R"), Sym("Lp"), Sym("Lr")
BR = _mul(B, R)

MODELS = (
    Model("actor", "policy", True, PRESETS["llama2-7b"], "llama2-7b", loc(2)),
    Model("ref", "reference", False, PRESETS["llama2-7b"], "llama2-7b", loc(3)),
    Model("critic", "critic", True, PRESETS["llama2-7b"], "llama2-7b", loc(4)),
    Model("reward", "reward", False, PRESETS["llama2-7b"], "llama2-7b", loc(5)),
)

CONTAINERS = (
    Container("W_actor", "weights", model="actor", loc=loc(10)),
    Container("W_ref", "weights", model="ref", loc=loc(11)),
    Container("W_critic", "weights", model="critic", loc=loc(12)),
    Container("W_reward", "weights", model="reward", loc=loc(13)),
    Container("X", "tokens", (B, LP), loc=loc(14)),
    Container("Y", "tokens", (BR, BinOp("+", LP, LR)), loc=loc(15)),
    Container("logp", "logprobs", (BR, LR), loc=loc(16)),
    Container("ref_logp", "logprobs", (BR, LR), loc=loc(17)),
    Container("r", "rewards", (BR,), loc=loc(18)),
    Container("v", "values", (BR, LR), loc=loc(19)),
)

VERTICES = (
    Vertex("gen", "generation", "actor", ("W_actor", "X"), ("Y", "logp"), loc(30)),
    Vertex("ref_inf", "inference", "ref", ("W_ref", "Y"), ("ref_logp",), loc(31)),
    Vertex("rew_inf", "inference", "reward", ("W_reward", "Y"), ("r",), loc(32)),
    Vertex("val_inf", "inference", "critic", ("W_critic", "Y"), ("v",), loc(33)),
    Vertex("train_actor", "training", "actor", ("W_actor", "Y", "logp", "ref_logp", "r", "v"), ("W_actor",), loc(34)),
    Vertex("train_critic", "training", "critic", ("W_critic", "Y", "ref_logp", "r", "v"), ("W_critic",), loc(35)),
)

DATA_EDGES = (
    Edge("gen", "ref_inf", "Y", loc(40)),
    Edge("gen", "rew_inf", "Y", loc(41)),
    Edge("gen", "val_inf", "Y", loc(42)),
    Edge("ref_inf", "train_actor", "ref_logp", loc(43)),
    Edge("ref_inf", "train_critic", "ref_logp", loc(44)),
    Edge("rew_inf", "train_actor", "r", loc(45)),
    Edge("rew_inf", "train_critic", "r", loc(46)),
    Edge("val_inf", "train_actor", "v", loc(47)),
    Edge("val_inf", "train_critic", "v", loc(48)),
)

PUB_EDGES = (
    Edge("train_actor", "gen", "W_actor", loc(50)),
    Edge("train_critic", "val_inf", "W_critic", loc(51)),
)

PLACEMENTS = (  # on 1 rack x 2 nodes x 4 GPUs, B*R = 256
    Placement("gen", Alloc((0, 0, 0), (1, 1, 4)), Strategy(dp=2, pp=1, tp=2, mb=1), loc(71)),
    Placement("ref_inf", Alloc((0, 1, 0), (1, 1, 4)), Strategy(dp=4, pp=1, tp=1, mb=1), loc(72)),
    Placement("rew_inf", Alloc((0, 1, 0), (1, 1, 4)), Strategy(dp=1, pp=2, tp=2, mb=4), loc(73)),
    Placement("val_inf", Alloc((0, 1, 0), (1, 1, 4)), Strategy(dp=2, pp=2, tp=1, mb=2), loc(74)),
    Placement("train_actor", Alloc((0, 0, 0), (1, 2, 4)), Strategy(dp=2, pp=2, tp=2, mb=4), loc(75)),
    Placement("train_critic", Alloc((0, 0, 0), (1, 2, 4)), Strategy(dp=8, pp=1, tp=1, mb=1), loc(76)),
)


def ppo_program() -> Program:
    graph = Graph(
        name="ppo",
        containers=CONTAINERS,
        inputs=("X", "W_ref", "W_reward"),
        outputs=(),
        vertices=VERTICES,
        data_edges=DATA_EDGES,
        pub_edges=PUB_EDGES,
        staleness=(("actor", 1), ("critic", 0)),
        quantiles=(Quantile(0.5, BinOp("/", LR, Num(2)), loc(61)), Quantile(1.0, LR, loc(62))),
        loc=loc(8),
        staleness_loc=loc(55),
        quantiles_loc=loc(60),
    )
    return Program(
        workload=Workload(B=64, R=4, Lp=128, Lr=256, loc=loc(1)),
        models=MODELS,
        graph=graph,
        cluster=Cluster("c", 1, 2, 4, "gh200", loc(65)),
        plan=Plan("p", "ppo", "c", PLACEMENTS, loc(70)),
        file=FILE,
    )


def grpo_program() -> Program:
    """GRPO: PPO without the critic (no value inference, no critic training)."""
    p = ppo_program()
    g = p.graph
    keep = {"gen", "ref_inf", "rew_inf", "train_actor"}
    actor_train = Vertex("train_actor", "training", "actor", ("W_actor", "Y", "logp", "ref_logp", "r"),
                         ("W_actor",), loc(34))
    graph = replace(
        g,
        name="grpo",
        containers=tuple(c for c in g.containers if c.name not in ("W_critic", "v")),
        vertices=tuple(actor_train if v.name == "train_actor" else v for v in g.vertices if v.name in keep),
        data_edges=tuple(e for e in g.data_edges if e.src in keep and e.dst in keep),
        pub_edges=tuple(e for e in g.pub_edges if e.src in keep),
        staleness=(("actor", 1),),
    )
    plan = replace(p.plan, graph="grpo", placements=tuple(pl for pl in p.plan.placements if pl.vertex in keep))
    return replace(p, models=tuple(m for m in p.models if m.name != "critic"), graph=graph, plan=plan)


# --- edit helpers for the tests ----------------------------------------------------------------


def with_graph(p: Program, **changes) -> Program:
    return replace(p, graph=replace(p.graph, **changes))


def with_vertex(p: Program, name: str, **changes) -> Program:
    return with_graph(p, vertices=tuple(replace(v, **changes) if v.name == name else v for v in p.graph.vertices))


def with_model(p: Program, name: str, **changes) -> Program:
    return replace(p, models=tuple(replace(m, **changes) if m.name == name else m for m in p.models))


def messages(errors) -> list[str]:
    return [e.message for e in errors]


# --- tests -------------------------------------------------------------------------------------


def test_ppo_and_grpo_are_wellformed_and_their_plans_legal():
    for p in (ppo_program(), grpo_program()):
        assert check_graph(p) == []
        assert check_plan(p) == []


def test_ppo_topological_order_follows_data_edges_then_declaration_order():
    assert topological_order(ppo_program().graph) == [
        "gen", "ref_inf", "rew_inf", "val_inf", "train_actor", "train_critic"
    ]
    assert topological_order(grpo_program().graph) == ["gen", "ref_inf", "rew_inf", "train_actor"]


def test_publication_edges_do_not_constrain_the_topological_order():
    # train_actor -> gen is a publication edge (next step), so gen still comes first.
    order = topological_order(ppo_program().graph)
    assert order.index("gen") < order.index("train_actor")
