"""What rpeg-calibrate measures of a verifier on this host (tools/verifier_timing.py): the `[host]` table a CPU
profile gets, and `--verifier SPEC --data FILE` for a user's function. No test asserts a time: only that the values
are positive, load as a profile's, and that bad input is a one-line error."""

import json
import tomllib

import pytest

from rpegc.core.cost.hardware import Hardware, load_hardware
from rpegc.tools.calibrate import main as calibrate
from rpegc.runtime.report import host_cores
from rpegc.tools.verifier_timing import BusyScorers, HostTable, host_text, samples


def test_the_host_table_loads_into_a_profile(tmp_path):
    base = (load_hardware("cpu-reference").source)
    text = open(base).read().split("\n# The host")[0].split("\n[host]")[0] + host_text(tmp_path)
    hw = Hardware.from_dict(tomllib.loads(text), source="t.toml")
    assert hw.host_cores >= 1 and hw.verify_call >= 0
    assert hw.checkpoint_rate > 0 and hw.checkpoint_file >= 0
    assert hw.checkpoint_keep_rate > 0 and hw.checkpoint_keep_tensor >= 0  # the copies a stale model keeps
    # the disk the writers share is measured, or the table says why not
    assert (hw.checkpoint_disk_rate is not None) != ("# checkpoint_disk_rate left out" in text)
    assert list(tmp_path.iterdir()) == []  # the write probe's scratch directory is gone
    assert {fn for fn, _ in hw.verify_s} == {"math", "exact_match", "rule"} and all(s > 0 for _, s in hw.verify_s)
    assert "median of 12 batches of 64 arithmetic answers" in text  # one window of a machine profile's built-ins


def test_a_machine_profile_keeps_the_median_window_of_the_built_ins(tmp_path):
    """`rpeg-calibrate --machine` times the built-ins in windows across the calibration and keeps per function the
    median of the windows' medians, naming every window's (a slow minute that covers one window prices nothing)."""
    scorers = BusyScorers(("math", "exact_match"), *samples(2), cores=1, repeats=12)
    scorers.windows = [{"math": 9e-4, "exact_match": 2e-6}, {"math": 6e-4, "exact_match": 3e-6},
                       {"math": 7e-4, "exact_match": 1e-6}]
    scorers.witnesses = [{"math": 3e-4, "exact_match": 1e-4}, {"math": 2e-4, "exact_match": 1e-4},
                         {"math": 2.5e-4, "exact_match": 2e-4}]
    assert scorers.typical() == {"math": 7e-4, "exact_match": 2e-6}  # the witnesses do not move the windows
    table = HostTable(2, 3e-4, 20, (), 1e-7, quick=False).text(scorers)
    assert "\nmath = 0.0007    # s per response on one core while every core scores, the median of 3 windows' " \
           "medians (0.9, 0.6, 0.7 ms) across the calibration, each of 12 batches" in table
    assert "; the speed witness after the windows' batches 0.3, 0.2, 0.25 ms" in table
    assert "\nverify_witness = 0.00025 " in table  # math's windows' median witness
    assert "\nexact_match = 2e-06 " in table
    base = open(load_hardware("cpu-reference").source).read().split("\n# The host")[0].split("\n[host]")[0]
    hw = Hardware.from_dict(tomllib.loads(base + table), source="t.toml")
    assert dict(hw.verify_s)["math"] == 7e-4 and hw.verify_witness == 2.5e-4


@pytest.mark.skipif(host_cores() < 2, reason="with one core the verifier is measured in this process")
def test_the_built_ins_windows_are_taken_by_one_set_of_processes():
    """The scoring processes start once and wait, idle, between windows (a window is ~1.5 s less than a start)."""
    with BusyScorers(("exact_match",), *samples(4), repeats=2) as scorers:
        first = scorers.window()
        pids = scorers.live_pids
        assert len(pids) == host_cores()
        second = scorers.window()
        assert scorers.live_pids == pids and scorers.windows == [first, second]
        seen = [w["exact_match"] for w in scorers.witnesses]
        assert len(seen) == 2 and min(seen) > 0  # the speed witness after each window's batches
        assert scorers.typical()["exact_match"] == (first["exact_match"] + second["exact_match"]) / 2 > 0
        assert scorers.typical_witness("exact_match") == sum(seen) / 2
    assert scorers.live_pids == ()  # the processes end with the measurement


def test_the_samples_are_half_right_for_the_math_verifier():
    from rpegc.runtime.backends.torch.rl.rewards import math_answer

    texts, examples = samples(8)
    scores = [math_answer("a", t, e.answer)["score"] for t, e in zip(texts, examples)]
    assert scores == [1.0, 0.0] * 4


def test_calibrate_measures_a_function_over_a_dataset(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    assert calibrate(["--verifier", "exact_match", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "exact_match: " in out and 'rpeg.verifier @v {fn = "exact_match", per_response = ' in out
    assert calibrate(["--verifier", "exact_match"]) == 1
    assert "--verifier needs --data FILE" in capsys.readouterr().err
    assert calibrate(["--verifier", "nope_fn", "--data", str(data)]) == 1
    assert "unknown reward 'nope_fn'" in capsys.readouterr().err


@pytest.mark.skipif(host_cores() < 2,
                    reason="with one core the verifier is measured in this process, which it would end")
def test_a_verifier_that_kills_its_process_is_a_one_line_error(tmp_path, capsys):
    """The measurement runs in a process per core at once (`busy_per_response`); one that ends without a time is
    named at once, not waited for."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    plugin = tmp_path / "dies.py"
    plugin.write_text("import os\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    os._exit(3)\n")
    assert calibrate(["--verifier", f"{plugin}:compute_score", "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert "cores at once failed: a process ended without a time" in err and "Traceback" not in err


@pytest.mark.skipif(host_cores() < 2, reason="with one core the verifier is measured in this process")
def test_a_verifier_that_kills_one_of_the_processes_is_a_one_line_error_not_a_hang(tmp_path, capsys):
    """The first process to call it dies, the other waits for it at the barrier before measuring: the measurement
    stops them both and names the function (it waited for the live one for ever before)."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    plugin = tmp_path / "dies_once.py"
    plugin.write_text("import os\n\nMARK = " + repr(str(tmp_path / "died")) + "\n\n"
                      "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    try:\n        os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))\n"
                      "    except FileExistsError:\n        return 1.0\n    os._exit(3)\n")
    assert calibrate(["--verifier", f"{plugin}:compute_score", "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert f"measuring the verifier '{plugin}:compute_score'" in err and "a process ended without a time" in err
    assert "Traceback" not in err
