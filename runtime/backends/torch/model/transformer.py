"""Small decoder-only transformers for the torch backend, built from an `Arch` and a model kind.

Paper Sec. IV-A / spec §0 (model kinds and heads): policy and reference models carry an LM head,
a critic a per-token scalar value head, a reward model a scalar read at the last token, and a shared
actor-critic both heads on one backbone. The network is pre-norm (RMSNorm), causal self-attention
with optional grouped-query attention (`kv_heads`), a SwiGLU or GELU MLP of width `ffn`, and RoPE or
learned positions.

Layout choices made for the distributed backend: the blocks are identical modules in one
`nn.ModuleList`, so a pipeline stage is a slice `layers[a:b]` (`forward_layers`); attention keeps
separate q/k/v/o projections and the MLP separate gate/up/down projections, so tensor parallelism can
shard heads and FFN columns. Every parameter is initialised from its own generator seeded by
`derive_seed(seed, name)`, so a rank that builds only a slice of the model (a pipeline stage) or a
model with different heads gets bit-identical values for the parameters it does build.

Precision: models are built in float32 (the training master). Serving copies are the same modules cast
to `serving_dtype(workload)` (bf16/fp16 when the workload says so); whatever the module's dtype, `heads`
returns float32 logits and values, so log-probs, sampling and the RL math always run in float32.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rpegc.core.cost.memory import segment_layers
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import MODEL_KINDS, Arch, Workload
from rpegc.runtime.backends.torch.parallel.tensor_parallel import copy_to_tp

LM_HEAD_KINDS = ("policy", "reference", "actor_critic")
SCALAR_HEAD_KINDS = ("critic", "reward", "actor_critic")
MLP_KINDS = ("swiglu", "geglu", "gelu")
GATED_MLPS = ("swiglu", "geglu")  # a gate projection (Arch.gated)
POSITION_KINDS = ("rope", "learned")
# The `.rpeg` workload's tensor format -> the dtype of serving copies and serving forwards (the cost model's
# s_b bytes per parameter). Training always keeps float32 masters and Adam state and computes in float32:
# mixed-precision training (bf16 forward/backward over a float32 master) is out of scope.
SERVING_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (same on every process, Python version and run)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def serving_dtype(workload: Workload) -> torch.dtype:
    """The dtype published weight copies are stored in and generation/inference compute in, from
    `workload.dtype` (the one place that reads it)."""
    dtype = SERVING_DTYPES.get(workload.dtype)
    if dtype is None:
        raise RpegError(workload.loc, f"workload dtype '{workload.dtype}' is not supported by the "
                        f"torch backend; use one of {', '.join(SERVING_DTYPES)}")
    return dtype


def cast_weights(weights: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """A published version in `dtype` (a serving copy); tensors already in `dtype` are kept as they are."""
    return {n: t.to(dtype) for n, t in weights.items()}


@dataclass(frozen=True)
class NetOptions:
    """Choices the `.rpeg` arch does not fix (`mlp` it does: `arch_net`). `max_seq` bounds positions (Lp + Lr)."""

    max_seq: int
    mlp: str = "swiglu"
    positions: str = "rope"
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    init_std: float = 0.02
    hf: Optional[str] = None  # a Hugging Face checkpoint directory: its config's RoPE tables (hf.py)
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2)
    # Gemma's block (hf.py sets these from a gemma3_text config): norm weights applied as 1 + w with the product in
    # float32, the embedding times sqrt(d), the query scaled by attn_scale instead of head_dim ** -0.5, and per
    # layer full attention or a sliding window of `sliding_window` keys with RoPE tables of its own
    norm_offset: bool = False
    embed_scale: bool = False
    attn_scale: Optional[float] = None
    sliding_window: Optional[int] = None
    sliding_layers: tuple[int, ...] = ()  # the layers that attend through the sliding window


@dataclass
class ModelOutput:
    """`logits` [b, t, V] if the model has an LM head; `values` [b, t] if it has a scalar head. A serving forward
    computes the logits (`computed`); a training forward (autograd on) keeps the final norm's output `hidden`
    [b, t, d] and the `lm_head` instead, so its loss can compute them a piece at a time (`rl.head_logprobs`)."""

    values: Optional[Tensor]
    computed: Optional[Tensor] = None
    hidden: Optional[Tensor] = None
    lm_head: Optional[nn.Module] = None

    @property
    def logits(self) -> Optional[Tensor]:
        """The logits in the module's dtype: as the forward computed them, or now, whole, from `hidden`."""
        if self.computed is None and self.lm_head is not None and self.hidden is not None:
            return self.lm_head(self.hidden)
        return self.computed


class KVCache:
    """Keys/values of every layer for `batch` sequences, preallocated to `capacity` positions.

    `length` is the number of positions already stored; a forward pass with a cache writes its new
    positions at `length` and advances it once all layers have run.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: Optional[torch.device] = None):
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity
        self.length = 0

    def store(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions of `layer` and return all keys/values stored so far."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise RpegError(None, f"KV cache holds {self.capacity} positions but {end} were requested; "
                            "build the cache with a capacity of at least Lp + Lr")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: bool = False):
        super().__init__()
        self.eps, self.offset = eps, offset  # offset (Gemma): the weight applies as 1 + w, in float32
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        # A tensor-parallel group whose ranks each normalise only their own heads with this (replicated) weight
        # (Qwen3's q/k norms): its gradient is the sum of theirs (`parallel.build_stage_module` sets it).
        self.grad_group = None

    def forward(self, x: Tensor) -> Tensor:
        # The statistic in float32 (as LLaMA does): a bf16 mean is not only coarse, the CPU reduces it in
        # another order for another batch size, which would make a sequence's logits depend on its
        # replica's or microbatch's size. A no-op for float32 modules.
        h = x.float()
        w = self.weight if self.grad_group is None else copy_to_tp(self.weight, self.grad_group)
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (normed * (1.0 + w.float())).to(x.dtype)
        return normed.to(x.dtype) * w


def rope_tables(max_seq: int, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE; x is [b, heads, t, hd], cos/sin are [t, hd] or [b, 1, t, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def position_ids(pads: Optional[Tensor], start: int, t: int, device: torch.device) -> Tensor:
    """The positions of the `t` inputs after `start` cached ones: [t] absolute positions, or with left
    padding (`pads` [b], the pad count of each row) [b, t] positions counted from each row's first real
    token, 0 on pads (as `transformers` numbers a left-padded batch: cumsum of its attention mask)."""
    pos = start + torch.arange(t, device=device)
    if pads is None:
        return pos
    return (pos.unsqueeze(0) - pads.to(device).unsqueeze(1)).clamp(min=0)


def attention_mask(pads: Optional[Tensor], start: int, t: int, device: torch.device) -> Tensor:
    """Which keys each of the `t` queries after `start` cached positions may see: [t, start+t] causal, or
    with left padding [b, 1, t, start+t], causal and from the row's first real token on. A pad query sees
    itself only: its output is never read, and a query with no key would make softmax NaN."""
    keys = torch.arange(start + t, device=device)
    queries = start + torch.arange(t, device=device)
    causal = keys.unsqueeze(0) <= queries.unsqueeze(1)
    if pads is None:
        return causal
    real = keys.view(1, 1, -1) >= pads.to(device).view(-1, 1, 1)
    itself = keys.unsqueeze(0) == queries.unsqueeze(1)
    return ((causal & real) | itself).unsqueeze(1)


def window_mask(mask: Tensor, start: int, t: int, window: Optional[int]) -> Tensor:
    """`mask` (attention_mask's) restricted to the last `window` keys of each query, itself included (a sliding-window
    layer: key j is seen from query i when i - window < j <= i, on positions counted with the pads, as transformers
    does)."""
    keys = torch.arange(mask.shape[-1], device=mask.device)
    queries = start + torch.arange(t, device=mask.device)
    return mask & (keys.unsqueeze(0) > queries.unsqueeze(1) - window)


def positioned_rope(cos: Tensor, sin: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """The RoPE tables at `positions` ([t] -> [t, hd]; per-row [b, t] -> [b, 1, t, hd] for apply_rope)."""
    if positions.dim() == 1:
        return cos[positions], sin[positions]
    return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, arch: Arch, qkv_bias: bool = False, norm_eps: float = 1e-6, norm_offset: bool = False,
                 scale: Optional[float] = None):
        super().__init__()
        self.scale = scale  # None: SDPA's head_dim ** -0.5
        self.heads, self.kv_heads, self.head_dim = arch.heads, arch.kv_heads, arch.head_dim
        d = arch.hidden
        self.wq = nn.Linear(d, self.heads * self.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(d, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.wv = nn.Linear(d, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.wo = nn.Linear(self.heads * self.head_dim, d, bias=False)
        # Qwen3: an RMSNorm over each head's query and key, before RoPE (one head_dim weight, shared by the heads,
        # so a tensor-parallel shard holds it whole)
        self.q_norm = RMSNorm(self.head_dim, norm_eps, norm_offset) if arch.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, norm_eps, norm_offset) if arch.qk_norm else None

    def forward(self, x: Tensor, rope: Optional[tuple[Tensor, Tensor]], mask: Tensor,
                cache: Optional[KVCache], layer: int) -> Tensor:
        """`rope`: cos/sin at the positions of x (`positioned_rope`); `mask`: which keys each query sees
        (`attention_mask`)."""
        b, t, _ = x.shape
        # Head counts come from the projections' widths, so a tensor-parallel shard that holds a
        # subset of the heads (column-sharded wq/wk/wv, row-sharded wo) runs this code unchanged.
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.store(layer, k, v)
        # grouped-query attention inside SDPA: repeating the keys and values per query head copied the whole cache
        # at every decode step (15% of a 10-layer GQA model's generation on CPU); the float32 results are identical
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, arch: Arch, kind: str):
        super().__init__()
        self.kind = kind
        if kind in GATED_MLPS:
            self.w_gate = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.w_up = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.w_down = nn.Linear(arch.ffn, arch.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "swiglu":
            return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        if self.kind == "geglu":  # Gemma: the gate through the tanh approximation of GELU
            return self.w_down(F.gelu(self.w_gate(x), approximate="tanh") * self.w_up(x))
        return self.w_down(F.gelu(self.w_up(x)))


class Block(nn.Module):
    def __init__(self, arch: Arch, opts: NetOptions):
        super().__init__()
        off = opts.norm_offset
        self.attn_norm = RMSNorm(arch.hidden, opts.norm_eps, off)
        self.attn = Attention(arch, opts.qkv_bias, opts.norm_eps, off, opts.attn_scale)
        # Gemma: a norm on each sub-layer's output too, before the residual add
        self.attn_post_norm = RMSNorm(arch.hidden, opts.norm_eps, off) if arch.post_norms else None
        self.mlp_norm = RMSNorm(arch.hidden, opts.norm_eps, off)
        self.mlp = MLP(arch, opts.mlp)
        self.mlp_post_norm = RMSNorm(arch.hidden, opts.norm_eps, off) if arch.post_norms else None

    def forward(self, x: Tensor, rope, mask: Tensor, cache: Optional[KVCache], layer: int) -> Tensor:
        a = self.attn(self.attn_norm(x), rope, mask, cache, layer)
        x = x + (a if self.attn_post_norm is None else self.attn_post_norm(a))
        m = self.mlp(self.mlp_norm(x))
        return x + (m if self.mlp_post_norm is None else self.mlp_post_norm(m))


class TransformerModel(nn.Module):
    """Embedding -> `layers` identical blocks -> final norm -> the heads of `kind`.

    `stage` = (first, last, has_embedding, has_heads) builds one pipeline stage only: blocks first..last-1 (the
    others are empty modules, so block indices and parameter names stay those of the whole model), the embedding
    and the heads only where the stage has them. Nothing of the other stages is allocated, even for a moment."""

    def __init__(self, arch: Arch, kind: str, opts: NetOptions,
                 stage: Optional[tuple[int, int, bool, bool]] = None):
        super().__init__()
        self.arch, self.kind, self.opts = arch, kind, opts
        first, last, embeds, ends = stage if stage is not None else (0, arch.layers, True, True)
        self.embed = nn.Embedding(arch.vocab, arch.hidden) if embeds else None
        self.pos_embed = nn.Embedding(opts.max_seq, arch.hidden) if opts.positions == "learned" and embeds else None
        self.layers = nn.ModuleList(Block(arch, opts) if first <= i < last else nn.Module() for i in range(arch.layers))
        self.norm = RMSNorm(arch.hidden, opts.norm_eps, opts.norm_offset) if ends else None
        self.lm_head = nn.Linear(arch.hidden, arch.vocab, bias=False) if kind in LM_HEAD_KINDS and ends else None
        self.value_head = nn.Linear(arch.hidden, 1) if kind in SCALAR_HEAD_KINDS and ends else None
        self.recompute = "interval"  # how a training forward recomputes (training.RECOMPUTES; the trainer sets it)
        if opts.positions == "rope":
            self.init_buffers()
        else:
            self.rope_cos = self.rope_sin = None

    def init_buffers(self, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        """(Re)compute the RoPE tables, in float32 on the CPU unless `device`/`dtype` say otherwise (a module built
        on the meta device gets its real tables here)."""
        if self.opts.positions != "rope":
            return
        with torch.device("cpu"):
            if self.opts.hf is not None:
                from rpegc.runtime.backends.torch.model.hf_rope import rope_tables as hf_rope_tables

                cos, sin = hf_rope_tables(self.opts.hf, self.opts.max_seq)
                local = hf_rope_tables(self.opts.hf, self.opts.max_seq, "sliding_attention") \
                    if self.opts.sliding_layers else (cos, sin)
            else:
                cos, sin = rope_tables(self.opts.max_seq, self.arch.head_dim, self.opts.rope_theta)
                local = (cos, sin)
        self.register_buffer("rope_cos", cos.to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(device=device, dtype=dtype), persistent=False)
        # the sliding-window layers' tables (Gemma: another base); the same tables elsewhere
        self.register_buffer("rope_cos_local", local[0].to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin_local", local[1].to(device=device, dtype=dtype), persistent=False)

    @property
    def has_lm_head(self) -> bool:
        return self.lm_head is not None

    @property
    def has_value_head(self) -> bool:
        return self.value_head is not None

    def new_cache(self, batch: int, capacity: Optional[int] = None) -> KVCache:
        a = self.arch
        return KVCache(a.layers, batch, a.kv_heads, a.head_dim, capacity or self.opts.max_seq,
                       self.embed.weight.dtype, self.embed.weight.device)

    def embed_tokens(self, tokens: Tensor, start: int = 0, pads: Optional[Tensor] = None) -> Tensor:
        """First pipeline stage: token (+ learned position) embeddings of positions start..; `pads` [b]
        is the number of left-pad positions of each row (None: no padding)."""
        t = tokens.shape[1]
        if start + t > self.opts.max_seq:
            raise RpegError(None, f"sequence of {start + t} positions exceeds the model's max_seq "
                            f"{self.opts.max_seq}; build the model with max_seq >= Lp + Lr")
        h = self.embed(tokens)
        if self.opts.embed_scale:  # Gemma: sqrt(d), rounded to the embedding's dtype as transformers does
            h = h * torch.tensor(self.arch.hidden ** 0.5, dtype=h.dtype)
        if self.pos_embed is not None:
            h = h + self.pos_embed(position_ids(pads, start, t, tokens.device))
        return h

    def forward_layers(self, h: Tensor, start: int = 0, cache: Optional[KVCache] = None,
                       first: int = 0, last: Optional[int] = None, pads: Optional[Tensor] = None) -> Tensor:
        """Blocks first..last-1 (a pipeline stage); does not advance the cache."""
        last = len(self.layers) if last is None else last
        t = h.shape[1]
        rope = (None, None)  # (full-attention layers, sliding-window layers)
        if self.rope_cos is not None:
            positions = position_ids(pads, start, t, h.device)
            rope = (positioned_rope(self.rope_cos, self.rope_sin, positions),
                    positioned_rope(self.rope_cos_local, self.rope_sin_local, positions))
        full = attention_mask(pads, start, t, h.device)
        mask = (full, window_mask(full, start, t, self.opts.sliding_window) if self.opts.sliding_layers else full)
        if not (self.training and cache is None and torch.is_grad_enabled()):
            return self._segment(h, rope, mask, first, last, cache)
        # Training recomputes activations as its `Training` says and the cost model prices (spec 2.2 [A1], 6.2
        # [A11]; memory.segment_layers): autograd keeps only the input of every segment of c layers (c of [A11]
        # for "interval", 1 for "full") and recomputes a segment's activations in the backward pass. The
        # recomputation runs the same operations on the same values, so gradients are those of no recompute.
        c = segment_layers(self.recompute, last - first)
        if c is None:
            return self._segment(h, rope, mask, first, last, cache)
        c = int(c)
        for a in range(first, last, c):
            h = checkpoint(self._segment, h, rope, mask, a, min(a + c, last), use_reentrant=False,
                           preserve_rng_state=False)
        return h

    def _segment(self, h: Tensor, rope, mask, first: int, last: int,
                 cache: Optional[KVCache] = None) -> Tensor:
        """Blocks first..last-1; `rope` and `mask` hold the full-attention layers' and the sliding-window ones'."""
        for i in range(first, last):
            w = int(i in self.opts.sliding_layers)
            h = self.layers[i](h, rope[w], mask[w], cache, i)
        return h

    def heads(self, h: Tensor) -> ModelOutput:
        """Last pipeline stage: final norm and the heads of this model kind.

        A module computes its heads in its own dtype. Values are returned in float32. Serving: logits stay in the
        module's dtype (one vocabulary-wide tensor, the d + V width the memory model counts per token) and their
        consumers (`rl.token_logprobs`, the sampler) compute in float32 a piece at a time. Training (autograd
        on): no logits; the loss computes them a few sequences at a time and the backward pass recomputes them
        (`rl.head_logprobs`), so no vocabulary-wide tensor of a microbatch is kept for the backward pass (the
        training activations the memory model counts, spec 6.2, have no vocabulary-wide term)."""
        h = self.norm(h)
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        if self.lm_head is not None and self.training and torch.is_grad_enabled():
            return ModelOutput(values=values, hidden=h, lm_head=self.lm_head)
        logits = self.lm_head(h) if self.lm_head is not None else None
        return ModelOutput(values=values, computed=logits)

    def forward(self, tokens: Tensor, cache: Optional[KVCache] = None, pads: Optional[Tensor] = None) -> ModelOutput:
        """Tokens [b, t]; with a cache they continue the cached positions and the cache advances. `pads`
        [b]: left-pad positions per row (their keys are masked and positions start after them)."""
        start = cache.length if cache is not None else 0
        out = self.heads(self.forward_layers(self.embed_tokens(tokens, start, pads), start, cache, pads=pads))
        if cache is not None:
            cache.length += tokens.shape[1]
        return out


def param_shapes(arch: Arch, kind: str, opts: NetOptions) -> dict[str, tuple[int, ...]]:
    """Every parameter's full shape, in `TransformerModel`'s order, computed (a whole model is never built for
    it: a worker that serves one stage of a large model would briefly hold all of it in float32)."""
    d, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (arch.vocab, d)}
    if opts.positions == "learned":
        shapes["pos_embed.weight"] = (opts.max_seq, d)
    for i in range(arch.layers):
        block = {"attn_norm.weight": (d,), "attn.wq.weight": (q, d), "attn.wq.bias": (q,), "attn.wk.weight": (kv, d),
                 "attn.wk.bias": (kv,), "attn.wv.weight": (kv, d), "attn.wv.bias": (kv,), "attn.wo.weight": (d, q),
                 "attn.q_norm.weight": (arch.head_dim,), "attn.k_norm.weight": (arch.head_dim,),
                 "attn_post_norm.weight": (d,), "mlp_norm.weight": (d,), "mlp.w_gate.weight": (arch.ffn, d),
                 "mlp.w_up.weight": (arch.ffn, d), "mlp.w_down.weight": (d, arch.ffn), "mlp_post_norm.weight": (d,)}
        for name, shape in block.items():
            if (name.endswith(".bias") and not opts.qkv_bias) or (name.startswith("mlp.w_gate") and opts.mlp not in GATED_MLPS) \
                    or (name.startswith(("attn.q_norm", "attn.k_norm")) and not arch.qk_norm) \
                    or (name.endswith("post_norm.weight") and not arch.post_norms):
                continue
            shapes[f"layers.{i}.{name}"] = shape
    shapes["norm.weight"] = (d,)
    if kind in LM_HEAD_KINDS:
        shapes["lm_head.weight"] = (arch.vocab, d)
    if kind in SCALAR_HEAD_KINDS:
        shapes["value_head.weight"], shapes["value_head.bias"] = (1, d), (1,)
    return shapes


def arch_net(arch: Arch, opts: NetOptions) -> NetOptions:
    """`opts` with the MLP `arch` has: SwiGLU for a gated FFN (or the checkpoint's gated kind, Gemma's GeGLU), GELU for
    the spec's two-projection one (so the backend runs what the cost model prices)."""
    if arch.gated:
        return dataclasses.replace(opts, mlp=opts.mlp if opts.mlp in GATED_MLPS else "swiglu")
    return dataclasses.replace(opts, mlp="gelu")


def check_arch(arch: Arch, kind: str, opts: NetOptions) -> None:
    """Reject architectures this backend cannot build, saying what to change."""
    if kind not in MODEL_KINDS:
        raise RpegError(None, f"unknown model kind '{kind}'; use one of {', '.join(MODEL_KINDS)}")
    if opts.mlp not in MLP_KINDS:
        raise RpegError(None, f"unknown MLP kind '{opts.mlp}'; use one of {', '.join(MLP_KINDS)}")
    if opts.positions not in POSITION_KINDS:
        raise RpegError(None, f"unknown position kind '{opts.positions}'; use one of {', '.join(POSITION_KINDS)}")
    if min(arch.layers, arch.hidden, arch.ffn, arch.vocab, arch.heads, arch.kv_heads, opts.max_seq) < 1:
        raise RpegError(None, f"architecture {arch} has a non-positive size; every field must be >= 1")
    if arch.hidden % arch.heads and not arch.head_size:
        raise RpegError(None, f"hidden = {arch.hidden} is not divisible by heads = {arch.heads}; "
                        "choose heads that divide hidden, or give head_dim")
    if arch.heads % arch.kv_heads:
        raise RpegError(None, f"heads = {arch.heads} is not divisible by kv_heads = {arch.kv_heads}; "
                        "choose kv_heads that divide heads")
    if opts.positions == "rope" and arch.head_dim % 2:
        raise RpegError(None, f"RoPE needs an even head dimension, got {arch.head_dim}; "
                        "change hidden, heads or head_dim, or use learned positions")


def seeded_parameter(name: str, shape: tuple[int, ...], seed: int, std: float, layers: int) -> Tensor:
    """The seeded init of parameter `name`: normal(0, std); residual outputs std/sqrt(2L) (GPT-2); norms 1;
    biases 0. It depends on (seed, name, shape) only, so any rank builds the same values."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    gen = torch.Generator().manual_seed(derive_seed(seed, name))
    scale = std / math.sqrt(2 * layers) if name.endswith(("wo.weight", "w_down.weight")) else std
    return torch.randn(shape, generator=gen, dtype=torch.float32) * scale


def init_parameters(model: nn.Module, seed: int, std: float, layers: int) -> None:
    """Every parameter of `model` from `seeded_parameter`."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(seeded_parameter(name, tuple(p.shape), seed, std, layers))


def build_model(arch: Arch, kind: str, seed: int, opts: NetOptions) -> TransformerModel:
    """A float32 model of `kind` with deterministic weights: same (arch, seed, opts) -> same tensors,
    and the backbone does not depend on the heads (an actor and its reference built from one seed agree)."""
    check_arch(arch, kind, opts)
    model = TransformerModel(arch, kind, opts)
    init_parameters(model, seed, opts.init_std, arch.layers)
    return model


def export_weights(model: nn.Module) -> dict[str, Tensor]:
    """A flat, detached copy of every parameter (a published model version)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def install_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Load a published version in place; names and shapes must match exactly."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    extra = sorted(set(weights) - set(own))
    if missing or extra:
        raise RpegError(None, f"weights do not fit the model: missing {missing[:4]}, unexpected {extra[:4]}; "
                        "publish weights of the same model (same arch, kind and options)")
    for k, v in weights.items():
        if v.shape != own[k].shape:
            raise RpegError(None, f"weight '{k}' has shape {tuple(v.shape)}, the model expects "
                            f"{tuple(own[k].shape)}; publish weights of the same architecture")
    model.load_state_dict(weights, strict=True)
