"""Per-GPU memory of one operator and of one model's persistent state (paper Sec. V-D, App. D-H,
D-I; spec 6.1-6.5), plus capacity, feasibility and the OOM penalty factor (spec 6.6, 7).

A training operator trains as its `Training` says (core/ir/training.py: precision, ZeRO stage, recomputation,
pipeline schedule; the spec's baseline is mixed precision, ZeRO-2, recomputation every c layers and 1F1B), and its
terms are what the torch backend holds doing so (issue 32: the plan is a contract):
- the optimizer state S on a training GPU: FP32 masters and two moments (mixed, 12 B per parameter) or two moments
  (fp32, 8 B) of the replica's ZeRO share (ZeRO >= 1: / P_d), plus the float32 working weights themselves under
  fp32 (they are the masters and stay between steps). In mixed precision the 16-bit working copy is the version
  the step trains, which the backend takes over from its published copy: a transient of the operator, M_w;
- the gradients: the working dtype, of the replica's share under ZeRO-2 (reduced after every microbatch);
- activations (`accounting = "backend"`): the segment inputs every live microbatch keeps (the input of every
  segment of c layers and the stage's output), one segment's saved tensors while it is recomputed
  (`layer_saved_bytes` per layer: what the backend's block saves, bench/layer_activations.py), or without
  recomputation every layer's saved tensors and input for every live microbatch; live = min(mb, P_p) under 1F1B,
  mb under GPipe. `accounting = "spec"` is the spec's [B] form (every live microbatch reserves its checkpoints and
  a recompute buffer of [A12]'s width).
Serving operators with an LM head also hold the float32 log-softmax of `LOGPROB_PIECE` elements at a time (two
pieces at once), which the backend computes log-probs in. Plan quantities may be scalars or numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from rpegc.core.cost.optime import Quantity
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.cost.params import (LM_HEAD_KINDS, SCALAR_HEAD_KINDS, ffn_matrices, final_norm_params,
                                    layer_replicated_params, layer_sharded_params)
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.ir.training import Training

BETA_OOM = 40.0  # spec 1.3 / 7
# Float32 elements of one piece of a vocabulary-wide log-softmax: the torch backend computes log-probs (inference,
# the training head) a few sequences at a time so that no larger vocabulary-wide float32 tensor exists, and holds
# two such pieces at once (the log-softmax and its input). Declared here, read by the backend (rl.py).
LOGPROB_PIECE = 1 << 20
FP32 = 4

# Residency of a model on a device (spec 6.5), in rule order.
NONE, TRAINING, FROZEN, SHADOW = 0, 1, 2, 3


def weight_shard(arch: Arch, kind: str, pp, tp):
    """W_shard: parameters on the worst pipeline stage's GPU (spec 6.1, [A21]).

    TP shards the transformer layers' projections (and their biases); norms, the embedding (first stage) and the
    heads with the final norm (last stage) are replicated. A single stage holds the embedding and a separate
    LM-head copy (untied, as the torch backend trains even a tied checkpoint's pair).
    """
    E = arch.vocab * arch.hidden
    first = E
    last = (kind in LM_HEAD_KINDS) * E + (kind in SCALAR_HEAD_KINDS) * arch.hidden + final_norm_params(arch)
    nonsplit = (pp == 1) * (first + last) + (pp != 1) * np.maximum(first, last)
    per_layer = layer_sharded_params(arch) / tp + layer_replicated_params(arch)
    return arch.layers / pp * per_layer + nonsplit


def checkpoint_interval(layers_local, opts: CostOptions = DEFAULT_OPTIONS):
    """c = max(1, floor(sqrt(L/P_p))) ([A11]; "ceil" is the alternative rounding)."""
    root = np.sqrt(layers_local)
    return np.maximum(1, np.floor(root) if opts.checkpoint_interval == "floor" else np.ceil(root))


def segment_layers(recompute: str, layers_local, opts: CostOptions = DEFAULT_OPTIONS):
    """Layers per recomputed segment: c of [A11] (interval), 1 (full); None without recomputation."""
    if recompute == "none":
        return None
    return checkpoint_interval(layers_local, opts) if recompute == "interval" else np.ones_like(layers_local)


def layer_saved_bytes(arch: Arch, tp, s_t: int):
    """Bytes per token one transformer layer of the torch backend saves for its backward pass, its input aside
    (bench/layer_activations.py counts them with autograd's saved-tensor hooks; tests/test_bench_smoke.py holds the
    two equal): in the working dtype (s_t bytes) the two RMSNorms' inputs and outputs with the attention's residual
    sum (5 d, replicated over TP), the attention's q, k, v (k, v repeated to every head) and output (4 d / P_t), the
    FFN's d_ff-wide tensors (gate, up, their SiLU and product: 4 d_ff / P_t; two without a gate); in float32 the
    attention's log-sum-exp per head and the norms' reciprocal RMS (4 (heads / P_t + 2)); in a 16-bit dtype 6 d
    bytes more: the norms compute their statistic on a float32 copy of their input (in float32 the input itself)."""
    d = arch.hidden
    ffn = (4 if arch.gated else 2) * arch.ffn / tp
    upcast = 6 * d if s_t < FP32 else 0
    return s_t * (5 * d + 4 * d / tp + ffn) + FP32 * (arch.heads / tp + 2) + upcast


def live_microbatches(train: Training, pp, mb):
    """Microbatches whose activations a stage holds at once: min(mb, P_p) under 1F1B's warm-up, mb under GPipe."""
    return np.minimum(mb, pp) if train.schedule == "1f1b" else mb * np.ones_like(pp)


def logprob_piece_bytes(arch: Arch, kind: str, role: str, b_loc, Lr):
    """What a serving operator with an LM head holds of vocabulary-wide float32 log-softmax at once: two pieces of
    LOGPROB_PIECE elements, or of one row when a row is larger (a sequence's Lr response positions in inference, one
    position of a decode step in generation), never more rows than the microbatch's b_loc."""
    if kind not in LM_HEAD_KINDS or role == "training":
        return 0.0 * b_loc
    per_row = arch.vocab * (1 if role == "generation" else Lr)
    piece_rows = np.minimum(b_loc, np.maximum(1, LOGPROB_PIECE // per_row))
    return 2 * FP32 * piece_rows * per_row


def buffer_width(arch: Arch, tp, opts: CostOptions = DEFAULT_OPTIONS):
    """Per-token scalars of the widest recompute buffer: attention vs FFN ([A12]); a gated FFN holds three d_ff
    wide tensors (gate, up and their product) where the spec's holds two."""
    d = arch.hidden
    f = ffn_matrices(arch)
    width = np.maximum(2 * d + 6 * d / tp, 2 * d + f * arch.ffn / tp)
    if opts.recompute_buffer_third_term:
        width = np.maximum(width, 2 * d + f * arch.ffn)
    return width


def head_act_width(arch: Arch, kind: str, opts: CostOptions = DEFAULT_OPTIONS) -> int:
    """LM-head activation width of M_act^I: d + V, or d + 1 for scalar heads under [A23] "one"."""
    if opts.scalar_head_act_width == "one" and kind in ("critic", "reward"):
        return arch.hidden + 1
    return arch.hidden + arch.vocab


def kv_width(arch: Arch, tp):
    """Per-rank K (or V) width: d/P_t for MHA, ceil(n_kv/P_t) d_h for GQA ([A22])."""
    if arch.kv_heads == arch.heads:
        return arch.hidden / tp
    return np.ceil(arch.kv_heads / tp) * arch.head_dim


@dataclass(frozen=True)
class OpMemory:
    """Per-GPU memory of one operator under one plan (bytes, W_shard in parameters)."""

    role: str
    W_shard: Quantity
    M_w: Quantity  # one weight copy: the working copy of a training operator, else a serving copy (s_b)
    M_opt: Quantity  # training: FP32 masters and moments (mixed) or moments (fp32) of the replica's ZeRO share
    M_grad: Quantity  # training: gradients held (the ZeRO-2 share, else all), in the working dtype
    M_act: Quantity  # M_act^T (training) or M_act^I (inference: ell_full; generation: L_p), log-prob pieces included
    M_kv: Quantity  # generation only, else 0
    A_core: Quantity
    state: Quantity = 0.0  # training: S(m, d) on its GPUs, M_opt (+ M_w when the working weights persist: fp32)
    c: Optional[Quantity] = None  # training with recomputation: layers per recomputed segment ...
    n_ckpt: Optional[Quantity] = None  # ... retained segment inputs ...
    layer_bytes: Optional[Quantity] = None  # training: bytes per token one layer saves for its backward pass
    live: Optional[Quantity] = None  # training: microbatches whose activations a stage holds at once
    pieces: Quantity = 0.0  # serving with an LM head: the float32 log-softmax pieces (in M_act)

    @property
    def serving(self) -> bool:
        return self.role != "training"

    @property
    def A_with_weights(self):
        """A(v, d) on a GPU without a persistent BF16 copy (serving roles add M_w, [A13])."""
        return self.A_core + self.M_w if self.serving else self.A_core


def op_memory(role: str, arch: Arch, kind: str, wl: Workload, *, dp, pp, tp, mb, train: Optional[Training] = None,
              opts: CostOptions = DEFAULT_OPTIONS) -> OpMemory:
    """The memory terms of spec 6.1-6.4 for one operator; a training operator's as `train` says (the workload's
    training by default)."""
    s_b = wl.s_b
    BR = wl.B * wl.R
    b_loc = BR / (dp * mb)
    layers_local = arch.layers / pp
    w_shard = weight_shard(arch, kind, pp, tp)
    zero = 0.0 * b_loc
    if role == "training":
        return _training_memory(arch, wl, w_shard, b_loc, layers_local, dp=dp, pp=pp, tp=tp, mb=mb,
                                train=train if train is not None else wl.training(), opts=opts)
    M_w = w_shard * s_b
    width = np.maximum(buffer_width(arch, tp, opts), head_act_width(arch, kind, opts))
    pieces = logprob_piece_bytes(arch, kind, role, b_loc, wl.Lr) if opts.accounting == "backend" else zero
    if role == "inference":
        M_act = s_b * b_loc * (wl.Lp + wl.Lr) * width + pieces
        return OpMemory(role, w_shard, M_w, zero, zero, M_act, zero, M_act, pieces=pieces)
    if role == "generation":
        M_act = s_b * b_loc * wl.Lp * width + pieces
        M_kv = 2 * s_b * (BR / dp) * (wl.Lp + wl.Lr) * layers_local * kv_width(arch, tp)
        return OpMemory(role, w_shard, M_w, zero, zero, M_act, M_kv, M_act + M_kv, pieces=pieces)
    raise ValueError(f"unknown role {role!r}")


def _training_memory(arch: Arch, wl: Workload, w_shard, b_loc, layers_local, *, dp, pp, tp, mb, train: Training,
                     opts: CostOptions) -> OpMemory:
    """Spec 6.1-6.2 under `train` (module docstring)."""
    s_t, d = train.working_bytes(wl.s_b), arch.hidden
    M_w = w_shard * s_t
    M_opt = train.state_bytes * w_shard / train.shards_state(dp)
    M_grad = w_shard * s_t / train.shards_grads(dp)
    live = live_microbatches(train, pp, mb)
    tokens = b_loc * (wl.Lp + wl.Lr)
    c = segment_layers(train.recompute, layers_local, opts)
    n_ckpt = None if c is None else np.ceil(layers_local / c)
    if opts.accounting == "spec":  # [B]: every live microbatch reserves its checkpoints and a buffer of [A12]
        layer = s_t * buffer_width(arch, tp, opts)
        held = (layers_local * layer if c is None else n_ckpt * s_t * d + c * layer) * live
    else:
        layer = layer_saved_bytes(arch, tp, s_t)
        if c is None:  # every layer's saved tensors and its input, and the stage's output
            held = live * (layers_local * (layer + s_t * d) + s_t * d)
        else:  # the segment inputs and the stage's output; one segment recomputed at a time
            held = live * (n_ckpt + 1) * s_t * d + c * layer + (c - 1) * s_t * d
    M_act = tokens * held
    working = 0.0 if train.persistent_weights else M_w
    state = M_opt + (M_w if train.persistent_weights else 0.0)
    return OpMemory("training", w_shard, M_w, M_opt, M_grad, M_act, 0.0 * b_loc, M_act + working + M_grad, state,
                    c, n_ckpt, layer, live)


def transient_bytes(mem: OpMemory, holds_copy, opts: CostOptions = DEFAULT_OPTIONS):
    """A(v, d): A_core, plus M_w for a serving operator on a GPU without a persistent copy ([A13]).

    `holds_copy` is True where the model's residency on the GPU is shadow or frozen.
    """
    materialized = mem.M_w if mem.serving and opts.serving_weights_in_transient else 0.0
    return mem.A_core + materialized * np.logical_not(holds_copy)


def copy_bytes(w_shard, s_b):
    """S(m, d) of a shadow or frozen BF16 copy."""
    return w_shard * s_b


def memory_ratio(peak, m_eff):
    """r_peak = max_d peak(d) / M_eff (0 for an empty device set)."""
    return float(np.max(peak)) / m_eff if np.size(peak) else 0.0


def oom_penalty(r_peak, beta_oom: float = BETA_OOM):
    """Score multiplier exp(-beta_oom max(0, r_peak - 1)) that guides the search (spec 7)."""
    return np.exp(-beta_oom * np.maximum(0.0, r_peak - 1.0))
