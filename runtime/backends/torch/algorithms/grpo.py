"""GRPO (Shao et al. 2024, DeepSeekMath; paper Sec. II): R rollouts per prompt, group-relative advantages and no
critic, the KL to the reference as a loss term (k3); the math is rl.py's, the reference step
`reference.ReferenceTrainer`'s. A replica trains whole groups (`row_group`)."""

from __future__ import annotations

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.algorithms.base import Algorithm


class GRPO(Algorithm):
    name = "grpo"
    stat_keys = {"policy": ("policy_loss", "clipped_tokens")}

    def check(self, cfg) -> None:
        if cfg.has_critic:
            raise RpegError(None, "GRPO uses group-relative advantages and no critic; remove the critic model")
