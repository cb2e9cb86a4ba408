"""Per-GPU memory of one operator and of one model's persistent state (paper Sec. V-D, App. D-H,
D-I; spec 6.1-6.5), plus capacity, feasibility and the OOM penalty factor (spec 6.6, 7).

A training operator trains as its `Training` says (core/ir/training.py: precision, ZeRO stage, recomputation,
pipeline schedule; the spec's baseline is mixed precision, ZeRO-2, recomputation every c layers and 1F1B), and its
terms are what the torch backend holds doing so (issue 32: the plan is a contract):
- the optimizer state S on a training GPU: FP32 masters and two moments (mixed, 12 B per parameter) or two moments
  (fp32, 8 B) of the replica's ZeRO share (ZeRO >= 1: / P_d), plus the float32 working weights themselves under
  fp32 (they are the masters and stay between steps). In mixed precision the 16-bit working copy is the version
  the step trains, which the backend takes over from its published copy: a transient of the operator, M_w;
- the gradients: the working dtype, of the replica's share under ZeRO-2 (reduced after every microbatch), with the
  reduction's buckets (`gradient_bucket_bytes`: those completing, at most one per replica, and the flat copy being
  reduced); all of them under ZeRO 0 and 1, and one bucket's flat copy; where gradients accumulate over
  microbatches (kept across them) a fresh gradient of the largest parameter beside its accumulated one;
- the LM head of training (stages holding it): one piece of vocabulary-wide logits and log-softmax with their
  gradients (rl.head_logprobs recomputes them a piece at a time), beside the activations;
- the phases: with one microbatch the backward pass frees activations as it makes gradients, so the transient is
  the largest of the activations, the gradients beside what the pass holds when it reaches the first layers (the
  first segment recomputed) or beside the optimizer step's float32 copy of a 16-bit gradient, and a float32
  trainer's published copy; with more, the gradients kept from the earlier microbatches (or the replica's share of
  them, ZeRO-2) meet the last one's activations: their sum;
- activations (`accounting = "backend"`): the segment inputs every live microbatch keeps (the input of every
  segment of c layers and the stage's output), one segment's saved tensors while it is recomputed
  (`layer_saved_bytes` per layer: what the backend's block saves, bench/layer_activations.py), or without
  recomputation every layer's saved tensors and input for every live microbatch; live = min(mb, P_p) under 1F1B,
  mb under GPipe. `accounting = "spec"` is the spec's [B] form (every live microbatch reserves its checkpoints and
  a recompute buffer of [A12]'s width).
Serving operators with an LM head also hold vocabulary-wide float32 tensors: inference two log-softmax pieces of
`LOGPROB_PIECE` elements, generation its sampling step's (`sampling_bytes`). Plan quantities may be scalars or numpy
arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from rpegc.core.cost.optime import Quantity
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.cost.params import (LM_HEAD_KINDS, SCALAR_HEAD_KINDS, ffn_matrices, final_norm_params,
                                    layer_replicated_params, layer_sharded_params)
from rpegc.core.cost.work import forward_length
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.ir.training import Training

BETA_OOM = 40.0  # spec 1.3 / 7
# Float32 elements of one piece of a vocabulary-wide log-softmax: the torch backend computes log-probs (inference,
# the training head) a few sequences at a time so that no larger vocabulary-wide float32 tensor exists, and holds
# two such pieces at once (the log-softmax and its input). Declared here, read by the backend (rl/step.py).
LOGPROB_PIECE = 1 << 20
FP32 = 4
# Data-parallel gradient reductions go in buckets (DDP's 25 MiB at most), a quarter of a replica's share of a stage's
# gradients, at least 1 MiB: a large model's buckets are negligible beside its share, a small one's stay a fraction.
MAX_BUCKET_BYTES = 25 << 20
MIN_BUCKET_BYTES = 1 << 20


def gradient_bucket_bytes(grad_bytes, dp):
    """The bucket size of the gradient reductions of a stage whose gradients are `grad_bytes`, over dp replicas
    (the torch backend's, `ZeroGradients.buckets`)."""
    return np.clip(grad_bytes / (4 * dp), MIN_BUCKET_BYTES, MAX_BUCKET_BYTES)

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
    sum (5 d, replicated over TP), the attention's q and output (2 d_q / P_t) and its k and v (2 `kv_width`: SDPA
    attends the grouped queries to the KV heads themselves), the FFN's d_ff-wide tensors (gate, up, their SiLU and
    product: 4 d_ff / P_t; two without a gate); in float32 the attention's log-sum-exp per head and the norms'
    reciprocal RMS (4 (heads / P_t + 2)); in a 16-bit dtype 6 d bytes more: the norms compute their statistic on a
    float32 copy of their input (in float32 the input itself).
    Per-head q/k norms (Qwen3) save, over d_q + d_kv per P_t, their normalised output in the working dtype and their
    input in float32 (the input itself in float32, its float32 copy in a 16-bit dtype), and a float32 reciprocal RMS
    per head, (heads + kv_heads) / P_t. Gemma's block (`post_norms`) has four norms, each applying 1 + w in float32:
    one saves its float32 input and normalised value and the reciprocal RMS, 8 d + 4 bytes, where the Llama-style
    norm of the count above saves (4 + s_t) d + 4; its q/k norms save 8 bytes per element of their width."""
    d = arch.hidden
    ffn = (4 if arch.gated else 2) * arch.ffn / tp
    upcast = 6 * d if s_t < FP32 else 0
    saved = s_t * (5 * d + 2 * arch.q_width / tp + 2 * kv_width(arch, tp) + ffn) + FP32 * (arch.heads / tp + 2) + upcast
    if arch.post_norms:
        saved = saved + 4 * (2 * FP32 * d + FP32) - 2 * ((FP32 + s_t) * d + FP32)
    if arch.qk_norm:
        width = (arch.q_width + arch.kv_width) / tp
        per_element = 2 * FP32 if arch.post_norms else s_t + FP32
        saved = saved + per_element * width + FP32 * (arch.heads + arch.kv_heads) / tp
    return saved


def live_microbatches(train: Training, pp, mb):
    """Microbatches whose activations a stage holds at once: min(mb, P_p) under 1F1B's warm-up, mb under GPipe."""
    return np.minimum(mb, pp) if train.schedule == "1f1b" else mb * np.ones_like(pp)


def logprob_piece_bytes(arch: Arch, kind: str, b_loc, Lr):
    """What inference with an LM head holds of vocabulary-wide float32 log-softmax at once (rl.token_logprobs): two
    pieces of LOGPROB_PIECE elements, or of one sequence's Lr response positions when that is larger, never more rows
    than the microbatch's b_loc."""
    if kind not in LM_HEAD_KINDS:
        return 0.0 * b_loc
    per_row = arch.vocab * Lr
    piece_rows = np.minimum(b_loc, np.maximum(1, LOGPROB_PIECE // per_row))
    return 2 * FP32 * piece_rows * per_row


def buffer_width(arch: Arch, tp, opts: CostOptions = DEFAULT_OPTIONS):
    """Per-token scalars of the widest recompute buffer: attention vs FFN ([A12]); a gated FFN holds three d_ff
    wide tensors (gate, up and their product) where the spec's holds two."""
    d = arch.hidden
    f = ffn_matrices(arch)
    width = np.maximum(2 * d + 6 * arch.q_width / tp, 2 * d + f * arch.ffn / tp)
    if opts.recompute_buffer_third_term:
        width = np.maximum(width, 2 * d + f * arch.ffn)
    return width


def head_act_width(arch: Arch, kind: str, opts: CostOptions = DEFAULT_OPTIONS) -> int:
    """LM-head activation width of M_act^I: d + V, or d + 1 for scalar heads under [A23] "one"."""
    if opts.scalar_head_act_width == "one" and kind in ("critic", "reward"):
        return arch.hidden + 1
    return arch.hidden + arch.vocab


def kv_width(arch: Arch, tp):
    """Per-rank K (or V) width: d_q/P_t for MHA (d/P_t), ceil(n_kv/P_t) d_h for GQA ([A22])."""
    if arch.kv_heads == arch.heads:
        return arch.q_width / tp
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
    training by default). Generation and inference hold the rows a step draws (`Workload.for_role`)."""
    wl = wl.for_role(role)
    s_b = wl.s_b
    BR = wl.B * wl.R
    b_loc = BR / (dp * mb)
    layers_local = arch.layers / pp
    w_shard = weight_shard(arch, kind, pp, tp)
    zero = 0.0 * b_loc
    if role == "training":
        return _training_memory(arch, kind, wl, w_shard, b_loc, layers_local, dp=dp, pp=pp, tp=tp, mb=mb,
                                train=train if train is not None else wl.training(), opts=opts)
    M_w = w_shard * s_b
    width = np.maximum(buffer_width(arch, tp, opts), head_act_width(arch, kind, opts))
    backend = opts.accounting == "backend"
    if role == "inference":
        pieces = logprob_piece_bytes(arch, kind, b_loc, wl.Lr) if backend else zero
        M_act = s_b * b_loc * forward_length(kind, wl.Lp, wl.Lr, opts) * width + pieces
        return OpMemory(role, w_shard, M_w, zero, zero, M_act, zero, M_act, pieces=pieces)
    if role == "generation":
        pieces = sampling_bytes(arch, s_b, b_loc) if backend else zero
        M_act = s_b * b_loc * wl.Lp * width + pieces
        M_kv = 2 * s_b * (BR / dp) * (wl.Lp + wl.Lr) * layers_local * kv_width(arch, tp)
        return OpMemory(role, w_shard, M_w, zero, zero, M_act, M_kv, M_act + M_kv, pieces=pieces)
    raise ValueError(f"unknown role {role!r}")


def _gradient_transients(arch: Arch, kind: str, grad_bytes, dp, pp, tp, mb, s_t: int, train: Training):
    """What the gradients hold beyond the shard the optimizer steps (module docstring): the reductions' buckets over
    dp > 1, and, where gradients accumulate over microbatches, a fresh gradient of the largest parameter."""
    bucket = gradient_bucket_bytes(grad_bytes, dp)
    if train.zero == 2:
        buckets = (dp + 1) * bucket  # completing ones, one per owner, and the flat copy being reduced
    else:
        buckets = bucket  # the flat copy of the bucket being reduced once the step's gradients are complete
    # a small stage's buckets are its gradients (and one flat copy), however many owners it has
    buckets = np.where(dp > 1, np.minimum(buckets, grad_bytes + bucket), 0.0)
    accumulating = (mb > 1) & ((train.zero < 2) | (dp == 1))
    return buckets + np.where(accumulating, s_t * largest_param(arch, kind, pp, tp), 0.0)


def largest_param(arch: Arch, kind: str, pp, tp):
    """Elements of the largest parameter of the worst stage, which holds the embedding or the LM head (V x d), or of a
    layer's d_ff x d projection (TP-sharded) where that is larger; shaped as the plan quantities."""
    layer = arch.hidden * arch.ffn / tp
    return np.maximum(layer, arch.vocab * arch.hidden) + 0 * pp


def head_piece_bytes(arch: Arch, wl: Workload, s_t: int, b_loc):
    """What training's LM head holds in its backward pass beyond its weight's gradient (rl.head_logprobs): one piece of
    logits in the working dtype, their float32 tempered copy, log-softmax and probabilities, the float32 gradient and
    its cast to the working dtype; a piece is as many sequences' L_r x V logits as fit LOGPROB_PIECE elements (at
    least one, at most the microbatch's)."""
    per_row = wl.Lr * arch.vocab
    rows = np.minimum(b_loc, np.maximum(1, LOGPROB_PIECE // per_row))
    return (2 * s_t + 4 * FP32) * rows * per_row


def sampling_bytes(arch: Arch, s_b: int, b_loc):
    """What generation's sampling step holds of the vocabulary for a microbatch's b_loc rows (generation.Sampler):
    the tempered float32 logits and their log-softmax (and the float32 copy of 16-bit logits), and the float64
    probabilities with their cumulative sum that the draw inverts."""
    return (2 * FP32 + (FP32 if s_b < FP32 else 0) + 2 * 8) * b_loc * arch.vocab


def _training_memory(arch: Arch, kind: str, wl: Workload, w_shard, b_loc, layers_local, *, dp, pp, tp, mb,
                     train: Training, opts: CostOptions) -> OpMemory:
    """Spec 6.1-6.2 under `train` (module docstring)."""
    s_t, d = train.working_bytes(wl.s_b), arch.hidden
    M_w = w_shard * s_t
    M_opt = train.state_bytes * w_shard / train.shards_state(dp)
    M_grad = w_shard * s_t / train.shards_grads(dp)
    if opts.accounting == "backend":
        M_grad = M_grad + _gradient_transients(arch, kind, w_shard * s_t, dp, pp, tp, mb, s_t, train)
    live = live_microbatches(train, pp, mb)
    tokens = b_loc * forward_length(kind, wl.Lp, wl.Lr, opts)
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
    transient = M_act + working + M_grad  # spec 6.4
    if opts.accounting == "backend":
        # what the backward pass still holds of the activations when it reaches the first layers, beside nearly all
        # the gradients: the first segment recomputed (or the first layer's saved tensors), and the first layer's
        # input gradients and temporaries (about its saved tensors)
        last = tokens * (layer + s_t * d if c is None else c * layer + (c - 1) * s_t * d) + tokens * layer
        if kind in LM_HEAD_KINDS:
            M_act = M_act + head_piece_bytes(arch, wl, s_t, b_loc)
        # the optimizer step turns one 16-bit gradient at a time into float32 (master_weights.MasterWeights.step); a
        # float32 trainer publishes a copy of its weights in the serving dtype once its gradients are gone
        step = FP32 * largest_param(arch, kind, pp, tp) if s_t < FP32 else 0.0
        published = w_shard * wl.s_b if train.persistent_weights else 0.0
        one_pass = np.maximum(np.maximum(M_act, M_grad + np.maximum(last, step)), published)
        transient = working + np.where(mb > 1, M_act + M_grad, one_pass)
    return OpMemory("training", w_shard, M_w, M_opt, M_grad, M_act, 0.0 * b_loc, transient, state, c, n_ckpt, layer,
                    live)


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
