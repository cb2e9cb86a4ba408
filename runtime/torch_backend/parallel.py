"""Model parallelism of one invocation: TP, PP and DP with microbatches on per-vertex process groups.

Paper Sec. VII (each vertex runs under its own plan (dp, pp, tp, mb)) and spec Sec. 1.4 (nested
placement); the pipeline schedules are the ones spec/cost-model.md Sec. 3.3 prices, microbatches in
flight across stages (T_gemm * (mb + pp - 1) / mb) for all three roles [A6]. Which part uses what:
- tensor parallelism: Megatron-style column/row-parallel projections in every block, from
  megatron-core (`megatron_compat`, tp_impl "megatron") or from the two autograd functions below
  (tp_impl "torch": identity forward / all-reduce backward before a column-parallel projection,
  all-reduce forward / identity backward after a row-parallel one). Either way on the vertex's own
  TP group; embeddings, norms and heads are replicated over TP;
- pipeline parallelism: stage slicing of the blocks (`layout.stage_bounds`) with point-to-point
  transfers on the vertex's own PP group. Sends are non-blocking (`StageLink`) and nothing
  synchronises the stages between microbatches, so stage s works on microbatch j while stage s+1
  works on j-1:
  - inference (`infer`): all microbatches forward, one broadcast of the results at the end;
  - training (`train_step`): GPipe, all forwards then all backwards in reverse, each phase pipelined;
  - generation (`generate`): every decode step sends the microbatches through the stages as a
    wavefront; the last stage samples with the per-sequence generators and sends only the token ids
    back to stage 0 (no logits broadcast), and the rollouts are broadcast once at the end;
- data parallelism: a SUM all-reduce of the gradients over the DP group (the losses are sums over local
  tokens divided by the GLOBAL token count, so the sum is the whole-batch gradient), plain
  torch.distributed.
Everything a `ParallelModel` builds (its stage module, KV caches, message buffers, placeholders) is on
its `device`: the CPU under gloo, the worker's GPU under NCCL (`device.worker_device`), and in its
`dtype`: float32 for training, the serving dtype (`models.serving_dtype`: bf16 when the workload says
so) for generation and inference, whose activations, KV caches, TP all-reduces and pipeline messages are
then bf16 too; the heads return float32 (`TransformerModel.heads`), so results and sampling are float32.
Inference and the losses are the single-process functions of `rl`, run on a `StageView` that looks like
a `TransformerModel` to them; generation repeats `generation.generate`'s sampling step by step, so a
sequence gets the tokens it gets in a single process. `ParallelModel.trace` records a rank's schedule
(what it computed, in order, with times) for tests and measurements.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Iterable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rpegc.core.errors import RpegError
from rpegc.core.program import Arch
from rpegc.runtime.torch_backend.device import CPU
from rpegc.runtime.torch_backend.generation import Rollout, Sampler, Sampling, check_generation
from rpegc.runtime.torch_backend.layout import Layout, param_piece, rank_pieces, shard_dim, split_rows, stage_bounds
from rpegc.runtime.torch_backend.models import (LM_HEAD_KINDS, SCALAR_HEAD_KINDS, KVCache, ModelOutput, NetOptions,
                                                TransformerModel)
from rpegc.runtime.torch_backend.rl import Experience, RLConfig, optimizer_step

TP_IMPLS = ("megatron", "torch")


class ProcessGroups:
    """Every process group the plan's layouts need, created once, in one order on every rank."""

    def __init__(self, layouts: Iterable[Layout]):
        self._groups: dict[tuple[int, ...], object] = {}
        for ranks in sorted({g for layout in layouts for g in layout.groups()}):
            self._groups[ranks] = dist.new_group(list(ranks))

    def get(self, ranks: tuple[int, ...]):
        """The group of `ranks`, or None for a single rank (nothing to communicate)."""
        if len(ranks) <= 1:
            return None
        return self._groups[tuple(ranks)]

    def __len__(self) -> int:
        return len(self._groups)


# ---------------------------------------------------------------------------------------------------
# Tensor parallelism with plain torch.distributed


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_local: int, group, bias: bool = False):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_local, in_features))
        self.bias = nn.Parameter(torch.zeros(out_local)) if bias else None  # sharded with the output rows

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(_CopyToTP.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, in_local: int, out_features: int, group):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_features, in_local))

    def forward(self, x: Tensor) -> Tensor:
        return _ReduceFromTP.apply(F.linear(x, self.weight), self.group)


def canonical_name(name: str) -> str:
    """The single-process parameter name (megatron layers nest their weight under `inner.`)."""
    return name.replace(".inner.", ".")


def _tp_linear(kind: str, lin: nn.Linear, tp: int, group, impl: str, device: torch.device) -> nn.Module:
    if impl == "megatron":
        from rpegc.runtime.torch_backend import megatron_compat as mc

        if kind == "column":
            return mc.column_linear(lin.in_features, lin.out_features, tp, group, device, bias=lin.bias is not None)
        return mc.row_linear(lin.in_features, lin.out_features, tp, group, device)
    if kind == "column":
        return ColumnParallelLinear(lin.in_features, lin.out_features // tp, group, bias=lin.bias is not None)
    return RowParallelLinear(lin.in_features // tp, lin.out_features, group)


def build_stage_module(arch: Arch, kind: str, net: NetOptions, layout: Layout, rank: int, tp_group, tp_impl: str,
                       device: torch.device = CPU, dtype: torch.dtype = torch.float32) -> TransformerModel:
    """The part of the model `rank` runs: its pipeline stage's blocks, TP-sharded projections, on `device`
    in `dtype` (parameters and floating buffers such as the RoPE tables).

    Parameters keep the names of the single-process model (after `canonical_name`); their values are
    placeholders until a published version is loaded. megatron's layers are allocated on the device
    itself (its GPU path); the rest is built on the CPU and moved once it is cut to this rank's share.
    """
    _, p, _ = layout.coord(rank)
    first, last = stage_bounds(arch.layers, layout.pp)[p]
    model = TransformerModel(arch, kind, net)
    for i in range(arch.layers):
        if not first <= i < last:
            model.layers[i] = nn.Module()  # keeps block indices (and parameter names) of the full model
    if p != 0:
        model.embed = None
        model.pos_embed = None
    if p != layout.pp - 1:
        model.norm = None
        model.lm_head = None
        model.value_head = None
    if layout.tp > 1:
        for i in range(first, last):
            block = model.layers[i]
            for name in ("wq", "wk", "wv"):
                setattr(block.attn, name, _tp_linear("column", getattr(block.attn, name), layout.tp, tp_group, tp_impl,
                                                     device))
            block.attn.wo = _tp_linear("row", block.attn.wo, layout.tp, tp_group, tp_impl, device)
            if block.mlp.kind == "swiglu":
                block.mlp.w_gate = _tp_linear("column", block.mlp.w_gate, layout.tp, tp_group, tp_impl, device)
            block.mlp.w_up = _tp_linear("column", block.mlp.w_up, layout.tp, tp_group, tp_impl, device)
            block.mlp.w_down = _tp_linear("row", block.mlp.w_down, layout.tp, tp_group, tp_impl, device)
    return model.to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------------
# One rank's share of a model under a layout


class ParallelModel:
    """The stage module of `rank` under `layout` with its TP/PP/DP/replica groups, on `device`, computing in
    `dtype` (float32 for training; a serving module may be bf16/fp16)."""

    def __init__(self, arch: Arch, kind: str, net: NetOptions, layout: Layout, rank: int, groups: ProcessGroups,
                 tp_impl: str, device: torch.device = CPU, dtype: torch.dtype = torch.float32):
        self.arch, self.kind, self.net, self.layout, self.rank = arch, kind, net, layout, rank
        self.device, self.dtype = device, dtype
        d, p, t = layout.coord(rank)
        self.d, self.p, self.t = d, p, t
        self.first_layer, self.last_layer = stage_bounds(arch.layers, layout.pp)[p]
        self.is_first, self.is_last = p == 0, p == layout.pp - 1
        self.prev = layout.rank_at(d, p - 1, t) if not self.is_first else None
        self.next = layout.rank_at(d, p + 1, t) if not self.is_last else None
        self.first_rank = layout.rank_at(d, 0, t)
        self.last_rank = layout.rank_at(d, layout.pp - 1, t)
        self.tp_group = groups.get(layout.tp_group(d, p))
        self.pp_group = groups.get(layout.pp_group(d, t))
        self.dp_group = groups.get(layout.dp_group(p, t))
        self.mp_group = groups.get(layout.replica(d))
        self.module = build_stage_module(arch, kind, net, layout, rank, self.tp_group, tp_impl, device, dtype)
        self.loaded: Optional[tuple[str, int]] = None  # (model, version) of the values in the module
        self.trace: Optional[list[StageEvent]] = None  # set to a list to record this rank's schedule

    def params(self) -> dict[str, nn.Parameter]:
        return {canonical_name(n): p for n, p in self.module.named_parameters()}

    def load(self, shards: dict[str, Tensor]) -> None:
        """Copy a version's shards (on any device) into the module's parameters (cast to the module's dtype)."""
        own = self.params()
        if set(own) != set(shards):
            missing, extra = sorted(set(own) - set(shards)), sorted(set(shards) - set(own))
            raise RpegError(None, f"weights do not fit this rank's shard: missing {missing[:3]}, unexpected "
                            f"{extra[:3]} (layout {self.layout.short()})")
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(shards[n])

    def export(self) -> dict[str, Tensor]:
        return {n: p.detach().clone() for n, p in self.params().items()}

    # -- pipeline ---------------------------------------------------------------------------------

    @contextmanager
    def event(self, what: str, key: tuple[int, ...]) -> Iterator[None]:
        """Time a piece of this rank's schedule into `trace` (when tracing)."""
        if self.trace is None:
            yield
            return
        start = time.monotonic()
        yield
        self.trace.append(StageEvent(what, key, start, time.monotonic()))

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        a = self.arch
        cache = KVCache(0, batch, a.kv_heads // self.layout.tp, a.head_dim, capacity, self.dtype, self.device)
        shape = (batch, a.kv_heads // self.layout.tp, capacity, a.head_dim)
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        cache.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                      if self.first_layer <= i < self.last_layer else empty for i in range(a.layers)]
        cache.values = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                        if self.first_layer <= i < self.last_layer else empty for i in range(a.layers)]
        return cache

    def expect_input(self, link: StageLink, key: tuple[int, ...], shape: tuple[int, int]) -> None:
        """Post the receive of microbatch `key`'s input, `shape` = [b, t] positions, from the previous stage."""
        if not self.is_first:
            link.expect((*shape, self.arch.hidden), self.dtype, self.prev, ACTIVATION, key)

    def stage_forward(self, link: StageLink, key: tuple[int, ...], shape: tuple[int, int],
                      tokens: Optional[Tensor] = None, cache: Optional[KVCache] = None,
                      grad: bool = False, pads: Optional[Tensor] = None) -> tuple[Optional[Tensor], Tensor]:
        """This stage's blocks on the `shape` = [b, t] positions of microbatch `key`: (received input or
        None on stage 0, output). Stage 0 embeds `tokens`; the others receive the previous stage's
        output; the output goes on to the next stage without waiting. Advances `cache`. `pads` (the rows'
        left padding) is known to every stage: each reads it from the prompts, not from the pipeline."""
        b, t = shape
        start = cache.length if cache is not None else 0
        inp: Optional[Tensor] = None
        if not self.is_first:
            inp = link.recv((b, t, self.arch.hidden), self.dtype, self.prev, ACTIVATION, key)  # activations in dtype
            if grad:
                inp.requires_grad_(True)
        with self.event("forward", key):
            h = self.module.embed_tokens(tokens, start, pads) if self.is_first else inp
            out = self.module.forward_layers(h, start, cache, self.first_layer, self.last_layer, pads)
        if not self.is_last:
            link.send(out, self.next, ACTIVATION, key)
        if cache is not None:
            cache.length += t
        return inp, out

    def from_last_stage(self, x: Tensor) -> Tensor:
        """`x` as the last stage computed it, on every stage of this pipeline (every stage knows its shape)."""
        if self.pp_group is not None and x.numel():
            with self.event("broadcast", ()):
                x = x.contiguous()
                dist.broadcast(x, src=self.last_rank, group=self.pp_group)
        return x

    # -- gradients --------------------------------------------------------------------------------

    def allreduce_grads(self) -> None:
        """Sum gradients over the data-parallel replicas (one flat buffer)."""
        if self.dp_group is None:
            return
        params = list(self.module.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # a replica without rows still joins the all-reduce
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.dp_group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n

    def grad_sq_total(self, _local: Tensor) -> Tensor:
        """The squared global gradient norm: TP shards and stages summed, replicated tensors once."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.params().items():
            if p.grad is None:
                continue
            replicated = self.layout.tp == 1 or shard_dim(name) is None
            if replicated and self.t != 0:
                continue
            total = total + p.grad.double().pow(2).sum()
        if self.mp_group is not None:
            dist.all_reduce(total, group=self.mp_group)
        return total


# ---------------------------------------------------------------------------------------------------
# Pipeline schedules

# What a point-to-point message carries; with the microbatch key it makes the message's tag, so every
# receive matches exactly one send whatever order the transfers complete in.
ACTIVATION, GRADIENT, TOKENS = 0, 1, 2
_KINDS = 3


@dataclass(frozen=True)
class StageEvent:
    """One piece of a rank's pipeline schedule: `what` ("forward", "backward", "sample", "broadcast") of
    microbatch `key` ((j,) or (decode step, j); () for a whole-invocation broadcast), between two
    `time.monotonic()` readings (comparable across the processes of one host)."""

    what: str
    key: tuple[int, ...]
    start: float
    end: float


class StageLink:
    """A stage's point-to-point traffic on its pipeline's own process group during one invocation.

    Sends are non-blocking: the stage hands microbatch j on and starts j+1 while the next stage works on
    j (a blocking send would hold it until the receiver is ready). The sent tensors are kept until
    `close`, which waits for all of them; gloo moves the data in its own threads meanwhile. Receives
    can be posted ahead (`expect`): gloo delivers a message whose receive is already posted in one hop,
    while a send that finds no receive waits for the receiver's "ready" notice, a round trip more that
    a pipelined sender, running ahead of its receiver, would otherwise pay on every message.

    Under NCCL receives are posted only when awaited (`expect` does nothing): NCCL ignores tags and
    matches a pair's messages in the order they are issued, on one stream per pair, so a receive posted
    ahead would hold up the sends queued behind it on that stream (stage 0 waiting for tokens before it
    sends the activations that produce them). Every schedule here sends and receives each direction of
    a pair in the same (step, microbatch) order, which is what order matching needs.
    """

    def __init__(self, pm: ParallelModel, microbatches: int):
        self.pm, self.microbatches = pm, microbatches
        self._sent: list[tuple[dist.Work, Tensor]] = []
        self._posted: dict[int, tuple[dist.Work, Tensor]] = {}
        self.post_ahead = pm.pp_group is None or dist.get_backend(pm.pp_group) != "nccl"

    def tag(self, kind: int, key: tuple[int, ...]) -> int:
        """(kind, step, microbatch) as one integer; (j,) keys are step 0."""
        step, j = (0, key[0]) if len(key) == 1 else key
        return (step * self.microbatches + j) * _KINDS + kind

    def send(self, x: Tensor, dst: int, kind: int, key: tuple[int, ...]) -> None:
        x = x.detach().contiguous()
        self._sent.append((dist.isend(x, dst, group=self.pm.pp_group, tag=self.tag(kind, key)), x))

    def expect(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> None:
        """Post the receive of message (kind, key) from `src` now (once; later calls do nothing; under NCCL
        nothing: see the class)."""
        if self.post_ahead:
            self._post(shape, dtype, src, kind, key)

    def _post(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> None:
        tag = self.tag(kind, key)
        if tag not in self._posted:
            x = torch.empty(shape, dtype=dtype, device=self.pm.device)
            self._posted[tag] = (dist.irecv(x, src, group=self.pm.pp_group, tag=tag), x)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> Tensor:
        """Message (kind, key) from `src`, waiting for it."""
        self._post(shape, dtype, src, kind, key)
        work, x = self._posted.pop(self.tag(kind, key))
        work.wait()
        return x

    def close(self) -> None:
        assert not self._posted, "every posted receive is consumed within its invocation"
        for work, _ in self._sent:
            work.wait()
        self._sent.clear()


class StageView:
    """What `response_forward`, `last_token_scores` and the losses use of a TransformerModel, for
    microbatch j of a pipelined invocation whose microbatches have `rows` rows each.

    The last stage returns its heads' output; the other stages run their blocks and return zeros of the
    right shape (their results are replaced by the last stage's).
    """

    def __init__(self, pm: ParallelModel, link: StageLink, j: int, rows: Sequence[int]):
        self.pm, self.link, self.j, self.rows = pm, link, j, rows
        self.kind = pm.kind
        self.opts = pm.net
        self.records: list[tuple[Optional[Tensor], Tensor]] = []

    @property
    def has_lm_head(self) -> bool:
        return self.kind in LM_HEAD_KINDS

    @property
    def has_value_head(self) -> bool:
        return self.kind in SCALAR_HEAD_KINDS

    @property
    def training(self) -> bool:
        return self.pm.module.training

    def eval(self) -> "StageView":
        self.pm.module.eval()
        return self

    def train(self, mode: bool = True) -> "StageView":
        self.pm.module.train(mode)
        return self

    def __call__(self, tokens: Tensor, pads: Optional[Tensor] = None) -> ModelOutput:
        # one pass per microbatch: its messages are tagged by the microbatch alone
        assert not self.records, "a StageView runs one forward pass"
        pm = self.pm
        b, t = tokens.shape
        for i in range(self.j, len(self.rows)):  # every pass of the invocation has this length
            pm.expect_input(self.link, (i,), (self.rows[i], t))
        inp, out = pm.stage_forward(self.link, (self.j,), (b, t), tokens, grad=torch.is_grad_enabled(), pads=pads)
        self.records.append((inp, out))
        if pm.is_last:
            return pm.module.heads(out)
        return ModelOutput(logits=torch.zeros(b, t, pm.arch.vocab, device=pm.device) if self.has_lm_head else None,
                           values=torch.zeros(b, t, device=pm.device) if self.has_value_head else None)


Microbatch = Callable[[StageView], Tensor]


def infer(pm: ParallelModel, microbatches: Sequence[Microbatch], rows: Sequence[int]) -> Tensor:
    """Run each function of `microbatches` (e.g. response_forward(...).logprobs of its `rows[j]` rows) through
    the pipeline, pipelined; their results concatenated, on every stage (one broadcast at the end)."""
    link = StageLink(pm, len(microbatches))
    with torch.no_grad():
        results = [fn(StageView(pm, link, j, rows)) for j, fn in enumerate(microbatches)]
        link.close()
        return pm.from_last_stage(torch.cat(results))


@torch.no_grad()
def generate(pm: ParallelModel, prompts: Tensor, chunks: Sequence[tuple[int, int]], *, seed: int, step: int,
             max_new_tokens: int, sampling: Sampling = Sampling(), eos_id: Optional[int] = None,
             pad_id: int = 0, pads: Optional[Tensor] = None) -> Rollout:
    """`generation.generate` of the prompt rows [lo, hi) in microbatches `chunks` (global sequence
    indices, contiguous from lo; `prompts` holds rows lo..hi, left-padded by `pads`), pipelined over the
    stages; the rollouts on every stage.

    Every stage runs forward f (f = 0: the prompts; f > 0: the tokens sampled at step f-1) of
    microbatch 0, 1, ..., mb-1, then forward f+1, so while stage s works on microbatch j the next stage
    works on j-1 (a wavefront through the stages, step after step). The last stage samples with the
    per-sequence generators (`generation.generate`'s draws, so the tokens are the single-process ones)
    and sends only the token ids to stage 0, which feeds them to forward f+1; each stage posts the
    receives of forward f+1 when it starts forward f.
    """
    n, lp = prompts.shape
    check_generation(pm.kind in LM_HEAD_KINDS, pm.kind, sampling, max_new_tokens, lp, pm.net.max_seq)
    lo = chunks[0][0] if chunks else 0
    pm.module.eval()
    link = StageLink(pm, len(chunks))
    caches = [pm.new_cache(b - a, lp + max_new_tokens) for a, b in chunks]
    samplers = ([Sampler(range(a, b), seed, step, sampling, eos_id, pad_id, pm.device) for a, b in chunks]
                if pm.is_last else [])
    fed: list[Optional[Tensor]] = [None] * len(chunks)  # the last sampled tokens, where stage 0 is also the last

    def expect(f: int) -> None:
        """Post this stage's receives for forward f: its inputs, and on stage 0 the tokens that feed it."""
        for j, (a, b) in enumerate(chunks if f < max_new_tokens else ()):
            pm.expect_input(link, (f, j), (b - a, lp if f == 0 else 1))
            if f > 0 and pm.is_first and not pm.is_last:
                link.expect((b - a, 1), torch.int64, pm.last_rank, TOKENS, (f - 1, j))

    expect(0)
    for f in range(max_new_tokens):
        expect(f + 1)  # a step ahead: stage 0 runs at most one step ahead of the others
        for j, (a, b) in enumerate(chunks):
            tokens = None
            if pm.is_first:
                if f == 0:
                    tokens = prompts[a - lo:b - lo]
                elif pm.is_last:
                    tokens = fed[j]
                else:
                    tokens = link.recv((b - a, 1), torch.int64, pm.last_rank, TOKENS, (f - 1, j))
            rows_pads = None if pads is None else pads[a - lo:b - lo]
            _, out = pm.stage_forward(link, (f, j), (b - a, lp if f == 0 else 1), tokens, caches[j], pads=rows_pads)
            if not pm.is_last:
                continue
            with pm.event("sample", (f, j)):
                fed[j] = samplers[j].sample(pm.module.heads(out).logits[:, -1]).unsqueeze(-1)
            if f + 1 < max_new_tokens and not pm.is_first:
                link.send(fed[j], pm.first_rank, TOKENS, (f, j))
    link.close()
    shape = (n, max_new_tokens)
    responses = torch.zeros(shape, dtype=torch.int64, device=pm.device)
    logps, mask = torch.zeros(shape, device=pm.device), torch.zeros(shape, device=pm.device)
    if samplers:
        responses, logps, mask = (torch.cat(parts) for parts in zip(*(s.result() for s in samplers)))
    responses, logps, mask = (pm.from_last_stage(x) for x in (responses, logps, mask))
    return Rollout(sequences=torch.cat([prompts, responses], dim=1), responses=responses, logprobs=logps, mask=mask)


LossFn = Callable[[StageView, Experience], tuple[Tensor, dict[str, float]]]


def train_step(pm: ParallelModel, optimizer: torch.optim.Optimizer, loss_fn: LossFn, exp: Experience,
               microbatches: int, cfg: RLConfig, stat_keys: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """One optimizer step on this replica's rows `exp` in `microbatches` microbatches (GPipe schedule:
    all forwards, then all backwards in reverse, both phases pipelined over the stages). `exp` is any batch
    with `len`, `rows(slice)` and `forward_rows` (rows of the forward pass per batch row: an Experience 1, DPO's
    PairRows 2, both sides of a pair).

    Returns (statistics summed over microbatches and replicas, valid on the last stage; pre-clip norm).
    """
    n = len(exp)
    chunks = [c for c in split_rows(0, n, max(1, min(microbatches, n))) if c[1] > c[0]] if n else []
    pm.module.train()
    link = StageLink(pm, len(chunks))
    pending: list[tuple[Optional[Tensor], Optional[Tensor], Tensor]] = []
    sums = torch.zeros(len(stat_keys), dtype=torch.float64, device=pm.device)
    rows = [exp.forward_rows * (hi - lo) for lo, hi in chunks]  # what each microbatch's forward pass carries
    for j, (lo, hi) in enumerate(chunks):
        view = StageView(pm, link, j, rows)
        loss, stats = loss_fn(view, exp.rows(slice(lo, hi)))
        inp, out = view.records[0]
        pending.append((loss if pm.is_last else None, inp, out))
        if pm.is_last:
            sums += torch.tensor([float(stats.get(k, 0.0)) for k in stat_keys], dtype=torch.float64, device=pm.device)
    if not pm.is_last:
        for j, (_, _, out) in enumerate(pending):
            link.expect(tuple(out.shape), out.dtype, pm.next, GRADIENT, (j,))
    for j in reversed(range(len(pending))):
        loss, inp, out = pending[j]
        grad = None if loss is not None else link.recv(tuple(out.shape), out.dtype, pm.next, GRADIENT, (j,))
        with pm.event("backward", (j,)):
            if loss is not None:
                loss.backward()
            else:
                out.backward(grad)
        if inp is not None:
            link.send(inp.grad, pm.prev, GRADIENT, (j,))
    link.close()
    pm.allreduce_grads()
    norm = optimizer_step(pm.module, optimizer, cfg, reduce_sq=pm.grad_sq_total)
    if pm.is_last and pm.dp_group is not None:
        dist.all_reduce(sums, group=pm.dp_group)
    return dict(zip(stat_keys, sums.tolist())), norm


def shard_of(full: dict[str, Tensor], shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int,
             layers: int) -> dict[str, Tensor]:
    """This rank's pieces of full tensors (an initial checkpoint or a saved version)."""
    out = {}
    for name, piece in rank_pieces(shapes, layout, rank, layers).items():
        t = full[name]
        out[name] = t.clone() if piece.dim is None else t.narrow(piece.dim, piece.lo, piece.hi - piece.lo).clone()
    return out


def param_shapes(arch: Arch, kind: str, net: NetOptions) -> dict[str, tuple[int, ...]]:
    """Full parameter shapes of a model (built once on the CPU: the meta device would pull in torch's
    compiler stack on first use, seconds per process)."""
    model = TransformerModel(arch, kind, net)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


__all__ = ["ProcessGroups", "ParallelModel", "StageView", "StageLink", "StageEvent", "infer", "generate", "train_step", "shard_of", "param_shapes",
           "canonical_name", "param_piece", "TP_IMPLS"]
