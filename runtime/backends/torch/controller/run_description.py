"""One run of the torch backend, described once when it starts (`describe_run`): the run's configuration (what
the program, the RL settings, the dataset and the reward say), the models as the workers build them, which rank
runs each device and which host cores it gets, the fields each vertex writes, the routes of every node's commands,
the fusions and the cost model's memory of every device. The controller side reads it (the memory check, dispatch,
the nodes in flight, exports, the trackers' config, the summary's peaks, the notes) and the worker setup is made
from it. Its configuration is derived once per program and shared with what reads it before the run starts (the
trace header, a resume's identity check: `TorchBackend.config`). The generic controller (runtime/controller.py)
reads the backend-neutral part, the RunPlan (`plan`): the nodes, their order and the artifacts' producers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from rpegc.core.cost.residency import DeviceMemory
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import VERIFY, Program
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.controller.memory_check import plan_memory, predicted_peaks
from rpegc.runtime.backends.torch.controller.pinning import core_slots
from rpegc.runtime.backends.torch.controller.routing import Routes
from rpegc.runtime.backends.torch.model.transformer import derive_seed, param_shapes
from rpegc.runtime.backends.torch.rl.algorithms import ALGORITHMS, Algorithm, algorithm
from rpegc.runtime.backends.torch.rl.datasets import DataConfig
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.run_config import RunConfig, check_run_config, program_config, toy_rl_config
from rpegc.runtime.plan import RunPlan


@dataclass(frozen=True)
class RunSettings:
    """What the backend's options say of the run itself (the rest of rpeg-run's options say how it runs)."""

    seed: int = 0  # draws version 0 of every model and every sampling generator
    task: str = "pattern"  # the built-in toy task without a dataset
    reward: Optional[str] = None  # --reward: what the reward vertex scores with (None: the plan's or the rule)
    lr: Optional[float] = None  # --lr: both learning rates, over the RL settings
    rl: tuple[tuple[str, object], ...] = ()  # --rl-config / --rl: RLConfig fields
    data: tuple[tuple[str, object], ...] = ()  # the dataset's rules: DataConfig fields

    def config(self, program: Program) -> RunConfig:
        return run_config(program, task=self.task, reward=self.reward, lr=self.lr, rl=dict(self.rl),
                          data=dict(self.data))


@dataclass(frozen=True)
class RunDescription:
    """A run of `plan` as the torch backend executes it, computed once (`describe_run`)."""

    plan: RunPlan
    cfg: RunConfig  # the workload, the models' architectures, the RL, data and reward settings
    models: dict  # model name -> ModelSpec: what each worker builds
    shapes: dict  # model name -> parameter name -> shape
    fields: dict  # vertex -> the data fields it writes (the algorithm's)
    routes: Routes  # where each shard is held and the commands of every node (its holdings change as the run goes)
    fusion_of: dict  # member node -> its fusion
    core_slots: tuple[tuple[int, ...], ...]  # per rank, the host cores it gets
    memory: DeviceMemory  # the cost model's memory of every device: the memory check and the summary's peaks read it
    warnings: tuple[str, ...]  # what the run says before it starts (an algorithm the graph only implies)

    @property
    def predicted_peaks(self) -> dict[int, float]:
        """The cost model's peak of every model device, bytes (the memory check and the summary hold them)."""
        return predicted_peaks(self.memory, self.plan.model_devices)

    @property
    def program(self) -> Program:
        return self.plan.program

    @property
    def rank_of(self) -> dict[int, int]:
        return self.routes.rank_of

    @property
    def device_of(self) -> dict[int, int]:
        return {i: d for d, i in self.routes.rank_of.items()}


def describe_run(plan: RunPlan, settings: RunSettings, cfg: RunConfig) -> RunDescription:
    """The run of `plan` under its configuration `cfg` (`RunSettings.config`, derived once), a dataset's errors (a
    row, B, the tokenizer) found before any worker starts."""
    p = plan.program
    assert p.graph is not None and p.cluster is not None
    models, shapes = built_models(p, settings.seed, cfg)
    w = cfg.workload
    if cfg.data.path is not None:
        prompts = open_prompts(cfg.data, cfg.task, cfg.actor.vocab, w.Lp, w.Lr, pairs=not cfg.alg.generates)
        prompts.step_examples(w.drawn, settings.seed, 0)
    fields = cfg.alg.vertex_fields(p, cfg)
    warnings = ()
    if cfg.algorithm_inferred:
        warnings = (f"graph @{p.graph.name} names no algorithm; running {cfg.algorithm.upper()}, which its shape "
                    f"implies (add `rpeg.algorithm {cfg.algorithm}` to the graph)",)
    fusion_of = {m: f for f in p.exec.fusions for m in f.members} if p.exec is not None else {}
    return RunDescription(plan, cfg, models, shapes, fields, Routes(plan, cfg, models, shapes, fields), fusion_of,
                          plan_core_slots(plan), plan_memory(p), warnings)


def run_identity(plan: RunPlan, seed: int, cfg: RunConfig) -> dict:
    """What a checkpoint of a run of `plan` under `cfg` records and a resume must match (`shard_files.run_identity`)."""
    models, shapes = built_models(plan.program, seed, cfg)
    return ckpt.run_identity(seed, cfg, models, shapes, dict(plan.tau))


def run_config(program: Program, *, task: str = "pattern", reward: Optional[str] = None, lr: Optional[float] = None,
               positions: str = "learned", rl: Optional[dict] = None, data: Optional[dict] = None) -> RunConfig:
    """The RL run the torch backend executes for `program` (and the reference oracle must run).

    The tiny models learn with the toy learning rate (`run_config.toy_rl_config`) and learned positions;
    `rl` overrides fields of the RL config (e.g. {"adam_eps": 1e-6}), `data` fields of the DataConfig (e.g.
    {"path": "train.jsonl"}). Paths (dataset, tokenizer, a reward's file) are made absolute: workers may
    run elsewhere, from another directory.
    """
    # checked once its RL settings are final (below): a graph without a reference runs with --rl kl_coef=0
    cfg = program_config(program, task=task, reward=_absolute_reward(reward_spec(program, reward)),
                         positions=positions,
                         data=_absolute_paths(DataConfig(**(data or {}))))
    overrides = dict(rl or {})
    if lr is not None:
        overrides.update(lr_actor=lr, lr_critic=lr)
    if "algorithm" in overrides:  # another algorithm of the graph's family (--rl algorithm=dapo on a GRPO graph)
        cfg = dataclasses.replace(cfg, algorithm=_same_family(cfg.alg, overrides.pop("algorithm")))
    cfg = dataclasses.replace(cfg, rl=toy_rl_config(cfg.algorithm, **overrides))
    check_run_config(cfg)
    return cfg

def reward_spec(program: Program, reward: Optional[str]) -> str:
    """What the reward vertex scores with: the verifier a verify vertex runs (the plan priced it; --reward may only
    repeat it), else `reward` (--reward), else the toy tasks' rule."""
    verifiers = [v for v in (program.graph.vertices if program.graph else ()) if v.role == VERIFY]
    if not verifiers:
        return reward or "rule"
    if len(verifiers) > 1:
        raise RpegError(verifiers[1].loc, f"the torch backend runs one verify vertex, found {len(verifiers)}; keep one")
    fn = program.verifier(verifiers[0].model).fn
    if reward is not None and reward != fn:
        raise RpegError(verifiers[0].loc, f"--reward {reward}: the plan's verify vertex @{verifiers[0].name} runs "
                                          f"'{fn}' (rpeg.verifier @{verifiers[0].model}), and the plan is priced for "
                                          "it; change the verifier in the module and recompile, or drop --reward")
    return fn



def _same_family(graph: Algorithm, name: str) -> str:
    """`name`, if its algorithm has the graph's family (its shape)."""
    chosen = algorithm(name)
    if chosen.family != graph.family:
        raise RpegError(None, f"--rl algorithm={name}: {name} is of the {chosen.family.upper()} family, but the graph "
                              f"has {graph.family.upper()}'s shape (rpeg.algorithm {graph.name}); choose one of "
                              f"{', '.join(n for n, a in ALGORITHMS.items() if a.family == graph.family)}")
    return name


def _absolute_paths(data: DataConfig) -> DataConfig:
    return dataclasses.replace(data, **{k: os.path.abspath(getattr(data, k)) for k in ("path", "tokenizer")
                                        if getattr(data, k) is not None})


def _absolute_reward(spec: str) -> str:
    target, sep, name = spec.rpartition(":")
    return f"{os.path.abspath(target)}:{name}" if sep and target.endswith(".py") else spec


def built_models(p: Program, seed: int, cfg: RunConfig) -> tuple[dict[str, ModelSpec], dict]:
    """The models of `p` as the workers build them under `cfg` (`model_specs`) and their parameters' shapes."""
    models = model_specs(p, seed)
    return models, {m: param_shapes(s.arch, s.kind, s.net(cfg.net)) for m, s in models.items()}


def model_specs(p: Program, seed: int) -> dict[str, ModelSpec]:
    """The models of `p` as the workers build them (a checkpoint directory made absolute: workers may run
    elsewhere, from another directory)."""
    return {m.name: ModelSpec(m.name, m.kind, m.arch, model_seed(seed, m.kind),
                              hf=os.path.abspath(m.hf) if m.hf is not None else None) for m in p.models}


def model_seed(seed: int, kind: str) -> int:
    """Version-0 seed of a model, as the reference trainer draws it (the reference model is the initial actor)."""
    role = {"policy": "actor", "actor_critic": "actor", "reference": "actor", "critic": "critic",
            "reward": "reward"}[kind]
    return derive_seed(seed, role)


def plan_core_slots(plan: RunPlan) -> tuple[tuple[int, ...], ...]:
    """Per worker rank, the host cores (slots) the plan gives it (pinning.core_slots): one per device worker, and
    for the verifier pool's worker its processes' own and the ranks of the devices whose cores they share."""
    devices = len(plan.model_devices)
    verify = [n.node for n in plan.nodes if n.kind == "op" and n.node.pool is not None]
    if not verify:
        return core_slots(devices)
    shared = sorted({d for n in verify for d in n.shares})
    return core_slots(devices, max(n.pool for n in verify), tuple(plan.devices.index(d) for d in shared))


