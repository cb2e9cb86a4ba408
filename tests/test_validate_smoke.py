"""rpeg-validate end to end on a tiny grid: real operators of the torch backend run in a worker process,
every configuration gets positive warm timings, and the CSV, plot and report are written. No accuracy
is asserted (the machine is shared); bench/validation/ reports the accuracy."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

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
             Case("training", "policy", "tiny", tiny, 16, 1, 8, 8, 2, 1, 1, 1),
             Case("generation", "policy", "tiny", tiny, 16, 1, 8, 8, 2, 1, 1, 1)]
    rows = make_rows(cases, [((0.01, 0.012), None), ((0.05, 0.04), None), ((0.2, 0.3), None)],
                     load_hardware("gh200"), CostOptions(), 8)
    saved = tmp_path / "validation.csv"
    write_csv(rows, saved)
    out = tmp_path / "val"
    hw = Path(__file__).resolve().parent.parent / "rpegc" / "hardware" / "gh200.toml"
    assert main(["--hardware", str(hw), "--from", str(saved), "--out", str(out),
                 "--cost-option", "dp_scalar_allreduces=4"]) == 0
    printed = capsys.readouterr().out
    assert "Cost-model validation" in printed and "dp_scalar_allreduces = 4" in printed
    again = list(csv.DictReader((out / "validation-repredicted.csv").read_text().splitlines()))
    assert [r["case"] for r in again] == [c.id for c in cases] and tuple(again[0]) == CSV_COLUMNS
    assert float(again[1]["predicted_s"]) > float(again[1]["predicted_default_s"])  # 4 scalar AllReduces more
    assert (out / "validation-repredicted.png").stat().st_size > 0 and (out / "report-repredicted.md").exists()


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys):
    assert main(["--hardware", str(tmp_path / "missing.toml"), "--quick"]) == 1
    assert "rpeg-validate: error: cannot read hardware profile" in capsys.readouterr().err
    hw = Path(__file__).resolve().parent.parent / "rpegc" / "hardware" / "gh200.toml"
    assert main(["--hardware", str(hw), "--cost-option", "nonsense", "--quick"]) == 1
    assert "NAME=VALUE" in capsys.readouterr().err


def _training_runs(ctx, case):
    """Three runs of a training operator through rpeg-validate's runner: the weights labels it reads and writes,
    what the worker then holds, and which version its training state holds."""
    from rpegc.tools.validate import _OpRuns, _backend_worker, _init_groups, _layout

    layout = _layout(case)
    _init_groups(ctx, [layout])
    op = _OpRuns(ctx, _backend_worker(ctx, case, 0, "torch"), case, layout, 0)
    seen = []
    for _ in range(3):
        seen.append((op.cmd.weights, op.cmd.output, op.cmd.version_out))
        op.run()
    held = sorted(k for k, e in op.worker.holdings.entries.items() if e.kind == "weights")
    return seen, held, op.worker.holdings.training[("actor", layout)].pm.loaded


def test_repeated_training_runs_train_the_version_the_last_one_published():
    """As a run's consecutive steps: each run reads the version the previous one published, the one it read is
    released, and the training state is never reloaded (re-running one command re-drew version 0 each time)."""
    from rpegc.tools.measure import WorkerPool

    tiny = VALIDATION_ARCHS["tiny"]
    case = Case("training", "policy", "tiny", tiny, 8, 1, 4, 4, 1, 1, 1, 1)
    with WorkerPool(1) as pool:
        seen, held, loaded = pool.run(_training_runs, case)[0]
    base = seen[0][0]
    assert seen == [(base, f"{base}@1", 1), (f"{base}@1", f"{base}@2", 2), (f"{base}@2", f"{base}@3", 3)]
    assert held == [f"{base}@3"] and loaded == ("actor", 3)


def test_cli_refuses_nccl_without_cuda_and_a_csv_with_an_unknown_dtype(tmp_path: Path, capsys):
    import torch

    if not torch.cuda.is_available():
        assert main(["--hardware", "h200", "--backend", "nccl", "--quick", "--out", str(tmp_path / "v")]) == 1
        assert "--backend nccl needs CUDA devices" in capsys.readouterr().err
    from rpegc.core.cost.hardware import load_hardware
    from rpegc.core.cost.options import CostOptions
    from rpegc.tools.validate import make_rows, write_csv

    tiny = VALIDATION_ARCHS["tiny"]
    saved = tmp_path / "v.csv"
    write_csv(make_rows([Case("inference", "reference", "tiny", tiny, 16, 1, 8, 8, 1, 1, 1, 1)], [((0.01,), None)],
                        load_hardware("h200"), CostOptions(), 8), saved)
    saved.write_text(saved.read_text().replace(",fp32,", ",fp16,"))
    assert main(["--hardware", "h200", "--from", str(saved), "--out", str(tmp_path / "r")]) == 1
    assert "line 2: malformed row (dtype 'fp16' is not fp32 or bf16)" in capsys.readouterr().err


def test_a_per_round_hook_needs_rounds_over_the_grid():
    """`after_round` times something beside every round of the grid; an isolated run has no rounds, so it refuses the
    hook instead of dropping it."""
    with pytest.raises(ValueError, match="after_round needs rounds"):
        measure([], 1, repeats=1, isolated=True, after_round=lambda pool: None)


def test_a_cpu_worker_of_the_grid_runs_in_a_run_workers_condition():
    """Its heap meter sampling as a run's worker's does, on a thread left free of its core, and the interpreter's
    switch interval a worker sets (validate._run_condition); a CUDA worker keeps its own."""
    import sys
    from types import SimpleNamespace

    from rpegc.runtime.backends.torch.worker.host_memory import RUN_SAMPLE_S
    from rpegc.runtime.backends.torch.worker.process import SWITCH_INTERVAL_S
    from rpegc.tools.validate import _run_condition

    before = sys.getswitchinterval()
    repinned = []
    cpu = SimpleNamespace(is_cuda=False, state={}, repin=lambda: repinned.append(True))
    try:
        _run_condition(cpu)
        meter = cpu.state["meter"]
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S) and meter.period_s == RUN_SAMPLE_S
        assert repinned == [True]
        meter.stop()
    finally:
        sys.setswitchinterval(before)
    gpu = SimpleNamespace(is_cuda=True, state={}, repin=lambda: repinned.append(True))
    _run_condition(gpu)
    assert gpu.state == {} and sys.getswitchinterval() == pytest.approx(before)
