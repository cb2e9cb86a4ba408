"""PPO (Schulman et al. 2017; paper Sec. II, App. B): rollouts, a critic's values, GAE advantages (whitened),
the clipped policy and value losses; the math is rl.py's, the reference step `reference.ReferenceTrainer`'s."""

from __future__ import annotations

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.algorithms.base import Algorithm


class PPO(Algorithm):
    name = "ppo"
    stat_keys = {"policy": ("policy_loss", "clipped_tokens"), "actor_critic": ("policy_loss", "clipped_tokens",
                                                                               "value_loss"),
                 "critic": ("value_loss",)}

    def check(self, cfg) -> None:
        if not cfg.has_critic:
            raise RpegError(None, "PPO needs a critic: add a critic model or use a shared actor_critic model "
                            "(or choose GRPO)")
