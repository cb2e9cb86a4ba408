"""Experiment trackers of a run's per-step metrics (`rpeg-run --log`, issue 35 item 5).

RUN_DIR/metrics.jsonl is always written (metrics_log.py); `--log NAME[,NAME...]` also sends every line of it, under
the same names at the same step, to each tracker named, through that library's own API, and records the run's
configuration (plan, hash, seed, backend settings, RL hyper-parameters, prompts, reward) with it:

- tensorboard: `torch.utils.tensorboard.SummaryWriter` in RUN_DIR/tensorboard/ (scalars, the config as text);
- wandb: `wandb.init(mode="offline", dir=RUN_DIR)`, a local run in RUN_DIR/wandb/offline-run-*/ that
  `wandb sync` uploads later; nothing goes to the network and W&B prints nothing;
- mlflow: a file store in RUN_DIR/mlflow/ (`MlflowClient(tracking_uri="file:...")`: the config as params, the
  metrics with their step); MLflow's telemetry is switched off.

Without --log a run keeps what it always did: TensorBoard when the `tensorboard` package is installed. A named
tracker whose package is missing, or a name no tracker has, is a one-line error before anything runs. Every
run of rpeg-run is one tracker run (a resumed run is a new one whose config says its first step); it is closed at
the end of the run with its outcome: finished, failed, or killed (interrupted).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from rpegc.core.ir.errors import RpegError

# How a tracker run ends (MLflow's RunStatus names; W&B: exit code 0 for finished, 1 otherwise).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
NONE = "none"  # --log none: metrics.jsonl only
PROJECT = "rpegc"  # the W&B project and the MLflow experiment unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME say
TENSORBOARD_DIR, WANDB_DIR, MLFLOW_DIR = "tensorboard", "wandb", "mlflow"  # under the run directory


@dataclass(frozen=True)
class TrackerKind:
    """A tracker `--log` can name: the module it imports, the pinned package that provides it, what it writes."""

    name: str
    module: str
    requirement: str
    help: str

    @property
    def package(self) -> str:
        return self.requirement.split("==")[0]


KINDS: dict[str, TrackerKind] = {k.name: k for k in (
    TrackerKind("tensorboard", "tensorboard", "tensorboard==2.21.0", "TensorBoard scalars in RUN_DIR/tensorboard/"),
    TrackerKind("wandb", "wandb", "wandb==0.31.0", "an offline Weights & Biases run in RUN_DIR/wandb/, for wandb sync"),
    TrackerKind("mlflow", "mlflow", "mlflow-skinny==3.18.0", "an MLflow file store in RUN_DIR/mlflow/"),
)}


class Tracker(Protocol):
    """One open tracker run: `log` a step's values, `close` once with the run's outcome."""

    name: str

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self, status: str) -> None: ...


def parse_log(text: str) -> tuple[str, ...]:
    """The trackers of `--log TEXT` (comma-separated, in order, each once); `none` alone is no tracker."""
    names = [n.strip() for n in text.split(",")]
    if names == [NONE]:
        return ()
    known = ", ".join(KINDS)
    for name in names:
        if not name:
            raise RpegError(None, f"--log {text}: an empty tracker name; give a comma-separated list of {known} "
                                  f"(or {NONE})")
        if name == NONE:
            raise RpegError(None, f"--log {text}: {NONE} means no tracker and stands alone; known trackers: {known}")
        if name not in KINDS:
            close = difflib.get_close_matches(name, list(KINDS) + [NONE], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise RpegError(None, f"--log {text}: unknown tracker '{name}'; {hint}known: {known} (or {NONE} "
                                  "alone)")
    return tuple(dict.fromkeys(names))


def check_installed(names: Sequence[str]) -> None:
    """A one-line error naming the package to install for the first tracker in `names` that cannot be imported
    (checked without importing it: rpeg-run checks its options in milliseconds)."""
    for name in names:
        kind = KINDS[name]
        if not _importable(kind.module):
            raise RpegError(None, f"--log {name} needs the {kind.package} package: pip install {kind.requirement}")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is not a package, a module without __spec__
        return False


def default_trackers() -> tuple[str, ...]:
    """Without --log: TensorBoard when its package is installed, as before --log existed."""
    return ("tensorboard",) if _importable("tensorboard") else ()


def open_trackers(names: Sequence[str], run_dir: str, config: dict, first_step: int = 0) -> list[Tracker]:
    """Start a tracker run for each of `names` under `run_dir`; a tracker that cannot start is a one-line error,
    after the ones already started are closed as failed."""
    opened: list[Tracker] = []
    for name in names:
        try:
            opened.append(OPENERS[name](run_dir, {**config, "first_step": first_step}))
        except Exception as e:
            for t in opened:
                close_quietly(t, FAILED)
            if isinstance(e, RpegError):
                raise
            raise RpegError(None, f"--log {name}: cannot start the {name} run in {run_dir}: "
                                  f"{type(e).__name__}: {_first_line(e)}") from None
    return opened


def close_quietly(t: Tracker, status: str) -> Optional[str]:
    """Close `t`; a failure is returned as a warning line (the run's own outcome matters more)."""
    try:
        t.close(status)
    except Exception as e:
        return f"--log {t.name}: closing its run failed: {type(e).__name__}: {_first_line(e)}"
    return None


def warn(line: str) -> None:
    print(f"rpeg-run: warning: {line}", file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def run_name(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(os.path.abspath(run_dir)))


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as flat `a.b` keys with string values (MLflow params; lists and tuples as JSON)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_params(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = str(v)
    return out


# -- TensorBoard ------------------------------------------------------------------------------------------


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, TENSORBOARD_DIR))
        text = "```\n" + json.dumps(config, indent=2, default=str) + "\n```"
        self.writer.add_text("config", text, int(config.get("first_step", 0)))

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


# -- Weights & Biases ------------------------------------------------------------------------------------------


def quiet_wandb_environment() -> None:
    """Before wandb is imported: no console output and no error reports sent anywhere."""
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ["WANDB_ERROR_REPORTING"] = "false"


class WandbTracker:
    """An offline W&B run in RUN_DIR/wandb/: history by step, the config as the run's config."""

    name = "wandb"

    def __init__(self, run_dir: str, config: dict):
        quiet_wandb_environment()
        import wandb

        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False,
                                  disable_git=True)
        self.run = wandb.init(mode="offline", dir=os.path.abspath(run_dir),
                              project=os.environ.get("WANDB_PROJECT") or PROJECT, name=run_name(run_dir),
                              config=config, settings=settings, reinit="create_new")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, status: str) -> None:
        import wandb

        self.run.finish(exit_code=0 if status == FINISHED else 1)
        # finish() can return before W&B's service has written the run's last records: teardown waits for it
        # (its atexit hook is not reliable in a process that uses multiprocessing, as rpeg-run does).
        wandb.teardown()


# -- MLflow ------------------------------------------------------------------------------------------------------

MLFLOW_BATCH = 100  # params per log_batch call (MLflow's limit)


def mlflow_uri(run_dir: str) -> str:
    """The tracking URI of a run directory's MLflow file store."""
    return "file:" + os.path.abspath(os.path.join(run_dir, MLFLOW_DIR))


def mlflow_environment() -> None:
    """Before mlflow is imported: no telemetry, and the file store allowed (MLflow 3 asks for the opt-in)."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


class MlflowTracker:
    """An MLflow run in the file store RUN_DIR/mlflow/: the config as params, metrics by step."""

    name = "mlflow"

    def __init__(self, run_dir: str, config: dict):
        mlflow_environment()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(run_dir))
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        found = self.client.get_experiment_by_name(experiment)
        eid = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        tags = {"rpegc.plan_hash": str(config.get("plan_hash", "")), "rpegc.run_dir": os.path.abspath(run_dir)}
        self.run_id = self.client.create_run(eid, run_name=run_name(run_dir), tags=tags).info.run_id
        params = [Param(k, v) for k, v in flat_params(config).items()]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MLFLOW_BATCH])

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


OPENERS: dict[str, Callable[[str, dict], Any]] = {
    "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
