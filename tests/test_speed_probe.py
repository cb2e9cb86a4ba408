"""This machine's speed against its profile's calibration (runtime/speed_probe.py): the probe, the note rpeg-run
prints when the machine drifted more than TOLERANCE from the speed its profile recorded, and none within it."""

from __future__ import annotations

import pytest

from rpegc.core.cost.hardware import load_hardware
from rpegc.runtime.speed_probe import TOLERANCE, drift_note, probe_seconds

REFERENCE = "rpegc/hardware/cpu-reference.toml"


def test_the_probe_takes_milliseconds_on_one_thread_and_gives_the_threads_back():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    s = probe_seconds(repeats=3)
    assert 0 < s < 5 and torch.get_num_threads() == threads


@pytest.mark.parametrize("ratio, words", [(1.0, None), (1 + 0.9 * TOLERANCE, None), (1 / (1 + 0.9 * TOLERANCE), None),
                                          (1.4, "1.40x slower"), (0.5, "2.00x faster")])
def test_a_drift_beyond_the_tolerance_is_named_either_way(ratio, words):
    note = drift_note(ratio * 0.01, 0.01, "2026-12-05T21:04:36+00:00")
    if words is None:
        assert note is None
    else:
        assert note.startswith(f"this machine ran the speed probe {words} than when its profile was calibrated "
                               "(2026-12-05 21:04): ") and "rpeg-calibrate --machine" in note


def test_the_profile_keeps_the_probe_in_its_meta_and_ignores_what_is_not_a_time(tmp_path):
    text = open(REFERENCE).read()
    assert load_hardware(REFERENCE).speed_probe_s is None  # the shipped profile predates the probe
    for value, want in (("0.0042", 0.0042), ('"fast"', None), ("-1.0", None), ("true", None)):
        path = tmp_path / "p.toml"
        path.write_text(text.replace("[meta]", f"[meta]\nspeed_probe_s = {value}"))
        assert load_hardware(str(path)).speed_probe_s == want


def test_rpeg_run_names_a_machine_that_runs_slower_than_its_profile_was_calibrated(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from rpegc.core.cost.machine import PIN_ENV
    from rpegc.runtime.cli import main as rpeg_run
    from fixtures.programs import compile_example

    profile = tmp_path / "cpu-fast.toml"  # a machine that ran the probe in a microsecond
    profile.write_text(open(REFERENCE).read().replace("[meta]", "[meta]\nspeed_probe_s = 1e-6"))
    monkeypatch.setenv(PIN_ENV, str(profile))
    plan = str(tmp_path / "g.exec.rpeg")
    compile_example("grpo-tiny", plan, steps=1)
    assert rpeg_run([plan, "--backend", "torch", "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "note: this machine ran the speed probe " in out and "x slower than when its profile was calibrated" in out


def test_the_calibration_times_the_probe_in_a_fresh_process():
    pytest.importorskip("torch")
    from rpegc.runtime.speed_probe import fresh_probe_seconds

    s = fresh_probe_seconds(runs=1)
    assert s is not None and 0 < s < 5
