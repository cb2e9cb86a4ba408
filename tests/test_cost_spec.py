"""The worked example of docs/cost-model-spec.md Section 8, number by number (rel tol 1e-6).

Everything is built from dataclasses here: an 8-GPU node (1 x 1 x 8), LLaMA-7B-like models, the
hardware of spec 8.1 and the plan (P_d, P_p, P_t) = (2, 2, 2), mb = 4 for every operator. The spec's literal
form is the cost option accounting = "spec" (SPEC below) with the default training (mixed precision, ZeRO-2,
recomputation every c layers, 1F1B); what the torch backend holds instead (the default accounting) and the other
training choices are tested in test_cost_training.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from rpegc.core.cost.annotate import annotate, program_memory
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy, replica_tier, span_tier
from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode
from rpegc.core.cost.explain import explain
from rpegc.core.ir.expr import Num, Sym
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.memory import FROZEN, NONE, SHADOW, TRAINING, oom_penalty, op_memory
from rpegc.core.cost.optime import op_time
from rpegc.core.cost.params import layer_params, param_count
from rpegc.core.ir.program import Graph, Model, Placement, Plan, Program, Quantile, Vertex
from rpegc.core.ir.training import Training
from rpegc.core.lower.rules import data_bytes, publication_bytes
from rpegc.core.cost.transfer import (
    comm_node_time,
    reshard_node_time,
)
from rpegc.core.cost.work import (
    decode_flops_per_rollout,
    forward_flops_per_sequence,
    forward_flops_per_token,
    forward_length,
    generation_work,
    inference_work,
    prefill_flops_per_rollout,
    training_work,
)

from fixtures.spec_example import ARCH, GIB, HW, HW_DICT, PLAN, WL, approx

ALL8 = Alloc((0, 0, 0), (1, 1, 8))
LOW4 = Alloc((0, 0, 0), (1, 1, 4))
HIGH4 = Alloc((0, 0, 4), (1, 1, 4))
STRAT = Strategy(2, 2, 2, 4)
SPEC = CostOptions(accounting="spec")


def approx6(x):
    """Spec values printed with six decimals (r_peak): 6 significant digits."""
    return pytest.approx(x, rel=1e-5)


def timing(role, kind, opts=SPEC, train=None):
    return op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=HW, opts=opts, train=train)


def memory(role, kind, opts=SPEC):
    return op_memory(role, ARCH, kind, WL, **PLAN, opts=opts)


# ---- 8.1 / 8.8 Inputs --------------------------------------------------------------------------


def test_inputs():
    assert param_count(ARCH, "policy") == 5_164_236_800
    assert param_count(ARCH, "critic") == 5_164_240_896
    assert layer_params(ARCH) == 157_286_400
    assert ARCH.vocab * ARCH.hidden == 131_072_000
    assert forward_flops_per_token(ARCH, "policy", 640) == approx(10_496_245_760)
    assert forward_flops_per_token(ARCH, "reference", 640) == approx(10_496_245_760)
    assert forward_flops_per_token(ARCH, "critic", 640) == approx(10_234_109_952)
    assert forward_flops_per_token(ARCH, "reward", 640) == approx(10_234_101_772.8)
    assert HW.M_eff == approx(92_771_293_593.6)
    assert span_tier(ALL8) == "intra_node"


# ---- 8.2 Generation ----------------------------------------------------------------------------


def test_generation_work():
    assert prefill_flops_per_rollout(ARCH, 512) == 5_222_942_375_936
    assert decode_flops_per_rollout(ARCH, 512, 128) == 1_350_068_862_976
    assert generation_work(ARCH, WL) == (334_268_312_059_904, 86_404_407_230_464)


@pytest.mark.parametrize("kind", ["policy", "reference", "critic", "actor_critic", "reward"])
def test_a_teacher_forced_forward_runs_the_tokens_the_backend_runs(kind):
    """The spec's ell_full = L_p + L_r; the backend reads log-probs and values at the positions that predict the
    response, so it runs a row less its last token, and a reward model's score at the last token, the whole row."""
    ell = 640 if kind == "reward" else 639
    assert forward_length(kind, 512, 128) == ell and forward_length(kind, 512, 128, SPEC) == 640
    assert inference_work(ARCH, kind, WL) == WL.B * WL.R * forward_flops_per_sequence(ARCH, kind, ell)
    assert inference_work(ARCH, kind, WL, SPEC) == WL.B * WL.R * forward_flops_per_sequence(ARCH, kind, 640)
    if kind != "reward":
        assert training_work(ARCH, kind, WL, 3) == 3 * WL.B * WL.R * forward_flops_per_sequence(ARCH, kind, ell)
        assert timing("training", kind, CostOptions()).phase("forward").ell == 639
    assert timing("inference", kind, CostOptions()).phase("forward").ell == ell
    assert timing("inference", kind).phase("forward").ell == 640  # the worked example's


def test_generation_time():
    t = timing("generation", "policy")
    assert t.P == 8 and t.b_loc == 8 and t.N_m == 5_164_236_800
    assert t.W == approx(420_672_719_290_368)
    pf, dec = t.phase("prefill"), t.phase("decode")
    expected_pf = dict(ell=512, W_dev=10_445_884_751_872, Omega_W=2_516_582_400, Omega_A=1_073_741_824, I=2909.454,
                       eta=0.7529412, F_compute=3.011765e14, F_memory=8.728363e15, F_eff=3.011765e14, T_gemm=0.1387344)
    expected_dec = dict(ell=1, W_dev=21_260_926_976, Omega_A=2_097_152, I=8.441299, eta=0.02424242,
                        F_compute=9.696970e12, F_memory=2.532390e13, F_eff=9.696970e12, T_gemm=1.113807)
    for phase, expected in ((pf, expected_pf), (dec, expected_dec)):
        for name, value in expected.items():
            assert getattr(phase, name) == approx(value), (phase.name, name)
    assert t.T_gemm == approx(1.252541)
    assert t.T_bubble == approx(0.3131353)
    tp_pf, tp_dec = t.tp_calls("prefill"), t.tp_calls("decode")
    assert (tp_pf.count, tp_pf.msg) == (128, 33_554_432)
    assert tp_pf.per_call == approx(1.877722e-4) and tp_pf.time == approx(0.02403484)
    assert (tp_dec.count, tp_dec.msg) == (4064, 262_144)
    assert tp_dec.per_call == approx(2.131072e-5) and tp_dec.time == approx(0.08660677)
    assert t.T_tp == approx(0.1106416) and t.T_comm == approx(0.1106416)
    assert t.T_pp == 0 and t.T_dp == 0 and t.T_non_gemm == 0 and t.T_opt == 0
    assert t.T_op == approx(1.676318)


def test_generation_memory():
    m = memory("generation", "policy")
    assert m.W_shard == 1_389_363_200
    assert m.M_w == 2_778_726_400
    assert m.M_act == 295_698_432
    assert m.M_kv == 2_684_354_560
    assert m.A_core == 2_980_052_992
    assert m.A_with_weights == 5_758_779_392


def test_gqa_kv_cache_counts_replicated_heads_per_rank():
    gqa = dataclasses.replace(ARCH, kv_heads=8)
    m = op_memory("generation", gqa, "policy", WL, **PLAN, opts=SPEC)
    assert m.M_kv == 2_684_354_560 // 4  # ceil(8/2)*128 = 512 of the MHA's 2048 per rank
    wide_tp = op_memory("generation", gqa, "policy", WL, dp=1, pp=1, tp=16, mb=1, opts=SPEC)
    assert wide_tp.M_kv == 2 * 2 * 64 * 640 * 32 * 128  # ceil(8/16) = 1 head per rank, not half of one


# ---- 8.3 Inference -----------------------------------------------------------------------------


def test_reference_inference_time():
    t = timing("inference", "reference")
    f = t.phase("forward")
    assert (t.P, t.b_loc, t.N_m) == (8, 8, 5_164_236_800)
    assert t.W == approx(429_926_226_329_600)
    expected = dict(ell=640, W_dev=13_435_194_572_800, Omega_W=2_516_582_400, Omega_A=1_342_177_280, I=3481.739,
                    eta=0.7619048, F_compute=3.047619e14, F_memory=1.044522e16, F_eff=3.047619e14, T_gemm=0.1763369)
    for name, value in expected.items():
        assert getattr(f, name) == approx(value), name
    assert t.T_bubble == approx(0.04408423)
    tp = t.tp_calls("forward")
    assert (tp.count, tp.msg) == (128, 41_943_040) and tp.per_call == approx(2.297152e-4)
    assert t.T_tp == approx(0.02940355)
    assert (t.pp.steps, t.pp.msg, t.pp.n_intra, t.pp.n_inter) == (4, 20_971_520, 1, 0)
    assert t.pp.per_step == approx(1.448101e-4)
    assert t.T_pp == approx(5.792405e-4)
    assert t.T_comm == approx(2.998279e-2)
    assert t.T_dp == 0 and t.T_non_gemm == 0 and t.T_opt == 0
    assert t.T_op == approx(0.2504039)


def test_reference_inference_memory():
    m = memory("inference", "reference")
    assert (m.W_shard, m.M_w) == (1_389_363_200, 2_778_726_400)
    assert m.M_act == 369_623_040 and m.A_core == 369_623_040
    assert m.A_with_weights == 3_148_349_440


# ---- 8.4 Training ------------------------------------------------------------------------------


def test_actor_training_time():
    t = timing("training", "policy")
    f = t.phase("forward")
    assert (t.P, t.b_loc, t.N_m) == (8, 8, 5_164_236_800)
    assert t.W == approx(1_719_704_905_318_400)
    assert f.ell == 640 and f.W_dev == approx(13_435_194_572_800)
    assert (f.Omega_W, f.Omega_A) == (2_516_582_400, 1_342_177_280)
    assert f.F_compute == approx(3.047619e14)
    assert (f.I, f.eta, f.F_eff) == (approx(3481.739), approx(0.7619048), approx(3.047619e14))
    assert f.F_memory == approx(1.044522e16)
    assert t.T_gemm == approx(0.7053477)
    assert t.T_bubble == approx(0.1763369)
    tp = t.tp_calls("forward")
    assert (tp.count, tp.msg) == (384, 41_943_040) and tp.per_call == approx(2.297152e-4)
    assert t.T_tp == approx(0.08821064)
    assert (t.pp.steps, t.pp.msg, t.pp.n_intra, t.pp.n_inter) == (5, 20_971_520, 1, 0)
    assert t.pp.per_step == approx(1.448101e-4) and t.T_pp == approx(7.240507e-4)
    assert t.dp.msg == 2_582_118_400
    assert t.dp.reduce == approx(6.465296e-3) and t.dp.gather == approx(6.465296e-3) and t.dp.reduces == 1
    assert t.T_dp == approx(0.01293059)
    assert t.T_comm == approx(1.018653e-1)
    assert t.T_non_gemm == 0
    assert t.T_opt == approx(3.873178e-3)
    assert t.T_op == approx(0.9874231)


def test_actor_training_memory():
    m = memory("training", "policy")
    assert (m.W_shard, m.M_w, m.M_opt, m.M_grad) == (1_389_363_200, 2_778_726_400, 8_336_179_200, 1_389_363_200)
    # M_buf = 20,480 scalars per token (the layer's recompute buffer, [A12]) of s_b = 2 bytes; n_ckpt d + c M_buf =
    # 98,304 scalars per token and live microbatch.
    assert (m.c, m.n_ckpt, m.layer_bytes, m.live) == (4, 4, 2 * 20_480, 2)
    assert m.M_act == 2_013_265_920 == 2 * 2 * 8 * 640 * 98_304
    assert m.state == m.M_opt
    assert m.A_core == 6_181_355_520 and m.A_with_weights == 6_181_355_520


@pytest.mark.parametrize(
    "role, kind, W, T_gemm, T_dp, T_opt, T_op",
    [
        ("inference", "critic", 419_189_143_633_920, 0.1719330, 0.0, 0.0, 0.2448991),
        ("training", "critic", 1_676_756_574_535_680, 0.6877322, 1.293060e-2, 3.873181e-3, 0.9654037),
        ("inference", "reward", 419_188_808_613_888, 0.1719329, 0.0, 0.0, 0.2448989),
    ],
)
def test_extra_operators(role, kind, W, T_gemm, T_dp, T_opt, T_op):
    t = timing(role, kind)
    assert t.W == approx(W)
    assert t.phase("forward").F_eff == approx(3.047619e14)
    assert t.T_gemm == approx(T_gemm)
    assert t.T_dp == approx(T_dp) and t.T_opt == approx(T_opt)
    assert t.T_non_gemm == 0
    assert t.T_op == approx(T_op)
    m = memory(role, kind)
    assert m.W_shard == 1_389_363_200
    assert m.A_core == (6_181_355_520 if role == "training" else 369_623_040)


# ---- 8.5 / 8.6 Comm and Reshard ------------------------------------------------------------------


def test_comm_and_reshard_nodes():
    y = data_bytes(64 * 640 * 2, None)
    assert y == 81_920
    assert comm_node_time(y, LOW4, HIGH4, HW) == approx(5.136533e-6)
    for fraction, payload, time in ((0.5, 40_960, 5.068267e-6), (0.35, 28_672, 5.047787e-6), (0.15, 12_288, 5.020480e-6)):
        assert data_bytes(y, fraction) == payload
        assert comm_node_time(data_bytes(y, fraction), LOW4, HIGH4, HW) == approx(time)
    n_m = param_count(ARCH, "policy")
    overlap = publication_bytes(n_m * 2, ALL8, HIGH4)
    assert overlap == approx(5_164_236_800)
    assert comm_node_time(overlap, ALL8, HIGH4, HW) == approx(8.612061e-3)
    disjoint = publication_bytes(n_m * 2, LOW4, HIGH4)
    assert disjoint == approx(10_328_473_600)
    assert comm_node_time(disjoint, LOW4, HIGH4, HW) == approx(1.721912e-2)
    assert n_m * 2 / 8 == 1_291_059_200
    assert reshard_node_time(n_m, 2, ALL8, HW) == approx(6.525296e-3)


def test_tier_selection_on_two_racks():
    r0n0, r0n1, r1n0 = Alloc((0, 0, 0), (1, 1, 4)), Alloc((0, 1, 0), (1, 1, 4)), Alloc((1, 0, 0), (1, 1, 4))
    assert span_tier(r0n0, r0n1) == "inter_node"
    assert span_tier(r0n0, r1n0) == "inter_rack"
    assert comm_node_time(81_920, r0n0, r0n1, HW) == approx(2.081920e-5)
    assert comm_node_time(81_920, r0n0, r1n0, HW) == approx(4.163840e-5)
    two_nodes = Alloc((0, 0, 0), (1, 2, 4))
    tier = span_tier(two_nodes)
    t = op_time("training", ARCH, "policy", WL, dp=1, pp=4, tp=2, mb=4, gpus_per_node=4, hw=HW, span_tier=tier,
                opts=SPEC)
    assert (t.pp.n_intra, t.pp.n_inter, t.pp.msg) == (2, 1, 41_943_040)
    assert t.pp.per_step == approx(7.556540e-4)
    assert t.T_pp == approx(6.800886e-3)


def test_replica_tier_alternative_for_pipeline_boundaries():
    # Two racks of 2 nodes x 4 GPUs; each (P_p, P_t) = (4, 2) replica fills one rack.
    both_racks, strategy = Alloc((0, 0, 0), (2, 2, 4)), Strategy(2, 4, 2, 4)
    assert span_tier(both_racks) == "inter_rack"
    assert replica_tier(both_racks, strategy) == "inter_node"
    assert replica_tier(both_racks, Strategy(1, 8, 2, 8)) == "inter_rack"
    cluster = Cluster("two-racks", 2, 2, 4, "spec-8.1")
    gen_alloc = Alloc((0, 0, 0), (1, 1, 4))
    nodes = (
        ExecNode("gen#0", "op", 0, 0, vertex="gen", role="generation", model="actor", alloc=gen_alloc, strategy=Strategy(2, 1, 2, 1)),
        ExecNode("train#0", "op", 0, 1, vertex="train", role="training", model="actor", alloc=both_racks, strategy=strategy),
    )
    p = toy_program(cluster=cluster, nodes=nodes)
    train = lambda opts: annotate(p, HW, opts).exec.node("train#0").time  # noqa: E731
    # M_pp = 64*640*4096*2 / (2*2*4); 9 steps, each with one of three boundaries crossing nodes.
    msg = 20_971_520
    inter_rack_boundary = 4e-5 + msg / 12.5e9
    inter_node_boundary = 2e-5 + msg / 25e9
    gap = train(SPEC) - train(CostOptions(accounting="spec", pp_inter_tier="replica"))
    assert gap == approx(9 * (inter_rack_boundary - inter_node_boundary) / 3)


# ---- 8.7 Device peak via annotate -----------------------------------------------------------------


def toy_program(cluster=Cluster("node", 1, 1, 8, "spec-8.1"), quantiles=(), nodes=None, staleness=()):
    models = (Model("actor", "policy", True, ARCH), Model("ref", "reference", False, ARCH))
    vertices = (
        Vertex("gen", "generation", "actor", (), ()),
        Vertex("ref_inf", "inference", "ref", (), ()),
        Vertex("train", "training", "actor", (), ()),
    )
    graph = Graph("toy", (), (), (), vertices, (), (), staleness=staleness, quantiles=quantiles)
    if nodes is None:
        nodes = tuple(
            ExecNode(f"{v.name}#0", "op", 0, i, vertex=v.name, role=v.role, model=v.model, alloc=ALL8, strategy=STRAT)
            for i, v in enumerate(vertices)
        )
    edges = tuple(ExecEdge(a.id, b.id) for a, b in zip(nodes, nodes[1:]))
    return Program(WL, models, graph, cluster, None, ExecGraph("toy", 1, nodes, edges, lowered=True))


def test_colocated_chain_times_and_peak():
    p = annotate(toy_program(), HW, SPEC)
    times = {n.id: n.time for n in p.exec.nodes}
    assert times == {"gen#0": approx(1.676318), "ref_inf#0": approx(0.2504039), "train#0": approx(0.9874231)}
    assert sum(times.values()) == approx(2.914145)  # the chain's makespan
    mem = p.exec.memory
    assert [d for d, _ in mem.peak] == list(range(8))
    assert all(v == 17_296_261_120 for _, v in mem.peak)
    assert all(v == 8_336_179_200 + 2_778_726_400 for _, v in mem.persistent)
    assert all(v == 6_181_355_520 for _, v in mem.transient)
    assert mem.m_eff == approx(92_771_293_593.6)
    assert mem.r_peak == approx6(0.186440) and mem.feasible
    assert 17_296_261_120 / GIB == pytest.approx(16.1084, rel=1e-5)


def test_colocated_chain_residency_and_transients():
    dm = program_memory(toy_program(), HW, SPEC)
    assert list(dm.residency["actor"]) == [TRAINING] * 8 and list(dm.residency["ref"]) == [FROZEN] * 8
    assert dm.persistent_by_model["actor"][0] == 8_336_179_200
    assert dm.persistent_by_model["ref"][0] == 2_778_726_400
    by_vertex = {op.vertex: m for op, m in zip(dm.ops, dm.op_memory)}
    assert by_vertex["gen"].A_with_weights == 5_758_779_392  # no persistent BF16 actor copy on a training GPU
    assert by_vertex["ref_inf"].A_core == 369_623_040
    assert by_vertex["train"].A_core == 6_181_355_520
    literal = program_memory(toy_program(), HW, CostOptions(accounting="spec", serving_weights_in_transient=False))
    assert literal.peak[0] == 17_296_261_120  # [A13] both readings agree here


@pytest.mark.parametrize(
    "gib, m_eff, r_peak, feasible, penalty",
    [
        (96, 92_771_293_593.6, 0.186440, True, 1.0),
        (24, 23_192_823_398.4, 0.745759, True, 1.0),
        (16, 15_461_882_265.6, 1.118639, False, 8.690270e-3),
    ],
)
def test_capacities(gib, m_eff, r_peak, feasible, penalty):
    hw = dataclasses.replace(HW, M_GPU=gib * GIB)
    mem = annotate(toy_program(), hw, SPEC).exec.memory
    assert mem.m_eff == approx(m_eff)
    assert mem.r_peak == approx6(r_peak)
    assert mem.feasible is feasible
    assert oom_penalty(mem.r_peak) == approx(penalty)


# ---- 8.8 Sensitivity to ambiguous choices ------------------------------------------------------------


def test_sensitivity_alternatives():
    # [A1] 3 forward-equivalents: training without recomputation (the training field recompute = none)
    a1 = timing("training", "policy", train=Training("mixed", 2, "none", "1f1b"))
    assert a1.W == approx(1_289_778_678_988_800)
    # The spec's alternative keeps 6 TP AllReduces per layer and microbatch; without the recomputing forward
    # there are 4 (forward and backward), 2/3 of T_tp = 0.08821064 of the worked example.
    assert a1.T_gemm == approx(5.290108e-1) and a1.T_op == approx6(7.670019e-1 - 0.08821064 / 3)
    a5 = timing("generation", "policy", CostOptions(accounting="spec", decode_rows="local_batch"))
    dec = a5.phase("decode")
    assert (dec.I, dec.eta, dec.F_eff, dec.T_gemm) == (
        approx(3.368106e1), approx(8.888889e-2), approx(3.555556e13), approx(3.037655e-1))
    assert a5.T_op == approx(6.637665e-1)
    assert timing("generation", "policy", CostOptions(accounting="spec", bubble_on_generation=False)).T_op == approx(1.363183)
    for rounding in ("floor", "ceil"):
        assert memory("training", "policy", CostOptions(accounting="spec", checkpoint_interval=rounding)).c == 4
    a12 = memory("training", "policy", CostOptions(accounting="spec", recompute_buffer_third_term=True))
    assert a12.layer_bytes == 2 * 30_208 and a12.M_act == 2_810_183_680
    a23 = memory("inference", "critic", CostOptions(accounting="spec", scalar_head_act_width="one"))
    assert a23.A_core == 209_715_200
    assert memory("inference", "critic").A_core == 369_623_040
    a7 = timing("generation", "policy", CostOptions(accounting="spec", generation_pp="prefill"))
    assert a7.T_pp == pytest.approx(4.674e-4, rel=1e-3)
    assert a7.T_op == approx(1.676318 + a7.T_pp)
    # [A7] "wavefront": the prefill as above, plus per decode step and microbatch (127 * 4) one
    # activation hop (b_loc = 8 rows of d = 4096 BF16, TP-sharded: 32 KiB) and 8 int64 tokens back.
    wave = timing("generation", "policy", CostOptions(accounting="spec", generation_pp="wavefront"))
    alpha, beta = HW_DICT["p2p"]["intra_node"]["alpha"], HW_DICT["p2p"]["intra_node"]["beta"]
    per_step = (alpha + beta * 8 * 4096 * 2 / 2) + (alpha + beta * 8 * 8)
    assert (wave.decode_pp.steps, wave.decode_pp.msg) == (127 * 4, 32_768)
    assert wave.T_pp == approx(a7.T_pp + 127 * 4 * per_step)
    assert wave.decode_time == approx(a7.decode_time + 127 * 4 * per_step)
    assert wave.T_op == approx(a7.T_op + 127 * 4 * per_step)


def test_remaining_alternatives():
    # [A3] [PF]'s unexpanded sum: attention of a decode step is 2L(L_p+t)d instead of 4L(L_p+t)d.
    attention = 4 * 32 * 4096 * (127 * 512 + 127 * 128 / 2)
    assert decode_flops_per_rollout(ARCH, 512, 128, CostOptions(accounting="spec", decode_attention_factor=1)) == approx(
        1_350_068_862_976 - attention / 2)
    # [A4] shared actor-critic: both heads by default, value head only as the alternative.
    both = timing("inference", "actor_critic").W
    value = timing("inference", "actor_critic", CostOptions(accounting="spec", actor_critic_inference_heads="value")).W
    assert both - value == approx(64 * 640 * 2 * 32000 * 4096)
    assert timing("training", "actor_critic", CostOptions(accounting="spec", actor_critic_inference_heads="value")).W == approx(4 * both)
    # dp_scalar_allreduces (not in the source): k latency-bound AllReduces of 8 B over P_d = 2.
    base, four = timing("training", "policy"), timing("training", "policy", CostOptions(accounting="spec", dp_scalar_allreduces=4))
    one = 2 * 1 * 1.0e-5 + 2 * (1 / 2) * 8 / 200e9
    assert four.T_dp == approx(base.T_dp + 4 * one) and four.T_op == approx(base.T_op + 4 * one)
    assert timing("inference", "reference", CostOptions(accounting="spec", dp_scalar_allreduces=4)).T_op == approx(
        timing("inference", "reference").T_op)
    # [A16] AlltoAll priced with the P2P pair.
    p2p_reshard = reshard_node_time(param_count(ARCH, "policy"), 2, ALL8, HW, CostOptions(alltoall_family="p2p"))
    assert p2p_reshard == approx(7 * 5e-6 + 1_291_059_200 / 150e9)


def test_alternative_decode_tp_count():
    t = timing("generation", "policy", CostOptions(accounting="spec", tp_decode="per_microbatch"))
    calls = t.tp_calls("decode")
    assert calls.count == 2 * 16 * 4 * 127 and calls.msg == 262_144 / 4


# ---- annotate on a hand-lowered graph with Comm, Reshard and quantile sub-nodes -----------------


QUANTILES = (Quantile(0.5, Num(32)), Quantile(0.85, Num(64)), Quantile(1.0, Sym("Lr")))


def lowered_graph_with_transfers():
    fractions = (0.5, 0.35, 0.15)
    nodes = []
    for q in (1, 2, 3):
        nodes.append(ExecNode(f"gen#0.q{q}", "op", 0, 0, vertex="gen", role="generation", model="actor",
                              phase=q, nphases=3, alloc=ALL8, strategy=STRAT, fraction=fractions[q - 1]))
    for q in (1, 2, 3):
        nodes.append(ExecNode(f"c_y{q}", "comm", 0, 1, container="Y", alloc=HIGH4, src_alloc=LOW4,
                              bytes=data_bytes(81_920, fractions[q - 1]), fraction=fractions[q - 1]))
        nodes.append(ExecNode(f"ref_inf#0.q{q}", "op", 0, 1, vertex="ref_inf", role="inference", model="ref",
                              phase=q, nphases=3, alloc=ALL8, strategy=STRAT, fraction=fractions[q - 1]))
    nodes.append(ExecNode("r_actor", "reshard", 0, 2, model="actor", alloc=ALL8, src_alloc=ALL8,
                          strategy=STRAT, src_strategy=Strategy(4, 1, 2, 1)))
    nodes.append(ExecNode("train#0", "op", 0, 2, vertex="train", role="training", model="actor", alloc=ALL8, strategy=STRAT))
    n_m = param_count(ARCH, "policy")
    nodes.append(ExecNode("pub", "comm", 0, 0, model="actor", alloc=HIGH4, src_alloc=ALL8,
                          bytes=publication_bytes(n_m * 2, ALL8, HIGH4)))
    return toy_program(quantiles=QUANTILES, nodes=tuple(nodes))


def test_annotate_quantile_comm_and_reshard_nodes():
    p = annotate(lowered_graph_with_transfers(), HW, SPEC)
    t = {n.id: n.time for n in p.exec.nodes}
    # Spec 5.3 from the 8.2 numbers: T_pf = T_gemm^pf (mb+P_p-1)/mb + T_tp(prefill), same for decode.
    t_pf = 0.1387344 * 5 / 4 + 0.02403484
    t_dec = 1.113807 * 5 / 4 + 0.08660677
    assert t["gen#0.q1"] == approx(t_pf + t_dec * 32 / 128)
    assert t["gen#0.q2"] == approx(t_dec * 32 / 128)
    assert t["gen#0.q3"] == approx(t_dec * 64 / 128)
    assert t["gen#0.q1"] + t["gen#0.q2"] + t["gen#0.q3"] == approx(1.676318)
    for q, f in ((1, 0.5), (2, 0.35), (3, 0.15)):
        assert t[f"ref_inf#0.q{q}"] == approx(0.2504039 * f)
    assert (t["c_y1"], t["c_y2"], t["c_y3"]) == (approx(5.068267e-6), approx(5.047787e-6), approx(5.020480e-6))
    assert t["r_actor"] == approx(6.525296e-3)
    assert t["train#0"] == approx(0.9874231)
    assert t["pub"] == approx(8.612061e-3)
    # Comm and Reshard nodes hold no modelled memory; sub-nodes carry their parent's A.
    assert all(v == 17_296_261_120 for _, v in p.exec.memory.peak)
    assert all(n.time is not None for n in p.exec.nodes)


def test_operator_overhead_terms():
    """[overhead] (not in the source; 0 in the spec's profile): per microbatch `call`, per token (prompt and response)
    of a replica's rows `token`, in T_non_gemm; generation's call and prompt tokens are in its prefill share, its
    generated tokens in its decode share; a teacher-forced forward's tokens are those the backend runs
    (`forward_length`: a row less its last token)."""
    oh = {"generation_call": 1e-3, "generation_token": 2e-6, "inference_call": 3e-4, "inference_token": 4e-7,
          "training_call": 5e-3, "training_token": 6e-6}
    hw = Hardware.from_dict({**HW_DICT, "overhead": oh})
    mb, rows = PLAN["mb"], WL.B * WL.R / PLAN["dp"]

    def both(role, kind):
        return (op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=HW),
                op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=hw))

    base, slow = both("generation", "policy")
    assert slow.prefill_time - base.prefill_time == approx(mb * 1e-3 + rows * WL.Lp * 2e-6)
    assert slow.decode_time - base.decode_time == approx(rows * WL.Lr * 2e-6)
    assert slow.T_non_gemm - base.T_non_gemm == approx(mb * 1e-3 + rows * (WL.Lp + WL.Lr) * 2e-6)
    base, slow = both("inference", "reference")
    assert slow.T_op - base.T_op == approx(mb * 3e-4 + rows * (WL.Lp + WL.Lr - 1) * 4e-7)
    base, slow = both("training", "policy")
    assert slow.T_op - base.T_op == approx(mb * 5e-3 + rows * (WL.Lp + WL.Lr - 1) * 6e-6)
    assert HW.overhead == type(HW.overhead)()  # an optional table: profiles without it keep the spec's model


def test_annotate_adds_the_control_round_trip_to_every_node():
    """[overhead] node: every exec node (op, quantile phase, comm, reshard) costs the runtime's round trip once;
    transfer: every Comm and Reshard node its fixed cost beside the link's."""
    hw = Hardware.from_dict({**HW_DICT, "overhead": {"node": 2e-3, "transfer": 5e-4}})
    nodes = annotate(lowered_graph_with_transfers(), HW, SPEC).exec.nodes
    base = {n.id: n.time for n in nodes}
    slow = {n.id: n.time for n in annotate(lowered_graph_with_transfers(), hw, SPEC).exec.nodes}
    assert base.keys() == slow.keys() and len(base) > 5
    kinds = {n.id: n.kind for n in nodes}
    assert {"op", "comm", "reshard"} <= set(kinds.values())
    assert all(slow[i] - base[i] == approx(2e-3 + (5e-4 if kinds[i] != "op" else 0.0)) for i in base)


def test_annotate_requires_lowered_graph():
    p = toy_program()
    unlowered = dataclasses.replace(p, exec=dataclasses.replace(p.exec, lowered=False))
    with pytest.raises(RpegError, match="insert-comm and insert-reshard"):
        annotate(unlowered, HW)
    with pytest.raises(RpegError, match="executable graph"):
        annotate(dataclasses.replace(p, exec=None), HW)


def test_annotate_rejects_generation_without_vocabulary_head():
    p = toy_program()
    critic = Model("actor", "critic", True, ARCH)
    with pytest.raises(RpegError, match="vocabulary head"):
        annotate(dataclasses.replace(p, models=(critic, p.models[1])), HW)


# ---- residency beyond the co-located chain (spec 6.5, [A14]) --------------------------------------


def two_allocation_program(gen_alloc, train_alloc, tau):
    cluster = Cluster("two", 1, 1, 16, "spec-8.1")
    nodes = (
        ExecNode("gen#0", "op", 0, 0, vertex="gen", role="generation", model="actor", alloc=gen_alloc, strategy=STRAT),
        ExecNode("train#0", "op", 0, 1, vertex="train", role="training", model="actor", alloc=train_alloc, strategy=STRAT),
    )
    return toy_program(cluster=cluster, nodes=nodes, staleness=(("actor", tau),))


def test_shadow_copy_on_disjoint_serving_gpus():
    dm = program_memory(two_allocation_program(Alloc((0, 0, 0), (1, 1, 8)), Alloc((0, 0, 8), (1, 1, 8)), tau=1), HW,
                        SPEC)
    assert list(dm.residency["actor"]) == [SHADOW] * 8 + [TRAINING] * 8
    assert list(dm.persistent[:8]) == [2_778_726_400] * 8  # W_shard s_b of the generation layout
    assert list(dm.transient[:8]) == [2_980_052_992] * 8  # A_core: weights are resident
    assert list(dm.peak[8:]) == [8_336_179_200 + 6_181_355_520] * 8


def test_synchronous_serving_gpus_receive_weights_transiently():
    dm = program_memory(two_allocation_program(Alloc((0, 0, 0), (1, 1, 8)), Alloc((0, 0, 8), (1, 1, 8)), tau=0), HW,
                        SPEC)
    assert list(dm.residency["actor"][:8]) == [NONE] * 8
    assert list(dm.persistent[:8]) == [0] * 8
    assert list(dm.transient[:8]) == [5_758_779_392] * 8


def test_partial_overlap_gives_none_outside_training():
    dm = program_memory(two_allocation_program(Alloc((0, 0, 4), (1, 1, 8)), Alloc((0, 0, 0), (1, 1, 8)), tau=1), HW,
                        SPEC)
    res = list(dm.residency["actor"])
    assert res[:8] == [TRAINING] * 8 and res[8:12] == [NONE] * 4 and res[12:] == [NONE] * 4
    assert list(dm.peak[4:8]) == [8_336_179_200 + 6_181_355_520] * 4  # training dominates A(gen)+M_w
    assert list(dm.peak[8:12]) == [5_758_779_392] * 4
    assert list(dm.peak[12:]) == [0] * 4


# ---- explain -------------------------------------------------------------------------------------


def test_explain_names_what_overflows():
    small = dataclasses.replace(HW, M_GPU=16 * GIB)
    text = explain(toy_program(), small, SPEC)
    assert "gen" in text and "T_non-gemm" in text and "1.6763e+00" in text
    verdict = text.strip().splitlines()
    assert verdict[-2].startswith("infeasible (r_peak = 1.1186)")
    assert verdict[-1].strip().startswith("devices 0-7: actor optimizer state 7.76 GiB + ref frozen weights 2.59 GiB")
    assert verdict[-1].endswith("= 16.11 GiB > 14.40 GiB usable")
    assert "feasible: every device fits" in explain(toy_program(), HW, SPEC)


def test_explain_groups_identical_devices():
    prog = two_allocation_program(Alloc((0, 0, 0), (1, 1, 8)), Alloc((0, 0, 8), (1, 1, 8)), tau=1)
    text = explain(prog, HW, SPEC)
    assert "devices 8-15: peak 13.52 = actor optimizer state 7.76" in text
    assert "devices 0-7: peak 5.36 = actor shadow copy 2.59 + gen activations 0.28 + gen KV cache 2.50" in text


def test_explain_from_a_plan_without_exec_graph():
    p = toy_program()
    plan = Plan("p", "toy", "node", tuple(Placement(v, ALL8, STRAT) for v in ("gen", "ref_inf", "train")))
    text = explain(dataclasses.replace(p, exec=None, plan=plan), HW, SPEC)
    assert "Transfers" not in text
    assert "devices 0-7: peak 16.11 = actor optimizer state 7.76 + ref frozen weights 2.59" in text
    with pytest.raises(RpegError, match="places no vertex 'train'"):
        explain(dataclasses.replace(p, exec=None, plan=dataclasses.replace(plan, placements=plan.placements[:2])), HW)


def test_allocation_outside_the_cluster_is_a_located_error():
    p = toy_program()
    node = dataclasses.replace(p.exec.nodes[0], alloc=Alloc((0, 0, 4), (1, 1, 8)), loc=Loc("toy.rpeg", 7, 3))
    bad = dataclasses.replace(p, exec=dataclasses.replace(p.exec, nodes=(node,) + p.exec.nodes[1:]))
    with pytest.raises(RpegError) as info:
        annotate(bad, HW)
    assert info.value.loc == Loc("toy.rpeg", 7, 3) and "outside cluster @node" in info.value.message


def test_layer_call_overhead_t_layer():
    """hardware t_layer (not in the source; 0 in the spec's profile): every forward call of a local
    layer costs t_layer, in T_non_gemm; generation splits it between its prefill and decode shares."""
    t_layer = 1e-4
    hw = Hardware.from_dict({**HW_DICT, "compute": {**HW_DICT["compute"], "t_layer": t_layer}})
    layers_local, mb = 32 / 2, 4

    def both(role, kind, opts=CostOptions()):
        return (op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=HW, opts=opts),
                op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=hw, opts=opts))

    base, slow = both("inference", "reference")
    assert slow.T_non_gemm - base.T_non_gemm == approx(mb * layers_local * t_layer)
    base, slow = both("training", "policy")
    assert slow.T_op - base.T_op == approx(4 * mb * layers_local * t_layer)  # 4 forward-equivalents
    base, slow = both("generation", "policy")
    assert slow.prefill_time - base.prefill_time == approx(mb * layers_local * t_layer)
    assert slow.decode_time - base.decode_time == approx(127 * layers_local * t_layer)  # batched decode
    assert slow.T_op - base.T_op == approx((mb + 127) * layers_local * t_layer)
    _, per_mb = both("generation", "policy", CostOptions(accounting="spec", tp_decode="per_microbatch"))
    assert per_mb.launch_decode == approx(127 * mb * layers_local * t_layer)
    assert HW.t_layer == 0.0  # an optional key: profiles without it keep the spec's model


def test_rope_rotations_priced_per_layer_call_and_rotated_element():
    """hardware rope_* (not in the source; 0 in the spec's profile): a RoPE model's every layer call rotates its TP
    shard's query and key heads of each token it computes, a fixed part and a part per element; a training step's
    forwards (its recomputation's too) and one backward; a model with learned positions pays none of it."""
    a, e, c, g = 3e-5, 1e-9, 1.2e-4, 1.6e-9
    hw = Hardware.from_dict({**HW_DICT, "compute": {**HW_DICT["compute"], "rope_call": a, "rope_element": e,
                                                    "rope_backward_call": c, "rope_backward_element": g}})
    layers_local, mb, rows = 32 / 2, 4, 64 / 2  # pp = 2; dp = 2 replicas of the 64 rows
    rotated = (32 / 2 + 32 / 2) * 128  # tp = 2 shards the query and the key heads

    def both(role, kind, arch=ARCH, opts=CostOptions()):
        return (op_time(role, arch, kind, WL, **PLAN, gpus_per_node=8, hw=hw, opts=opts),
                op_time(role, arch, kind, WL, **PLAN, gpus_per_node=8, hw=hw, opts=opts, rope=True))

    ell = 639  # the tokens of a row less its last (`forward_length`), where generation's prefill has 512
    learned, rope = both("inference", "reference")
    assert rope.T_non_gemm - learned.T_non_gemm == approx(layers_local * (mb * a + rows * ell * rotated * e))
    learned, rope = both("training", "policy")
    forward = layers_local * (mb * a + rows * ell * rotated * e)
    backward = layers_local * (mb * c + rows * ell * rotated * g)
    assert rope.T_op - learned.T_op == approx(2 * forward + backward)  # recomputation: a second forward
    learned, rope = both("generation", "policy")
    assert rope.prefill_time - learned.prefill_time == approx(layers_local * (mb * a + rows * 512 * rotated * e))
    assert rope.decode_time - learned.decode_time == approx(layers_local * 127 * (a + rows * rotated * e))
    # fewer key heads than TP ranks: each rank keeps one whole
    gqa = dataclasses.replace(ARCH, kv_heads=1)
    learned, rope = both("inference", "reference", gqa)
    assert rope.T_op - learned.T_op == approx(layers_local * (mb * a + rows * ell * (16 + 1) * 128 * e))
    assert op_time("inference", ARCH, "reference", WL, **PLAN, gpus_per_node=8, hw=HW, rope=True).T_op == approx(
        op_time("inference", ARCH, "reference", WL, **PLAN, gpus_per_node=8, hw=HW).T_op)  # keys left out: 0


def test_a_checkpoint_model_is_priced_with_its_rotations_on_the_pass_path():
    """`Model.rope` (a Hugging Face checkpoint's network: the backend builds RoPE for it, learned positions else) is
    what annotate prices every placed operator with."""
    from rpegc.core.cost.annotate import node_placement, placement_time

    hw = Hardware.from_dict({**HW_DICT, "compute": {**HW_DICT["compute"], "rope_call": 3e-5, "rope_element": 1e-9,
                                                    "rope_backward_call": 1e-4, "rope_backward_element": 2e-9}})
    p = toy_program()
    hf = dataclasses.replace(p, models=tuple(dataclasses.replace(m, hf="ckpt") for m in p.models))
    assert all(m.rope for m in hf.models) and not any(m.rope for m in p.models)
    for n in p.exec.nodes:
        model = p.model(n.model)
        grown = placement_time(hf, node_placement(n, hf), hw).T_op - placement_time(p, node_placement(n, p), hw).T_op
        alone = [op_time(n.role, ARCH, model.kind, WL, **PLAN, gpus_per_node=8, hw=hw, rope=r).T_op
                 for r in (False, True)]
        assert grown == approx(alone[1] - alone[0]) and grown > 0


def test_a_recomputed_forward_pays_its_own_fixed_costs():
    """[overhead] recompute_call and recompute_token: each forward a training step recomputes (n_fe - 3 of them) costs
    them per microbatch and per token of the replica's rows beside its kernels; a step without recomputation none."""
    call, token = 2e-3, 3e-6
    hw = Hardware.from_dict({**HW_DICT, "overhead": {"recompute_call": call, "recompute_token": token}})
    mb, rows = 4, 64 / 2

    def priced(recompute, profile):
        train = Training(precision="mixed", zero=2, recompute=recompute, schedule="1f1b")
        return op_time("training", ARCH, "policy", WL, **PLAN, gpus_per_node=8, hw=profile, train=train).T_op

    for recompute in ("interval", "full"):
        assert priced(recompute, hw) - priced(recompute, HW) == approx(mb * call + rows * 639 * token)
    assert priced("none", hw) == priced("none", HW)


def test_the_speed_witness_is_priced_once_per_operator():
    """[overhead] witness (runtime/speed_probe.py): a CPU worker ends every operator with the speed witness, one call
    whatever the microbatches, rows or role; 0 where the profile leaves it out (the spec's model)."""
    hw = Hardware.from_dict({**HW_DICT, "overhead": {"witness": 2.5e-4}})
    for role, kind in (("generation", "policy"), ("inference", "reference"), ("training", "policy")):
        base = op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=HW)
        witnessed = op_time(role, ARCH, kind, WL, **PLAN, gpus_per_node=8, hw=hw)
        assert witnessed.T_op - base.T_op == approx(2.5e-4)
    assert HW.overhead.witness == 0.0
