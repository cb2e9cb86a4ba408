"""Verifiable reward rules: toy tasks whose reward a program computes exactly (no reward model).

Paper Sec. II: the reward stage scores each response; for reasoning tasks with checkable answers it
is a rule. These tasks are small enough that a tiny actor visibly learns them in a few dozen RL steps
on a CPU, which is what the demo and the learning tests show. A score is the fraction of response
tokens equal to the target at their position, in [0, 1]; masked (after end-of-sequence) tokens count
as misses, so stopping early never pays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.rl.datasets import PairBatch, PromptBatch
from rpegc.runtime.backends.torch.model.transformer import derive_seed

TASK_NAMES = ("pattern", "reverse")


@dataclass(frozen=True)
class Task:
    """`pattern`: respond with `pattern` repeated (target[t] = pattern[t % len]), whatever the prompt.
    Its tokens are distinct and prompts never use them, so the target is a function of the previous
    token and no single repeated token scores more than 1/len (no cheap local optimum).
    `reverse`: respond with the prompt reversed, repeated if Lr > Lp (needs attention to the prompt)."""

    name: str
    vocab: int
    prompt_len: int
    response_len: int
    pattern: tuple[int, ...] = (5, 2, 7, 3)

    def prompts(self, batch: int, seed: int, step: int) -> Tensor:
        """The B prompts [B, Lp] of RL step `step`, the same on every process."""
        gen = torch.Generator().manual_seed(derive_seed("prompts", seed, step))
        low = max(self.pattern) + 1 if self.name == "pattern" else 0
        return torch.randint(low, self.vocab, (batch, self.prompt_len), generator=gen)

    @property
    def eos_id(self) -> None:
        return None  # responses run to Lr tokens

    @property
    def pad_id(self) -> int:
        return 0

    def batch(self, batch: int, seed: int, step: int) -> PromptBatch:
        """Step `step`'s prompts as a dataset gives them (every prompt has Lp tokens: no padding)."""
        return PromptBatch(tokens=self.prompts(batch, seed, step))

    def pairs(self, batch: int, seed: int, step: int) -> PairBatch:
        """DPO's preference pairs of the task: the correct response chosen over a seeded random one."""
        prompts = self.prompts(batch, seed, step)
        gen = torch.Generator().manual_seed(derive_seed("rejected", seed, step))
        rejected = torch.randint(0, self.vocab, (batch, self.response_len), generator=gen)
        mask = torch.ones(batch, self.response_len)
        return PairBatch(chosen=torch.cat([prompts, self.targets(prompts)], dim=1),
                         rejected=torch.cat([prompts, rejected], dim=1), chosen_mask=mask, rejected_mask=mask.clone())

    def targets(self, prompts: Tensor) -> Tensor:
        """The correct response [b, Lr] for each prompt row."""
        t = torch.arange(self.response_len, device=prompts.device)
        if self.name == "pattern":
            pat = torch.tensor(self.pattern, device=prompts.device)
            return pat[t % len(self.pattern)].expand(prompts.shape[0], -1)
        return prompts.flip(-1)[:, t % self.prompt_len]

    def score(self, prompts: Tensor, responses: Tensor, mask: Tensor) -> Tensor:
        """Fraction of correct response tokens per sequence [b], in [0, 1]; `prompts` has one row per response."""
        hits = (responses == self.targets(prompts)).float() * mask
        return hits.sum(-1) / self.response_len


def make_task(name: str, vocab: int, prompt_len: int, response_len: int) -> Task:
    """Validate and build a task; raises RpegError saying what to change."""
    if name not in TASK_NAMES:
        raise RpegError(None, f"unknown verifiable task '{name}'; use one of {', '.join(TASK_NAMES)}")
    if prompt_len < 1 or response_len < 1:
        raise RpegError(None, f"task '{name}' needs Lp >= 1 and Lr >= 1, got Lp = {prompt_len}, Lr = {response_len}")
    task = Task(name, vocab, prompt_len, response_len)
    if name == "pattern" and max(task.pattern) + 1 >= vocab:
        raise RpegError(None, f"the pattern task needs its target tokens {task.pattern} and at least one other "
                        f"token for prompts, but the vocabulary has {vocab}; use vocab > {max(task.pattern) + 1}")
    return task
