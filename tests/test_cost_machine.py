"""`hardware = "cpu"` is the profile of the machine the tool runs on (rpegc/core/cost/machine.py): cached per
machine key in the user's cache directory, calibrated on first use by `rpeg-calibrate --machine` in a child
process, pinned to another profile by $RPEGC_CPU_PROFILE (the suite pins `cpu-reference`, tests/conftest.py)."""

import re
import subprocess

import pytest

from rpegc.core.cost import machine
from rpegc.core.cost.hardware import PROFILE_DIR, load_hardware, profile_names
from rpegc.core.ir.errors import RpegError


@pytest.fixture
def this_machine(tmp_path, monkeypatch):
    """`cpu` unpinned, with an empty cache of its own."""
    monkeypatch.delenv(machine.PIN_ENV, raising=False)
    monkeypatch.setenv(machine.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "hardware" / f"cpu-{machine.machine_key()}.toml"


def test_the_pinned_reference_is_another_machines_profile():
    hw = load_hardware("cpu")
    assert hw.name == "cpu-reference" and "cpu" in profile_names() and "cpu-reference" in profile_names()
    assert hw.provenance().startswith("another machine's profile (vm, calibrated 2026-12-01; ")


def test_a_cached_profile_is_used_without_calibrating(this_machine, monkeypatch):
    this_machine.parent.mkdir(parents=True)
    text = (PROFILE_DIR / "cpu-reference.toml").read_text()
    this_machine.write_text(re.sub(r'host = "vm"', f'host = "here"\nmachine_key = "{machine.machine_key()}"', text))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("calibrated although a profile is cached"))
    hw = load_hardware("cpu")
    assert hw.source == str(this_machine) and hw.provenance().startswith("this machine's profile (")


def test_the_first_use_calibrates_this_machine_and_caches_it(this_machine, monkeypatch, capsys):
    monkeypatch.setattr(machine, "CALIBRATE", machine.CALIBRATE + ("--quick",))  # the smoke sweep: seconds
    hw = load_hardware("cpu")
    assert this_machine.is_file() and hw.source == str(this_machine) and hw.name == "cpu"
    assert hw.provenance().startswith("this machine's profile (") and hw.F_peak > 0
    assert hw.speed_probe_s is not None and hw.speed_probe_s > 0  # what rpeg-run compares its own probe with
    table = hw.attention  # the attention kernel timed as the backend calls it, at the smoke sweep's 4 lengths
    assert table is not None and table.head_dim == 16 and len(table.forward) == 4
    assert all(0 < t < 1e-4 for t in table.forward + table.decode) and all(t >= 0 for t in table.backward)
    from rpegc.tools.measure import device_count

    two = min(8, device_count("gloo")) >= 2  # forwards alone against every worker busy: two workers or more
    assert ("co_run = " in this_machine.read_text()) == two and hw.overhead.co_run >= 0
    # the speed witness a run's workers and pool processes end their work with, and the speeds they are held against
    assert 0 < hw.overhead.witness < 0.1 and 0 < hw.verify_witness < 0.1
    assert "calibrating this machine's CPU profile" in capsys.readouterr().err
    assert load_hardware("cpu") == hw  # the second use reads the cache


def test_a_failed_calibration_is_a_one_line_error(this_machine, monkeypatch):
    monkeypatch.setattr(machine, "CALIBRATE", ("-c", "print('no torch here'); raise SystemExit(3)"))
    with pytest.raises(RpegError, match=r"could not calibrate this machine's CPU profile \(no torch here\); run "
                                        r"`rpeg-calibrate --machine` to see why, or set RPEGC_CPU_PROFILE="):
        load_hardware("cpu")
    assert not this_machine.exists()


def test_a_pin_names_a_profile_and_a_wrong_pin_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv(machine.PIN_ENV, "gh200")
    assert load_hardware("cpu").name == "gh200"
    monkeypatch.setenv(machine.PIN_ENV, "cpu-refrence")
    with pytest.raises(RpegError, match=r"unknown hardware profile 'cpu-refrence'.* \(in \$RPEGC_CPU_PROFILE\)"):
        load_hardware("cpu")


def test_the_key_follows_what_the_kernels_speed_depends_on():
    ident = machine.machine_identity()
    assert set(ident) == {"cpu", "cores", "machine", "flags", "torch", "python", "campaign"}
    assert machine.machine_key(ident) == machine.machine_key()
    assert machine.machine_key({**ident, "campaign": "1"}) != machine.machine_key()  # a profile lacking keys
    assert machine.machine_key({**ident, "torch": "9.9"}) != machine.machine_key()
    assert machine.machine_key({**ident, "cores": "64"}) != machine.machine_key()


def test_calibrate_machine_refuses_an_output_path(capsys):
    from rpegc.tools.calibrate import main

    assert main(["--machine", "-o", "x.toml", "--quiet"]) == 1
    assert "--machine writes this machine's cached profile; drop -o" in capsys.readouterr().err
