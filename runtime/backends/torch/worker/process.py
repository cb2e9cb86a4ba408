"""The persistent worker process of the torch backend: one per device of the plan (paper Sec. VII, Alg. 2;
docs/architecture.md, Runtime).

    python -m rpegc.runtime.backends.torch.worker.process --store HOST:PORT [--rank R --world N]

A worker joins the controller's TCPStore, reads the run setup from it, picks its device, joins
torch.distributed through the same store with the backend the setup names, creates every process group
of the plan's layouts (all ranks, one order), then executes commands until told to stop. Under torchrun
or Slurm, RANK / WORLD_SIZE (or SLURM_PROCID / SLURM_NTASKS) come from the environment instead of the
flags; nothing else changes.

Devices (`device.worker_device`): with gloo everything is on the CPU. With NCCL the worker first calls
`torch.cuda.set_device(local rank)` (LOCAL_RANK under torchrun, SLURM_LOCALID under srun; a locally
launched worker takes rank modulo the node's GPUs) and keeps on that GPU every model, parameter, Adam
state, KV cache, data piece it receives and communication buffer; only the per-sequence sampling
generators and their draws stay on the CPU (`generation.sample_tokens`). Version 0 is built on the CPU
from its seed, and on resume a worker reads from the checkpoint's shard files only the boxes of its own
pieces, to the CPU, then moves them to its GPU. Checkpoints and final weights are written by every worker
itself, its own shards, as one safetensors file into the run directory (`cmd_export`, checkpoints/shard_files.py;
copied to the CPU first); only the file's name, size, SHA-256 and tensor boxes go back to the controller.
A command reports completion only after the GPU has finished its work.

Control channel (all through the store, so it works across nodes; `messages.py`): the controller pushes
the commands of rank r onto the store queue `cmd/r`, the worker pushes its reports onto `res`; both are
plain, bounded messages sealed with the run's secret (a message that is not authentic is dropped and
logged to the worker log, never executed). A locally forked worker gets the secret from its parent; an
external one reads it from --secret-file PATH or $RPEG_RUN_SECRET_FILE (mode 0600, written by `rpeg-run
--store`). The worker blocks in the store until its next command comes (`WAIT`: an idle hour at most
before it checks that the controller is still there), so a normal run logs no c10d timeout.
Commands run strictly in order, so every rank meets the collectives of concurrent nodes in the same
order. A command names a node (op, comm, reshard) or is bookkeeping (install, release, keep, export, stop).

What a worker keeps (the states of the memory model, docs/cost-model-spec.md Sec. 6):
- published parameter copies: `weights` entries, one per (model, version, allocation), each this rank's
  pieces under the layout it is held in (serving copies, and the shadow copies asynchronous consumers
  read while training moves on), in the serving dtype (`models.serving_dtype`: s_b bytes per parameter,
  bf16 for a bf16 workload); Comm and Reshard nodes move them as they are, so the bytes they report are
  those of the serving dtype;
- execution modules: one `ParallelModel` per (model, layout) it serves, in the serving dtype, whose
  parameters are the tensors of the weights entry a node reads (bound, not copied: one serving copy; a
  module lets go of them when the entry is freed or replaced); one training state per trained (model, layout),
  training as the plan says (core/ir/training.py: precision, ZeRO stage, recomputation, schedule): a module in
  the training dtype (`master_weights.training_dtype`: bf16 under mixed precision, else float32) and the float32
  master weights and Adam state of what it steps (its replica's ZeRO share; all of it under ZeRO-0;
  `master_weights.MasterWeights`; a float32 module is its own master). In mixed precision each new version is
  published as the working weights themselves (one bf16 copy, which the next step takes over or copies:
  `loaded_state`), under fp32 as a copy in the serving dtype. A master never reloads from a reduced-precision copy: a
  training state starts from the float32 version it was cast from (version 0 by seed, or the checkpoint), and
  checkpoints and final weights save the masters (each data-parallel replica its share). Version 0 is never
  held whole: a rank draws (or reads from the checkpoint) only the pieces it installs;
- data artifacts: `data` entries, row pieces of a container for one step (and phase), float32/int64.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rpegc.core.ir.errors import RpegError, error_line
from rpegc.core.ir.exec_graph import microtask_of
from rpegc.core.ir.program import VERIFY
from rpegc.runtime.backends.torch.worker.interleave import Interleave, run_members
from rpegc.core.ir.training import Training
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.controller.device import local_rank, rank_and_world, synchronize, worker_device
from rpegc.runtime.backends.torch.model.generation import expand_rollouts
from rpegc.runtime.backends.torch.parallel.layout import (Layout, RowMove, WeightMove, rank_pieces, replica_owner,
                                                          split_rows)
from rpegc.runtime.backends.torch.channel.messages import SECRET_ENV, Endpoint, MessageError, read_secret
from rpegc.runtime.backends.torch.controller.pinning import local_workers, pin_cpu_worker, pin_slots
from rpegc.runtime.backends.torch.model.hf import HFWeights
from rpegc.runtime.backends.torch.worker.host_memory import heap_in_use, release_freed
from rpegc.runtime.backends.torch.model.master_weights import MasterWeights, training_dtype
from rpegc.runtime.backends.torch.model.transformer import cast_weights, check_arch, param_shapes
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, ProcessGroups, seeded_shard
from rpegc.runtime.backends.torch.worker.peak_memory import PeakMeter
from rpegc.runtime.backends.torch.worker.sender import CommandRouter
from rpegc.runtime.backends.torch.rl.finite import NonFiniteError
from rpegc.runtime.backends.torch.parallel.schedules import generate, infer
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec, WorkerSetup
from rpegc.runtime.backends.torch.rl.step import last_token_scores, response_forward
from rpegc.runtime.backends.torch.rl.datasets import PairBatch, PromptBatch
from rpegc.runtime.backends.torch.rl.prompts import open_prompts
from rpegc.runtime.backends.torch.rl.rewards import load_reward, reward_stats, score_responses, score_rows
from rpegc.runtime.backends.torch.controller.verifier_pool import VerifierPool

FAULT_ENV = "RPEG_TORCH_FAULT"  # "kill:NODE[:RANK]" or "raise:NODE[:RANK]": a test hook
WAIT = timedelta(hours=1)  # longest blocking wait for a command before checking on the controller
MAX_ERROR_CHARS = 8000  # an error report keeps the tail of a longer traceback


def field_spec(name: str, run: RunConfig) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-sequence shape and dtype of a data field."""
    w = run.workload
    specs = {
        "sequences": ((w.Lp + w.Lr,), torch.int64),
        "mask": ((w.Lr,), torch.float32),
        "old_logprobs": ((w.Lr,), torch.float32),
        "ref_logprobs": ((w.Lr,), torch.float32),
        "values": ((w.Lr,), torch.float32),
        "scores": ((), torch.float32),
        "task_scores": ((), torch.float32),
        "chosen_ref_logprobs": ((w.Lr,), torch.float32),  # DPO: the reference's log-probs of each side
        "rejected_ref_logprobs": ((w.Lr,), torch.float32),
    }
    return specs[name]


@dataclass
class Piece:
    lo: int
    hi: int
    fields: dict[str, Tensor]


@dataclass
class Entry:
    """An artifact held by this worker: data pieces, or this rank's shards of a weights version."""

    kind: str
    model: Optional[str] = None
    version: int = 0
    layout: Optional[Layout] = None
    shards: dict[str, Tensor] = field(default_factory=dict)
    pieces: list[Piece] = field(default_factory=list)
    # (shard and piece counts it was counted at, bytes): an entry only ever gains pieces, so its bytes change
    # only when the counts do; summing on every report delayed each node's report by ~0.1 ms
    _counted: tuple[tuple[int, int], int] = field(default=((-1, -1), 0), repr=False, compare=False)

    def nbytes(self) -> int:
        key = (len(self.shards), len(self.pieces))
        if self._counted[0] != key:
            tensors = list(self.shards.values()) + [t for p in self.pieces for t in p.fields.values()]
            self._counted = (key, sum(t.numel() * t.element_size() for t in tensors))
        return self._counted[1]

    def full_precision(self) -> bool:
        """Whether the shards are float32 (exact master values), not a reduced-precision serving copy."""
        return all(t.dtype == torch.float32 for t in self.shards.values())


@dataclass
class TrainState:
    """A trained model's module in the training dtype (`pm`, at version `pm.loaded`), the float32 master
    weights and Adam state of the parameters this rank steps, and how it trains (`train`: the plan's).

    In mixed precision the module's parameters and the version it publishes are one copy (`Worker.publish`:
    the entry `shares`), which the next step takes over when no later node reads that version (`take`), else
    copies; under fp32 the module's float32 parameters are the masters and stay between steps."""

    pm: ParallelModel
    master: MasterWeights
    train: Training
    shares: Optional[str] = None  # the weights entry whose tensors are the module's parameters


SWITCH_INTERVAL_S = 2e-4  # the worker's threads' turn at the interpreter (sys.setswitchinterval; Python: 5 ms)


class CommandError(Exception):
    """A command that cannot run; the message names what is wrong."""


def _bytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Worker:
    def __init__(self, setup: WorkerSetup, rank: int, channel: Optional[Endpoint] = None,
                 device: Optional[torch.device] = None, commands: Optional[Endpoint] = None):
        self.setup, self.rank, self.channel = setup, rank, channel
        # where commands are read: the channel's link, or over the store a connection of the reader thread's own (a
        # store client serves one request at a time, and a reader waiting for a command would hold up every report)
        self.commands = commands if commands is not None else channel
        # Without a device: the one a locally launched worker of this backend gets (the CPU for gloo).
        self.device = device if device is not None else worker_device(setup.dist_backend, rank, {})
        self.run = setup.run
        self.serving_dtype = setup.run.serving_dtype  # of every `weights` entry and serving module
        self.entries: dict[str, Entry] = {}
        self.debug = bool(os.environ.get("RPEG_TORCH_DEBUG"))  # one line per command in the worker log
        self.meter: Optional[PeakMeter] = None  # what the worker held at its peak (`loop`)
        self.serving: dict[tuple[str, Layout], ParallelModel] = {}
        self.training: dict[tuple[str, Layout], TrainState] = {}
        self._model_bytes: tuple[tuple, int] = ((), 0)  # (counts it was computed at, bytes): see memory()
        self.nets = {m: s.net(self.run.net) for m, s in setup.models.items()}
        self.shapes = {m: param_shapes(s.arch, s.kind, self.nets[m]) for m, s in setup.models.items()}
        # On resume: the checkpoint's shard files, of which this worker reads only the boxes it needs
        self.resume = ckpt.Reader(setup.resume_file) if setup.resume_file else None
        # Versions a checkpoint must still save once the live copies moved on (staleness tau > 0):
        # (model, version) -> (layout, this rank's float32 pieces), on the CPU
        self.window: dict[tuple[str, int], tuple[Layout, dict[str, Tensor]]] = {}
        w = self.run.workload
        self.alg = self.run.alg  # what the vertices compute (algorithms/)
        self.prompts = open_prompts(self.run.data, self.run.task, self.run.actor.vocab, w.Lp, w.Lr,
                                    pairs=not self.alg.generates)
        self.reward_fn = load_reward(self.run.reward) if self.run.reward_function else None
        self.pool: Optional[VerifierPool] = None  # a verify vertex's processes, if this rank is the plan's pool
        self._batches: dict[int, PromptBatch] = {}  # the prompts of the steps in flight
        self._pairs: dict[int, PairBatch] = {}  # DPO: the preference pairs of the steps in flight
        self.groups = ProcessGroups(setup.layouts)
        self._report_lock = threading.Lock()
        if self.resume is not None and ckpt.rng_key(self.rank) in self.resume:
            torch.set_rng_state(self.resume.read(ckpt.rng_key(self.rank)))

    def now(self) -> float:
        return time.time() - self.setup.t0

    # -- channel ----------------------------------------------------------------------------------

    def report(self, msg: dict) -> None:
        """Push a report to the controller; one that cannot be sent (too large, not plain) becomes an error report.
        The main loop and the sender thread both report: one at a time (the channel numbers its messages)."""
        assert self.channel is not None
        with self._report_lock:
            try:
                self.channel.push("res", msg)
            except MessageError as e:
                self.channel.push("res", {"type": "error", "node": msg.get("node"), "what": msg.get("type", "report"),
                                          "rank": self.rank, "message": f"cannot report: {e.message}"})

    def next_command(self) -> dict:
        """The next authentic command, blocking until it comes; exits (code 3) once the controller is gone."""
        assert self.commands is not None
        key = f"cmd/{self.rank}"
        while True:
            try:
                return self.commands.receive(key, WAIT).msg
            except EOFError:  # the controller closed this worker's link: it is gone
                raise SystemExit(3)
            except (RuntimeError, TimeoutError):  # an idle hour, or the controller is gone (its store with it)
                try:
                    self.commands.store.check([key])
                except Exception:
                    raise SystemExit(3)

    def loop(self) -> None:
        meter = self.meter = PeakMeter(self.device)
        meter.start()  # what the plan makes this worker hold is measured from here on
        # A transfer's source side runs on a sender thread beside the operators (sender.py). The reader and the
        # sender hold the interpreter briefly; an operator's Python holds it otherwise, and would keep them waiting
        # the default 5 ms switch interval for each message and send.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        commands = CommandRouter(self.next_command, lambda cmd: self.handle(cmd, sender=True)).start()
        self.report({"type": "ready", "rank": self.rank, "groups": len(self.groups)})
        while True:
            cmd = commands.next()
            if cmd["type"] == "stop":
                if self.pool is not None:
                    self.pool.close()
                # the controller keeps its store until all said bye
                self.report({"type": "bye", "rank": self.rank, "peak": meter.peak(), "resident": meter.resident()})
                return
            self.handle(cmd)
            commands.finished(cmd)

    def handle(self, cmd: dict, sender: bool = False) -> None:
        """Run one command and report it; `sender`: on the sender thread, a transfer's source side (it frees and
        trims nothing: the main loop owns what the worker holds)."""
        start = self.now()
        node = cmd.get("node")
        try:
            if not sender:
                self.free(cmd.get("release", ()))  # copies freed since this rank's last command
                release_freed()  # every command starts from what the worker holds, not its last high-water mark
            self.maybe_fail(cmd)
            info = getattr(self, "cmd_" + cmd["type"])(cmd) or {}
            synchronize(self.device)  # finished means the device finished (and its errors surface here)
        except Exception as e:
            detail = _error_text(e, cmd)
            detail = detail if len(detail) <= MAX_ERROR_CHARS else "..." + detail[-MAX_ERROR_CHARS:]
            self.report({"type": "error", "node": node, "what": cmd["type"], "rank": self.rank, "message": detail})
            return
        if self.debug:
            peak = self.meter.peak() if self.meter is not None else None
            now = heap_in_use()
            held = (f" (holds {(now - self.meter.heap.base) / 2**20:,.1f} MiB, peak so far {peak / 2**20:,.1f} MiB)"
                    if peak is not None and now is not None and self.meter.heap is not None else "")
            print(f"[{start:9.3f} -> {self.now():9.3f}] {cmd['type']} {node or cmd.get('label', '')}{held}", flush=True)
        if node is not None or cmd["type"] == "export":
            finish = self.now()
            for report in info.pop("members", None) or [info]:  # a fusion: each member, with its start and finish
                report.update(type="done", node=report.get("node", node), rank=self.rank, start=start,
                              finish=finish, mem=self.memory())
                self.report(report)

    def maybe_fail(self, cmd: dict) -> None:
        """The failure-injection hook of the tests: "kill:NODE[:RANK]" or "raise:NODE[:RANK]" makes worker
        RANK (default: the node's lowest rank) die by SIGKILL or raise when it starts node NODE."""
        spec, node = self.setup.fault, cmd.get("node")
        if not spec or node is None:
            return
        parts = spec.split(":")
        action, target = parts[0], parts[1]
        rank = int(parts[2]) if len(parts) > 2 else min(cmd.get("ranks", [self.rank]))
        if target != node or rank != self.rank:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise CommandError(f"injected failure ({FAULT_ENV}={spec})")

    def memory(self) -> int:
        """Bytes this worker holds: its entries, its models' parameters and their optimizer state."""
        # Snapshots of the dicts: the sender thread reports too, while the main loop may add to them.
        entries, serving = list(self.entries.values()), list(self.serving.values())
        training = list(self.training.values())
        held = sum(e.nbytes() for e in entries)
        # Models are only ever added and an optimizer's state only fills once (at its first step), so the
        # models' bytes change only when these counts do (summing every parameter took ~0.7 ms per report).
        # A serving module bound to an entry holds the entry's tensors: they are counted with the entry.
        # A training module sharing its published entry's tensors is counted with the entry too.
        key = (len(serving), len(training), sum(len(st.master.optimizer.state) for st in training),
               tuple(pm.bound is None for pm in serving), tuple(st.shares is None for st in training))
        if self._model_bytes[0] != key:
            mods = sum(_bytes_of(pm.module.parameters()) for pm in serving if pm.bound is None)
            for st in training:
                mods += (_bytes_of(st.pm.module.parameters()) if st.shares is None else 0) + st.master.nbytes()
            self._model_bytes = (key, mods)
        return held + self._model_bytes[1]

    # -- bookkeeping commands -----------------------------------------------------------------------

    def hf_weights(self, model: str) -> HFWeights:
        spec = self.setup.models[model]
        assert spec.hf is not None
        return HFWeights(spec.hf, spec.kind, spec.seed, self.nets[model])

    def version_shards(self, model: str, version: int, layout: Layout,
                       convert: Callable[[Tensor], Tensor] = lambda t: t) -> dict[str, Tensor]:
        """This rank's float32 pieces under `layout` of a version it installs, each `convert`ed as it is read (so a
        serving copy never has all its float32 values at once): read from the resume checkpoint's shard files
        (only the boxes it needs, from whichever files hold them), or version 0: only this rank's slices of the
        model's checkpoint, or only its parameters drawn from the model's seed (the values `hf.initial_model`
        builds whole for the single-process reference). Nothing else is kept."""
        spec = self.setup.models[model]
        if self.resume is not None and version in self.resume.index.get("versions", {}).get(model, ()):
            return self.resume.pieces(ckpt.weights_key(model, version, ""), self.shapes[model], layout, self.rank,
                                      spec.arch.layers, convert)
        if version != 0:
            raise CommandError(f"version {version} of @{model} is neither in the checkpoint nor version 0")
        if spec.hf is not None:
            return self.hf_weights(model).pieces(self.shapes[model], layout, self.rank, convert)
        check_arch(spec.arch, spec.kind, self.nets[model])
        return seeded_shard(self.shapes[model], layout, self.rank, spec.arch.layers, spec.seed,
                            self.nets[model].init_std, convert)

    def cmd_install(self, cmd: dict) -> None:
        m, layout = cmd["model"], cmd["layout"]
        if cmd.get("keep"):  # a resumed version the next checkpoint saves again (tau > 0): its float32 values too
            master = self.version_shards(m, cmd["version"], layout)
            self._keep(m, cmd["version"], layout, master, cmd["tau"])
            shards = {n: t.to(self.device, self.serving_dtype) for n, t in master.items()}
        else:
            shards = self.version_shards(m, cmd["version"], layout, lambda t: t.to(self.device, self.serving_dtype))
        self._put_weights(cmd["label"], Entry("weights", m, cmd["version"], layout, shards=shards))

    def _writes(self, model: str, layout: Layout) -> set[str]:
        """The parameters of `model` whose pieces this rank writes under `layout`: those its data-parallel
        replica owns (`layout.replica_owner`: the pieces whose optimizer state it keeps), and of a piece
        replicated over TP only t = 0's."""
        d, _, t = layout.coord(self.rank)
        owner = replica_owner(self.shapes[model], layout, self.rank, self.setup.models[model].arch.layers)
        pieces = rank_pieces(self.shapes[model], layout, self.rank, self.setup.models[model].arch.layers)
        return {n for n, piece in pieces.items() if owner[n] == d and (piece.dim is not None or t == 0)}

    def _keep(self, model: str, version: int, layout: Layout, shards: dict[str, Tensor], tau: int) -> None:
        mine = self._writes(model, layout)
        self.window[(model, version)] = (layout, {n: t.detach().to("cpu", copy=True) for n, t in shards.items()
                                                  if n in mine})
        for key in [k for k in self.window if k[0] == model and k[1] < version - tau]:
            del self.window[key]

    def cmd_keep(self, cmd: dict) -> None:
        """Keep a copy of this rank's float32 pieces of a new version for later checkpoints (tau > 0: nodes
        after the next checkpoint still read it), dropping the versions older than version - tau."""
        e = self.entries.get(cmd["label"])
        if e is None or e.layout is None or e.model is None:
            raise CommandError(f"keep of {cmd['label']}, which this worker does not hold")
        self._keep(e.model, e.version, e.layout, self.saved_shards(e), cmd["tau"])

    def cmd_release(self, cmd: dict) -> None:
        self.free(cmd["labels"])

    def free(self, labels) -> None:
        for label in labels:
            self.entries.pop(label, None)
            self._unbind(label)

    def _unbind(self, label: str) -> None:
        """Serving modules bound to the tensors of entry `label` let go of them (it is freed or replaced), so
        nothing keeps a copy the plan no longer holds."""
        for pm in self.serving.values():
            if pm.bound == label:
                pm.unbind()

    def _put_weights(self, label: str, entry: Entry) -> None:
        self._unbind(label)  # a module bound to the entry this one replaces keeps no stale copy alive
        self.entries[label] = entry

    def cmd_export(self, cmd: dict) -> dict:
        """Write this rank's shards (weights versions, the optimizer state of trained models, the RNG state)
        as one safetensors file into the checkpoint or final-weights directory `cmd["dir"]`, and report
        what it holds: file name, size, SHA-256 and the box of every tensor (plain values; no tensor goes
        through the control channel).

        cmd: "weights" [[label, key prefix]], "masters" [[model, layout, version, key prefix]] (the float32
        master a training state holds), "window" [[model, version, key prefix]] (kept versions),
        "optimizer" [[model, layout]], "rng" (bool). Every rank of a layout is asked; it writes only the
        pieces `_writes` gives it, so the files of all ranks tile every tensor exactly once and the
        data-parallel replicas share the writing."""
        tensors: dict[str, tuple[Tensor, ckpt.Box, tuple[int, ...]]] = {}

        def add(prefix: str, model: str, layout: Layout, shards: dict[str, Tensor]) -> None:
            mine = self._writes(model, layout)
            pieces = rank_pieces(self.shapes[model], layout, self.rank, self.setup.models[model].arch.layers)
            for n, t in shards.items():
                if n in mine:
                    shape = self.shapes[model][n]
                    tensors[prefix + n] = (t, ckpt.piece_box(pieces[n], shape), shape)

        for label, prefix in cmd.get("weights", ()):
            e = self.entries.get(label)
            if e is None or e.layout is None or e.model is None:
                raise CommandError(f"export of {label}, which this worker does not hold")
            add(prefix, e.model, e.layout, self.saved_shards(e))
        for m, layout, v, prefix in cmd.get("masters", ()):
            st = self.training.get((m, layout))
            if st is None or st.pm.loaded != (m, v):
                raise CommandError(f"checkpoint of the float32 master of version {v} of @{m}, which no training "
                                   f"state on this worker holds")
            add(prefix, m, layout, st.master.export(copy=False))  # written before any later step runs
        for m, v, prefix in cmd.get("window", ()):
            kept = self.window.get((m, v))
            if kept is None:
                raise CommandError(f"checkpoint of version {v} of @{m}, which this worker did not keep")
            add(prefix, m, kept[0], kept[1])
        for m, layout in cmd.get("optimizer", ()):
            st = self.training.get((m, layout))
            if st is None:
                continue
            mine = self._writes(m, layout)
            t_coord = layout.coord(self.rank)[2]
            pieces = rank_pieces(self.shapes[m], layout, self.rank, self.setup.models[m].arch.layers)
            for n in st.master.names:
                shape = self.shapes[m][n]
                for k, v in st.master.adam_state(n).items() if n in mine else ():
                    if not isinstance(v, Tensor):
                        raise CommandError(f"Adam state {k} of {n} is not a tensor; cannot checkpoint it")
                    if v.dim():
                        tensors[ckpt.adam_key(m, n, k)] = (v, ckpt.piece_box(pieces[n], shape), shape)
                    elif t_coord == 0:  # a scalar (the step count) is the same on every TP rank: one copy
                        tensors[ckpt.adam_key(m, n, k)] = (v, ((), ()), ())
        if cmd.get("rng"):
            state = torch.get_rng_state()
            tensors[ckpt.rng_key(self.rank)] = (state, ((0,), tuple(state.shape)), tuple(state.shape))
        path = os.path.join(cmd["dir"], ckpt.shard_file(self.rank, cmd.get("part", "")))
        try:
            report = ckpt.write_shard_file(path, tensors)
        except OSError as e:
            raise CommandError(f"cannot write {path}: "
                               f"{e.strerror or e}") from None
        return {"export": cmd["export"], **report}

    def saved_shards(self, e: Entry) -> dict[str, Tensor]:
        """What an export saves of a weights entry: the entry, unless it is a reduced-precision serving copy
        of the version a training state here holds in the same layout; then that state's float32 masters (of the
        share this rank writes), so checkpoints resume exactly and final weights are the trained ones, not their
        bf16 rounding."""
        st = self.training.get((e.model, e.layout)) if e.model is not None and e.layout is not None else None
        if st is not None and not e.full_precision() and st.pm.loaded == (e.model, e.version):
            return st.master.export(copy=False)
        return e.shards

    # -- transfers ----------------------------------------------------------------------------------

    def rows_of(self, labels: list[str], lo: int, hi: int, fields: list[str]) -> dict[str, Tensor]:
        """Rows [lo, hi) of each field, assembled from the pieces this worker holds of `labels`."""
        pieces = [p for lab in labels if lab in self.entries for p in self.entries[lab].pieces]
        return {f: self._field_rows([p for p in pieces if f in p.fields], f, lo, hi, labels) for f in fields}

    def _field_rows(self, pieces: list[Piece], f: str, lo: int, hi: int, labels: list[str]) -> Tensor:
        parts, cur = [], lo
        while cur < hi:
            best = None
            for p in pieces:
                if p.lo <= cur < p.hi and (best is None or p.hi > best.hi):
                    best = p
            if best is None:
                raise CommandError(f"rows [{cur}, {hi}) of '{f}' are not held on worker {self.rank} "
                                   f"(artifacts {labels})")
            end = min(best.hi, hi)
            parts.append(best.fields[f][cur - best.lo:end - best.lo])
            cur = end
        return torch.cat(parts) if parts else self.empty(f, 0)

    def empty(self, name: str, rows: int) -> Tensor:
        shape, dtype = field_spec(name, self.run)
        return torch.zeros((rows, *shape), dtype=dtype, device=self.device)

    def move_rows(self, moves: list[RowMove], sources: list[str], target: str, fields: list[str], tag0: int) -> int:
        """Execute row moves; received rows become pieces of `target`. Returns bytes this rank sent."""
        ops, received, sent = [], [], 0
        for i, m in enumerate(moves):
            if m.src == self.rank and m.dst == self.rank:
                received.append(Piece(m.lo, m.hi, {k: v.clone() for k, v in
                                                   self.rows_of(sources, m.lo, m.hi, fields).items()}))
                continue
            if m.src == self.rank:
                data = self.rows_of(sources, m.lo, m.hi, fields)
                for j, f in enumerate(fields):
                    t = data[f].contiguous()
                    sent += t.numel() * t.element_size()
                    ops.append(dist.isend(t, m.dst, tag=tag0 + 16 * i + j))
            elif m.dst == self.rank:
                bufs = {f: self.empty(f, m.hi - m.lo) for f in fields}
                for j, f in enumerate(fields):
                    ops.append(dist.irecv(bufs[f], m.src, tag=tag0 + 16 * i + j))
                received.append(Piece(m.lo, m.hi, bufs))
        for op in ops:
            op.wait()
        if received:
            entry = self.entries.setdefault(target, Entry("data"))
            entry.pieces.extend(received)
        return sent

    def move_weights(self, moves: list[WeightMove], src_label: str, model: str, layout: Layout,
                     tag0: int) -> tuple[Optional[dict[str, Tensor]], int, Optional[int]]:
        """Execute weight moves into this rank's pieces under `layout`; (shards or None, bytes sent, version)."""
        shapes = self.shapes[model]
        layers = self.setup.models[model].arch.layers
        src = self.entries.get(src_label)
        version = src.version if src is not None else None
        mine = rank_pieces(shapes, layout, self.rank, layers) if self.rank in layout.ranks else {}
        new: dict[str, Tensor] = {}
        for name, piece in mine.items():
            shape = list(shapes[name])
            if piece.dim is not None:
                shape[piece.dim] = piece.hi - piece.lo
            new[name] = torch.empty(shape, dtype=self.serving_dtype, device=self.device)
        ops, sent = [], 0
        for i, m in enumerate(moves):
            if m.src == self.rank:
                if src is None:
                    raise CommandError(f"{src_label} is not held on worker {self.rank}")
                t = self._src_slice(src, m)
                if m.dst == self.rank:
                    self._dst_slice(new, mine, m).copy_(t)
                    continue
                t = t.contiguous()
                sent += t.numel() * t.element_size()
                ops.append(dist.isend(t, m.dst, tag=tag0 + i))
            elif m.dst == self.rank:
                view = self._dst_slice(new, mine, m)
                buf = torch.empty(view.shape, dtype=self.serving_dtype, device=self.device)  # as sent
                ops.append((dist.irecv(buf, m.src, tag=tag0 + i), view, buf))
        for op in ops:
            if isinstance(op, tuple):
                op[0].wait()
                op[1].copy_(op[2])
            else:
                op.wait()
        return (new if mine else None), sent, version

    def _src_slice(self, entry: Entry, m: WeightMove) -> Tensor:
        """The part [m.lo, m.hi) along m.dim of the piece of `m.name` this rank holds in `entry`."""
        t = entry.shards[m.name]
        if m.dim is None:
            return t
        assert entry.layout is not None and entry.model is not None
        layers = self.setup.models[entry.model].arch.layers
        held = rank_pieces(self.shapes[entry.model], entry.layout, self.rank, layers)[m.name]
        lo = held.lo if held.dim is not None else 0
        return t.narrow(m.dim, m.lo - lo, m.hi - m.lo)

    @staticmethod
    def _dst_slice(new: dict[str, Tensor], mine: dict, m: WeightMove) -> Tensor:
        t = new[m.name]
        if m.dim is None:
            return t
        piece = mine[m.name]
        lo = piece.lo if piece.dim is not None else 0
        return t.narrow(m.dim, m.lo - lo, m.hi - m.lo)

    def cmd_comm_data(self, cmd: dict) -> dict:
        sent = self.move_rows(cmd["moves"], cmd["sources"], cmd["target"], cmd["fields"], cmd["tag"])
        return {"bytes": sent, "versions_in": {}}

    def cmd_move_weights(self, cmd: dict) -> dict:
        """A weights Comm (to another allocation) or a Reshard (same allocation, another layout)."""
        m, layout = cmd["model"], cmd["layout"]
        shards, sent, version = self.move_weights(cmd["moves"], cmd["source"], m, layout, cmd["tag"])
        if cmd["source"] == cmd["target"] and self.rank in cmd["src_ranks"]:
            self.free([cmd["source"]])  # a Reshard replaces the old layout
        if shards is not None:
            self._put_weights(cmd["target"], Entry("weights", m, cmd["version"], layout, shards=shards))
        return {"bytes": sent, "versions_in": {m: version} if version is not None else {}}

    # -- model invocations --------------------------------------------------------------------------

    def serving_model(self, model: str, layout: Layout, label: str) -> tuple[ParallelModel, int]:
        """The execution module of (model, layout) loaded with the version in `label`."""
        key = (model, layout)
        pm = self.serving.get(key)
        if pm is None:
            spec = self.setup.models[model]
            pm = self.serving[key] = ParallelModel(spec.arch, spec.kind, self.nets[model], layout, self.rank,
                                                   self.groups, self.setup.tp_impl, self.device, self.serving_dtype)
        e = self.entries.get(label)
        if e is None:
            raise CommandError(f"{label} is not held on worker {self.rank}")
        if pm.bound != label or pm.loaded != (model, e.version):
            pm.bind(e.shards, label)  # the module serves the entry's own tensors: one copy
            pm.loaded = (model, e.version)
        return pm, e.version

    def train_state(self, model: str, layout: Layout, train: Training) -> TrainState:
        """The training state of (model, layout), made on first use for `train`: its module computes in the training
        dtype, recomputes and reduces as `train` says, its optimizer steps the parameters of its ZeRO share."""
        key = (model, layout)
        st = self.training.get(key)
        if st is None:
            spec = self.setup.models[model]
            pm = ParallelModel(spec.arch, spec.kind, self.nets[model], layout, self.rank, self.groups, self.setup.tp_impl,
                               self.device, training_dtype(self.run.workload, train))
            pm.zero, pm.module.recompute = train.zero, train.recompute
            lr = self.run.rl.lr_critic if spec.kind == "critic" else self.run.rl.lr_actor
            master = MasterWeights(pm.params(), pm.stepped(), lr, self.run.rl)
            if self.resume is not None and model in self.resume.index.get("optimizer", ()):
                self._load_optimizer(master, pm, model)
            st = self.training[key] = TrainState(pm, master, train)
        elif st.train != train:
            raise CommandError(f"@{model} trains in layout {layout.short()} as {st.train}, and now as {train}: one "
                               "training vertex per model and layout trains one way")
        return st

    def master_shards(self, model: str, layout: Layout, e: Entry) -> dict[str, Tensor]:
        """The float32 values a training state (re)starts from at version `e.version`: the entry when it is
        float32; else the full-precision version it was cast from (version 0 by seed, or the checkpoint),
        since a bf16 serving copy has lost bits the master must keep."""
        if e.full_precision():
            return e.shards
        try:
            return self.version_shards(model, e.version, layout)
        except CommandError as err:
            raise CommandError(f"training @{model} cannot start from the {self.serving_dtype} serving copy of "
                               f"version {e.version}: {err}") from None

    def _load_optimizer(self, master: MasterWeights, pm: ParallelModel, model: str) -> None:
        """This rank's pieces of the checkpointed Adam state under its layout (reshard on load), for the parameters
        of its replica's share (another replica's share: its owner keeps that state)."""
        assert self.resume is not None
        pieces = rank_pieces(self.shapes[model], pm.layout, self.rank, self.setup.models[model].arch.layers)
        for name in master.names:
            device = master.values[name].device
            prefix = ckpt.adam_key(model, name, "")
            local = {}
            for key in self.resume.keys(prefix):
                k = key[len(prefix):]
                if self.resume.shape(key):
                    local[k] = self.resume.read_piece(key, pieces[name]).to(device)
                else:  # 0-dim state (Adam's step count), on the parameter's device as the fused Adam keeps it
                    local[k] = self.resume.read(key).to(device)
            if local:
                master.set_adam_state(name, local)

    def prep(self, cmd: dict) -> None:
        """Move inputs into the invocation's layout first (rows to replicas, weights to shards)."""
        for i, step in enumerate(cmd.get("prep", ())):
            tag = cmd["tag"] + 100000 * (i + 1)
            if step["kind"] == "rows":
                self.move_rows(step["moves"], [step["label"]], step["label"], step["fields"], tag)
            else:
                shards, _, _ = self.move_weights(step["moves"], step["label"], step["model"], step["layout"], tag)
                if shards is not None:
                    e = self.entries[step["label"]]
                    self._put_weights(step["label"], Entry("weights", e.model, e.version, step["layout"], shards=shards))

    def cmd_op(self, cmd: dict) -> dict:
        self.prep(cmd)
        role = cmd["role"]
        lo, hi = cmd["rows"][self.rank]
        if role == "training":
            return self.op_training(cmd, lo, hi)
        if role == VERIFY:
            return self.op_verify(cmd, lo, hi)
        pm, version = self.serving_model(cmd["model"], cmd["layout"], cmd["weights"])
        report: dict = {}
        if role == "generation":
            fields = self.op_generation(cmd, pm, lo, hi)
        else:
            fields, report = self.op_inference(cmd, pm, lo, hi)
        for label, names in cmd["outputs"].items():
            self.entries[label] = Entry("data", pieces=[Piece(lo, hi, {f: fields[f] for f in names})])
        out = {"bytes": 0, "versions_in": {cmd["model"]: version}}
        if "reward_stats" in report:
            out["reward_stats"] = report["reward_stats"]
        return out

    def cmd_fused(self, cmd: dict) -> dict:
        """The members of a fusion (their op commands) as one operator: each in a thread of its own, taking turns in
        the order of this rank's pipeline stage (interleave.py); one report per member."""
        members = cmd["members"]
        _, p, _ = members[0]["layout"].coord(self.rank)
        order = [microtask_of(t, p) for t in cmd["stages"][p]]
        inter = Interleave(len(members), [(t.member, t.kind, t.micro) for t in order], self.now)
        results = run_members(inter, [lambda c=c: self.cmd_op(c) for c in members])
        return {"members": [dict(info, node=c["node"], microtasks=[[self.rank, p, *t] for t in inter.records[i]])
                            for i, (c, info) in enumerate(zip(members, results))]}

    def chunks(self, cmd: dict, lo: int, hi: int) -> list[tuple[int, int]]:
        n = hi - lo
        return [c for c in split_rows(lo, hi, max(1, min(cmd["mb"], n))) if c[1] > c[0]] if n else []

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

    def op_generation(self, cmd: dict, pm: ParallelModel, lo: int, hi: int) -> dict[str, Tensor]:
        w, rl = self.run.workload, self.run.rl
        prompts = expand_rollouts(self.step_batch(cmd["step"]).tokens, w.R).to(self.device)
        pads = self.row_pads(cmd["step"], lo, hi)
        roll = generate(pm, prompts[lo:hi], self.chunks(cmd, lo, hi), seed=self.setup.seed, step=cmd["step"],
                        max_new_tokens=w.Lr, sampling=rl.sampling, eos_id=self.prompts.eos_id,
                        pad_id=self.prompts.pad_id, pads=pads)
        out = {"sequences": roll.sequences, "mask": roll.mask, "old_logprobs": roll.logprobs}
        if "values" in cmd["fields"]:
            out["values"] = self.forward_field(cmd, pm, out, "values", lo, hi, pads)
        return out

    def op_inference(self, cmd: dict, pm: ParallelModel, lo: int, hi: int) -> tuple[dict[str, Tensor], dict]:
        """The fields of an inference vertex, and what a reward function's calls report (accuracy sums,
        failures) from one rank of each replica."""
        return self.alg.inference(self, cmd, pm, lo, hi)

    def verifier_scores(self, cmd: dict, pm: ParallelModel, data: dict[str, Tensor], lo: int, hi: int,
                        report: dict) -> Tensor:
        """The toy rule's or the reward function's scores of the rows (computed once per vertex)."""
        if "verifier" not in report:
            scores, scored = score_responses(self.prompts, self.reward_fn, self.step_batch(cmd["step"]),
                                             data["sequences"], data["mask"], range(lo, hi), self.run.workload.R)
            report["verifier"] = scores
            if scored is not None and pm.is_last and pm.t == 0:  # the rows' one reporter in its replica
                report["reward_stats"] = reward_stats(scored)
        return report["verifier"]

    def op_verify(self, cmd: dict, lo: int, hi: int) -> dict:
        """A verify vertex: the run's reward function over the rows' responses in the plan's pool of processes (the
        toy rule here), written as the rewards container's fields; what its calls report."""
        data = self.rows_of(cmd["inputs"], lo, hi, ["sequences", "mask"])
        pool = self.verifier_pool(cmd["pool"])
        if pool.function:
            scores, scored = score_rows(pool.score_texts, self.prompts, self.step_batch(cmd["step"]),
                                        data["sequences"], data["mask"], range(lo, hi), self.run.workload.R)
        else:
            scores, scored = score_responses(self.prompts, None, self.step_batch(cmd["step"]), data["sequences"],
                                             data["mask"], range(lo, hi), self.run.workload.R)
        for label, names in cmd["outputs"].items():
            self.entries[label] = Entry("data", pieces=[Piece(lo, hi, {f: scores for f in names})])
        out: dict = {"bytes": 0, "versions_in": {}}
        if scored is not None:
            out["reward_stats"] = reward_stats(scored)
        return out

    def verifier_pool(self, size: int) -> VerifierPool:
        """The pool of the run's reward function, of the plan's size (started on first use)."""
        if self.pool is None or self.pool.size != size:
            if self.pool is not None:
                self.pool.close()
            self.pool = VerifierPool(self.run.reward, size)
        return self.pool

    def forward_field(self, cmd: dict, pm: ParallelModel, data: dict[str, Tensor], f: str, lo: int,
                      hi: int, pads: Optional[Tensor], temperature: Optional[float] = None) -> Tensor:
        """A teacher-forced field (log-probs, values, reward-model scores) for the rows, in pipelined microbatches;
        log-probs at the sampling temperature unless `temperature` is given."""
        lp = self.run.workload.Lp
        temp = self.run.rl.temperature if temperature is None else temperature
        if f not in ("old_logprobs", "ref_logprobs", "values", "scores"):
            raise CommandError(f"the torch backend cannot compute field '{f}'")
        fns, rows = [], []
        for a, b in self.chunks(cmd, lo, hi):
            rows.append(b - a)
            seqs, mask = data["sequences"][a - lo:b - lo], data["mask"][a - lo:b - lo]
            p = None if pads is None else pads[a - lo:b - lo]
            if f == "values":
                fns.append(lambda v, s=seqs, p=p: response_forward(v, s, lp, pads=p).values)
            elif f == "scores":
                fns.append(lambda v, s=seqs, m=mask, p=p: last_token_scores(v, s, lp, m, p))
            else:
                fns.append(lambda v, s=seqs, p=p: response_forward(v, s, lp, temp, pads=p).logprobs)
        return infer(pm, fns, rows) if fns else self.empty(f, 0)

    def dp_sum(self, pm: ParallelModel):
        def reduce(t: Tensor) -> Tensor:
            t = t.clone()
            if pm.dp_group is not None:
                dist.all_reduce(t, group=pm.dp_group)
            return t
        return reduce

    def loaded_state(self, cmd: dict) -> tuple[TrainState, Entry]:
        """The training state of the command's model and layout, holding the version it trains as its own working
        copy: the published copy it shares is taken over when the command is its last reader (`take`: the memory
        model's one 16-bit copy, M_w of the training operator), else copied first, so that a later reader of that
        version finds it unchanged; a copy the command does not need (the state holds the version already, or
        loaded it from the masters) it lets go of when it is the last reader."""
        model, layout = cmd["model"], cmd["layout"]
        st = self.train_state(model, layout, cmd.get("train") or self.run.workload.training())
        label, take = cmd["weights"], bool(cmd.get("take"))
        e = self.entries.get(label)
        if e is None:
            raise CommandError(f"{label} is not held on worker {self.rank}")
        if st.pm.loaded != (model, e.version):
            values = self.master_shards(model, layout, e)
            self._own_parameters(st, keep_values=False)
            st.pm.load(values)
            st.master.load(values)
            st.pm.loaded = (model, e.version)
        elif st.shares is not None and not (take and st.shares == label):
            self._own_parameters(st)  # a copy of the shared tensors, which stay with their entry
        if take:
            self.free([label])
        if st.shares == label:
            st.shares = None  # taken over: the tensors are the module's alone now
        return st, e

    def _own_parameters(self, st: TrainState, keep_values: bool = True) -> None:
        """Give the module tensors of its own where it shares an entry's (before it loads or trains in place): copies,
        or uninitialised ones when a load follows."""
        if st.shares is not None:
            with torch.no_grad():
                for p in st.pm.params().values():
                    p.data = p.data.clone() if keep_values else torch.empty_like(p.data)
            st.shares = None

    def publish(self, cmd: dict, st: TrainState) -> int:
        """The trained version as a serving copy of the working weights (the masters stay in the training state):
        in mixed precision the module's own tensors, one copy (a later step takes it over or copies it); under
        fp32 a copy (cast to the serving dtype), the module's float32 parameters staying as the masters."""
        pm = st.pm
        model, version = cmd["model"], cmd["version_out"]
        pm.loaded = (model, version)
        weights = pm.export() if st.train.persistent_weights else {n: p.detach() for n, p in pm.params().items()}
        self._put_weights(cmd["output"], Entry("weights", model, version, cmd["layout"],
                                               shards=cast_weights(weights, self.serving_dtype)))
        if not st.train.persistent_weights:
            st.shares = cmd["output"]
        return version

    def op_training(self, cmd: dict, lo: int, hi: int) -> dict:
        return self.alg.train(self, cmd, lo, hi)


def _error_text(e: Exception, cmd: dict) -> str:
    """What a command's failure says: the message of an error the runtime raises (located where it has a file), a
    non-finite quantity with its step, else the traceback of a bug."""
    if isinstance(e, NonFiniteError):
        return (f"step {cmd.get('step')}: {e}, so the run stops before the step is applied or saved "
                "(the last checkpoint stays)")
    if isinstance(e, RpegError):
        return e.quoted()
    if isinstance(e, CommandError):
        return str(e)
    if _out_of_memory(e):
        return (f"out of memory: {error_line(e)} (the cost model's estimate is checked against each worker before "
                "launch unless --no-memory-check)")
    return traceback.format_exc(limit=8)


def _out_of_memory(e: Exception) -> bool:
    """An allocation the device or the host refused: torch's OutOfMemoryError, Python's MemoryError, or the CPU
    allocator's RuntimeError."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def _setup_failed(channel: Endpoint, rank: int, message: str) -> int:
    channel.push("res", {"type": "error", "node": None, "what": "setup", "rank": rank,
                         "message": message[-MAX_ERROR_CHARS:]})
    return 1


def standalone_worker(run: RunConfig, models: dict[str, ModelSpec], *, rank: int = 0, world: int = 1, seed: int = 0,
                      tp_impl: str = "torch", device: Optional[torch.device] = None) -> Worker:
    """A worker outside a controlled run (no store, no layouts of its own): what tests, rpeg-validate and
    the GPU smoke script drive directly with `cmd_*` calls. With world > 1 the caller must already have
    joined torch.distributed and set `worker.groups`."""
    setup = WorkerSetup(world=world, seed=seed, run=run, models=models, layouts=(), tp_impl=tp_impl,
                        t0=time.time(), timeout_s=300.0)
    return Worker(setup, rank, channel=None, device=device)


def _log(rank: int) -> Callable[[str], None]:
    def log(line: str) -> None:
        print(f"rpeg-torch-worker {rank}: {line}", file=sys.stderr, flush=True)
    return log


def run_worker(host: str, port: int, rank: int, world: int, env: dict[str, str], *, secret: Optional[bytes] = None,
               secret_file: Optional[str] = None, link=None) -> int:
    """Join the controller's store and process group, then serve commands until told to stop. `env` holds
    the launcher's variables (LOCAL_RANK, SLURM_LOCALID); a locally launched worker passes none. The run's
    secret is `secret` (a forked worker) or read from `secret_file` once the store is up. `link`: the
    forked worker's pipe to the controller, which then carries its commands and reports (messages.py)."""
    torch.set_num_threads(1)
    if secret is None and not secret_file:
        read_secret(None)  # the one-line error, before waiting for a store
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120))
    except RuntimeError as e:  # DistNetworkError: nothing serves the address within the timeout
        raise RpegError(None, f"cannot reach the control store at {host}:{port}: {error_line(e)}") from None
    links = {"res": link, f"cmd/{rank}": link} if link is not None else {}
    channel = Endpoint(store, secret if secret is not None else read_secret(secret_file), f"worker-{rank}", _log(rank),
                       links=links)
    try:
        setup = channel.get("setup")["setup"]
    except MessageError as e:
        raise MessageError(f"the run setup in the store at {host}:{port} is {e.message}; "
                           "is the secret that of this run?") from None
    if not isinstance(setup, WorkerSetup):
        raise MessageError("the run setup in the store is not a worker setup")
    if world and world != setup.world:
        raise SystemExit(f"worker {rank}: launched for {world} ranks, the plan needs {setup.world}")
    try:
        device = worker_device(setup.dist_backend, rank, env)
    except RpegError as e:
        return _setup_failed(channel, rank, e.quoted())
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL starts: its communicators bind to the current device
    dist.init_process_group(setup.dist_backend, store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=setup.world, timeout=timedelta(seconds=setup.timeout_s))
    commands = None
    if link is None:  # over the store: the command reader gets a connection of its own (Worker.commands)
        commands = Endpoint(dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120)),
                            channel.secret, f"worker-{rank}", _log(rank))
    try:
        worker = Worker(setup, rank, channel, device, commands)
    except Exception as e:  # a located error (a checkpoint, a config), else the traceback of a bug
        return _setup_failed(channel, rank, _error_text(e, {}))
    if device.type == "cpu":  # after the process groups exist: their threads stay free (pinning.py)
        if setup.core_slots is not None and not env:  # launched here: the plan's slots
            slots = setup.core_slots
            core = pin_slots(slots[rank], 1 + max(s for ss in slots for s in ss), setup.dist_backend)
        else:
            core = pin_cpu_worker(local_rank(rank, env, setup.world), local_workers(setup.world, env),
                                  setup.dist_backend)
        cores = (core,) if isinstance(core, int) else core
        _log(rank)(f"main thread bound to core{'s' if len(cores) > 1 else ''} {', '.join(map(str, cores))}" if cores
                   else "not bound to a core (more workers than cores on this node, or the launcher does not say how "
                        "many share it)")
    worker.loop()
    return 0


def spawn_main(host: str, port: int, rank: int, world: int, log_path: str, secret: bytes, link=None) -> None:
    """Entry of a locally launched worker: output to its log file, then `run_worker`; exits hard at the end
    (tearing down the interpreter and gloo politely costs seconds and holds nothing we need)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 1
    try:
        code = run_worker(host, port, rank, world, {}, secret=secret, link=link)  # GPU = rank modulo the GPUs
    except RpegError as e:
        print(f"rpeg-torch-worker {rank}: error: {e.quoted()}", flush=True)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="rpeg-torch-worker")
    ap.add_argument("--store", required=True, help="HOST:PORT of the controller's TCPStore")
    rank, world = rank_and_world(os.environ)
    ap.add_argument("--rank", type=int, default=rank, help="default: RANK or SLURM_PROCID")
    ap.add_argument("--world", type=int, default=world, help="default: WORLD_SIZE or SLURM_NTASKS")
    ap.add_argument("--secret-file", default=os.environ.get(SECRET_ENV) or None, metavar="PATH",
                    help=f"the run's control secret, as rpeg-run --store wrote it (default: ${SECRET_ENV})")
    args = ap.parse_args(argv)
    host, _, port = args.store.rpartition(":")
    if not port.isdigit():
        ap.error(f"--store {args.store} is not HOST:PORT")
    try:
        code = run_worker(host, int(port), args.rank, args.world, dict(os.environ), secret_file=args.secret_file)
    except RpegError as e:
        print(f"rpeg-torch-worker {args.rank}: error: {e.quoted()}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    # run the module's own main, not this __main__ copy: messages rebuild the module's classes (WorkerSetup)
    from rpegc.runtime.backends.torch.worker.process import main as _main

    sys.exit(_main())
