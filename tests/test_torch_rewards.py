"""Reward functions (runtime/backends/torch/rewards.py): the built-ins, plugins named as
module:function, file.py:function or an entry point, verl's signature checked, and failing calls counted,
reported and scored 0."""

from __future__ import annotations

import math

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.datasets import Example
from rpegc.runtime.backends.torch.rewards import (ENTRY_POINT_GROUP, exact_match, load_reward, math_answer,
                                                 score_texts)


def test_exact_match_compares_stripped_text():
    assert exact_match("s", " 42\n", "42") == 1.0 and exact_match("s", "41", "42") == 0.0


@pytest.mark.parametrize("response,truth,score", [
    ("so the answer is #### 42", "Janet has ... #### 42", 1.0),
    ("#### 1,234", "#### 1234", 1.0),
    ("the result is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
    ("\\boxed{7}", "#### 8", 0.0),
    ("no answer at all", "#### 8", 0.0),
])
def test_the_math_verifier_reads_gsm8k_and_boxed_answers(response, truth, score):
    pytest.importorskip("math_verify")
    got = math_answer("gsm8k", response, truth)
    assert got == {"score": score, "acc": score}


def test_a_plugin_comes_from_a_file_or_a_module(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    return scale * len(solution_str)\n")
    fn = load_reward(f"{tmp_path / 'my_reward.py'}:compute_score")
    assert fn(data_source="", solution_str="abc", ground_truth=None, extra_info={}) == 3
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("my_reward:compute_score")(data_source="", solution_str="ab", ground_truth=None,
                                                  extra_info={}) == 2


def test_an_entry_point_names_an_installed_plugin(tmp_path, monkeypatch):
    (tmp_path / "plugin_rewards.py").write_text("def score(**kwargs):\n    return 0.5\n")
    dist = tmp_path / "plugin_rewards-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-rewards\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nhalf = plugin_rewards:score\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("half")() == 0.5


@pytest.mark.parametrize("spec,match", [
    ("nothing_like_it", "unknown reward 'nothing_like_it'"),
    ("no_such_module_xyz:f", "importing no_such_module_xyz failed: ModuleNotFoundError"),
    ("math:nope", "math has no function 'nope'"),
    ("missing.py:f", "missing.py is not a file"),
])
def test_bad_reward_specs_say_what_is_wrong(spec, match):
    with pytest.raises(RpegError, match=match):
        load_reward(spec)


def test_a_function_without_verls_arguments_is_refused_and_a_broken_file_is_an_error(tmp_path):
    (tmp_path / "r.py").write_text("def f(text):\n    return 1.0\n")
    with pytest.raises(RpegError, match="lacks data_source, solution_str, ground_truth, extra_info"):
        load_reward(f"{tmp_path / 'r.py'}:f")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(RpegError, match="importing .*broken.py failed: SyntaxError"):
        load_reward(f"{tmp_path / 'broken.py'}:f")


def test_failing_calls_score_zero_and_are_counted_with_the_first_one():
    def flaky(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "boom":
            raise ValueError("cannot parse")
        if solution_str == "nan":
            return math.nan
        if solution_str == "text":
            return "high"
        return {"score": 0.25, "acc": 1.0}

    examples = [Example(ids=(1,), answer="1")] * 4
    scored = score_texts(flaky, ["ok", "boom", "nan", "text"], examples, rows=[10, 11, 12, 13])
    assert scored.scores == [0.25, 0.0, 0.0, 0.0] and scored.accuracies == [1.0, None, None, None]
    assert scored.failures.count == 3
    assert scored.failures.first == "sequence 11: raised ValueError: cannot parse"

