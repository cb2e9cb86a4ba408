"""PPO (Schulman et al. 2017; paper Sec. II, App. B): rollouts, a critic's values, GAE advantages (whitened),
the clipped policy and value losses, the KL to the reference in the per-token reward (k1); the computation is
rollout.py's, the math rl/step.py's."""

from __future__ import annotations

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.rl.algorithms.rollout import RolloutAlgorithm


class PPO(RolloutAlgorithm):
    name = family = "ppo"
    paper = "Schulman et al. 2017, Proximal Policy Optimization Algorithms"
    stat_keys = {"policy": ("policy_loss", "clipped_tokens"), "actor_critic": ("policy_loss", "clipped_tokens",
                                                                               "value_loss"),
                 "critic": ("value_loss",)}

    def check(self, cfg) -> None:
        if not cfg.has_critic:
            raise RpegError(None, "PPO needs a critic: add a critic model or use a shared actor_critic model "
                            "(or choose GRPO)")
        super().check(cfg)
