"""Workers launched from outside (as torchrun or Slurm start them): `python -m
rpegc.runtime.backends.torch.worker.process --store HOST:PORT` with RANK / WORLD_SIZE in the environment joins a
controller started with `launcher="external"`; the run is the same as with locally forked workers."""

import os
import socket
import stat
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from rpegc.runtime.verify import verify  # noqa: E402
from fixtures.torch_runs import STAT_REL  # noqa: E402
from fixtures.programs import compile_example  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_externally_launched_workers_run_the_plan_and_exit_cleanly(tmp_path):
    out = str(tmp_path / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    plan = load_plan(out)
    address = f"127.0.0.1:{free_port()}"
    secret = str(tmp_path / "secret")  # the workers read it once they reach the store
    workers = [subprocess.Popen([sys.executable, "-m", "rpegc.runtime.backends.torch.worker.process", "--store",
                                address], env=dict(os.environ, RANK=str(r), WORLD_SIZE="4",
                                RPEG_RUN_SECRET_FILE=secret), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True) for r in range(4)]
    try:
        backend = TorchBackend(seed=0, tp_impl="torch", launcher="external", store=address, secret_file=secret)
        result = run(plan, backend)
        codes = [w.wait(timeout=60) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert codes == [0, 0, 0, 0], [w.stderr.read()[-2000:] for w in workers]
    assert verify(plan, result.trace) == []
    assert not os.path.exists(secret)  # removed with the run
    ref = run_reference(run_config(plan.program), 2, seed=0)
    assert backend.metrics[1]["actor_grad_norm"] == pytest.approx(ref.metrics[1]["actor_grad_norm"], rel=STAT_REL)
    for n, w in ref.weights["actor"].items():
        torch.testing.assert_close(backend.final_weights["actor"][n], w, rtol=0, atol=5e-5)


def test_rpeg_run_store_option_waits_for_workers_started_elsewhere(tmp_path):
    """`rpeg-run --backend torch --store HOST:PORT` starts no worker; four started as torchrun would
    start them (RANK / WORLD_SIZE) join it, and the run ends verified."""
    out = str(tmp_path / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    address = f"127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    secret = run_dir / "control-secret"
    controller = subprocess.Popen([sys.executable, "-m", "rpegc.runtime.cli", out, "--backend", "torch",
                                   "--steps", "1", "--tp-impl", "torch", "--store", address, "--quiet",
                                   "--run-dir", str(run_dir)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not secret.exists() and controller.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert secret.exists(), controller.communicate()[1][-2000:] if controller.poll() is not None else "no secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    workers = [subprocess.Popen([sys.executable, "-m", "rpegc.runtime.backends.torch.worker.process", "--store",
                                 address, "--secret-file", str(secret)],
                                env=dict(os.environ, RANK=str(r), WORLD_SIZE="4"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
               for r in range(4)]
    try:
        stdout, stderr = controller.communicate(timeout=180)
        codes = [w.wait(timeout=60) for w in workers]
    finally:
        for p in [controller, *workers]:
            if p.poll() is None:
                p.kill()
    assert controller.returncode == 0, stderr[-2000:]
    assert "waiting for 4 workers" in stderr and f"--secret-file {secret}" in stderr, stderr
    assert "verification: OK" in stdout, (stdout, stderr)
    assert codes == [0, 0, 0, 0]
    assert "[c10d]" not in stderr and not secret.exists()


@pytest.mark.parametrize("address", ["no-port", "host:99999", "host:"])
def test_rpeg_run_rejects_a_malformed_store_address(tmp_path, address, capsys):
    from rpegc.runtime.cli import main as rpeg_run

    out = str(tmp_path / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    capsys.readouterr()
    assert rpeg_run([out, "--backend", "torch", "--store", address]) == 1
    err = capsys.readouterr().err
    assert "is not HOST:PORT" in err and "Traceback" not in err
    assert rpeg_run([out, "--backend", "sim", "--store", "127.0.0.1:5000"]) == 1
    assert "to the torch backend only" in capsys.readouterr().err


def test_rpeg_run_secret_file_needs_store(tmp_path, capsys):
    from rpegc.runtime.cli import main as rpeg_run

    out = str(tmp_path / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=2)
    capsys.readouterr()
    assert rpeg_run([out, "--backend", "torch", "--secret-file", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--secret-file is where an external launch (--store) writes" in err
    assert rpeg_run([out, "--backend", "sim", "--secret-file", str(tmp_path / "s")]) == 1
    assert "to the torch backend only" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
