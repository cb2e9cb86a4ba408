"""Lowering PPO (App. A-G, Alg. 4): Fig. 17 (Comm and Reshard), Fig. 18/19 (quantile splitting),
the five placement cases of Fig. 3, reuse of installed weights, and pass-order errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rpegc.core.lower.insert_comm import insert_comm
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Container, Edge, Vertex
from rpegc.core.lower.split_quantiles import split_quantiles
from rpegc.core.lower.insert_reshard import insert_reshard
from rpegc.core.lower.unroll import unroll
from fixtures.lowering import (
    colocated,
    edge_set,
    gpus,
    is_acyclic,
    ppo_program,
    preds,
    strat,
    succs,
    unroll_and_lower as lowered,
    weight_bytes_of,
    with_plan,
)

# |a| s(a) with B=8, R=2, Lp=4, Lr=12, s_b=2.
Y_BYTES = 8 * 2 * (4 + 12) * 2
PER_TOKEN_BYTES = 8 * 2 * 12 * 2  # logp_ref, v
R_BYTES = 8 * 2 * 2


def comms(g):
    return [n for n in g.nodes if n.kind == "comm"]


def reshards(g):
    return [n for n in g.nodes if n.kind == "reshard"]


# --- Fig. 17: one step with Comm and Reshard nodes -------------------------------------------

FIG17 = {
    "gen": (gpus(0, 1, 2, 3), strat(tp=4)),
    "train_actor": (gpus(0, 1, 2, 3), strat(dp=2, tp=2)),
    "ref_inf": (gpus(4), strat()),
    "reward_inf": (gpus(5), strat()),
    "critic_inf": (gpus(6, 7), strat(dp=2)),
    "train_critic": (gpus(6, 7), strat(dp=2)),
}


def test_fig17_executable_graph_of_one_step():
    g = lowered(ppo_program(FIG17), 1).exec
    assert g.lowered and {e.kind for e in g.edges} == {"dep"}
    assert len(g.nodes) == 6 + 8 + 1 and len(g.edges) == 8 * 2 + 1 + 2
    # Comm ids follow the data-edge order; each sits between producer and consumer.
    expected = [
        ("gen#0", "ref_inf#0", "Y", Y_BYTES),
        ("gen#0", "reward_inf#0", "Y", Y_BYTES),
        ("gen#0", "critic_inf#0", "Y", Y_BYTES),
        ("ref_inf#0", "train_actor#0", "logp_ref", PER_TOKEN_BYTES),
        ("ref_inf#0", "train_critic#0", "logp_ref", PER_TOKEN_BYTES),
        ("reward_inf#0", "train_actor#0", "r", R_BYTES),
        ("reward_inf#0", "train_critic#0", "r", R_BYTES),
        ("critic_inf#0", "train_actor#0", "v", PER_TOKEN_BYTES),
    ]
    for i, (u, v, container, size) in enumerate(expected):
        c = g.node(f"c{i}")
        assert (preds(g, c.id), succs(g, c.id)) == ({u}, {v})
        assert (c.container, c.bytes, c.step) == (container, size, 0)
        assert c.alloc == FIG17[v.split("#")[0]][0] and c.src_alloc == FIG17[u.split("#")[0]][0]
        assert c.order == g.node(v).order
    # Same devices: the critic's values reach critic training through a bare edge.
    assert ("critic_inf#0", "train_critic#0") in edge_set(g)
    # Actor generation and training share GPUs 0-3 in different layouts: one Reshard.
    (r,) = reshards(g)
    assert r.id == "r0" and (preds(g, r.id), succs(g, r.id)) == ({"gen#0"}, {"train_actor#0"})
    assert (r.model, r.bytes, r.alloc, r.src_alloc) == ("actor", weight_bytes_of("actor"), gpus(0, 1, 2, 3), gpus(0, 1, 2, 3))
    assert (r.src_strategy, r.strategy) == (strat(tp=4), strat(dp=2, tp=2))
    assert r.version_in == (("actor", 0),)
    # Critic inference and training share devices and layout: no Reshard for the critic.
    assert all(n.model != "critic" for n in reshards(g))


def test_new_nodes_are_listed_before_their_consumer():
    ids = [n.id for n in lowered(ppo_program(FIG17), 1).exec.nodes]
    assert ids.index("c0") < ids.index("ref_inf#0") and ids.index("r0") < ids.index("train_actor#0")


# --- Fig. 18 / 19: quantile splitting on 4 GPUs ----------------------------------------------

FIG18 = {
    "gen": (gpus(0), strat()),
    "ref_inf": (gpus(1), strat()),
    "reward_inf": (gpus(2), strat()),
    "critic_inf": (gpus(3), strat()),
    "train_actor": (gpus(0, 1, 2, 3), strat(dp=4)),
    "train_critic": (gpus(0, 1, 2, 3), strat(dp=4)),
}
QUANTILES = ((0.25, 4), (0.6, 8), (1.0, 12))
INFS = ("ref_inf", "reward_inf", "critic_inf")


@pytest.mark.parametrize("quantiles, split", [((), True), (QUANTILES, False)])
def test_fig18_without_splitting_three_full_comms(quantiles, split):
    g = lowered(ppo_program(FIG18, quantiles=quantiles), 1, split=split).exec
    gen_comms = [c for c in comms(g) if preds(g, c.id) == {"gen#0"}]
    assert len(gen_comms) == 3 and all(c.bytes == Y_BYTES and c.fraction is None for c in gen_comms)
    assert all(n.phase is None for n in g.nodes)


def test_fig19_quantile_phases_and_scaled_comms():
    p = ppo_program(FIG18, quantiles=QUANTILES)
    split = split_quantiles(unroll(p, 1)).exec
    gen_phases = [f"gen#0.q{q}" for q in (1, 2, 3)]
    assert [split.node(i).phase for i in gen_phases] == [1, 2, 3]
    assert all(split.node(i).nphases == 3 and split.node(i).alloc == gpus(0) for i in gen_phases)
    assert [split.node(i).fraction for i in gen_phases] == pytest.approx([0.25, 0.35, 0.4])
    assert {n.id for n in split.nodes if n.vertex in INFS} == {f"{v}#0.q{q}" for v in INFS for q in (1, 2, 3)}
    assert all(n.phase is None for n in split.nodes if n.role == "training")
    data = {(e.src, e.dst) for e in split.edges if e.kind == "data"}
    assert {(f"gen#0.q{q}", f"{v}#0.q{q}") for v in INFS for q in (1, 2, 3)} <= data
    assert ("ref_inf#0.q3", "train_actor#0") in data and ("ref_inf#0.q1", "train_actor#0") not in data

    g = insert_reshard(insert_comm(replace(p, exec=split))).exec
    phase_comms = [c for c in comms(g) if c.container == "Y"]
    assert len(phase_comms) == 9
    for c in phase_comms:
        (src,), (dst,) = preds(g, c.id), succs(g, c.id)
        q = g.node(src).phase
        assert src == f"gen#0.q{q}" and dst.endswith(f"#0.q{q}") and g.node(dst).vertex in INFS
        assert c.fraction == pytest.approx([0.25, 0.35, 0.4][q - 1])
        assert c.bytes == round(Y_BYTES * c.fraction)
    assert sum(c.bytes for c in phase_comms) == pytest.approx(3 * Y_BYTES, abs=3)
    # Chains on each vertex's own devices, then whole-container comms out of the last phase.
    for v in ("gen",) + INFS:
        assert (f"{v}#0.q1", f"{v}#0.q2") in edge_set(g) and (f"{v}#0.q2", f"{v}#0.q3") in edge_set(g)
    out_comms = [c for c in comms(g) if c.container != "Y"]
    assert len(out_comms) == 6 and all(preds(g, c.id) <= {f"{v}#0.q3" for v in INFS} for c in out_comms)
    assert all(c.fraction is None for c in out_comms)
    # Pairs attach to the last phase of u: gen and train_actor overlap partially -> bare edge.
    assert ("gen#0.q3", "train_actor#0") in edge_set(g) and ("critic_inf#0.q3", "train_critic#0") in edge_set(g)
    assert len(g.nodes) == 3 + 9 + 2 + 15 and len(g.edges) == 8 + 18 + 12 + 2


def test_publication_enters_first_generation_phase():
    g = lowered(ppo_program(FIG18, quantiles=QUANTILES), 2).exec
    (c,) = [c for c in comms(g) if c.model == "actor"]
    assert preds(g, c.id) == {"train_actor#0"} and succs(g, c.id) == {"gen#1.q1"}
    # 4 training GPUs, 1 generation GPU, overlap 1: (4 - 1) / 4 of the weights move.
    assert c.bytes == round(weight_bytes_of("actor") * 3 / 4) and c.version_in == (("actor", 1),)


def test_nothing_is_split_on_shared_devices():
    placements = dict(FIG18, ref_inf=(gpus(0), strat()))
    g = split_quantiles(unroll(ppo_program(placements, quantiles=QUANTILES), 1)).exec
    assert g.node("ref_inf#0").phase is None
    assert ("gen#0.q3", "ref_inf#0") in edge_set(g, "data")
    assert g.node("reward_inf#0.q2").phase == 2
    colocated_all = split_quantiles(unroll(ppo_program(colocated(), quantiles=QUANTILES), 1))
    assert all(n.phase is None for n in colocated_all.exec.nodes)


def test_disabled_or_missing_quantiles_leave_the_graph_unchanged():
    p = unroll(ppo_program(FIG18, quantiles=QUANTILES), 2)
    assert split_quantiles(p, enabled=False) is p
    q = unroll(ppo_program(FIG18), 2)
    assert split_quantiles(q) is q
    single = unroll(ppo_program(FIG18, quantiles=((1.0, 12),)), 2)
    assert split_quantiles(single) is single  # Q = 1 is the monolithic operator


def test_bad_quantiles_are_reported():
    with pytest.raises(RpegError, match="strictly increasing"):
        split_quantiles(unroll(ppo_program(FIG18, quantiles=((0.6, 4), (0.5, 8), (1.0, 12))), 1))
    with pytest.raises(RpegError, match="f = 1.0"):
        split_quantiles(unroll(ppo_program(FIG18, quantiles=((0.5, 4), (0.9, 8))), 1))


# --- Fig. 3: five placements of the critic on two GPUs ---------------------------------------

ELSEWHERE = {
    "gen": (gpus(4), strat()),
    "ref_inf": (gpus(5), strat()),
    "reward_inf": (gpus(6), strat()),
    "train_actor": (gpus(7), strat()),
}


def critic_case(inf, train, tau, k=3):
    placements = dict(ELSEWHERE, critic_inf=inf, train_critic=train)
    return lowered(ppo_program(placements, staleness={"critic": tau}), k).exec


def critic_weight_comms(g):
    return [c for c in comms(g) if c.model == "critic"]


def test_fig3_case1_sync_disjoint_transient_comm():
    g = critic_case((gpus(0), strat()), (gpus(1), strat()), tau=0)
    cs = critic_weight_comms(g)
    assert [(preds(g, c.id), succs(g, c.id)) for c in cs] == [
        ({"train_critic#0"}, {"critic_inf#1"}),
        ({"train_critic#1"}, {"critic_inf#2"}),
    ]
    assert all(c.bytes == weight_bytes_of("critic") and c.container == "W_critic" for c in cs)
    assert [c.version_in for c in cs] == [(("critic", 1),), (("critic", 2),)]
    assert all((f"critic_inf#{k}", f"train_critic#{k}") in edge_set(g) for k in range(3))
    assert not [n for n in reshards(g) if n.model == "critic"]


def test_fig3_case2_async_disjoint_shadow_pair():
    g = critic_case((gpus(0), strat()), (gpus(1), strat()), tau=1)
    (c,) = critic_weight_comms(g)
    assert (preds(g, c.id), succs(g, c.id), c.version_in) == ({"train_critic#0"}, {"critic_inf#2"}, (("critic", 1),))
    # Shadow pair: no intra-step precedence edge; only the values transfer links the two.
    assert all((f"critic_inf#{k}", f"train_critic#{k}") not in edge_set(g) for k in range(3))


@pytest.mark.parametrize(
    "inf, train, tau",
    [
        ((gpus(0, 1), strat(dp=2)), (gpus(1), strat()), 0),  # case 3: inference spans the training GPU
        ((gpus(0), strat()), (gpus(0, 1), strat(dp=2)), 1),  # case 4: overlap, so no shadow pair
    ],
)
def test_fig3_cases3_4_partial_overlap(inf, train, tau):
    g = critic_case(inf, train, tau)
    cs = critic_weight_comms(g)
    assert len(cs) == 3 - 1 - tau
    assert all(c.bytes == weight_bytes_of("critic") // 2 for c in cs)  # n_max = 2, n_overlap = 1
    assert all((f"critic_inf#{k}", f"train_critic#{k}") in edge_set(g) for k in range(3))


def test_fig3_case5_full_colocation_reshards():
    g = critic_case((gpus(0, 1), strat(dp=2)), (gpus(0, 1), strat(tp=2)), tau=0)
    assert not critic_weight_comms(g)
    rs = [r for r in reshards(g) if r.model == "critic"]
    within = {(r.step, frozenset(preds(g, r.id)), next(iter(succs(g, r.id)))) for r in rs if r.strategy == strat(tp=2)}
    # The within-step Reshard also waits for the training op that produced the version it moves.
    producer = {0: set(), 1: {"train_critic#0"}, 2: {"train_critic#1"}}
    assert within == {(k, frozenset({f"critic_inf#{k}"} | producer[k]), f"train_critic#{k}") for k in range(3)}
    pubs = {(next(iter(preds(g, r.id))), next(iter(succs(g, r.id))), r.version_in) for r in rs if r.strategy == strat(dp=2)}
    assert pubs == {("train_critic#0", "critic_inf#1", (("critic", 1),)), ("train_critic#1", "critic_inf#2", (("critic", 2),))}
    assert all(r.bytes == weight_bytes_of("critic") for r in rs)


def test_colocation_with_same_layout_needs_no_reshard():
    g = critic_case((gpus(0, 1), strat(dp=2, mb=2)), (gpus(0, 1), strat(dp=2, mb=8)), tau=0)
    assert not reshards(g) and not critic_weight_comms(g)
    assert ("train_critic#0", "critic_inf#1") in edge_set(g)


def test_frozen_models_are_never_resharded():
    placements = colocated(gpus(0, 1), strat(dp=2))
    placements["reward_inf"] = (gpus(0, 1), strat(tp=2))
    placements["ref_inf"] = (gpus(0, 1), strat(pp=2))
    g = lowered(ppo_program(placements), 2).exec
    assert not reshards(g) and not comms(g)


# --- Reuse of an installed weight version ----------------------------------------------------


def with_actor_scorer(placements):
    """PPO plus a second actor consumer (an actor inference) that receives its own publication."""
    p = ppo_program(placements)
    g = p.graph
    graph = replace(
        g,
        containers=g.containers + (Container("score", "logprobs", g.container("logp").dims),),
        vertices=g.vertices[:1] + (Vertex("scorer", "inference", "actor", ("W_actor", "Y"), ("score",)),) + g.vertices[1:],
        data_edges=g.data_edges + (Edge("gen", "scorer", "Y"), Edge("scorer", "train_actor", "score")),
        pub_edges=g.pub_edges + (Edge("train_actor", "scorer", "W_actor"),),
    )
    return replace(p, graph=graph)


def test_comm_installing_the_same_version_is_reused():
    placements = dict(FIG17, train_actor=(gpus(4), strat()), scorer=(gpus(0, 1, 2, 3), strat(tp=4)))
    g = lowered(with_actor_scorer(placements), 3).exec
    cs = [c for c in comms(g) if c.model == "actor"]
    assert len(cs) == 2  # one per step 1, 2, not one per consumer
    for c in cs:
        k = c.step
        assert preds(g, c.id) == {f"train_actor#{k - 1}"} and succs(g, c.id) == {f"gen#{k}", f"scorer#{k}"}


def test_reshard_installing_the_same_version_is_reused():
    placements = dict(FIG17, scorer=(gpus(0, 1, 2, 3), strat(tp=4)))
    g = lowered(with_actor_scorer(placements), 2).exec
    pub_reshards = [r for r in reshards(g) if r.strategy == strat(tp=4)]
    assert len(pub_reshards) == 1
    (r,) = pub_reshards
    assert preds(g, r.id) == {"train_actor#0"} and succs(g, r.id) == {"gen#1", "scorer#1"}


# --- Whole pipeline properties on PPO --------------------------------------------------------


def test_lowered_graph_is_acyclic_with_unique_dep_edges():
    for staleness in ({}, {"actor": 1}, {"actor": 2, "critic": 1}):
        g = lowered(ppo_program(FIG18, staleness=staleness, quantiles=QUANTILES), 4).exec
        pairs = [(e.src, e.dst) for e in g.edges]
        assert len(pairs) == len(set(pairs)) and {e.kind for e in g.edges} == {"dep"}
        assert is_acyclic([n.id for n in g.nodes], pairs)


def test_plan_attached_after_unrolling_is_used():
    p = with_plan(unroll(ppo_program(), 2), FIG17)
    g = insert_reshard(insert_comm(p)).exec
    assert g.node("gen#1").alloc == gpus(0, 1, 2, 3) and len(reshards(g)) == 3  # 2 within-step + 1 publication


# --- Pass order and preconditions ------------------------------------------------------------


def test_passes_need_an_unrolled_graph_and_a_plan():
    for pass_fn, name in ((split_quantiles, "split-quantiles"), (insert_comm, "insert-comm"), (insert_reshard, "insert-reshard")):
        with pytest.raises(RpegError, match=f"run unroll.*before {name}"):
            pass_fn(ppo_program(FIG17))
        with pytest.raises(RpegError, match="needs an execution plan"):
            pass_fn(unroll(ppo_program(), 1))


def test_passes_run_out_of_order_are_rejected():
    p = unroll(ppo_program(FIG17, quantiles=QUANTILES), 2)
    with pytest.raises(RpegError, match="needs insert-comm first.*run insert-comm before insert-reshard"):
        insert_reshard(p)
    commed = insert_comm(p)
    with pytest.raises(RpegError, match="split-quantiles must run before insert-comm"):
        split_quantiles(commed)
    with pytest.raises(RpegError, match="insert-comm already ran"):
        insert_comm(commed)
    done = insert_reshard(commed)
    for pass_fn in (split_quantiles, insert_comm, insert_reshard):
        with pytest.raises(RpegError, match="already lowered"):
            pass_fn(done)
    with pytest.raises(RpegError, match="split-quantiles already ran"):
        split_quantiles(split_quantiles(unroll(ppo_program(FIG18, quantiles=QUANTILES), 1)))


def test_missing_placement_when_lowering_is_reported():
    placements = dict(FIG17)
    del placements["ref_inf"]
    with pytest.raises(RpegError, match="no placement for vertex @ref_inf"):
        insert_comm(with_plan(unroll(ppo_program(), 1), placements))


def test_colocated_reshard_under_staleness_waits_for_the_version_it_moves():
    # tau = 1 on shared devices (not a shadow pair): critic_inf#k reads version k-1, but the Reshard before
    # train_critic#k moves version k, so it must depend on train_critic#(k-1), which produces it.
    g = critic_case((gpus(0, 1), strat(dp=2)), (gpus(0, 1), strat(tp=2)), tau=1)
    rs = [r for r in reshards(g) if r.model == "critic" and r.strategy == strat(tp=2)]
    assert len(rs) == 3
    for r in rs:
        assert r.version_in == (("critic", r.step),)
        if r.step > 0:
            assert f"train_critic#{r.step - 1}" in preds(g, r.id)
