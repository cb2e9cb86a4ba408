"""megatron-core tensor parallelism on explicit, per-vertex process groups, on CPU (gloo) or GPU (NCCL).

docs/architecture.md, Runtime: model parallelism goes through megatron-core where it runs. The torch backend uses
megatron-core's `ColumnParallelLinear` / `RowParallelLinear` for the Megatron-style TP of every block
(column-parallel wq, wk, wv, w_gate, w_up; row-parallel wo, w_down) and passes each vertex's own TP
group as `tp_group`, so two co-located vertices with different layouts live in one worker process;
megatron's global `parallel_state` is never initialised (the tests check that).

What was measured with megatron-core 0.16.1 on torch 2.13 (CPU build, gloo):
- `import megatron.core` works without Triton, Transformer Engine or Apex (it only warns), and does not
  initialise CUDA at import (checked with CUDA's lazy initialisation trapped), so the backend's fork
  server may import it before the workers pick their GPUs;
- with `use_cpu_initialization=True` and `perform_initialization=False` the layers allocate on the CPU
  and never touch the CUDA RNG tracker (the backend loads every weight from the published version);
- the forward/backward of both layers with `gather_output=False`, `input_is_parallel=True`, no sequence
  parallelism and no gradient-accumulation fusion call only `all_reduce` on the given group.
So, for exactly this use, the module needs NO monkey patch: `PATCHES` is empty, and
`tests/test_torchrun_megatron.py` checks that these layers give the single-process result and leave
the global parallel state uninitialised. What would need patches on CPU (the pipeline schedules and
p2p_communication, megatron DDP's grad buffers, the distributed optimizer, grad clipping, all of which
allocate on `torch.cuda.current_device()` or use the global state) is not used: pipeline and data
parallelism are plain torch.distributed in `parallel/parallel_model.py`.

The only CPU-specific choices are settings, not patches, and both depend on the worker's device:
on the CPU `use_cpu_initialization=True` and megatron's CUDA_DEVICE_MAX_CONNECTIONS hint is silenced;
on a GPU (NCCL workers) the layers take megatron's normal path, `use_cpu_initialization=False`, which
allocates the weights on `torch.cuda.current_device()` (the worker sets it to its own GPU first), and the
hint stays visible. The GPU path is written from megatron-core 0.16.1's source and has not been run here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from rpegc.runtime.backends.torch.controller.device import CPU

VERIFIED_VERSIONS = ("0.16.1",)


@dataclass(frozen=True)
class Patch:
    """One change to megatron-core needed to run on CPU: where, and why."""

    target: str
    reason: str


# Nothing to patch for the layers used here (see the module docstring); a patch added later must be
# listed here and exercised by tests/test_torchrun_megatron.py.
PATCHES: tuple[Patch, ...] = ()


def _import() -> tuple[Optional[object], str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
            import megatron.core as mcore
            from megatron.core.tensor_parallel import layers
    except Exception as e:  # ImportError, or a GPU-only dependency failing at import time
        return None, f"megatron-core cannot be imported ({type(e).__name__}: {e})"
    return layers, getattr(mcore, "__version__", "unknown")


# Imported with this module (seconds), so the backend's fork server pays it once for all workers.
_LAYERS, _VERSION = _import()


def load() -> tuple[Optional[object], str]:
    """(megatron.core.tensor_parallel.layers, version) or (None, why it cannot be used)."""
    return _LAYERS, _VERSION


def parallel_config(tp: int, dtype: torch.dtype = torch.float32, device: torch.device = CPU):
    """megatron's settings for TP layers whose weights live on `device` (CPU or the current CUDA device)."""
    from megatron.core.model_parallel_config import ModelParallelConfig

    return ModelParallelConfig(
        tensor_model_parallel_size=tp, use_cpu_initialization=device.type == "cpu", perform_initialization=False,
        params_dtype=dtype, sequence_parallel=False, gradient_accumulation_fusion=False,
    )


def _require(device: torch.device):
    if _LAYERS is None:
        raise RuntimeError(f"{_VERSION}; run with --tp-impl torch")
    if device.type == "cpu":
        # A CUDA-stream tuning hint (CUDA_DEVICE_MAX_CONNECTIONS) megatron prints at the first backward;
        # meaningless on the CPU, worth seeing on a GPU.
        warnings.filterwarnings("ignore", message="When using async grad allreduce")
    elif device.type != "cuda" or device.index != torch.cuda.current_device():
        current = torch.cuda.current_device() if torch.cuda.is_available() else None
        raise RuntimeError(f"megatron's GPU path allocates on torch.cuda.current_device() (= {current}), not on "
                           f"the worker's device {device}; call torch.cuda.set_device first")
    return _LAYERS


def _no_init(_w: Tensor) -> None:
    """Weights come from the published version, never from megatron's initialiser."""


class MegatronLinear(nn.Module):
    """A megatron parallel linear returning a plain tensor (megatron returns (output, bias)).

    Its parameter is `inner.weight`; `tensor_parallel.canonical_name` drops the `inner.` so names match the
    single-process model's.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x)[0]


def column_linear(in_features: int, out_features: int, tp: int, group, device: torch.device = CPU,
                  bias: bool = False) -> MegatronLinear:
    """Column-parallel: this rank holds out_features / tp output rows (and their biases); the input is replicated."""
    layers = _require(device)
    inner = layers.ColumnParallelLinear(in_features, out_features, config=parallel_config(tp, device=device),
                                        init_method=_no_init, bias=bias, gather_output=False, tp_group=group)
    return MegatronLinear(inner)


def row_linear(in_features: int, out_features: int, tp: int, group, device: torch.device = CPU) -> MegatronLinear:
    """Row-parallel: this rank holds in_features / tp input columns; the output is all-reduced."""
    layers = _require(device)
    inner = layers.RowParallelLinear(in_features, out_features, config=parallel_config(tp, device=device),
                                     init_method=_no_init, bias=False, input_is_parallel=True, skip_bias_add=False,
                                     tp_group=group)
    return MegatronLinear(inner)


def global_state_initialized() -> bool:
    """Whether megatron's global parallel state was set up (the backend never does)."""
    from megatron.core import parallel_state

    return bool(parallel_state.model_parallel_is_initialized())


def self_check(rank: int, init_file: str, out_file: str) -> None:
    """Run on two gloo ranks (tests/test_torchrun_megatron.py): a column- then row-parallel pair on its own
    group against the same math in one process; rank 0 saves the relative errors of the output, the input
    gradient and the weight gradient, and whether megatron's global parallel state got initialised."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])  # a vertex's own TP group, not megatron's global one
    gen = torch.Generator().manual_seed(0)
    w1, w2, x = (torch.randn(s, generator=gen) for s in ((8, 4), (4, 8), (3, 5, 4)))
    col, row = column_linear(4, 8, 2, group), row_linear(8, 4, 2, group)
    with torch.no_grad():
        col.inner.weight.copy_(w1[4 * rank:4 * (rank + 1)])
        row.inner.weight.copy_(w2[:, 4 * rank:4 * (rank + 1)])
    xin = x.clone().requires_grad_(True)
    row(torch.relu(col(xin))).square().sum().backward()
    xs, w1s = x.clone().requires_grad_(True), w1.clone().requires_grad_(True)
    ys = torch.relu(xs @ w1s.T) @ w2.T
    ys.square().sum().backward()
    y = row(torch.relu(col(x)))

    def rel(a: Tensor, b: Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max())

    errors = [rel(y.detach(), ys.detach()), rel(xin.grad, xs.grad),
              rel(col.inner.weight.grad, w1s.grad[4 * rank:4 * (rank + 1)])]
    if rank == 0:
        torch.save({"errors": errors, "global_state": global_state_initialized()}, out_file)
    dist.barrier()
    dist.destroy_process_group()
