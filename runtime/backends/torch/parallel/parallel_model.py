"""Model parallelism of one invocation: TP, PP and DP with microbatches on per-vertex process groups.

Paper Sec. VII (each vertex runs under its own plan (dp, pp, tp, mb)) and spec Sec. 1.4 (nested
placement); the pipeline schedules are the ones docs/cost-model-spec.md Sec. 3.3 prices, microbatches in
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
  - training (`train_step`): 1F1B, pp - p - 1 warm-up forwards on stage p, then one forward and one backward
    at a time, then the last backwards (at most min(mb, pp) microbatches' activations live);
  - generation (`generate`): every decode step sends the microbatches through the stages as a
    wavefront; the last stage samples with the per-sequence generators and sends only the token ids
    back to stage 0 (no logits broadcast), and the rollouts are broadcast once at the end;
- data parallelism: ZeRO over the DP group at the training's stage (`zero.ZeroGradients`, a model's `grads`).
Everything a `ParallelModel` builds (its stage module, KV caches, message buffers, placeholders) is on
its `device`: the CPU under gloo, the worker's GPU under NCCL (`device.worker_device`), and in its
`dtype`: the workload's (`models.serving_dtype` for generation and inference, `master_weights.training_dtype`
for training: bf16 when the workload says so), whose activations, KV caches, TP all-reduces, pipeline messages
and (training) gradients, their reductions and the weights' broadcast are then bf16 too; the heads return
float32 (`TransformerModel.heads`), so results, sampling and the losses are float32.
Inference and the losses are the single-process functions of `rl`, run on a `StageView` that looks like
a `TransformerModel` to them; generation repeats `generation.generate`'s sampling step by step, so a
sequence gets the tokens it gets in a single process. `ParallelModel.trace` records a rank's schedule
(what it computed, in order, with times) for tests and measurements.

Modules: this one holds the process groups, the stage module and `ParallelModel` (one rank's share of a
model); `tensor_parallel` the TP projections; `pipeline` the point-to-point links between stages; `zero` the
gradients' reduction over the DP group; `schedules` the pipelined inference, generation and training steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Iterable, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Arch
from rpegc.runtime.backends.torch.controller.device import CPU
from rpegc.runtime.backends.torch.parallel.layout import Layout, rank_pieces, replica_owner, stage_bounds
from rpegc.runtime.backends.torch.model.transformer import (GATED_MLPS, KVCache, NetOptions, TransformerModel,
                                                            param_shapes,
                                                seeded_parameter)
from rpegc.runtime.backends.torch.parallel.pipeline import ACTIVATION, StageEvent, StageLink
from rpegc.runtime.backends.torch.parallel.tensor_parallel import canonical_name, tp_linear
from rpegc.runtime.backends.torch.parallel.zero import ZeroGradients


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


def build_stage_module(arch: Arch, kind: str, net: NetOptions, layout: Layout, rank: int, tp_group, tp_impl: str,
                       device: torch.device = CPU, dtype: torch.dtype = torch.float32) -> TransformerModel:
    """The part of the model `rank` runs: its pipeline stage's blocks, TP-sharded projections, on `device`
    in `dtype` (parameters and floating buffers such as the RoPE tables).

    Parameters keep the names of the single-process model (after `canonical_name`); their values are
    placeholders until a published version is loaded or bound. The module is built on the meta device and
    allocated, uninitialised, once, in `dtype` on `device`: never a float32 copy of a bf16 module, and no
    initialisation that the loaded values replace. megatron's layers are allocated on the device itself.
    """
    _, p, _ = layout.coord(rank)
    first, last = stage_bounds(arch.layers, layout.pp)[p]
    with torch.device("meta"):
        model = TransformerModel(arch, kind, net, stage=(first, last, p == 0, p == layout.pp - 1))
    model = model.to(dtype=dtype)
    if layout.tp > 1:
        for i in range(first, last):
            block = model.layers[i]
            for name in ("wq", "wk", "wv"):
                setattr(block.attn, name, tp_linear("column", getattr(block.attn, name), layout.tp, tp_group, tp_impl,
                                                     device))
            block.attn.wo = tp_linear("row", block.attn.wo, layout.tp, tp_group, tp_impl, device)
            if block.attn.q_norm is not None:  # each rank normalises its own heads: the weights' gradients add up
                block.attn.q_norm.grad_group = block.attn.k_norm.grad_group = tp_group
            if block.mlp.kind in GATED_MLPS:
                block.mlp.w_gate = tp_linear("column", block.mlp.w_gate, layout.tp, tp_group, tp_impl, device)
            block.mlp.w_up = tp_linear("column", block.mlp.w_up, layout.tp, tp_group, tp_impl, device)
            block.mlp.w_down = tp_linear("row", block.mlp.w_down, layout.tp, tp_group, tp_impl, device)
    model = model.to_empty(device=device).to(dtype=dtype)  # a megatron layer built in float32 on the device
    model.init_buffers(device, dtype)
    return model


# ---------------------------------------------------------------------------------------------------
# One rank's share of a model under a layout


class ParallelModel:
    """The stage module of `rank` under `layout` with its TP/PP/DP/replica groups, on `device`, computing in
    `dtype` (the workload's: float32, bf16, or fp16 for serving)."""

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
        self.piece_shapes = {n: tuple(p.shape) for n, p in self.params().items()}  # what this rank holds
        self.grads = ZeroGradients(self.params, replica_owner(param_shapes(arch, kind, net), layout, rank, arch.layers),
                                   layout, (d, p, t), self.dp_group, self.mp_group, device, dtype)
        self.loaded: Optional[tuple[str, int]] = None  # (model, version) of the values in the module
        self.bound: Optional[str] = None  # the weights entry whose tensors the parameters are (`bind`)
        self.trace: Optional[list[StageEvent]] = None  # set to a list to record this rank's schedule

    def params(self) -> dict[str, nn.Parameter]:
        return {canonical_name(n): p for n, p in self.module.named_parameters()}

    def load(self, shards: dict[str, Tensor]) -> None:
        """Copy a version's shards (on any device) into the module's parameters (cast to the module's dtype)."""
        self._check_fit(shards)
        with torch.no_grad():
            for n, p in self.params().items():
                p.copy_(shards[n])

    def _check_fit(self, shards: dict[str, Tensor]) -> None:
        own = self.piece_shapes
        if set(own) != set(shards):
            missing, extra = sorted(set(own) - set(shards)), sorted(set(shards) - set(own))
            raise RpegError(None, f"weights do not fit this rank's shard: missing {missing[:3]}, unexpected "
                            f"{extra[:3]} (layout {self.layout.short()})")
        for n, t in shards.items():
            if tuple(t.shape) != own[n]:
                raise RpegError(None, f"weights do not fit this rank's shard: {n} has shape {tuple(t.shape)}, "
                                f"the rank holds {own[n]} (layout {self.layout.short()})")

    def bind(self, shards: dict[str, Tensor], label: str) -> None:
        """Make the parameters the tensors of weights entry `label` (no copy: a serving module and the copy it
        serves are one copy in memory); a tensor of another dtype or device is cast into a copy."""
        self._check_fit(shards)
        for n, p in self.params().items():
            t = shards[n]
            if t.dtype == p.dtype and t.device == p.device:
                p.data = t
            else:
                with torch.no_grad():
                    p.data = t.to(device=p.device, dtype=p.dtype)
        self.bound = label

    def unbind(self) -> None:
        """Let go of the bound entry's tensors (it is freed or replaced): the parameters hold nothing until the
        next `bind`."""
        for p in self.params().values():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.bound, self.loaded = None, None

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


def shard_of(full: dict[str, Tensor], shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int,
             layers: int) -> dict[str, Tensor]:
    """This rank's pieces of full tensors (an initial checkpoint or a saved version)."""
    out = {}
    for name, piece in rank_pieces(shapes, layout, rank, layers).items():
        t = full[name]
        out[name] = t.clone() if piece.dim is None else t.narrow(piece.dim, piece.lo, piece.hi - piece.lo).clone()
    return out


def seeded_shard(shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int, layers: int, seed: int,
                 std: float, convert: Callable[[Tensor], Tensor] = lambda t: t) -> dict[str, Tensor]:
    """This rank's pieces of version 0 drawn from the model's seed, each `convert`ed as it is drawn: a parameter's
    values depend on (seed, name, shape) alone (`models.seeded_parameter`), so a rank draws only the parameters it
    holds, one at a time, and gets exactly the values of the whole model `models.build_model` makes."""
    out = {}
    for name, piece in rank_pieces(shapes, layout, rank, layers).items():
        t = seeded_parameter(name, shapes[name], seed, std, layers)
        out[name] = convert(t if piece.dim is None else t.narrow(piece.dim, piece.lo, piece.hi - piece.lo).clone())
    return out
