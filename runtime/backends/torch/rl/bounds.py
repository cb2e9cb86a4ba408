"""The range of every bounded RL setting, declared once: read by the checks of an RL config (`step.check_rl_config`,
whoever built it) and of what a user sets (`hyperparameters`: a TOML file, --rl, --lr). Importing it needs no torch.

The training arithmetic is float32, so the bounds keep every setting where it stays finite: Adam moves each weight
by about the learning rate per step (lr > 1 throws a model's weights, of order 0.01-1, out in one step; the same for
lr x weight decay); coefficients multiply loss terms of order 1-100 (above 1e4 one term is all the loss, and float32
sums lose the rest); the sampler divides float32 logits by the temperature (below 1e-4 that is greedy decoding to
float32 precision, for which top_k = 1 is the setting; 1e-300 is zero in float32, and the division gives NaN); an
epsilon below the smallest normal float32 is zero, and Adam's update divides by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32: an epsilon below it is zero in the arithmetic
LR_MAX = 1.0  # the largest learning rate (--lr, lr_actor, lr_critic)


@dataclass(frozen=True)
class Bound:
    """A setting's range: at least `low` (or above it, when `low` itself is not allowed), at most `high`."""

    low: Optional[float] = None
    low_allowed: bool = True
    high: Optional[float] = None

    def error(self, name: str, value: Any) -> Optional[str]:
        """What is wrong with `value` of setting `name`; None: it is in range (an unset setting, None, is)."""
        if value is None:
            return None
        if self.low is not None and (value < self.low or (value == self.low and not self.low_allowed)):
            return f"{name} must be {'>=' if self.low_allowed else '>'} {self.low}, got {value}"
        if self.high is not None and value > self.high:
            return f"{name} must be <= {self.high}, got {value}"
        return None


def above(low: float, high: Optional[float] = None) -> Bound:
    return Bound(low, False, high)


def at_least(low: float, high: Optional[float] = None) -> Bound:
    return Bound(low, True, high)


BOUNDS = {
    "lr_actor": above(0.0, LR_MAX), "lr_critic": above(0.0, LR_MAX), "weight_decay": at_least(0.0, 1.0),
    "grad_clip": above(0.0), "clip_eps": above(0.0), "clip_eps_high": above(0.0), "gamma": at_least(0.0, 1.0),
    "lam": at_least(0.0, 1.0), "kl_coef": at_least(0.0, 1e4), "value_clip": above(0.0),
    "value_coef": at_least(0.0, 1e4), "entropy_coef": at_least(0.0, 1e4), "ppo_epochs": at_least(1, 1000),
    "ppo_minibatches": at_least(1, 100000), "temperature": at_least(1e-4, 1e4), "top_p": above(0.0, 1.0),
    "top_k": at_least(0), "adam_eps": at_least(FLOAT32_TINY, 1.0), "grpo_eps": at_least(FLOAT32_TINY, 1.0),
    "dpo_beta": above(0.0, 1e4), "overlong_buffer": at_least(0), "overlong_penalty": at_least(0.0),
}


def range_error(name: str, value: Any) -> Optional[str]:
    """What is wrong with `value` of RL setting `name` (its bound, and adam_betas' two betas); None: nothing."""
    if name == "adam_betas" and not all(0 <= b < 1 for b in value):
        return f"adam_betas must lie in [0, 1), got {list(value)}"
    return BOUNDS[name].error(name, value) if name in BOUNDS else None
