"""`rpeg-run --log`: the experiment trackers of a run's metrics (runtime/trackers.py, runtime/metrics_log.py).

Each tracker gets the lines of metrics.jsonl (same names, same step) and the run's config through its own library,
offline, under the run directory: W&B's offline run is read back from its transaction log, MLflow's file store
through MlflowClient. A missing package, an unknown name and --log without a run directory are one-line errors
before anything runs; a tracker run is closed with the run's outcome."""

from __future__ import annotations

import json
import os
import sys

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime import trackers
from rpegc.runtime.cli import main
from rpegc.runtime.interrupt import resume_command
from rpegc.runtime.metrics_log import MetricsLog, metrics_path
from rpegc.runtime.trackers import FAILED, FINISHED, KILLED, check_installed, flat_params, parse_log

CONFIG = {"plan": "/p/g.exec.rpeg", "plan_hash": "0123abcd", "seed": 7, "backend": "torch",
          "rl": {"kl_coef": 0.02, "adam_betas": [0.9, 0.999], "value_clip": None}, "data": {"task": "pattern"}}
STEPS = [(0, 2.0, {"reward": 0.5, "response_tokens": 100.0, "policy_loss": -0.25}),
         (1, 2.5, {"reward": 0.75, "response_tokens": 50.0, "policy_loss": 0.125, "kl": float("nan")})]


def logged(run_dir, names, status=FINISHED) -> list[dict]:
    """Run `STEPS` through a MetricsLog with trackers `names`, close it with `status`; metrics.jsonl's lines."""
    log = MetricsLog(str(run_dir), trackers=names, config=CONFIG)
    for step, finish, metrics in STEPS:
        log.write(step, finish, metrics)
    log.close(status)
    with open(metrics_path(str(run_dir))) as f:
        return [json.loads(x) for x in f]


def by_step(lines: list[dict]) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in lines}


# -- the option -------------------------------------------------------------------------------------------


def test_log_names_trackers_in_order_once_and_none_means_no_tracker():
    assert parse_log("wandb,mlflow") == ("wandb", "mlflow")
    assert parse_log(" mlflow , tensorboard,mlflow") == ("mlflow", "tensorboard")
    assert parse_log("none") == ()


@pytest.mark.parametrize("text,message", [
    ("wandbb", "--log wandbb: unknown tracker 'wandbb'; did you mean wandb? known: tensorboard, wandb, mlflow"),
    ("comet", "--log comet: unknown tracker 'comet'; known: tensorboard, wandb, mlflow (or none alone)"),
    ("wandb,", "--log wandb,: an empty tracker name"),
    ("none,mlflow", "--log none,mlflow: none means no tracker and stands alone"),
])
def test_unknown_or_empty_names_are_refused_naming_the_known_ones(text, message):
    with pytest.raises(RpegError) as e:
        parse_log(text)
    assert message in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("name,install", [("wandb", "wandb==0.31.0"), ("mlflow", "mlflow-skinny==3.18.0"),
                                          ("tensorboard", "tensorboard==2.21.0")])
def test_a_tracker_whose_package_is_missing_names_the_package_to_install(monkeypatch, name, install):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now fails as if it were not installed
    with pytest.raises(RpegError) as e:
        check_installed(("wandb", "mlflow", "tensorboard"))
    package = install.split("==")[0]
    assert e.value.message == f"--log {name} needs the {package} package: pip install {install}"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    from rpegc.syntax.json_form import program_to_json
    from fixtures.runtime_plans import disaggregated_plan, scheduled

    path = tmp_path_factory.mktemp("plans") / "ppo.exec.json"
    path.write_text(json.dumps(program_to_json(scheduled(disaggregated_plan(1), 2))))
    return str(path)


def test_rpeg_run_refuses_a_missing_package_in_one_line_before_anything_runs(plan_file, tmp_path, monkeypatch,
                                                                              capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    run_dir = tmp_path / "run"
    assert main([plan_file, "--backend", "torch", "--run-dir", str(run_dir), "--log", "mlflow,wandb"]) == 1
    err = capsys.readouterr().err
    assert err == "rpeg-run: error: --log wandb needs the wandb package: pip install wandb==0.31.0\n"
    assert not run_dir.exists()  # refused before the run directory was even claimed


@pytest.mark.parametrize("args,message", [
    (["--backend", "torch", "--run-dir", "RUN", "--log", "wandb,neptune"],
     "--log wandb,neptune: unknown tracker 'neptune'; known: tensorboard, wandb, mlflow"),
    (["--backend", "torch", "--log", "mlflow"],
     "--log mlflow: the trackers write under the run directory; give --run-dir DIR"),
    (["--backend", "sim", "--log", "none"], "--log applies to the torch backend only"),
])
def test_rpeg_run_refuses_bad_log_options_in_one_line(plan_file, tmp_path, capsys, args, message):
    args = [str(tmp_path / "run") if a == "RUN" else a for a in args]
    assert main([plan_file, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rpeg-run: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_resume_command_keeps_the_trackers():
    cmd = resume_command("p.rpeg", ["p.rpeg", "--run-dir", "run", "--log", "wandb,mlflow", "--seed=3"], "run")
    assert cmd == "rpeg-run p.rpeg --backend torch --resume run --log wandb,mlflow --seed 3"


# -- what each tracker records ---------------------------------------------------------------------------


def test_wandb_offline_run_has_the_metrics_by_step_and_the_config(tmp_path):
    pytest.importorskip("wandb")
    from fixtures.trackers import wandb_runs

    lines = logged(tmp_path, ("wandb",))
    (run,) = wandb_runs(str(tmp_path))
    assert run.history == by_step(lines)  # every field of every line, at its step; NaN left out as in the file
    assert run.history[1]["tokens_per_s"] == pytest.approx(100.0) and "kl" not in run.history[1]
    assert run.config == {**CONFIG, "first_step": 0}
    assert run.project == "rpegc" and run.name == os.path.basename(tmp_path) and run.exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "wandb"]  # W&B writes under RUN_DIR/wandb/ only


def test_wandb_marks_a_failed_run(tmp_path):
    pytest.importorskip("wandb")
    from fixtures.trackers import wandb_runs

    logged(tmp_path, ("wandb",), status=FAILED)
    (run,) = wandb_runs(str(tmp_path))
    assert run.exit_code == 1 and sorted(run.history) == [0, 1]


def test_mlflow_file_store_has_the_run_with_metrics_params_and_status(tmp_path):
    pytest.importorskip("mlflow")
    from fixtures.trackers import mlflow_history, mlflow_runs

    lines = logged(tmp_path, ("mlflow",))
    (run,) = mlflow_runs(str(tmp_path))
    assert run.info.status == FINISHED and run.info.run_name == os.path.basename(tmp_path)
    keys = {k for r in lines for k in r if k != "step"}
    assert set(run.data.metrics) == keys
    assert mlflow_history(str(tmp_path), run.info.run_id, keys) == by_step(lines)
    assert run.data.params == flat_params({**CONFIG, "first_step": 0})
    assert run.data.params["rl.kl_coef"] == "0.02" and run.data.params["rl.adam_betas"] == "[0.9, 0.999]"
    assert run.data.tags["rpegc.plan_hash"] == "0123abcd"


@pytest.mark.parametrize("status", [FAILED, KILLED])
def test_mlflow_marks_a_failed_or_interrupted_run(tmp_path, status):
    pytest.importorskip("mlflow")
    from fixtures.trackers import mlflow_runs

    logged(tmp_path, ("mlflow",), status=status)
    (run,) = mlflow_runs(str(tmp_path))
    assert run.info.status == status and run.info.end_time is not None


def test_both_trackers_at_once_and_a_resumed_run_is_a_new_tracker_run(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from fixtures.trackers import mlflow_runs, wandb_runs

    logged(tmp_path, ("wandb", "mlflow"))
    resumed = MetricsLog(str(tmp_path), first_step=1, trackers=("wandb", "mlflow"), config=CONFIG)
    resumed.write(1, 9.0, {"reward": 1.0})
    resumed.close()
    assert [r["step"] for r in by_step_lines(tmp_path)] == [0, 1]
    first, second = wandb_runs(str(tmp_path))
    assert sorted(first.history) == [0, 1] and second.history == {1: {"time_s": 9.0, "reward": 1.0}}
    assert second.config["first_step"] == 1
    runs = mlflow_runs(str(tmp_path))
    assert [r.data.params["first_step"] for r in runs] == ["0", "1"]
    assert runs[1].data.metrics == {"time_s": 9.0, "reward": 1.0}


def by_step_lines(run_dir) -> list[dict]:
    with open(metrics_path(str(run_dir))) as f:
        return [json.loads(x) for x in f]


# -- opening, failing, closing -----------------------------------------------------------------------------------


class FakeTracker:
    """A tracker that records what it is given (and fails where told)."""

    def __init__(self, name: str, events: list, fail_log: bool = False):
        self.name, self.events, self.fail_log = name, events, fail_log

    def log(self, step, values):
        if self.fail_log:
            raise OSError("No space left on device")
        self.events.append((self.name, "log", step, dict(values)))

    def close(self, status):
        self.events.append((self.name, "close", status))


def test_a_tracker_that_fails_mid_run_is_dropped_with_a_warning_and_the_file_goes_on(tmp_path, monkeypatch, capsys):
    events: list = []
    monkeypatch.setitem(trackers.OPENERS, "wandb", lambda d, c: FakeTracker("wandb", events))
    monkeypatch.setitem(trackers.OPENERS, "mlflow", lambda d, c: FakeTracker("mlflow", events, fail_log=True))
    lines = logged(tmp_path, ("wandb", "mlflow"))
    assert [r["step"] for r in lines] == [0, 1]
    assert [e[:3] for e in events] == [("wandb", "log", 0), ("mlflow", "close", FAILED), ("wandb", "log", 1),
                                       ("wandb", "close", FINISHED)]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rpeg-run: warning: --log mlflow: logging step 0 failed "
                                                   "(OSError: No space left on device)")


def test_a_tracker_that_cannot_start_is_one_error_and_the_started_ones_are_closed_failed(tmp_path, monkeypatch):
    events: list = []
    configs: list = []

    def start_wandb(run_dir, config):
        configs.append(config)
        return FakeTracker("wandb", events)

    def start_mlflow(run_dir, config):
        raise PermissionError(13, "Permission denied", str(run_dir))

    monkeypatch.setitem(trackers.OPENERS, "wandb", start_wandb)
    monkeypatch.setitem(trackers.OPENERS, "mlflow", start_mlflow)
    with pytest.raises(RpegError) as e:
        MetricsLog(str(tmp_path), first_step=0, trackers=("wandb", "mlflow"), config=CONFIG)
    assert e.value.message.startswith(f"--log mlflow: cannot start the mlflow run in {tmp_path}: PermissionError:")
    assert events == [("wandb", "close", FAILED)] and configs == [{**CONFIG, "first_step": 0}]


def test_without_log_tensorboard_only_when_installed_and_none_logs_nowhere(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert MetricsLog(str(tmp_path)).trackers == []  # as before --log: the JSONL file only
    events: list = []
    monkeypatch.setitem(trackers.OPENERS, "tensorboard", lambda d, c: FakeTracker("tensorboard", events))
    monkeypatch.setattr(trackers, "_importable", lambda module: True)
    assert [t.name for t in MetricsLog(str(tmp_path)).trackers] == ["tensorboard"]
    assert MetricsLog(str(tmp_path), trackers=parse_log("none")).trackers == []


def test_closing_twice_closes_each_tracker_once(tmp_path, monkeypatch):
    events: list = []
    monkeypatch.setitem(trackers.OPENERS, "wandb", lambda d, c: FakeTracker("wandb", events))
    log = MetricsLog(str(tmp_path), trackers=("wandb",))
    log.close(FAILED)
    log.close(FINISHED)
    assert events == [("wandb", "close", FAILED)]


@pytest.mark.parametrize("interrupted,status", [(False, FAILED), (True, KILLED)])
def test_the_torch_backend_closes_the_trackers_of_a_run_that_did_not_finish(tmp_path, monkeypatch, interrupted,
                                                                           status):
    pytest.importorskip("torch")
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend

    events: list = []
    monkeypatch.setitem(trackers.OPENERS, "mlflow", lambda d, c: FakeTracker("mlflow", events))
    backend = TorchBackend(run_dir=str(tmp_path), trackers=("mlflow",))
    backend.record.log = MetricsLog(str(tmp_path), trackers=backend.trackers)  # as start() opens it
    backend._interrupted = interrupted
    backend.shutdown()  # the run stopped before its workers started (start() failed, or a signal came)
    assert events == [("mlflow", "close", status)]


def test_tensorboard_gets_the_scalars_by_step_and_the_config(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = logged(tmp_path, ("tensorboard",))
    board = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    got: dict[int, dict] = {}
    for tag in board.Tags()["scalars"]:
        for s in board.Scalars(tag):
            got.setdefault(s.step, {})[tag] = s.value
    assert got == pytest.approx(by_step(lines))
    assert "plan_hash" in board.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
