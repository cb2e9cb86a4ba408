"""How a training operator trains, priced (core/ir/training.py; issue 32, item 1): precision, ZeRO stage, activation
recomputation and pipeline schedule, on the worked example of docs/cost-model-spec.md Section 8 (test_cost_spec.py:
LLaMA-7B-like, (P_d, P_p, P_t) = (2, 2, 2), mb = 4, bf16), each term derived by hand from the spec's numbers."""

from __future__ import annotations

import dataclasses

import pytest

from rpegc.core.cost.memory import layer_saved_bytes, op_memory
from rpegc.core.cost.optime import op_time
from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Workload
from rpegc.core.ir.training import TrainSpec, Training, resolve
from fixtures.spec_example import ARCH, HW, PLAN, SCALAR_AR, WL, approx

W = 1_389_363_200  # W_shard of the example (spec 8.4)
RS = 6.465296e-3  # one ReduceScatter (and one AllGather) of its 2,582,118,400 gradient bytes over P_d = 2
T_OPT = 3.873178e-3  # one Adam step over the shard, W / P_d of it per replica
TOKENS = 8 * 639  # b_loc x (L_p + L_r - 1) of a microbatch: the backend's forward runs a row less its last token
D = 4096
BUCKET = 25 << 20  # a reduction bucket: a quarter of a replica's gradient share, at most 25 MiB
LARGEST = 32000 * 4096  # the largest parameter: the LM head (V x d)
HEAD = 20 * 128 * 32000  # the head's backward: one sequence's L_r x V logits at 2 + 2 + 4 x 4 bytes each (bf16)


def train(precision="mixed", zero=2, recompute="interval", schedule="1f1b") -> Training:
    return Training(precision, zero, recompute, schedule)


def memory(t: Training, opts=CostOptions()):
    return op_memory("training", ARCH, "policy", WL, **PLAN, train=t, opts=opts)


def timing(t: Training, opts=CostOptions()):
    return op_time("training", ARCH, "policy", WL, **PLAN, gpus_per_node=8, hw=HW, opts=opts, train=t)


def test_defaults_resolve_from_the_workload_and_the_placement_overrides_them():
    assert WL.training() == train()
    assert Workload(1, 1, 1, 1, "fp32").training() == train("fp32")
    wl = dataclasses.replace(WL, train=TrainSpec(zero=1, schedule="gpipe"))
    assert wl.training() == train(zero=1, schedule="gpipe")
    assert wl.training(TrainSpec(zero=0, recompute="full")) == train(zero=0, recompute="full", schedule="gpipe")
    with pytest.raises(RpegError, match="precision = mixed .* dtype = fp32"):
        resolve("fp32", TrainSpec(precision="mixed"))
    with pytest.raises(RpegError, match="zero = 3"):
        TrainSpec(zero=3)


def test_zero_stages_shard_what_they_say_and_price_their_reductions():
    """ZeRO 0: 12 B per parameter and the gradients on every replica, one AllReduce (= RS + AG in the ring model),
    Adam over the whole shard; 1: the state / P_d, one RS and one AG; 2: the gradients / P_d too, a RS after each of
    the mb = 4 microbatches; beside them the backend's AllReduces of statistics (SCALAR_AR: four, and under ZeRO >= 1
    the gradient norm's). Beyond the shard the gradients hold their reduction's buckets: under ZeRO-2 one completing
    per replica and the flat copy being reduced (3 x 25 MiB); under ZeRO 0 and 1 the flat copy of one, and, as they
    accumulate over the 4 microbatches, a fresh gradient of the largest parameter (the LM head) beside its sum."""
    accumulated = 2 * W + BUCKET + 2 * LARGEST
    expect = {0: (12 * W, accumulated, 2 * RS + 4 * SCALAR_AR, 2 * T_OPT),
              1: (6 * W, accumulated, 2 * RS + 5 * SCALAR_AR, T_OPT),
              2: (6 * W, W + 3 * BUCKET, 5 * RS + 5 * SCALAR_AR, T_OPT)}
    for zero, (state, grads, t_dp, t_opt) in expect.items():
        m, t = memory(train(zero=zero)), timing(train(zero=zero))
        assert (m.state, m.M_grad, m.M_w) == (state, grads, 2 * W), zero
        assert m.A_core == m.M_act + m.M_w + m.M_grad
        assert t.T_dp == approx(t_dp) and t.T_opt == approx(t_opt), zero
    assert timing(train(zero=0)).dp.gather == 0 and timing(train(zero=2)).dp.reduces == 4
    assert timing(train(zero=2), CostOptions(accounting="spec")).T_dp == approx(2 * RS)  # spec 3.4.3


def test_fp32_precision_keeps_its_float32_weights_as_the_masters():
    """fp32 on a bf16 workload: the float32 working weights persist (they are the masters) beside 8 B of moments per
    parameter of the share; float32 gradients; every training byte count doubles (TP, PP, DP messages)."""
    m, mixed = memory(train("fp32")), memory(train())
    assert m.M_w == 4 * W and m.state == 4 * W + 8 * W / 2 and m.M_grad == 4 * W / 2 + 3 * BUCKET
    assert m.A_core == m.M_act + m.M_grad  # no transient working copy
    t, base = timing(train("fp32")), timing(train())
    assert t.dp.msg == 2 * base.dp.msg and t.tp_calls("forward").msg == 2 * base.tp_calls("forward").msg
    assert t.pp.msg == 2 * base.pp.msg
    assert m.layer_bytes == 4 * (5 * D + 4 * D / 2 + 2 * 11008 / 2) + 4 * (32 / 2 + 2)  # no float32 upcasts
    assert mixed.layer_bytes == 2 * (5 * D + 4 * D / 2 + 2 * 11008 / 2) + 4 * (32 / 2 + 2) + 6 * D


def test_fp32_gemms_of_a_16bit_workload_run_at_the_profiles_fp32_ceiling():
    slow = dataclasses.replace(HW, F_peak_fp32=HW.F_peak / 16)
    t = op_time("training", ARCH, "policy", WL, **PLAN, gpus_per_node=8, hw=slow, train=train("fp32"))
    base = op_time("training", ARCH, "policy", WL, **PLAN, gpus_per_node=8, hw=slow, train=train())
    assert t.phase("forward").F_compute == approx(base.phase("forward").F_compute / 16)
    fp32_workload = op_time("training", ARCH, "policy", dataclasses.replace(WL, dtype="fp32"), **PLAN, gpus_per_node=8,
                            hw=slow, train=train("fp32"))
    assert fp32_workload.phase("forward").F_compute == base.phase("forward").F_compute  # its own dtype's F_peak


def test_recomputation_keeps_segment_inputs_and_one_segment_or_every_layer():
    """L/P_p = 16 layers of 104,008 B per token (bf16); 2 live microbatches (1F1B, min(mb, P_p)).
    interval: c = 4, n_ckpt = 4: 2 x (4 + 1) inputs + 4 layers + 3 inner inputs; full: c = 1, 2 x 17 inputs + 1 layer;
    none: 2 x (16 x (layer + input) + output), 3 forward-equivalents (W and the TP AllReduces 3/4 and 2/3)."""
    layer = layer_saved_bytes(ARCH, 2, 2)
    assert layer == 104_008
    expect = {"interval": 2 * 5 * 2 * D + 4 * layer + 3 * 2 * D, "full": 2 * 17 * 2 * D + layer,
              "none": 2 * (16 * (layer + 2 * D) + 2 * D)}
    for recompute, per_token in expect.items():
        assert memory(train(recompute=recompute)).M_act == TOKENS * per_token + HEAD, recompute
    none, interval = timing(train(recompute="none")), timing(train())
    assert none.W == approx(interval.W * 3 / 4)
    assert none.tp_calls("forward").count == 2 * 2 * 16 * 4 and interval.tp_calls("forward").count == 3 * 2 * 16 * 4
    assert timing(train(recompute="full")).T_op == approx(interval.T_op)  # the same work, fewer bytes held
    assert memory(train(recompute="full")).M_act < memory(train()).M_act


def test_gpipe_holds_every_microbatch():
    one_f_one_b, gpipe = memory(train()), memory(train(schedule="gpipe"))
    assert (one_f_one_b.live, gpipe.live) == (2, 4)
    # the live microbatches' segment inputs double; the one recomputed segment does not
    assert gpipe.M_act - one_f_one_b.M_act == TOKENS * 2 * 5 * 2 * D
    assert timing(train(schedule="gpipe")).T_op == timing(train()).T_op  # the same bubble (spec 3.3)


def test_serving_operators_hold_their_vocabulary_wide_float32_tensors():
    """Reference inference: a sequence's response rows (L_r x V = 4,096,000 floats) exceed a piece, so two one-row
    pieces; generation's sampling step over the microbatch's b_loc = 8 rows: tempered logits, log-softmax and the
    float32 copy of bf16 logits (3 x 4 B), float64 probabilities and their cumulative sum (2 x 8 B)."""
    ref = op_memory("inference", ARCH, "reference", WL, **PLAN)
    gen = op_memory("generation", ARCH, "policy", WL, **PLAN)
    assert ref.pieces == 2 * 4 * 128 * 32000 and ref.M_act == 369_045_504 + ref.pieces  # 8 x 639 tokens
    assert gen.pieces == 28 * 8 * 32000 and gen.M_act == 295_698_432 + gen.pieces
    critic = op_memory("inference", ARCH, "critic", WL, **PLAN)
    assert critic.pieces == 0  # no LM head
