"""Rollout generation: batched sampling with a KV cache and per-sequence seeded generators.

Paper Sec. II (the generation stage of an RL step) and Sec. VII (the runtime executes each vertex's
plan under any dp/pp/tp/microbatch layout). Each sequence draws its randomness from its own
`torch.Generator` seeded by `(seed, step, global sequence index)`, and a token is drawn by
inverse-CDF sampling in float64 from that sequence's own probabilities, so the tokens a sequence gets
do not depend on which replica or microbatch it lands in. Sequence `g` of a step is rollout `g % R` of
prompt `g // R` (`expand_rollouts`). The draw happens on the CPU whatever device the model runs on
(`sample_tokens`), so a GPU run samples what a CPU run would from the same probabilities.

Sampling (`Sampling`): the logits are divided by the temperature, then top-k and top-p (nucleus) keep the
k most likely tokens and the smallest most-likely set holding probability top_p, in transformers' order
(temperature, top-k, top-p; ties at a boundary are all kept by top-k and broken by vocabulary order by
top-p). The token is drawn from that truncated, renormalised distribution, but the log-probability
recorded with it is under the whole tempered distribution: the one the training and inference vertices
compute by teacher forcing (`rl.token_logprobs`), as verl and TRL recompute old log-probs without the
truncation. With top-p or top-k on, the PPO ratio's denominator is therefore not the exact behaviour
policy; that is the convention of those systems, and it keeps the old and the trained log-probs one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.model.transformer import TransformerModel, derive_seed


@dataclass
class Rollout:
    """Generated sequences of one batch (or shard).

    sequences [b, Lp+Lr] prompt followed by response; responses [b, Lr]; logprobs [b, Lr] the
    log-probabilities (at the sampling temperature, not truncated by top-k/top-p) of the sampled tokens
    under the generating weights, 0 where masked; mask [b, Lr] 1.0 up to and including the end-of-sequence token.
    """

    sequences: Tensor
    responses: Tensor
    logprobs: Tensor
    mask: Tensor

    @property
    def prompt_len(self) -> int:
        return self.sequences.shape[1] - self.responses.shape[1]


def sequence_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of global sequence `index` at RL step `step`."""
    return derive_seed("sample", seed, step, index)


def expand_rollouts(prompts: Tensor, rollouts: int) -> Tensor:
    """[B, Lp] -> [B*R, Lp]: the R rollouts of a prompt are consecutive sequences."""
    return prompts.repeat_interleave(rollouts, dim=0)


@dataclass(frozen=True)
class Sampling:
    """How a generation vertex draws: temperature > 0; top_p in (0, 1] (1: off); top_k >= 0 (0: off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def check(self) -> None:
        if not self.temperature > 0:
            raise RpegError(None, f"sampling temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RpegError(None, f"top_p must lie in (0, 1] (1 turns it off), got {self.top_p}")
        if self.top_k < 0:
            raise RpegError(None, f"top_k must be >= 0 (0 turns it off), got {self.top_k}")


def truncate(probs: Tensor, sampling: Sampling) -> Tensor:
    """probs [b, V] with the tokens top-k and then top-p drop set to 0 (not renormalised)."""
    if 0 < sampling.top_k < probs.shape[-1]:
        kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if sampling.top_p < 1:
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        above = ranked.cumsum(-1) - ranked  # the probability of the tokens ranked higher
        keep = above < sampling.top_p * ranked.sum(-1, keepdim=True)  # the first token always stays
        probs = torch.where(torch.zeros_like(keep).scatter(-1, order, keep), probs, torch.zeros_like(probs))
    return probs


def sample_tokens(logprobs: Tensor, generators: Sequence[torch.Generator], sampling: Sampling = Sampling()) -> Tensor:
    """One token per row from log-probabilities [b, V] (at the sampling temperature), truncated by
    `sampling`'s top-k/top-p, row i drawing from generators[i] (CPU generators); the tokens are returned on
    the device of `logprobs`. A token of probability 0 (truncated, or underflowed) is never drawn.

    The inverse CDF is taken on the CPU even when the model runs on a GPU: a CUDA generator draws a
    different stream than a CPU one seeded alike, and a float64 cumsum on the GPU need not sum in the
    CPU's order, so drawing there would make the tokens depend on the device. The copy is [b, V] per
    decode step, which generation synchronises on anyway (the next step needs the tokens).
    """
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    cdf = torch.cumsum(truncate(logprobs.detach().to("cpu", torch.float64).exp(), sampling), dim=-1)
    # the first index whose cdf exceeds the draw: a zero-probability token repeats its predecessor's cdf
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return idx.clamp_(max=logprobs.shape[-1] - 1).to(logprobs.device)


def check_generation(has_lm_head: bool, kind: str, sampling: Sampling, max_new_tokens: int, prompt_len: int,
                     max_seq: int) -> None:
    """The user errors of a generation request, for the single-process and the pipelined generate."""
    if not has_lm_head:
        raise RpegError(None, f"generation needs a model with an LM head (policy or actor_critic), got kind '{kind}'")
    sampling.check()
    if max_new_tokens < 1:
        raise RpegError(None, f"max_new_tokens (Lr) must be >= 1, got {max_new_tokens}")
    if prompt_len + max_new_tokens > max_seq:
        raise RpegError(None, f"Lp + Lr = {prompt_len} + {max_new_tokens} exceeds the model's max_seq {max_seq}; "
                        "build the model with max_seq >= Lp + Lr")


class Sampler:
    """The sampling state of a batch of sequences, step by step: each row's generator, which rows are still
    alive, and the tokens, log-probs and mask so far. The log-probabilities are computed on `device`; the
    draw happens on the CPU (`sample_tokens`: the tokens must not depend on the device). Both the
    single-process `generate` and the pipelined one (parallel/parallel_model.py, on the last stage) sample with it."""

    def __init__(self, indices: Sequence[int], seed: int, step: int, sampling: Sampling,
                 eos_id: Optional[int], pad_id: int, device: torch.device):
        self.generators = [torch.Generator().manual_seed(sequence_seed(seed, step, int(i))) for i in indices]
        self.sampling, self.eos_id, self.pad_id = sampling, eos_id, pad_id
        self.alive = torch.ones(len(indices), dtype=torch.bool, device=device)
        self.tokens: list[Tensor] = []
        self.logps: list[Tensor] = []
        self.masks: list[Tensor] = []

    def sample(self, logits: Tensor) -> Tensor:
        """Draw the next token of every row from the last position's `logits` [b, V]; returns the tokens
        to feed back (pad after end-of-sequence)."""
        logp = torch.log_softmax(logits.float() / self.sampling.temperature, dim=-1)
        tok = sample_tokens(logp, self.generators, self.sampling)
        tok_logp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        self.tokens.append(torch.where(self.alive, tok, torch.full_like(tok, self.pad_id)))
        self.logps.append(torch.where(self.alive, tok_logp, torch.zeros_like(tok_logp)))
        self.masks.append(self.alive.float())
        if self.eos_id is not None:
            self.alive = self.alive & (tok != self.eos_id)
        return self.tokens[-1]

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """(responses, log-probs, mask), each [b, steps so far]."""
        return torch.stack(self.tokens, dim=1), torch.stack(self.logps, dim=1), torch.stack(self.masks, dim=1)


@torch.no_grad()
def generate(model: TransformerModel, prompts: Tensor, indices: Sequence[int], *, seed: int, step: int,
             max_new_tokens: int, sampling: Sampling = Sampling(), eos_id: Optional[int] = None,
             pad_id: int = 0, pads: Optional[Tensor] = None) -> Rollout:
    """Sample `max_new_tokens` tokens after each prompt row; `indices[i]` is row i's global sequence index;
    `pads` [b] the left padding of each prompt row (None: none).

    After a sequence emits `eos_id` its remaining positions hold `pad_id` with mask 0 and log-prob 0.
    """
    check_generation(model.has_lm_head, model.kind, sampling, max_new_tokens, prompts.shape[1], model.opts.max_seq)
    if len(indices) != prompts.shape[0]:
        raise RpegError(None, f"{prompts.shape[0]} prompts but {len(indices)} sequence indices; "
                        "pass one global index per prompt row")
    b, lp = prompts.shape
    was_training = model.training
    model.eval()
    sampler = Sampler(indices, seed, step, sampling, eos_id, pad_id, prompts.device)
    cache = model.new_cache(b, lp + max_new_tokens)
    logits = model(prompts, cache, pads).logits[:, -1]
    for t in range(max_new_tokens):
        fed = sampler.sample(logits)
        if t + 1 < max_new_tokens:
            logits = model(fed.unsqueeze(-1), cache, pads).logits[:, -1]
    model.train(was_training)
    responses, logprobs, mask = sampler.result()
    return Rollout(sequences=torch.cat([prompts, responses], dim=1), responses=responses, logprobs=logprobs,
                   mask=mask)
