"""Per-step training metrics of a torch run in its run directory (issue 15, item 8).

RUN_DIR/metrics.jsonl gets one JSON object per completed RL step, in step order: `step`, `time_s` (the
run's clock when the step's last node finished), `step_s` (since the previous step finished; absent for a
run's first step), `tokens_per_s` (response tokens generated in the step / step_s) and every metric the
workers reported (reward and its std, score, kl, response length and tokens, policy/value/KL losses,
entropy, clip fraction, grad norms: runtime/backends/torch/worker.py `op_training`). A resumed run keeps the
lines of the steps before the checkpoint and continues the file. When TensorBoard's writer can be imported
(`torch.utils.tensorboard`, which needs the `tensorboard` package), the same values go to
RUN_DIR/tensorboard/ as scalars `metric` at global step `step`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional

FILE = "metrics.jsonl"
TENSORBOARD = "tensorboard"


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
    """Appends the steps of a run to RUN_DIR/metrics.jsonl (and TensorBoard when available)."""

    def __init__(self, run_dir: str, first_step: int = 0):
        os.makedirs(run_dir, exist_ok=True)
        if first_step:
            keep_before(run_dir, first_step)
        elif os.path.exists(metrics_path(run_dir)):
            os.remove(metrics_path(run_dir))  # a fresh run owns its directory
        self.path = metrics_path(run_dir)
        self.last_finish: Optional[float] = None
        self.board = _tensorboard(os.path.join(run_dir, TENSORBOARD))

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
        if self.board is not None:
            for k, v in record.items():
                if k != "step":
                    self.board.add_scalar(k, v, step)
            self.board.flush()

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def _tensorboard(directory: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is not installed: the JSONL file only
        return None
    return SummaryWriter(directory)
