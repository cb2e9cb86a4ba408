"""rpeg-validate end to end on a tiny grid: real operators of the torch backend run in a worker process,
every configuration gets positive warm timings, and the CSV, plot and report are written. No accuracy
is asserted (the machine is shared); bench/validation/ reports the accuracy."""

from __future__ import annotations

import csv
from pathlib import Path

from rpegc.tools.validate import CSV_COLUMNS, VALIDATION_ARCHS, Case, main, measure


def test_measure_runs_each_role_through_the_backend_worker():
    tiny = VALIDATION_ARCHS["tiny"]
    cases = [Case(role, kind, "tiny", tiny, 8, 1, 4, 4, 1, 1, 1, 1)
             for role, kind in (("generation", "policy"), ("inference", "reference"), ("inference", "critic"),
                                ("inference", "reward"), ("training", "policy"), ("training", "critic"))]
    results = measure(cases, 1, repeats=2, warmup=1, quiet=True)
    assert len(results) == len(cases)
    for samples, peak in results:
        assert len(samples) == 2 and all(s > 0 for s in samples)
        assert peak is None  # CPU workers: no per-device peak


def test_isolated_measurement_goes_on_past_a_failing_configuration(capsys):
    """Each configuration alone on its worker (the CUDA mode): one that fails gets no samples, its error is
    reported, and the next one runs on a fresh pool, in bf16 here (mixed-precision training)."""
    tiny = VALIDATION_ARCHS["tiny"]
    cases = [Case("inference", "no-such-kind", "tiny", tiny, 8, 1, 4, 4, 1, 1, 1, 1),
             Case("training", "policy", "tiny", tiny, 8, 1, 4, 4, 1, 1, 1, 1, dtype="bf16")]
    failed, trained = measure(cases, 1, repeats=2, warmup=1, quiet=True, isolated=True)
    assert failed == ((), None)
    assert len(trained[0]) == 2 and all(s > 0 for s in trained[0])
    assert f"configuration {cases[0].id} failed" in capsys.readouterr().err
    # Alone on a CPU worker, torch's own count of its tensors is measured: at least the training state,
    # bf16 weights and gradients, float32 masters and two moments (2 + 2 + 4 + 8 bytes per parameter).
    from rpegc.core.cost.memory import weight_shard

    assert trained[1] >= 16 * weight_shard(tiny, "policy", 1, 1)


def test_cli_repredicts_saved_measurements(tmp_path: Path, capsys):
    """`--from` re-prices a validation CSV with a profile and cost options; it writes the re-predicted
    CSV, the plot and the report, and prints the report."""
    from rpegc.core.cost.options import CostOptions
    from rpegc.core.cost.hardware import load_hardware
    from rpegc.tools.validate import make_rows, write_csv

    tiny = VALIDATION_ARCHS["tiny"]
    cases = [Case("inference", "reference", "tiny", tiny, 16, 1, 8, 8, 1, 1, 1, 1),
             Case("training", "policy", "tiny", tiny, 16, 1, 8, 8, 1, 2, 1, 2),
             Case("generation", "policy", "tiny", tiny, 16, 1, 8, 8, 2, 1, 1, 1)]
    rows = make_rows(cases, [((0.01, 0.012), None), ((0.05, 0.04), None), ((0.2, 0.3), None)],
                     load_hardware("gh200"), CostOptions(), 8)
    saved = tmp_path / "validation.csv"
    write_csv(rows, saved)
    out = tmp_path / "val"
    hw = Path(__file__).resolve().parent.parent / "rpegc" / "hardware" / "gh200.toml"
    assert main(["--hardware", str(hw), "--from", str(saved), "--out", str(out),
                 "--cost-option", "train_forward_equivalents=3"]) == 0
    printed = capsys.readouterr().out
    assert "Cost-model validation" in printed and "train_forward_equivalents = 3" in printed
    again = list(csv.DictReader((out / "validation-repredicted.csv").read_text().splitlines()))
    assert [r["case"] for r in again] == [c.id for c in cases] and tuple(again[0]) == CSV_COLUMNS
    assert float(again[1]["predicted_s"]) < float(again[1]["predicted_default_s"])  # 3 vs 4 forward-equivalents
    assert (out / "validation-repredicted.png").stat().st_size > 0 and (out / "report-repredicted.md").exists()


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys):
    assert main(["--hardware", str(tmp_path / "missing.toml"), "--quick"]) == 1
    assert "rpeg-validate: error: cannot read hardware profile" in capsys.readouterr().err
    hw = Path(__file__).resolve().parent.parent / "rpegc" / "hardware" / "gh200.toml"
    assert main(["--hardware", str(hw), "--cost-option", "nonsense", "--quick"]) == 1
    assert "NAME=VALUE" in capsys.readouterr().err
