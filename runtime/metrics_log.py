"""Per-step training metrics of a torch run in its run directory (issue 15, item 8).

RUN_DIR/metrics.jsonl gets one JSON object per completed RL step, in step order: `step`, `time_s` (the
run's clock when the step's last node finished), `step_s` (since the previous step finished; absent for a
run's first step), `tokens_per_s` (response tokens generated in the step / step_s) and every metric the
workers reported (reward and its std, score, kl, response length and tokens, policy/value/KL losses,
entropy, clip fraction, grad norms: the algorithm's `train`, runtime/backends/torch/rl/algorithms/). A resumed
run keeps the lines of the steps before the checkpoint and continues the file. The same values (every field but `step`)
go to the experiment trackers of `rpeg-run --log` under the same names at global step `step`, with the run's config
(runtime/trackers.py); without --log, to TensorBoard (RUN_DIR/tensorboard/) when the `tensorboard` package is
installed. A tracker that fails in the middle of a run is dropped with a warning: the run and metrics.jsonl go on.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.trackers import (FAILED, FINISHED, Tracker, close_quietly, default_trackers,
                                    open_trackers, warn)

FILE = "metrics.jsonl"


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, FILE)


def keep_before(run_dir: str, step: int) -> None:
    """Drop the lines of steps >= `step` (a resume repeats them) and a torn last line."""
    path = metrics_path(run_dir)
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] < step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)


class MetricsLog:
    """Appends the steps of a run to RUN_DIR/metrics.jsonl and sends them to its trackers (`trackers`: the names
    of `rpeg-run --log`; None: TensorBoard when installed) with the run's `config`."""

    def __init__(self, run_dir: str, first_step: int = 0, trackers: Optional[Sequence[str]] = None,
                 config: Optional[dict] = None):
        os.makedirs(run_dir, exist_ok=True)
        if first_step:
            keep_before(run_dir, first_step)
        elif os.path.exists(metrics_path(run_dir)):
            os.remove(metrics_path(run_dir))  # a fresh run owns its directory
        self.path = metrics_path(run_dir)
        self.last_finish: Optional[float] = None
        self.trackers: list[Tracker] = _open(run_dir, trackers, dict(config or {}), first_step)
        self.closed = False

    def write(self, step: int, finish: float, metrics: dict[str, float]) -> None:
        record: dict = {"step": step, "time_s": finish}
        if self.last_finish is not None and finish > self.last_finish:
            record["step_s"] = finish - self.last_finish
            if "response_tokens" in metrics:
                record["tokens_per_s"] = metrics["response_tokens"] / record["step_s"]
        self.last_finish = finish
        record.update({k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))
                       and math.isfinite(v)})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")
        values = {k: v for k, v in record.items() if k != "step"}
        for t in list(self.trackers):
            self._log(t, step, values)

    def _log(self, t: Tracker, step: int, values: dict[str, float]) -> None:
        """One tracker's step; a tracker that fails is closed as failed and dropped, with one warning."""
        try:
            t.log(step, values)
        except Exception as e:
            self.trackers.remove(t)
            warn(f"--log {t.name}: logging step {step} failed ({type(e).__name__}: {str(e).strip()[:200]}); "
                 f"{t.name} gets no more steps of this run, metrics.jsonl keeps them all")
            close_quietly(t, FAILED)

    def close(self, status: str = FINISHED) -> None:
        """Close every tracker run once, with the run's outcome (trackers.FINISHED, FAILED or KILLED)."""
        if self.closed:
            return
        self.closed = True
        for t in self.trackers:
            problem = close_quietly(t, status)
            if problem:
                warn(problem)


def _open(run_dir: str, names: Optional[Sequence[str]], config: dict, first_step: int) -> list[Tracker]:
    """The trackers `names` asks for (a one-line error if one cannot start); None: TensorBoard if it starts."""
    if names is not None:
        return open_trackers(names, run_dir, config, first_step)
    try:
        return open_trackers(default_trackers(), run_dir, config, first_step)
    except RpegError:  # tensorboard is installed but its writer cannot be imported: the JSONL file only, as before
        return []
