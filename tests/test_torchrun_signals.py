"""SIGINT / SIGTERM to `rpeg-run --backend torch`: every worker and the fork server
stop within 5 s, rpeg-run prints one line naming the last completed step and the exact resume command
(exit 143 / 130), and that command then completes the run."""

import shlex
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from rpegc.runtime.interrupt import RunState, interrupted_line, resume_command  # noqa: E402
from fixtures.programs import compile_example  # noqa: E402

RPEG_RUN = [sys.executable, "-m", "rpegc.runtime.cli"]
STOP_S = 5.0  # the bound, for every process the run started


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("plans") / "grpo8.exec.rpeg")
    compile_example("grpo-tiny", out, steps=8)
    return out


def interrupt_after_step_2(argv, signum):
    """Start rpeg-run, wait for `step 2 done`, send `signum`; (returncode, stderr, descendants alive 5 s
    after the signal)."""
    proc = subprocess.Popen(RPEG_RUN + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step 2 done"):
                break
        else:
            pytest.fail(f"rpeg-run ended before step 2: {proc.stderr.read()}")
        descendants = psutil.Process(proc.pid).children(recursive=True)  # workers, fork server, trackers
        assert len(descendants) >= 5  # 4 workers + the fork server
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=STOP_S)
        _, alive = psutil.wait_procs(descendants, timeout=STOP_S)
        return proc.returncode, err, [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_stops_every_process_and_the_printed_command_resumes(plan_file, tmp_path):
    run_dir = str(tmp_path / "run")
    argv = [plan_file, "--backend", "torch", "--tp-impl", "torch", "--run-dir", run_dir, "--seed", "3"]
    rc, err, alive = interrupt_after_step_2(argv, signal.SIGTERM)
    assert rc == 143
    assert alive == []
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("rpeg-run:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("rpeg-run: interrupted by SIGTERM after step ")
    step = int(lines[0].split("after step ")[1].split()[0])
    assert step >= 2
    command = lines[0].split("resume with: ")[1]
    assert command == resume_command(plan_file, argv, run_dir)
    assert "--seed 3" in command
    words = shlex.split(command)
    assert words[:2] == ["rpeg-run", plan_file]
    done = subprocess.run(RPEG_RUN + words[1:], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "verification: OK" in done.stdout


def test_sigint_without_a_run_dir_says_nothing_can_be_resumed(plan_file):
    rc, err, alive = interrupt_after_step_2([plan_file, "--backend", "torch", "--tp-impl", "torch"], signal.SIGINT)
    assert rc == 130
    assert alive == []
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("rpeg-run:")]
    assert len(lines) == 1 and lines[0].startswith("rpeg-run: interrupted by SIGINT after step ")
    assert "nothing can be resumed" in lines[0] and "--run-dir" in lines[0]


def test_interrupted_line_names_the_step_and_the_checkpoint():
    state = RunState(last_step=3, first_step=0, total_steps=20, run_dir="out/run", checkpoint_step=4)
    line = interrupted_line("SIGTERM", state, "p.rpeg", ["p.rpeg", "--backend", "torch", "--run-dir", "out/run"])
    assert line == ("rpeg-run: interrupted by SIGTERM after step 3 (steps 0..19), the last checkpoint resumes at "
                    "step 4; resume with: rpeg-run p.rpeg --backend torch --resume out/run")


def test_interrupted_line_before_any_checkpoint():
    state = RunState(last_step=None, first_step=0, total_steps=4, run_dir="r", checkpoint_step=None)
    line = interrupted_line("SIGINT", state, "p.rpeg", [])
    assert "before step 0 completed" in line and "no checkpoint was written yet in r" in line


def test_resume_command_keeps_the_identity_options_in_both_spellings():
    argv = ["p", "--backend=torch", "--lr=0.01", "--reward", "model", "--run-dir", "d", "--trace", "t.jsonl"]
    assert resume_command("p", argv, "d") == "rpeg-run p --backend torch --resume d --lr 0.01 --reward model"


def test_a_second_sigterm_kills_at_once_and_leaves_no_process(plan_file):
    proc = subprocess.Popen(RPEG_RUN + [plan_file, "--backend", "torch", "--tp-impl", "torch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step 1 done"):
                break
        descendants = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=STOP_S)
        _, alive = psutil.wait_procs(descendants, timeout=STOP_S)
        assert proc.returncode == 143
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_during_the_launch_leaves_no_process(plan_file, tmp_path):
    """Signalled while the fork server starts workers: no hang on a half-sent request, no stray worker."""
    argv = [plan_file, "--backend", "torch", "--tp-impl", "torch", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(RPEG_RUN + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        me = psutil.Process(proc.pid)
        seen = []
        for _ in range(600):  # until the fork server runs (at most ~60 s)
            seen = me.children(recursive=True)
            if any("forkserver" in " ".join(p.cmdline()) for p in seen if p.is_running()):
                break
            time.sleep(0.1)
        seen = me.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STOP_S)
        _, alive = psutil.wait_procs(seen, timeout=STOP_S)
        assert proc.returncode == 143 and "Traceback" not in err
        assert "rpeg-run: interrupted by SIGTERM before step 0 completed" in err
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
