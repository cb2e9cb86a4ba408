"""rl/step.py's estimators, losses, aggregations and KL estimators against verl's own (`verl.trainer.ppo.core_algos`,
the pinned test dependency verl==0.9.1: `make install`), on the same tensors.

verl imports `ray` at import time though nothing in core_algos uses it, so the import runs with a stand-in module
(verl's own tests of core_algos need Ray installed); its import also sets environment variables and a root logging
handler, which the fixture restores. Where the conventions differ the test passes verl the settings that make them
one: no dual-clip (verl's clip_ratio_c, which rpegc does not implement, set to 1e9), whole-batch normalisers
(dp_size 1). Tolerance: both sides compute in float32 on the same inputs in nearly the same order (verl's GRPO
statistics in float32, ours in float64; sums of at most 48 terms): 1e-5 relative, 1e-6 absolute.
"""

import logging
import os
import sys
from types import ModuleType
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.backends.torch.rl.algorithms import default_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import (LOSS_AGG_MODES, Experience, aggregate, compute_advantages,
                                                   # noqa: E402
                                            kl_estimate, loss_normaliser, policy_loss, sequence_ratio, value_loss)

TOL = dict(rtol=1e-5, atol=1e-6)
R, GROUPS, T = 4, 3, 6  # 3 prompts x 4 rollouts, 6 response tokens


@pytest.fixture(scope="module")
def verl() -> ModuleType:
    """verl's core_algos, imported with `ray` stood in for; the process's environment and logging as they were."""
    env, handlers, level = dict(os.environ), list(logging.root.handlers), logging.root.level
    had_ray = "ray" in sys.modules
    sys.modules.setdefault("ray", mock.MagicMock())
    try:
        import verl.trainer.ppo.core_algos as core_algos
    finally:
        if not had_ray:
            sys.modules.pop("ray", None)
        os.environ.clear()
        os.environ.update(env)
        logging.root.handlers[:] = handlers
        logging.root.setLevel(level)
    return core_algos


@pytest.fixture(scope="module")
def batch() -> dict:
    """Rollouts of varied lengths (right padding), scores with a tied group (all equal) and ties inside groups."""
    g = torch.Generator().manual_seed(0)
    n = R * GROUPS
    lengths = torch.tensor([6, 3, 5, 1, 6, 6, 2, 4, 5, 6, 3, 6])
    mask = (torch.arange(T) < lengths[:, None]).float()
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.3, 0.3, 0.3, 0.3, 0.0, 1.0, 1.0, 0.2])
    old = -torch.rand(n, T, generator=g) * 2
    return dict(mask=mask, scores=scores, old=old, logp=old + 0.3 * torch.randn(n, T, generator=g),
                ref=old + 0.2 * torch.randn(n, T, generator=g), values=torch.randn(n, T, generator=g),
                index=np.array([f"p{i // R}" for i in range(n)], dtype=object))


def token_rewards(b: dict) -> torch.Tensor:
    """The score on each sequence's last real token, as verl's outcome rewards are laid out."""
    out = torch.zeros_like(b["mask"])
    out[torch.arange(len(out)), b["mask"].sum(-1).long() - 1] = b["scores"]
    return out


def ours(b: dict, **settings) -> torch.Tensor:
    exp = Experience(torch.zeros(len(b["mask"]), 2 + T, dtype=torch.long), b["mask"], b["old"], b["ref"],
                     b["scores"], values=b["values"])
    return compute_advantages(exp, default_rl_config(settings.pop("algorithm", "grpo"), **settings), R).advantages


@pytest.mark.parametrize("by_std", [True, False])
def test_grpo_and_dr_grpo_advantages(verl, batch, by_std):
    want, _ = verl.compute_grpo_outcome_advantage(token_rewards(batch), batch["mask"], batch["index"],
                                                  epsilon=1e-6, norm_adv_by_std_in_grpo=by_std)
    torch.testing.assert_close(ours(batch, norm_adv_by_std=by_std), want, **TOL)


def test_rloo_advantages(verl, batch):
    want, _ = verl.compute_rloo_outcome_advantage(token_rewards(batch), batch["mask"], batch["index"])
    torch.testing.assert_close(ours(batch, adv_estimator="rloo"), want, **TOL)


def test_reinforce_plus_plus_advantages(verl, batch):
    from verl.trainer.config import AlgoConfig

    want, _ = verl.compute_reinforce_plus_plus_outcome_advantage(token_rewards(batch), batch["mask"],
                                                                 config=AlgoConfig(gamma=0.9))
    got = ours(batch, adv_estimator="reinforce_plus_plus", kl_in_reward=False, gamma=0.9)
    torch.testing.assert_close(got, want, **TOL)


def test_reinforce_plus_plus_baseline_advantages(verl, batch):
    want, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards(batch), batch["mask"],
                                                                          batch["index"])
    torch.testing.assert_close(ours(batch, adv_estimator="reinforce_plus_plus_baseline"), want, **TOL)


def test_gae_advantages_whitened_over_the_batch(verl, batch):
    want, _ = verl.compute_gae_advantage_return(token_rewards(batch), batch["values"], batch["mask"], 1.0, 0.95)
    got = ours(batch, algorithm="ppo", kl_in_reward=False, gamma=1.0, lam=0.95)
    torch.testing.assert_close(got * batch["mask"], want * batch["mask"], **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_aggregation(verl, batch, mode):
    terms = batch["values"]
    want = verl.agg_loss(terms, batch["mask"], mode)
    got = aggregate(terms, batch["mask"], loss_normaliser(batch["mask"], mode), mode)
    torch.testing.assert_close(got, want, **TOL)


def _actor_config(verl_low: float, verl_high: float):
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=R, ppo_micro_batch_size_per_gpu=1, clip_ratio=verl_low,
                       clip_ratio_low=verl_low, clip_ratio_high=verl_high, clip_ratio_c=1e9)


@pytest.mark.parametrize("name", ["vanilla", "gspo"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_losses_and_their_gradients(verl, batch, name, mode):
    """PPO's clipped surrogate with DAPO's clip-higher (0.2 / 0.28), or GSPO's sequence ratios, under each
    aggregation: the loss and its gradient with respect to the log-probs."""
    adv = ours(batch) + 0.1 * batch["values"]  # per-token advantages of both signs
    low, high = (0.2, 0.28) if name == "vanilla" else (3e-4, 4e-4)

    def both(logp_fn):
        logp = batch["logp"].clone().requires_grad_()
        loss = logp_fn(logp)
        loss.backward()
        return loss.detach(), logp.grad

    want = both(lambda logp: verl.get_policy_loss_fn(name)(
        old_log_prob=batch["old"], log_prob=logp, advantages=adv, response_mask=batch["mask"], loss_agg_mode=mode,
        config=_actor_config(low, high))[0])
    ratio = (lambda logp: sequence_ratio(logp, batch["old"], batch["mask"])) if name == "gspo" else (lambda logp: None)
    got = both(lambda logp: policy_loss(logp, batch["old"], adv, batch["mask"], low,
                                        loss_normaliser(batch["mask"], mode), mode, high, ratio=ratio(logp))[0])
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)


@pytest.mark.parametrize("ours_name, verl_name", [("k1", "k1"), ("k2", "k2"), ("k3", "k3")])
def test_kl_estimators(verl, batch, ours_name, verl_name):
    want = verl.kl_penalty(batch["logp"], batch["ref"], verl_name)
    torch.testing.assert_close(kl_estimate(batch["logp"], batch["ref"], ours_name), want, **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_clipped_value_loss(verl, batch, mode):
    returns = batch["values"] + torch.linspace(-1, 1, T)
    vpreds = batch["values"] + 0.3 * torch.cos(torch.arange(len(returns) * T).float()).view(-1, T)
    want, _ = verl.compute_value_loss(vpreds, returns, batch["values"], batch["mask"], cliprange_value=0.2,
                                      loss_agg_mode=mode)
    got = value_loss(vpreds, batch["values"], returns, batch["mask"], 0.2, loss_normaliser(batch["mask"], mode), mode)
    torch.testing.assert_close(got, want, **TOL)
