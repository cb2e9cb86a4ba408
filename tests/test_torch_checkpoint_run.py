"""Checkpoints of real `rpeg-run --backend torch` runs (2 workers, tiny models, staleness 1 so checkpoints
also hold the older version generation still reads): --keep-checkpoints bounds the checkpoint
directories, a checkpoint interrupted before its index leaves the previous one in use (and is removed),
and damaged or mismatched run directories are one-line errors naming the file, exit 1."""

from __future__ import annotations

import os
import re
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from fixtures.cli import one_line_error, rpeg_run  # noqa: E402

from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.core.cost.hardware import load_hardware  # noqa: E402
from rpegc.core.cost.machine import PIN_ENV  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import (complete_checkpoints, load_checkpoint,  # noqa: E402
                                                    load_final)
from rpegc.runtime.backends.torch.worker.process import FAULT_ENV  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=4},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
PLAN = """rpeg.cluster @cpu2 {racks = 1, nodes = 1, gpus = 2, hardware = "cpu"}
rpeg.plan @p for @grpo on @cpu2 {
  @gen         at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @ref_inf     at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @reward_inf  at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
}
"""


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    src = open(os.path.join(ROOT, "examples/grpo-tiny.rpeg")).read()
    src = src[:src.index("rpeg.cluster")].replace("rpeg.staleness {@actor = 0}", "rpeg.staleness {@actor = 1}") + PLAN
    d = tmp_path_factory.mktemp("plans")
    (d / "g.rpeg").write_text(src)
    out = str(d / "g.exec.rpeg")
    assert rpegc_main([str(d / "g.rpeg"), "-p", PIPELINE, "-o", out]) == 0
    return out



def torch_run(plan_file, *args, env=None):
    return rpeg_run(plan_file, "--backend", "torch", "--tp-impl", "torch", "--quiet", *args, env=env)


def steps(run_dir: str) -> list[int]:
    return [s for s, _ in complete_checkpoints(run_dir)]



@pytest.fixture(scope="module")
def uninterrupted_run(plan_file, tmp_path_factory):
    """The run directory and summary of an uninterrupted run, priced with the shipped profile plus checkpoint terms
    ([host] checkpoint_*: core/cost/checkpoint.py)."""
    d = tmp_path_factory.mktemp("full")
    profile = d / "priced.toml"
    text = open(load_hardware("cpu-reference").source).read()
    profile.write_text(text.replace("[host]\n", "[host]\ncheckpoint_file = 0.0005\ncheckpoint_tensor = 2.5e-5\n"
                                                 "checkpoint_rate = 7e8\ncheckpoint_commit = 0.002\n", 1))
    run_dir = str(d / "run")
    out = torch_run(plan_file, "--run-dir", run_dir, env={PIN_ENV: str(profile)})  # --keep-checkpoints 2 by default
    assert out.returncode == 0, out.stderr
    return run_dir, out.stdout


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run):
    return uninterrupted_run[0]


def test_the_runs_prediction_prices_its_checkpoint_writes(uninterrupted_run, plan_file):
    """A run directory checkpoints every step by default: the 3 writes of the 4-step run (before steps 1-3, none
    after the last) are priced, each with the controller's commit after it, and in the predicted steady state, and the
    summary sets the writes and the commits against their prices."""
    from rpegc.core.cost.checkpoint import checkpoint_time
    from rpegc.runtime.plan import load_plan

    _, stdout = uninterrupted_run
    profile = os.path.join(os.path.dirname(uninterrupted_run[0]), "priced.toml")
    price = checkpoint_time(load_plan(plan_file).program, load_hardware(profile))
    assert price > 0
    steady = next(line for line in stdout.splitlines() if line.startswith("steady state:"))
    assert f", {1000 * (price + 0.002):.3g} ms of it checkpoint writes (" in steady  # every steady step follows one
    line = next(line for line in stdout.splitlines() if line.startswith("checkpoint writes:"))
    assert line.startswith("checkpoint writes: 3, median ") and f", {1000 * price:.3g} ms priced each" in line
    line = next(line for line in stdout.splitlines() if line.startswith("checkpoint commits"))
    assert line.startswith("checkpoint commits (the controller's index, rename and pruning): median ")
    assert line.endswith(" ms measured, 2 ms priced each")


def test_a_training_that_checkpoints_still_has_its_successors_chained_behind_it(tmp_path):
    """exports.py queues a checkpoint's parts behind the training that makes it due, the moment the training is sent,
    so an on-policy generation after it is sent before it finishes (Dispatcher.chain) and runs behind the parts, with
    no control round trip between: a run with checkpoints once left every training unchained, ~1.5 ms a step on
    this host."""
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.trace import read_trace

    src = open(os.path.join(ROOT, "examples/grpo-tiny.rpeg")).read()
    one_device = PLAN.replace("(1, 1, 2) dp = 2", "(1, 1, 1) dp = 1")
    (tmp_path / "g.rpeg").write_text(src[:src.index("rpeg.cluster")] + one_device)
    plan_file = str(tmp_path / "g.exec.rpeg")
    assert rpegc_main([str(tmp_path / "g.rpeg"), "-p", PIPELINE, "-o", plan_file]) == 0
    out = torch_run(plan_file, "--run-dir", str(tmp_path / "run"), "--trace", str(tmp_path / "trace.jsonl"))
    assert out.returncode == 0, out.stderr
    plan, trace = load_plan(plan_file), read_trace(str(tmp_path / "trace.jsonl"))
    assert plan.tau.get("actor", 0) == 0 and len(steps(str(tmp_path / "run"))) == 2  # of 3, kept 2
    for k in range(3):  # generation k + 1 reads what training k made, on the same worker
        gen, train = trace.nodes[f"gen#{k + 1}"], trace.nodes[f"train_actor#{k}"]
        assert gen.dispatch < train.finish <= gen.start  # sent behind it, run after it (and after its checkpoint)


def test_the_summary_says_where_the_host_cores_went(uninterrupted_run):
    """worker/thread_cpu.py: each worker's main thread on a core and waiting for one, its other threads, the
    controller, in cores per second of the run (at most the host's)."""
    from rpegc.runtime.report import host_cores

    if not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"):
        pytest.skip("no per-thread scheduler statistics here")
    lines = uninterrupted_run[1].splitlines()
    at = lines.index("threads on the host's cores (cores busy per second of the run, /proc schedstat):")
    for r, line in zip((0, 1), lines[at + 1:at + 3]):
        n = r"([\d.]+)"
        m = re.fullmatch(rf"  worker {r}: main thread {n}, waiting for a core {n}; its other threads {n}", line)
        assert m, line
        main, wait, others = map(float, m.groups())
        assert 0 < main <= host_cores() and 0 <= wait <= host_cores() and 0 <= others <= host_cores()
    assert lines[at + 3].startswith("  controller: ") and 0 < float(lines[at + 3].split(": ")[1]) <= host_cores()


@pytest.fixture(scope="module")
def killed(plan_file, tmp_path_factory):
    """Killed in step 3's training, after the checkpoints of steps 1, 2 and 3."""
    run_dir = str(tmp_path_factory.mktemp("killed") / "run")
    out = torch_run(plan_file, "--run-dir", run_dir, "--keep-checkpoints", "3", env={FAULT_ENV: "kill:train_actor#3"})
    assert out.returncode == 1 and "killed by signal 9 while running node train_actor#3" in out.stderr
    return run_dir


def test_keep_checkpoints_bounds_the_checkpoint_directories(plan_file, uninterrupted, killed, tmp_path):
    assert steps(uninterrupted) == [2, 3]  # checkpoints at 1, 2, 3 of 4 steps; the default keeps 2
    assert sorted(os.listdir(os.path.join(uninterrupted, "checkpoints"))) == ["step-000002", "step-000003"]
    assert steps(killed) == [1, 2, 3]
    saved = load_checkpoint(os.path.join(killed, "checkpoints", "step-000003"))
    assert sorted(saved["versions"]["actor"]) == [2, 3]  # tau = 1: generation at step 3 reads version 2
    one = str(tmp_path / "one")
    assert torch_run(plan_file, "--run-dir", one, "--keep-checkpoints", "1", "--steps", "3").returncode == 0
    assert steps(one) == [2]
    one_line_error(torch_run(plan_file, "--run-dir", str(tmp_path / "zero"), "--keep-checkpoints", "0"),
                   "--keep-checkpoints must be >= 1")
    one_line_error(rpeg_run(plan_file, "--keep-checkpoints", "2"), "to the torch backend only")


def test_a_checkpoint_interrupted_before_its_index_leaves_the_previous_one_in_use(plan_file, uninterrupted, killed,
                                                                                   tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(killed, run_dir)
    # what a crash while writing step 3's checkpoint leaves: its directory still .partial, no index yet
    ckpts = os.path.join(run_dir, "checkpoints")
    os.rename(os.path.join(ckpts, "step-000003"), os.path.join(ckpts, "step-000003.partial"))
    os.remove(os.path.join(ckpts, "step-000003.partial", "index.json"))
    out = torch_run(plan_file, "--resume", run_dir)
    assert out.returncode == 0, out.stderr
    assert "8 nodes on 2 devices" in out.stdout  # resumed at step 2: the 8 nodes of steps 2 and 3 of 16
    assert "step-000003.partial" not in os.listdir(ckpts)
    assert steps(run_dir) == [2, 3]  # the resumed run wrote step 3 again (keeping versions 2 and 3)
    assert sorted(load_checkpoint(os.path.join(ckpts, "step-000003"))["versions"]["actor"]) == [2, 3]
    want, got = load_final(uninterrupted), load_final(run_dir)
    assert all(torch.equal(got["actor"][n], w) for n, w in want["actor"].items())  # bit for bit
    one_line_error(torch_run(plan_file, "--resume", run_dir), "already finished", os.path.join(run_dir, "final"))


def _flip_a_byte(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0x01
    open(path, "wb").write(bytes(data))


def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(plan_file, uninterrupted, killed, tmp_path):
    """A corrupted newest checkpoint blocked --resume although older intact ones were kept (issue 33, item 5)."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(killed, run_dir)
    shard = os.path.join(run_dir, "checkpoints", "step-000003", "rank-00001.safetensors")
    _flip_a_byte(shard)
    out = torch_run(plan_file, "--resume", run_dir)
    assert out.returncode == 0, out.stderr
    assert "rpeg-run: warning: resuming from step-000002, the newest intact checkpoint; step-000003 is damaged " \
           f"({shard}: " in out.stderr
    assert "8 nodes on 2 devices" in out.stdout  # steps 2 and 3
    want, got = load_final(uninterrupted), load_final(run_dir)
    assert all(torch.equal(got["actor"][n], w) for n, w in want["actor"].items())  # bit for bit


def test_a_damaged_or_foreign_checkpoint_is_a_one_line_error_naming_the_file(plan_file, killed, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(killed, run_dir)
    one_line_error(torch_run(plan_file, "--resume", run_dir, "--seed", "1"),
                   os.path.join(run_dir, "checkpoints", "step-000003", "index.json"),
                   "the checkpoint belongs to another run: --seed is 0 in the checkpoint, 1 here")
    for step in (1, 2):  # the only checkpoint left is the damaged one
        shutil.rmtree(os.path.join(run_dir, "checkpoints", f"step-00000{step}"))
    shard = os.path.join(run_dir, "checkpoints", "step-000003", "rank-00001.safetensors")
    _flip_a_byte(shard)
    one_line_error(torch_run(plan_file, "--resume", run_dir), shard, "corrupted")
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    one_line_error(torch_run(plan_file, "--resume", run_dir), "no checkpoint to resume from")


def test_a_checkpoint_written_under_tp_and_pp_resumes_under_dp_within_fp32_rounding(tmp_path):
    """The other direction of tests/test_torch_checkpoint_resume.py: the checkpoint is written by a
    tp = 2 x pp = 2 training layout on 4 workers (each TP rank writes its slices, a scalar Adam step
    count once) and resumed by a dp = 2 plan on 2. Tolerance as derived there, with n = ffn = 256."""
    from fixtures.torch_runs import LR, RL, U
    from rpegc.runtime.backends.base import BackendError
    from rpegc.runtime.controller import run
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend

    src = open(os.path.join(ROOT, "examples/grpo-tiny.rpeg")).read()  # training pp 2 x tp 2 on 4 devices
    dp = src[:src.index("rpeg.cluster")] + PLAN
    paths = {}
    for name, text in (("tp", src), ("dp", dp)):
        (tmp_path / f"{name}.rpeg").write_text(text)
        paths[name] = str(tmp_path / f"{name}.exec.rpeg")
        assert rpegc_main([str(tmp_path / f"{name}.rpeg"), "-p", PIPELINE.replace("k=4", "k=3"), "-o", paths[name]]) == 0
    tp, dp = load_plan(paths["tp"]), load_plan(paths["dp"])
    full = TorchBackend(seed=0, tp_impl="torch", run_dir=str(tmp_path / "full"), checkpoint_every=1, rl=RL)
    run(tp, full)
    run_dir = str(tmp_path / "run")
    failed = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, rl=RL,
                          fault="kill:train_actor#2")
    with pytest.raises(BackendError):
        run(tp, failed)
    saved = load_checkpoint(os.path.join(run_dir, "checkpoints", "step-000002"))
    assert all(int(s["step"]) == 2 for s in saved["optimizer"]["actor"].values())
    resumed = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, rl=RL, resume=True)
    run(resumed.prepare(dp), resumed)
    for name, w in full.final_weights["actor"].items():
        torch.testing.assert_close(resumed.final_weights["actor"][name], w, rtol=2 * U, atol=LR * 2 * 2 * 256 * U)
