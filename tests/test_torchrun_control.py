"""The control channel of a live torch run (backend.py, worker/process.py, messages.py): messages that whoever
reaches the store's port injects, without the run's secret, are dropped and logged, never executed, and
the run completes (the store transport, which externally launched workers use); forked workers' pipes
are not on the store at all; a normal run prints no c10d warning."""

import glob
import os
import pickle
import re
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.channel import messages  # noqa: E402
from rpegc.runtime.backends.torch.channel.commands import Stop  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.verify import verify  # noqa: E402
from fixtures.programs import compile_example  # noqa: E402


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("plan") / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    return out


class Touch:
    """Unpickling this creates `path`: the proof that someone unpickled what an attacker sent."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class InjectingBackend(TorchBackend):
    """Once its workers are up, and again at its first op, an outsider who knows the store's address
    (not the secret) pushes commands to every worker and reports to the controller."""

    marker = ""
    injected = 0

    def start(self, plan):
        ranks = super().start(plan)
        self._inject()
        return ranks

    def run_op(self, d):
        if self.injected == 1:
            self._inject()
        super().run_op(d)

    def _inject(self):
        outsider = dist.TCPStore("127.0.0.1", self.pool.store_port, is_master=False, timeout=timedelta(seconds=10))
        evil = pickle.dumps({"type": "stop", "payload": Touch(self.marker)})
        wrong_secret = messages.seal(bytes(32), "cmd/0", "controller", 0, Stop())
        for r in range(self.pool.world):
            outsider.queue_push(f"cmd/{r}", evil)
            outsider.queue_push(f"cmd/{r}", b'{"type": "stop"}')
            outsider.queue_push(f"cmd/{r}", wrong_secret.replace(b"cmd/0", f"cmd/{r}".encode()))
            outsider.set(f"cmd/{r}/0", evil)  # the keys of the old, pickled channel: nobody reads them
        outsider.queue_push("res", evil)
        outsider.queue_push("res", b'{"type": "error", "node": null, "what": "op", "rank": 0, "message": "x"}')
        self.injected += 1


def test_unauthenticated_commands_and_reports_are_dropped_logged_and_the_run_completes(plan_file, tmp_path, capfd):
    plan = load_plan(plan_file)
    backend = InjectingBackend(seed=0, tp_impl="torch", run_dir=str(tmp_path / "run"), checkpoint_every=0,
                               control="store")
    backend.marker = str(tmp_path / "unpickled")
    result = run(plan, backend)
    err = capfd.readouterr().err
    assert backend.injected == 2
    assert verify(plan, result.trace) == []
    assert backend.final_weights  # collected after the forged stops: the workers kept serving
    assert not os.path.exists(backend.marker)
    assert err.count("rpeg-run: warning: dropped a message on control channel res: not authenticated") == 4
    logs = sorted(glob.glob(str(tmp_path / "run" / "workers" / "worker-*.log")))
    assert len(logs) == 4
    for r, path in enumerate(logs):
        with open(path) as f:
            text = f.read()
        assert text.count(f"rpeg-torch-worker {r}: dropped a message on control channel cmd/{r}: "
                          "not authenticated") == 6, text


def test_forked_workers_read_commands_from_their_pipes_not_from_the_store(plan_file, tmp_path, capfd):
    """The default transport of forked workers: what an outsider pushes into the store's queues is never
    read (no drop logged, nothing executed) and the run completes."""
    plan = load_plan(plan_file)
    backend = InjectingBackend(seed=0, tp_impl="torch", run_dir=str(tmp_path / "run"), checkpoint_every=0)
    backend.marker = str(tmp_path / "unpickled")
    result = run(plan, backend)
    assert backend.pool.control == "pipe" and backend.injected == 2
    assert verify(plan, result.trace) == []
    assert backend.final_weights and not os.path.exists(backend.marker)
    assert "dropped a message" not in capfd.readouterr().err
    for path in glob.glob(str(tmp_path / "run" / "workers" / "worker-*.log")):
        with open(path) as f:
            assert "dropped a message" not in f.read()


def test_a_normal_torch_run_prints_no_c10d_warning(plan_file, tmp_path):
    """`make demo`'s third stage in small: the controller's stderr and the worker logs hold no [c10d] line
    (and the environment sets no TORCH_CPP_LOG_LEVEL)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "rpegc.runtime.cli", plan_file, "--backend", "torch", "--tp-impl",
                           "torch", "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verification: OK" in proc.stdout
    # the summary holds each worker's measured peak beside the cost model's (peak_memory.py)
    peaks = re.findall(r"worker (\d) \(device \d\): [\d,.]+ MiB measured, [\d,.]+ MiB predicted", proc.stdout)
    assert sorted(peaks) == ["0", "1", "2", "3"], proc.stdout
    assert "[c10d]" not in proc.stderr and "waitForInput" not in proc.stderr, proc.stderr[-2000:]
    logs = glob.glob(str(tmp_path / "run" / "workers" / "worker-*.log"))
    assert len(logs) == 4
    fits = len(os.sched_getaffinity(0)) >= 4
    for path in logs:
        with open(path) as f:
            text = f.read()
        assert "[c10d]" not in text
        assert ("main thread bound to core" in text) == fits and ("not bound to a core" in text) != fits


def test_worker_logs_of_a_run_without_run_dir_are_removed_at_the_end(plan_file, tmp_path):
    plan = load_plan(plan_file)
    backend = TorchBackend(seed=0, tp_impl="torch")
    run(plan, backend)
    assert backend.pool.log_dir and not os.path.exists(backend.pool.log_dir)


def test_an_external_worker_without_the_secret_stops_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "rpegc.runtime.backends.torch.worker.process", "--store",
                           "127.0.0.1:1", "--rank", "0", "--world", "1"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != messages.SECRET_ENV})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rpeg-torch-worker 0: error: no control secret: give --secret-file PATH or set RPEG_RUN_SECRET_FILE=PATH "
        "(rpeg-run --store writes the file and prints its path)"]


def test_an_external_worker_with_another_runs_secret_stops_with_one_line(tmp_path):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    messages.Endpoint(store, messages.new_secret(), "controller", print).put("setup", {"type": "setup", "setup": None})
    stale = str(tmp_path / "control-secret")
    messages.write_secret(stale, messages.new_secret())  # an earlier run's file
    proc = subprocess.run([sys.executable, "-m", "rpegc.runtime.backends.torch.worker.process", "--store",
                           f"127.0.0.1:{store.port}", "--secret-file", stale, "--rank", "0", "--world", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"rpeg-torch-worker 0: error: the run setup in the store at 127.0.0.1:{store.port} is not authenticated "
        "(no valid tag for this run's secret); is the secret that of this run?"]
