"""Per-step metrics in the run directory (runtime/metrics_log.py): one JSON line per
step with times, tokens/s and the workers' metrics; a resume keeps the earlier steps' lines."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from rpegc.runtime.metrics_log import MetricsLog, metrics_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lines(run_dir) -> list[dict]:
    with open(metrics_path(str(run_dir))) as f:
        return [json.loads(x) for x in f]


def test_steps_get_times_tokens_per_second_and_finite_metrics(tmp_path):
    log = MetricsLog(str(tmp_path))
    log.write(0, 2.0, {"reward": 0.5, "response_tokens": 100.0})
    log.write(1, 2.5, {"reward": 0.75, "response_tokens": 50.0, "kl": math.nan, "step": 1.0})
    log.close()
    first, second = lines(tmp_path)
    assert first == {"step": 0, "time_s": 2.0, "reward": 0.5, "response_tokens": 100.0}
    assert second["step_s"] == pytest.approx(0.5) and second["tokens_per_s"] == pytest.approx(100.0)
    assert "kl" not in second and second["step"] == 1  # non-finite values are left out, never written as NaN


def test_a_fresh_run_starts_the_file_and_a_resume_keeps_the_steps_before_it(tmp_path):
    path = metrics_path(str(tmp_path))
    with open(path, "w") as f:
        f.write('{"step": 0, "time_s": 1.0}\n{"step": 1, "time_s": 2.0}\n{"step": 2, "time_s": 3.0}\n{"step": 3, "ti')
    MetricsLog(str(tmp_path), first_step=2).write(2, 9.0, {})
    assert [r["step"] for r in lines(tmp_path)] == [0, 1, 2]
    MetricsLog(str(tmp_path)).write(0, 1.0, {})
    assert [r["step"] for r in lines(tmp_path)] == [0]


def test_a_torch_run_writes_a_line_per_step(tmp_path):
    """... and `--log wandb,mlflow` sends the same lines, with the run's config, to both trackers (offline)."""
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from fixtures.trackers import mlflow_history, mlflow_runs, wandb_runs

    pipeline = "verify-wellformed,unroll{k=3},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
    run = [sys.executable, "-m", "rpegc.cli", os.path.join(ROOT, "examples", "grpo-tiny-2.rpeg"), "-p", pipeline,
           "-o", "g.exec.rpeg"]
    assert subprocess.run(run, cwd=tmp_path, capture_output=True).returncode == 0
    proc = subprocess.run([sys.executable, "-m", "rpegc.runtime.cli", "g.exec.rpeg", "--backend", "torch",
                           "--run-dir", "run", "--quiet", "--log", "wandb,mlflow"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert not any(name in proc.stderr.lower() for name in ("wandb", "w&b", "mlflow")), proc.stderr  # quiet
    # whose machine the predictions were priced for (the suite pins cpu-reference, tests/conftest.py)
    assert ("predictions priced with hardware 'cpu' = 'cpu-reference': another machine's profile (vm, calibrated "
            "2026-12-01;") in proc.stdout
    steps = lines(tmp_path / "run")
    assert [r["step"] for r in steps] == [0, 1, 2]
    for key in ("reward", "reward_std", "kl", "response_length", "policy_loss", "clip_frac", "actor_grad_norm"):
        assert all(key in r for r in steps), key
    assert all(r["tokens_per_s"] > 0 and r["step_s"] > 0 for r in steps[1:])

    by_step = {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in steps}
    (wb,) = wandb_runs(str(tmp_path / "run"))
    assert wb.history == by_step and wb.exit_code == 0
    assert wb.config["algorithm"] == "grpo" and wb.config["rl"]["clip_eps"] > 0 and wb.config["seed"] == 0
    (ml,) = mlflow_runs(str(tmp_path / "run"))
    assert ml.info.status == "FINISHED" and ml.data.params["plan_hash"] == wb.config["plan_hash"]
    assert mlflow_history(str(tmp_path / "run"), ml.info.run_id, by_step[1]) == by_step
