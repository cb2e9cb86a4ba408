"""Def. A.2 and the extra graph checks: each violation alone, its message and its location."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.expr import BinOp, Num, Sym
from rpegc.core.ir.program import Container, Edge, Graph, Quantile, Vertex
from rpegc.core.check.wellformed import check_graph, topological_order
from fixtures.ppo_source import loc, ppo_program, with_graph, with_model, with_vertex


def only_error(p) -> RpegError:
    errors = check_graph(p)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def edges(p, *extra):
    return p.graph.data_edges + tuple(extra)


# --- (1) interface consistency ----------------------------------------------------------------


def test_data_edge_whose_source_does_not_write_the_container():
    p = ppo_program()
    p = with_graph(p, data_edges=edges(p, Edge("ref_inf", "reward_inf", "Y", loc(90))))
    err = only_error(p)
    assert err.loc == loc(90)
    assert "@ref_inf does not write it (Def. A.2 (1))" in err.message
    assert "add %Y to the writes of @ref_inf" in err.message


def test_data_edge_whose_destination_does_not_read_the_container():
    p = ppo_program()
    p = with_graph(p, data_edges=edges(p, Edge("gen", "train_critic", "logp", loc(90))))
    err = only_error(p)
    assert err.loc == loc(90)
    assert "@train_critic does not read it" in err.message
    assert "add %logp to the reads of @train_critic or remove the edge" in err.message


def test_publication_edge_whose_destination_does_not_read_the_weights():
    p = ppo_program()
    p = with_graph(p, pub_edges=p.graph.pub_edges + (Edge("train_actor", "ref_inf", "W_actor", loc(90)),))
    err = only_error(p)
    assert err.loc == loc(90)
    assert err.message.startswith(
        "publication edge @train_actor -> @ref_inf carries %W_actor, but @ref_inf does not read")


# --- (2) publication edges --------------------------------------------------------------------


def test_publication_edge_must_leave_a_training_vertex():
    p = ppo_program()
    p = with_graph(p, pub_edges=p.graph.pub_edges + (Edge("gen", "ref_inf", "Y", loc(90)),))
    err = only_error(p)
    assert err.loc == loc(90)
    assert "publication edge leaves @gen, a generation vertex" in err.message
    assert "use a data edge (rpeg.data)" in err.message


def test_publication_edge_must_carry_the_weights_of_the_model_it_trains():
    p = ppo_program()
    # train_critic writes W_critic, but this edge claims to publish the actor's weights.
    p = with_vertex(p, "train_critic", writes=("W_critic", "v"))
    p = with_graph(p, pub_edges=p.graph.pub_edges + (Edge("train_critic", "train_actor", "v", loc(90)),))
    err = only_error(p)
    assert err.loc == loc(90)
    assert "carries %v, which is not the weights of @critic trained by @train_critic" in err.message
    assert "carry %W_critic" in err.message


def test_publication_edge_onto_its_own_training_vertex_is_rejected():
    p = ppo_program()
    p = with_graph(p, pub_edges=p.graph.pub_edges + (Edge("train_actor", "train_actor", "W_actor", loc(90)),))
    err = only_error(p)
    assert err.loc == loc(90) and "loops on one vertex" in err.message


def test_data_edge_must_not_carry_weights():
    p = ppo_program()
    p = with_graph(p, data_edges=edges(p, Edge("train_actor", "train_critic", "W_actor", loc(90))))
    p = with_vertex(p, "train_critic", reads=("W_critic", "Y", "logp_ref", "r", "v", "W_actor"))
    errors = check_graph(p)
    at_edge = [e for e in errors if e.loc == loc(90)]
    assert len(at_edge) == 1 and "carry them with a publication edge" in at_edge[0].message


def test_reader_of_trainable_weights_needs_a_publication_edge():
    p = ppo_program()
    p = with_graph(p, pub_edges=p.graph.pub_edges[:1])  # drop train_critic -> critic_inf
    err = only_error(p)
    assert err.loc == loc(33)
    assert "add 'rpeg.publish @train_critic -> @critic_inf (%W_critic)'" in err.message


# --- (3) boundary consistency -----------------------------------------------------------------


def test_read_container_without_producer_must_be_an_input():
    p = ppo_program()
    p = with_graph(p, inputs=("W_ref", "W_reward"))
    err = only_error(p)
    assert err.loc == loc(14)  # the declaration of %X
    assert "%X is read by @gen but no vertex writes it (Def. A.2 (3)); list it in rpeg.input" in err.message


def test_written_container_without_consumer_must_be_an_output():
    p = ppo_program()
    p = with_vertex(p, "train_actor", reads=("W_actor", "Y", "logp_ref", "r", "v"))
    err = only_error(p)
    assert err.loc == loc(16)  # %logp
    assert "%logp is written by @gen but no vertex reads it" in err.message and "rpeg.output" in err.message
    assert check_graph(with_graph(p, outputs=("logp",))) == []


def test_an_input_must_not_also_be_written():
    p = ppo_program()
    p = with_graph(p, inputs=("X", "W_ref", "W_reward", "W_actor"))
    err = only_error(p)
    assert err.loc == loc(10)
    assert "%W_actor is a graph input but @train_actor also writes it" in err.message


def test_unused_input_and_unwritten_output_are_rejected():
    p = ppo_program()
    extra = Container("extra", "scalars", (Num(1),), loc=loc(20))
    p = with_graph(p, containers=p.graph.containers + (extra,), inputs=p.graph.inputs + ("extra",))
    err = only_error(p)
    assert err.loc == loc(20) and "listed in rpeg.input but no vertex reads it" in err.message
    p = with_graph(ppo_program(), containers=p.graph.containers, outputs=("extra",))
    err = only_error(p)
    assert err.loc == loc(20) and "listed in rpeg.output but no vertex writes it" in err.message


# --- (4) acyclic data edges -------------------------------------------------------------------


def test_cycle_is_named_at_its_first_edge():
    p = ppo_program()
    # train_actor -> gen as a DATA edge closes gen -> ref_inf -> train_actor -> gen.
    p = with_vertex(p, "train_actor", writes=("W_actor", "extra"))
    extra = Container("extra", "scalars", (Num(1),), loc=loc(20))
    p = with_vertex(p, "gen", reads=("W_actor", "X", "extra"))
    p = with_graph(p, containers=p.graph.containers + (extra,),
                   data_edges=edges(p, Edge("train_actor", "gen", "extra", loc(90))))
    err = only_error(p)
    assert err.loc == loc(40)  # gen -> ref_inf is the earliest-declared edge of the cycle
    assert "data edges form a cycle @gen -> @ref_inf -> @train_actor -> @gen" in err.message
    with pytest.raises(RpegError) as info:
        topological_order(p.graph)
    assert info.value.loc == loc(40)


def test_self_loop_and_two_separate_cycles_each_reported():
    g = Graph(
        name="g", containers=(), inputs=(), outputs=(),
        vertices=(Vertex("a", "inference", "m", (), ()), Vertex("b", "inference", "m", (), ()),
                  Vertex("c", "inference", "m", (), ()), Vertex("d", "inference", "m", (), ())),
        data_edges=(Edge("a", "a", "x", loc(1)), Edge("b", "c", "x", loc(2)), Edge("c", "d", "x", loc(3)),
                    Edge("d", "b", "x", loc(4))),
        pub_edges=(),
    )
    from rpegc.core.check.wellformed import find_cycles

    cycles = find_cycles(g)
    assert [e.loc for e in cycles] == [loc(1), loc(2)]
    assert "cycle @a -> @a;" in cycles[0].message
    assert "cycle @b -> @c -> @d -> @b;" in cycles[1].message


# --- models, roles, training vertices ---------------------------------------------------------


def test_generation_needs_a_policy_or_actor_critic_model():
    p = with_vertex(ppo_program(), "ref_inf", role="generation")
    err = only_error(p)
    assert err.loc == loc(31)
    assert "@ref of kind reference, which has no language-model head" in err.message
    assert "policy or actor_critic" in err.message


def test_training_needs_a_trainable_model():
    p = with_vertex(ppo_program(), "ref_inf", role="training")
    errors = check_graph(p)
    assert any(e.loc == loc(31) and "@ref, which is frozen; declare @ref trainable" in e.message for e in errors)


def test_frozen_weights_are_never_written():
    p = with_vertex(ppo_program(), "ref_inf", writes=("logp_ref", "W_ref"))
    errors = check_graph(p)
    assert any(e.loc == loc(31) and "writes %W_ref, the weights of frozen model @ref" in e.message for e in errors)


def test_only_the_training_vertex_writes_trainable_weights():
    p = with_vertex(ppo_program(), "gen", writes=("Y", "logp", "W_actor"))
    err = only_error(p)
    assert err.loc == loc(30)
    assert "only the training vertex of @actor may update them" in err.message


def test_trainable_model_needs_exactly_one_training_vertex():
    p = ppo_program()
    second = Vertex("train_actor2", "training", "actor", ("W_actor", "Y", "logp"), ("W_actor",), loc(36))
    p = with_graph(p, vertices=p.graph.vertices + (second,))
    err = only_error(p)
    assert err.loc == loc(36)
    assert "assume exactly one training vertex t_m per trainable model" in err.message
    assert "merge @train_actor2 into @train_actor" in err.message


def test_trainable_model_without_training_vertex():
    p = with_model(ppo_program(), "ref", trainable=True)
    err = only_error(p)
    assert err.loc == loc(3)
    assert "trainable model @ref has no training vertex" in err.message


def test_vertex_must_read_its_model_weights_and_training_must_write_them():
    p = with_vertex(ppo_program(), "ref_inf", reads=("Y",))
    errors = check_graph(p)
    assert any(e.loc == loc(31) and "does not read its weights; add %W_ref" in e.message for e in errors)
    p = with_vertex(ppo_program(), "train_critic", writes=())
    errors = check_graph(p)
    assert any(e.loc == loc(35) and "does not write its weights; add %W_critic" in e.message for e in errors)


# --- names ------------------------------------------------------------------------------------


def test_unknown_names_are_reported_not_raised():
    p = ppo_program()
    p = with_vertex(p, "gen", model="nope", reads=("W_actor", "X", "Z"))
    p = with_graph(p, data_edges=edges(p, Edge("gen", "ghost", "Y", loc(90))), inputs=p.graph.inputs + ("Q",))
    msgs = [e.message for e in check_graph(p)]
    assert any("invokes unknown model '@nope'" in m for m in msgs)
    assert any("reads unknown container '%Z'" in m for m in msgs)
    assert any("data edge names unknown vertex '@ghost'" in m for m in msgs)
    assert any("rpeg.input names unknown container '%Q'" in m for m in msgs)


def test_duplicate_declarations():
    p = ppo_program()
    dup = replace(p.graph.vertices[1], loc=loc(95))
    p = with_graph(p, vertices=p.graph.vertices + (dup,))
    errors = check_graph(p)
    assert any(e.loc == loc(95) and "vertex @ref_inf is declared twice" in e.message for e in errors)


# --- staleness and quantiles ------------------------------------------------------------------


@pytest.mark.parametrize(
    "staleness, text",
    [
        ((("actor", 1), ("ref", 1)), "staleness budget given for frozen model @ref"),
        ((("actor", -1),), "staleness budget of @actor is -1; it must be an integer >= 0"),
        ((("actor", 1), ("nope", 0)), "staleness budget names unknown model '@nope'"),
        ((("actor", 1), ("actor", 0)), "staleness budget of @actor is given twice"),
    ],
)
def test_staleness_rules(staleness, text):
    err = only_error(with_graph(ppo_program(), staleness=staleness))
    assert err.loc == loc(55) and text in err.message


LR = Sym("Lr")


@pytest.mark.parametrize(
    "quantiles, line, text",
    [
        (((0.6, BinOp("/", LR, Num(4))), (0.5, BinOp("/", LR, Num(2))), (1.0, LR)), 62,
         "quantile fraction 0.5 must lie in (0, 1] and exceed the previous fraction 0.6"),
        (((0.0, BinOp("/", LR, Num(2))), (1.0, LR)), 61, "quantile fraction 0.0 must lie in (0, 1]"),
        (((0.5, BinOp("/", LR, Num(2))), (0.9, LR)), 62, "the last quantile fraction is 0.9"),
        (((0.5, LR), (1.0, LR)), 62, "must be positive and exceed the previous length 256"),
        (((0.5, Num(0)), (1.0, LR)), 61, "quantile length 0 = 0 tokens must be positive"),
        (((0.5, Num(10)), (1.0, Num(200))), 62, "responses end by Lr = 256; end the list with length Lr"),
    ],
)
def test_quantile_rules(quantiles, line, text):
    qs = tuple(Quantile(f, t, loc(61 + i)) for i, (f, t) in enumerate(quantiles))
    err = only_error(with_graph(ppo_program(), quantiles=qs))
    assert err.loc == loc(line) and text in err.message


# --- topological order ------------------------------------------------------------------------


def _reference_order(n: int, pairs: list[tuple[int, int]]) -> list[int]:
    """Repeatedly take the earliest-declared vertex whose predecessors are all placed."""
    done: list[int] = []
    while len(done) < n:
        ready = [v for v in range(n) if v not in done and all(a in done for a, b in pairs if b == v)]
        done.append(min(ready))
    return done


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.just(n), st.permutations(range(n)),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12))))
def test_topological_order_is_the_declaration_ordered_kahn_order(case):
    n, rank, raw = case
    # Orient every pair along a hidden permutation so the graph is acyclic.
    pairs = [(a, b) if rank[a] < rank[b] else (b, a) for a, b in raw if a != b]
    g = Graph(name="g", containers=(), inputs=(), outputs=(),
              vertices=tuple(Vertex(f"v{i}", "inference", "m", (), ()) for i in range(n)),
              data_edges=tuple(Edge(f"v{a}", f"v{b}", "x") for a, b in pairs), pub_edges=())
    assert topological_order(g) == [f"v{i}" for i in _reference_order(n, pairs)]


@pytest.mark.parametrize("name,fits", [("ppo", True), ("grpo", False), ("dpo", False)])
def test_a_named_algorithm_must_fit_the_graph(name, fits):
    """The PPO program has a generation vertex and a critic: it is PPO, and naming it GRPO or DPO is an error at
    the rpeg.algorithm line."""
    p = ppo_program()
    p = with_graph(p, algorithm=name, algorithm_loc=loc(95))
    if fits:
        assert check_graph(p) == []
        return
    err = only_error(p)
    assert err.loc == loc(95) and f"names algorithm {name}, but" in err.message
