"""RL math: GAE, PPO/GRPO losses and advantages against hand-computed values; data-parallel exactness."""

import math

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.program import Arch  # noqa: E402
from rpegc.runtime.backends.torch.model.generation import expand_rollouts, generate  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import NetOptions, build_model  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms import default_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import (LOSS_AGG_MODES, Experience, RLConfig, actor_loss,  # noqa: E402
                                            aggregate, compute_advantages, critic_loss, gae,
                                            epoch_stats, grpo_advantages, kl_estimate, masked_moments,
                                            minibatch_rows, minibatch_steps, policy_loss, response_forward,
                                            token_rewards, value_loss, whiten)

torch.set_num_threads(1)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_app_b_hyper_parameters_are_the_defaults():
    cfg = RLConfig()
    assert (cfg.lr_actor, cfg.lr_critic, cfg.weight_decay, cfg.grad_clip) == (1e-6, 1e-6, 0.0, 1.0)
    assert (cfg.clip_eps, cfg.gamma, cfg.lam, cfg.kl_coef, cfg.ppo_epochs) == (0.2, 1.0, 0.95, 0.01, 1)
    grpo = default_rl_config("grpo")
    assert (grpo.kl_in_reward, grpo.kl_estimator, grpo.clip_eps, grpo.kl_coef) == (False, "k3", 0.2, 0.01)


def test_gae_matches_a_hand_computed_example():
    rewards, values = t([0, 0, 1], [0, 0.5, 0]), t([0.5, 0.6, 0.7], [0.2, 0.4, 9.0])
    mask = t([1, 1, 1], [1, 1, 0])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # row 0: deltas 0.1, 0.1, 0.3 -> A2 = 0.3, A1 = 0.1 + 0.95*0.3, A0 = 0.1 + 0.95*A1
    # row 1: the episode ends after token 1, so V_2 = 9 is ignored: A1 = 0.5 - 0.4, A0 = 0.4 - 0.2 + 0.95*0.1
    torch.testing.assert_close(adv, t([0.46575, 0.385, 0.3], [0.295, 0.1, 0.0]))
    torch.testing.assert_close(ret, t([0.96575, 0.985, 1.0], [0.495, 0.5, 0.0]))
    adv, _ = gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=0.5)
    # deltas: 0.9*0.6-0.5 = 0.04, 0.9*0.7-0.6 = 0.03, 1-0.7 = 0.3; gamma*lam = 0.45
    torch.testing.assert_close(adv, t([0.04 + 0.45 * (0.03 + 0.45 * 0.3), 0.03 + 0.45 * 0.3, 0.3]))


def test_token_rewards_put_the_score_on_the_last_real_token_and_the_kl_everywhere():
    r = token_rewards(t(2.0, 3.0), t([1, 1, 1], [2, 2, 2]), t([1, 1, 1], [1, 1, 0]), kl_coef=0.1)
    torch.testing.assert_close(r, t([-0.1, -0.1, 1.9], [-0.2, 2.8, 0.0]))


def test_kl_estimators():
    logp, ref = t(-1.0, -2.0), t(-1.5, -1.0)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), t(0.5, -1.0))
    k3 = kl_estimate(logp, ref, "k3")
    torch.testing.assert_close(k3, t(math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1))
    assert (k3 >= 0).all() and kl_estimate(ref, ref, "k3").eq(0).all()
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), t(0.125, 0.5))  # (log ratio)^2 / 2
    with pytest.raises(RpegError, match="k1, k2, k3"):
        kl_estimate(logp, ref, "k4")
    with pytest.raises(RpegError, match="loss_agg_mode 'mean'; use one of token-mean, seq-mean-token-sum"):
        default_rl_config("grpo", loss_agg_mode="mean")


def oracle_aggregate(terms, mask, mode):
    """The aggregations written out per sequence. As verl's `agg_loss` (verl/trainer/ppo/core_algos.py) on one
    batch: token-mean sum(l m) / sum(m); seq-mean-token-sum: the mean over sequences of sum_t l m; seq-mean-token-
    mean: the mean over sequences of sum_t l m / sum_t m (GRPO, Shao et al. 2024, Eq. 3). seq-mean-token-sum-norm is
    Dr. GRPO's objective (Liu et al. 2025, Sec. 3.1: the 1/|o_i| dropped, the mean over the G responses kept, the
    token sums divided by a constant, here Lr): sum(l m) / (N Lr). verl divides each micro-batch's token sum by Lr
    alone and averages the micro-batches, a scale that depends on the micro-batch size; rpegc's does not."""
    rows = [(sum(float(l) * float(m) for l, m in zip(tr, mr)), sum(float(m) for m in mr)) for tr, mr in zip(terms, mask)]
    n, lr = len(rows), len(mask[0])
    if mode == "token-mean":
        return sum(s for s, _ in rows) / sum(c for _, c in rows)
    if mode == "seq-mean-token-sum":
        return sum(s for s, _ in rows) / n
    if mode == "seq-mean-token-mean":
        return sum(s / c for s, c in rows) / n
    return sum(s for s, _ in rows) / (n * lr)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_aggregation_matches_the_formulas_and_shards_sum_to_the_whole(mode):
    g = torch.Generator().manual_seed(7)
    terms = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0],
                         [1, 0, 0, 0, 0]], dtype=torch.float64)
    exp = Experience(torch.zeros(6, 7, dtype=torch.long), mask, mask, mask, torch.zeros(6))
    whole = float(exp.loss_count(mode))
    want = oracle_aggregate(terms.tolist(), mask.tolist(), mode)
    assert aggregate(terms, mask, whole, mode).item() == pytest.approx(want, rel=1e-12)
    # shards (replicas, microbatches) divide by the whole batch's normaliser, the sum of theirs
    parts = [exp.rows(slice(a, b)) for a, b in ((0, 1), (1, 4), (4, 6))]
    assert sum(float(p.loss_count(mode)) for p in parts) == whole
    total = sum(aggregate(terms[a:b], mask[a:b], whole, mode).item() for a, b in ((0, 1), (1, 4), (4, 6)))
    assert total == pytest.approx(want, rel=1e-12)


def test_ppo_clipped_loss_matches_a_hand_computed_example():
    old = t([0.0, 0.0, 0.0])
    logp = torch.log(t([1.5, 0.5, 1.1])).requires_grad_()
    adv, mask = t([1.0, 1.0, -2.0]), t([1, 1, 1])
    loss, stats = policy_loss(logp, old, adv, mask, clip_eps=0.2, num_tokens=3)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped, no gradient); token 1: max(-0.5, -0.8) = -0.5;
    # token 2: max(2.2, 2.2) = 2.2
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 2.2) / 3, abs=1e-6)
    assert stats["clipped_tokens"] == 1
    loss.backward()
    # d/dlogp of -A*r is -A*r, divided by the global token count
    torch.testing.assert_close(logp.grad, t([0.0, -0.5 / 3, 2.2 / 3]))


def test_value_loss_with_and_without_clipping():
    v, old, ret, mask = t([1.0, 0.0]), t([0.5, 0.0]), t([2.0, 1.0]), t([1, 1])
    assert value_loss(v, old, ret, mask, None, 2).item() == pytest.approx(0.5 * (1 + 1) / 2)
    # token 0: clipped value 0.7 is further from the return (1.3^2 > 1^2)
    assert value_loss(v, old, ret, mask, 0.2, 2).item() == pytest.approx(0.5 * (1.69 + 1) / 2)


def test_grpo_advantages_are_group_relative():
    adv = grpo_advantages(t(1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5), group_size=4)
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # unbiased std of (1, 0, 0, 1) is sqrt(1/3)
    torch.testing.assert_close(adv, t(z, -z, -z, z, 0, 0, 0, 0))
    with pytest.raises(RpegError, match="R >= 2"):
        grpo_advantages(t(1, 0), group_size=1)
    with pytest.raises(RpegError, match="whole groups"):
        grpo_advantages(t(1, 0, 1), group_size=2)


def test_whitening_from_summed_shard_moments_equals_whole_batch_whitening():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    mask = (torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    whole = whiten(x, mask, masked_moments(x, mask))
    sel = mask.bool()
    assert whole[sel].mean().abs() < 1e-5 and (whole[sel].var() - 1).abs() < 1e-4  # the unbiased variance
    moments = masked_moments(x[:2], mask[:2]) + masked_moments(x[2:], mask[2:])
    torch.testing.assert_close(whiten(x[:2], mask[:2], moments), whole[:2])


ARCH = Arch(layers=1, hidden=32, ffn=64, vocab=16, heads=4, kv_heads=4)
LP, LR = 3, 4


def experience(algorithm):
    opts = NetOptions(max_seq=LP + LR)
    actor = build_model(ARCH, "policy", 0, opts)
    prompts = expand_rollouts(torch.randint(0, 16, (4, LP), generator=torch.Generator().manual_seed(0)), 2)
    roll = generate(actor, prompts, range(8), seed=0, step=0, max_new_tokens=LR, eos_id=5)
    with torch.no_grad():
        ref = response_forward(build_model(ARCH, "reference", 1, opts), roll.sequences, LP).logprobs
        values = response_forward(build_model(ARCH, "critic", 2, opts), roll.sequences, LP).values
    scores = torch.rand(8, generator=torch.Generator().manual_seed(3))
    exp = Experience(roll.sequences, roll.mask, roll.logprobs, ref, scores,
                     values=values if algorithm == "ppo" else None)
    return compute_advantages(exp, default_rl_config(algorithm), group_size=2)


def grads(model, loss_fn, exp, shards, agg="token-mean"):
    model.zero_grad()
    n = float(exp.loss_count(agg))  # the GLOBAL normaliser (e.g. token count), whatever the shard
    size = exp.sequences.shape[0] // shards
    for i in range(shards):
        loss = loss_fn(model, exp.rows(slice(i * size, (i + 1) * size)), n)
        loss.backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("algorithm, kind, agg", [("ppo", "policy", "token-mean"), ("grpo", "policy", "token-mean"),
                                                  ("ppo", "actor_critic", "token-mean"), ("ppo", "critic", "token-mean"),
                                                  ("grpo", "policy", "seq-mean-token-mean"),
                                                  ("ppo", "actor_critic", "seq-mean-token-sum"),
                                                  ("grpo", "policy", "seq-mean-token-sum-norm")])
def test_sharded_losses_sum_to_the_whole_batch_gradient(algorithm, kind, agg):
    """Data-parallel replicas or microbatches summing their gradients reproduce the single-process update, under
    every loss aggregation."""
    exp = experience(algorithm)
    assert exp.mask.eq(0).any()  # variable-length responses: shards hold different token counts
    cfg = default_rl_config(algorithm, entropy_coef=0.01, loss_agg_mode=agg)
    model = build_model(ARCH, kind, 0, NetOptions(max_seq=LP + LR))
    if kind == "critic":
        def loss_fn(m, e, n):
            return critic_loss(m, e, cfg, n)
    else:
        def loss_fn(m, e, n):
            return actor_loss(m, e, cfg, n)[0]
    whole = grads(model, loss_fn, exp, 1, agg)
    for shards in (2, 4):
        for k, g in grads(model, loss_fn, exp, shards, agg).items():
            torch.testing.assert_close(g, whole[k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rows, replicas, count", [(16, 2, 2), (12, 3, 4), (10, 2, 3), (6, 3, 6)])
def test_minibatches_are_the_batchs_whatever_the_replicas_hold(rows, replicas, count):
    """Minibatch k is the rows g with g % count == k: the replicas' parts (contiguous shards) make exactly it."""
    bounds = [rows * r // replicas for r in range(replicas + 1)]
    for k in range(count):
        parts = [minibatch_rows(lo, hi, count, k) + lo for lo, hi in zip(bounds, bounds[1:])]
        assert torch.cat(parts).tolist() == list(range(k, rows, count))
        for p, lo, hi in zip(parts, bounds, bounds[1:]):  # each replica holds its even share
            assert (hi - lo) // count <= len(p) <= -(-(hi - lo) // count)


def test_minibatch_statistics_are_the_whole_batchs_and_each_minibatch_is_one_step():
    exp = experience("grpo")
    cfg = default_rl_config("grpo", ppo_epochs=3, ppo_minibatches=2)
    seen: list[tuple[int, float]] = []

    def step(sub, n):
        seen.append((len(sub), n))
        return {"loss": float(sub.mask.sum()) / n, "count": 1.0}, float(len(seen))

    stats, norm = minibatch_steps(cfg, exp, 0, len(exp), step, counts=("count",))
    sizes = [float(exp.mask[k::2].sum()) for k in range(2)]
    assert seen == [(len(exp) // 2, sizes[0]), (len(exp) // 2, sizes[1])] * 3  # 3 epochs x 2 optimizer steps
    assert stats == pytest.approx({"loss": 1.0, "count": 2.0}) and norm == 5.5  # the last epoch's
    assert epoch_stats([({"a": 2.0, "n": 1.0}, 0.25), ({"a": 4.0, "n": 3.0}, 0.75)], ("n",)) == {"a": 3.5, "n": 4.0}


def test_ppo_without_a_critic_and_grpo_with_kl_in_reward_are_user_errors():
    exp = experience("grpo")
    with pytest.raises(RpegError, match="critic values"):
        compute_advantages(exp, default_rl_config("ppo"), group_size=2)
    with pytest.raises(RpegError, match="kl_in_reward"):
        default_rl_config("grpo", kl_in_reward=True)
    with pytest.raises(RpegError, match="ppo, grpo, dpo"):
        default_rl_config("reinforce")
    with pytest.raises(RpegError, match="dpo_beta must be > 0"):
        default_rl_config("dpo", dpo_beta=0.0)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_the_pieced_head_log_probs_have_the_gradients_of_the_whole_computation(monkeypatch, with_entropy):
    """Training's LM head (rl.head_logprobs: two sequences per piece here, recomputed in the backward pass, the
    weight gradient added up in one buffer) against autograd through the whole head at once, in float32. The values
    are the same operations row by row (equal); the gradients differ only in how the pieces' weight gradients are
    summed: 3 pieces, each entry a sum of 2 x 7 products, within a few float32 roundings of the magnitudes summed
    (|g| |h| <= ~1 here): rel 1e-5, abs 1e-6."""
    from torch import nn

    from rpegc.runtime.backends.torch.rl import step as rl

    torch.manual_seed(0)
    b, t, d, vocab, temperature = 5, 7, 16, 50, 0.7
    monkeypatch.setattr(rl, "LOGPROB_PIECE", 2 * t * vocab)
    head = nn.Linear(d, vocab, bias=False)
    hidden = torch.randn(b, t, d, requires_grad=True)
    tokens = torch.randint(0, vocab, (b, t))
    weights = torch.randn(b, t), torch.randn(b, t)

    def loss(picked, entropy):
        return (picked * weights[0]).sum() + ((entropy * weights[1]).sum() if with_entropy else 0.0)

    picked, entropy = rl.head_logprobs(head, hidden, tokens, temperature, with_entropy)
    got = torch.autograd.grad(loss(picked, entropy), (hidden, head.weight))
    logp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    whole = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    whole_entropy = -(logp.exp() * logp).sum(-1)
    assert torch.equal(picked, whole) and (entropy is None) != with_entropy
    if with_entropy:
        torch.testing.assert_close(entropy, whole_entropy, rtol=1e-6, atol=1e-6)
    want = torch.autograd.grad(loss(whole, whole_entropy), (hidden, head.weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# --- GRPO's variants: each against its paper's formula, written out here -----------------------------------------


def test_rloo_and_dr_grpo_advantages_follow_their_formulas():
    from rpegc.runtime.backends.torch.rl.step import compute_advantages

    scores = t(1.0, 0.0, 0.25, 1.0, 0.5, 0.5, 0.5, 0.9)
    mask = torch.ones(8, 3)
    exp = Experience(torch.zeros(8, 5, dtype=torch.long), mask, mask, mask, scores)
    r = scores.tolist()

    def advantages(**cfg):
        return compute_advantages(exp, default_rl_config("grpo", **cfg), group_size=4).advantages[:, 0].tolist()

    # RLOO (Ahmadian et al. 2024, Eq. 5): r_i less the mean of the other R - 1 rewards of its prompt
    loo = [r[i] - (sum(r[g:g + 4]) - r[i]) / 3 for g in (0, 4) for i in range(g, g + 4)]
    assert advantages(adv_estimator="rloo") == pytest.approx(loo, abs=1e-6)
    # Dr. GRPO (Liu et al. 2025, Eq. 3): r_i less the group mean, no std
    centred = [r[i] - sum(r[g:g + 4]) / 4 for g in (0, 4) for i in range(g, g + 4)]
    assert advantages(norm_adv_by_std=False) == pytest.approx(centred, abs=1e-6)


def _whitened(x, mask):
    vals = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)  # the sample variance, as verl's masked_whiten
    return [[(v - mean) / math.sqrt(var + 1e-8) * m for v, m in zip(row, mrow)] for row, mrow in zip(x, mask)]


def test_reinforce_plus_plus_advantages_follow_their_formulas():
    """REINFORCE++ (Hu 2025, Eq. 6-7): discounted returns of the per-token rewards (the score on the last token and
    the KL penalty -beta k1 on every token), normalised over the whole batch; with a group baseline (Sec. 3.2) the
    score less its group's mean on every token, normalised over the batch."""
    from rpegc.runtime.backends.torch.rl.step import compute_advantages

    mask = t([1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1])
    logp, ref = t([-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0], [-0.2, 0.0, 0.0], [-0.3, -0.4, -0.6]), torch.full((4, 3), -1.0)
    scores = t(1.0, 0.0, 0.5, 0.25)
    exp = Experience(torch.zeros(4, 5, dtype=torch.long), mask, logp, ref, scores)
    cfg = default_rl_config("grpo", adv_estimator="reinforce_plus_plus", kl_in_reward=True, kl_estimator="k1",
                            kl_coef=0.1, gamma=0.9)
    got = compute_advantages(exp, cfg, group_size=2).advantages.tolist()
    returns = []
    for i, (lrow, mrow) in enumerate(zip(logp.tolist(), mask.tolist())):
        n = int(sum(mrow))
        rewards = [-0.1 * (lrow[k] + 1.0) + (scores[i].item() if k == n - 1 else 0.0) for k in range(n)]
        ret = [sum(0.9 ** (j - k) * rewards[j] for j in range(k, n)) for k in range(n)]
        returns.append(ret + [0.0] * (3 - n))
    want = _whitened(returns, mask.tolist())
    assert got == [pytest.approx(row, abs=1e-5) for row in want]
    base = default_rl_config("grpo", adv_estimator="reinforce_plus_plus_baseline")
    got = compute_advantages(exp, base, group_size=2).advantages.tolist()
    s = scores.tolist()
    centred = [[(s[i] - (s[i - i % 2] + s[i - i % 2 + 1]) / 2) * m for m in mrow] for i, mrow in enumerate(mask.tolist())]
    assert got == [pytest.approx(row, abs=1e-5) for row in _whitened(centred, mask.tolist())]


def test_clip_higher_clips_the_ratio_above_at_its_own_bound():
    """DAPO (Yu et al. 2025, Eq. 10): clip(r, 1 - eps_low, 1 + eps_high)."""
    old, logp = t([0.0, 0.0]), torch.log(t([1.5, 0.5]))
    adv, mask = t([1.0, -1.0]), t([1, 1])
    loss, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, num_tokens=2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2, abs=1e-6)  # 1.5 clipped at 1.28; 0.5 at 1 - 0.2


def test_gspo_is_the_sequence_level_clipped_objective():
    """GSPO (Zheng et al. 2025, Eq. 5-7): per sequence s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|), the loss the mean over
    sequences of max(-A_i s_i, -A_i clip(s_i, 1 - eps, 1 + eps)); with seq-mean-token-mean the token form gives that
    value and gradient."""
    from rpegc.runtime.backends.torch.rl.step import POLICY_LOSSES, sequence_ratio

    mask = t([1, 1, 1], [1, 1, 0], [1, 0, 0])
    old = t([-1.0, -1.2, -0.7], [-0.5, -0.9, 0.0], [-2.0, 0.0, 0.0])
    logp = (old + t([0.3, -0.1, 0.2], [-0.4, 0.05, 0.0], [0.1, 0.0, 0.0])).requires_grad_()
    adv = t(1.0, -0.5, 2.0).unsqueeze(-1) * mask
    cfg = default_rl_config("grpo", policy_loss="gspo", loss_agg_mode="seq-mean-token-mean")
    loss, _ = POLICY_LOSSES["gspo"](logp, old, adv, mask, cfg, 3.0)
    loss.backward()
    ours = logp.grad.clone()
    logp2 = logp.detach().clone().requires_grad_()
    n = mask.sum(-1)
    s = torch.exp(((logp2 - old) * mask).sum(-1) / n)
    a = adv[:, 0]
    want = torch.maximum(-a * s, -a * s.clamp(0.8, 1.2)).mean()
    want.backward()
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    torch.testing.assert_close(ours, logp2.grad * mask, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sequence_ratio(logp.detach(), old, mask)[:, 0], s.detach())


def test_variants_are_registered_and_checked():
    from rpegc.runtime.backends.torch.rl.step import ADV_ESTIMATORS, POLICY_LOSSES

    assert set(ADV_ESTIMATORS) == {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}
    assert set(POLICY_LOSSES) == {"ppo", "gspo"}
    with pytest.raises(RpegError, match="unknown adv_estimator 'ppo'; use one of gae, grpo, rloo"):
        default_rl_config("grpo", adv_estimator="ppo")
    with pytest.raises(RpegError, match="adv_estimator 'gae' needs critic; under GRPO use one of grpo, rloo"):
        default_rl_config("grpo", adv_estimator="gae")
    with pytest.raises(RpegError, match="adv_estimator 'rloo' has no critic; under PPO use one of gae"):
        default_rl_config("ppo", adv_estimator="rloo")
    with pytest.raises(RpegError, match="adv_estimator 'grpo' has no per-token reward to put the KL penalty into"):
        default_rl_config("grpo", kl_in_reward=True)
    with pytest.raises(RpegError, match="unknown policy_loss 'gpo'"):
        default_rl_config("grpo", policy_loss="gpo")


def test_dapo_overlong_shaping_punishes_the_last_tokens_of_the_budget():
    """DAPO (Yu et al. 2025, Eq. 13): R_length(y) = 0 if |y| <= L_max - L_cache, (L_max - L_cache - |y|) / L_cache up
    to L_max; here L_max = Lr = 6, L_cache = 4, the penalty factor 0.5; then GRPO's advantages of the shaped scores."""
    from rpegc.runtime.backends.torch.rl.step import compute_advantages, overlong_shaping

    lengths = [1, 2, 3, 4, 5, 6]
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths])
    want = [0.5 * min(0.0, (6 - 4 - n) / 4) for n in lengths]
    assert overlong_shaping(mask, 4, 0.5).tolist() == pytest.approx(want)
    exp = Experience(torch.zeros(6, 8, dtype=torch.long), mask, mask, mask, torch.zeros(6))
    cfg = default_rl_config("grpo", overlong_buffer=4, overlong_penalty=0.5, norm_adv_by_std=False)
    got = compute_advantages(exp, cfg, group_size=3).advantages[:, 0].tolist()
    centred = [want[i] - sum(want[i - i % 3:i - i % 3 + 3]) / 3 for i in range(6)]
    assert got == pytest.approx(centred, abs=1e-6)
    with pytest.raises(RpegError, match="overlong_buffer must be >= 0, got -1"):
        default_rl_config("grpo", overlong_buffer=-1)


PLUGIN = '''
from rpegc.runtime.backends.torch.rl.algorithms import GRPO, register_algorithm
from rpegc.runtime.backends.torch.rl.step import register_adv_est, register_policy_loss, policy_loss
from dataclasses import replace


@register_adv_est("plugin_sign")
def sign(exp, cfg, group_size, reduce):
    return replace(exp, advantages=exp.scores.sign().unsqueeze(-1) * exp.mask, returns=None)


@register_policy_loss("plugin_unclipped")
def unclipped(logp, old_logp, advantages, mask, cfg, n):
    return policy_loss(logp, old_logp, advantages, mask, 1e9, n, cfg.loss_agg_mode)


register_algorithm(GRPO("sign_grpo", dict(adv_estimator="plugin_sign", policy_loss="plugin_unclipped"), "a test"))
'''


def test_a_plugin_registers_an_estimator_a_loss_and_an_algorithm_through_an_entry_point(tmp_path, monkeypatch):
    """An installed package's entry point of the group rpegc.rl is imported when a name is missing (in every process
    that looks one up, the compiler's included); the estimator and loss it registers are selected by --rl like the
    built-in ones, the algorithm it registers by the graph (`rpeg.algorithm`), checked against its family's shape."""
    from rpegc.core.check.wellformed import check_program
    from rpegc.core.ir import algorithms as families
    from rpegc.runtime.backends.torch.rl import algorithms as algs
    from rpegc.runtime.backends.torch.rl import step as rl_module
    from rpegc.runtime.backends.torch.controller.run_description import run_config
    from rpegc.syntax.parser import parse
    from rpegc.core.ir.algorithms import PLUGIN_GROUP
    from rpegc.runtime.backends.torch.rl.step import ADV_ESTIMATORS, POLICY_LOSSES, compute_advantages
    from fixtures.plugins import install_plugin

    install_plugin(tmp_path, "my_rl", PLUGIN, PLUGIN_GROUP, {"mine": "my_rl"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rl_module, "ADV_ESTIMATORS", dict(ADV_ESTIMATORS))  # what the plugin adds goes with the test
    monkeypatch.setattr(rl_module, "POLICY_LOSSES", dict(POLICY_LOSSES))
    monkeypatch.setattr(algs, "ALGORITHMS", dict(algs.ALGORITHMS))
    monkeypatch.setattr(families, "_FAMILY_OF", dict(families._FAMILY_OF))
    import sys
    monkeypatch.delitem(sys.modules, "my_rl", raising=False)
    cfg = default_rl_config("grpo", adv_estimator="plugin_sign", policy_loss="plugin_unclipped")
    mask = torch.ones(2, 3)
    exp = Experience(torch.zeros(2, 5, dtype=torch.long), mask, mask, mask, t(0.5, -2.0))
    assert compute_advantages(exp, cfg, group_size=2).advantages[:, 0].tolist() == [1.0, -1.0]
    assert "plugin_unclipped" in rl_module.POLICY_LOSSES
    text = open("examples/grpo-tiny.rpeg").read().replace("rpeg.algorithm grpo", "rpeg.algorithm sign_grpo")
    program = parse(text, "plugin.rpeg")
    assert check_program(program) == []
    cfg = run_config(program)
    assert (cfg.algorithm, cfg.rl.algorithm, cfg.rl.adv_estimator, cfg.rl.policy_loss) == (
        "sign_grpo", "grpo", "plugin_sign", "plugin_unclipped")
    ppo = open("examples/ppo-tiny.rpeg").read().replace("rpeg.algorithm ppo", "rpeg.algorithm sign_grpo")
    assert any("names algorithm sign_grpo, but GRPO samples rollouts and has no critic" in e.message
               for e in check_program(parse(ppo, "p.rpeg")))
    with pytest.raises(RpegError, match="unknown algorithm 'sign_grp'"):
        parse(text.replace("sign_grpo", "sign_grp"), "typo.rpeg")
    (tmp_path / "my_rl.py").write_text("raise ImportError('broken plugin')\n")
    monkeypatch.delitem(sys.modules, "my_rl", raising=False)
    with pytest.raises(RpegError, match="the RL plugin mine .my_rl. failed to load: ImportError: broken plugin"):
        default_rl_config("grpo", adv_estimator="still_missing")


@pytest.mark.parametrize("variant", ["dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_a_graph_names_a_grpo_variant_and_runs_grpo_with_its_settings(variant):
    """rpeg.algorithm VARIANT: a GRPO-shaped graph, GRPO's run with the variant's settings, which --rl overrides;
    `--rl algorithm=VARIANT` chooses it for a graph that names GRPO (an algorithm of another family is an error)."""
    from rpegc.core.check.wellformed import check_program
    from rpegc.runtime.backends.torch.controller.run_description import run_config
    from rpegc.runtime.backends.torch.rl.algorithms import algorithm
    from rpegc.syntax.parser import parse

    text = open("examples/grpo-tiny.rpeg").read().replace("rpeg.algorithm grpo", f"rpeg.algorithm {variant}")
    program = parse(text, "v.rpeg")
    assert check_program(program) == []
    cfg = run_config(program, rl={"kl_coef": 0.005})
    assert (cfg.algorithm, cfg.alg.family, cfg.rl.algorithm, cfg.rl.kl_coef) == (variant, "grpo", "grpo", 0.005)
    for key, value in algorithm(variant).settings.items():
        if key != "kl_coef":
            assert getattr(cfg.rl, key) == value, key
    chosen = run_config(parse(text.replace(f"rpeg.algorithm {variant}", "rpeg.algorithm grpo"), "g.rpeg"),
                        rl={"algorithm": variant})  # --rl algorithm=VARIANT on a GRPO graph
    assert (chosen.algorithm, chosen.rl) == (variant, run_config(program).rl)
    with pytest.raises(RpegError, match=f"--rl algorithm=ppo: ppo is of the PPO family, but the graph has GRPO's "
                                        f"shape .rpeg.algorithm {variant}.; choose one of grpo, dr_grpo"):
        run_config(program, rl={"algorithm": "ppo"})
    ppo = open("examples/ppo-tiny.rpeg").read().replace("rpeg.algorithm ppo", f"rpeg.algorithm {variant}")
    errors = check_program(parse(ppo, "p.rpeg"))
    assert any(f"names algorithm {variant}, but GRPO samples rollouts and has no critic" in e.message for e in errors)
