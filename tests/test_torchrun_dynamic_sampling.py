"""DAPO's dynamic sampling on 2 workers against the single-process reference: the workload's `oversample`
draws K x B prompts, generation and inference run on all of them, each training replica keeps from its own slots
the first group whose rewards differ (rl.keep_informative), and the run equals the reference's, which selects
the same rows from the whole batch. Tolerances as in test_torchrun_equivalence.py."""

import re

import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.backends.torch.rl.step import keep_informative  # noqa: E402
from fixtures.torch_runs import assert_same_run, compile_plan, run_torch  # noqa: E402


def test_each_slot_keeps_its_first_group_whose_scores_differ():
    # 2 slots x 3 groups x 2 rollouts: slot 0's groups are (1, 1), (0, 1), (1, 0): the second is kept; slot 1 has
    # none whose scores differ, so it keeps its first group and reports it found none
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.0, 0.0, 2.0, 2.0])
    rows, found = keep_informative(scores, group_size=2, oversample=3)
    assert rows.tolist() == [2, 3, 6, 7] and found.tolist() == [True, False]


def test_dapo_with_dynamic_sampling_on_dp_2_matches_the_reference(tmp_path):
    text = open("examples/grpo-tiny.rpeg").read().replace("rpeg.algorithm grpo", "rpeg.algorithm dapo")
    text = re.sub(r"rpeg\.workload \{B = 16,", "rpeg.workload {B = 8, oversample = 2,", text, count=1)
    plan = compile_plan(tmp_path, "dapo.rpeg", steps=2, text=text)
    rl = {"adam_eps": 1e-5}
    backend, _ = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)
    got = [backend.metrics[k]["informative_groups"] for k in sorted(backend.metrics)]
    assert all(0 < g <= 1 for g in got)
