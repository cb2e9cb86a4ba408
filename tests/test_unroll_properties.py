"""Properties of unrolling over random well-formed graphs (Lemma A.1, Def. A.6, Alg. 3 sizes)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.lower.unroll import unroll
from fixtures.lowering import edge_set, is_acyclic, random_programs

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(random_programs(with_plan=False), st.integers(1, 6))
def test_unrolled_graph_is_a_dag(drawn, k):
    """Lemma A.1: data edges stay in a step and are acyclic; publication edges go strictly forward."""
    g = unroll(drawn[0], k).exec
    assert is_acyclic([n.id for n in g.nodes], edge_set(g))
    for e in g.edges:
        src, dst = g.node(e.src), g.node(e.dst)
        assert src.step == dst.step if e.kind == "data" else src.step < dst.step
        if e.kind == "data":
            assert src.order < dst.order


@SETTINGS
@given(random_programs(with_plan=False), st.integers(1, 7))
def test_publisher_selection_bounds(drawn, k):
    """0 <= s_m(k) < k and (k-1) - s_m(k) <= tau(m); steps k <= tau(m) get no publication edge."""
    p = drawn[0]
    g = unroll(p, k).exec
    for e in p.graph.pub_edges:
        tau = p.graph.tau(p.graph.vertex(e.src).model)
        sources = {
            g.node(x.dst).step: g.node(x.src).step
            for x in g.edges
            if x.kind == "pub" and g.node(x.src).vertex == e.src and g.node(x.dst).vertex == e.dst
        }
        assert set(sources) == set(range(tau + 1, k))
        for step, s in sources.items():
            assert 0 <= s < step and (step - 1) - s <= tau
            assert s == step - tau - 1  # maximally stale admissible publisher


@SETTINGS
@given(random_programs(with_plan=False), st.integers(1, 6))
def test_consumers_read_the_version_their_publisher_produced(drawn, k):
    p = drawn[0]
    g = unroll(p, k).exec
    for n in g.nodes:
        for model, version in n.version_in:
            if n.role == "training" and n.model == model:
                assert version == n.step
            elif any(m.name == model and m.trainable for m in p.models):
                assert version == max(0, n.step - p.graph.tau(model))
            else:
                assert version == 0
    for e in g.edges:
        if e.kind == "pub":
            model = g.node(e.src).model
            assert dict(g.node(e.src).version_out)[model] == dict(g.node(e.dst).version_in)[model]


@SETTINGS
@given(random_programs(with_plan=False), st.integers(1, 6))
def test_sizes_are_linear_in_k(drawn, k):
    """|V-bar| = K|V|, |E-bar data| = K|E data|, publications and ordered updates per step."""
    p = drawn[0]
    graph = p.graph
    g = unroll(p, k).exec
    kinds = [e.kind for e in g.edges]
    trainers = [v for v in graph.vertices if v.role == "training"]
    assert len(g.nodes) == k * len(graph.vertices)
    assert kinds.count("data") == k * len(graph.data_edges)
    expected_pubs = sum(max(0, k - 1 - graph.tau(graph.vertex(e.src).model)) for e in graph.pub_edges)
    assert kinds.count("pub") == expected_pubs
    assert kinds.count("order") == (k - 1) * len(trainers)
    assert len(g.nodes) + len(g.edges) <= k * (len(graph.vertices) + len(graph.data_edges) + len(graph.pub_edges) + len(trainers))
