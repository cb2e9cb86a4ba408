"""What a torch worker's operators read of a step besides its containers: the step's prompts (or DPO's preference
pairs), drawn as every process draws them, their left padding, and the run's reward function."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from rpegc.runtime.backends.torch.channel.worker_setup import WorkerSetup
from rpegc.runtime.backends.torch.model.generation import expand_rollouts
from rpegc.runtime.backends.torch.rl.datasets import PairBatch, PromptBatch
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.rl.rewards import load_reward


class StepInputs:
    """The run's prompts and reward function, and the batches of the steps in flight."""

    def __init__(self, setup: WorkerSetup, device: torch.device):
        self.setup, self.run, self.device = setup, setup.run, device
        w = self.run.workload
        self.prompts = open_prompts(self.run.data, self.run.task, self.run.actor.vocab, w.Lp, w.Lr,
                                    pairs=not self.run.alg.generates)
        self.reward_fn = load_reward(self.run.reward) if self.run.reward_function else None
        self._batches: dict[int, PromptBatch] = {}  # the prompts of the steps in flight
        self._pairs: dict[int, PairBatch] = {}  # DPO: the preference pairs of the steps in flight

    @staticmethod
    def _recent(cache: dict, step: int, draw: Callable[[], object]):
        """cache[step], drawn on first use; a few recent steps are kept (staleness lets a step's vertices run
        while the next step's generation has started)."""
        if step not in cache:
            cache[step] = draw()
            for old in [k for k in cache if k < step - 8]:
                del cache[old]
        return cache[step]

    def step_batch(self, step: int) -> PromptBatch:
        """Step `step`'s prompts (all it draws), as every process draws them."""
        w = self.run.workload
        return self._recent(self._batches, step, lambda: self.prompts.batch(w.drawn, self.setup.seed, step))

    def step_pairs(self, step: int) -> PairBatch:
        """DPO: step `step`'s preference pairs, as every process draws them."""
        return self._recent(self._pairs, step, lambda: self.prompts.pairs(self.run.workload.B, self.setup.seed, step))

    def pair_rows(self, step: int, side: str, lo: int, hi: int) -> tuple[dict[str, Tensor], Optional[Tensor]]:
        """DPO: ({"sequences", "mask"} of pairs lo..hi-1 on `side`, their pads)."""
        batch = self.step_pairs(step)
        seqs, mask = batch.side(side)
        pads = None if batch.pads is None else batch.pads[lo:hi].to(self.device)
        return {"sequences": seqs[lo:hi].to(self.device), "mask": mask[lo:hi].to(self.device)}, pads

    def row_pads(self, step: int, lo: int, hi: int) -> Optional[Tensor]:
        """The left padding of sequences lo..hi-1 of `step` (None: the prompts are not padded)."""
        pads = self.step_batch(step).pads
        return None if pads is None else expand_rollouts(pads, self.run.workload.R)[lo:hi].to(self.device)
