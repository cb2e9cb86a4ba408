"""Reward functions (runtime/backends/torch/rl/rewards.py): the built-ins, plugins named as
module:function, file.py:function or an entry point, verl's signature checked, and failing calls counted,
reported and scored 0."""

from __future__ import annotations

import math
import re

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.rl.datasets import Example
from rpegc.runtime.backends.torch.rl.rewards import (ENTRY_POINT_GROUP, exact_match, load_reward, math_answer, probe_reward,
                                                 score_texts)
from fixtures.plugins import install_plugin


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
    install_plugin(tmp_path, "plugin_rewards", "def score(**kwargs):\n    return 0.5\n", ENTRY_POINT_GROUP,
                   {"half": "plugin_rewards:score"})
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



@pytest.mark.parametrize("result, why", [
    (10 ** 400, "returned 1000"),  # an int beyond any float: float() raises OverflowError
    (1e300, "beyond float32's range"),  # finite in Python, inf in the float32 arithmetic of the scores
    (-1e39, "beyond float32's range"),
    ("0.75", "returned '0.75', not a number"),  # a string is not a score, whatever it spells
    ({"score": "1"}, "returned '1', not a number"),
    (b"1", "returned b'1', not a number"),
])
def test_a_score_that_is_no_float32_number_is_a_counted_failure(result, why):
    """What the function returns is scored as a float32; anything else scores 0 and is counted, never raised."""
    scored = score_texts(lambda **_: result, ["x"], [Example(ids=(1,), answer="1")], rows=[4])
    assert scored.scores == [0.0] and scored.failures.count == 1
    assert scored.failures.first.startswith("sequence 4: ") and why in scored.failures.first, scored.failures.first


def test_scores_at_float32s_limits_and_numpy_scalars_are_kept():
    np = pytest.importorskip("numpy")
    for value in (3.0e38, -3.0e38, np.float64(0.5), np.int64(2), True):
        scored = score_texts(lambda **_: value, ["x"], [Example(ids=(1,), answer="1")], rows=[0])
        assert scored.failures.count == 0 and scored.scores == [float(value)]


@pytest.mark.parametrize("how, body, match", [
    ("sys_exit", "import sys\nsys.exit(4)\n", "it called sys.exit(4)"),
    ("os_exit", "import os\nos._exit(7)\n", "ended the process with exit status 7"),
])
def test_a_module_that_ends_its_process_at_import_is_a_located_error(tmp_path, how, body, match):
    """sys.exit or os._exit in a reward module's import ended rpeg-run with status 4 or 7 and no message."""
    path = tmp_path / f"exits_{how}.py"
    path.write_text(body + "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    spec = f"{path}:compute_score"
    with pytest.raises(RpegError, match=re.escape(match)):
        probe_reward(spec)
        load_reward(spec)


def test_a_module_that_never_finishes_importing_is_refused_after_the_timeout(tmp_path, monkeypatch):
    from rpegc.runtime.backends.torch.rl import rewards

    monkeypatch.setattr(rewards, "LOAD_TIMEOUT_S", 2)
    path = tmp_path / "sleeps.py"
    path.write_text("import time\ntime.sleep(600)\n")
    with pytest.raises(RpegError, match="did not finish within 2 s"):
        probe_reward(f"{path}:compute_score")


def test_the_probe_leaves_other_failures_to_load_reward_and_passes_a_good_module(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    probe_reward(f"{good}:compute_score")
    probe_reward(f"{good}:missing")  # load_reward says what is wrong with it, in this process
    with pytest.raises(RpegError, match="has no function 'missing'"):
        load_reward(f"{good}:missing")
