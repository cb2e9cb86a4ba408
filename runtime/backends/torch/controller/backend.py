"""The torch execution backend: real worker processes, models, RL math and transfers (paper Sec. VII,
Alg. 2; docs/architecture.md, Runtime; issue 8).

`TorchBackend` implements `rpegc.runtime.backends.base.Backend` for the completion-driven controller:
- `start` chooses the torch.distributed backend (`dist_backend`: gloo on CPUs, nccl with one GPU per
  worker, auto = nccl when every worker gets a GPU; `device.choose_dist_backend`), describes the run once
  (run_description.py), holds the cost model's memory of every device against its worker's capacity before any
  worker starts (memory_check.py), and has its `WorkerPool` (pool.py: processes, the authenticated control channel,
  health, stop) launch one persistent worker per device of the plan and send them the run setup, then waits
  until every worker has created the process groups of every vertex layout;
- `run_op` / `transfer` / `reshard` / `chain` / `install` / `release` send a Dispatch's commands to the
  node's workers (dispatch.py, with every route precomputed by `routing.Routes` from where each artifact's
  shards are held); `wait` collects the workers' reports into Completions (inflight.py: start/finish on the
  wall clock, bytes moved, versions read and produced) and turns a worker error or death into a BackendError
  naming the node, the device and the worker;
- checkpoints every N steps (weights, Adam state, step, RNG; `exports.Exports`) are written by the workers,
  each its own shards, straight into RUN_DIR/checkpoints/step-NNNNNN/ (checkpoints/shard_files.py: safetensors
  shards + an index the controller writes last; only file names, sizes and boxes travel through the control
  channel); `prepare` restricts the plan to the steps after the last checkpoint when resuming
  (checkpoints/run_claim.py), under this plan or any other of the same run (workers reshard on load); at the
  end the workers write the final weights of every trained model to RUN_DIR/final/ the same way
  (`shard_files.load_final`), which the controller then reads into `final_weights` (without a run directory,
  from a temporary directory it removes).

What the RL vertices compute is the run's algorithm's (algorithms/: by role, model kind and container):
under PPO and GRPO generation writes sequences + mask and the sampling log-probs; inference with the reference
model writes reference log-probs, with a critic values, with the reward model scores (the verifier by default,
or the frozen reward model with reward = "model"); training reads them all. Under DPO the reference scores
each side of the given preference pairs and training reads both.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import ContextManager, Optional

import torch

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Program
from rpegc.runtime.backends.base import Backend, BackendError, Completion, Dispatch
from rpegc.runtime.backends.torch.channel.worker_setup import WorkerSetup
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.checkpoints.exports import Exports
from rpegc.runtime.backends.torch.checkpoints.run_claim import RunClaim
from rpegc.runtime.backends.torch.controller.dispatch import Dispatcher
from rpegc.runtime.backends.torch.controller.device import DIST_BACKEND_CHOICES, plan_dist_backend
from rpegc.runtime.backends.torch.controller.inbox import warn
from rpegc.runtime.backends.torch.controller.inflight import InFlight
from rpegc.runtime.backends.torch.controller.memory_check import check_memory
from rpegc.runtime.backends.torch.controller.options import KEEP_CHECKPOINTS, TorchOptions
from rpegc.runtime.backends.torch.controller.pool import WorkerPool
from rpegc.runtime.backends.torch.controller.processes import stop_forkserver
from rpegc.runtime.backends.torch.controller.run_description import (RunDescription, RunSettings, describe_run,
                                                                     plan_core_slots, run_identity)
from rpegc.runtime.backends.torch.controller.run_record import RunRecord
from rpegc.runtime.backends.torch.parallel.tensor_parallel import resolve_tp_impl
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.backends.torch.worker.peak_memory import WorkerPeak, peak_lines
from rpegc.runtime.backends.torch.worker.process import FAULT_ENV
from rpegc.runtime.backends.torch.worker.thread_cpu import CoreUse, ThreadCpu, cpu_lines, read_thread_cpu, usage
from rpegc.runtime.interrupt import stop_on_signals
from rpegc.runtime.metrics_log import MetricsLog
from rpegc.runtime.plan import Artifact, RunPlan
from rpegc.runtime.report import host_cores
from rpegc.runtime.trackers import FAILED, FINISHED, KILLED, parse_log


def runs_witness(program: Program) -> bool:
    """Whether a run's workers end every operator with the speed witness (runtime/speed_probe.py): where the plan's
    profile prices it ([overhead] witness: a CPU machine profile), whatever the workers' device, as it is priced."""
    from rpegc.core.cost.hardware import program_hardware

    return program.cluster is not None and program_hardware(program).overhead.witness > 0


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
                 store: Optional[str] = None, secret_file: Optional[str] = None,
                 keep_checkpoints: int = KEEP_CHECKPOINTS,
                 memory_check: bool = True, control: str = "auto", overwrite: bool = False,
                 trackers: Optional[tuple[str, ...]] = None):
        _check_arguments(tp_impl, checkpoint_every, keep_checkpoints, bool(checkpoint_every or resume) and not run_dir,
                         dist_backend)
        self.settings = RunSettings(seed, task, reward, lr, tuple((rl or {}).items()), tuple((data or {}).items()))
        self.run_dir, self.checkpoint_every, self.resume = run_dir, checkpoint_every, resume
        self.keep_checkpoints = keep_checkpoints
        self.claim = RunClaim(run_dir, resume, overwrite)
        self.memory_check = memory_check  # refuse a plan whose cost-model memory does not fit the workers
        self.tp_impl, self.timeout_s = tp_impl, timeout_s
        self.fault = fault if fault is not None else os.environ.get(FAULT_ENV) or None
        self.pool = WorkerPool(launcher=launcher, store=store, secret_file=secret_file, control=control,
                               run_dir=run_dir, timeout_s=timeout_s)
        self.dist_backend, self.launcher = dist_backend, launcher
        self.record = RunRecord()  # per-step metrics, a reward function's statistics, metrics.jsonl
        self.exports: Optional[Exports] = None  # checkpoints and final weights, once started
        self.run: Optional[RunDescription] = None  # the run, once started
        self._config: Optional[tuple[Program, RunConfig]] = None  # (program, its run's configuration): `config`
        self.flight: Optional[InFlight] = None  # its nodes in flight, once started
        self.dispatcher: Optional[Dispatcher] = None  # what sends them, once started
        self.warnings: list[str] = []
        self.trackers = trackers  # --log: where the metrics also go (runtime/trackers.py); None: the default
        self._interrupted = False  # SIGINT/SIGTERM: stop fast, write no final weights, reap the fork server
        self._stopped = True
        self._cpu_start: Optional[ThreadCpu] = None  # the controller's threads once the workers are ready
        self._cpu: Optional[CoreUse] = None  # their cores from then to the workers' stop

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
                   secret_file=o.secret_file,
                   keep_checkpoints=KEEP_CHECKPOINTS if o.keep_checkpoints is None else o.keep_checkpoints,
                   memory_check=not o.no_memory_check, overwrite=o.overwrite,
                   trackers=parse_log(o.log) if o.log is not None else None)

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def metrics(self) -> dict[int, dict[str, float]]:
        return self.record.metrics

    # -- the run's identity and its directory ------------------------------------------------------------

    def header_options(self, plan: RunPlan) -> dict:
        """What the trace header records: the worker processes launched here, the cores they share, the cluster
        nodes the plan's devices lie on, the torch.distributed backend (gloo: CPU workers; nccl: a GPU each), and
        the effective RL hyper-parameters, prompts and reward of a run of `plan`."""
        cfg = self.config(plan.program)
        slots = {s for ss in plan_core_slots(plan) for s in ss}
        out = {"local_workers": len(slots) if self.launcher == "local" else 0, "host_cores": host_cores(),
               "plan_nodes": plan.nodes_used,
               "dist_backend": plan_dist_backend(plan, self.dist_backend, self.launcher),
               "rl": dataclasses.asdict(cfg.rl), "reward": cfg.reward}
        out["data"] = dataclasses.asdict(cfg.data) if cfg.data.path is not None else {"task": cfg.task}
        return out

    def tracker_config(self, plan: RunPlan, dist_backend: str, tp_impl: str) -> dict:
        """The run's config as the experiment trackers record it: the plan, its hash, the seed, the backend's
        settings and what the trace header records (RL hyper-parameters, prompts, reward)."""
        assert self.run is not None
        header = self.header_options(plan)
        return {"plan": os.path.abspath(plan.file), "plan_hash": plan.hash, "steps": plan.steps,
                "plan_steps": plan.plan_steps, "devices": len(plan.devices), "backend": self.name,
                "seed": self.seed, "algorithm": self.run.cfg.algorithm, "run_dir": os.path.abspath(self.run_dir or "."),
                "resumed": self.resume, "checkpoint_every": self.checkpoint_every,
                "keep_checkpoints": self.keep_checkpoints, "tp_impl": tp_impl, **header, "dist_backend": dist_backend}

    def stop_signals(self) -> ContextManager:
        """SIGINT/SIGTERM stop the run cleanly: the workers finish or drop their step (runtime/interrupt.py)."""
        return stop_on_signals(self)

    def last_checkpoint_step(self) -> Optional[int]:
        return self.claim.last_checkpoint_step()

    def prepare(self, plan: RunPlan) -> RunPlan:
        """On --resume: the plan from the last checkpoint's step on; otherwise the plan itself. The
        checkpoint may come from another plan of the same run (same identity: program, seed, options)."""
        self.claim.claim()
        if not self.resume:
            return plan
        resumed = self.claim.resumed_plan(plan, self.identity)
        self.record.metrics.update(self.claim.resumed_metrics())
        return resumed

    def identity(self, plan: RunPlan) -> dict:
        """What a checkpoint of this run records and a resume must match (`shard_files.run_identity`)."""
        return run_identity(plan, self.seed, self.config(plan.program))

    def config(self, program: Program) -> RunConfig:
        """The run's configuration for `program`, derived once: the trace header, a resume's identity check and the
        run's description read the same object."""
        if self._config is None or self._config[0] is not program:
            self._config = (program, self.settings.config(program))
        return self._config[1]

    @property
    def resume_step(self) -> int:
        return self.claim.resume_step

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, plan: RunPlan) -> dict[int, int]:
        self.claim.claim()  # released by shutdown(), which the controller calls whatever start does
        # before anything is cleared or started
        dist_backend = plan_dist_backend(plan, self.dist_backend, self.launcher)
        tp = any(n.kind == "op" and n.node.strategy is not None and n.node.strategy.tp > 1 for n in plan.nodes)
        tp_impl, fallback = resolve_tp_impl(self.tp_impl, tp)
        self.warnings += [fallback] if fallback else []
        # the fork server's imports (seconds) run while the plan, the models and the dataset are analysed
        self.pool.start_forkserver(tp_impl, hf=any(m.hf is not None for m in plan.program.models))
        run = self.run = describe_run(plan, self.settings, self.config(plan.program))
        if self.memory_check and self.launcher == "local":  # external workers run on hosts unseen from here
            check_memory(run.memory, plan.model_devices, dist_backend)  # before any worker starts
        self._measured_what = "GPU allocator" if dist_backend == "nccl" else "the C heap's allocations"
        self.warnings += [w for w in run.warnings if w not in self.warnings]
        if self.run_dir and not self.resume:
            ckpt.clear_run_dir(self.run_dir)
        if self.run_dir:  # the trackers start here, before any worker does
            self.record.log = MetricsLog(self.run_dir, first_step=plan.first_step, trackers=self.trackers,
                                         config=self.tracker_config(plan, dist_backend, tp_impl))
        self._t0 = time.time()
        resumed = self.claim.resume_index is not None
        self.exports = Exports(plan, self.pool, run.routes, run_dir=self.run_dir, every=self.checkpoint_every,
                               keep=self.keep_checkpoints, identity=self.identity(plan), metrics=self.record.metrics,
                               resumed_at=self.resume_step if resumed else None)
        self.flight = InFlight(self.pool, run.device_of, self.timeout_s, self.now, self.record, self.exports)
        # gloo's sends may come from a second thread (tags keep them apart); NCCL's would need their own stream and
        # an order matched on both sides, not built yet: there a transfer's sources send in their command loop.
        self.dispatcher = Dispatcher(run, self.pool, self.flight, self.exports, sender_threads=dist_backend == "gloo")
        self._stopped = False  # from here on shutdown() must stop workers, even if the launch fails halfway
        self.pool.open(self._worker_setup(run, dist_backend, tp_impl), tp_impl)
        for w in self.warnings:
            warn(w)
        self.flight.await_ready(len(plan.devices))
        self._cpu_start = read_thread_cpu()  # the controller's threads from here to the workers' stop
        return dict(run.rank_of)

    def _worker_setup(self, run: RunDescription, dist_backend: str, tp_impl: str) -> WorkerSetup:
        layouts = tuple(sorted(set(run.routes.layouts.values()), key=lambda L: (L.ranks, L.dp, L.pp, L.tp)))
        resume = self.claim.resume_dir
        return WorkerSetup(world=len(run.plan.devices), seed=self.seed, run=run.cfg, models=run.models,
                           layouts=layouts, tp_impl=tp_impl, t0=self._t0, timeout_s=self.timeout_s,
                           dist_backend=dist_backend, fault=self.fault,
                           core_slots=run.core_slots if self.launcher == "local" else None,
                           resume_file=os.path.abspath(resume) if resume else None,
                           witness=runs_witness(run.program))

    def now(self) -> float:
        return time.time() - self._t0

    # -- what the run measured and says -------------------------------------------------------------------

    def memory_summary(self) -> list[str]:
        """Each worker's measured peak (its bye) beside the cost model's peak of its device (peak_memory.py)."""
        assert self.run is not None
        predicted = self.run.predicted_peaks  # of model devices: a verifier pool's worker holds unpriced host memory
        peaks = [WorkerPeak(r, d, predicted.get(d, 0.0), self.pool.peaks.get(r), self.pool.resident.get(r))
                 for d, r in sorted(self.run.rank_of.items(), key=lambda dr: dr[1]) if d in predicted]
        return peak_lines(peaks, self._measured_what)

    def cpu_summary(self, contention_priced: bool = False) -> list[str]:
        """Each worker's threads' cores from its ready to its stop, and the controller's (worker/thread_cpu.py)."""
        devices = len(self.run.plan.model_devices) if self.run is not None else len(self.pool.cpu)
        pools = frozenset(r for r in self.pool.cpu if r >= devices)  # a verifier pool's worker: the last rank
        return cpu_lines(self.pool.cpu, self._cpu, pools, oversubscribed=len(self.pool.cpu) > host_cores(),
                         priced=contention_priced)

    def run_notes(self) -> list[str]:
        """What the summary says after the run (run_record.py: failed reward calls, what the plan does not price)."""
        run = self.run
        return self.record.notes(run.program if run else None, run.cfg if run else None)

    def memory(self) -> dict[int, float]:
        return dict(self.flight.mem) if self.flight else {}

    def peak_memory(self) -> dict[int, float]:
        return dict(self.flight.peak) if self.flight else {}

    def step_metrics(self, step: int) -> dict[str, float]:
        return self.record.step_metrics(step)

    def step_done(self, step: int, finish: float) -> None:
        """Append step `step`'s metrics and times to RUN_DIR/metrics.jsonl (and TensorBoard, if installed)."""
        self.record.step_done(step, finish)

    # -- nodes and parameter copies (dispatch.py) --------------------------------------------------------

    def install(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        self._dispatcher().install(artifact, devices)

    def release(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        self._dispatcher().release(artifact, devices)

    def run_op(self, d: Dispatch) -> None:
        self._dispatcher().run_op(d)

    def submit_fused(self, ds: tuple[Dispatch, ...]) -> None:
        self._dispatcher().submit_fused(ds)

    def transfer(self, d: Dispatch) -> None:
        self._dispatcher().transfer(d)

    def reshard(self, d: Dispatch) -> None:
        self._dispatcher().reshard(d)

    def chain(self, d: Dispatch, after: tuple[str, ...]) -> bool:
        return self._dispatcher().chain(d, after)

    def _dispatcher(self) -> Dispatcher:
        assert self.dispatcher is not None, "the backend dispatches once started"
        return self.dispatcher

    def wait(self) -> list[Completion]:
        if self.flight is None:
            raise BackendError(None, "wait() with nothing running")
        return self.flight.wait()

    # -- checkpoints and final weights (exports.py) --------------------------------------------------------

    @property
    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """The final weights of every trained model, read back from what the workers wrote at the end."""
        return self.exports.final_weights if self.exports is not None else {}

    @property
    def checkpoints(self) -> list[str]:
        return self.exports.checkpoints if self.exports is not None else []

    @property
    def io_stats(self) -> list[dict]:
        """One entry per checkpoint / final-weights write: {"what", "step", "bytes", "files", "write_s", "commit_s"}."""
        return self.exports.io_stats if self.exports is not None else []

    def checkpoint_write_seconds(self) -> list[float]:
        return [float(s["write_s"]) for s in self.io_stats if s["what"] == "checkpoint"]

    def checkpoint_commit_seconds(self) -> list[float]:
        return [float(s["commit_s"]) for s in self.io_stats if s["what"] == "checkpoint"]

    # -- ending -------------------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """The run was interrupted (rpeg-run got SIGINT/SIGTERM): shutdown() stops the workers after a short
        grace instead of letting them finish, writes no final weights, and ends the fork server too. The signal
        may have cut the main thread's read of a report short (`Endpoint.allow_gaps`)."""
        self._interrupted = True
        self.pool.allow_gaps()

    def kill_now(self) -> None:
        """A second signal: SIGKILL every worker and the fork server, without waiting (the process exits)."""
        self.pool.kill_now()

    @property
    def _failed(self) -> bool:
        return self.flight is not None and self.flight.failed

    def shutdown(self) -> None:
        outcome = FAILED  # of the run, as the trackers record it
        try:
            if self._stopped:
                return
            try:
                flight = self.flight
                assert self.run is not None and flight is not None and self.exports is not None
                finished = flight.count == len(self.run.plan.nodes) and not flight.pending
                if finished and not self._failed and not self._interrupted:
                    self.exports.collect_final(flight.drain_exports)
                    outcome = FINISHED
            finally:
                self._cpu = usage(self._cpu_start, read_thread_cpu())
                self._stop_workers()
                if self.exports is not None:
                    self.exports.discard_open()
        finally:
            if self.record.log is not None:  # also when the run failed before its workers started
                self.record.log.close(KILLED if self._interrupted else outcome)
            self.claim.release()

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


def _check_arguments(tp_impl: str, checkpoint_every: int, keep_checkpoints: int, no_run_dir: bool,
                     dist_backend: str) -> None:
    """The constructor's arguments, as a program that builds the backend itself may pass them."""
    resolve_tp_impl(tp_impl, False)  # a known name
    if checkpoint_every < 0:
        raise RpegError(None, f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    if keep_checkpoints < 1:
        raise RpegError(None, f"--keep-checkpoints must be >= 1, got {keep_checkpoints}")
    if no_run_dir:
        raise RpegError(None, "checkpoints and --resume need a run directory; give --run-dir DIR")
    if dist_backend not in DIST_BACKEND_CHOICES:
        raise RpegError(None, f"unknown distributed backend '{dist_backend}'; use "
                              f"{', '.join(DIST_BACKEND_CHOICES)}")
