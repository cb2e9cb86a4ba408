"""Schedules the paper's figures promise, compared across two driver runs (Figs. 16, 18, 19).

- Figs. 18/19: on 4 GPUs with generation on GPU 0 and inference on GPUs 1-3, quantile splitting (Q = 3)
  lets inference start on early-finishing sequences, so the makespan is strictly smaller than without it.
- Fig. 16(b) / Def. A.10: with tau(actor) = 1 and training disjoint from generation, generation of step
  k+1 runs while step k trains; with tau = 0 (same plan) it waits for the actor's update.
Each case runs the full pipeline through `rpegc.cli.main(argv)` with `--emit=json` and reads the times.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from rpegc.cli import main

pytest.importorskip("rpegc.passes.annotate_cost")

INPUTS = pathlib.Path(__file__).parent.parent / "lit_tests" / "Inputs"
FIG18 = INPUTS / "fig18-4gpu.rpeg"
ASYNC = INPUTS / "ppo-8gpu-async.rpeg"


def pipeline(k: int, split: bool = True) -> str:
    return (f"verify-wellformed,unroll{{k={k}}},split-quantiles{{enable={str(split).lower()}}},"
            "insert-comm,insert-reshard,annotate-cost,schedule")


def schedule_of(capsys, path: pathlib.Path, passes: str) -> dict:
    code = main([str(path), "-p", passes, "--emit=json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def nodes(data: dict) -> dict[str, dict]:
    return {n["id"]: n for n in data["nodes"]}


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["finish"] and b["start"] < a["finish"]


# --- Figs. 18/19: quantile splitting -------------------------------------------------------------------


def test_split_quantiles_gives_a_strictly_smaller_makespan(capsys):
    split = schedule_of(capsys, FIG18, pipeline(k=2, split=True))
    whole = schedule_of(capsys, FIG18, pipeline(k=2, split=False))
    assert split["schedule"]["makespan"] < whole["schedule"]["makespan"]
    assert split["schedule"]["score"] > whole["schedule"]["score"]  # same tokens in less time


def test_split_inference_starts_before_generation_ends(capsys):
    """Fig. 19(b): inference of phase 1 overlaps later generation phases; Fig. 18(b): it cannot."""
    split = nodes(schedule_of(capsys, FIG18, pipeline(k=1, split=True)))
    whole = nodes(schedule_of(capsys, FIG18, pipeline(k=1, split=False)))
    generation_end = split["gen#0.q3"]["finish"]
    for inference in ("ref_inf", "reward_inf", "critic_inf"):
        first = split[f"{inference}#0.q1"]
        assert first["start"] < generation_end, inference
        assert set(first["devices"]).isdisjoint(split["gen#0.q3"]["devices"])
        assert whole[f"{inference}#0"]["start"] >= whole["gen#0"]["finish"], inference


# --- Fig. 16(b): asynchrony on disjoint devices --------------------------------------------------------


def with_actor_staleness(tmp_path: pathlib.Path, tau: int) -> pathlib.Path:
    text = ASYNC.read_text()
    assert "rpeg.staleness {@actor = 1, @critic = 0}" in text
    path = tmp_path / f"ppo-tau{tau}.rpeg"
    path.write_text(text.replace("rpeg.staleness {@actor = 1", f"rpeg.staleness {{@actor = {tau}"))
    return path


def test_async_generation_overlaps_the_previous_steps_training(tmp_path, capsys):
    k_eval = 3
    sync = nodes(schedule_of(capsys, with_actor_staleness(tmp_path, 0), pipeline(k=k_eval)))
    asyn = nodes(schedule_of(capsys, with_actor_staleness(tmp_path, 1), pipeline(k=k_eval)))
    trainers = ("train_actor", "train_critic")
    overlapping = []
    for k in range(k_eval - 1):
        gen_next = asyn[f"gen#{k + 1}"]
        for t in trainers:
            train = asyn[f"{t}#{k}"]
            assert set(gen_next["devices"]).isdisjoint(train["devices"])
            if overlaps(gen_next, train):
                overlapping.append((gen_next["id"], train["id"]))
        # tau = 1: gen#k+1 reads version k, so it need not wait for train_actor#k ...
        assert gen_next["start"] < asyn[f"train_actor#{k}"]["finish"]
        # ... while tau = 0 makes it wait for the actor's update of step k.
        assert sync[f"gen#{k + 1}"]["start"] >= sync[f"train_actor#{k}"]["finish"]
    assert overlapping, "no generation of step k+1 ran concurrently with training of step k"


def test_async_makespan_is_smaller_than_sync(tmp_path, capsys):
    passes = pipeline(k=3)
    sync = schedule_of(capsys, with_actor_staleness(tmp_path, 0), passes)["schedule"]["makespan"]
    asyn = schedule_of(capsys, with_actor_staleness(tmp_path, 1), passes)["schedule"]["makespan"]
    assert asyn < sync
