"""The torch execution backend: real worker processes, models, RL math and transfers (paper Sec. VII,
Alg. 2; docs/architecture.md, Runtime; issue 8).

`TorchBackend` implements `rpegc.runtime.backends.base.Backend` for the completion-driven controller:
- `start` chooses the torch.distributed backend (`dist_backend`: gloo on CPUs, nccl with one GPU per
  worker, auto = nccl when every worker gets a GPU; `device.choose_dist_backend`), and has its
  `WorkerPool` (pool.py: processes, the authenticated control channel, health, stop) launch one
  persistent worker per device of the plan and send them the run setup, then waits until every worker
  has created the process groups of every vertex layout;
- `run_op` / `transfer` / `reshard` send a Dispatch's commands to the node's workers, built by
  `routing.Routes` with every route precomputed from where each artifact's shards are held; `wait`
  collects the workers' reports into Completions (start/finish on the wall clock, bytes moved, versions
  read and produced) and turns a worker error or death into a BackendError naming the node, the device
  and the worker;
- `install` loads version 0 (or, on resume, a checkpointed version) in the layout its readers use;
  `release` frees an artifact on its workers;
- checkpoints every N steps (weights, Adam state, step, RNG; `exports.Exports`) are written by the workers,
  each its own shards, straight into RUN_DIR/checkpoints/step-NNNNNN/ (checkpoints/shard_files.py: safetensors shards +
  an index the controller writes last; only file names, sizes and boxes travel through the control channel);
  `prepare` restricts the plan to the steps after the last checkpoint when resuming, under this plan or
  any other of the same run (workers reshard on load); at the end the workers write the final weights of
  every trained model to RUN_DIR/final/ the same way (`checkpoint.load_final`), which the controller then
  reads into `final_weights` (without a run directory, from a temporary directory it removes).

What the RL vertices compute is the run's algorithm's (algorithms/: by role, model kind and container):
under PPO and GRPO generation writes sequences + mask and the sampling log-probs; inference with the reference
model writes reference log-probs, with a critic values, with the reward model scores (the verifier by default,
or the frozen reward model with reward = "model"); training reads them all. Under DPO the reference scores
each side of the given preference pairs and training reads both.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from typing import ContextManager, Optional

import torch

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.rl.algorithms import ALGORITHMS, Algorithm, algorithm
from rpegc.core.ir.exec_graph import microtask_text
from rpegc.core.ir.program import VERIFY, Program
from rpegc.runtime.backends.base import Backend, BackendError, Completion, Dispatch
from rpegc.runtime.backends.torch.controller.options import TorchOptions
from rpegc.runtime.interrupt import stop_on_signals
from rpegc.runtime.report import host_cores
from rpegc.runtime.backends.torch.controller.inbox import warn
from rpegc.runtime.backends.torch.worker.peak_memory import WorkerPeak, peak_lines
from rpegc.runtime.backends.torch.controller.pinning import core_slots
from rpegc.runtime.backends.torch.controller.pool import WorkerPool
from rpegc.runtime.backends.torch.worker.sender import SENDER
from rpegc.runtime.backends.torch.controller.processes import stop_forkserver
from rpegc.runtime.metrics_log import MetricsLog
from rpegc.runtime.trackers import FAILED, FINISHED, KILLED, parse_log
from rpegc.runtime.plan import Artifact, RunPlan
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.controller.device import DIST_BACKEND_CHOICES, choose_dist_backend
from rpegc.runtime.backends.torch.checkpoints.exports import Exports
from rpegc.runtime.backends.torch.controller.routing import Command, Holding, Routes
from rpegc.runtime.backends.torch.checkpoints.run_dir import RunDirLock, check_fresh_run
from rpegc.runtime.backends.torch.model.transformer import derive_seed, param_shapes
from rpegc.runtime.backends.torch.parallel.tensor_parallel import TP_IMPLS
from rpegc.runtime.backends.torch.rl.datasets import DataConfig
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.run_config import RunConfig, check_run_config, program_config, toy_rl_config
from rpegc.runtime.backends.torch.worker.process import FAULT_ENV
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec, WorkerSetup

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


def unpriced_reward(program: Program, cfg: RunConfig) -> Optional[str]:
    """What a run whose reward vertex runs a reward model in the plan but a reward function in the run says: the plan
    prices the model's inference, the run calls the function (make it a verify vertex to price it). The toy tasks'
    rule, which the tiny examples' reward models stand for, costs microseconds and is not reported."""
    if not cfg.reward_function or program.graph is None:
        return None
    for v in program.graph.vertices:
        if v.role == "inference" and program.model(v.model).kind == "reward":
            return (f"the plan prices @{v.name} as the inference of reward model @{v.model}, but this run scores "
                    f"with '{cfg.reward}' instead, which the plan does not price; declare it as a verifier "
                    f"(rpeg.verifier @v {{fn = \"{cfg.reward}\"}}) and make @{v.name} a verify vertex")
    return None


def unpriced_passes(cfg: RunConfig) -> Optional[str]:
    """What a run whose training operators make more than one pass over their batch, or more than one optimizer step,
    says: the cost model prices one of each per training operator (the IR does not carry ppo_epochs and
    ppo_minibatches yet), so such a run's training takes longer than its plan says."""
    epochs, minibatches = cfg.rl.ppo_epochs, cfg.rl.ppo_minibatches
    if epochs == 1 and minibatches == 1:
        return None
    return (f"--rl ppo_epochs = {epochs}, ppo_minibatches = {minibatches}: each training operator makes {epochs} "
            f"pass(es) over its batch and {epochs * minibatches} optimizer step(s), but the plan prices one of each: "
            f"its training operators take about {epochs}x their predicted time, more with the extra steps")


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


@dataclass
class _Pending:
    """A node its ranks run. It starts when its last rank begins it (before, it cannot have begun on all
    its devices) and finishes when the last of its `ends` ranks finished."""

    dispatch: Optional[Dispatch]
    ranks: set[int]
    ends: frozenset[int] = frozenset()
    start: float = float("-inf")
    finish: float = float("-inf")
    bytes: int = 0
    versions_in: dict = field(default_factory=dict)
    versions_out: dict = field(default_factory=dict)
    since: float = 0.0  # when it could start: sent, or the last node it is chained after finished
    after: tuple[str, ...] = ()  # the nodes it is chained after
    microtasks: list = field(default_factory=list)  # a fused member's, as its ranks report them
    senders: frozenset[int] = frozenset()  # ranks that run it on their sender thread (a transfer's sources)


def plan_core_slots(plan: RunPlan) -> tuple[tuple[int, ...], ...]:
    """Per worker rank, the host cores (slots) the plan gives it (pinning.core_slots): one per device worker, and
    for the verifier pool's worker its processes' own and the ranks of the devices whose cores they share."""
    devices = len(plan.model_devices)
    verify = [n.node for n in plan.nodes if n.kind == "op" and n.node.pool is not None]
    if not verify:
        return core_slots(devices)
    shared = sorted({d for n in verify for d in n.shares})
    return core_slots(devices, max(n.pool for n in verify), tuple(plan.devices.index(d) for d in shared))


class TorchBackend(Backend):
    name = "torch"
    clock = "wall"
    # The scheduler's rule (spec 7): a transfer holds its destination; its source side runs on the source worker's
    # sender thread beside that worker's operators (sender.py). "endpoints" (Table III) holds both.
    default_reserve = "destination"

    def __init__(self, seed: int = 0, *, run_dir: Optional[str] = None, checkpoint_every: int = 0,
                 resume: bool = False, task: str = "pattern", reward: Optional[str] = None, lr: Optional[float] = None,
                 tp_impl: str = "auto", timeout_s: float = 120.0, fault: Optional[str] = None,
                 dist_backend: str = "gloo", rl: Optional[dict] = None, data: Optional[dict] = None,
                 launcher: str = "local",
                 store: Optional[str] = None, secret_file: Optional[str] = None, keep_checkpoints: int = 2,
                 memory_check: bool = True, control: str = "auto", overwrite: bool = False,
                 trackers: Optional[tuple[str, ...]] = None):
        if tp_impl not in ("auto",) + TP_IMPLS:
            raise RpegError(None, f"unknown tensor-parallel implementation '{tp_impl}'; use auto, megatron or torch")
        if checkpoint_every < 0:
            raise RpegError(None, f"--checkpoint-every must be >= 0, got {checkpoint_every}")
        if keep_checkpoints < 1:
            raise RpegError(None, f"--keep-checkpoints must be >= 1, got {keep_checkpoints}")
        if (checkpoint_every or resume) and not run_dir:
            raise RpegError(None, "checkpoints and --resume need a run directory; give --run-dir DIR")
        self.seed, self.run_dir, self.checkpoint_every, self.resume = seed, run_dir, checkpoint_every, resume
        self.keep_checkpoints = keep_checkpoints
        self.overwrite = overwrite  # a fresh run may replace an earlier run's state in run_dir
        self._lock = RunDirLock(run_dir) if run_dir else None
        self.memory_check = memory_check  # refuse a plan whose cost-model memory does not fit the workers
        self.task, self.reward, self.lr, self.tp_impl, self.timeout_s = task, reward, lr, tp_impl, timeout_s
        self.fault = fault if fault is not None else os.environ.get(FAULT_ENV) or None
        self.pool = WorkerPool(launcher=launcher, store=store, secret_file=secret_file, control=control,
                               run_dir=run_dir, timeout_s=timeout_s)
        if dist_backend not in DIST_BACKEND_CHOICES:
            raise RpegError(None, f"unknown distributed backend '{dist_backend}'; use {', '.join(DIST_BACKEND_CHOICES)}")
        self.dist_backend, self.launcher = dist_backend, launcher
        self._sender_threads = False  # set by start(): sources of transfers send on their sender thread (gloo)
        self.rl_overrides = dict(rl or {})
        self.data_settings = dict(data or {})
        self.reward_stats: dict[int, dict] = {}  # step -> a reward function's accuracy sums and failures
        self.first_reward_failure: Optional[str] = None
        self.metrics: dict[int, dict[str, float]] = {}
        self.exports: Optional[Exports] = None  # checkpoints and final weights, once started
        self.warnings: list[str] = []
        self._metrics_log: Optional[MetricsLog] = None  # RUN_DIR/metrics.jsonl
        self.trackers = trackers  # --log: where the metrics also go (runtime/trackers.py); None: the default
        self._resume_dir: Optional[str] = None
        self._resume_index: Optional[dict] = None
        self._failed = False
        self._interrupted = False  # SIGINT/SIGTERM: stop fast, write no final weights, reap the fork server
        self._stopped = True

    @classmethod
    def from_options(cls, o: TorchOptions) -> "TorchBackend":
        """The backend `rpeg-run --backend torch` builds from its options."""
        run_dir = o.resume or o.run_dir
        every = o.checkpoint_every
        if every is None:
            every = 1 if run_dir else 0
        from rpegc.runtime.backends.torch.rl.hyperparameters import rl_settings

        settings = rl_settings(o.rl_config, o.rl or (), None, o.data)
        return cls(seed=o.seed, rl=settings.rl, data=settings.data, run_dir=run_dir, checkpoint_every=every,
                   resume=bool(o.resume), lr=o.lr, tp_impl=o.tp_impl, reward=o.reward, task=o.task,
                   dist_backend=o.dist_backend, launcher="external" if o.store else "local", store=o.store,
                   secret_file=o.secret_file, keep_checkpoints=2 if o.keep_checkpoints is None else o.keep_checkpoints,
                   memory_check=not o.no_memory_check, overwrite=o.overwrite,
                   trackers=parse_log(o.log) if o.log is not None else None)

    # -- plan ------------------------------------------------------------------------------------

    def _run_config(self, program: Program) -> RunConfig:
        return run_config(program, task=self.task, reward=self.reward, lr=self.lr, rl=self.rl_overrides,
                          data=self.data_settings)

    def header_options(self, plan: RunPlan) -> dict:
        """What the trace header records: the worker processes launched here, the cores they share, the
        torch.distributed backend (gloo: CPU workers; nccl: a GPU each), and the effective RL
        hyper-parameters, prompts and reward of a run of `plan`."""
        cfg = self._run_config(plan.program)
        slots = {s for ss in plan_core_slots(plan) for s in ss}
        out = {"local_workers": len(slots) if self.launcher == "local" else 0, "host_cores": host_cores(),
               "dist_backend": self._resolve_dist_backend(plan), "rl": dataclasses.asdict(cfg.rl),
               "reward": cfg.reward}
        out["data"] = dataclasses.asdict(cfg.data) if cfg.data.path is not None else {"task": cfg.task}
        return out

    def tracker_config(self, plan: RunPlan, dist_backend: str, tp_impl: str) -> dict:
        """The run's config as the experiment trackers record it: the plan, its hash, the seed, the backend's
        settings and what the trace header records (RL hyper-parameters, prompts, reward)."""
        header = self.header_options(plan)
        return {"plan": os.path.abspath(plan.file), "plan_hash": plan.hash, "steps": plan.steps,
                "plan_steps": plan.plan_steps, "devices": len(plan.devices), "backend": self.name,
                "seed": self.seed, "algorithm": self.cfg.algorithm, "run_dir": os.path.abspath(self.run_dir or "."),
                "resumed": self.resume, "checkpoint_every": self.checkpoint_every,
                "keep_checkpoints": self.keep_checkpoints, "tp_impl": tp_impl, **header, "dist_backend": dist_backend}

    def stop_signals(self) -> ContextManager:
        """SIGINT/SIGTERM stop the run cleanly: the workers finish or drop their step (runtime/interrupt.py)."""
        return stop_on_signals(self)

    def last_checkpoint_step(self) -> Optional[int]:
        found = ckpt.complete_checkpoints(self.run_dir) if self.run_dir else []
        return found[-1][0] if found else None

    def prepare(self, plan: RunPlan) -> RunPlan:
        """On --resume: the plan from the last checkpoint's step on; otherwise the plan itself. The
        checkpoint may come from another plan of the same run (same identity: program, seed, options)."""
        self._claim_run_dir()
        if not self.resume:
            return plan
        assert self.run_dir is not None
        try:
            path, index = ckpt.find_resume_checkpoint(self.run_dir, self.identity(plan), plan)
        except BaseException:
            self._release_run_dir()
            raise
        self._resume_dir, self._resume_index = path, index
        self.metrics.update({int(k): v for k, v in index.get("metrics", {}).items()})
        return ckpt.resume_plan(plan, index["step"])

    def _claim_run_dir(self) -> None:
        """Lock the run directory for this run's life (once), before its state is read or replaced; a fresh run
        does not replace an earlier run's state unless told to (run_dir.py)."""
        if self._lock is None or self._lock.held:
            return
        self._lock.acquire()
        if not self.resume:
            try:
                check_fresh_run(self.run_dir, self.overwrite)
            except RpegError:
                self._release_run_dir()
                raise

    def _release_run_dir(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def identity(self, plan: RunPlan) -> dict:
        """What a checkpoint of this run records and a resume must match (`checkpoint.run_identity`)."""
        p = plan.program
        if getattr(self, "program", None) is p:  # started: from what `_analyse` computed once
            return ckpt.run_identity(self.seed, self.cfg, self.models, self.shapes, dict(plan.tau))
        cfg = self._run_config(p)
        models = model_specs(p, self.seed)
        shapes = {m: param_shapes(s.arch, s.kind, s.net(cfg.net)) for m, s in models.items()}
        return ckpt.run_identity(self.seed, cfg, models, shapes, dict(plan.tau))

    @property
    def resume_step(self) -> int:
        return self._resume_index["step"] if self._resume_index else 0

    def _analyse(self, plan: RunPlan) -> None:
        p = plan.program
        assert p.graph is not None and p.cluster is not None
        self.plan, self.program = plan, p
        self.cfg = self._run_config(p)
        self.models = model_specs(p, self.seed)
        self.shapes = {m: param_shapes(s.arch, s.kind, s.net(self.cfg.net)) for m, s in self.models.items()}
        w = self.cfg.workload
        if self.cfg.data.path is not None:  # a dataset's errors (a row, B, the tokenizer) before any worker starts
            prompts = open_prompts(self.cfg.data, self.cfg.task, self.cfg.actor.vocab, w.Lp, w.Lr,
                                   pairs=not self.cfg.alg.generates)
            prompts.step_examples(w.drawn, self.seed, 0)
        self.fields = self.cfg.alg.vertex_fields(p, self.cfg)
        if self.cfg.algorithm_inferred and not any(w.startswith("graph @") for w in self.warnings):
            self.warnings.append(f"graph @{p.graph.name} names no algorithm; running {self.cfg.algorithm.upper()}, "
                                 f"which its shape implies (add `rpeg.algorithm {self.cfg.algorithm}` to the graph)")
        self.routes = Routes(plan, self.cfg, self.models, self.shapes, self.fields)
        self.fusion_of = {m: f for f in p.exec.fusions for m in f.members} if p.exec is not None else {}
        self.rank_of = self.routes.rank_of
        self.device_of = {i: d for d, i in self.rank_of.items()}

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, plan: RunPlan) -> dict[int, int]:
        self._claim_run_dir()  # released by shutdown(), which the controller calls whatever start does
        dist_backend = self._resolve_dist_backend(plan)  # before anything is cleared or started
        # gloo's sends may come from a second thread (tags keep them apart); NCCL's would need their own stream and
        # an order matched on both sides, not built yet: there a transfer's sources send in their command loop.
        self._sender_threads = dist_backend == "gloo"
        from rpegc.runtime.backends.torch.controller.memory_check import check_memory, predicted_peaks

        if self.memory_check and self.launcher == "local":  # external workers run on hosts unseen from here
            self._predicted_peaks = check_memory(plan.program, plan.model_devices, dist_backend)
        else:
            self._predicted_peaks = predicted_peaks(plan.program, plan.model_devices)
        self._measured_what = "GPU allocator" if dist_backend == "nccl" else "the C heap's allocations"
        tp_impl = self._resolve_tp_impl(plan)
        # the fork server's imports (seconds) run while the plan, the models and the dataset are analysed
        self.pool.start_forkserver(tp_impl, hf=any(m.hf is not None for m in plan.program.models))
        self._analyse(plan)
        if self.run_dir and not self.resume:
            ckpt.clear_run_dir(self.run_dir)
        if self.run_dir:  # the trackers start here, before any worker does
            self._metrics_log = MetricsLog(self.run_dir, first_step=plan.first_step, trackers=self.trackers,
                                           config=self.tracker_config(plan, dist_backend, tp_impl))
        self._t0 = time.time()
        self._pending: dict[str, _Pending] = {}
        self._ready: list[Completion] = []
        self._mem: dict[int, float] = {}
        self._peak: dict[int, float] = {}
        self._completed = 0
        self.exports = Exports(plan, self.pool, self.routes, run_dir=self.run_dir, every=self.checkpoint_every,
                               keep=self.keep_checkpoints, identity=self.identity(plan), metrics=self.metrics,
                               resumed_at=self.resume_step if self._resume_index is not None else None)
        layouts = tuple(sorted(set(self.routes.layouts.values()), key=lambda L: (L.ranks, L.dp, L.pp, L.tp)))
        setup = WorkerSetup(world=len(plan.devices), seed=self.seed, run=self.cfg, models=self.models,
                            layouts=layouts, tp_impl=tp_impl, t0=self._t0, timeout_s=self.timeout_s,
                            dist_backend=dist_backend, fault=self.fault,
                            core_slots=plan_core_slots(plan) if self.launcher == "local" else None,
                            resume_file=os.path.abspath(self._resume_dir) if self._resume_dir else None)
        self._stopped = False  # from here on shutdown() must stop workers, even if the launch fails halfway
        self.pool.open(setup, tp_impl)
        for w in self.warnings:
            warn(w)
        self._await_ready(len(plan.devices))
        return dict(self.rank_of)

    def _resolve_dist_backend(self, plan: RunPlan) -> str:
        """gloo or nccl. Locally launched workers all run on this host, one GPU each under NCCL; externally
        launched ones run elsewhere and check their own GPUs, so here only auto looks at this host's GPUs
        (against a node of the plan's cluster: the controller usually shares a node with workers)."""
        here: Optional[int] = len(plan.devices)
        if self.launcher == "external":
            cluster = plan.program.cluster
            here = min(here, cluster.gpus) if self.dist_backend == "auto" and cluster is not None else None
        return choose_dist_backend(self.dist_backend, here, torch.cuda.device_count())

    def _resolve_tp_impl(self, plan: RunPlan) -> str:
        """megatron-core's TP layers when TP is used and megatron-core is installed (the workers import it)."""
        tp = any(n.kind == "op" and n.node.strategy is not None and n.node.strategy.tp > 1 for n in plan.nodes)
        if not tp or self.tp_impl == "torch":
            return "torch"
        import importlib.util

        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            why = "megatron-core is not installed"
            if self.tp_impl == "megatron":
                raise RpegError(None, f"--tp-impl megatron: {why}; install megatron-core 0.16.1 or use --tp-impl torch")
            self.warnings.append(f"{why}; tensor parallelism falls back to plain torch.distributed")
            return "torch"
        return "megatron"

    def _await_ready(self, world: int) -> None:
        ready: set[int] = set()
        deadline = time.time() + self.timeout_s
        while len(ready) < world:
            msg = self.pool.poll()
            if msg is None:
                self._check_workers()
                if time.time() > deadline:
                    where = (f"see the worker logs in {self.pool.log_dir}" if self.pool.log_dir else
                             "see the workers' own output (a worker without this run's secret file stops at once)")
                    self._fail(f"only {len(ready)} of {world} workers started within {self.timeout_s:.0f} s; {where}")
                continue
            if msg["type"] == "ready":
                ready.add(msg["rank"])
            else:
                self._on_message(msg)

    def now(self) -> float:
        return time.time() - self._t0

    # -- reports and health ----------------------------------------------------------------------------

    def _fail(self, message: str, loc=None) -> None:
        self._failed = True
        raise BackendError(loc, message)

    def _check_workers(self) -> None:
        exited = self.pool.exited()
        if exited is not None:
            r, rc = exited
            running = [p for p, pend in self._pending.items() if r in pend.ranks and not self._queued(pend)]
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            what = f"while running node {', '.join(running)}" if running else "while idle"
            why = "; SIGKILL comes from the kernel's out-of-memory killer or a kill -9" if rc == -signal.SIGKILL else ""
            self._fail(f"worker {r} (device {self.device_of.get(r, r)}) {how} {what}; the run stopped "
                       f"(log: {self.pool.log_path(r)}){why}")
        now = self.now()
        for node, pend in self._pending.items():
            if now - pend.since > self.timeout_s and not self._queued(pend):
                devs = sorted(self.device_of[r] for r in pend.ranks)
                self._fail(f"node {node} did not finish within {self.timeout_s:.0f} s on device(s) {devs}")

    def _on_message(self, msg: dict) -> None:
        if msg["type"] == "error":
            # A worker that died makes its peers' collectives fail a moment later: report the death,
            # the cause, if one shows within a second.
            deadline = time.time() + 1.0
            while time.time() < deadline:
                self._check_workers()
                time.sleep(0.05)
            r = msg["rank"]
            dev = self.device_of.get(r, r)
            if msg.get("node"):
                self._fail(f"node {msg['node']} failed on device {dev} (worker {r}): {msg['message'].strip()}")
            self._fail(f"worker {r} (device {dev}) failed in {msg['what']}: {msg['message'].strip()}")
        if msg["type"] != "done":
            return
        r = msg["rank"]
        self._mem[self.device_of[r]] = float(msg.get("mem", 0))
        d = self.device_of[r]
        self._peak[d] = max(self._peak.get(d, 0.0), self._mem[d])
        if "export" in msg:
            assert self.exports is not None
            self.exports.report(r, msg)
            return
        pend = self._pending[msg["node"]]
        pend.ranks.discard(r)
        pend.start = max(pend.start, msg["start"])
        if r in pend.ends:
            pend.finish = max(pend.finish, msg["finish"])
        pend.bytes += int(msg.get("bytes", 0))
        pend.versions_in.update(msg.get("versions_in") or {})
        pend.versions_out.update(msg.get("versions_out") or {})
        pend.microtasks += [tuple(t) for t in msg.get("microtasks") or ()]
        if msg.get("metrics"):
            d0 = pend.dispatch
            assert d0 is not None
            self.metrics.setdefault(d0.node.step, {}).update(msg["metrics"])
        if msg.get("reward_stats"):
            d0 = pend.dispatch
            assert d0 is not None
            self._reward_report(d0.node.step, msg["reward_stats"])
        if not pend.ranks:
            self._complete(msg["node"], pend)

    def _reward_report(self, step: int, stats: dict) -> None:
        """Sum one replica's reward-function report into step `step`'s accuracy and failure count; the first
        failure of the run becomes a warning (the run goes on: a failed call scored 0)."""
        acc = self.reward_stats.setdefault(step, {"acc_sum": 0.0, "acc_n": 0, "failures": 0})
        for k in acc:
            acc[k] += stats[k]
        metrics = self.metrics.setdefault(step, {})
        if acc["acc_n"]:
            metrics["accuracy"] = acc["acc_sum"] / acc["acc_n"]
        metrics["reward_failures"] = float(acc["failures"])
        if stats.get("first_failure") and self.first_reward_failure is None:
            self.first_reward_failure = f"step {step}, {stats['first_failure']}"
            warn(f"the reward function failed at {self.first_reward_failure}; such calls score 0 and the run goes "
                  "on (their count: reward_failures in metrics.jsonl and the summary)")

    def memory_summary(self) -> list[str]:
        """Each worker's measured peak (its bye) beside the cost model's peak of its device (peak_memory.py)."""
        models = set(self.plan.model_devices)  # a verifier pool's worker holds host memory, which is not priced
        peaks = [WorkerPeak(r, d, self._predicted_peaks.get(d, 0.0), self.pool.peaks.get(r), self.pool.resident.get(r))
                 for d, r in sorted(self.rank_of.items(), key=lambda dr: dr[1]) if d in models]
        return peak_lines(peaks, self._measured_what)

    def run_notes(self) -> list[str]:
        """What the summary says after the run: the reward function's failed calls, a reward function the plan does
        not price (`unpriced_reward`), and training passes it does not price (`unpriced_passes`)."""
        lines = []
        failed = int(sum(s["failures"] for s in self.reward_stats.values()))
        if failed:
            lines.append(f"reward function: {failed} call(s) failed and scored 0; the first at "
                         f"{self.first_reward_failure}")
        program = getattr(self, "program", None)  # set when the run's plan is analysed (`_analyse`)
        unpriced = [unpriced_reward(program, self.cfg) if program is not None else None, unpriced_passes(self.cfg)]
        return lines + [f"note: {u}" for u in unpriced if u]

    def _complete(self, node: str, pend: _Pending) -> None:
        del self._pending[node]
        now = self.now()
        for other in self._pending.values():
            if node in other.after:
                other.since = now
        d = pend.dispatch
        assert d is not None
        out = d.versions_out if d.node.kind != "op" else tuple(sorted(pend.versions_out.items()))
        self._ready.append(Completion(node=node, start=pend.start, finish=pend.finish, bytes=pend.bytes,
                                      versions_in=tuple(sorted(pend.versions_in.items())), versions_out=out,
                                      microtasks=tuple(sorted(pend.microtasks, key=lambda t: (t[0], t[4], t[5])))))
        self._completed += 1
        if self._is_training(d):
            assert self.exports is not None
            self.exports.after_training(d)

    def _submit(self, d: Dispatch, commands: dict[int, dict], ends: frozenset[int],
                after: tuple[str, ...] = ()) -> None:
        if not commands:  # nothing to move (the copy is already where and as it should be): done at once
            t = self.now()
            self._ready.append(Completion(node=d.id, start=t, finish=t, bytes=0, versions_in=(),
                                          versions_out=d.versions_out))
            self._completed += 1
            return
        self._pending[d.id] = _Pending(d, set(commands), ends or frozenset(commands), since=self.now(),
                                       after=after)
        for cmd in commands.values():
            cmd["ranks"] = sorted(commands)
        senders = self._senders(d, commands)
        self._pending[d.id].senders = frozenset(senders)
        for r in senders:  # a transfer's ranks may share one command: this one is theirs
            commands[r] = {**commands[r], SENDER: True}
        for r, cmd in sorted(commands.items()):
            self.pool.send(r, cmd)

    # -- parameter copies: installed, released --------------------------------------------------------

    def install(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        if artifact.kind != "weights":
            raise BackendError(None, f"cannot install {artifact.label}: only parameter copies are installed")
        layout = self.routes.reader_layout(artifact)
        cmd = {"type": "install", "label": artifact.label, "model": artifact.name, "version": artifact.index,
               "layout": layout}
        assert self.exports is not None
        keep = self.exports.keeps_installed(artifact, layout)
        tau = self.plan.tau.get(artifact.name, 0)
        for r in layout.ranks:
            self.pool.send(r, {**cmd, "keep": True, "tau": tau} if keep else cmd)
        self.routes.holdings[artifact] = Holding(layout=layout)

    def release(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        h = self.routes.holdings.pop(artifact, None)
        ranks = set(self.routes.ranks(devices))
        if h is not None:
            ranks |= set(h.layout.ranks) if h.layout else set(h.rows)
        for r in sorted(ranks):  # sent with the rank's next command, or before the controller waits
            self.pool.free(r, artifact.label)

    # -- nodes -----------------------------------------------------------------------------------------

    def run_op(self, d: Dispatch) -> None:
        self._issue(d, self.routes.op_command(d))

    def submit_fused(self, ds: tuple[Dispatch, ...]) -> None:
        """The members of a fusion as one command per rank (`Operators.fused` in worker/operators.py): their op
        commands, built in turn (a member's rows moved for one are where the next finds them), and the fusion's
        microtask order per stage."""
        commands = []
        for d in ds:
            c = self.routes.op_command(d)
            self.routes.holdings.update(c.holdings)
            commands.append(c)
        ranks = sorted(commands[0].commands)
        if any(sorted(c.commands) != ranks for c in commands):
            raise BackendError(ds[0].node.node.loc, f"the members of the fusion of {ds[0].id} run on different ranks")
        for d, c in zip(ds, commands):
            self._pending[d.id] = _Pending(d, set(c.commands), c.ends or frozenset(c.commands), since=self.now())
            for cmd in c.commands.values():
                cmd["ranks"] = ranks
        fusion = self.fusion_of[ds[0].id]
        stages = [[microtask_text(t) for t in order] for order in fusion.stages]
        for r in ranks:
            members = [c.commands[r] for c in commands]
            self.pool.send(r, {"type": "fused", "node": ds[0].id, "tag": members[0]["tag"], "ranks": ranks,
                               "members": members, "stages": stages})

    def transfer(self, d: Dispatch) -> None:
        self._issue(d, self.routes.transfer_command(d))

    def reshard(self, d: Dispatch) -> None:
        self._issue(d, self.routes.reshard_command(d))

    def chain(self, d: Dispatch, after: tuple[str, ...]) -> bool:
        """Send `d` behind its running predecessors `after` when its start cannot come before their finish:
        every rank that ends a predecessor (`routing.Command.ends`) runs `d` too, after it in its queue, and `d`
        starts when its last rank begins it. Not with checkpoints around a training node: a step boundary's
        checkpoint is requested when its training completes and must reach the workers before the nodes
        after it."""
        if self.checkpoint_every and any(self._is_training(x) for x in (d, *self._dispatches(after))):
            return False
        c = self.routes.command(d)
        if not c.commands:
            return False  # nothing to send: it completes at once when dispatched
        # A transfer's senders run it on their sender thread (sender.py), behind earlier sends only: the ranks that
        # queue it in order must end every predecessor, and no predecessor may still run in a sender's main loop
        # (it could be producing the data to send).
        senders = self._senders(d, c.commands)
        ranks = set(c.commands) - senders
        for p in after:
            pend = self._pending.get(p)
            if pend is not None and (not pend.ends <= ranks or (pend.ranks & senders) - pend.senders):
                return False
        self._issue(d, c, after)
        return True

    def _queued(self, pend: _Pending) -> bool:
        """Whether a chained node still waits in its workers' queues behind an unfinished predecessor."""
        return any(a in self._pending for a in pend.after)

    def _senders(self, d: Dispatch, commands: dict[int, dict]) -> set[int]:
        """The ranks of a transfer's commands outside what it reserves: they only send, on their sender thread."""
        if not d.node.is_transfer or not self._sender_threads:
            return set()
        held = set(d.reserved)
        return {r for r in commands if self.device_of[r] not in held}

    @staticmethod
    def _is_training(d: Dispatch) -> bool:
        return d.node.kind == "op" and d.node.node.role == "training"

    def _dispatches(self, nodes: tuple[str, ...]) -> list[Dispatch]:
        return [p.dispatch for x in nodes if (p := self._pending.get(x)) is not None and p.dispatch is not None]

    def _issue(self, d: Dispatch, c: Command, after: tuple[str, ...] = ()) -> None:
        self.routes.holdings.update(c.holdings)
        self._submit(d, c.commands, c.ends, after)

    # -- waiting -----------------------------------------------------------------------------------------

    def wait(self) -> list[Completion]:
        if not self._ready and not self._pending:
            raise BackendError(None, "wait() with nothing running")
        if not self._ready:
            self.pool.flush_releases()
        while not self._ready:
            msg = self.pool.poll()
            if msg is None:
                self._check_workers()
                continue
            self._on_message(msg)
        out, self._ready = self._ready, []
        return out

    def memory(self) -> dict[int, float]:
        return dict(self._mem)

    def peak_memory(self) -> dict[int, float]:
        return dict(self._peak)

    def step_metrics(self, step: int) -> dict[str, float]:
        return dict(self.metrics.get(step, {}))

    def step_done(self, step: int, finish: float) -> None:
        """Append step `step`'s metrics and times to RUN_DIR/metrics.jsonl (and TensorBoard, if installed)."""
        if self._metrics_log is not None:
            self._metrics_log.write(step, finish, self.step_metrics(step))

    # -- checkpoints and final weights (exports.py) --------------------------------------------------------

    def _drain_exports(self) -> None:
        deadline = time.time() + self.timeout_s
        while self.exports is not None and self.exports.jobs:
            msg = self.pool.poll()
            if msg is None:
                self._check_workers()
                if time.time() > deadline:
                    self._fail("exports of checkpoints or final weights did not finish in time")
                continue
            self._on_message(msg)

    @property
    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """The final weights of every trained model, read back from what the workers wrote at the end."""
        return self.exports.final_weights if self.exports is not None else {}

    @property
    def checkpoints(self) -> list[str]:
        return self.exports.checkpoints if self.exports is not None else []

    @property
    def io_stats(self) -> list[dict]:
        """One entry per checkpoint / final-weights write: {"what", "step", "bytes", "files", "write_s"}."""
        return self.exports.io_stats if self.exports is not None else []

    def interrupt(self) -> None:
        """The run was interrupted (rpeg-run got SIGINT/SIGTERM): shutdown() stops the workers after a short
        grace instead of letting them finish, writes no final weights, and ends the fork server too. The signal
        may have cut the main thread's read of a report short (`Endpoint.allow_gaps`)."""
        self._interrupted = True
        self.pool.allow_gaps()

    def kill_now(self) -> None:
        """A second signal: SIGKILL every worker and the fork server, without waiting (the process exits)."""
        self.pool.kill_now()

    def shutdown(self) -> None:
        outcome = FAILED  # of the run, as the trackers record it
        try:
            if self._stopped:
                return
            try:
                finished = self._completed == len(self.plan.nodes) and not self._pending
                if finished and not self._failed and not self._interrupted:
                    assert self.exports is not None
                    self.exports.collect_final(self._drain_exports)
                    outcome = FINISHED
            finally:
                self._stop_workers()
        finally:
            if self._metrics_log is not None:  # also when the run failed before its workers started
                self._metrics_log.close(KILLED if self._interrupted else outcome)
            self._release_run_dir()

    def _stop_workers(self) -> None:
        """Stop the workers: a short grace after a failure or an interrupt, and the fork server too after an
        interrupt; the worker logs stay after a failure (the error message points there)."""
        self._stopped = True
        fast = self._failed or self._interrupted
        self.pool.stop(grace_s=1.0 if fast else 10.0, kill_grace_s=1.0 if self._interrupted else 3.0,
                       keep_logs=self._failed)
        if self._interrupted:
            stop_forkserver()

    @property
    def worker_pids(self) -> list[int]:
        return self.pool.pids
