"""The memory check before launch: the cost model's per-device estimate against each
worker's share of the host (CPU) or its GPU; a plan that does not fit is refused with one line naming the
device, the bytes and the largest vertices, before any worker starts; --no-memory-check overrides."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("psutil")

from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.runtime.cli import main as rpeg_run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.controller import memory_check  # noqa: E402
from rpegc.runtime.backends.torch.controller.memory_check import (DeviceNeed, Share, check_memory,  # noqa: E402
                                                                   host_capacity, plan_memory, predicted_peaks,
                                                                   refusal, worst)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
UNANNOTATED = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard"


def lowered(tmp_path_factory, example, pipeline=LOWER):
    out = str(tmp_path_factory.mktemp("plans") / f"{example}.exec.rpeg")
    assert rpegc_main([os.path.join(ROOT, "examples", f"{example}.rpeg"), "-p", pipeline, "-o", out]) == 0
    return out


@pytest.fixture(scope="module")
def dpo(tmp_path_factory):
    return lowered(tmp_path_factory, "dpo")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return lowered(tmp_path_factory, "grpo-tiny")


def test_dpo_7b_is_refused_before_any_worker_starts(dpo, tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rpegc.runtime.cli", dpo, "--backend", "torch", "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [x for x in done.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1
    line = errors[0]
    assert line.startswith("rpeg-run: error: device ")
    assert "needs an estimated" in line and "bytes" in line and "RAM among 16 workers" in line
    assert "@train_policy" in line and "--no-memory-check" in line and "more dp/tp/pp" in line
    assert not (run_dir / "workers").exists() or not os.listdir(run_dir / "workers")  # no worker launched


def test_an_unannotated_plan_is_checked_with_the_same_estimate(tmp_path_factory, dpo):
    bare = lowered(tmp_path_factory, "dpo", UNANNOTATED)
    caps = lambda n: ([2.0**30] * n, "a test capacity")  # noqa: E731
    errors = []
    for path in (dpo, bare):
        plan = load_plan(path)
        with pytest.raises(Exception) as err:
            check_memory(plan_memory(plan.program), plan.devices, "gloo", caps)
        errors.append(str(err.value))
    assert errors[0] == errors[1]


def test_the_tiny_plan_fits_this_host(tiny):
    """...and the check returns the per-device peaks the run summary compares measurements with."""
    plan = load_plan(tiny)
    mem = plan_memory(plan.program)
    peaks = check_memory(mem, plan.devices, "gloo")
    assert peaks == predicted_peaks(mem, plan.devices) and set(peaks) == set(plan.devices)
    assert all(p > 0 for p in peaks.values())


def test_the_worst_device_is_the_one_that_overshoots_most():
    needs = [DeviceNeed(0, 0, 3.0, 2.0, "x", ()), DeviceNeed(1, 1, 10.0, 4.0, "x", ()),
             DeviceNeed(2, 2, 1.0, 8.0, "x", ())]
    assert worst(needs).device == 1
    assert worst(needs[2:]) is None


def test_the_refusal_names_device_bytes_and_largest_shares():
    n = DeviceNeed(5, 1, 3 * 2**30, 2**30, "its GPU", (Share("@gen (activations)", 2.0 * 2**30),
                                                         Share("@actor (resident weights)", 2.0**30)))
    line = refusal(n, 1)
    assert line.startswith("device 5 (worker 1) needs an estimated 3.0 GiB (3221225472 bytes) but has 1.0 GiB")
    assert "largest shares: @gen (activations) 2.0 GiB, @actor (resident weights) 1.0 GiB" in line


def test_host_capacity_divides_the_ram_among_the_workers():
    caps, where = host_capacity(4, total=8 * 2**30)
    assert caps == [2.0 * 2**30] * 4 and "among 4 workers" in where


def test_no_memory_check_overrides_the_refusal(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory_check, "host_capacity", lambda n: ([1.0] * n, "a 1-byte test capacity"))
    assert rpeg_run([tiny, "--backend", "torch", "--tp-impl", "torch", "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "rpeg-run: error: device " in err and " MiB (" in err and "a 1-byte test capacity" in err
    assert rpeg_run([tiny, "--backend", "torch", "--tp-impl", "torch", "--steps", "1", "--no-memory-check"]) == 0
    assert "verification: OK" in capsys.readouterr().out


def test_no_memory_check_is_a_torch_option(tiny, capsys):
    assert rpeg_run([tiny, "--no-memory-check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-memory-check" in err and "to the torch backend only" in err
