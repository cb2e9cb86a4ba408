"""The rollout algorithms' computation (PPO and GRPO, algorithms/ppo.py and grpo.py; paper Sec. II): generation
samples R responses per prompt, inference vertices write log-probs (reference, policy), values (critic) and scores
(a reward model or the verifier), and the trainers turn them into advantages and clipped losses with rl/step.py's math.
`ReferenceTrainer` is their single-process oracle: the same functions on the whole batch."""

from __future__ import annotations

import time
from typing import Optional

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import VERIFY, Arch, Container, Program, Vertex, Workload
from rpegc.runtime.backends.torch.channel.commands import Op
from rpegc.runtime.backends.torch.rl.algorithms.base import Algorithm, Worker, training_report
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel
from rpegc.runtime.backends.torch.rl.finite import require_finite
from rpegc.runtime.backends.torch.model.generation import expand_rollouts, generate
from rpegc.runtime.backends.torch.model.hf import initial_model
from rpegc.runtime.backends.torch.model.master_weights import train_whole
from rpegc.runtime.backends.torch.model.transformer import (TransformerModel, cast_weights, derive_seed, export_weights,
                                                install_weights)
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.rl.rewards import accuracy_sums, load_reward, score_responses
from rpegc.runtime.backends.torch.rl import step as rl_math
from rpegc.runtime.backends.torch.rl.step import (Experience, RLConfig, actor_loss, compute_advantages, critic_loss,
                                            has_kl_loss, keep_informative, kl_estimate, last_token_scores,
                                            minibatch_steps, response_forward)
from rpegc.runtime.backends.torch.parallel.schedules import train_step


# What a vertex of a rollout algorithm writes: generation the sampled sequences, their mask and the sampling
# log-probs; inference per model kind.
ROLLOUT_FIELDS = {
    "generation": {"tokens": ("sequences", "mask"), "logprobs": ("old_logprobs",), "values": ("values",)},
    "reference": {"logprobs": ("ref_logprobs",)},
    "policy": {"logprobs": ("old_logprobs",)},
    "critic": {"values": ("values",)},
    "actor_critic": {"values": ("values",), "logprobs": ("old_logprobs",)},
    "reward": {"rewards": ("scores", "task_scores"), "scalars": ("scores", "task_scores")},
}
ROLLOUT_TRAINING_FIELDS = ("sequences", "mask", "old_logprobs", "ref_logprobs", "scores", "task_scores")


def token_kl(exp: Experience) -> Optional[Tensor]:
    """The k1 KL of the sampling policy to the reference per response token (the "kl" metric's terms); None without a
    reference, whose runs report no "kl" (a metric a step does not have is left out, never written as NaN)."""
    return None if exp.ref_logprobs is None else kl_estimate(exp.old_logprobs, exp.ref_logprobs, "k1")


def check_reference(cfg) -> None:
    """A KL term needs the reference's log-probs: a graph without a reference inference vertex has none, so its RL
    settings may not ask for one (TRL loads no reference model with beta = 0, and computes no KL)."""
    if cfg.has_reference:
        return
    asks = [(f"kl_coef = {cfg.rl.kl_coef:g}", "kl_coef=0")] if cfg.rl.kl_coef != 0 else []
    asks += [("kl_in_reward = true", "kl_in_reward=false")] if cfg.rl.kl_in_reward else []
    if asks:
        what = f"{' and '.join(a for a, _ in asks)} {'asks' if len(asks) == 1 else 'ask'}"
        raise RpegError(cfg.loc, f"{what} for a KL term to the reference model, but the graph has no inference vertex "
                                 "of a reference model; add one (a model of kind = reference whose inference vertex "
                                 "writes the log-probs training reads) or run without the KL: "
                                 f"{' '.join(f'--rl {f}' for _, f in asks)}")


def keep_drawn(exp: Experience, task_scores: Tensor, w: Workload) -> tuple[Experience, Tensor, Tensor]:
    """The rows of a replica's drawn slots that train (`rl.keep_informative`; all of them without over-sampling), their
    verifier's scores, and per slot whether it found a group whose scores differ."""
    if w.oversample == 1:
        return exp, task_scores, torch.zeros(0, dtype=torch.bool, device=task_scores.device)
    rows, found = keep_informative(exp.scores, w.R, w.oversample)
    return exp.rows(rows), task_scores[rows], found


class RolloutAlgorithm(Algorithm):
    """A rollout algorithm: PPO (with a critic) or GRPO (group-relative, without)."""

    def check_rl(self, cfg: RLConfig) -> None:
        estimators = rl_math.ADV_ESTIMATORS  # the registry as it is now (plugins add to it)
        estimator = estimators[cfg.adv_estimator]
        critic = self.family == "ppo"
        if estimator.needs_critic != critic:
            fits = [n for n, e in estimators.items() if e.needs_critic == critic]
            raise RpegError(None, f"adv_estimator '{cfg.adv_estimator}' {'needs' if estimator.needs_critic else 'has no'}"
                                  f" critic; under {self.family.upper()} use one of {', '.join(fits)}")
        if cfg.kl_in_reward and not estimator.token_rewards:
            raise RpegError(None, f"adv_estimator '{cfg.adv_estimator}' has no per-token reward to put the KL penalty "
                                  "into; set kl_in_reward = false (or use reinforce_plus_plus)")

    def container_fields(self, program: Program, vertex: Vertex, container: Container) -> Optional[tuple[str, ...]]:
        if vertex.role == VERIFY:  # a verifier writes what a reward vertex does
            return ROLLOUT_FIELDS["reward"].get(container.elem)
        kind = program.model(vertex.model).kind
        if vertex.role == "generation":
            return ROLLOUT_FIELDS["generation"].get(container.elem)
        if vertex.role != "inference":
            return None
        return ROLLOUT_FIELDS.get(kind, {}).get(container.elem)

    def check(self, cfg) -> None:
        check_reference(cfg)

    def training_fields(self, has_critic: bool, has_reference: bool = True) -> tuple[str, ...]:
        # without a reference inference vertex nothing writes ref_logprobs: the run has no KL (`check_reference`)
        names = tuple(f for f in ROLLOUT_TRAINING_FIELDS if has_reference or f != "ref_logprobs")
        return names + (("values",) if has_critic else ())

    def what_writes(self) -> str:
        return ("generation writes tokens and log-probs, inference writes log-probs (reference), values (critic) "
                "or rewards")

    def reference_trainer(self, cfg, seed: int) -> "ReferenceTrainer":
        return ReferenceTrainer(cfg, seed)

    def inference(self, worker: Worker, cmd: Op, pm: ParallelModel, lo: int,
                  hi: int) -> tuple[dict[str, Tensor], dict]:
        """Log-probs (reference, policy), values (critic) and scores (a reward model's, the verifier's) of the
        generated rows."""
        out: dict[str, Tensor] = {}
        report: dict = {}
        data = worker.rows_of(cmd.inputs, lo, hi, ["sequences", "mask"])
        pads = worker.row_pads(cmd.step, lo, hi)
        for f in cmd.fields:
            if f in ("scores", "task_scores"):
                # The vertex is the reward model's inference, and the plan prices it so: the model runs whichever
                # score the run trains on (the toy task's rule, a reward function's, or the model's own).
                if "model_scores" not in report:
                    report["model_scores"] = worker.forward_field(cmd, pm, data, "scores", lo, hi, pads)
                # a dataset has no rule: the model's score is also the reward
                from_model = worker.run.reward == "model" and (f == "scores" or not worker.run.has_rule)
                out[f] = report["model_scores"] if from_model else worker.verifier_scores(cmd, pm, data, lo, hi, report)
            else:
                out[f] = worker.forward_field(cmd, pm, data, f, lo, hi, pads)
        if "model_scores" in report and worker.run.reward != "model" and pm.is_last and pm.t == 0:
            # trained on another score: the model's is logged beside it (reward_model_score), one reporter a replica
            stats = report.setdefault("reward_stats", {})
            stats["model_sum"], stats["model_n"] = float(report["model_scores"].sum()), report["model_scores"].numel()
        return out, report

    def train(self, worker: Worker, cmd: Op, lo: int, hi: int) -> dict:
        model = cmd.model
        spec = worker.setup.models[model]
        rl = worker.run.rl
        st, e = worker.loaded_state(cmd)
        pm = st.pm
        names = list(self.training_fields(worker.run.has_critic, worker.run.has_reference))
        data = worker.rows_of(cmd.inputs, lo, hi, names)
        exp = Experience(sequences=data["sequences"], mask=data["mask"], old_logprobs=data["old_logprobs"],
                         ref_logprobs=data.get("ref_logprobs"), scores=data["scores"], values=data.get("values"),
                         pads=worker.row_pads(cmd.step, lo, hi))
        for name in ("scores", "old_logprobs", "ref_logprobs", "values"):
            if getattr(exp, name) is not None:
                require_finite(f"the {name.replace('_', ' ')} it trains on", getattr(exp, name))
        dp_sum = worker.dp_sum(pm)
        w = worker.run.workload
        exp, task_scores, found = keep_drawn(exp, data["task_scores"], w)
        lo, hi = lo // w.oversample, hi // w.oversample  # the kept rows' place in the step's batch
        num_tokens = float(dp_sum(exp.mask.double().sum()))
        exp = compute_advantages(exp, rl, worker.run.workload.R, reduce=dp_sum)
        require_finite("the advantages", exp.advantages)
        keys = self.stat_keys[spec.kind]
        if spec.kind != "critic":
            keys += ((("kl_loss",) if has_kl_loss(rl, worker.run.has_reference) else ())
                     + (("entropy",) if rl.entropy_coef else ()))

        def step(sub: Experience, n: float) -> tuple[dict[str, float], float]:
            def loss_fn(view, e):
                if spec.kind != "critic":
                    return actor_loss(view, e, rl, n)
                loss = critic_loss(view, e, rl, n)
                return loss, {"value_loss": loss.item()}

            return train_step(pm, st.master, loss_fn, sub, cmd.mb, rl, keys, st.train.schedule)

        stats, norm = minibatch_steps(rl, exp, lo, hi, step, counts=("clipped_tokens",), reduce=dp_sum)
        version = worker.publish(cmd, st)
        kl = token_kl(exp)
        task_scores = task_scores.double()
        # without a reference the KL's slot holds a zero, so every run reduces the same sums
        kl_sum = (torch.zeros((), dtype=torch.float64, device=worker.device) if kl is None
                  else (kl * exp.mask).double().sum())
        sums = dp_sum(torch.stack([task_scores.sum(), exp.scores.double().sum(), kl_sum,
                                   torch.tensor(float(hi - lo), dtype=torch.float64, device=worker.device),
                                   task_scores.pow(2).sum(), found.double().sum()]))
        mean = float(sums[0] / sums[3])
        metrics = {"reward": mean, "score": float(sums[1] / sums[3]),
                   **({} if kl is None else {"kl": float(sums[2] / num_tokens)}),
                   "reward_std": max(0.0, float(sums[4] / sums[3]) - mean * mean) ** 0.5,
                   "response_length": num_tokens / float(sums[3]), "response_tokens": num_tokens}
        if w.oversample > 1:
            metrics["informative_groups"] = float(sums[5]) / w.B
        if spec.kind == "critic":
            metrics.update(value_loss=stats["value_loss"], critic_grad_norm=norm)
        else:
            metrics.update({k: v for k, v in stats.items() if k != "clipped_tokens"})
            metrics.update(clip_frac=stats["clipped_tokens"] / num_tokens, actor_grad_norm=norm)
        return training_report(model, e.version, version, pm, metrics)


class VersionStore:
    """Published versions of one trainable model: version v = weights after v training steps, kept as
    serving copies in `dtype` (what the workers' published entries hold)."""

    def __init__(self, weights: dict[str, Tensor], dtype: torch.dtype):
        self.dtype = dtype
        self.versions = {0: cast_weights(weights, dtype)}
        self.latest = 0

    def publish(self, weights: dict[str, Tensor], keep: int) -> None:
        self.latest += 1
        self.versions[self.latest] = cast_weights(weights, self.dtype)
        for v in [v for v in self.versions if v < self.latest - keep]:
            del self.versions[v]

    def for_step(self, step: int, tau: int) -> tuple[int, dict[str, Tensor]]:
        v = max(0, step - tau)
        return v, self.versions[v]


class ReferenceTrainer:
    """Models, optimizers and published versions of one run; `step(k)` runs RL step k on the whole batch."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed
        w = cfg.workload
        net = cfg.net
        self.prompts = open_prompts(cfg.data, cfg.task, cfg.actor.vocab, w.Lp, w.Lr)
        self.reward_fn = load_reward(cfg.reward) if cfg.reward_function else None
        serving = cfg.serving_dtype

        def serving_model(arch: Arch, kind: str, model_seed: int, hf: Optional[str]) -> TransformerModel:
            # built in float32 (from the seed or the checkpoint), then cast: the values a worker's version-0 copy holds
            return initial_model(arch, kind, model_seed, hf, net).to(serving).requires_grad_(False)

        actor_kind = "actor_critic" if cfg.shared_actor_critic else "policy"
        actor_seed = derive_seed(seed, "actor")
        # trained models (actor, critic) compute in the training dtype over float32 masters, as the workers do
        self.actor = initial_model(cfg.actor, actor_kind, actor_seed, cfg.actor_hf, net)
        self.actor_master = train_whole(self.actor, cfg.training_dtype("actor"), cfg.rl.lr_actor, cfg.rl)
        self.reference = (serving_model(cfg.actor, "reference", actor_seed, cfg.reference_hf) if cfg.has_reference
                          else None)  # a graph without a reference inference vertex: no KL, no forward
        self.actor_versions = VersionStore(self.actor_master.export(), serving)
        self.stale_actor = serving_model(cfg.actor, actor_kind, actor_seed, cfg.actor_hf)
        self.critic: Optional[TransformerModel] = None
        if cfg.critic is not None:
            critic_seed = derive_seed(seed, "critic")
            self.critic = initial_model(cfg.critic, "critic", critic_seed, cfg.critic_hf, net)
            self.critic_master = train_whole(self.critic, cfg.training_dtype("critic"), cfg.rl.lr_critic, cfg.rl)
            self.critic_versions = VersionStore(self.critic_master.export(), serving)
            self.stale_critic = serving_model(cfg.critic, "critic", critic_seed, cfg.critic_hf)
        self.reward_model = None
        if cfg.reward_arch is not None:  # the graph's reward model runs, whichever score trains (rule, function)
            self.reward_model = serving_model(cfg.reward_arch, "reward", derive_seed(seed, "reward"), cfg.reward_hf)

    def _at_version(self, model: TransformerModel, store: VersionStore, step: int, tau: int) -> TransformerModel:
        _, weights = store.for_step(step, tau)
        install_weights(model, weights)
        return model

    @torch.no_grad()
    def collect(self, step: int) -> tuple[Experience, Tensor, tuple[float, int], Optional[float]]:
        """Generation and inference vertices of step k: (experience, the verifier's scores, the (sum, count)
        of the accuracies the reward function gave, the mean score of a reward model the run does not train on)."""
        cfg, w = self.cfg, self.cfg.workload
        batch = self.prompts.batch(w.drawn, self.seed, step)
        prompts = expand_rollouts(batch.tokens, w.R)
        pads = None if batch.pads is None else expand_rollouts(batch.pads, w.R)
        gen_model = self._at_version(self.stale_actor, self.actor_versions, step, cfg.tau_actor)
        rollout = generate(gen_model, prompts, range(w.drawn * w.R), seed=self.seed, step=step, max_new_tokens=w.Lr,
                           sampling=cfg.rl.sampling, eos_id=self.prompts.eos_id, pad_id=self.prompts.pad_id,
                           pads=pads)
        ref_logp = None
        if self.reference is not None:
            ref_logp = response_forward(self.reference, rollout.sequences, w.Lp, cfg.rl.temperature, pads=pads).logprobs
        scored, model_scores = None, None
        if self.reward_model is not None:
            model_scores = last_token_scores(self.reward_model, rollout.sequences, w.Lp, rollout.mask, pads)
        if cfg.has_rule:
            task_scores, scored = score_responses(self.prompts, self.reward_fn, batch, rollout.sequences,
                                                  rollout.mask, range(w.drawn * w.R), w.R)
        else:
            task_scores = model_scores
        scores = model_scores if cfg.reward == "model" else task_scores
        values = None
        if self.critic is not None:
            critic = self._at_version(self.stale_critic, self.critic_versions, step, cfg.tau_critic)
            values = response_forward(critic, rollout.sequences, w.Lp, pads=pads).values
        elif cfg.shared_actor_critic:
            values = response_forward(gen_model, rollout.sequences, w.Lp, pads=pads).values
        exp = Experience(sequences=rollout.sequences, mask=rollout.mask, old_logprobs=rollout.logprobs,
                         ref_logprobs=ref_logp, scores=scores, values=values, pads=pads)
        logged = None if model_scores is None or cfg.reward == "model" else float(model_scores.mean())
        return exp, task_scores, accuracy_sums(scored), logged

    def train(self, exp: Experience) -> dict[str, float]:
        """Actor (or shared actor-critic) and critic training vertices on the whole batch."""
        cfg = self.cfg

        def actor_step(e: Experience, n: float) -> tuple[dict[str, float], float]:
            loss, stats = actor_loss(self.actor, e, cfg.rl, n)
            loss.backward()
            return stats, self.actor_master.step(cfg.rl)

        stats, norm = minibatch_steps(cfg.rl, exp, 0, len(exp), actor_step, counts=("clipped_tokens",))
        metrics = dict(stats, actor_grad_norm=norm, clip_frac=stats["clipped_tokens"] / exp.num_tokens)
        if self.critic is not None:
            def critic_step(e: Experience, n: float) -> tuple[dict[str, float], float]:
                vl = critic_loss(self.critic, e, cfg.rl, n)
                vl.backward()
                return {"value_loss": vl.item()}, self.critic_master.step(cfg.rl)

            stats, norm = minibatch_steps(cfg.rl, exp, 0, len(exp), critic_step)
            metrics.update(value_loss=stats["value_loss"], critic_grad_norm=norm)
        keep = max(cfg.tau_actor, cfg.tau_critic)
        self.actor_versions.publish(export_weights(self.actor), keep)
        if self.critic is not None:
            self.critic_versions.publish(export_weights(self.critic), keep)
        return metrics

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        exp, task_scores, (acc_sum, acc_n), model_score = self.collect(step)
        w = self.cfg.workload
        exp, task_scores, found = keep_drawn(exp, task_scores, w)
        exp = compute_advantages(exp, self.cfg.rl, w.R)
        kl = token_kl(exp)
        metrics = {"step": float(step), "reward": float(task_scores.mean()), "score": float(exp.scores.mean()),
                   **({} if kl is None else {"kl": float((kl * exp.mask).sum() / exp.num_tokens)}),
                   "reward_std": float(task_scores.double().std(unbiased=False)),
                   "response_length": float(exp.num_tokens) / task_scores.numel(),
                   "response_tokens": float(exp.num_tokens)}
        if acc_n:
            metrics["accuracy"] = acc_sum / acc_n
        if model_score is not None:
            metrics["reward_model_score"] = model_score
        if w.oversample > 1:
            metrics["informative_groups"] = float(found.sum()) / w.B
        metrics.update(self.train(exp))
        metrics["time_s"] = time.perf_counter() - t0
        return metrics

    def weights(self) -> dict[str, dict[str, Tensor]]:
        """The float32 master weights of the trained models (not their serving copies)."""
        out = {"actor": self.actor_master.export()}
        if self.critic is not None:
            out["critic"] = self.critic_master.export()
        return out
