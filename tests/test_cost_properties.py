"""Properties of the cost model over random models, workloads, plans and hardware (hypothesis)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.cost.collectives import allgather, allreduce, alltoall, reduce_scatter
from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.memory import op_memory
from rpegc.core.cost.optime import op_time
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.ir.training import PRECISIONS, RECOMPUTES, SCHEDULES, ZERO_STAGES, Training
from rpegc.core.cost.transfer import generation_phase_time

SETTINGS = settings(max_examples=40, deadline=None)
ROLE_KINDS = [("generation", "policy"), ("generation", "actor_critic"), ("inference", "reference"),
              ("inference", "critic"), ("inference", "reward"), ("inference", "actor_critic"),
              ("training", "policy"), ("training", "critic"), ("training", "actor_critic")]
OPTIONS = st.builds(
    CostOptions,
    decode_rows=st.sampled_from(["local_mb", "local_batch"]),
    bubble_on_generation=st.booleans(),
    generation_pp=st.sampled_from(["none", "prefill", "wavefront"]),
    tp_decode=st.sampled_from(["batched", "per_microbatch"]),
    dp_scalar_allreduces=st.integers(0, 6),
    accounting=st.sampled_from(["backend", "spec"]),
)
# How training operators train (the workloads are bf16, so both precisions apply).
TRAININGS = st.builds(Training, precision=st.sampled_from(PRECISIONS), zero=st.sampled_from(ZERO_STAGES),
                      recompute=st.sampled_from(RECOMPUTES), schedule=st.sampled_from(SCHEDULES))


@st.composite
def archs(draw):
    heads = draw(st.sampled_from([4, 8, 16, 32]))
    hidden = heads * draw(st.sampled_from([16, 64, 128]))
    return Arch(
        layers=draw(st.sampled_from([2, 4, 8, 16, 32])),
        hidden=hidden,
        ffn=hidden * draw(st.sampled_from([2, 3, 4])),
        vocab=draw(st.integers(64, 130_000)),
        heads=heads,
        kv_heads=draw(st.sampled_from([h for h in (1, 2, 4, 8, 16, 32) if heads % h == 0])),
        gated=draw(st.booleans()),
    )


workloads = st.builds(Workload, B=st.integers(1, 64), R=st.integers(1, 4), Lp=st.integers(1, 1024), Lr=st.integers(1, 512))


@st.composite
def plans(draw, layers):
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if layers % p == 0]))
    return dict(
        dp=draw(st.sampled_from([1, 2, 4, 8])),
        pp=pp,
        tp=draw(st.sampled_from([1, 2, 4, 8])),
        mb=1 if pp == 1 else pp * draw(st.sampled_from([1, 2])),
        train=draw(TRAININGS),  # read by training operators only
    )


def positive(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


@st.composite
def hardwares(draw):
    def link():
        return {"alpha": draw(positive(0, 1e-4)), "beta": draw(positive(1e-13, 1e-9))}

    return Hardware.from_dict({
        "compute": {"F_peak": draw(positive(1e13, 1e15)), "BW_mem": draw(positive(1e11, 1e13)),
                    "gamma_M": draw(positive(0, 2048)), "gamma_K": draw(positive(0, 2048)),
                    "c_ng": draw(positive(0, 1e-2)), "B_cal": draw(positive(1, 64))},
        "memory": {"M_GPU": 80e9, "eps_rt": 0.1},
        "collective": {t: link() for t in ("intra_node", "inter_node", "inter_rack")},
        "p2p": {t: link() for t in ("intra_node", "inter_node", "inter_rack")},
    })


@st.composite
def cases(draw):
    arch = draw(archs())
    role, kind = draw(st.sampled_from(ROLE_KINDS))
    return role, kind, arch, draw(workloads), draw(plans(arch.layers)), draw(hardwares()), draw(st.integers(0, 2)), draw(OPTIONS)


def price(role, kind, arch, wl, plan, hw, tier, opts):
    return op_time(role, arch, kind, wl, **plan, gpus_per_node=8, hw=hw, opts=opts, span_tier=tier)


@SETTINGS
@given(cases(), positive(0.05, 1.0), positive(1.0, 20.0))
def test_more_bandwidth_never_slows_an_operator(case, beta_scale, bw_scale):
    role, kind, arch, wl, plan, hw, tier, opts = case
    faster = dataclasses.replace(
        hw,
        BW_mem=hw.BW_mem * bw_scale,
        beta_coll=tuple(b * beta_scale for b in hw.beta_coll),
        beta_p2p=tuple(b * beta_scale for b in hw.beta_p2p),
    )
    before = price(role, kind, arch, wl, plan, hw, tier, opts)
    after = price(role, kind, arch, wl, plan, faster, tier, opts)
    assert after.T_op <= before.T_op * (1 + 1e-12)
    assert after.T_gemm <= before.T_gemm * (1 + 1e-12)
    assert after.T_comm <= before.T_comm * (1 + 1e-12)


@SETTINGS
@given(archs(), workloads, st.data())
def test_serving_memory_never_grows_with_data_parallelism(arch, wl, data):
    plan = data.draw(plans(arch.layers))
    kind = data.draw(st.sampled_from(["policy", "reference", "critic", "reward"]))
    role = "generation" if kind == "policy" and data.draw(st.booleans()) else "inference"
    wider = dict(plan, dp=plan["dp"] * 2)
    small = op_memory(role, arch, kind, wl, **plan)
    large = op_memory(role, arch, kind, wl, **wider)
    assert large.A_core <= small.A_core
    assert large.A_with_weights <= small.A_with_weights
    assert large.W_shard == small.W_shard


@SETTINGS
@given(positive(0, 1e12), positive(0, 1e-3), positive(0, 1e-9))
def test_collectives_over_one_participant_are_free(M, alpha, beta):
    for primitive in (allreduce, allgather, reduce_scatter, alltoall):
        assert primitive(M, 1, alpha, beta) == 0
        assert primitive(M, 2, alpha, beta) >= 0


@SETTINGS
@given(cases())
def test_single_degree_parallelism_costs_no_communication(case):
    role, kind, arch, wl, plan, hw, tier, opts = case
    t = price(role, kind, arch, wl, dict(plan, dp=1, pp=1, tp=1, mb=1), hw, tier, opts)
    assert t.T_tp == 0 and t.T_pp == 0 and t.T_dp == 0 and t.T_bubble == 0 and t.T_non_gemm == 0


@SETTINGS
@given(archs(), workloads, hardwares(), OPTIONS, st.sampled_from(ROLE_KINDS), st.data())
def test_array_and_scalar_paths_agree(arch, wl, hw, opts, role_kind, data):
    role, kind = role_kind
    batch = [data.draw(plans(arch.layers)) for _ in range(data.draw(st.integers(1, 5)))]
    train = batch[0]["train"]  # one training for the batch: the array form prices one strategy's many shapes
    batch = [dict(p, train=train) for p in batch]
    tiers = [data.draw(st.integers(0, 2)) for _ in batch]
    arrays = {k: np.array([p[k] for p in batch]) for k in ("dp", "pp", "tp", "mb")}
    vec = op_time(role, arch, kind, wl, **arrays, gpus_per_node=8, hw=hw, opts=opts, span_tier=np.array(tiers),
                  train=train)
    vec_mem = op_memory(role, arch, kind, wl, **arrays, opts=opts, train=train)
    for i, (plan, tier) in enumerate(zip(batch, tiers)):
        one = op_time(role, arch, kind, wl, **plan, gpus_per_node=8, hw=hw, opts=opts, span_tier=tier)
        for term in ("T_gemm", "T_bubble", "T_tp", "T_pp", "T_dp", "T_non_gemm", "T_opt", "T_op"):
            assert np.asarray(getattr(vec, term))[i] == pytest.approx(float(getattr(one, term)), rel=1e-12, abs=1e-300), term
        one_mem = op_memory(role, arch, kind, wl, **plan, opts=opts)
        for term in ("W_shard", "M_act", "M_kv", "A_core", "A_with_weights"):
            assert np.asarray(getattr(vec_mem, term))[i] == pytest.approx(float(getattr(one_mem, term)), rel=1e-12), term


@SETTINGS
@given(cases(), st.lists(st.integers(1, 10_000), min_size=1, max_size=5, unique=True))
def test_generation_phases_sum_to_the_operator(case, cuts):
    _, _, arch, wl, plan, hw, tier, opts = case
    t = price("generation", "policy", arch, wl, plan, hw, tier, opts)
    tokens = sorted(cuts)
    parts = [generation_phase_time(t.prefill_time, t.decode_time, q, tokens[q - 1], tokens[q - 2] if q > 1 else 0, tokens[-1])
             for q in range(1, len(tokens) + 1)]
    assert sum(parts) == pytest.approx(float(t.T_op), rel=1e-9)
