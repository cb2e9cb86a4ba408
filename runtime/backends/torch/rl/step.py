"""RL math of one PPO / GRPO step: log-probs, KL, rewards, GAE, group advantages, losses, minibatch steps.

Paper Sec. II (PPO and GRPO stages) and App. B (hyper-parameters: one PPO epoch, actor/critic learning
rate 1e-6, zero weight decay, gradient clipping at 1.0, PPO clip 0.2, gamma = 1, GAE lambda = 0.95,
KL coefficient 0.01). Losses are aggregated over the GLOBAL batch (`loss_agg_mode`, verl's names): each takes
`num_tokens`, the normaliser of the whole batch (`loss_normaliser`, summed over replicas), and returns
sum(local terms x token weights) / normaliser. A shard's gradient is then exactly its share of the full-batch
gradient, so summing gradients over data-parallel replicas and microbatches (an all-reduce SUM, or a mean times
the replica count) reproduces the single-process update. The modes:
  token-mean               sum_it l_it m_it / sum_it m_it                  (every token alike; DAPO's choice)
  seq-mean-token-sum       sum_it l_it m_it / N                            (a sequence's tokens summed)
  seq-mean-token-mean      sum_i (sum_t l_it m_it / sum_t m_it) / N        (GRPO's 1/|o_i| per sequence)
  seq-mean-token-sum-norm  sum_it l_it m_it / (N Lr)                       (Dr. GRPO: a constant length, Lr; verl
                                                                           divides per micro-batch by Lr alone)
with N sequences and m the response mask (Liu et al. 2025, "Understanding R1-Zero-Like Training", Sec. 3.1, for
why the per-sequence 1/|o_i| biases the update toward long wrong answers).

Conventions: response token t of a sequence with prompt length Lp sits at position Lp + t and is
predicted from position Lp + t - 1; the value V(s_t) of the state before token t is read at that same
position. Masks are float tensors, 1 for real response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection, Optional, Protocol, Sequence

import torch
from torch import Tensor, nn

from rpegc.core.cost.memory import LOGPROB_PIECE  # the cost model counts two such pieces
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.options import option
from rpegc.core.ir.algorithms import FAMILIES, PLUGIN_GROUP, registered
from rpegc.runtime.backends.torch.model.generation import Sampling
from rpegc.runtime.backends.torch.model.transformer import TransformerModel
from rpegc.runtime.backends.torch.rl.bounds import BOUNDS, range_error

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# A sum over data-parallel replicas (all-reduce SUM); the identity in a single process.
Reduce = Callable[[Tensor], Tensor]


def _identity(t: Tensor) -> Tensor:
    return t


@dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of one RL step. Defaults are the paper's App. B values where it gives them.

    Not in App. B (conventions of PPO for LLMs, as in verl/InstructGPT): the KL penalty enters the
    per-token reward with the k1 estimator log(pi_old/pi_ref) for PPO; GRPO instead adds a KL loss with
    the k3 estimator (DeepSeekMath). Value clipping 0.2 (PPO2's convention for the value function),
    advantage whitening for PPO, Adam betas/eps are torch defaults. `value_coef` weights the value loss
    of a shared actor-critic only. The tiny toy task needs a far larger learning rate than 1e-6
    (see `run_config.toy_rl_config`).
    """

    algorithm: str = option("ppo", "the algorithm's family (ppo, grpo, dpo); the graph's `rpeg.algorithm` sets it, "
                                   "and `algorithm = NAME` picks another registered algorithm of that family")
    lr_actor: float = option(1e-6, "the actor's (policy's) Adam learning rate")
    lr_critic: float = option(1e-6, "the critic's Adam learning rate")
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay")
    grad_clip: float = option(1.0, "the gradients' global norm is clipped to this")
    clip_eps: float = option(0.2, "PPO's ratio clip: ratios outside [1 - clip_eps, 1 + clip_eps] get no gradient")
    gamma: float = option(1.0, "the discount of GAE")
    lam: float = option(0.95, "GAE's lambda")
    kl_coef: float = option(0.01, "the weight of the KL to the reference (in the reward, or as a loss term)")
    kl_estimator: str = option("k1", "Schulman's KL estimator: k1, k2 or k3")
    kl_in_reward: bool = option(True, "the KL penalises the per-token reward (PPO) instead of being a loss term")
    value_clip: Optional[float] = option(0.2, "the value loss's clip around the old values (none: unclipped)")
    value_coef: float = option(0.5, "the value loss's weight in a shared actor-critic's loss")
    entropy_coef: float = option(0.0, "the weight of the entropy bonus")
    whiten_advantages: bool = option(True, "advantages are whitened over the batch (PPO)")
    ppo_epochs: int = option(1, "passes of each training operator over its batch")
    ppo_minibatches: int = option(1, "optimizer steps per epoch, each on the rows g with g % ppo_minibatches == k")
    temperature: float = option(1.0, "the sampling temperature; log-probs are the tempered ones")
    top_p: float = option(1.0, "nucleus sampling at generation (1: off)")
    top_k: int = option(0, "top-k sampling at generation (0: off)")
    adam_betas: tuple[float, float] = option((0.9, 0.999), "Adam's two betas")
    adam_eps: float = option(1e-8, "Adam's epsilon")
    grpo_eps: float = option(1e-6, "added to a group's reward std before GRPO divides by it")
    loss_agg_mode: str = option("token-mean", "how a loss's per-token terms become one number (the module docstring): "
                                              + ", ".join(LOSS_AGG_MODES))
    adv_estimator: str = option("gae", "the advantage estimator: gae (PPO), grpo, rloo, reinforce_plus_plus(_baseline)"
                                       " or a plugin's")
    norm_adv_by_std: bool = option(True, "grpo: divide by the group's std (false: Dr. GRPO, Liu et al. 2025)")
    policy_loss: str = option("ppo", "ppo (token ratios), gspo (sequence ratios, Zheng et al. 2025) or a plugin's")
    clip_eps_high: Optional[float] = option(None, "the ratio's upper clip 1 + clip_eps_high (DAPO's clip-higher; "
                                                  "none: clip_eps)")
    overlong_buffer: int = option(0, "DAPO's soft overlong punishment over the last this many of Lr tokens (0: off)")
    overlong_penalty: float = option(1.0, "the overlong punishment's penalty at Lr tokens")
    dpo_beta: float = option(0.1, "DPO's inverse temperature of the implicit reward (Rafailov et al. 2023)")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)


def check_rl_config(cfg: RLConfig) -> None:
    """The errors of settings any algorithm has (each algorithm adds its own: `Algorithm.check_rl`)."""
    if cfg.algorithm not in FAMILIES:
        raise RpegError(None, f"unknown RL algorithm family '{cfg.algorithm}'; use one of {', '.join(FAMILIES)}")
    if cfg.kl_estimator not in KL_ESTIMATORS:
        raise RpegError(None, f"unknown KL estimator '{cfg.kl_estimator}'; use one of {', '.join(KL_ESTIMATORS)}")
    if cfg.loss_agg_mode not in LOSS_AGG_MODES:
        raise RpegError(None, f"unknown loss_agg_mode '{cfg.loss_agg_mode}'; use one of {', '.join(LOSS_AGG_MODES)}")
    for name, table, what in ((cfg.adv_estimator, ADV_ESTIMATORS, "adv_estimator"),
                              (cfg.policy_loss, POLICY_LOSSES, "policy_loss")):
        if not registered(table, name):
            raise RpegError(None, f"unknown {what} '{name}'; use one of {', '.join(table)} (or an estimator or loss a "
                                  f"plugin of the entry-point group {PLUGIN_GROUP} registers)")
    cfg.sampling.check()
    for name in BOUNDS:
        error = range_error(name, getattr(cfg, name))
        if error is not None:
            raise RpegError(None, error)
    error = range_error("adam_betas", cfg.adam_betas)
    if error is not None:
        raise RpegError(None, error)


# ---------------------------------------------------------------------------------------------------
# Forward passes over given sequences (teacher forcing)


@dataclass
class ResponseForward:
    """Per response token: log-probs of the given tokens, values V(s_t), entropies (None if absent)."""

    logprobs: Optional[Tensor]
    values: Optional[Tensor]
    entropy: Optional[Tensor]


# Float32 elements of vocabulary-wide log-softmax one piece of a no-grad log-prob computation holds (4 MiB):
# beyond the logits (in the module's dtype), that is all inference holds of the vocabulary, not three
# float32 copies of the whole microbatch's.


def _logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(token) in float32 for logits [b, ..., V] (any float dtype) and tokens [b, ...] at the sampling
    temperature. Logits that autograd does not track, a few sequences at a time (each row's arithmetic is the
    same, so the values are those of one piece); tracked ones whole, since the backward pass keeps the
    log-softmax anyway."""
    per_row = max(1, logits[:1].numel())
    rows = max(1, LOGPROB_PIECE // per_row)
    if (logits.requires_grad and torch.is_grad_enabled()) or logits.shape[0] <= rows:
        return _logprobs(logits, tokens, temperature)
    return torch.cat([_logprobs(logits[i:i + rows], tokens[i:i + rows], temperature)
                      for i in range(0, logits.shape[0], rows)])


def _head_piece(weight: Tensor, temperature: float, hidden: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(logits in the module's dtype, float32 log-softmax at the temperature, the tokens' log-probs) of a piece."""
    logits = hidden @ weight.t()
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logits, logp, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class _HeadLogprobs(torch.autograd.Function):
    """log pi(token) and the entropy of an LM head (`weight` [V, d], no bias) over `hidden` [b, t, d], a piece of
    `rows` sequences at a time in both passes: the forward keeps only its inputs, the backward recomputes each
    piece's logits and adds its weight gradient into one [V, d] buffer. So no vocabulary-wide tensor larger than a
    piece exists, and the head's weight gradient is one tensor (autograd's graph of checkpointed pieces made one per
    piece and summed them: three [V, d] tensors at once). The gradients are autograd's of `_head_piece`: through
    the gather and log-softmax g_pick (onehot - p), through the entropy H = -sum p log p: -g_H p (log p + H), both
    divided by the temperature and cast to the logits' dtype, then the two products of the linear layer."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float, rows: int,
                with_entropy: bool):
        picked, entropy = [], []
        for i in range(0, hidden.shape[0], rows):
            _, logp, p = _head_piece(weight, temperature, hidden[i:i + rows], tokens[i:i + rows])
            picked.append(p)
            if with_entropy:
                entropy.append(-(logp.exp() * logp).sum(-1))
        ctx.save_for_backward(hidden, weight, tokens)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.set_materialize_grads(False)  # an unused entropy gets no gradient to apply
        out = torch.cat(picked)
        return (out, torch.cat(entropy)) if with_entropy else (out, out.new_zeros(out.shape))

    @staticmethod
    def backward(ctx, g_pick: Optional[Tensor], g_entropy: Optional[Tensor]):
        hidden, weight, tokens = ctx.saved_tensors
        if g_pick is None:
            g_pick = torch.zeros(tokens.shape, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for i in range(0, hidden.shape[0], ctx.rows):
            h, tok = hidden[i:i + ctx.rows], tokens[i:i + ctx.rows]
            with torch.no_grad():
                logits, logp, _ = _head_piece(weight, ctx.temperature, h, tok)
                p = logp.exp()
                g = -p * g_pick[i:i + ctx.rows].unsqueeze(-1)
                g.scatter_add_(-1, tok.unsqueeze(-1), g_pick[i:i + ctx.rows].unsqueeze(-1))
                if g_entropy is not None:
                    entropy = -(p * logp).sum(-1, keepdim=True)
                    g -= g_entropy[i:i + ctx.rows].unsqueeze(-1) * p * (logp + entropy)
                g_logits = (g / ctx.temperature).to(logits.dtype)
                del logits, logp, p, g
                if grad_hidden is not None:
                    grad_hidden[i:i + ctx.rows] = g_logits @ weight
                if grad_weight is not None:
                    grad_weight.add_(g_logits.flatten(0, -2).t() @ h.flatten(0, -2))
        return grad_hidden, grad_weight, None, None, None, None


def head_logprobs(lm_head: nn.Module, hidden: Tensor, tokens: Tensor, temperature: float = 1.0,
                  with_entropy: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """Training's log pi(token) (and entropies) in float32 from the final norm's output `hidden` [b, t, d] and
    tokens [b, t]: the LM head and the log-softmax a few sequences at a time (LOGPROB_PIECE float32 elements) in
    the forward and again in the backward pass (`_HeadLogprobs`), so autograd keeps only `hidden` and no
    vocabulary-wide tensor larger than a piece exists at any time; the price is the head's forward once more in the
    backward pass, as for the blocks."""
    rows = max(1, LOGPROB_PIECE // max(1, hidden.shape[1] * lm_head.out_features))
    picked, entropy = _HeadLogprobs.apply(hidden, lm_head.weight, tokens, temperature, rows, with_entropy)
    return picked, entropy if with_entropy else None


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def response_forward(model: TransformerModel, sequences: Tensor, prompt_len: int, temperature: float = 1.0,
                     with_entropy: bool = False, pads: Optional[Tensor] = None) -> ResponseForward:
    """One teacher-forced pass over `sequences` [b, Lp+Lr] (prompts left-padded by `pads`), read at the Lr
    positions that predict responses."""
    out = model(sequences[:, :-1], pads=pads)
    logprobs = entropy = values = None
    if out.hidden is not None and out.lm_head is not None:  # training: the head a piece at a time
        logprobs, entropy = head_logprobs(out.lm_head, out.hidden[:, prompt_len - 1:], sequences[:, prompt_len:],
                                          temperature, with_entropy)
    elif out.logits is not None:
        logits = out.logits[:, prompt_len - 1:]
        logprobs = token_logprobs(logits, sequences[:, prompt_len:], temperature)
        if with_entropy:
            entropy = entropy_from_logits(logits, temperature)
    if out.values is not None:
        values = out.values[:, prompt_len - 1:]
    return ResponseForward(logprobs=logprobs, values=values, entropy=entropy)


def last_token_scores(model: TransformerModel, sequences: Tensor, prompt_len: int, mask: Tensor,
                      pads: Optional[Tensor] = None) -> Tensor:
    """A reward model's scalar at the last real token of each sequence [b]."""
    if not model.has_value_head:
        raise RpegError(None, f"a reward model needs a scalar head, got kind '{model.kind}'")
    values = model(sequences, pads=pads).values
    last = prompt_len + mask.sum(-1).long() - 1
    return values.gather(-1, last.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------
# Rewards and advantages


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from samples of pi (Schulman, "Approximating KL Divergence", 2020):
    k1 = log(pi/pi_ref) (unbiased, can be negative); k2 = (log(pi/pi_ref))^2 / 2 (biased, low variance, >= 0);
    k3 = pi_ref/pi - log(pi_ref/pi) - 1 (unbiased, always >= 0)."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        d = ref_logp - logp
        return torch.exp(d) - d - 1
    raise RpegError(None, f"unknown KL estimator '{estimator}'; use one of {', '.join(KL_ESTIMATORS)}")


def token_rewards(scores: Tensor, kl: Optional[Tensor], mask: Tensor, kl_coef: float) -> Tensor:
    """Per-token rewards [b, Lr]: -kl_coef * kl on every token, plus the sequence score on its last token."""
    rewards = torch.zeros_like(mask) if kl is None else -kl_coef * kl * mask
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    return rewards.scatter_add(-1, last.unsqueeze(-1), scores.to(rewards.dtype).unsqueeze(-1))


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens; returns (advantages, returns), masked.

    delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1}; past the last real
    token V and A are 0 (the episode has ended).
    """
    lr = rewards.shape[-1]
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(lr)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = (delta + gamma * lam * next_adv) * m
        adv[:, t] = a
        next_adv = a
        next_value = values[:, t] * m
    return adv, (adv + values) * mask


def masked_moments(x: Tensor, mask: Tensor) -> Tensor:
    """(sum, sum of squares, count) in float64, summable across shards before `whiten`."""
    xd, md = x.double(), mask.double()
    return torch.stack([(xd * md).sum(), (xd * xd * md).sum(), md.sum()])


def whiten(x: Tensor, mask: Tensor, moments: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) with the batch statistics `moments` (from `masked_moments`); var is the unbiased
    sample variance over the masked tokens, as verl's `masked_whiten` (tests/test_torch_rl_verl.py)."""
    total, total_sq, count = moments.unbind()
    mean = total / count
    var = (total_sq / count - mean * mean).clamp(min=0) * count / (count - 1).clamp(min=1)
    return ((x.double() - mean) * torch.rsqrt(var + eps)).to(x.dtype) * mask


def _groups(scores: Tensor, group_size: int, what: str) -> Tensor:
    """The scores as [groups, R] (sequences g*R..g*R+R-1 form group g); whole groups of R >= 2 are needed."""
    if group_size < 2:
        raise RpegError(None, f"{what} compares the rollouts of one prompt and needs R >= 2, got R = {group_size}; "
                        "raise R in the workload")
    if scores.shape[0] % group_size:
        raise RpegError(None, f"{scores.shape[0]} scores do not form whole groups of R = {group_size}; "
                        f"shard {what} batches along prompts, not rollouts")
    return scores.double().view(-1, group_size)


def grpo_advantages(scores: Tensor, group_size: int, eps: float = 1e-6, by_std: bool = True) -> Tensor:
    """(r - mean_group) / (std_group + eps) per sequence; sequences g*R..g*R+R-1 form group g (`by_std` False:
    r - mean_group, Dr. GRPO).

    std is the unbiased sample standard deviation (as DeepSeekMath/verl). Needs whole groups.
    """
    groups = _groups(scores, group_size, "GRPO")
    centred = groups - groups.mean(-1, keepdim=True)
    adv = centred / (groups.std(-1, keepdim=True) + eps) if by_std else centred
    return adv.view(-1).to(torch.float32)


# ---------------------------------------------------------------------------------------------------
# Losses (sum over local tokens x weights / the global normaliser)


def token_weights(mask: Tensor, mode: str) -> Tensor:
    """Each response token's weight in a loss aggregated by `mode`: its mask, divided by its sequence's token count
    for seq-mean-token-mean."""
    if mode == "seq-mean-token-mean":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1)
    return mask


def loss_normaliser(mask: Tensor, mode: str) -> Tensor:
    """What a loss aggregated by `mode` is divided by, for the sequences of `mask` (a 0-d tensor; summed over the
    shards of a batch it is the batch's): its tokens (token-mean), its sequences, or sequences x Lr."""
    if mode == "token-mean":
        return mask.sum()
    rows = torch.tensor(float(mask.shape[0]), dtype=mask.dtype, device=mask.device)
    return rows * mask.shape[1] if mode == "seq-mean-token-sum-norm" else rows


def aggregate(terms: Tensor, mask: Tensor, normaliser: float, mode: str = "token-mean") -> Tensor:
    """sum of per-token `terms` weighted by `token_weights` / the batch's `normaliser` (module docstring)."""
    return (terms * token_weights(mask, mode)).sum() / normaliser


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float,
                num_tokens: float, agg: str = "token-mean", clip_eps_high: Optional[float] = None,
                ratio: Optional[Tensor] = None) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate: the aggregate (`agg`) over tokens of max(-A r, -A clip(r, 1 - eps, 1 + eps_high)),
    r = pi/pi_old per token (or the `ratio` given, GSPO's); eps_high = eps unless given (DAPO's clip-higher,
    Yu et al. 2025, Sec. 3.1)."""
    ratio = torch.exp(logp - old_logp) if ratio is None else ratio
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_eps, 1 + high)
    loss = aggregate(torch.maximum(unclipped, clipped), mask, num_tokens, agg)
    clip_count = ((clipped > unclipped).float() * mask).sum().item()
    return loss, {"clipped_tokens": clip_count}


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's importance ratio (Zheng et al. 2025, Eq. 7), one per sequence and on each of its tokens:
    s_i = exp(mean_t log(pi/pi_old)), its gradient that of the tokens' own log-probabilities (the token form,
    s_i sg[pi_t] / pi_t, equal in value), the log-ratio clamped at 10 as verl's `gspo` loss does."""
    log_seq = ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.exp((logp - logp.detach() + log_seq.detach()).clamp(max=10.0))


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, "RLConfig", float], tuple[Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register `fn(logp, old_logp, advantages, mask, cfg, normaliser) -> (loss, stats)` as `--rl policy_loss=NAME`
    (verl's register_policy_loss)."""
    def register(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES[name] = fn
        return fn
    return register


@register_policy_loss("ppo")
def ppo_policy_loss(logp, old_logp, advantages, mask, cfg, num_tokens):
    return policy_loss(logp, old_logp, advantages, mask, cfg.clip_eps, num_tokens, cfg.loss_agg_mode, cfg.clip_eps_high)


@register_policy_loss("gspo")
def gspo_policy_loss(logp, old_logp, advantages, mask, cfg, num_tokens):
    """GSPO: the clipped surrogate on sequence-level ratios (GSPO's objective averages each sequence's tokens:
    loss_agg_mode = seq-mean-token-mean, as verl's gspo loss fixes it)."""
    return policy_loss(logp, old_logp, advantages, mask, cfg.clip_eps, num_tokens, cfg.loss_agg_mode,
                       cfg.clip_eps_high, ratio=sequence_ratio(logp, old_logp, mask))


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: Optional[float],
               num_tokens: float, agg: str = "token-mean") -> Tensor:
    """0.5 (V - R)^2, or with clipping 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)."""
    err = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return 0.5 * aggregate(err, mask, num_tokens, agg)


def kl_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str, num_tokens: float,
            agg: str = "token-mean") -> Tensor:
    return aggregate(kl_estimate(logp, ref_logp, estimator), mask, num_tokens, agg)


def has_kl_loss(cfg: RLConfig, has_reference: bool) -> bool:
    """Whether the actor's loss has a KL term: the KL is not in the reward, and a reference wrote its log-probs (a run
    without one has no KL at all; `RolloutAlgorithm.check` refuses settings that ask for it)."""
    return has_reference and not cfg.kl_in_reward


def entropy_bonus(entropy: Tensor, mask: Tensor, num_tokens: float, agg: str = "token-mean") -> Tensor:
    return aggregate(entropy, mask, num_tokens, agg)


# ---------------------------------------------------------------------------------------------------
# Experience: what the inference vertices produce and the training vertices consume


@dataclass
class Experience:
    """One batch (or shard) of rollouts with everything training needs. Rows are global sequences in order.

    values are the critic's V(s_t) at inference (PPO only); ref_logprobs the reference model's log-probs (None: the
    graph has no reference inference vertex, so there is no KL term, as TRL with beta = 0); advantages/returns are
    filled by `compute_advantages` (returns only with a critic). `pads` [b] is each prompt's left padding (None: none;
    it comes from the prompts, so it is not a data field the containers carry).
    """

    sequences: Tensor
    mask: Tensor
    old_logprobs: Tensor
    ref_logprobs: Optional[Tensor]
    scores: Tensor
    values: Optional[Tensor] = None
    advantages: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    pads: Optional[Tensor] = None
    forward_rows = 1  # a loss's forward pass runs one row per sequence (schedules.train_step)

    @property
    def prompt_len(self) -> int:
        return self.sequences.shape[1] - self.mask.shape[1]

    @property
    def num_tokens(self) -> float:
        return float(self.mask.sum().item())

    def loss_count(self, agg: str = "token-mean") -> Tensor:
        """What the losses aggregated by `agg` are divided by, for these rows (`loss_normaliser`)."""
        return loss_normaliser(self.mask, agg)

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def rows(self, index: slice | Tensor) -> "Experience":
        """The shard of sequences `index` (a slice or index tensor)."""
        def pick(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t[index]
        return Experience(*(pick(getattr(self, f)) for f in
                            ("sequences", "mask", "old_logprobs", "ref_logprobs", "scores", "values",
                             "advantages", "returns", "pads")))


@dataclass(frozen=True)
class AdvEstimator:
    """An advantage estimator: `fn(exp, cfg, group_size, reduce) -> Experience` with advantages (and returns with a
    critic); `needs_critic`: it reads values; `token_rewards`: it reads per-token rewards (so a KL penalty can go
    into them)."""

    fn: Callable[["Experience", "RLConfig", int, Reduce], "Experience"]
    needs_critic: bool = False
    token_rewards: bool = False


ADV_ESTIMATORS: dict[str, AdvEstimator] = {}


def register_adv_est(name: str, needs_critic: bool = False, token_rewards: bool = False):
    """Register an advantage estimator as `--rl adv_estimator=NAME` (verl's register_adv_est)."""
    def register(fn):
        ADV_ESTIMATORS[name] = AdvEstimator(fn, needs_critic, token_rewards)
        return fn
    return register


def compute_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce = _identity) -> Experience:
    """Fill advantages (and returns with a critic) by `cfg.adv_estimator`, from the scores shaped by
    `overlong_shaping`. `reduce` sums whitening statistics over replicas; the group estimators need whole groups of
    `group_size` rollouts in `exp`."""
    registered(ADV_ESTIMATORS, cfg.adv_estimator)  # a worker imports the plugins at the first name it lacks
    if cfg.overlong_buffer:
        exp = replace(exp, scores=exp.scores + overlong_shaping(exp.mask, cfg.overlong_buffer, cfg.overlong_penalty))
    return ADV_ESTIMATORS[cfg.adv_estimator].fn(exp, cfg, group_size, reduce)


def keep_informative(scores: Tensor, group_size: int, oversample: int) -> tuple[Tensor, Tensor]:
    """DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2) over a step's drawn rows: (the indices of the rows kept, and
    per slot whether it found an informative group).

    The drawn rows are slots of `oversample` consecutive groups of `group_size` rollouts (one slot per trained
    prompt); each slot keeps its first group whose scores are not all equal (a group of equal scores has zero
    group-relative advantage everywhere), else its first group, so a step trains B prompts whatever it draws and a
    replica selects from its own slots (the same rows whatever the layout). DAPO instead draws batches until B
    informative groups are found; slots bound the draws by the plan's `oversample` and select the same groups on
    any number of replicas."""
    groups = scores.reshape(-1, oversample, group_size)
    informative = groups.amax(-1) != groups.amin(-1)  # [slots, oversample]
    found = informative.any(-1)
    first = torch.where(found, informative.to(torch.int8).argmax(-1), 0)  # argmax: the first maximal entry
    group = torch.arange(len(groups), device=scores.device) * oversample + first
    rows = (group[:, None] * group_size + torch.arange(group_size, device=scores.device)).reshape(-1)
    return rows, found


def overlong_shaping(mask: Tensor, buffer: int, penalty: float) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13): 0 for a response of at most Lr - buffer tokens, then
    down linearly to -penalty at Lr tokens, per sequence (Lr is the mask's width, the most a response holds)."""
    lr = mask.shape[-1]
    exceed = mask.sum(-1) - (lr - buffer)
    return (-exceed.clamp(min=0) / buffer * penalty).to(torch.float32)


def _token_rewards(exp: Experience, cfg: RLConfig) -> Tensor:
    # kl_in_reward without a reference is refused before the run (`RolloutAlgorithm.check`)
    kl = kl_estimate(exp.old_logprobs, exp.ref_logprobs, cfg.kl_estimator) if cfg.kl_in_reward else None
    return token_rewards(exp.scores, kl, exp.mask, cfg.kl_coef)


@register_adv_est("gae", needs_critic=True, token_rewards=True)
def _gae_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce) -> Experience:
    """PPO: GAE over per-token rewards and the critic's values, whitened over the batch."""
    if exp.values is None:
        raise RpegError(None, "PPO advantages need critic values; add a critic (or actor_critic) inference vertex "
                        "or use GRPO")
    adv, returns = gae(_token_rewards(exp, cfg), exp.values, exp.mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = whiten(adv, exp.mask, reduce(masked_moments(adv, exp.mask)))
    return replace(exp, advantages=adv, returns=returns)


@register_adv_est("grpo")
def _grpo_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce) -> Experience:
    """GRPO (Shao et al. 2024): each sequence's score against its group's, over the group's std unless
    norm_adv_by_std = false (Dr. GRPO)."""
    adv = grpo_advantages(exp.scores, group_size, cfg.grpo_eps, cfg.norm_adv_by_std)
    return replace(exp, advantages=adv.unsqueeze(-1) * exp.mask, returns=None)


@register_adv_est("rloo")
def _rloo_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce) -> Experience:
    """RLOO (Ahmadian et al. 2024, Eq. 5): each sequence's score against the mean of its group's other ones,
    r_i - (sum_j r_j - r_i) / (R - 1) = R / (R - 1) (r_i - mean)."""
    groups = _groups(exp.scores, group_size, "RLOO")
    adv = (groups - groups.mean(-1, keepdim=True)) * group_size / (group_size - 1)
    return replace(exp, advantages=adv.reshape(-1).to(exp.mask.dtype).unsqueeze(-1) * exp.mask, returns=None)


@register_adv_est("reinforce_plus_plus", token_rewards=True)
def _reinforce_pp_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce) -> Experience:
    """REINFORCE++ (Hu 2025, Eq. 6-7): the discounted return of the per-token rewards (KL penalty included when in
    the reward), whitened over the whole batch (statistics summed over replicas)."""
    rewards = _token_rewards(exp, cfg)
    returns, _ = gae(rewards, torch.zeros_like(rewards), exp.mask, cfg.gamma, 1.0)  # no critic, lambda 1: returns
    return replace(exp, advantages=whiten(returns, exp.mask, reduce(masked_moments(returns, exp.mask))),
                   returns=None)


@register_adv_est("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline_advantages(exp: Experience, cfg: RLConfig, group_size: int, reduce: Reduce) -> Experience:
    """REINFORCE++ with a group baseline (Hu 2025, Sec. 3.2): the score less its group's mean on every token,
    whitened over the whole batch."""
    groups = _groups(exp.scores, group_size, "REINFORCE++ with a group baseline")
    adv = (groups - groups.mean(-1, keepdim=True)).reshape(-1).to(exp.mask.dtype).unsqueeze(-1) * exp.mask
    return replace(exp, advantages=whiten(adv, exp.mask, reduce(masked_moments(adv, exp.mask))), returns=None)


def actor_loss(model: TransformerModel, exp: Experience, cfg: RLConfig,
               num_tokens: float) -> tuple[Tensor, dict[str, float]]:
    """The loss of an actor (or shared actor-critic) training vertex on `exp`, `num_tokens` the batch's normaliser.

    policy loss; + kl_coef * KL loss unless the KL is in the reward or there is no reference (`has_kl_loss`);
    - entropy_coef * entropy;
    + value_coef * value loss when the model also has a value head (shared actor-critic).
    """
    fwd = response_forward(model, exp.sequences, exp.prompt_len, cfg.temperature,
                           with_entropy=cfg.entropy_coef != 0, pads=exp.pads)
    agg = cfg.loss_agg_mode
    registered(POLICY_LOSSES, cfg.policy_loss)  # a worker imports the plugins at the first name it lacks
    loss, stats = POLICY_LOSSES[cfg.policy_loss](fwd.logprobs, exp.old_logprobs, exp.advantages, exp.mask, cfg,
                                                 num_tokens)
    stats["policy_loss"] = loss.item()
    if has_kl_loss(cfg, exp.ref_logprobs is not None):
        kl = kl_loss(fwd.logprobs, exp.ref_logprobs, exp.mask, cfg.kl_estimator, num_tokens, agg)
        loss = loss + cfg.kl_coef * kl
        stats["kl_loss"] = kl.item()
    if cfg.entropy_coef != 0:
        ent = entropy_bonus(fwd.entropy, exp.mask, num_tokens, agg)
        loss = loss - cfg.entropy_coef * ent
        stats["entropy"] = ent.item()
    if fwd.values is not None:
        vl = value_loss(fwd.values, exp.values, exp.returns, exp.mask, cfg.value_clip, num_tokens, agg)
        loss = loss + cfg.value_coef * vl
        stats["value_loss"] = vl.item()
    return loss, stats


def critic_loss(model: TransformerModel, exp: Experience, cfg: RLConfig, num_tokens: float) -> Tensor:
    """The loss of a critic training vertex on `exp`, `num_tokens` the batch's normaliser."""
    fwd = response_forward(model, exp.sequences, exp.prompt_len, cfg.temperature, pads=exp.pads)
    return value_loss(fwd.values, exp.values, exp.returns, exp.mask, cfg.value_clip, num_tokens, cfg.loss_agg_mode)


# ---------------------------------------------------------------------------------------------------
# Epochs and minibatches


class Rows(Protocol):
    """A batch a training vertex steps on (an Experience, DPO's PairRows)."""

    def rows(self, index: slice | Tensor) -> "Rows": ...

    def loss_count(self, agg: str) -> Tensor:
        """What its loss aggregated by `agg` is divided by, locally (e.g. response tokens, or pairs), as a 0-d tensor
        on its device."""
        ...


def minibatch_rows(lo: int, hi: int, count: int, k: int) -> Tensor:
    """Positions among global rows lo..hi-1 of minibatch k of `count`: the rows g with g % count == k.

    The split is the batch's, not the layout's: every plan takes the single-process optimizer steps, and
    each data-parallel replica (contiguous rows) holds an equal share of every minibatch."""
    g = torch.arange(lo, hi)
    return g[g % count == k] - lo


def epoch_stats(parts: Sequence[tuple[dict[str, float], float]], counts: Collection[str]) -> dict[str, float]:
    """An epoch's statistics from its minibatch steps' (statistics, share of the batch): a minibatch's means
    (over its own tokens or pairs) weighted by its share, so they are the whole batch's; `counts` summed."""
    out: dict[str, float] = {}
    for stats, share in parts:
        for key, value in stats.items():
            out[key] = out.get(key, 0.0) + (value if key in counts else value * share)
    return out


def minibatch_steps(cfg: RLConfig, batch: Rows, lo: int, hi: int,
                    step: Callable[[Rows, float], tuple[dict[str, float], float]], counts: Collection[str] = (),
                    reduce: Reduce = _identity) -> tuple[dict[str, float], float]:
    """`cfg.ppo_epochs` passes over `batch` (global rows lo..hi-1), each `cfg.ppo_minibatches` optimizer
    steps `step(minibatch, size)`, where size is the minibatch's loss normaliser over the whole batch (its
    `loss_count`, summed over replicas by `reduce`) and `step` returns (statistics, pre-clip gradient norm).
    Returns the last epoch's statistics (`epoch_stats`) and its mean norm."""
    subs = [batch.rows(minibatch_rows(lo, hi, cfg.ppo_minibatches, k)) for k in range(cfg.ppo_minibatches)]
    sizes = reduce(torch.stack([sub.loss_count(cfg.loss_agg_mode).double() for sub in subs])).tolist()
    total = sum(sizes)
    results: list[tuple[dict[str, float], float]] = []
    for _ in range(cfg.ppo_epochs):
        results = [step(sub, size) for sub, size in zip(subs, sizes)]
    stats = epoch_stats([(st, size / total) for (st, _), size in zip(results, sizes)], counts)
    return stats, sum(norm for _, norm in results) / len(results)
