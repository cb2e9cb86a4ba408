"""The torch backend's worker processes and its control channel (paper Sec. VII: persistent workers, one per
device; docs/architecture.md, Runtime): launch, the run's secret, commands out and reports in, health, stop.

`WorkerPool.open` serves a TCPStore that is also the control channel (`messages.py`: plain, bounded
messages sealed with a per-run secret), sends the run setup and starts the workers: locally, one process per
device forked from a server that imported torch once, each with its own pipe (the default transport) or the
store's queues; externally, the same worker module under torchrun/Slurm, which reads the secret from the file
written here (mode 0600). Reports come back through an inbox thread (`inbox.py`) so that the main thread
waits on a Python queue and checks the processes in between: no short store timeouts, no c10d warnings.
What a worker runs, and when a node is done, is the backend's business, not the pool's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from rpegc.core.ir.errors import RpegError, error_line
from rpegc.runtime.backends.torch.controller.inbox import PipeInbox, StoreInbox, warn
from rpegc.runtime.backends.torch.channel.commands import Command, NodeCommand, Release, Stop, Transfer
from rpegc.runtime.backends.torch.channel.messages import Endpoint, new_secret, write_secret
from rpegc.runtime.backends.torch.controller.processes import forkserver_pid
from rpegc.runtime.backends.torch.checkpoints.run_dir import WORKER_LOGS
from rpegc.runtime.backends.torch.channel.worker_setup import WorkerSetup
from rpegc.runtime.backends.torch.worker.thread_cpu import CoreUse

LAUNCHERS = ("local", "external")
CONTROL_TRANSPORTS = ("auto", "pipe", "store")
POLL_S = 0.1  # longest (Python-level) wait for a worker report before the controller checks the workers' health
SECRET_FILE = "control-secret"  # in the run directory, for externally launched workers


def loopback_listener() -> tuple[int, int]:
    """(descriptor, port) of a socket listening on 127.0.0.1 and a free port, for a local run's control store:
    TCPStore's own socket listens on every interface whatever host it is given, so a locally forked run hands it
    this one instead (`master_listen_fd`; the store owns the descriptor from then on and closes it)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    return listener.detach(), port


def split_address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RpegError(None, f"store address '{addr}' is not HOST:PORT (a port in 1..65535)")
    return host or "0.0.0.0", int(port)


class WorkerPool:
    """The workers of one run and the channel to them; `open` once, `stop` once (also after a failure)."""

    def __init__(self, *, launcher: str = "local", store: Optional[str] = None, secret_file: Optional[str] = None,
                 control: str = "auto", run_dir: Optional[str] = None, timeout_s: float = 120.0):
        if launcher not in LAUNCHERS:
            raise RpegError(None, f"unknown launcher '{launcher}'; use {' or '.join(LAUNCHERS)}")
        if launcher == "external" and not store:
            raise RpegError(None, "an external launch needs the store address workers connect to (HOST:PORT)")
        if launcher == "external":
            split_address(store or "")  # a malformed address fails here, before the run directory is touched
        if secret_file and launcher != "external":
            raise RpegError(None, "--secret-file is where an external launch (--store) writes the control secret; "
                                  "locally launched workers get it from rpeg-run")
        if control not in CONTROL_TRANSPORTS:
            raise RpegError(None, f"unknown control transport '{control}'; use {', '.join(CONTROL_TRANSPORTS)}")
        if control == "pipe" and launcher == "external":
            raise RpegError(None, "externally launched workers reach the controller through its store only")
        self.launcher, self.store_addr, self.secret_file = launcher, store, secret_file
        # auto: a pipe per forked worker, the store for external ones; "store" forces the store (tests of it)
        self.control = "store" if launcher == "external" or control == "store" else "pipe"
        self.run_dir, self.timeout_s = run_dir, timeout_s
        self.world = 0
        self.log_dir = ""  # the workers' log directory (local launch); a temporary one is removed at the end
        self._temp_logs = False
        self._procs: list = []  # multiprocessing.Process, one per worker rank
        self._store: Optional[dist.TCPStore] = None
        self._chan: Optional[Endpoint] = None  # the controller's side of the control channel
        self._inbox: Optional[StoreInbox | PipeInbox] = None
        self.peaks: dict[int, int] = {}  # rank -> bytes it held above its start-up size (its bye says)
        self.resident: dict[int, int] = {}  # rank -> its resident high-water mark above it (CPU workers)
        self.cpu: dict[int, CoreUse] = {}  # rank -> its threads' cores from ready to stop (its bye says)
        self._releases: dict[int, list[str]] = {}  # rank -> labels freed since its last command
        self._secret_written: Optional[str] = None  # the secret file of an external launch, removed at the end
        self._secret_tmpdir: Optional[str] = None

    # -- launch ----------------------------------------------------------------------------------------

    def open(self, setup: WorkerSetup, tp_impl: str) -> None:
        """Serve the store, send the setup and start (or wait to be joined by) `setup.world` workers."""
        world = setup.world
        host, port = ("127.0.0.1", 0) if self.launcher == "local" else split_address(self.store_addr or "")
        secret = new_secret()
        if self.launcher == "external":
            self._write_secret(secret)  # before the store serves: a worker that reaches it finds the file
        try:
            fd = None
            if self.launcher == "local":
                fd, port = loopback_listener()
            self._store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=self.timeout_s), master_listen_fd=fd)
        except (RuntimeError, OSError) as err:  # DistNetworkError is a RuntimeError: port taken, bad host
            self._remove_secret()
            raise RpegError(None, f"cannot serve the control store at {host}:{port}: {error_line(err)}; "
                                  "choose a free port on this host (--store HOST:PORT)") from None
        self.world = world
        self._chan = Endpoint(self._store, secret, "controller", warn)
        self._chan.put("setup", {"type": "setup", "setup": setup})
        if self.control == "store":
            self._inbox = StoreInbox("127.0.0.1" if host == "0.0.0.0" else host, self._store.port, secret)
        if self.launcher == "local":
            hf = any(m.hf is not None for m in setup.models.values())
            links = self.launch(world, self._store.port, tp_impl, secret, hf)
            if self.control == "pipe":
                self._chan.links.update({f"cmd/{r}": link for r, link in links.items()})
                self._inbox = PipeInbox(links, self._chan)
        else:
            print(f"rpeg-run: waiting for {world} workers; start rank r of them with "
                  f"`python -m rpegc.runtime.backends.torch.worker.process --store {self.store_addr} --secret-file "
                  f"{self._secret_written} --rank r --world {world}` (torchrun/Slurm: RANK and "
                  f"WORLD_SIZE from the environment; every worker must be able to read {self._secret_written}, "
                  "mode 0600, or find it through RPEG_RUN_SECRET_FILE)", file=sys.stderr, flush=True)

    @property
    def is_open(self) -> bool:
        return self._store is not None

    @property
    def store_port(self) -> int:
        assert self._store is not None
        return self._store.port

    def launch(self, world: int, port: int, tp_impl: str, secret: bytes, hf: bool = False) -> dict[int, Any]:
        """One process per device, forked from a server that imported torch once (fast repeated launches).
        Each gets the run's secret through the fork server's pipe (never the network or the command line),
        and, under the pipe transport, its own end of a pipe to the controller; returns the controller's
        ends by rank.

        On a cluster the same workers start under torchrun/Slurm instead:
        `python -m rpegc.runtime.backends.torch.worker.process --store HOST:PORT` with RANK/WORLD_SIZE set.
        """
        import multiprocessing as mp

        self._temp_logs = not self.run_dir
        self.log_dir = (os.path.join(self.run_dir, WORKER_LOGS) if self.run_dir
                        else tempfile.mkdtemp(prefix="rpeg-workers-"))
        os.makedirs(self.log_dir, exist_ok=True)
        ctx = mp.get_context("forkserver")
        self.start_forkserver(tp_impl, hf)
        from rpegc.runtime.backends.torch.worker.process import spawn_main

        atexit.register(self.kill)
        links: dict[int, Any] = {}
        for r in range(world):
            mine, theirs = ctx.Pipe(duplex=True) if self.control == "pipe" else (None, None)
            proc = ctx.Process(target=spawn_main, args=("127.0.0.1", port, r, world, self.log_path(r), secret, theirs),
                               daemon=True, name=f"rpeg-worker-{r}")
            proc.start()
            self._procs.append(proc)
            if theirs is not None:
                theirs.close()  # the worker holds its end: its death closes the pipe
                links[r] = mine
        return links

    def start_forkserver(self, tp_impl: str, hf: bool) -> None:
        """Start the fork server of a local launch now, if none runs: it imports what the workers need once
        (torch, torch._dynamo, which the first torch.optim.Adam pulls in at ~1 s per process, megatron's layers for
        TP through megatron, transformers' config classes for checkpoints) while the controller goes on, so
        `rpeg-run` calls this before it analyses the plan and the imports overlap that work. A server already
        running keeps its imports."""
        if self.launcher != "local":
            return
        import multiprocessing as mp
        from multiprocessing import forkserver

        preload = ["rpegc.runtime.backends.torch.worker.env", "torch", "torch._dynamo",
                   "rpegc.runtime.backends.torch.worker.process"]
        if tp_impl == "megatron":
            preload.append("rpegc.runtime.backends.torch.parallel.megatron_compat")
        if hf:
            preload.append("transformers.models.auto.configuration_auto")
        mp.get_context("forkserver").set_forkserver_preload(preload)  # for a server started from here on
        forkserver.ensure_running()

    def log_path(self, rank: int) -> str:
        return os.path.join(self.log_dir, f"worker-{rank}.log")

    def _write_secret(self, secret: bytes) -> None:
        """The run's secret for externally launched workers: --secret-file, else RUN_DIR/control-secret,
        else a file in a private temporary directory; removed when the run ends."""
        path = self.secret_file
        if not path and self.run_dir:
            os.makedirs(self.run_dir, exist_ok=True)
            path = os.path.join(self.run_dir, SECRET_FILE)
        if not path:
            self._secret_tmpdir = tempfile.mkdtemp(prefix="rpeg-run-")
            path = os.path.join(self._secret_tmpdir, SECRET_FILE)
        write_secret(path, secret)
        self._secret_written = path

    def _remove_secret(self) -> None:
        if self._secret_written:
            try:
                os.remove(self._secret_written)
            except OSError:
                pass
            self._secret_written = None
        if self._secret_tmpdir:
            shutil.rmtree(self._secret_tmpdir, ignore_errors=True)
            self._secret_tmpdir = None

    # -- the channel -----------------------------------------------------------------------------------

    def send(self, rank: int, cmd: Command) -> None:
        """Push `cmd` to `rank` with every copy freed there since its last command (a worker runs its commands
        in order, so it frees them before it runs `cmd`): in a node's command, else as a release message first."""
        if isinstance(cmd, Transfer) and cmd.sender:
            self._push(rank, cmd)  # the sender thread frees nothing: the main loop gets them with its next command
            return
        labels = self._releases.pop(rank, None)
        if labels and isinstance(cmd, NodeCommand):
            cmd = replace(cmd, release=labels)
        elif labels:
            self._push(rank, Release(labels=labels))
        self._push(rank, cmd)

    def free(self, rank: int, label: str) -> None:
        """Free the copy `label` on `rank`: sent with the rank's next command, or by `flush_releases`."""
        self._releases.setdefault(rank, []).append(label)

    def flush_releases(self) -> None:
        for rank in sorted(self._releases):
            self._push(rank, Release(labels=self._releases.pop(rank)))

    def _push(self, rank: int, cmd: Command) -> None:
        """Send `cmd` to `rank`. A forked worker whose pipe is closed has died: what it is sent is lost, as it is in a
        dead worker's store queue, and the caller's next check of the workers (`exited`) reports the death with its
        cause and the node it ran, where the broken pipe had ended the run with a traceback."""
        assert self._chan is not None
        try:
            self._chan.push(f"cmd/{rank}", cmd)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def poll(self) -> Optional[dict]:
        """The next worker report, or None after POLL_S without one.

        The inbox thread hands a report over as soon as the store has it; the bounded (Python-level,
        silent) wait lets the caller check for dead workers and timeouts in between."""
        assert self._inbox is not None
        return self._inbox.get(POLL_S)

    def allow_gaps(self) -> None:
        """A signal may have cut the main thread's read of a report short (`Endpoint.allow_gaps`)."""
        if self._chan is not None:
            self._chan.allow_gaps = True

    # -- health and stop -------------------------------------------------------------------------------

    def exited(self) -> Optional[tuple[int, int]]:
        """(rank, exit code) of the first locally launched worker that is no longer running; None if all are."""
        for r, proc in enumerate(self._procs):
            if proc.exitcode is not None:
                return r, proc.exitcode
        return None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def stop(self, grace_s: float, kill_grace_s: float, keep_logs: bool) -> None:
        """Tell every worker to stop (an idle one exits at once; one stuck in a collective after a failure
        reads it once its collective times out), wait up to `grace_s` for them, then terminate what is left of
        ours (killed after `kill_grace_s`) and close the channel. The temporary log directory goes unless
        `keep_logs`."""
        if self._store is not None:
            for r in range(self.world):
                try:
                    self.send(r, Stop())
                except Exception:
                    break
            deadline = time.time() + grace_s
            left = set(range(self.world))
            while left and time.time() < deadline:
                if self._procs and all(p.exitcode is not None for p in self._procs):
                    break  # every local worker already exited: no bye left to wait for
                try:
                    msg = self.poll()
                except Exception:
                    break
                if msg is not None and msg.get("type") == "bye":
                    left.discard(msg["rank"])
                    if msg.get("peak") is not None:
                        self.peaks[msg["rank"]] = int(msg["peak"])
                    if msg.get("resident") is not None:
                        self.resident[msg["rank"]] = int(msg["resident"])
                    if (use := CoreUse.from_plain(msg.get("cpu"))) is not None:
                        self.cpu[msg["rank"]] = use
            for p in self._procs:
                p.join(timeout=max(0.0, deadline - time.time()))
        self.kill(kill_grace_s)
        atexit.unregister(self.kill)
        if self._inbox is not None and self._chan is not None:
            self._inbox.close(self._chan)
        self._inbox, self._chan, self._store = None, None, None
        self._remove_secret()
        if self._temp_logs and not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)  # kept after a failure: the message points there

    def kill(self, grace_s: float = 3.0) -> None:
        """Terminate, then (after `grace_s`) kill, every worker still alive; reap them all (no orphans, no
        zombies)."""
        for p in self._procs:
            if p.exitcode is None:
                p.terminate()
        deadline = time.time() + grace_s
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.time()))
            if p.exitcode is None:
                p.kill()
                p.join()

    def kill_now(self) -> None:
        """SIGKILL every worker and the fork server, without waiting (a second signal: the process exits)."""
        for pid in [p.pid for p in self._procs if p.exitcode is None] + [forkserver_pid()]:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
