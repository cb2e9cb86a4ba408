"""Def. A.5 and P1-P8: one minimal Program per rule violation, its message and location; plan consistency."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import Loc
from rpegc.core.ir.expr import BinOp, Sym
from rpegc.core.check.plan_rules import (
    check_placement,
    check_plan,
    divisors,
    is_legal,
    layout_extent,
    microbatch_choices,
)
from rpegc.core.ir.program import Arch, Container, Graph, Model, Placement, Plan, Program, Vertex, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.check.wellformed import check_graph
from fixtures.ppo_source import ppo_program

PLACE = Loc("one.rpeg", 9, 3)


def one_vertex_program(alloc, strategy, *, layers=32, shape=(1, 2, 4), B=64, R=4) -> Program:
    """A well-formed one-vertex graph (generation with a frozen policy) and a one-placement plan."""
    arch = Arch(layers=layers, hidden=64, ffn=256, vocab=64, heads=4, kv_heads=4)
    graph = Graph(
        name="g",
        containers=(Container("W", "weights", model="m"), Container("X", "tokens", (Sym("B"), Sym("Lp"))),
                    Container("Y", "tokens", (BinOp("*", Sym("B"), Sym("R")), Sym("Lr")))),
        inputs=("W", "X"),
        outputs=("Y",),
        vertices=(Vertex("gen", "generation", "m", ("W", "X"), ("Y",)),),
        data_edges=(),
        pub_edges=(),
    )
    p = Program(
        workload=Workload(B=B, R=R, Lp=8, Lr=8),
        models=(Model("m", "policy", False, arch),),
        graph=graph,
        cluster=Cluster("c", *shape, "gh200"),
        plan=Plan("p", "g", "c", (Placement("gen", Alloc(*alloc), Strategy(*strategy), PLACE),)),
        file="one.rpeg",
    )
    assert check_graph(p) == []
    return p


def plan_errors(*args, **kwargs) -> list[str]:
    errors = check_plan(one_vertex_program(*args, **kwargs))
    assert all(e.loc == PLACE for e in errors)
    return [e.message for e in errors]


def test_legal_placements_have_no_errors():
    # (dp, pp, tp, mb): intra-node DP (2*1*2 = 4 GPUs of one node), a pipeline over two nodes.
    assert plan_errors(((0, 1, 0), (1, 1, 4)), (2, 1, 2, 1)) == []
    assert plan_errors(((0, 0, 0), (1, 2, 4)), (2, 2, 2, 4)) == []


def test_spec_worked_example_plan_is_legal():
    # docs/cost-model-spec.md 8.1: (dp, pp, tp) = (2, 2, 2), mb = 4 on one 8-GPU node, B*R = 64.
    assert plan_errors(((0, 0, 0), (1, 1, 8)), (2, 2, 2, 4), shape=(1, 1, 8), B=64, R=1) == []


def test_size_must_equal_dp_pp_tp():
    assert plan_errors(((0, 0, 0), (1, 1, 4)), (1, 1, 2, 1)) == [
        "@gen: the allocation holds 4 GPUs but dp*pp*tp = 1*1*2 = 2 (Def. A.5: |sigma| = dp*pp*tp, one shard "
        "per GPU); change the extent or the degrees"
    ]


def test_allocation_inside_cluster():
    (msg,) = plan_errors(((0, 2, 0), (1, 1, 4)), (4, 1, 1, 1))
    assert msg.startswith("@gen: allocation at (0, 2, 0) extent (1, 1, 4) leaves cluster @c (1x2x4")
    assert "in the node dimension" in msg


def test_p1_tp_divides_gpus_per_node():
    assert plan_errors(((0, 0, 0), (1, 2, 4)), (1, 1, 8, 1)) == [
        "@gen: P1: tp = 8 does not divide the 4 GPUs of a node (a tensor-parallel group stays inside one node); "
        "use tp in {1, 2, 4}"
    ]


def test_p2_pp_divides_layers():
    assert plan_errors(((0, 0, 0), (1, 1, 4)), (1, 4, 1, 4), layers=30) == [
        "@gen: P2: pp = 4 does not divide the 30 layers of @m; use pp in {1, 2, 6, 10, 30}"
    ]


def test_p2_pp_is_one_or_even():
    (msg,) = plan_errors(((0, 0, 0), (1, 3, 4)), (1, 3, 4, 4), layers=30, shape=(1, 4, 4))
    assert msg == ("@gen: P2: pp = 3 is odd; a pipeline is 1 stage or an even number of stages; "
                   "use pp in {1, 2, 6, 10, 30}")


def test_p3_dp_divides_batch():
    (msg,) = plan_errors(((0, 0, 0), (1, 1, 4)), (4, 1, 1, 1), B=6, R=2)
    assert msg.startswith("@gen: P3: dp = 4 does not divide the batch B = 6")
    assert "use a divisor of 6, e.g. 1, 2, 3, 6" in msg


def test_p3_dp_at_most_the_gpu_count():
    msgs = plan_errors(((0, 0, 0), (1, 2, 4)), (16, 1, 1, 1))
    assert "@gen: P3: dp = 16 exceeds the 8 GPUs of cluster @c; use dp <= 8" in msgs


def test_p4_no_pipeline_no_microbatches():
    assert plan_errors(((0, 0, 0), (1, 1, 2)), (2, 1, 1, 2)) == [
        "@gen: P4: mb = 2 with pp = 1; microbatching only serves a pipeline, so set mb = 1"
    ]


def test_p5_mb_divides_local_batch():
    # B*R/dp = 256/4 = 64; the valid mb are the divisors of 64 in [pp, 64/8] = 2, 4, 8.
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 4)), (4, 2, 1, 3))
    assert msg == (
        "@gen: P5: mb = 3 does not divide the local batch B*R/dp = 64; use a divisor of 64 that is >= pp = 2 "
        "and at most 64/8, e.g. 2, 4, 8"
    )


def test_p5_mb_at_least_pp_and_microbatch_of_eight():
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 4)), (4, 2, 1, 1))
    assert "mb = 1 is below pp = 2, too few microbatches to fill the pipeline" in msg
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 4)), (4, 2, 1, 16))
    assert "a microbatch of B*R/(dp*mb) = 64/16 holds fewer than 8 sequences" in msg
    assert "e.g. 2, 4, 8" in msg


def test_p5_without_any_valid_mb_says_to_lower_dp_or_pp():
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 4)), (4, 2, 1, 2), B=16, R=1)  # B*R/dp = 4 < 8*pp
    assert "no mb satisfies P5 for dp = 4, pp = 2" in msg and "lower dp or pp" in msg


def test_p6_nodes_fit_neither_one_rack_nor_whole_racks():
    assert plan_errors(((0, 0, 0), (2, 2, 4)), (16, 1, 1, 1), shape=(2, 3, 4)) == [
        "@gen: P6: the allocation needs n_need = 4 nodes, which neither fits inside one rack of 3 nodes nor fills "
        "whole racks (4 is not a multiple of 3 or needs more than 2 racks); use fewer GPUs or a multiple of 12 GPUs"
    ]


def test_p6_layout_shape_is_fixed_by_the_degrees():
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 2)), (4, 1, 1, 1))
    assert msg.startswith("@gen: P6: 4 GPUs must be laid out as extent (1, 1, 4)")
    assert msg.endswith("not (1, 2, 2); use extent (1, 1, 4)")


def test_p6_node_block_divides_the_node():
    (msg,) = plan_errors(((0, 0, 0), (1, 1, 3)), (3, 1, 1, 1), B=48)
    assert msg.startswith("@gen: P6: an allocation inside one node takes a divisor of the node's 4 GPUs")
    assert "use dp*pp*tp in {1, 2, 4}" in msg


def test_p6_multi_node_allocation_uses_whole_nodes():
    (msg,) = plan_errors(((0, 0, 0), (1, 2, 3)), (6, 1, 1, 1), B=48)
    assert msg.startswith("@gen: P6: an allocation larger than one node must consist of whole nodes")


def test_p7_aligned_origin():
    assert plan_errors(((0, 0, 1), (1, 1, 2)), (2, 1, 1, 1)) == [
        "@gen: P7: origin (0, 0, 1) is not a multiple of the extent (1, 1, 2) in the GPU dimension, so allocations "
        "would not tile the device space; use an aligned origin such as (0, 0, 0)"
    ]


def test_p8_stages_per_node_divide_pp():
    (msg,) = plan_errors(((0, 0, 0), (1, 3, 4)), (2, 6, 1, 8), layers=30, shape=(1, 4, 4))
    assert msg.startswith("@gen: P8: a node hosts s = min(pp, N_g/tp) = min(6, 4) = 4 pipeline stages, which does "
                          "not divide pp = 6")


def test_p8_small_replicas_do_not_straddle_nodes():
    (msg,) = plan_errors(((0, 0, 0), (1, 3, 8)), (4, 6, 1, 8), layers=30, shape=(1, 4, 8))
    assert msg.startswith("@gen: P8: a replica of pp*tp = 6 GPUs would straddle two nodes of 8 GPUs")


def test_several_violations_are_all_reported():
    msgs = plan_errors(((0, 0, 1), (1, 1, 2)), (2, 1, 1, 3), B=9)
    assert [m.split(":")[1].strip() for m in msgs] == ["P3", "P4", "P7"]


# --- plan-level consistency -------------------------------------------------------------------


def test_plan_must_name_the_modules_graph_and_cluster():
    p = ppo_program()
    p = replace(p, plan=replace(p.plan, graph="other", cluster="elsewhere"))
    msgs = [(e.loc, e.message) for e in check_plan(p)]
    assert (p.plan.loc, "plan @p is for graph @other, but the module's graph is @ppo; write 'for @ppo'") in msgs
    assert (p.plan.loc, "plan @p runs on cluster @elsewhere, but the module's cluster is @c; write 'on @c'") in msgs


def test_every_vertex_placed_exactly_once():
    p = ppo_program()
    placements = p.plan.placements
    ghost = replace(placements[0], vertex="ghost", loc=Loc("ppo.rpeg", 80, 3))
    dup = replace(placements[1], loc=Loc("ppo.rpeg", 81, 3))
    p = replace(p, plan=replace(p.plan, placements=placements[1:] + (ghost, dup)))
    errors = check_plan(p)
    assert len(errors) == 3
    by_loc = {e.loc.line: e.message for e in errors}
    assert by_loc[80].startswith("plan places unknown vertex '@ghost'")
    assert by_loc[81] == ("vertex @ref_inf is placed twice; a plan gives each vertex exactly one placement — "
                          "remove one")
    assert by_loc[70].startswith("vertex @gen has no placement in plan @p")


def test_placement_errors_carry_the_placement_location():
    p = ppo_program()
    bad = replace(p.plan.placements[0], strategy=Strategy(dp=2, pp=1, tp=2, mb=2))
    p = replace(p, plan=replace(p.plan, placements=(bad,) + p.plan.placements[1:]))
    (err,) = check_plan(p)
    assert err.loc == bad.loc and err.message.startswith("@gen: P4:")


# --- the boolean fast path agrees with the messages -------------------------------------------


@st.composite
def placements(draw):
    """Mostly near-legal inputs: degrees from the rule-relevant ranges, and usually the layout extent
    at an aligned origin, so that both verdicts occur often."""
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 6, 8])))
    cluster = Cluster("c", *shape, "gh200")
    workload = Workload(B=draw(st.sampled_from([1, 6, 16, 48, 64])), R=draw(st.sampled_from([1, 2, 4])), Lp=8, Lr=8)
    layers = draw(st.sampled_from([2, 4, 6, 30, 32]))
    def pick(valid, anything):
        return draw(st.sampled_from(valid)) if valid and draw(st.integers(0, 7)) > 0 else draw(anything)

    tp = pick(divisors(cluster.gpus), st.integers(0, 8))
    pp = pick([d for d in divisors(layers) if d == 1 or d % 2 == 0], st.sampled_from([0, 1, 2, 3, 4, 6, 8]))
    dp = pick(divisors(workload.B), st.integers(0, 12))
    mb = pick(microbatch_choices(dp, pp, workload) if min(dp, pp) >= 1 else [], st.sampled_from([0, 1, 2, 3, 16]))
    extent = None
    if min(dp, pp, tp) >= 1 and draw(st.integers(0, 3)) > 0:
        extent = layout_extent(dp, pp, tp, cluster)
    if extent is None:
        extent = (draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(0, 8)))
    if min(extent) >= 1 and draw(st.integers(0, 3)) > 0:
        dims = (cluster.racks, cluster.nodes, cluster.gpus)
        slack = draw(st.sampled_from([0, 0, 0, 1]))  # sometimes one block past the edge
        origin = tuple(e * draw(st.integers(0, max(0, n // e - 1) + slack)) for e, n in zip(extent, dims))
    else:
        origin = (draw(st.integers(-1, 4)), draw(st.integers(-1, 4)), draw(st.integers(-1, 8)))
    return Alloc(origin, extent), Strategy(dp, pp, tp, mb), layers, workload, cluster


@settings(max_examples=500, deadline=None)
@given(placements())
def test_is_legal_iff_check_placement_is_empty(case):
    alloc, strategy, layers, workload, cluster = case
    model = Model("m", "policy", True, Arch(layers, 64, 256, 64, 4, 4))
    errors = check_placement(Placement("v", alloc, strategy), model, workload, cluster)
    assert is_legal(alloc, strategy, layers, workload, cluster) == (errors == [])


@pytest.mark.parametrize(
    "degrees, shape, extent",
    [
        ((2, 1, 2), (1, 2, 4), (1, 1, 4)),  # two replicas share a node
        ((1, 4, 2), (1, 2, 4), (1, 2, 4)),  # a 4-stage pipeline, 2 stages per node
        ((16, 1, 1), (2, 2, 4), (2, 2, 4)),  # whole racks
        ((3, 1, 4), (1, 4, 4), (1, 3, 4)),  # 3 nodes inside a rack of 4
        ((2, 1, 1), (1, 1, 8), (1, 1, 2)),
    ],
)
def test_layout_extent(degrees, shape, extent):
    assert layout_extent(*degrees, Cluster("c", *shape, "gh200")) == extent
