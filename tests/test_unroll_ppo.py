"""Unrolling the PPO RPEG (App. A-F, Alg. 3): Fig. 15 and Fig. 16 a-c, versions, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.program import Edge, Vertex
from rpegc.core.lower.unroll import consumed_version, publisher_step, unroll
from fixtures.lowering import ORDER, colocated, edge_set, gpus, is_acyclic, ppo_graph, ppo_program, strat

VERTEX_NAMES = list(ORDER)


def test_fig15_two_synchronous_steps():
    g = unroll(ppo_program(), 2).exec
    assert g.steps == 2 and g.graph == "ppo"
    assert [n.id for n in g.nodes] == [f"{v}#{k}" for k in range(2) for v in VERTEX_NAMES]
    assert all(n.kind == "op" for n in g.nodes)
    assert len([e for e in g.edges if e.kind == "data"]) == 18
    assert edge_set(g, "pub") == {("train_actor#0", "gen#1"), ("train_critic#0", "critic_inf#1")}
    assert edge_set(g, "order") == {("train_actor#0", "train_actor#1"), ("train_critic#0", "train_critic#1")}
    assert len(g.edges) == 18 + 2 + 2
    assert ("gen#1", "ref_inf#1") in edge_set(g, "data")
    pubs = {(e.src, e.dst): e.container for e in g.edges if e.kind == "pub"}
    assert pubs[("train_actor#0", "gen#1")] == "W_actor"


def _pubs(staleness, k=4):
    return edge_set(unroll(ppo_program(staleness=staleness), k).exec, "pub")


def test_fig16a_synchronous_publication_connects_consecutive_steps():
    assert _pubs({}) == {
        *{(f"train_actor#{k - 1}", f"gen#{k}") for k in (1, 2, 3)},
        *{(f"train_critic#{k - 1}", f"critic_inf#{k}") for k in (1, 2, 3)},
    }


def test_fig16b_one_step_actor_staleness():
    assert _pubs({"actor": 1}) == {
        ("train_actor#0", "gen#2"),
        ("train_actor#1", "gen#3"),
        *{(f"train_critic#{k - 1}", f"critic_inf#{k}") for k in (1, 2, 3)},
    }


def test_fig16c_two_step_actor_one_step_critic():
    assert _pubs({"actor": 2, "critic": 1}) == {
        ("train_actor#0", "gen#3"),
        ("train_critic#0", "critic_inf#2"),
        ("train_critic#1", "critic_inf#3"),
    }


def test_ordered_updates_do_not_depend_on_staleness():
    g = unroll(ppo_program(staleness={"actor": 3, "critic": 2}), 3).exec
    assert edge_set(g, "order") == {
        ("train_actor#0", "train_actor#1"),
        ("train_actor#1", "train_actor#2"),
        ("train_critic#0", "train_critic#1"),
        ("train_critic#1", "train_critic#2"),
    }


def test_versions_read_and_produced():
    g = unroll(ppo_program(staleness={"actor": 1}), 3).exec
    assert [dict(g.node(f"gen#{k}").version_in) for k in range(3)] == [{"actor": 0}, {"actor": 0}, {"actor": 1}]
    assert [dict(g.node(f"critic_inf#{k}").version_in) for k in range(3)] == [{"critic": k} for k in range(3)]
    assert dict(g.node("ref_inf#2").version_in) == {"ref": 0}  # frozen models stay at version 0
    # A training op reads the version its predecessor produced, whatever the budget.
    assert [dict(g.node(f"train_actor#{k}").version_in) for k in range(3)] == [{"actor": k} for k in range(3)]
    assert [g.node(f"train_actor#{k}").version_out for k in range(3)] == [(("actor", k + 1),) for k in range(3)]
    assert g.node("gen#1").version_out == () and g.node("ref_inf#1").version_out == ()


def test_publisher_version_matches_consumer_version():
    """The producer of a pub edge makes exactly the version the consumer reads (s_m(k) + 1 = k - tau)."""
    for tau in range(4):
        g = unroll(ppo_program(staleness={"actor": tau}), 6).exec
        for e in g.edges:
            if e.kind == "pub" and e.dst.startswith("gen"):
                assert dict(g.node(e.src).version_out)["actor"] == dict(g.node(e.dst).version_in)["actor"]


def test_publisher_selection_function():
    assert [publisher_step(k, 0) for k in range(4)] == [None, 0, 1, 2]
    assert [publisher_step(k, 2) for k in range(5)] == [None, None, None, 0, 1]
    assert [consumed_version(k, 2) for k in range(5)] == [0, 0, 0, 1, 2]


def test_plan_attributes_are_copied_to_ops():
    placements = colocated(gpus(0, 1, 2, 3), strat(dp=2, tp=2, mb=4))
    g = unroll(ppo_program(placements), 2).exec
    assert all(n.alloc == gpus(0, 1, 2, 3) and n.strategy == strat(dp=2, tp=2, mb=4) for n in g.nodes)
    assert all(n.alloc is None and n.strategy is None for n in unroll(ppo_program(), 2).exec.nodes)


def test_ops_carry_role_model_order():
    g = unroll(ppo_program(), 1).exec
    n = g.node("critic_inf#0")
    assert (n.vertex, n.role, n.model, n.order, n.step) == ("critic_inf", "inference", "critic", 3, 0)


def test_order_is_topological_with_declaration_tie_break():
    """Vertices declared out of dependency order still get a topological index."""
    g = ppo_graph()
    reversed_graph = replace(g, vertices=tuple(reversed(g.vertices)))
    ex = unroll(replace(ppo_program(), graph=reversed_graph), 1).exec
    order = {n.vertex: n.order for n in ex.nodes}
    assert all(order[e.src] < order[e.dst] for e in g.data_edges)
    # Independent vertices keep declaration order: reversed here, so critic_inf comes first.
    assert order["critic_inf"] < order["reward_inf"] < order["ref_inf"]
    assert order["train_critic"] < order["train_actor"]


def test_unrolled_graph_is_acyclic():
    g = unroll(ppo_program(staleness={"actor": 1}), 5).exec
    assert is_acyclic([n.id for n in g.nodes], edge_set(g))


def test_k_must_be_positive():
    graph_loc = Loc("ppo.rpeg", 3, 1)
    p = ppo_program()
    p = replace(p, graph=replace(p.graph, loc=graph_loc))
    with pytest.raises(RpegError, match="K_eval >= 1") as err:
        unroll(p, 0)
    assert err.value.loc == graph_loc


def test_unrolling_twice_is_an_error():
    with pytest.raises(RpegError, match="already unrolled"):
        unroll(unroll(ppo_program(), 2), 2)


def test_missing_graph_and_missing_placement():
    with pytest.raises(RpegError, match="no rpeg.graph"):
        unroll(replace(ppo_program(), graph=None), 1)
    placements = colocated()
    del placements["ref_inf"]
    with pytest.raises(RpegError, match="no placement for vertex @ref_inf"):
        unroll(ppo_program(placements), 1)


def test_cyclic_data_edges_are_reported():
    g = ppo_graph()
    cyclic = replace(g, data_edges=g.data_edges + (Edge("train_actor", "gen", "W_actor"),))
    with pytest.raises(RpegError, match="form a cycle"):
        unroll(replace(ppo_program(), graph=cyclic), 1)


def test_unknown_vertex_in_edges_is_reported():
    g = ppo_graph()
    bad = replace(g, pub_edges=g.pub_edges + (Edge("nope", "gen", "W_actor", loc=Loc("f", 9, 2)),))
    with pytest.raises(RpegError, match="unknown vertex '@nope'") as err:
        unroll(replace(ppo_program(), graph=bad), 2)
    assert err.value.loc == Loc("f", 9, 2)


def test_negative_staleness_is_rejected():
    with pytest.raises(RpegError, match=">= 0"):
        unroll(ppo_program(staleness={"actor": -1}), 2)


def test_unknown_model_of_vertex_is_reported():
    g = ppo_graph()
    bad = replace(g, vertices=g.vertices + (Vertex("extra", "inference", "ghost", (), ()),))
    with pytest.raises(RpegError, match="unknown model '@ghost'"):
        unroll(replace(ppo_program(), graph=bad), 1)


def test_single_step_has_no_publication_or_order_edges():
    g = unroll(ppo_program(), 1).exec
    assert {e.kind for e in g.edges} == {"data"} and len(g.edges) == 9
