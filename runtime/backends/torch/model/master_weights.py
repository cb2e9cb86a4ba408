"""What an optimizer step updates: the precision a model trains in, its master weights, Adam and the clip.

Spec 6.1 and the paper's App. B ("All runs use BF16 ... and ZeRO-2 gradient sharding for P_d > 1"): a training
device holds the working copy (s_b W_shard bytes), the gradients (s_b bytes per parameter) and, for the parameters
it steps (its data-parallel replica's ZeRO share under ZeRO 1 and 2, all under ZeRO 0), FP32 master weights and
Adam's two FP32 moments (12 bytes per parameter). The training precision is the training's (core/ir/training.py:
`precision`, by default from the workload's tensor format, the cost model's s_b):
- mixed (a bf16 workload): the module computes in bf16 (forward, backward, its gradients, the data-parallel
  reductions of the gradients, the pipeline messages and the broadcast of the updated weights) and the FP32
  masters exist only for the parameters this rank steps. After its Adam update a master is written back into the
  bf16 working copy, which `ZeroGradients.broadcast` (parallel/zero.py) then sends to the other replicas.
- fp32: the module's own float32 parameters are the masters; nothing is copied (8 bytes of moments per parameter).
- fp16 is not trained: fp16 gradients underflow without loss scaling, which the torch backend does not do.

Each parameter is stepped on its own: its gradient becomes float32 (times the clip scale) just before its Adam
update and is freed right after, so the float32 gradients of a share never exist at once (the cost model counts
none). Adam's single-tensor update of one parameter does not depend on the others, so this is bit-identical to
one step over all of them.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor, nn

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Workload
from rpegc.core.ir.training import Training
from rpegc.runtime.backends.torch.rl.step import RLConfig
from rpegc.runtime.backends.torch.rl.finite import require_finite

TRAINING_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# The squared global gradient norm from the gradients a rank steps (by parameter name); summed over the ranks
# that hold other parameters by a distributed model (`ZeroGradients.sq_total`).
SquaredNorm = Callable[[dict[str, Tensor]], Tensor]


def training_dtype(workload: Workload, train: Optional[Training] = None) -> torch.dtype:
    """The dtype a trained module computes in: float32 under precision fp32, else the workload's 16-bit dtype
    (`train`: the training resolved for its vertex; None: the workload's)."""
    if (train or workload.training()).precision == "fp32":
        return torch.float32
    dtype = TRAINING_DTYPES.get(workload.dtype)
    if dtype is None:
        raise RpegError(workload.loc, f"the torch backend trains in bf16 (mixed precision) or fp32, not "
                        f"'{workload.dtype}': fp16 gradients need loss scaling, which it does not implement; "
                        "write dtype = bf16 or dtype = fp32")
    return dtype


# Elements of a gradient squared in float64 at once (1 MiB with the square): a whole float64 copy of the largest
# gradient (and its square) would be the largest transient of a step.
SQUARE_PIECE = 1 << 16


def sum_of_squares(g: Tensor) -> Tensor:
    """sum(g^2) in float64, a piece at a time."""
    flat = g.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=g.device)
    for i in range(0, flat.numel(), SQUARE_PIECE):
        total += flat[i:i + SQUARE_PIECE].double().square().sum()
    return total


def local_sq_norm(grads: dict[str, Tensor]) -> Tensor:
    """The squared 2-norm of one process's gradients, summed in float64."""
    device = next(iter(grads.values())).device if grads else None
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads.values():
        total = total + sum_of_squares(g)
    return total


def clip_scale(norm: Tensor, max_norm: float) -> Tensor:
    """The factor that brings the gradients' global norm to at most `max_norm`: max_norm / (norm + 1e-6), capped
    at 1, as in torch.nn.utils.clip_grad_norm_."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


def train_whole(model: nn.Module, dtype: torch.dtype, lr: float, cfg: RLConfig) -> "MasterWeights":
    """Make a whole float32 model (version 0, in a single process) a module trained in `dtype`: the module is cast,
    its masters keep the float32 values it had (not the cast's rounding)."""
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.to(dtype)
    master = MasterWeights(dict(model.named_parameters()), values, lr, cfg)
    master.load(values)
    return master


class MasterWeights:
    """The FP32 values Adam updates for the parameters `names` of a module's `params` (the rank's ZeRO share, or
    all of them), with the optimizer. A module in float32 is its own master; one in bf16 gets float32 copies of
    `names` only (module docstring). Adam has App. B's zero weight decay and is torch's fused kernel: it updates a
    parameter in place without the temporaries of the single-tensor Adam (two of the parameter's size), on the CPU
    and on CUDA."""

    def __init__(self, params: dict[str, nn.Parameter], names: Iterable[str], lr: float, cfg: RLConfig):
        chosen = set(names)
        self.params = params
        self.names = [n for n in params if n in chosen]
        self.mixed = any(p.dtype != torch.float32 for p in params.values())
        self.values = {n: params[n].detach().to(torch.float32, copy=True) if self.mixed else params[n]
                       for n in self.names}
        self.optimizer = torch.optim.Adam(list(self.values.values()), lr=lr, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                          weight_decay=cfg.weight_decay, fused=True)

    def load(self, shards: dict[str, Tensor]) -> None:
        """Set the masters to a version's float32 values (the caller loads the module's working copy)."""
        if self.mixed:
            with torch.no_grad():
                for n in self.names:
                    self.values[n].copy_(shards[n])

    def export(self, copy: bool = True) -> dict[str, Tensor]:
        """The masters (float32), by parameter name: a copy, or (`copy=False`, for a checkpoint written at once) the
        masters themselves, which the next step changes."""
        return {n: v.detach().clone() if copy else v.detach() for n, v in self.values.items()}

    def nbytes(self) -> int:
        """Bytes of the float32 masters (none for a float32 module: they are its parameters) and the Adam state."""
        tensors = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
        if self.mixed:
            tensors += list(self.values.values())
        return sum(t.numel() * t.element_size() for t in tensors)

    def adam_state(self, name: str) -> dict:
        return self.optimizer.state.get(self.values[name], {})

    def set_adam_state(self, name: str, state: dict) -> None:
        self.optimizer.state[self.values[name]] = state

    def grads(self) -> dict[str, Tensor]:
        """The module's gradients of the parameters this rank steps: what the clip norm counts."""
        return {n: self.params[n].grad for n in self.names if self.params[n].grad is not None}

    def step(self, cfg: RLConfig, sq_total: SquaredNorm = local_sq_norm) -> float:
        """Clip on the global gradient norm, update every master with a gradient by Adam (one at a time: module
        docstring), write it back into a bf16 working copy, and clear all gradients. Returns the pre-clip norm."""
        grads = self.grads()
        norm = sq_total(grads).sqrt()
        require_finite("the gradient norm", float(norm))  # global: every replica and stage stops here alike
        scale = clip_scale(norm, cfg.grad_clip)
        for p in self.params.values():
            p.grad = None  # `grads` holds them; a float32 module's gradients must not meet Adam all at once
        for n in list(grads):
            grad = grads.pop(n).to(torch.float32)  # a float32 copy of a bf16 gradient (which goes), or itself
            grad.mul_(scale.to(grad.dtype))
            master = self.values[n]
            master.grad = grad
            self.optimizer.step()  # only `master` has a gradient: Adam skips the others
            master.grad = None
            require_finite(f"weight {n} after the update", master)
            if self.mixed:
                with torch.no_grad():
                    self.params[n].copy_(master)
        return float(norm)
