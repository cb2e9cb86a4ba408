"""Failure handling of the torch backend: a worker that dies or raises stops the run
with a message naming the node and the device, leaves no worker process behind, and `--resume` continues
from the last checkpoint to the same final weights as an uninterrupted run."""

import os

import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from rpegc.runtime.backends.base import BackendError  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import (latest_checkpoint, load_checkpoint,
                                                                  load_final)  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import FAULT_ENV  # noqa: E402
from rpegc.runtime.verify import verify  # noqa: E402
from fixtures.cli import rpeg_run  # noqa: E402
from fixtures.programs import compile_example  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("plans") / "grpo.exec.rpeg")
    compile_example("grpo-tiny", out, steps=3)
    return out


@pytest.fixture(scope="module")
def uninterrupted(plan_file, tmp_path_factory):
    backend = TorchBackend(seed=0, tp_impl="torch", run_dir=str(tmp_path_factory.mktemp("full")), checkpoint_every=1)
    run(load_plan(plan_file), backend)
    return backend.final_weights


def no_process_left(pids):
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def test_a_killed_worker_stops_the_run_and_resume_reaches_the_same_weights(plan_file, uninterrupted, tmp_path):
    plan = load_plan(plan_file)
    run_dir = str(tmp_path / "run")
    backend = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, fault="kill:train_actor#2")
    with pytest.raises(BackendError) as err:
        run(plan, backend)
    message = str(err.value)
    assert "worker 0 (device 0) was killed by signal 9 while running node train_actor#2" in message
    assert message.endswith("; SIGKILL comes from the kernel's out-of-memory killer or a kill -9")
    assert len(backend.worker_pids) == 4 and no_process_left(backend.worker_pids)
    saved = load_checkpoint(latest_checkpoint(run_dir))
    assert saved["step"] == 2 and sorted(saved["versions"]["actor"]) == [2]
    assert set(saved["optimizer"]["actor"]) == set(uninterrupted["actor"])  # Adam state of every parameter
    assert all("exp_avg" in s and int(s["step"]) == 2 for s in saved["optimizer"]["actor"].values())

    resumed = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, resume=True)
    rest = resumed.prepare(plan)
    assert {n.step for n in rest.nodes} == {2}
    result = run(rest, resumed)
    assert verify(rest, result.trace) == []
    assert no_process_left(resumed.worker_pids)
    for name, weights in uninterrupted["actor"].items():
        assert torch.equal(resumed.final_weights["actor"][name], weights), name  # bit for bit


def test_a_worker_that_raises_names_its_node_and_device_and_the_others_are_stopped(plan_file, tmp_path):
    # ref_inf runs with tp = 2 on devices 2-3: the failing rank's partner is blocked in a TP all-reduce.
    backend = TorchBackend(seed=0, tp_impl="torch", fault="raise:ref_inf#1.q1:2")
    with pytest.raises(BackendError, match=r"node ref_inf#1\.q1 failed on device 2 \(worker 2\): injected failure"):
        run(load_plan(plan_file), backend)
    assert no_process_left(backend.worker_pids)



def test_rpeg_run_exits_nonzero_on_a_dead_worker_and_resume_finishes_the_run(plan_file, uninterrupted, tmp_path):
    run_dir = str(tmp_path / "cli-run")
    killed = tmp_path / "killed.jsonl"
    out = rpeg_run(plan_file, "--backend", "torch", "--tp-impl", "torch", "--run-dir", run_dir,
                   "--trace", str(killed), env={FAULT_ENV: "kill:train_actor#1"})
    assert out.returncode == 1
    assert "worker 0 (device 0) was killed by signal 9 while running node train_actor#1" in out.stderr
    assert "step 0 done" in out.stdout and "reward" in out.stdout
    # A run that stops with an error leaves no partial trace (rpegc/outputs.py), nor its temporary file.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli-run"]
    trace = str(tmp_path / "resumed.jsonl")
    out = rpeg_run(plan_file, "--backend", "torch", "--tp-impl", "torch", "--resume", run_dir, "--trace", trace)
    assert out.returncode == 0, out.stderr
    assert "step 2 done" in out.stdout and "verification: OK" in out.stdout
    # The resumed trace says where it started, so it verifies against the whole plan file.
    check = rpeg_run("verify", plan_file, trace)
    assert check.returncode == 0 and "OK" in check.stdout, check.stdout + check.stderr
    final = load_final(run_dir)["actor"]
    assert all(torch.equal(final[n], w) for n, w in uninterrupted["actor"].items())
