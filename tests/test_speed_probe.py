"""This machine's speed against its profile's calibration (runtime/speed_probe.py): the probe, the note rpeg-run
prints when the machine drifted more than TOLERANCE from the speed its profile recorded, and none within it."""

from __future__ import annotations

import pytest

from rpegc.core.cost.hardware import load_hardware
from rpegc.runtime.speed_probe import (TOLERANCE, drift_note, prepare_witness, probe_seconds, spaced_probe_seconds,
                                      witness_seconds)

REFERENCE = "rpegc/hardware/cpu-reference.toml"


def test_the_probe_takes_milliseconds_on_one_thread_and_gives_the_threads_back():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    s = probe_seconds(repeats=3)
    assert 0 < s < 5 and torch.get_num_threads() == threads


def test_the_witness_takes_a_fraction_of_a_millisecond_on_one_thread_and_gives_the_threads_back():
    """The speed witness (what a CPU worker ends every operator with) takes a fraction of a millisecond and leaves
    torch's threads as they were."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = [witness_seconds() for _ in range(5)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert all(0 < s < 0.5 for s in seen)


def test_a_process_prepared_for_the_witness_runs_torch_on_one_thread():
    """A verifier pool's process (and the calibration's scorers) import torch and go to one thread before their first
    share is timed (verifier_pool._load)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        prepare_witness()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_rpeg_run_keeps_the_fastest_of_three_spaced_probes_as_the_calibration_does():
    """A lightly loaded core of this VM runs ~1.5x slower about a third of the time: one slow probe is not a drift."""
    times = iter([0.0066, 0.0044, 0.0065])
    assert spaced_probe_seconds(gap_s=0.0, probe=lambda: next(times)) == 0.0044
    assert spaced_probe_seconds(runs=1, gap_s=0.0, probe=lambda: 0.005) == 0.005


@pytest.mark.parametrize("ratios, words", [((1.0, 1.0), None), ((1 + 0.9 * TOLERANCE,) * 2, None),
                                           ((1 / (1 + 0.9 * TOLERANCE),) * 2, None), ((1.4, 1.6), "1.40x slower"),
                                           ((0.5, 0.4), "2.00x faster"), ((1.6, 1.0), None), ((1.6, 0.5), None)])
def test_a_drift_is_named_only_when_the_probes_before_and_after_the_run_agree(ratios, words):
    """One probe is a 50 ms sample of a VM whose speed moves within seconds: both sides of the run must be off the
    same way, and the note names the smaller drift."""
    note = drift_note([r * 0.01 for r in ratios], 0.01, "2026-12-05T21:04:36+00:00")
    if words is None:
        assert note is None
    else:
        assert note.startswith(f"this machine ran the speed probe at least {words} before and after the run than when "
                               "its profile was calibrated (2026-12-05 21:04): ") and "rpeg-calibrate --machine" in note


def test_the_profile_keeps_the_probe_in_its_meta_and_ignores_what_is_not_a_time(tmp_path):
    text = open(REFERENCE).read()
    assert load_hardware(REFERENCE).speed_probe_s is None  # the shipped profile predates the probe
    for value, want in (("0.0042", 0.0042), ('"fast"', None), ("-1.0", None), ("true", None)):
        path = tmp_path / "p.toml"
        path.write_text(text.replace("[meta]", f"[meta]\nspeed_probe_s = {value}"))
        assert load_hardware(str(path)).speed_probe_s == want


def test_rpeg_run_names_a_machine_that_runs_slower_than_its_profile_was_calibrated(tmp_path, monkeypatch):
    """rpeg-run's check (`runtime.cli._priced_profile` with a probe, then the probe before and after the run, the note printed
    after the profile line): a wall-clock run of a plan whose profile recorded a probe of a microsecond gets the note;
    a simulated clock or a profile without a probe is not probed."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from rpegc.core.cost.machine import PIN_ENV
    from rpegc.runtime.cli import _priced_profile, _with_probe
    from rpegc.runtime.plan import load_plan
    from fixtures.programs import compile_example

    path = str(tmp_path / "g.exec.rpeg")
    compile_example("grpo-tiny", path, steps=1)
    plan = load_plan(path)
    wall, sim = SimpleNamespace(clock="wall"), SimpleNamespace(clock="sim")

    def _probed_profile(plan, backend):
        return _with_probe(_priced_profile(plan, backend))

    assert _probed_profile(plan, wall) is None  # the pinned cpu-reference profile predates the probe
    profile = tmp_path / "cpu-fast.toml"  # a machine that ran the probe in a microsecond
    profile.write_text(open(REFERENCE).read().replace("[meta]", "[meta]\nspeed_probe_s = 1e-6"))
    monkeypatch.setenv(PIN_ENV, str(profile))
    hw = _probed_profile(plan, wall)
    note = drift_note((probe_seconds(), probe_seconds()), hw.speed_probe_s, hw.calibrated)
    assert note.startswith("this machine ran the speed probe at least ") and "x slower before and after" in note
    assert _probed_profile(plan, sim) is None


def test_the_calibration_times_the_probe_in_a_fresh_process():
    pytest.importorskip("torch")
    from rpegc.runtime.speed_probe import fresh_probe_seconds

    s = fresh_probe_seconds(runs=1)
    assert s is not None and 0 < s < 5


def test_a_measurement_at_a_slow_moment_is_taken_again():
    """The probes before and after a measurement both ran more than TOLERANCE slower than the fastest probe seen: it
    is retaken, and the try whose slower probe was fastest is kept (at most RETRIES more); one slow probe is not
    enough. Every probe can lower the reference, which the profile then records."""
    from rpegc.runtime.speed_probe import RETRIES, SpeedReference, at_usual_speed

    def run(probes: list[float], reference_s: float = 0.004) -> tuple[int, int, float]:
        seq, calls, ref = iter(probes), [], SpeedReference(reference_s)
        kept = at_usual_speed(lambda: calls.append(len(calls)) or len(calls), ref, probe=lambda: next(seq))
        return kept, len(calls), ref.seconds

    assert run([0.0041, 0.0044]) == (1, 1, 0.004)  # within 15 %: measured once
    assert run([0.0041, 0.0070]) == (1, 1, 0.004)  # one slow probe: measured once
    assert run([0.0070, 0.0060, 0.0042, 0.0043]) == (2, 2, 0.004)  # slow before and after: the second is kept
    slow = [0.0070, 0.0080, 0.0065, 0.0050]  # slow every time: the try with the fastest slow probe
    assert run(slow) == (2, 1 + RETRIES, 0.004)
    assert run([0.0070, 0.0050, 0.0075, 0.0080]) == (1, 1 + RETRIES, 0.004)  # ... which may be the first
    # a reference taken at a slow moment (7.2 ms) is lowered by a faster probe, and the next part is held against it
    ref = SpeedReference(0.0072)
    seq = iter([0.0040, 0.0060, 0.0060, 0.0061, 0.0041, 0.0043])
    assert at_usual_speed(lambda: 1, ref, probe=lambda: next(seq)) == 1 and ref.seconds == 0.0040
    assert at_usual_speed(lambda: 2, ref, probe=lambda: next(seq)) == 2 and next(seq, None) is None  # retaken
