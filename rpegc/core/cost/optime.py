"""Operator-node time T_op = T_gemm + T_bubble + T_comm + T_non-gemm + T_opt (paper Sec. V-B,
App. D; spec 3).

`op_time` prices one Op vertex under one plan. Plan quantities (dp, pp, tp, mb, tiers) may be
Python scalars or numpy arrays of equal shape, so the optimizer can price many candidate plans of
a vertex in one call; the result's fields then are arrays. Tiers are names from `geometry.TIERS` or
arrays of their indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from rpegc.core.cost.attention import decode_attention, layer_attention
from rpegc.core.cost.collectives import allgather, allreduce, p2p, reduce_scatter
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.params import layer_gemm_params, param_count
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.ir.training import Training
from rpegc.core.cost.work import forward_length, generation_work, inference_work, training_work

_TINY = 1e-300  # F_eff floor: a phase without work (L_r = 1 decode) then takes 0 s, not 0/0
ADAM_BYTES_PER_PARAM = 18  # effective HBM traffic of one Adam step (spec 3.6)
SCALAR_BYTES = 8  # one fp64 statistic (option dp_scalar_allreduces)
# A quantity of one configuration, or an array of them (the batched evaluator's form; `op_time` takes both).
Quantity = Union[float, np.ndarray]

NON_GEMM_MULTIPLIER = {"generation": 0, "inference": 1, "training": 4}


@dataclass(frozen=True)
class GemmPhase:
    """Roofline of one GEMM phase (spec 3.1-3.2); `W` is the phase's whole-operator work."""

    name: str  # "forward" (inference/training), "prefill" or "decode"
    ell: Quantity
    rows: Quantity  # sequences per device per GEMM (b_loc, or BR/P_d for [A5] "local_batch")
    W: Quantity
    W_dev: Quantity
    Omega_W: Quantity
    Omega_A: Quantity
    I: Quantity
    eta: Quantity
    F_compute: Quantity  # F_peak * eta
    F_memory: Quantity  # I * BW_mem
    F_eff: Quantity
    T_gemm: Quantity


@dataclass(frozen=True)
class TpCalls:
    """`count` TP AllReduces of `msg` bytes each, `per_call` seconds each (spec 3.4.1)."""

    name: str
    count: Quantity
    msg: Quantity
    per_call: Quantity

    @property
    def time(self):
        return self.count * self.per_call


@dataclass(frozen=True)
class PpComm:
    """Pipeline boundary transfers: `steps` steps of `per_step` seconds (spec 3.4.2)."""

    steps: Quantity
    msg: Quantity
    n_intra: Quantity
    n_inter: Quantity
    per_step: Quantity

    @property
    def time(self):
        return self.steps * self.per_step


@dataclass(frozen=True)
class DpComm:
    """The data-parallel collectives of one training step over `msg` bytes (spec 3.4.3 under the operator's ZeRO
    stage): `reduces` gradient reductions of `reduce` seconds each (ZeRO 0: one AllReduce; ZeRO 1: one
    ReduceScatter onto the owners; ZeRO 2: a ReduceScatter after every microbatch's backward pass, mb of them), the
    updated weights' AllGather from their owners (`gather` seconds; none under ZeRO 0), and the AllReduces of a few
    scalars (`scalars` seconds in all: the backend's own under `accounting = backend`, and the option
    `dp_scalar_allreduces`' more)."""

    msg: Quantity
    reduce: Quantity
    reduces: Quantity
    gather: Quantity
    scalars: Quantity = 0.0

    @property
    def time(self):
        return self.reduces * self.reduce + self.gather + self.scalars


@dataclass(frozen=True)
class OpTime:
    """Every term of T_op with the intermediates behind it (printed by `explain`)."""

    role: str
    P: Quantity
    b_loc: Quantity
    N_m: int
    W: Quantity
    phases: tuple[GemmPhase, ...]
    tp: tuple[TpCalls, ...]
    pp: Optional[PpComm]
    dp: Optional[DpComm]
    T_gemm: Quantity
    T_bubble: Quantity
    T_tp: Quantity
    T_pp: Quantity
    T_dp: Quantity
    T_non_gemm: Quantity
    T_opt: Quantity
    bubble_factor: Quantity  # T_bubble / T_gemm
    decode_pp: Optional[PpComm] = None  # [A7] "wavefront": the decode loop's transfers (in T_pp)
    # Fixed time beside the kernels (not in the source), included in T_non_gemm: per layer call (hardware t_layer),
    # a RoPE model's rotations (`rope_time`) and the operator's per-call and per-token overhead ([overhead]); for
    # generation split into its prefill and decode shares.
    T_launch: Quantity = 0.0
    launch_prefill: Quantity = 0.0
    launch_decode: Quantity = 0.0

    @property
    def T_comm(self):
        return self.T_tp + self.T_pp + self.T_dp

    @property
    def T_op(self):
        return self.T_gemm + self.T_bubble + self.T_comm + self.T_non_gemm + self.T_opt

    def phase(self, name: str) -> GemmPhase:
        return next(p for p in self.phases if p.name == name)

    def tp_calls(self, name: str) -> TpCalls:
        return next(c for c in self.tp if c.name == name)

    @property
    def prefill_time(self):
        """T_pf of spec 5.3: the prefill's GEMM with its bubble share, TP and (option A7) PP."""
        pp = self.pp.time if self.pp is not None else 0.0
        return (self.phase("prefill").T_gemm * (1 + self.bubble_factor) + self.tp_calls("prefill").time + pp
                + self.launch_prefill)

    @property
    def decode_time(self):
        """T_dec of spec 5.3: the decode's GEMM with its bubble share, TP and (option A7) PP."""
        pp = self.decode_pp.time if self.decode_pp is not None else 0.0
        return (self.phase("decode").T_gemm * (1 + self.bubble_factor) + self.tp_calls("decode").time + pp
                + self.launch_decode)


def backend_scalar_allreduces(zero: int) -> int:
    """The AllReduces of a few scalars a training operator of the torch backend makes over its DP group in one step
    of one epoch and one minibatch (runtime/backends/torch/rl/algorithms/rollout.py): the batch's token count, the
    minibatches' loss normalisers and the step's metrics, and per optimizer step the loss statistics
    (`schedules.train_step`) and, under ZeRO >= 1, the squared norm of the replicas' gradient shares
    (`ZeroGradients.sq_total`). An advantage estimator that whitens over the batch (PPO's GAE by default)
    reduces its moments once more; the program does not say which estimator runs, so that one is not counted.
    `tests/test_torchrun_zero.py` counts them in a real step."""
    return 4 + int(zero > 0)


def data_parallel(msg, dp, mb, train: Training, hw: Hardware, span_tier, opts: CostOptions) -> DpComm:
    """The DP collectives of one step of a training operator whose gradients of a stage's TP shard are `msg` bytes
    (DpComm's docstring; spec 3.4.3, `accounting = "spec"`, prices ZeRO-2 as one ReduceScatter + one AllGather,
    which holds only the shard of the gradients at mb = 1, and no scalar AllReduces beyond the option's)."""
    a_dp, b_dp = hw.coll(span_tier)
    own = backend_scalar_allreduces(train.zero) if opts.accounting == "backend" else 0
    scalars = (own + opts.dp_scalar_allreduces) * allreduce(SCALAR_BYTES, dp, a_dp, b_dp)
    if train.zero == 0:
        return DpComm(msg, allreduce(msg, dp, a_dp, b_dp), 1 + 0 * mb, 0.0 * msg, scalars)
    reduces = mb if train.zero == 2 and opts.accounting == "backend" else 1 + 0 * mb
    return DpComm(msg, reduce_scatter(msg, dp, a_dp, b_dp), reduces, allgather(msg, dp, a_dp, b_dp), scalars)


def rotated_per_token(heads, kv_heads, head_dim, tp=1):
    """The query and key elements one layer of a RoPE model rotates per token on one rank: its TP shard's heads (a key
    head stays whole on a rank where there are fewer than tp)."""
    return (heads / tp + np.maximum(kv_heads / tp, 1)) * head_dim


def rope_time(arch: Arch, hw: Hardware, layers, tp, calls, tokens, backward: bool = False):
    """Seconds of a RoPE model's rotations on one device ([compute] rope_*, not in the source): `calls` calls of each
    of its `layers` layers over `tokens` tokens in all, each layer rotating every token's queries and keys
    (`rotated_per_token`). The forward's, or the backward's."""
    call, element = ((hw.rope_backward_call, hw.rope_backward_element) if backward
                     else (hw.rope_call, hw.rope_element))
    return layers * (calls * call + tokens * rotated_per_token(arch.heads, arch.kv_heads, arch.head_dim, tp) * element)


def op_time(
    role: str,
    arch: Arch,
    kind: str,
    wl: Workload,
    *,
    dp,
    pp,
    tp,
    mb,
    gpus_per_node: int,
    hw: Hardware,
    opts: CostOptions = DEFAULT_OPTIONS,
    span_tier="intra_node",
    pp_tier=None,
    train: Optional[Training] = None,
    rope: bool = False,
) -> OpTime:
    """T_op of one Op vertex (spec 3); a training operator's as `train` says (the workload's training by default).
    `rope`: the model rotates its queries and keys (`Model.rope`), priced by `rope_time`.

    `span_tier` is tier(sigma(v)) (DP collectives, inter-node PP boundaries); `pp_tier` overrides
    the latter (option A8 "replica"). `gpus_per_node` is the cluster's N_g. Generation and inference run on the
    rows a step draws (`Workload.for_role`: dynamic sampling's over-sampling).
    """
    wl = wl.for_role(role)
    pp_tier = span_tier if pp_tier is None else pp_tier
    train = (train if train is not None else wl.training()) if role == "training" else None
    # Element bytes of what the operator computes on: the working dtype of a training operator (float32 under
    # precision = fp32), else the workload's; float32 GEMMs of a 16-bit workload run at the profile's fp32 ceiling.
    s_b, d = (train.working_bytes(wl.s_b) if train is not None else wl.s_b), arch.hidden
    f_peak = hw.peak(fp32=s_b > wl.s_b)
    BR = wl.B * wl.R
    ell = forward_length(kind, wl.Lp, wl.Lr, opts)  # of inference and training (the spec's Lp + Lr)
    P = dp * pp * tp
    b_loc = BR / (dp * mb)
    layers_local = arch.layers / pp
    rows_replica = BR / dp  # the rows one replica runs (every stage and TP shard of it)
    oh = hw.overhead
    N_m = param_count(arch, kind)

    omega_w = layers_local / tp * layer_gemm_params(arch) * s_b
    k = np.minimum(d, arch.ffn) / tp
    width_eff = k / (k + hw.gamma_K)

    def gemm(name, W, W_dev, ell, rows) -> GemmPhase:
        omega_a = 2 * rows * ell * d * layers_local * s_b
        intensity = W_dev / (omega_w + omega_a)
        eta = rows * ell / (rows * ell + hw.gamma_M) * width_eff
        f_compute = f_peak * eta
        f_memory = intensity * hw.BW_mem
        f_eff = np.minimum(f_compute, f_memory)
        t = W / (P * np.maximum(f_eff, _TINY))
        return GemmPhase(name, ell, rows, W, W_dev, omega_w, omega_a, intensity, eta, f_compute, f_memory, f_eff, t)

    a_tp, b_tp = hw.coll("intra_node")

    def tp_calls(name, count, msg) -> TpCalls:
        return TpCalls(name, count, msg, allreduce(msg, tp, a_tp, b_tp))

    per_node = np.maximum(np.minimum(pp, np.floor(gpus_per_node / tp)), 1)
    n_inter = np.maximum(0, np.ceil(pp / per_node) - 1)
    n_intra = pp - 1 - n_inter

    def boundary(msg):
        """Seconds of one transfer of `msg` bytes across a stage boundary, averaged over the boundaries."""
        boundaries = np.maximum(pp - 1, 1)
        return n_intra / boundaries * p2p(msg, *hw.p2p("intra_node")) + n_inter / boundaries * p2p(msg, *hw.p2p(pp_tier))

    def pipeline(ell, steps) -> PpComm:
        msg = BR * ell * d * s_b / (dp * tp * mb)
        return PpComm(steps, msg, n_intra, n_inter, boundary(msg))

    def decode_loop() -> PpComm:
        """[A7] "wavefront": per decode step and microbatch, pp - 1 activation transfers of one token's
        rows and the sampled token ids (int64) back around the ring; the stage that waits on a
        receive is idle, so the transfers are on the critical path."""
        msg = b_loc * d * s_b / tp
        tokens = b_loc * 8  # int64 ids, last stage -> first: across nodes when the pipeline is
        back = np.where(n_inter > 0, p2p(tokens, *hw.p2p(pp_tier)), p2p(tokens, *hw.p2p("intra_node")))
        per_step = (pp - 1) * boundary(msg) + (pp > 1) * back
        return PpComm((wl.Lr - 1) * mb, msg, n_intra, n_inter, per_step)

    pp_comm: Optional[PpComm] = None
    decode_pp: Optional[PpComm] = None
    launch_prefill = launch_decode = 0.0
    dp_comm: Optional[DpComm] = None
    if role == "generation":
        # Work leaves Python's exact ints here: it can exceed int64 and numpy would then refuse it.
        W_pf, W_dec = (w * 1.0 for w in generation_work(arch, wl, opts))
        decode_steps = wl.Lr - 1
        steps_div = np.maximum(decode_steps, 1)
        local_batch = opts.decode_rows == "local_batch"
        dec_rows = BR / dp if local_batch else b_loc
        dec_dev = W_dec / (P * steps_div) if local_batch else W_dec / (P * mb * steps_div)
        phases = (gemm("prefill", W_pf, W_pf / (P * mb), wl.Lp, b_loc), gemm("decode", W_dec, dec_dev, 1, dec_rows))
        W = W_pf + W_dec
        if opts.tp_decode == "batched":
            decode_tp = tp_calls("decode", 2 * layers_local * decode_steps, BR * d * s_b / dp)
        else:
            decode_tp = tp_calls("decode", 2 * layers_local * mb * decode_steps, BR * d * s_b / (dp * mb))
        tps = (tp_calls("prefill", 2 * layers_local * mb, BR * wl.Lp * d * s_b / (dp * mb)), decode_tp)
        decode_calls = decode_steps * (mb if opts.tp_decode == "per_microbatch" else 1)
        # The fixed costs beside the kernels ([overhead]): one decode loop per microbatch and each prompt token of the
        # replica's rows in the prefill, each generated token in the decode.
        launch_prefill = mb * (layers_local * hw.t_layer + oh.generation_call) + rows_replica * wl.Lp * oh.generation_token
        launch_decode = decode_calls * layers_local * hw.t_layer + rows_replica * wl.Lr * oh.generation_token
        if rope:
            launch_prefill = launch_prefill + rope_time(arch, hw, layers_local, tp, mb, rows_replica * wl.Lp)
            launch_decode = launch_decode + rope_time(arch, hw, layers_local, tp, decode_calls,
                                                      rows_replica * decode_steps)
        launch_prefill = launch_prefill + layer_attention(hw.attention, arch, layers_local, tp, rows_replica, wl.Lp)
        launch_decode = launch_decode + decode_attention(hw.attention, arch, layers_local, tp, rows_replica, wl.Lp,
                                                         wl.Lr)
        launch = launch_prefill + launch_decode
        if opts.generation_pp in ("prefill", "wavefront"):
            pp_comm = pipeline(wl.Lp, mb + pp - 2)
        if opts.generation_pp == "wavefront":
            decode_pp = decode_loop()
    elif role == "inference":
        W = inference_work(arch, kind, wl, opts) * 1.0
        phases = (gemm("forward", W, W / (P * mb), ell, b_loc),)
        tps = (tp_calls("forward", 2 * layers_local * mb, BR * ell * d * s_b / (dp * mb)),)
        pp_comm = pipeline(ell, mb + pp - 2)
        launch = mb * (layers_local * hw.t_layer + oh.inference_call) + rows_replica * ell * oh.inference_token
        if rope:
            launch = launch + rope_time(arch, hw, layers_local, tp, mb, rows_replica * ell)
        launch = launch + layer_attention(hw.attention, arch, layers_local, tp, rows_replica, ell)
    elif role == "training":
        assert train is not None
        n_fe = train.forward_equivalents
        W = training_work(arch, kind, wl, n_fe, opts) * 1.0
        # Intensity is that of one forward-equivalent pass.
        phases = (gemm("forward", W, W / (n_fe * P * mb), ell, b_loc),)
        # Two TP AllReduces per layer in every forward-equivalent pass (the backward is one pass of them).
        count = 2 * (n_fe - 1) * layers_local * mb
        tps = (tp_calls("forward", count, BR * ell * d * s_b / (dp * mb)),)
        pp_comm = pipeline(ell, mb + 2 * pp - 3)
        # Every forward-equivalent pass (backward = 2) calls each layer once per microbatch, and each recomputed
        # forward (n_fe - 3 of them: none without recomputation) pays its own fixed costs.
        launch = (n_fe * mb * layers_local * hw.t_layer + mb * oh.training_call
                  + rows_replica * ell * oh.training_token
                  + (n_fe - 3) * (mb * oh.recompute_call + rows_replica * ell * oh.recompute_token))
        if rope:  # the forward passes (the step's and a recomputation's) and one backward
            tokens = rows_replica * ell
            launch = launch + ((n_fe - 2) * rope_time(arch, hw, layers_local, tp, mb, tokens)
                               + rope_time(arch, hw, layers_local, tp, mb, tokens, backward=True))
        # the attention of the same passes: every forward's (the step's and a recomputation's) and one backward
        forward_attention = layer_attention(hw.attention, arch, layers_local, tp, rows_replica, ell)
        launch = (launch + (n_fe - 2) * forward_attention
                  + layer_attention(hw.attention, arch, layers_local, tp, rows_replica, ell, backward=True))
        dp_comm = data_parallel(N_m * s_b / (pp * tp), dp, mb, train, hw, span_tier, opts)
    else:
        raise ValueError(f"unknown role {role!r}")
    # The speed witness a CPU worker ends the operator with (runtime/speed_probe.py; 0 where not run).
    launch = launch + oh.witness

    T_gemm = sum(ph.T_gemm for ph in phases)
    bubbled = role != "generation" or opts.bubble_on_generation
    bubble_factor = (pp - 1) / mb * bubbled
    zero = 0.0 * P  # a zero of the plan's shape
    T_ng0 = layers_local * hw.c_ng * (b_loc / hw.B_cal) * (1 - 1 / tp)
    # Every replica steps its ZeRO share (ZeRO 0: every parameter of its stage and TP shard).
    T_opt = (ADAM_BYTES_PER_PARAM * N_m / (pp * tp * train.shards_state(dp) * hw.BW_mem) if train is not None
             else zero)
    return OpTime(
        role=role,
        P=P,
        b_loc=b_loc,
        N_m=N_m,
        W=W,
        phases=phases,
        tp=tps,
        pp=pp_comm,
        dp=dp_comm,
        T_gemm=T_gemm,
        T_bubble=T_gemm * bubble_factor,
        T_tp=sum(c.time for c in tps),
        T_pp=(pp_comm.time if pp_comm is not None else zero) + (decode_pp.time if decode_pp is not None else zero),
        T_dp=dp_comm.time if dp_comm is not None else zero,
        T_non_gemm=NON_GEMM_MULTIPLIER[role] * T_ng0 + launch,
        T_opt=T_opt,
        bubble_factor=bubble_factor,
        decode_pp=decode_pp,
        T_launch=launch,
        launch_prefill=launch_prefill,
        launch_decode=launch_decode,
    )
