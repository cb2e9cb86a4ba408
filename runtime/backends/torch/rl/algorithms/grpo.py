"""GRPO (Shao et al. 2024, DeepSeekMath; paper Sec. II): R rollouts per prompt, group-relative advantages and no
critic, the KL to the reference as a loss term (k3); the computation is rollout.py's, the math rl/step.py's. A replica
trains whole groups (`row_group`).

GRPO's variants are GRPO-shaped algorithms of their own name (`rpeg.algorithm dapo`), each with its paper's
settings over GRPO's (which --rl overrides):
- Dr. GRPO (Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective): no std scaling of the
  group advantages, no length normalisation (each sequence's token sum over the budget Lr);
- DAPO (Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale): clip-higher (0.28),
  token-level aggregation, no KL term; its overlong shaping is `overlong_buffer`; its dynamic sampling is the
  workload's `oversample` (the runtime keeps informative groups);
- GSPO (Zheng et al. 2025, Group Sequence Policy Optimization): sequence-level importance ratios clipped at
  3e-4 / 4e-4, each sequence's tokens averaged;
- RLOO (Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
  Feedback in LLMs): the leave-one-out baseline;
- REINFORCE++ (Hu 2025, REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models): the KL
  penalty in the per-token reward, batch-whitened returns; and its group-baseline form.
"""

from __future__ import annotations

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Workload
from rpegc.runtime.backends.torch.rl.algorithms.rollout import RolloutAlgorithm
from rpegc.runtime.backends.torch.rl.step import RLConfig


class GRPO(RolloutAlgorithm):
    name = family = "grpo"
    paper = "Shao et al. 2024, DeepSeekMath"
    stat_keys = {"policy": ("policy_loss", "clipped_tokens")}

    def base_rl(self) -> RLConfig:
        return RLConfig(algorithm="grpo", kl_estimator="k3", kl_in_reward=False, whiten_advantages=False,
                        adv_estimator="grpo")

    def training_group(self, w: Workload) -> int:
        # the group estimators need every rollout of a prompt; dynamic sampling a slot's `oversample` groups
        return w.R * w.oversample

    def check(self, cfg) -> None:
        if cfg.has_critic:
            raise RpegError(None, "GRPO uses group-relative advantages and no critic; remove the critic model")
        super().check(cfg)


VARIANTS = (
    GRPO("dr_grpo", dict(norm_adv_by_std=False, loss_agg_mode="seq-mean-token-sum-norm"), "Liu et al. 2025"),
    GRPO("dapo", dict(clip_eps_high=0.28, loss_agg_mode="token-mean", kl_coef=0.0), "Yu et al. 2025"),
    GRPO("gspo", dict(policy_loss="gspo", clip_eps=3e-4, clip_eps_high=4e-4, loss_agg_mode="seq-mean-token-mean"),
         "Zheng et al. 2025"),
    GRPO("rloo", dict(adv_estimator="rloo"), "Ahmadian et al. 2024"),
    GRPO("reinforce_pp", dict(adv_estimator="reinforce_plus_plus", kl_in_reward=True, kl_estimator="k1"), "Hu 2025"),
    GRPO("reinforce_pp_baseline", dict(adv_estimator="reinforce_plus_plus_baseline"), "Hu 2025"),
)
