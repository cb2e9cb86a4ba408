"""Model parallelism of one invocation: TP, PP and DP with microbatches on per-vertex process groups.

Paper Sec. VII (each vertex runs under its own plan (dp, pp, tp, mb)) and spec Sec. 1.4 (nested
placement). Which part uses what:
- tensor parallelism: Megatron-style column/row-parallel projections in every block, from
  megatron-core (`megatron_compat`, tp_impl "megatron") or from the two autograd functions below
  (tp_impl "torch": identity forward / all-reduce backward before a column-parallel projection,
  all-reduce forward / identity backward after a row-parallel one). Either way on the vertex's own
  TP group; embeddings, norms and heads are replicated over TP;
- pipeline parallelism: stage slicing of the blocks (`layout.stage_bounds`) with point-to-point
  send/recv of activations and their gradients per microbatch (a GPipe schedule: all forwards, then
  all backwards in reverse), plain torch.distributed;
- data parallelism: a SUM all-reduce of the gradients over the DP group (the losses are sums over local
  tokens divided by the GLOBAL token count, so the sum is the whole-batch gradient), plain
  torch.distributed.
Generation, inference and the losses are the single-process functions of `generation` and `rl`, run
on a `StageView` that looks like a `TransformerModel` to them.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rpegc.core.errors import RpegError
from rpegc.core.program import Arch
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
    def __init__(self, in_features: int, out_local: int, group):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_local, in_features))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(_CopyToTP.apply(x, self.group), self.weight)


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


def _tp_linear(kind: str, lin: nn.Linear, tp: int, group, impl: str) -> nn.Module:
    if impl == "megatron":
        from rpegc.runtime.torch_backend import megatron_compat as mc

        make = mc.column_linear if kind == "column" else mc.row_linear
        return make(lin.in_features, lin.out_features, tp, group)
    if kind == "column":
        return ColumnParallelLinear(lin.in_features, lin.out_features // tp, group)
    return RowParallelLinear(lin.in_features // tp, lin.out_features, group)


def build_stage_module(arch: Arch, kind: str, net: NetOptions, layout: Layout, rank: int, tp_group,
                       tp_impl: str) -> TransformerModel:
    """The part of the model `rank` runs: its pipeline stage's blocks, TP-sharded projections.

    Parameters keep the names of the single-process model (after `canonical_name`); their values are
    placeholders until a published version is loaded.
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
                setattr(block.attn, name, _tp_linear("column", getattr(block.attn, name), layout.tp, tp_group, tp_impl))
            block.attn.wo = _tp_linear("row", block.attn.wo, layout.tp, tp_group, tp_impl)
            if block.mlp.kind == "swiglu":
                block.mlp.w_gate = _tp_linear("column", block.mlp.w_gate, layout.tp, tp_group, tp_impl)
            block.mlp.w_up = _tp_linear("column", block.mlp.w_up, layout.tp, tp_group, tp_impl)
            block.mlp.w_down = _tp_linear("row", block.mlp.w_down, layout.tp, tp_group, tp_impl)
    return model


# ---------------------------------------------------------------------------------------------------
# One rank's share of a model under a layout


class ParallelModel:
    """The stage module of `rank` under `layout` with its TP/PP/DP/replica groups."""

    def __init__(self, arch: Arch, kind: str, net: NetOptions, layout: Layout, rank: int, groups: ProcessGroups,
                 tp_impl: str):
        self.arch, self.kind, self.net, self.layout, self.rank = arch, kind, net, layout, rank
        d, p, t = layout.coord(rank)
        self.d, self.p, self.t = d, p, t
        self.first_layer, self.last_layer = stage_bounds(arch.layers, layout.pp)[p]
        self.is_first, self.is_last = p == 0, p == layout.pp - 1
        self.prev = layout.rank_at(d, p - 1, t) if not self.is_first else None
        self.next = layout.rank_at(d, p + 1, t) if not self.is_last else None
        self.last_rank = layout.rank_at(d, layout.pp - 1, t)
        self.tp_group = groups.get(layout.tp_group(d, p))
        self.pp_group = groups.get(layout.pp_group(d, t))
        self.dp_group = groups.get(layout.dp_group(p, t))
        self.mp_group = groups.get(layout.replica(d))
        self.module = build_stage_module(arch, kind, net, layout, rank, self.tp_group, tp_impl)
        self.loaded: Optional[tuple[str, int]] = None  # (model, version) of the values in the module

    def params(self) -> dict[str, nn.Parameter]:
        return {canonical_name(n): p for n, p in self.module.named_parameters()}

    def load(self, shards: dict[str, Tensor]) -> None:
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

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        a = self.arch
        cache = KVCache(0, batch, a.kv_heads // self.layout.tp, a.head_dim, capacity, torch.float32)
        shape = (batch, a.kv_heads // self.layout.tp, capacity, a.head_dim)
        empty = torch.empty(0)
        cache.keys = [torch.zeros(shape) if self.first_layer <= i < self.last_layer else empty for i in range(a.layers)]
        cache.values = [torch.zeros(shape) if self.first_layer <= i < self.last_layer else empty
                        for i in range(a.layers)]
        return cache

    def stage_forward(self, tokens: Tensor, cache: Optional[KVCache] = None,
                      grad: bool = False) -> tuple[Optional[Tensor], Tensor]:
        """This stage's blocks on `tokens` [b, t]: (received input or None on stage 0, output)."""
        b, t = tokens.shape
        start = cache.length if cache is not None else 0
        inp: Optional[Tensor] = None
        if self.is_first:
            h = self.module.embed_tokens(tokens, start)
        else:
            inp = torch.empty(b, t, self.arch.hidden)
            dist.recv(inp, self.prev)
            if grad:
                inp.requires_grad_(True)
            h = inp
        out = self.module.forward_layers(h, start, cache, self.first_layer, self.last_layer)
        if not self.is_last:
            dist.send(out.detach().contiguous(), self.next)
        return inp, out

    def from_last_stage(self, x: Tensor) -> Tensor:
        """`x` as the last stage computed it, on every stage of this pipeline."""
        if self.pp_group is not None:
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
        total = torch.zeros((), dtype=torch.float64)
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


class StageView:
    """What `generate`, `response_forward`, `last_token_scores` and the losses use of a TransformerModel.

    mode "generate": every call returns the last position's logits, broadcast from the last stage so all
    stages sample the same tokens. mode "forward": the last stage returns its heads' output; other stages
    run their blocks and return zeros of the right shape (their results are replaced by the last stage's).
    """

    def __init__(self, pm: ParallelModel, mode: str):
        self.pm, self.mode = pm, mode
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

    def new_cache(self, batch: int, capacity: Optional[int] = None) -> KVCache:
        return self.pm.new_cache(batch, capacity or self.opts.max_seq)

    def __call__(self, tokens: Tensor, cache: Optional[KVCache] = None) -> ModelOutput:
        pm = self.pm
        inp, out = pm.stage_forward(tokens, cache, grad=torch.is_grad_enabled())
        if cache is not None:
            cache.length += tokens.shape[1]
        self.records.append((inp, out))
        b, t = tokens.shape
        if self.mode == "generate":
            logits = pm.module.heads(out).logits[:, -1:] if pm.is_last else torch.empty(b, 1, pm.arch.vocab)
            return ModelOutput(logits=pm.from_last_stage(logits), values=None)
        if pm.is_last:
            return pm.module.heads(out)
        return ModelOutput(logits=torch.zeros(b, t, pm.arch.vocab) if self.has_lm_head else None,
                           values=torch.zeros(b, t) if self.has_value_head else None)


def infer(pm: ParallelModel, fn: Callable[[StageView], Tensor]) -> Tensor:
    """Run `fn` (e.g. response_forward(...).logprobs) through the pipeline; its result on every stage."""
    with torch.no_grad():
        view = StageView(pm, "forward")
        result = fn(view)
    return pm.from_last_stage(result)


LossFn = Callable[[StageView, Experience], tuple[Tensor, dict[str, float]]]


def train_step(pm: ParallelModel, optimizer: torch.optim.Optimizer, loss_fn: LossFn, exp: Experience,
               microbatches: int, cfg: RLConfig, stat_keys: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """One optimizer step on this replica's rows `exp` in `microbatches` microbatches (GPipe schedule).

    Returns (statistics summed over microbatches and replicas, valid on the last stage; pre-clip norm).
    """
    n = exp.sequences.shape[0]
    chunks = [c for c in split_rows(0, n, max(1, min(microbatches, n))) if c[1] > c[0]] if n else []
    pm.module.train()
    pending: list[tuple[Optional[Tensor], Optional[Tensor], Tensor]] = []
    sums = torch.zeros(len(stat_keys), dtype=torch.float64)
    for lo, hi in chunks:
        view = StageView(pm, "forward")
        loss, stats = loss_fn(view, exp.rows(slice(lo, hi)))
        inp, out = view.records[0]
        pending.append((loss if pm.is_last else None, inp, out))
        if pm.is_last:
            sums += torch.tensor([float(stats.get(k, 0.0)) for k in stat_keys], dtype=torch.float64)
    for loss, inp, out in reversed(pending):
        if loss is not None:
            loss.backward()
        else:
            g = torch.empty_like(out)
            dist.recv(g, pm.next)
            out.backward(g)
        if inp is not None:
            dist.send(inp.grad.contiguous(), pm.prev)
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


__all__ = ["ProcessGroups", "ParallelModel", "StageView", "infer", "train_step", "shard_of", "param_shapes",
           "canonical_name", "param_piece", "TP_IMPLS"]
