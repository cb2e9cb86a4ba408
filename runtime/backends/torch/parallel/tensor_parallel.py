"""Tensor parallelism with plain torch.distributed (tp_impl "torch"): Megatron-style column- and row-parallel
projections on a vertex's own TP group, or megatron-core's layers (tp_impl "megatron", megatron_compat.py).
Identity forward / all-reduce backward before a column-parallel projection, all-reduce forward / identity
backward after a row-parallel one (parallel/parallel_model.py tells where these sit in a block)."""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rpegc.core.ir.errors import RpegError


TP_IMPLS = ("megatron", "torch")


def resolve_tp_impl(wanted: str, needs_tp: bool) -> tuple[str, Optional[str]]:
    """The TP implementation a run asking for `wanted` (auto, megatron, torch) uses: megatron-core's layers when TP
    is used and megatron-core is installed (found, not imported: the controller never imports it, the workers do),
    and what the run says when auto falls back to plain torch.distributed."""
    if wanted not in ("auto",) + TP_IMPLS:
        raise RpegError(None, f"unknown tensor-parallel implementation '{wanted}'; use auto, megatron or torch")
    if not needs_tp or wanted == "torch":
        return "torch", None
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        why = "megatron-core is not installed"
        if wanted == "megatron":
            raise RpegError(None, f"--tp-impl megatron: {why}; install megatron-core 0.16.1 or use --tp-impl torch")
        return "torch", f"{why}; tensor parallelism falls back to plain torch.distributed"
    return "megatron", None


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


def copy_to_tp(x: Tensor, group) -> Tensor:
    """`x` unchanged, its gradient summed over the TP `group` (what each rank's share of the work contributed)."""
    return _CopyToTP.apply(x, group)


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
        return F.linear(copy_to_tp(x, self.group), self.weight, self.bias)


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


def tp_linear(kind: str, lin: nn.Linear, tp: int, group, impl: str, device: torch.device) -> nn.Module:
    if impl == "megatron":
        from rpegc.runtime.backends.torch.parallel import megatron_compat as mc

        if kind == "column":
            return mc.column_linear(lin.in_features, lin.out_features, tp, group, device, bias=lin.bias is not None)
        return mc.row_linear(lin.in_features, lin.out_features, tp, group, device)
    if kind == "column":
        return ColumnParallelLinear(lin.in_features, lin.out_features // tp, group, bias=lin.bias is not None)
    return RowParallelLinear(lin.in_features // tp, lin.out_features, group)
