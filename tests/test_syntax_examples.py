"""The shipped examples (examples/*.rpeg): they parse, print back to an equal module, are well-formed
(Def. A.2) with legal plans (P1-P8), and PPO is exactly the paper's graph (App. A-D, Tables VII-IX)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpegc.core.ir.expr import BinOp, Num, Sym, evaluate
from rpegc.core.check.plan_rules import check_plan
from rpegc.core.check.wellformed import check_graph
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.rpeg"))  # every example, whoever added it


def test_the_documented_examples_exist():
    assert set(NAMES) >= {"ppo", "ppo-8gpu", "grpo", "dpo", "ppo-ac-shared", "ppo-async"}


def load(name: str):
    path = EXAMPLES / f"{name}.rpeg"
    return parse(path.read_text(), str(path))


@pytest.mark.parametrize("name", NAMES)
def test_example_parses_with_locations(name):
    p = load(name)
    assert p.graph is not None and p.cluster is not None and p.plan is not None
    assert p.file.endswith(f"{name}.rpeg")
    for obj in (p.workload, *p.models, p.graph, *p.graph.vertices, *p.graph.data_edges, *p.plan.placements):
        assert obj.loc.file == p.file and obj.loc.line >= 1 and obj.loc.col >= 1


@pytest.mark.parametrize("name", NAMES)
def test_example_starts_with_two_comment_lines(name):
    lines = (EXAMPLES / f"{name}.rpeg").read_text().splitlines()
    assert lines[0].startswith("// ") and lines[1].startswith("// ")


@pytest.mark.parametrize("name", NAMES)
def test_example_round_trips(name):
    p = load(name)
    text = print_program(p)
    again = parse(text)
    assert again == p
    assert print_program(again) == text  # the canonical form is a fixed point


@pytest.mark.parametrize("name", NAMES)
def test_example_is_wellformed_and_legal(name):
    p = load(name)
    assert [str(e) for e in check_graph(p)] == []
    assert [str(e) for e in check_plan(p)] == []
    placed = {pl.vertex for pl in p.plan.placements} | {pool.vertex for pool in p.plan.pools}
    assert placed == {v.name for v in p.graph.vertices}


@pytest.mark.parametrize("name", ["ppo", "grpo", "ppo-ac-shared"])
def test_64_gpu_plans_use_every_gpu(name):
    p = load(name)
    used = set()
    for pl in p.plan.placements:
        used |= set(pl.alloc.devices(p.cluster))
    assert p.cluster.num_devices == 64 and used == set(range(64))


def test_ppo_is_the_papers_graph():
    p = load("ppo")
    w = p.workload
    assert (w.B, w.R, w.Lp, w.Lr, w.dtype) == (512, 1, 128, 384, "bf16")
    kinds = {m.name: (m.kind, m.trainable, m.preset) for m in p.models}
    assert kinds == {
        "actor": ("policy", True, "llama2-7b"),
        "ref": ("reference", False, "llama2-7b"),
        "critic": ("critic", True, "llama2-7b"),
        "reward": ("reward", False, "llama2-7b"),
    }
    g = p.graph
    interfaces = {v.name: (v.role, v.model, set(v.reads), set(v.writes)) for v in g.vertices}
    assert interfaces == {
        "gen": ("generation", "actor", {"W_actor", "X"}, {"Y", "logp"}),
        "ref_inf": ("inference", "ref", {"W_ref", "Y"}, {"logp_ref"}),
        "reward_inf": ("inference", "reward", {"W_reward", "Y"}, {"r"}),
        "critic_inf": ("inference", "critic", {"W_critic", "Y"}, {"v"}),
        "train_actor": ("training", "actor", {"W_actor", "Y", "logp", "logp_ref", "r", "v"}, {"W_actor"}),
        "train_critic": ("training", "critic", {"W_critic", "Y", "logp_ref", "r", "v"}, {"W_critic"}),
    }
    assert {(e.src, e.dst, e.container) for e in g.data_edges} == {
        ("gen", "ref_inf", "Y"), ("gen", "reward_inf", "Y"), ("gen", "critic_inf", "Y"),
        ("ref_inf", "train_actor", "logp_ref"), ("ref_inf", "train_critic", "logp_ref"),
        ("reward_inf", "train_actor", "r"), ("reward_inf", "train_critic", "r"),
        ("critic_inf", "train_actor", "v"), ("critic_inf", "train_critic", "v"),
    }
    assert len(g.data_edges) == 9
    assert {(e.src, e.dst, e.container) for e in g.pub_edges} == {
        ("train_actor", "gen", "W_actor"), ("train_critic", "critic_inf", "W_critic"),
    }
    assert set(g.inputs) == {"X", "W_ref", "W_reward"} and g.outputs == ()
    assert g.tau("actor") == 0 and g.tau("critic") == 0
    # Table VIII sizes, in elements.
    sizes = {c.name: [evaluate(d, w.env) for d in c.dims] for c in g.containers if not c.is_weights}
    assert sizes == {
        "X": [512, 128], "Y": [512, 512], "logp": [512, 384], "logp_ref": [512, 384], "r": [512], "v": [512, 384],
    }
    assert {c.name: c.model for c in g.containers if c.is_weights} == {
        "W_actor": "actor", "W_critic": "critic", "W_ref": "ref", "W_reward": "reward",
    }
    assert [(q.f, q.tokens) for q in g.quantiles] == [
        (0.5, BinOp("/", Sym("Lr"), Num(4))), (0.85, BinOp("/", Sym("Lr"), Num(2))), (1.0, Sym("Lr")),
    ]
    c = p.cluster
    assert (c.racks, c.nodes, c.gpus, c.hardware) == (2, 8, 4, "gh200")


def test_ppo_variants_share_the_graph():
    base = load("ppo").graph
    assert load("ppo-8gpu").graph == base
    async_graph = load("ppo-async").graph
    assert async_graph.tau("actor") == 1 and async_graph.tau("critic") == 0
    assert async_graph.vertices == base.vertices and async_graph.data_edges == base.data_edges
    assert load("ppo-8gpu").cluster.num_devices == 8


def test_ppo_async_generation_is_disjoint_from_training():
    p = load("ppo-async")
    gen = set(p.plan.placement("gen").alloc.devices(p.cluster))
    for v in p.graph.vertices:
        if v.role == "training":
            assert gen.isdisjoint(p.plan.placement(v.name).alloc.devices(p.cluster))


def test_grpo_dpo_and_shared_shapes():
    grpo = load("grpo")
    assert grpo.workload.R == 8
    assert [v.name for v in grpo.graph.vertices] == ["gen", "ref_inf", "reward_inf", "train_actor"]
    dpo = load("dpo")
    assert all(v.role != "generation" for v in dpo.graph.vertices) and dpo.graph.pub_edges == ()
    shared = load("ppo-ac-shared")
    ac = [m for m in shared.models if m.kind == "actor_critic"]
    assert len(ac) == 1 and ac[0].trainable
    users = {v.name for v in shared.graph.vertices if v.model == ac[0].name}
    assert users == {"gen", "critic_inf", "train_ac"}
    assert {(e.src, e.dst) for e in shared.graph.pub_edges} == {("train_ac", "gen"), ("train_ac", "critic_inf")}

