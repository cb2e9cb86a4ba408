"""DPO (Rafailov et al. 2023; paper Sec. II and `examples/dpo.rpeg`): no rollouts, a frozen reference scores
given preference pairs, the policy trains on -log sigmoid(beta ((log pi(y_c) - log ref(y_c)) - (log pi(y_r) -
log ref(y_r)))), a sequence's log-probability the sum over its response tokens.

The graph: two graph-input token containers hold the pairs; the training vertex reads them, and the first it
reads is the chosen side, the second the rejected (`sides`). Each comes from the run's preference source
(a dataset with `chosen` and `rejected` columns, or a toy task's correct response over a random one), which
every process draws itself, as prompts are (datasets.py). An inference vertex of the reference model reading
a side writes that side's reference log-probs (`chosen_ref_logprobs` / `rejected_ref_logprobs`). The loss is
a sum over the local pairs divided by the global pair count, so summing gradients over replicas and
microbatches gives the whole-batch gradient, as rl/step.py's token means do. Log-probs are at temperature 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Container, Program, Vertex, Workload
from rpegc.runtime.backends.torch.channel.commands import Op
from rpegc.runtime.backends.torch.rl.algorithms.base import Algorithm, Worker, training_report
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel
from rpegc.runtime.backends.torch.rl.datasets import PairBatch
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.model.hf import initial_model
from rpegc.runtime.backends.torch.model.transformer import derive_seed
from rpegc.runtime.backends.torch.model.master_weights import train_whole
from rpegc.runtime.backends.torch.rl.step import RLConfig, minibatch_steps, response_forward
from rpegc.runtime.backends.torch.parallel.schedules import train_step


SIDES = ("chosen", "rejected")
# `dpo_loss`'s statistics that are sums over pairs (the loss itself is a mean)
PAIR_SUMS = ("reward_correct", "reward_margin", "chosen_reward", "rejected_reward")


def sides(program: Program) -> dict[str, str]:
    """Graph-input token container -> "chosen" | "rejected": the training vertex's first and second such read."""
    graph = program.graph
    assert graph is not None
    trainers = [v for v in graph.vertices if v.role == "training"]
    if len(trainers) != 1:
        raise RpegError(graph.loc, f"a DPO graph has one training vertex (the policy's), found {len(trainers)}")
    pairs = [c for c in trainers[0].reads if c in graph.inputs and graph.container(c).elem == "tokens"]
    if len(pairs) != 2:
        raise RpegError(trainers[0].loc, f"DPO's training vertex @{trainers[0].name} must read two graph-input token "
                        "containers, the chosen sequences first and the rejected second (rpeg.input %chosen, "
                        f"%rejected); it reads {len(pairs)}")
    return dict(zip(pairs, SIDES))


class DPO(Algorithm):
    name = family = "dpo"
    paper = "Rafailov et al. 2023, Direct Preference Optimization"
    generates = False
    stat_keys = {"policy": ("dpo_loss",) + PAIR_SUMS}

    def base_rl(self) -> RLConfig:
        # no rollouts, rewards or advantages: the KL anchor is in the loss itself
        return RLConfig(algorithm="dpo", kl_in_reward=False, whiten_advantages=False)

    def check_rl(self, cfg: RLConfig) -> None:
        if cfg.kl_in_reward:
            raise RpegError(None, "DPO has no per-token reward to put the KL penalty into; set kl_in_reward = false")

    def step_rows(self, w: Workload) -> int:
        return w.B

    def row_noun(self) -> str:
        return "pairs"

    def inference(self, worker: Worker, cmd: Op, pm: ParallelModel, lo: int,
                  hi: int) -> tuple[dict[str, Tensor], dict]:
        """The reference scores one side of the step's preference pairs (its field names it)."""
        out: dict[str, Tensor] = {}
        for f in cmd.fields:
            side, base = f.split("_", 1)
            data, pads = worker.pair_rows(cmd.step, side, lo, hi)
            out[f] = worker.forward_field(cmd, pm, data, base, lo, hi, pads, temperature=1.0)
        return out, {}

    def train(self, worker: Worker, cmd: Op, lo: int, hi: int) -> dict:
        """The policy update on pairs lo..hi-1 of the step, with the reference log-probs the inference vertices
        wrote."""
        st, e = worker.loaded_state(cmd)
        pm, rl = st.pm, worker.run.rl
        ref = worker.rows_of(cmd.inputs, lo, hi, ["chosen_ref_logprobs", "rejected_ref_logprobs"])
        rows = PairRows.of(worker.step_pairs(cmd.step), ref["chosen_ref_logprobs"], ref["rejected_ref_logprobs"],
                           lo, hi, worker.device)
        lp, beta = worker.run.workload.Lp, rl.dpo_beta
        keys = self.stat_keys["policy"]

        def step(sub: PairRows, n: float) -> tuple[dict[str, float], float]:
            return train_step(pm, st.master, lambda view, r: pair_loss(view, r, lp, beta, n), sub, cmd.mb, rl,
                              keys, st.train.schedule)

        stats, norm = minibatch_steps(rl, rows, lo, hi, step, counts=PAIR_SUMS, reduce=worker.dp_sum(pm))
        version = worker.publish(cmd, st)
        metrics = pair_metrics(stats, float(worker.run.workload.B), norm)
        return training_report(cmd.model, e.version, version, pm, metrics)

    def reference_trainer(self, cfg, seed: int) -> "DPOTrainer":
        return DPOTrainer(cfg, seed)

    def container_fields(self, program: Program, vertex: Vertex, container: Container) -> Optional[tuple[str, ...]]:
        kind = program.model(vertex.model).kind
        if vertex.role != "inference" or kind != "reference" or container.elem != "logprobs":
            return None
        side = [s for c, s in sides(program).items() if c in vertex.reads]
        return (f"{side[0]}_ref_logprobs",) if len(side) == 1 else None

    def training_fields(self, has_critic: bool, has_reference: bool = True) -> tuple[str, ...]:
        # DPO's loss is the reference's log-probs of both sides, with a reference vertex or not (then none writes them)
        return ("chosen_ref_logprobs", "rejected_ref_logprobs")

    def what_writes(self) -> str:
        return ("under DPO only the reference model's inference vertices write, the log-probs of the one pair "
                "side (graph-input token container) each reads")

    def check(self, cfg) -> None:
        if cfg.has_critic:
            raise RpegError(None, "DPO trains the policy alone; remove the critic model")
        if cfg.reward != "rule" or cfg.reward_arch is not None:
            raise RpegError(None, "DPO has no reward: the preference pairs are its signal; drop --reward and the "
                            "reward model")
        if cfg.workload.R != 1:
            raise RpegError(cfg.workload.loc, f"DPO has one pair per prompt: R must be 1, got {cfg.workload.R}")


# -- the loss -----------------------------------------------------------------------------------------


@dataclass
class PairRows:
    """A replica's (or microbatch's) pairs: both sides' sequences and masks, the reference log-probs of both
    [b, Lr] and the prompts' pads."""

    chosen: Tensor
    rejected: Tensor
    chosen_mask: Tensor
    rejected_mask: Tensor
    ref_chosen: Tensor
    ref_rejected: Tensor
    pads: Optional[Tensor] = None
    forward_rows = 2  # `pair_loss` runs both sides of a pair in one pass (schedules.train_step)

    def __len__(self) -> int:
        return self.chosen.shape[0]

    @staticmethod
    def of(batch: PairBatch, ref_chosen: Tensor, ref_rejected: Tensor, lo: int, hi: int,
           device: Optional[torch.device] = None) -> "PairRows":
        """Pairs lo..hi-1 of a step's `batch` with their reference log-probs, on `device`."""
        def on(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.to(device)
        return PairRows(on(batch.chosen[lo:hi]), on(batch.rejected[lo:hi]), on(batch.chosen_mask[lo:hi]),
                        on(batch.rejected_mask[lo:hi]), on(ref_chosen), on(ref_rejected),
                        None if batch.pads is None else on(batch.pads[lo:hi]))

    def loss_count(self, agg: str = "token-mean") -> Tensor:
        """The pairs the DPO loss is a mean over (its loss is per pair, so no token aggregation applies)."""
        return torch.tensor(float(len(self)), device=self.chosen.device)

    def rows(self, index: slice | Tensor) -> "PairRows":
        return PairRows(self.chosen[index], self.rejected[index], self.chosen_mask[index], self.rejected_mask[index],
                        self.ref_chosen[index], self.ref_rejected[index],
                        None if self.pads is None else self.pads[index])


def sequence_logps(logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi(y) of each response: its tokens' log-probs summed under the mask [b]."""
    return (logprobs * mask).sum(-1)


def dpo_loss(policy_c: Tensor, policy_r: Tensor, ref_c: Tensor, ref_r: Tensor, beta: float,
             num_pairs: float) -> tuple[Tensor, dict[str, float]]:
    """sum(-log sigmoid(beta (h_c - h_r))) / num_pairs, h = log pi - log ref per sequence, and the statistics
    (sums over the local pairs): the implicit rewards beta h, their margin and how many pairs rank right."""
    chosen, rejected = beta * (policy_c - ref_c), beta * (policy_r - ref_r)
    margin = chosen - rejected
    loss = -F.logsigmoid(margin).sum() / num_pairs
    stats = {"dpo_loss": loss.item(), "reward_correct": float((margin > 0).sum()),
             "reward_margin": float(margin.detach().sum()), "chosen_reward": float(chosen.detach().sum()),
             "rejected_reward": float(rejected.detach().sum())}
    return loss, stats


def pair_loss(model, rows: PairRows, prompt_len: int, beta: float, num_pairs: float) -> tuple[Tensor, dict]:
    """The DPO loss of `rows` under `model` (a TransformerModel or a pipeline StageView): both sides in one
    forward pass of 2b rows (a pipelined microbatch runs one pass)."""
    b = len(rows)
    pads = None if rows.pads is None else torch.cat([rows.pads, rows.pads])
    logprobs = response_forward(model, torch.cat([rows.chosen, rows.rejected]), prompt_len, 1.0, pads=pads).logprobs
    return dpo_loss(sequence_logps(logprobs[:b], rows.chosen_mask), sequence_logps(logprobs[b:], rows.rejected_mask),
                    sequence_logps(rows.ref_chosen, rows.chosen_mask), sequence_logps(rows.ref_rejected,
                                                                                      rows.rejected_mask),
                    beta, num_pairs)


def pair_metrics(sums: dict[str, float], num_pairs: float, grad_norm: float) -> dict[str, float]:
    """Per-step metrics from the statistics summed over all pairs: dpo_loss is already the mean."""
    return {"dpo_loss": sums["dpo_loss"], "reward_accuracy": sums["reward_correct"] / num_pairs,
            "reward_margin": sums["reward_margin"] / num_pairs, "chosen_reward": sums["chosen_reward"] / num_pairs,
            "rejected_reward": sums["rejected_reward"] / num_pairs, "actor_grad_norm": grad_norm}


# -- the single-process reference ------------------------------------------------------------------------


class DPOTrainer:
    """DPO's reference oracle: step k scores the step's pairs with the reference model and takes one Adam step
    of the policy on the whole batch."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed
        w = cfg.workload
        actor_seed = derive_seed(seed, "actor")
        self.actor = initial_model(cfg.actor, "policy", actor_seed, cfg.actor_hf, cfg.net)
        self.reference = initial_model(cfg.actor, "reference", actor_seed, cfg.reference_hf,
                                       cfg.net).to(cfg.serving_dtype)
        self.reference.requires_grad_(False)
        self.actor_master = train_whole(self.actor, cfg.training_dtype("actor"), cfg.rl.lr_actor, cfg.rl)
        self.pairs = open_prompts(cfg.data, cfg.task, cfg.actor.vocab, w.Lp, w.Lr, pairs=True)

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        w = self.cfg.workload
        batch = self.pairs.pairs(w.B, self.seed, step)
        with torch.no_grad():
            ref = {s: response_forward(self.reference, batch.side(s)[0], w.Lp, 1.0, pads=batch.pads).logprobs
                   for s in SIDES}
        rows = PairRows.of(batch, ref["chosen"], ref["rejected"], 0, w.B)

        def step_on(sub: PairRows, n: float) -> tuple[dict[str, float], float]:
            loss, stats = pair_loss(self.actor, sub, w.Lp, self.cfg.rl.dpo_beta, n)
            loss.backward()
            return stats, self.actor_master.step(self.cfg.rl)

        stats, norm = minibatch_steps(self.cfg.rl, rows, 0, w.B, step_on, counts=PAIR_SUMS)
        metrics = {"step": float(step), **pair_metrics(stats, float(w.B), norm)}
        metrics["time_s"] = time.perf_counter() - t0
        return metrics

    def weights(self) -> dict[str, dict[str, Tensor]]:
        return {"actor": self.actor_master.export()}
