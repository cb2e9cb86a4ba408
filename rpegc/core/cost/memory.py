"""Per-GPU memory of one operator and of one model's persistent state (paper Sec. V-D, App. D-H,
D-I; spec 6.1-6.5), plus capacity, feasibility and the OOM penalty factor (spec 6.6, 7).

Mixed precision (BF16 working weights, FP32 Adam master + two moments), activation checkpointing
and ZeRO-2 sharding over P_d. Plan quantities may be scalars or numpy arrays.
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

ADAM_STATE_BYTES_PER_PARAM = 12  # FP32 master + two FP32 moments
BETA_OOM = 40.0  # spec 1.3 / 7

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
    M_w: Quantity  # one BF16 weight copy
    M_opt: Quantity  # ZeRO-2 sharded FP32 master + moments
    M_grad: Quantity  # ZeRO-2 sharded BF16 gradients
    M_act: Quantity  # M_act^T (training) or M_act^I (inference: ell_full; generation: L_p)
    M_kv: Quantity  # generation only, else 0
    A_core: Quantity
    c: Optional[Quantity] = None  # training: checkpoint interval ...
    n_ckpt: Optional[Quantity] = None  # ... retained checkpoints ...
    M_buf: Optional[Quantity] = None  # ... recompute-buffer scalars per token ...
    per_token: Optional[Quantity] = None  # ... n_ckpt d + c M_buf

    @property
    def serving(self) -> bool:
        return self.role != "training"

    @property
    def A_with_weights(self):
        """A(v, d) on a GPU without a persistent BF16 copy (serving roles add M_w, [A13])."""
        return self.A_core + self.M_w if self.serving else self.A_core


def op_memory(role: str, arch: Arch, kind: str, wl: Workload, *, dp, pp, tp, mb,
              opts: CostOptions = DEFAULT_OPTIONS) -> OpMemory:
    """The memory terms of spec 6.1-6.4 for one operator."""
    s_b, d = wl.s_b, arch.hidden
    BR = wl.B * wl.R
    b_loc = BR / (dp * mb)
    layers_local = arch.layers / pp
    w_shard = weight_shard(arch, kind, pp, tp)
    M_w = w_shard * s_b
    M_opt = ADAM_STATE_BYTES_PER_PARAM * w_shard / dp
    M_grad = w_shard * s_b / dp
    zero = 0.0 * b_loc
    if role == "training":
        c = checkpoint_interval(layers_local, opts)
        n_ckpt = np.ceil(layers_local / c)
        M_buf = buffer_width(arch, tp, opts)
        per_token = n_ckpt * d + c * M_buf
        live = np.minimum(mb, pp)  # 1F1B warm-up microbatches held at once
        M_act = s_b * live * b_loc * (wl.Lp + wl.Lr) * per_token
        return OpMemory(role, w_shard, M_w, M_opt, M_grad, M_act, zero, M_act + M_w + M_grad, c, n_ckpt, M_buf, per_token)
    width = np.maximum(buffer_width(arch, tp, opts), head_act_width(arch, kind, opts))
    if role == "inference":
        M_act = s_b * b_loc * (wl.Lp + wl.Lr) * width
        return OpMemory(role, w_shard, M_w, M_opt, M_grad, M_act, zero, M_act)
    if role == "generation":
        M_act = s_b * b_loc * wl.Lp * width
        M_kv = 2 * s_b * (BR / dp) * (wl.Lp + wl.Lr) * layers_local * kv_width(arch, tp)
        return OpMemory(role, w_shard, M_w, M_opt, M_grad, M_act, M_kv, M_act + M_kv)
    raise ValueError(f"unknown role {role!r}")


def transient_bytes(mem: OpMemory, holds_copy, opts: CostOptions = DEFAULT_OPTIONS):
    """A(v, d): A_core, plus M_w for a serving operator on a GPU without a persistent copy ([A13]).

    `holds_copy` is True where the model's residency on the GPU is shadow or frozen.
    """
    materialized = mem.M_w if mem.serving and opts.serving_weights_in_transient else 0.0
    return mem.A_core + materialized * np.logical_not(holds_copy)


def training_state_bytes(w_shard, dp):
    """S(m, d) on a training GPU: FP32 master + moments, ZeRO-2 sharded (12 W_shard / P_d)."""
    return ADAM_STATE_BYTES_PER_PARAM * w_shard / dp


def copy_bytes(w_shard, s_b):
    """S(m, d) of a shadow or frozen BF16 copy."""
    return w_shard * s_b


def memory_ratio(peak, m_eff):
    """r_peak = max_d peak(d) / M_eff (0 for an empty device set)."""
    return float(np.max(peak)) / m_eff if np.size(peak) else 0.0


def oom_penalty(r_peak, beta_oom: float = BETA_OOM):
    """Score multiplier exp(-beta_oom max(0, r_peak - 1)) that guides the search (spec 7)."""
    return np.exp(-beta_oom * np.maximum(0.0, r_peak - 1.0))
