"""Non-finite numbers are never trained on or saved (issue 33, item 2).

A training step checks what it is about to apply, in the order the step computes it: the reward scores and the
advantages of its rows, the loss terms of its microbatches (on the pipeline's last stage), the global gradient
norm (the same on every replica and stage, so they all stop together) and every master weight after its update.
The first quantity that holds a NaN or an infinity stops the command with a `NonFiniteError` naming it; the worker
reports it as the node's error (the step and the node), the run stops, and no checkpoint or final weights of that
step are written, so the last good checkpoint is what `--resume` continues from. Weights read from a checkpoint or a
Hugging Face directory are checked the same way (`require_finite_tensor`).
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor


class NonFiniteError(Exception):
    """A quantity of a training step, or a tensor read from a file, that holds a NaN or an infinity."""


def finite_tensor(t: Tensor) -> bool:
    """No NaN or infinity in `t`. Its minimum and maximum say so (NaN propagates through both), without the
    temporary of `t`'s size that `torch.isfinite(t).all()` allocates."""
    if t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return True
    lo, hi = torch.aminmax(t.detach())
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def require_finite(what: str, value: Union[float, Tensor]) -> None:
    """Raise NonFiniteError naming `what` unless `value` (a number or a tensor) is finite."""
    if isinstance(value, Tensor):
        if not finite_tensor(value):
            raise NonFiniteError(f"{what} holds {_example(value)}")
        return
    if value != value or value in (float("inf"), float("-inf")):
        raise NonFiniteError(f"{what} is {value}")


def _example(t: Tensor) -> str:
    """The non-finite value `t` holds, and where (for the message)."""
    flat = t.detach().reshape(-1)
    bad = (~torch.isfinite(flat)).nonzero()  # only on the way to an error: the temporary no longer matters
    i = int(bad[0]) if bad.numel() else 0
    return f"{float(flat[i])} (element {i} of {int(flat.numel())})"
