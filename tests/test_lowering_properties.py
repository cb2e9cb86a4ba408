"""Properties of lowering over random well-formed graphs, plans and staleness maps (App. A-G, spec 5)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.lower.insert_comm import insert_comm
from rpegc.core.cost.params import param_count
from rpegc.core.lower.split_quantiles import split_quantiles
from rpegc.core.lower.insert_reshard import insert_reshard
from rpegc.core.lower.unroll import unroll
from fixtures.lowering import RANDOM_CLUSTER, WORKLOAD, edge_set, is_acyclic, random_programs

SETTINGS = settings(max_examples=30, deadline=None)


def stages(p, k):
    split = split_quantiles(unroll(p, k))
    commed = insert_comm(split)
    return split.exec, commed.exec, insert_reshard(commed).exec


def weight_bytes(p, model):
    m = p.model(model)
    return param_count(m.arch, m.kind) * WORKLOAD.s_b


def devices(alloc):
    return set(alloc.devices(RANDOM_CLUSTER))


@SETTINGS
@given(random_programs(), st.integers(1, 4))
def test_lowered_graph_is_an_acyclic_dep_graph(drawn, k):
    _, _, g = stages(drawn[0], k)
    pairs = [(e.src, e.dst) for e in g.edges]
    assert g.lowered and {e.kind for e in g.edges} <= {"dep"}
    assert len(pairs) == len(set(pairs))
    assert is_acyclic([n.id for n in g.nodes], pairs)
    assert len({n.id for n in g.nodes}) == len(g.nodes)


@SETTINGS
@given(random_programs(), st.integers(1, 4))
def test_every_cross_allocation_data_edge_has_exactly_one_comm(drawn, k):
    p, elements = drawn
    split, commed, lowered = stages(p, k)
    nodes = {n.id: n for n in split.nodes}
    cross = [e for e in split.edges if e.kind == "data" and nodes[e.src].alloc != nodes[e.dst].alloc]
    data_comms = [n for n in commed.nodes if n.kind == "comm" and n.model is None]
    assert len(data_comms) == len(cross)
    links = Counter()
    for c in data_comms:
        (src,) = {e.src for e in commed.edges if e.dst == c.id}
        (dst,) = {e.dst for e in commed.edges if e.src == c.id}
        links[(src, dst, c.container)] += 1
        u, v = nodes[src], nodes[dst]
        assert (c.src_alloc, c.alloc) == (u.alloc, v.alloc)
        full = elements[c.container] * WORKLOAD.s_b  # |a| s(a)
        if u.phase is not None and u.phase == v.phase:
            assert c.fraction == u.fraction and c.bytes == round(full * u.fraction)
        else:
            assert c.fraction is None and c.bytes == full
    assert links == Counter((e.src, e.dst, e.container) for e in cross)
    same = [e for e in split.edges if e.kind == "data" and nodes[e.src].alloc == nodes[e.dst].alloc]
    assert all((e.src, e.dst) in edge_set(lowered) for e in same)


@SETTINGS
@given(random_programs(), st.integers(2, 5))
def test_publications_become_comm_reshard_or_precedence(drawn, k):
    p = drawn[0]
    split, _, g = stages(p, k)
    nodes = {n.id: n for n in g.nodes}
    for e in split.edges:
        if e.kind != "pub":
            continue
        u, v = nodes[e.src], nodes[e.dst]
        model, version = u.model, dict(u.version_out)[u.model]
        # Transfers that carry this publication: a weight Comm, or a Reshard out of the publisher's layout
        # (a pair Reshard between two serving ops also waits for the publisher, but moves another copy).
        via = [
            n for n in g.nodes
            if (u.id, n.id) in edge_set(g) and (n.id, v.id) in edge_set(g)
            and (n.kind == "comm" or (n.kind == "reshard" and (n.src_alloc, n.src_strategy) == (u.alloc, u.strategy)))
        ]
        if u.alloc != v.alloc:
            (c,) = via
            n_max = max(len(devices(u.alloc)), len(devices(v.alloc)))
            n_overlap = len(devices(u.alloc) & devices(v.alloc))
            assert c.kind == "comm" and c.version_in == ((model, version),)
            assert abs(c.bytes - weight_bytes(p, model) * (n_max - n_overlap) / n_max) <= 0.5
        elif u.strategy.layout() != v.strategy.layout():
            (r,) = via
            assert r.kind == "reshard" and r.bytes == weight_bytes(p, model) and r.version_in == ((model, version),)
        else:
            assert not via and (u.id, v.id) in edge_set(g)
    # One installation per (model, version, destination): reuse never duplicates a transfer.
    weight_comms = [(n.version_in, n.alloc) for n in g.nodes if n.kind == "comm" and n.version_in]
    assert len(weight_comms) == len(set(weight_comms))


@SETTINGS
@given(random_programs(), st.integers(1, 4))
def test_pairs_follow_the_shadow_pair_rule(drawn, k):
    p = drawn[0]
    _, _, g = stages(p, k)
    ops = [n for n in g.nodes if n.kind == "op"]
    for model in {n.model for n in ops if p.model(n.model).trainable}:
        tau = p.graph.tau(model)
        vertices = sorted({(n.order, n.vertex) for n in ops if n.model == model})
        for (_, a), (_, b) in zip(vertices, vertices[1:]):
            for step in range(k):
                u = max((n for n in ops if (n.vertex, n.step) == (a, step)), key=lambda n: n.phase or 0)
                v = min((n for n in ops if (n.vertex, n.step) == (b, step)), key=lambda n: n.phase or 0)
                direct = (u.id, v.id) in edge_set(g)
                reshard = [
                    n for n in g.nodes
                    if n.kind == "reshard" and (u.id, n.id) in edge_set(g) and (n.id, v.id) in edge_set(g)
                ]
                shadow = tau > 0 and not devices(u.alloc) & devices(v.alloc)
                if shadow:
                    assert not reshard and not direct  # the two copies run free of each other
                elif u.alloc == v.alloc and u.strategy.layout() == v.strategy.layout():
                    assert not reshard
                elif u.alloc == v.alloc:
                    # The pair's own Reshard, or (direct edge) a publication's Reshard of the same version reused.
                    into_v = [n for n in g.nodes if n.kind == "reshard" and n.model == model and (n.id, v.id) in edge_set(g)]
                    assert len(reshard) == 1 or (direct and into_v)
                    assert all(r.bytes == weight_bytes(p, model) for r in reshard + into_v)
                else:
                    assert direct and not reshard


def _size(p, k):
    g = stages(p, k)[2]
    return len(g.nodes) + len(g.edges)


@settings(max_examples=20, deadline=None)
@given(random_programs())
def test_executable_graph_grows_linearly_in_k(drawn):
    """O(K(|V|+|E|)): past the warm-up steps (k > max tau) every extra step adds the same amount."""
    p = drawn[0]
    warm = max([tau for _, tau in p.graph.staleness], default=0) + 2
    sizes = [_size(p, k) for k in (warm, warm + 1, warm + 2)]
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0]
    graph = p.graph
    q = max(1, len(graph.quantiles))
    per_step = 8 * q * (len(graph.vertices) + len(graph.data_edges) + len(graph.pub_edges))
    assert sizes[2] <= (warm + 2) * per_step
