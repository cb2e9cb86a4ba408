"""The single-process reference trainer: whole-batch PPO / GRPO steps, the oracle for the torch backend.

Paper Sec. II (the RL step: generation, reference/old log-probs, reward, values, advantages, actor and
critic updates), Sec. IV (bounded staleness: a consumer at step k uses version max(0, k - tau(m)))
and App. B (hyper-parameters). Every stage is one of the functions in `generation` and `rl`, called
on the whole batch; a distributed worker calls the same functions on its shard with the global token
count, so at tau = 0 any legal plan must reproduce `run_reference` within float tolerance.

Seeds: model weights from `derive_seed(seed, role)` (the reference model shares the actor's seed, so
it is the initial actor), or version 0 read from a model's Hugging Face checkpoint (`hf.initial_model`);
prompts from the prompt source's `batch(B, seed, k)` (a toy task's random prompts or a dataset's seeded
epochs, runtime/backends/torch/datasets.py); sampling from `sequence_seed(seed, k, g)` for global sequence g.

Precision (`workload.dtype`, through `models.serving_dtype` and `master_weights.training_dtype`): trained
models compute in the training dtype over float32 master weights and float32 Adam state (bf16 mixed precision
for a bf16 workload, float32 for fp32). Every published version is a copy of the working weights in the
serving dtype, and the models that serve generation and inference (the stale actor/critic, the reference and
reward models) run their forward in that dtype; their heads return float32, so sampling, log-probs and the
losses are float32. The workers cast in the same places, so tau = 0 equivalence holds in bf16 too, step by
step: from the same serving copy, DP/PP serving splits rows only (on the CPU kernel paths tested, a
sequence's bf16 forward does not depend on its call's row count), TP sums partial products in another order;
bf16 training sums its bf16 gradients over microbatches and replicas in another order (tests/test_torch_bf16.py
derives the bounds). Across steps it does not compound: a published copy is bf16(master), a discontinuous
function of a master known to rounding noise only, so an independently trained reference may serve copies one
bf16 ulp apart in a few entries from step 1 on (tests/test_torch_bf16.py compares each step from the run's own
checkpoint).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import ALGORITHM_FAMILIES, Arch, Program, Workload
from rpegc.core.ir.training import TrainSpec
from rpegc.runtime.backends.torch.generation import expand_rollouts, generate
from rpegc.runtime.backends.torch.hf import initial_model
from rpegc.runtime.backends.torch.models import (NetOptions, TransformerModel, cast_weights, derive_seed,
                                                export_weights, install_weights, serving_dtype)
from rpegc.runtime.backends.torch.rl import (Experience, RLConfig, actor_loss, check_rl_config, compute_advantages,
                                            critic_loss, default_rl_config, kl_estimate, last_token_scores,
                                            minibatch_steps, response_forward)
from rpegc.runtime.backends.torch.master_weights import train_whole, training_dtype
from rpegc.runtime.backends.torch.algorithms import algorithm
from rpegc.runtime.backends.torch.algorithms.dpo import DPOTrainer
from rpegc.runtime.backends.torch.datasets import DataConfig, check_data_config
from rpegc.runtime.backends.torch.prompts import open_prompts
from rpegc.runtime.backends.torch.rewards import (NOT_FUNCTIONS, accuracy_sums, load_reward, probe_reward,
                                                  score_responses)


@dataclass(frozen=True)
class RunConfig:
    """What one RL run needs, independent of the execution plan.

    `critic` is the separate critic's arch (PPO); `shared_actor_critic` makes the actor one
    actor_critic model with both heads instead. `reward` is "rule" (the verifiable toy `task`), "model"
    (a frozen reward model of `reward_arch`; its score is still logged next to the rule's), or a reward
    function of the response text (rewards.py: a built-in, module:function, file.py:function) scoring the
    prompts of the dataset `data` names (`data.path` None: the toy `task`'s random prompts).
    `workload.dtype` sets `serving_dtype` (published copies and generation/inference forwards) and
    `training_dtype` (bf16 mixed precision or float32; fp16 is refused for training). `*_hf` name the checkpoints of models given as `hf = "DIR"`.
    """

    algorithm: str  # the family: ppo, grpo or dpo
    actor: Arch
    workload: Workload
    rl: RLConfig
    critic: Optional[Arch] = None
    shared_actor_critic: bool = False
    reward: str = "rule"
    reward_arch: Optional[Arch] = None
    task: str = "pattern"
    positions: str = "rope"
    tau_actor: int = 0
    tau_critic: int = 0
    data: DataConfig = DataConfig()
    algorithm_inferred: bool = False  # the graph names no algorithm (rpeg.algorithm): the runtime warns
    variant: Optional[str] = None  # the GRPO variant the graph names (rl.VARIANT_SETTINGS), None for the family itself
    # Hugging Face checkpoint directories version 0 of each model is read from (None: built from the seed)
    actor_hf: Optional[str] = None
    reference_hf: Optional[str] = None
    critic_hf: Optional[str] = None
    reward_hf: Optional[str] = None
    # the precision the plan trains the actor and the critic in (core/ir/training.py; None: the workload's)
    actor_precision: Optional[str] = None
    critic_precision: Optional[str] = None

    @property
    def reward_function(self) -> bool:
        return self.reward not in NOT_FUNCTIONS

    @property
    def has_rule(self) -> bool:
        """Whether a verifier (the toy rule or a reward function) scores responses; with a dataset and a
        reward model there is none, and the model's score is also the logged reward."""
        return self.reward_function or self.data.path is None

    @property
    def net(self) -> NetOptions:
        """The options every model of the run shares; each model's MLP is its arch's (`models.arch_net`)."""
        return NetOptions(max_seq=self.workload.Lp + self.workload.Lr, positions=self.positions)

    @property
    def has_critic(self) -> bool:
        return self.critic is not None or self.shared_actor_critic

    @property
    def serving_dtype(self) -> torch.dtype:
        return serving_dtype(self.workload)

    def training_dtype(self, trained: str = "actor") -> torch.dtype:
        """The dtype the actor (or the critic) trains in."""
        precision = self.actor_precision if trained == "actor" else self.critic_precision
        return training_dtype(self.workload, self.workload.training(TrainSpec(precision=precision)))


def check_run_config(cfg: RunConfig) -> None:
    check_rl_config(cfg.rl)
    if cfg.rl.algorithm != cfg.algorithm:
        raise RpegError(None, f"run algorithm '{cfg.algorithm}' but RL config for '{cfg.rl.algorithm}'; "
                        "build the RL config with default_rl_config(algorithm)")
    if cfg.shared_actor_critic and cfg.critic is not None:
        raise RpegError(None, "a shared actor_critic model replaces the separate critic; keep only one of them")
    algorithm(cfg.algorithm).check(cfg)
    check_data_config(cfg.data)
    if cfg.data.path is not None and cfg.data.tokenizer is None:
        raise RpegError(None, f"dataset {cfg.data.path} needs a tokenizer: give the actor an hf checkpoint "
                        "directory (its tokenizer is used) or set data.tokenizer")
    if algorithm(cfg.algorithm).generates:
        check_reward(cfg)
    if min(cfg.tau_actor, cfg.tau_critic) < 0:
        raise RpegError(None, "staleness bounds must be >= 0")
    w = cfg.workload
    if min(w.B, w.R, w.Lp, w.Lr) < 1:
        raise RpegError(w.loc, f"workload needs B, R, Lp, Lr >= 1, got {w.B}, {w.R}, {w.Lp}, {w.Lr}")
    rows = w.B if cfg.algorithm == "dpo" else w.B * w.R
    if cfg.rl.ppo_minibatches > rows:
        raise RpegError(None, f"ppo_minibatches = {cfg.rl.ppo_minibatches} exceeds the {rows} "
                        f"{'pairs' if cfg.algorithm == 'dpo' else 'sequences'} of a step; use at most {rows}")
    serving_dtype(w)  # an unsupported dtype fails here, before any worker starts
    cfg.training_dtype("actor")
    cfg.training_dtype("critic")


def check_reward(cfg: RunConfig) -> None:
    """The reward source of a rollout algorithm against its prompts."""
    if cfg.reward == "rule" and cfg.data.path is not None:
        raise RpegError(None, "--reward rule is the toy tasks' token rule; score a dataset's responses with a reward "
                        "function: --reward math, exact_match, module:function or file.py:function")
    if cfg.reward_function and cfg.data.path is None:
        raise RpegError(None, f"--reward {cfg.reward} scores response text; give it a dataset of prompts (--data FILE)")
    if cfg.reward_function:
        probe_reward(cfg.reward)  # one that hangs or ends its process at import, in a child process first
        load_reward(cfg.reward)  # an unknown or broken function fails here, before any worker starts
    if cfg.reward == "model" and cfg.reward_arch is None:
        raise RpegError(None, "reward = 'model' needs a reward model architecture")


def config_from_program(program: Program, *, rl: Optional[RLConfig] = None, task: str = "pattern",
                        reward: str = "rule", positions: str = "rope",
                        data: DataConfig = DataConfig()) -> RunConfig:
    """The run a `.rpeg` program describes, under the algorithm its graph names (`rpeg.algorithm`), else the one
    its shape implies: PPO if it has a critic or actor_critic model, DPO if it generates nothing (it trains on
    given pairs), else GRPO. A dataset without its own tokenizer directory takes the actor's `hf`
    checkpoint's."""
    by_kind: dict[str, list] = {}
    for m in program.models:
        by_kind.setdefault(m.kind, []).append(m)
    for kind, ms in by_kind.items():
        if len(ms) > 1:
            raise RpegError(ms[1].loc, f"the torch backend runs one {kind} model, found {len(ms)} "
                            f"({', '.join(m.name for m in ms)}); keep one")
    shared = "actor_critic" in by_kind
    if shared and "policy" in by_kind:
        raise RpegError(by_kind["policy"][0].loc, "a shared actor_critic model replaces the policy; "
                        "keep only one of them")
    actor = by_kind.get("actor_critic", by_kind.get("policy"))
    if not actor:
        raise RpegError(None, "the program has no policy or actor_critic model to train; add one")
    for ref in by_kind.get("reference", []):
        if ref.arch != actor[0].arch:
            raise RpegError(ref.loc, f"reference model '{ref.name}' must have the architecture of "
                            f"'{actor[0].name}': it is the initial actor (the KL anchor); give both the same arch")
    critic = by_kind.get("critic")
    generates = (program.graph is None or not program.graph.vertices
                 or any(v.role == "generation" for v in program.graph.vertices))
    named = program.graph.algorithm if program.graph is not None else None
    name = ALGORITHM_FAMILIES[named] if named else ("ppo" if shared or critic else "grpo" if generates else "dpo")
    reward_model = by_kind.get("reward")
    if reward == "model" and not reward_model:
        raise RpegError(None, "reward = 'model' needs a model of kind reward in the program")
    graph = program.graph
    tau_actor = graph.tau(actor[0].name) if graph else 0
    tau_critic = graph.tau(critic[0].name) if graph and critic else tau_actor if shared else 0
    if data.path is not None and data.tokenizer is None and actor[0].hf is not None:
        data = replace(data, tokenizer=actor[0].hf)
    def hf(models) -> Optional[str]:
        return os.path.abspath(models[0].hf) if models and models[0].hf is not None else None

    variant = named if named != name else None
    cfg = RunConfig(algorithm=name, variant=variant, actor=actor[0].arch, workload=program.workload,
                    rl=rl or default_rl_config(name, variant), critic=critic[0].arch if critic else None,
                    shared_actor_critic=shared, reward=reward,
                    reward_arch=reward_model[0].arch if reward_model else None, task=task,
                    positions=positions, tau_actor=tau_actor, tau_critic=tau_critic, data=data,
                    algorithm_inferred=named is None, actor_hf=hf(actor),
                    reference_hf=hf(by_kind.get("reference")) if "reference" in by_kind else hf(actor),
                    critic_hf=hf(critic), reward_hf=hf(reward_model),
                    actor_precision=_trained_precision(program, actor[0].name),
                    critic_precision=_trained_precision(program, critic[0].name) if critic else None)
    check_run_config(cfg)
    return cfg


def _trained_precision(program: Program, model: str) -> Optional[str]:
    """The precision the plan trains `model` in (its training vertex's placement, over the workload's)."""
    if program.graph is None or program.plan is None:
        return None
    placed = {pl.vertex: pl for pl in program.plan.placements}
    for v in program.graph.vertices:
        if v.role == "training" and v.model == model and v.name in placed:
            return program.workload.training(placed[v.name].strategy.train, placed[v.name].loc).precision
    return None


def toy_rl_config(algorithm: str, variant: Optional[str] = None, **overrides) -> RLConfig:
    """App. B defaults (and a GRPO `variant`'s settings) except the learning rate: 1e-6 is for 8B-70B models; the
    tiny toy actor needs 5e-3 (measured: 1e-2 learns faster but GRPO then often collapses onto a partial pattern)."""
    lr = {"lr_actor": 5e-3, "lr_critic": 5e-3}
    lr.update(overrides)
    return default_rl_config(algorithm, variant, **lr)


def toy_config(algorithm: str, *, B: Optional[int] = None, R: Optional[int] = None, Lp: int = 4, Lr: int = 6,
               shared_actor_critic: bool = False, task: str = "pattern", positions: str = "learned",
               dtype: str = "fp32", **rl_overrides) -> RunConfig:
    """The demo run: the `tiny` preset learning a verifiable `task`; by default 64 sequences per step for GRPO
    (B = 16 prompts x R = 4 rollouts) and 32 for PPO (B = 32, R = 1). Learned positions: with RoPE the
    tiny actor cannot tell response positions apart and stalls on a partial pattern."""
    tiny = lookup("tiny")
    R = R if R is not None else (4 if algorithm == "grpo" else 1)
    B = B if B is not None else (16 if algorithm == "grpo" else 32)
    critic = tiny if algorithm == "ppo" and not shared_actor_critic else None
    cfg = RunConfig(algorithm=algorithm, actor=tiny, workload=Workload(B=B, R=R, Lp=Lp, Lr=Lr, dtype=dtype),
                    rl=toy_rl_config(algorithm, **rl_overrides), critic=critic,
                    shared_actor_critic=shared_actor_critic, task=task, positions=positions)
    check_run_config(cfg)
    return cfg


@dataclass
class ReferenceResult:
    """Per-step metrics and the final weights of every trained model ("actor", "critic")."""

    metrics: list[dict[str, float]]
    weights: dict[str, dict[str, Tensor]] = field(default_factory=dict)


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

    def __init__(self, cfg: RunConfig, seed: int):
        check_run_config(cfg)
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
        self.reference = serving_model(cfg.actor, "reference", actor_seed, cfg.reference_hf)
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
        if cfg.reward == "model":
            self.reward_model = serving_model(cfg.reward_arch, "reward", derive_seed(seed, "reward"), cfg.reward_hf)

    def _at_version(self, model: TransformerModel, store: VersionStore, step: int, tau: int) -> TransformerModel:
        _, weights = store.for_step(step, tau)
        install_weights(model, weights)
        return model

    @torch.no_grad()
    def collect(self, step: int) -> tuple[Experience, Tensor, tuple[float, int]]:
        """Generation and inference vertices of step k: (experience, the verifier's scores, the (sum, count)
        of the accuracies the reward function gave)."""
        cfg, w = self.cfg, self.cfg.workload
        batch = self.prompts.batch(w.B, self.seed, step)
        prompts = expand_rollouts(batch.tokens, w.R)
        pads = None if batch.pads is None else expand_rollouts(batch.pads, w.R)
        gen_model = self._at_version(self.stale_actor, self.actor_versions, step, cfg.tau_actor)
        rollout = generate(gen_model, prompts, range(w.B * w.R), seed=self.seed, step=step, max_new_tokens=w.Lr,
                           sampling=cfg.rl.sampling, eos_id=self.prompts.eos_id, pad_id=self.prompts.pad_id,
                           pads=pads)
        ref_logp = response_forward(self.reference, rollout.sequences, w.Lp, cfg.rl.temperature, pads=pads).logprobs
        scored = None
        if self.reward_model is not None:
            scores = last_token_scores(self.reward_model, rollout.sequences, w.Lp, rollout.mask, pads)
        if cfg.has_rule:
            task_scores, scored = score_responses(self.prompts, self.reward_fn, batch, rollout.sequences,
                                                  rollout.mask, range(w.B * w.R), w.R)
        else:
            task_scores = scores
        if self.reward_model is None:
            scores = task_scores
        values = None
        if self.critic is not None:
            critic = self._at_version(self.stale_critic, self.critic_versions, step, cfg.tau_critic)
            values = response_forward(critic, rollout.sequences, w.Lp, pads=pads).values
        elif cfg.shared_actor_critic:
            values = response_forward(gen_model, rollout.sequences, w.Lp, pads=pads).values
        exp = Experience(sequences=rollout.sequences, mask=rollout.mask, old_logprobs=rollout.logprobs,
                         ref_logprobs=ref_logp, scores=scores, values=values, pads=pads)
        return exp, task_scores, accuracy_sums(scored)

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
        exp, task_scores, (acc_sum, acc_n) = self.collect(step)
        exp = compute_advantages(exp, self.cfg.rl, self.cfg.workload.R)
        kl = kl_estimate(exp.old_logprobs, exp.ref_logprobs, "k1")
        metrics = {"step": float(step), "reward": float(task_scores.mean()), "score": float(exp.scores.mean()),
                   "kl": float((kl * exp.mask).sum() / exp.num_tokens),
                   "reward_std": float(task_scores.double().std(unbiased=False)),
                   "response_length": float(exp.num_tokens) / task_scores.numel(),
                   "response_tokens": float(exp.num_tokens)}
        if acc_n:
            metrics["accuracy"] = acc_sum / acc_n
        metrics.update(self.train(exp))
        metrics["time_s"] = time.perf_counter() - t0
        return metrics

    def weights(self) -> dict[str, dict[str, Tensor]]:
        """The float32 master weights of the trained models (not their serving copies)."""
        out = {"actor": self.actor_master.export()}
        if self.critic is not None:
            out["critic"] = self.critic_master.export()
        return out


def run_reference(cfg: RunConfig, steps: int, seed: int) -> ReferenceResult:
    """Run `steps` RL steps from scratch; per-step metrics and the final weights."""
    trainer = DPOTrainer(cfg, seed) if cfg.algorithm == "dpo" else ReferenceTrainer(cfg, seed)
    metrics = [trainer.step(k) for k in range(steps)]
    return ReferenceResult(metrics=metrics, weights=trainer.weights())
