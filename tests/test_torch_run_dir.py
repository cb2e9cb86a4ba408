"""A run directory belongs to one run (runtime/backends/torch/checkpoints/run_dir.py; issue 33, item 1): a second
rpeg-run on it is refused while the first holds its lock, a fresh run does not replace an earlier run's checkpoints,
final weights or metrics unless --overwrite says so, an export never lands in the managed paths, and --secret-file never
overwrites a file. Each refusal is one line, exit 1, with every file left as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fixtures.cli import one_line_error, rpeg_run

from rpegc.cli import main as rpegc_main
from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.checkpoints.run_dir import (CHECKPOINT_DIR, FINAL, RunDirLock, check_fresh_run,
                                                              earlier_run,
                                                   managed_path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
METRICS_LINE = '{"step": 0, "reward": 0.5}\n'


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("plans") / "g.exec.rpeg")
    assert rpegc_main([os.path.join(ROOT, "examples/grpo-tiny.rpeg"), "-p", PIPELINE, "-o", out]) == 0
    return out




def earlier(run_dir) -> dict[str, str]:
    """A run directory as an interrupted run leaves it: two checkpoints and its metrics."""
    files = {}
    for step in (1, 2):
        d = run_dir / CHECKPOINT_DIR / f"step-{step:06d}"
        d.mkdir(parents=True)
        (d / "index.json").write_text(f'{{"step": {step}}}')
        files[str(d / "index.json")] = f'{{"step": {step}}}'
    (run_dir / "metrics.jsonl").write_text(METRICS_LINE)
    files[str(run_dir / "metrics.jsonl")] = METRICS_LINE
    return files


def unchanged(files: dict[str, str]) -> None:
    for path, text in files.items():
        assert open(path).read() == text, path


# -- the lock ----------------------------------------------------------------------------------------------------


def test_a_second_lock_on_a_run_directory_is_refused_until_the_first_is_released(tmp_path):
    first = RunDirLock(str(tmp_path / "run")).acquire()
    with pytest.raises(RpegError, match=rf"in use by another rpeg-run \(process {os.getpid()}\)"):
        RunDirLock(str(tmp_path / "run")).acquire()
    first.release()
    RunDirLock(str(tmp_path / "run")).acquire().release()


def test_the_lock_of_a_killed_process_is_free(tmp_path):
    """The operating system drops a flock with its process: a crashed run leaves no stale lock behind."""
    run_dir = str(tmp_path / "run")
    code = ("import sys, time; from rpegc.runtime.backends.torch.checkpoints.run_dir import RunDirLock; "
            "RunDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, run_dir], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(RpegError, match=f"process {child.pid}"):
            RunDirLock(run_dir).acquire()
    finally:
        child.kill()
        child.wait()
    RunDirLock(run_dir).acquire().release()


def test_rpeg_run_on_a_run_directory_in_use_is_refused_and_touches_nothing(plan_file, tmp_path):
    run_dir = tmp_path / "run"
    files = earlier(run_dir)
    lock = RunDirLock(str(run_dir)).acquire()  # another run holds it
    try:
        for extra in (("--run-dir", str(run_dir), "--overwrite"), ("--resume", str(run_dir))):
            out = rpeg_run(plan_file, "--backend", "torch", "--quiet", *extra)
            one_line_error(out, f"the run directory {run_dir} is in use by another rpeg-run (process {os.getpid()})")
            unchanged(files)
            assert not (run_dir / "workers").exists()
    finally:
        lock.release()


# -- a fresh run on an earlier run's directory --------------------------------------------------------------------


def test_what_an_earlier_run_left_is_named(tmp_path):
    assert earlier_run(str(tmp_path)) == []
    (tmp_path / CHECKPOINT_DIR / "step-000003.partial").mkdir(parents=True)  # not a checkpoint
    (tmp_path / "workers").mkdir()  # logs of a run that stopped before its first step
    assert earlier_run(str(tmp_path)) == []
    check_fresh_run(str(tmp_path), overwrite=False)
    (tmp_path / CHECKPOINT_DIR / "step-000002").mkdir()
    (tmp_path / FINAL).mkdir()
    (tmp_path / "metrics.jsonl").write_text(METRICS_LINE)
    assert earlier_run(str(tmp_path)) == ["1 checkpoint(s)", "final weights", "metrics.jsonl"]
    with pytest.raises(RpegError, match=r"holds an earlier run \(1 checkpoint\(s\), final weights, metrics.jsonl\); "
                                        r"continue it with --resume"):
        check_fresh_run(str(tmp_path), overwrite=False)
    check_fresh_run(str(tmp_path), overwrite=True)


def test_a_fresh_run_on_an_earlier_runs_directory_is_refused_without_overwrite(plan_file, tmp_path):
    run_dir = tmp_path / "run"
    files = earlier(run_dir)
    out = rpeg_run(plan_file, "--backend", "torch", "--quiet", "--run-dir", str(run_dir))
    one_line_error(out, "holds an earlier run (2 checkpoint(s), metrics.jsonl)", f"--resume {run_dir}", "--overwrite")
    unchanged(files)
    assert not (run_dir / "workers").exists()


def test_overwrite_needs_a_run_directory(plan_file):
    one_line_error(rpeg_run(plan_file, "--backend", "torch", "--overwrite"), "--overwrite", "--run-dir")


# -- exports and the secret file ----------------------------------------------------------------------------------


def test_managed_paths_of_a_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / CHECKPOINT_DIR).mkdir(parents=True)
    for inside in (run_dir, run_dir / CHECKPOINT_DIR / "step-999999", run_dir / FINAL, run_dir / "workers" / "x"):
        assert managed_path(str(inside)) == str(run_dir.resolve()), inside
    for outside in (run_dir / "exported", tmp_path / "elsewhere", tmp_path / FINAL):
        assert managed_path(str(outside)) is None, outside


@pytest.mark.parametrize("where", [f"{CHECKPOINT_DIR}/step-999999", FINAL, "."])
def test_an_export_into_a_run_directorys_managed_paths_is_refused(tmp_path, where):
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    files = earlier(run_dir)
    out = rpeg_run("export", str(run_dir), str(run_dir / where), "--step", "2")
    one_line_error(out, "cannot write the export", "choose a path outside them")
    unchanged(files)
    assert not (run_dir / CHECKPOINT_DIR / "step-999999").exists() and not (run_dir / FINAL).exists()


def test_secret_file_never_replaces_a_file(plan_file, tmp_path):
    """--secret-file names where the run writes its secret and removes it at the end: never an existing file, the
    plan least of all."""
    keep = tmp_path / "notes.txt"
    keep.write_text("mine\n")
    plan_text = open(plan_file).read()
    for path in (str(keep), plan_file):
        out = rpeg_run(plan_file, "--backend", "torch", "--store", "127.0.0.1:0", "--secret-file", path)
        one_line_error(out, f"--secret-file {path}: the file exists")
    assert keep.read_text() == "mine\n" and open(plan_file).read() == plan_text
