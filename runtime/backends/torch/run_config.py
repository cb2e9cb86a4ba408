"""The run's configuration (`RunConfig`): the workload, the models' architectures and checkpoints, the RL and data
settings and the reward, as the torch backend's workers and the single-process reference oracle read them; built from
a program (`program_config`, `config_from_program`) or for the toy task (`toy_config`), and checked before anything
runs (`check_run_config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc, RpegError
from rpegc.core.ir.frozen import loc_field
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import Arch, Program, Workload
from rpegc.core.ir.training import TrainSpec
from rpegc.runtime.backends.torch.model.transformer import NetOptions, serving_dtype
from rpegc.runtime.backends.torch.rl.step import RLConfig
from rpegc.runtime.backends.torch.model.master_weights import training_dtype
from rpegc.runtime.backends.torch.rl.algorithms import Algorithm, algorithm
from rpegc.runtime.backends.torch.rl.datasets import DataConfig, check_data_config
from rpegc.runtime.backends.torch.rl.rewards import NOT_FUNCTIONS, load_reward, probe_reward


@dataclass(frozen=True)
class RunConfig:
    """What one RL run needs, independent of the execution plan.

    `critic` is the separate critic's arch (PPO); `shared_actor_critic` makes the actor one
    actor_critic model with both heads instead. `reward` is "rule" (the verifiable toy `task`), "model"
    (a frozen reward model of `reward_arch`; its score is still logged next to the rule's), or a reward
    function of the response text (rewards.py: a built-in, module:function, file.py:function) scoring the
    prompts of the dataset `data` names (`data.path` None: the toy `task`'s random prompts). A graph's reward model
    runs whichever score trains, as its plan prices it (its mean score is then logged as reward_model_score).
    `workload.dtype` sets `serving_dtype` (published copies and generation/inference forwards) and
    `training_dtype` (bf16 mixed precision or float32; fp16 is refused for training). `*_hf` name the checkpoints of models given as `hf = "DIR"`.
    """

    algorithm: str  # the registered algorithm (algorithms/): ppo, grpo, dpo, a GRPO variant or a plugin's
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
    # Hugging Face checkpoint directories version 0 of each model is read from (None: built from the seed)
    actor_hf: Optional[str] = None
    reference_hf: Optional[str] = None
    critic_hf: Optional[str] = None
    reward_hf: Optional[str] = None
    # the precision the plan trains the actor and the critic in (core/ir/training.py; None: the workload's)
    actor_precision: Optional[str] = None
    critic_precision: Optional[str] = None
    # whether an inference vertex of a reference model writes ref_logprobs; without one (TRL's beta = 0) no process
    # builds or runs the reference, and the run has no KL term (`RolloutAlgorithm.check` refuses settings asking one)
    has_reference: bool = True
    # the graph in the source, where the errors of the run's settings against its graph point (the checkpoint
    # identity leaves every `loc` out: where the graph is written does not change the run)
    loc: Loc = loc_field()

    @property
    def alg(self) -> Algorithm:
        """What its vertices compute."""
        return algorithm(self.algorithm)

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
    alg = cfg.alg
    if cfg.rl.algorithm != alg.family:
        raise RpegError(None, f"run algorithm '{cfg.algorithm}' but RL config for '{cfg.rl.algorithm}'; "
                        "build the RL config with default_rl_config(algorithm)")
    alg.rl_config(**{f.name: getattr(cfg.rl, f.name) for f in fields(cfg.rl)})  # the settings' checks
    if cfg.shared_actor_critic and cfg.critic is not None:
        raise RpegError(None, "a shared actor_critic model replaces the separate critic; keep only one of them")
    alg.check(cfg)
    check_data_config(cfg.data)
    if cfg.data.path is not None and cfg.data.tokenizer is None:
        raise RpegError(None, f"dataset {cfg.data.path} needs a tokenizer: give the actor an hf checkpoint "
                        "directory (its tokenizer is used) or set data.tokenizer")
    if alg.generates:
        check_reward(cfg)
    if min(cfg.tau_actor, cfg.tau_critic) < 0:
        raise RpegError(None, "staleness bounds must be >= 0")
    w = cfg.workload
    if min(w.B, w.R, w.Lp, w.Lr) < 1:
        raise RpegError(w.loc, f"workload needs B, R, Lp, Lr >= 1, got {w.B}, {w.R}, {w.Lp}, {w.Lr}")
    rows = alg.step_rows(w)
    if cfg.rl.ppo_minibatches > rows:
        raise RpegError(None, f"ppo_minibatches = {cfg.rl.ppo_minibatches} exceeds the {rows} {alg.row_noun()} of a "
                        f"step; use at most {rows}")
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
    """The run a `.rpeg` program describes (`program_config`), checked."""
    cfg = program_config(program, rl=rl, task=task, reward=reward, positions=positions, data=data)
    check_run_config(cfg)
    return cfg


def program_config(program: Program, *, rl: Optional[RLConfig] = None, task: str = "pattern",
                   reward: str = "rule", positions: str = "rope",
                   data: DataConfig = DataConfig()) -> RunConfig:
    """The run a `.rpeg` program describes, under the algorithm its graph names (`rpeg.algorithm`), else the one
    its shape implies: PPO if it has a critic or actor_critic model, DPO if it generates nothing (it trains on
    given pairs), else GRPO. A dataset without its own tokenizer directory takes the actor's `hf`
    checkpoint's. Not checked as a whole: whoever overrides its RL settings (backend.run_config) checks the result,
    so a graph without a reference is not refused for the default KL coefficient that --rl kl_coef=0 replaces."""
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
    name = named or ("ppo" if shared or critic else "grpo" if generates else "dpo")
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

    cfg = RunConfig(algorithm=name, actor=actor[0].arch, workload=program.workload,
                    rl=rl or algorithm(name).rl_config(), critic=critic[0].arch if critic else None,
                    shared_actor_critic=shared, reward=reward,
                    reward_arch=reward_model[0].arch if reward_model else None, task=task,
                    positions=positions, tau_actor=tau_actor, tau_critic=tau_critic, data=data,
                    algorithm_inferred=named is None, actor_hf=hf(actor),
                    reference_hf=hf(by_kind.get("reference")) if "reference" in by_kind else hf(actor),
                    critic_hf=hf(critic), reward_hf=hf(reward_model),
                    actor_precision=_trained_precision(program, actor[0].name),
                    critic_precision=_trained_precision(program, critic[0].name) if critic else None,
                    has_reference=_has_reference(program), loc=graph.loc if graph else UNKNOWN_LOC)
    return cfg


def _has_reference(program: Program) -> bool:
    """Whether an inference vertex of a reference model writes the reference's log-probs. A program without a graph
    (or with an empty one) is a whole PPO / GRPO run, which has one, as `toy_config`'s runs do."""
    graph = program.graph
    if graph is None or not graph.vertices:
        return True
    return any(v.role == "inference" and program.model(v.model).kind == "reference" for v in graph.vertices)


def _trained_precision(program: Program, model: str) -> Optional[str]:
    """The precision the plan trains `model` in (its training vertex's placement, over the workload's)."""
    if program.graph is None or program.plan is None:
        return None
    placed = {pl.vertex: pl for pl in program.plan.placements}
    for v in program.graph.vertices:
        if v.role == "training" and v.model == model and v.name in placed:
            return program.workload.training(placed[v.name].strategy.train, placed[v.name].loc).precision
    return None


def toy_rl_config(name: str, **overrides) -> RLConfig:
    """Algorithm `name`'s settings (App. B's defaults, a variant's paper's) except the learning rate: 1e-6 is for
    8B-70B models; the tiny toy actor needs 5e-3 (measured: 1e-2 learns faster but GRPO then often collapses onto a partial pattern)."""
    lr = {"lr_actor": 5e-3, "lr_critic": 5e-3}
    lr.update(overrides)
    return algorithm(name).rl_config(**lr)


def toy_config(name: str, *, B: Optional[int] = None, R: Optional[int] = None, Lp: int = 4, Lr: int = 6,
               shared_actor_critic: bool = False, task: str = "pattern", positions: str = "learned",
               dtype: str = "fp32", **rl_overrides) -> RunConfig:
    """The demo run: the `tiny` preset learning a verifiable `task`; by default 64 sequences per step for GRPO
    (B = 16 prompts x R = 4 rollouts) and 32 for PPO (B = 32, R = 1). Learned positions: with RoPE the
    tiny actor cannot tell response positions apart and stalls on a partial pattern."""
    tiny = lookup("tiny")
    family = algorithm(name).family
    R = R if R is not None else (4 if family == "grpo" else 1)
    B = B if B is not None else (16 if family == "grpo" else 32)
    critic = tiny if family == "ppo" and not shared_actor_critic else None
    cfg = RunConfig(algorithm=name, actor=tiny, workload=Workload(B=B, R=R, Lp=Lp, Lr=Lr, dtype=dtype),
                    rl=toy_rl_config(name, **rl_overrides), critic=critic,
                    shared_actor_critic=shared_actor_critic, task=task, positions=positions)
    check_run_config(cfg)
    return cfg
