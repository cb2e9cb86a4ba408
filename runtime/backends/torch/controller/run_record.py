"""What a torch run records beside its trace: the per-step metrics its workers report (losses, rewards, a reward
function's accuracy and failed calls), written to RUN_DIR/metrics.jsonl and the experiment trackers as each step
ends, and the notes the summary prints after the run (what ran that the plan does not price).
"""

from __future__ import annotations

from typing import Optional

from rpegc.core.ir.program import Program
from rpegc.runtime.backends.torch.controller.inbox import warn
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.metrics_log import MetricsLog


class RunRecord:
    """Per-step metrics and a reward function's statistics of one run, and where they are written."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.reward_stats: dict[int, dict] = {}  # step -> a reward function's accuracy sums and failures
        self.first_reward_failure: Optional[str] = None
        self.log: Optional[MetricsLog] = None  # RUN_DIR/metrics.jsonl and the trackers, once the run starts

    def add_metrics(self, step: int, values: dict[str, float]) -> None:
        self.metrics.setdefault(step, {}).update(values)

    def step_metrics(self, step: int) -> dict[str, float]:
        return dict(self.metrics.get(step, {}))

    def step_done(self, step: int, finish: float) -> None:
        """Append step `step`'s metrics and times to RUN_DIR/metrics.jsonl (and the trackers)."""
        if self.log is not None:
            self.log.write(step, finish, self.step_metrics(step))

    def reward_report(self, step: int, stats: dict) -> None:
        """Sum one replica's reward report into step `step`'s accuracy, failure count and reward model's mean score;
        the first failure of the run becomes a warning (the run goes on: a failed call scored 0)."""
        acc = self.reward_stats.setdefault(step, {"acc_sum": 0.0, "acc_n": 0, "failures": 0, "model_sum": 0.0,
                                                  "model_n": 0})
        for k in acc:
            acc[k] += stats.get(k, 0)
        metrics = self.metrics.setdefault(step, {})
        if acc["acc_n"]:
            metrics["accuracy"] = acc["acc_sum"] / acc["acc_n"]
        if acc["model_n"]:  # a reward model that ran beside the score the run trains on (rollout.py)
            metrics["reward_model_score"] = acc["model_sum"] / acc["model_n"]
        if "failures" in stats:  # a reward function's calls
            metrics["reward_failures"] = float(acc["failures"])
        if stats.get("first_failure") and self.first_reward_failure is None:
            self.first_reward_failure = f"step {step}, {stats['first_failure']}"
            warn(f"the reward function failed at {self.first_reward_failure}; such calls score 0 and the run goes "
                  "on (their count: reward_failures in metrics.jsonl and the summary)")

    def notes(self, program: Optional[Program], cfg: Optional[RunConfig]) -> list[str]:
        """What the summary says after the run: the reward function's failed calls, a reward function the plan does
        not price (`unpriced_reward`), and training passes it does not price (`unpriced_passes`)."""
        lines = []
        failed = int(sum(s["failures"] for s in self.reward_stats.values()))
        if failed:
            lines.append(f"reward function: {failed} call(s) failed and scored 0; the first at "
                         f"{self.first_reward_failure}")
        if cfg is None:
            return lines
        unpriced = [unpriced_reward(program, cfg) if program is not None else None, unpriced_passes(cfg)]
        return lines + [f"note: {u}" for u in unpriced if u]


def unpriced_reward(program: Program, cfg: RunConfig) -> Optional[str]:
    """What a run whose reward vertex is a reward model's inference in the plan, and which trains on a reward
    function's scores, says: the model runs as the plan prices it, the function's calls beside it are not priced
    (make the function a verify vertex to price it). The toy tasks' rule, which scores beside the tiny examples'
    reward models, costs microseconds and is not reported."""
    if not cfg.reward_function or program.graph is None:
        return None
    for v in program.graph.vertices:
        if v.role == "inference" and program.model(v.model).kind == "reward":
            return (f"the plan prices @{v.name} as the inference of reward model @{v.model}, which runs, but this "
                    f"run trains on the scores of '{cfg.reward}', whose calls the plan does not price; declare it as "
                    f"a verifier (rpeg.verifier @v {{fn = \"{cfg.reward}\"}}) and make @{v.name} a verify vertex")
    return None


def unpriced_passes(cfg: RunConfig) -> Optional[str]:
    """What a run whose training operators make more than one pass over their batch, or more than one optimizer step,
    says: the cost model prices one of each per training operator (the IR does not carry ppo_epochs and
    ppo_minibatches yet), so such a run's training takes longer than its plan says."""
    epochs, minibatches = cfg.rl.ppo_epochs, cfg.rl.ppo_minibatches
    if epochs == 1 and minibatches == 1:
        return None
    return (f"--rl ppo_epochs = {epochs}, ppo_minibatches = {minibatches}: each training operator makes {epochs} "
            f"pass(es) over its batch and {epochs * minibatches} optimizer step(s), but the plan prices one of each: "
            f"its training operators take about {epochs}x their predicted time, more with the extra steps")
