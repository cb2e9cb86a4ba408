"""tools/gpu_smoke.py's dry run (`--device cpu`): every step of the GPU check runs on one CPU worker at
tiny sizes and writes what the GPU run writes. The GPU run itself needs a CUDA device (bench/gpu/)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rpegc.core.cost.hardware import load_hardware
from rpegc.tools.gpu_smoke import calibration_step, main, validation_step


def test_dry_run_writes_the_profile_and_the_validation(tmp_path: Path, capsys):
    out = tmp_path / "gpu"
    assert main(["--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gpu_smoke: OK" in printed and "step 1: trained weights differ by at most 0" in printed
    hw = load_hardware(str(out / "calibrated.toml"))
    h200 = load_hardware("h200")
    assert hw.F_peak > 0 and hw.coll("intra_node") == tuple(pytest.approx(x) for x in h200.coll("intra_node"))
    raw = {r["kind"] for r in csv.DictReader((out / "calibration-raw.csv").read_text().splitlines())}
    assert raw == {"copy", "forward", "non_gemm"}  # one device: no link measured
    rows = list(csv.DictReader((out / "validation" / "validation.csv").read_text().splitlines()))
    assert {r["role"] for r in rows} == {"generation", "inference", "training"}
    assert {r["dtype"] for r in rows} == {"bf16"}
    assert "each configuration alone" in (out / "validation" / "report.md").read_text()
    assert (out / "calibration.log").exists() and (out / "validation.log").exists()


def test_a_non_empty_out_directory_is_refused(tmp_path: Path, capsys):
    (tmp_path / "keep.txt").write_text("a user's file")
    assert main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    kept = tmp_path / "keep.txt"
    assert "not an empty directory" in capsys.readouterr().out and kept.read_text() == "a user's file"
    assert main(["--device", "cpu", "--out", str(kept)]) == 2  # a file: refused, not replaced
    assert "not an empty directory" in capsys.readouterr().out and kept.read_text() == "a user's file"


def test_gpu_steps_run_on_nccl_with_the_full_sweeps(tmp_path: Path):
    calibrate = calibration_step(tmp_path, dry_run=False, profile="h200")
    validate = validation_step(tmp_path, dry_run=False, hardware="h200")
    assert "nccl" in calibrate.args and "nccl" in validate.args and "--quick" not in calibrate.args + validate.args
    assert validate.args[validate.args.index("--grid") + 1] == "gpu" and "--isolated" in validate.args
    assert calibrate.limit_s + validate.limit_s <= 8 * 60 - 60  # the check fits one 8-minute call
