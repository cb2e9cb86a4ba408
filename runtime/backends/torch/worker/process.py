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
itself, its own shards, as one safetensors file into the run directory (worker/shard_writer.py,
checkpoints/shard_files.py; copied to the CPU first); only the file's name, size, SHA-256 and tensor boxes go
back to the controller. A command reports completion only after the GPU has finished its work.

Control channel (all through the store, so it works across nodes; `messages.py`): the controller pushes
the commands of rank r onto the store queue `cmd/r`, the worker pushes its reports onto `res`; both are
plain, bounded messages sealed with the run's secret (a message that is not authentic is dropped and
logged to the worker log, never executed). A locally forked worker gets the secret from its parent; an
external one reads it from --secret-file PATH or $RPEG_RUN_SECRET_FILE (mode 0600, written by `rpeg-run
--store`). The worker blocks in the store until its next command comes (`WAIT`: an idle hour at most
before it checks that the controller is still there), so a normal run logs no c10d timeout.
Commands run strictly in order, so every rank meets the collectives of concurrent nodes in the same
order. A command is one of the frozen dataclasses of channel/commands.py, read by attribute: it runs a node
(Op, Fused, CommData, MoveWeights: a NodeCommand) or is bookkeeping (Install, Release, Keep, Export, Stop).

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
  `TrainStates.loaded`), under fp32 as a copy in the serving dtype. A master never reloads from a
  reduced-precision copy: a training state starts from the float32 version it was cast from (version 0 by seed,
  or the checkpoint), and checkpoints and final weights save the masters (each data-parallel replica its share).
  Version 0 is never held whole: a rank draws (or reads from the checkpoint) only the pieces it installs;
- data artifacts: `data` entries, row pieces of a container for one step (and phase), float32/int64.

This module is the command loop and the process's entry points; the worker's parts, which share one `Holdings`:
holdings.py (what it keeps, and install / keep / release), transfers.py (Comm and Reshard moves), operators.py
(Op nodes and fusions; step_inputs.py: the steps' prompts), train_states.py, shard_writer.py (export).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rpegc.core.ir.errors import RpegError, error_line
from rpegc.runtime.backends.torch.channel.commands import Command, Install, NodeCommand
from rpegc.runtime.backends.torch.channel.messages import SECRET_ENV, Endpoint, MessageError, read_secret
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec, WorkerSetup
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.controller.device import local_rank, rank_and_world, synchronize, worker_device
from rpegc.runtime.backends.torch.controller.pinning import local_workers, pin_cpu_worker, pin_slots, thread_cores
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.parallel.parallel_model import ProcessGroups
from rpegc.runtime.backends.torch.rl.finite import NonFiniteError
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.backends.torch.worker.holdings import CommandError, Entry, Holdings
from rpegc.runtime.backends.torch.worker.host_memory import heap_in_use, release_freed
from rpegc.runtime.backends.torch.worker.operators import Operators
from rpegc.runtime.backends.torch.worker.peak_memory import PeakMeter
from rpegc.runtime.backends.torch.worker.sender import CommandRouter
from rpegc.runtime.backends.torch.worker.shard_writer import ShardWriter
from rpegc.runtime.backends.torch.worker.step_inputs import StepInputs
from rpegc.runtime.backends.torch.worker.thread_cpu import read_thread_cpu, thread_wait_s, usage
from rpegc.runtime.backends.torch.worker.train_states import TrainStates
from rpegc.runtime.backends.torch.worker.transfers import Transfers

FAULT_ENV = "RPEG_TORCH_FAULT"  # "kill:NODE[:RANK]" or "raise:NODE[:RANK]": a test hook
WAIT = timedelta(hours=1)  # longest blocking wait for a command before checking on the controller
MAX_ERROR_CHARS = 8000  # an error report keeps the tail of a longer traceback


SWITCH_INTERVAL_S = 2e-4  # the worker's threads' turn at the interpreter (sys.setswitchinterval; Python: 5 ms)


class Worker:
    """One rank's command loop: it reads the controller's commands, runs each in the part of the worker that does it,
    and reports. The parts share one `Holdings` (what the worker holds): `transfers` (rows and weights to and from
    other ranks), `operators` (Op nodes, fusions), `states` (training states), `shards` (its checkpoint files).

    Driven outside a run (`standalone_worker`: tests, rpeg-validate, the GPU smoke script), its public surface is
    `execute` (one command as a run sends it, raising where a run reports an error), `install` and `put_rows` (a
    weights version, data rows), `holds` and `entry` (what it holds under a label) and `memory`; a test inspects the
    parts."""

    def __init__(self, setup: WorkerSetup, rank: int, channel: Optional[Endpoint] = None,
                 device: Optional[torch.device] = None, commands: Optional[Endpoint] = None,
                 groups: Optional[ProcessGroups] = None):
        self.setup, self.rank, self.channel = setup, rank, channel
        # where commands are read: the channel's link, or over the store a connection of the reader thread's own (a
        # store client serves one request at a time, and a reader waiting for a command would hold up every report)
        self.commands = commands if commands is not None else channel
        # Without a device: the one a locally launched worker of this backend gets (the CPU for gloo).
        self.device = device if device is not None else worker_device(setup.dist_backend, rank, {})
        self.run = setup.run
        self.debug = bool(os.environ.get("RPEG_TORCH_DEBUG"))  # one line per command in the worker log
        self.meter: Optional[PeakMeter] = None  # what the worker held at its peak (`loop`)
        self.holdings = held = Holdings(setup, rank, self.device)
        inputs = StepInputs(setup, self.device)  # before the groups: a bad data file fails before any rank waits
        # all ranks create the plan's groups, in one order; standalone: the caller's (or none)
        self.groups = groups if groups is not None else ProcessGroups(setup.layouts)
        self.transfers = Transfers(held)
        self.states = TrainStates(held, self.groups)
        self.operators = Operators(held, self.transfers, inputs, self.states, self.groups, self.now)
        self.shards = ShardWriter(held)
        # what runs each command type (commands.COMMAND_CLASSES; "stop" ends the loop)
        self.runs: dict[str, Callable[[Any], Optional[dict]]] = {
            "install": held.install, "keep": held.keep, "release": held.release, "export": self.shards.export,
            "comm_data": self.transfers.comm_data, "move_weights": self.transfers.comm_weights,
            "op": self.operators.op, "fused": self.operators.fused}
        self._report_lock = threading.Lock()
        if held.resume is not None and ckpt.rng_key(self.rank) in held.resume:
            torch.set_rng_state(held.resume.read(ckpt.rng_key(self.rank)))

    def now(self) -> float:
        return time.time() - self.setup.t0

    # -- public surface outside a run ---------------------------------------------------------------

    def execute(self, cmd: Command) -> dict:
        """Run one command (any of commands.COMMAND_CLASSES but Stop) and return what it reports; raises what a
        run would report as an error."""
        return self.runs[cmd.type](cmd) or {}

    def install(self, label: str, model: str, layout: Layout, version: int = 0) -> None:
        """Hold version `version` of `model` under `layout` (this rank's pieces) as the weights entry `label`."""
        self.holdings.install(Install(label=label, model=model, version=version, layout=layout))

    def put_rows(self, label: str, lo: int, hi: int, fields: dict[str, Tensor]) -> None:
        """Hold rows [lo, hi) of `fields` as the data entry `label` (replacing what it held)."""
        self.holdings.put_rows(label, lo, hi, fields)

    def holds(self, label: str) -> bool:
        return label in self.holdings.entries

    def entry(self, label: str) -> Entry:
        """The artifact held under `label` (CommandError if none)."""
        return self.holdings.held(label)

    def memory(self) -> int:
        """Bytes this worker holds: its entries, its models' parameters and their optimizer state."""
        return self.holdings.nbytes()

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

    def next_command(self) -> Command:
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

    def start_threads(self) -> CommandRouter:
        """The heap meter's and the command router's threads (the reader and the sender). Started before the main
        thread is bound to its core (pinning.pin_main_thread frees the threads that exist then; a thread started
        after inherits the main thread's core), so that they run on whichever core is free: bound beside the
        operators, a worker's own reports, commands and sends took from its operators even while another core
        idled."""
        self.meter = PeakMeter(self.device)
        self.meter.start()  # what the plan makes this worker hold is measured from here on
        # A transfer's source side runs on a sender thread beside the operators (sender.py). The reader and the
        # sender hold the interpreter briefly; an operator's Python holds it otherwise, and would keep them waiting
        # the default 5 ms switch interval for each message and send.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        return CommandRouter(self.next_command, lambda cmd: self.handle(cmd, sender=True)).start()

    def loop(self, commands: CommandRouter) -> None:
        meter = self.meter
        cpu = read_thread_cpu(children=True)
        self.report({"type": "ready", "rank": self.rank, "groups": len(self.groups)})
        while True:
            cmd = commands.next()
            if cmd.type == "stop":
                use = usage(cpu, read_thread_cpu(children=True))  # before a verifier pool's processes exit with it
                self.operators.close()
                # the controller keeps its store until all said bye
                self.report({"type": "bye", "rank": self.rank, "peak": meter.peak(), "resident": meter.resident(),
                             "cpu": use.plain() if use else None})
                return
            self.handle(cmd)
            commands.finished(cmd)

    def handle(self, cmd: Command, sender: bool = False) -> None:
        """Run one command and report it; `sender`: on the sender thread, a transfer's source side (it frees and
        trims nothing: the main loop owns what the worker holds)."""
        start, waited_before = self.now(), thread_wait_s()
        node = cmd.node if isinstance(cmd, NodeCommand) else None
        try:
            if not sender:
                if node is not None:
                    self.holdings.free(cmd.release)  # copies freed since this rank's last command
                release_freed()  # every command starts from what the worker holds, not its last high-water mark
            if node is not None:
                self.maybe_fail(cmd)
            info = self.execute(cmd)
            synchronize(self.device)  # finished means the device finished (and its errors surface here)
        except Exception as e:
            detail = _error_text(e, getattr(cmd, "step", None))
            detail = detail if len(detail) <= MAX_ERROR_CHARS else "..." + detail[-MAX_ERROR_CHARS:]
            self.report({"type": "error", "node": node, "what": cmd.type, "rank": self.rank, "message": detail})
            return
        if self.debug:
            peak = self.meter.peak() if self.meter is not None else None
            now = heap_in_use()
            held = (f" (holds {(now - self.meter.heap.base) / 2**20:,.1f} MiB, peak so far {peak / 2**20:,.1f} MiB)"
                    if peak is not None and now is not None and self.meter.heap is not None else "")
            what = node or getattr(cmd, "label", "")
            print(f"[{start:9.3f} -> {self.now():9.3f}] {cmd.type} {what}{held}", flush=True)
        if node is not None or cmd.type == "export":
            finish, waited_after = self.now(), thread_wait_s()
            members = info.pop("members", None)
            if not members and node is not None and waited_before is not None and waited_after is not None:
                # (not a fusion's: its members run on threads of their own)
                info["waited"] = max(0.0, waited_after - waited_before)
            for report in members or [info]:  # a fusion: each member, with its start and finish
                report.update(type="done", node=report.get("node", node), rank=self.rank, start=start,
                              finish=finish, mem=self.holdings.nbytes())
                self.report(report)

    def maybe_fail(self, cmd: NodeCommand) -> None:
        """The failure-injection hook of the tests: "kill:NODE[:RANK]" or "raise:NODE[:RANK]" makes worker
        RANK (default: the node's lowest rank) die by SIGKILL or raise when it starts node NODE."""
        spec, node = self.setup.fault, cmd.node
        if not spec:
            return
        parts = spec.split(":")
        action, target = parts[0], parts[1]
        rank = int(parts[2]) if len(parts) > 2 else min(cmd.ranks)
        if target != node or rank != self.rank:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise CommandError(f"injected failure ({FAULT_ENV}={spec})")


def _error_text(e: Exception, step: Optional[int]) -> str:
    """What a command's failure says: the message of an error the runtime raises (located where it has a file), a
    non-finite quantity with the command's step, else the traceback of a bug."""
    if isinstance(e, NonFiniteError):
        return (f"step {step}: {e}, so the run stops before the step is applied or saved "
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
                      tp_impl: str = "torch", device: Optional[torch.device] = None,
                      groups: Optional[ProcessGroups] = None) -> Worker:
    """A worker outside a controlled run (no store, no layouts of its own): what tests, rpeg-validate and
    the GPU smoke script drive directly through `Worker.execute` and the rest of its public surface. With
    world > 1 the caller must already have joined torch.distributed and pass the process `groups` it created."""
    setup = WorkerSetup(world=world, seed=seed, run=run, models=models, layouts=(), tp_impl=tp_impl,
                        t0=time.time(), timeout_s=300.0)
    return Worker(setup, rank, channel=None, device=device, groups=groups)


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
    router = worker.start_threads()
    if device.type == "cpu":  # after the process groups and the worker's threads exist: they stay free (pinning.py)
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
        if cores:
            _log(rank)("its other threads may run on: " + "; ".join(
                f"{name} core{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}"
                for name, on in thread_cores().items()))
    worker.loop(router)
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
