"""rpeg-validate's pure parts: the accuracy metrics on hand-made data, the configuration grid obeys the
plan rules, the CSV schema round-trips, and the report/plot come out of given measurements."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.cost.optime import op_time
from rpegc.core.ir.program import Arch, Workload
from rpegc.tools.validate import (CSV_COLUMNS, VALIDATION_ARCHS, Case, build_grid, legal_strategies, make_rows,
                                  mape, pairs_ordered, plot, ranks, read_csv, report, scores, spearman, write_csv)


def test_mape_and_bias_on_hand_made_data():
    assert mape([110, 45, 300], [100, 50, 300]) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    s = scores([1.2, 0.5, 2.0, 4.0], [1.0, 1.0, 2.0, 5.0])
    assert s.n == 4 and s.mape == pytest.approx((0.2 + 0.5 + 0 + 0.2) / 4)
    assert s.within_band == pytest.approx(0.75)  # only the -50% point is outside +-25%
    assert s.bias == pytest.approx(np.median([0.2, -0.5, 0.0, -0.2]))
    with pytest.raises(RpegError):
        mape([1.0, 2.0], [1.0])


def test_ranks_average_ties():
    assert ranks([10, 30, 20, 30]).tolist() == [1.0, 3.5, 2.0, 3.5]


def test_spearman_on_hand_made_data():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = rank differences (0, 0, 1, -1): rho = 1 - 6 * 2 / (4 * 15) = 0.8 (no ties)
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_pairs_ordered_on_hand_made_data():
    # pairs (0,1) and (0,2) keep their order, (1,2) is swapped
    assert pairs_ordered([1, 2, 3], [1, 3, 2]) == pytest.approx(2 / 3)
    # a measured tie is skipped; a predicted tie of a measured difference counts as wrong
    assert pairs_ordered([1, 1, 3], [1, 2, 2]) == pytest.approx(1 / 2)


def _legal(arch: Arch, seqs: int, s) -> bool:
    dp, pp, tp, mb = s
    ok = arch.heads % tp == 0 and arch.kv_heads % tp == 0 and arch.ffn % tp == 0 and seqs % dp == 0
    if pp == 1:
        return ok and mb == 1
    return (ok and pp % 2 == 0 and arch.layers % pp == 0 and mb >= pp and (seqs // dp) % mb == 0
            and seqs // (dp * mb) >= 8)


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_strategies_obey_the_plan_rules(devices):
    for arch in VALIDATION_ARCHS.values():
        for seqs in (16, 32):
            strategies = legal_strategies(arch, seqs, devices)
            assert strategies and len(set(strategies)) == len(strategies)
            for s in strategies:
                assert _legal(arch, seqs, s), s
                assert s[0] * s[1] * s[2] in (1, 2, 4, 8) and s[0] * s[1] * s[2] <= devices


def test_strategies_on_two_devices():
    tiny = VALIDATION_ARCHS["tiny"]
    assert legal_strategies(tiny, 16, 2) == [(1, 1, 1, 1), (1, 1, 2, 1), (1, 2, 1, 2), (2, 1, 1, 1)]
    assert (1, 2, 1, 4) in legal_strategies(tiny, 32, 2)


def test_grid_has_enough_configurations_of_every_role():
    grid = build_grid(2)
    assert len(grid) >= 40 and len({c.id for c in grid}) == len(grid)
    assert {c.role for c in grid} == {"generation", "inference", "training"}
    assert {(c.dp > 1, c.pp > 1, c.tp > 1) for c in grid} >= {(False, False, False), (True, False, False),
                                                               (False, True, False), (False, False, True)}
    assert all(c.devices <= 2 for c in grid)
    assert all(c.devices <= 1 for c in build_grid(1, quick=True))


def _rows():
    hw = load_hardware("gh200")
    tiny = VALIDATION_ARCHS["tiny"]
    cases = [Case("inference", "reference", "tiny", tiny, 16, 1, 8, 8, 1, 1, 1, 1),
             Case("training", "policy", "tiny", tiny, 16, 1, 8, 8, 2, 1, 1, 1),
             Case("generation", "policy", "tiny", tiny, 16, 1, 8, 8, 1, 2, 1, 2, dtype="bf16")]
    measured = [((0.010, 0.012, 0.011), None), ((0.050, 0.040, 0.045), None), ((0.2, 0.3, 0.25), 1.5e6)]
    return cases, measured, make_rows(cases, measured, hw, CostOptions(dp_scalar_allreduces=4), 4)


def test_rows_predict_with_the_cost_model():
    cases, _, rows = _rows()
    hw = load_hardware("gh200")
    c = cases[1]
    expect = op_time("training", c.arch, "policy", Workload(16, 1, 8, 8, "fp32"), dp=2, pp=1, tp=1, mb=1,
                     gpus_per_node=4, hw=hw, opts=CostOptions(dp_scalar_allreduces=4)).T_op
    assert rows[1].pred.T_op == pytest.approx(float(expect))
    assert rows[1].pred_default.T_op < rows[1].pred.T_op  # 4 scalar AllReduces over dp = 2 more
    assert rows[0].measured_s == pytest.approx(0.011)


def test_csv_schema_and_round_trip(tmp_path: Path):
    cases, measured, rows = _rows()
    path = tmp_path / "v.csv"
    write_csv(rows, path)
    lines = path.read_text().splitlines()
    assert tuple(lines[0].split(",")) == CSV_COLUMNS
    assert {"predicted_s", "measured_s"} <= set(CSV_COLUMNS) and len(lines) == 1 + len(rows)
    back = read_csv(path)
    assert [c for c, _, _ in back] == cases
    assert [s for _, s, _ in back] == [pytest.approx(m) for m, _ in measured]
    assert back[2][2] == pytest.approx(1.5e6) and back[0][2] is None
    # A CSV from before the dtype column measured the float32 path.
    old = tmp_path / "old.csv"
    i = CSV_COLUMNS.index("dtype")
    old.write_text("\n".join(",".join(f for j, f in enumerate(line.split(",")) if j != i) for line in lines) + "\n")
    assert [c.dtype for c, _, _ in read_csv(old)] == ["fp32"] * 3
    bad = tmp_path / "bad.csv"
    bad.write_text("role,kind\ninference,reference\n")
    with pytest.raises(RpegError, match="lacks the columns"):
        read_csv(bad)


def test_gpu_grid_runs_1b_models_in_bf16_on_one_device():
    """Ten or more configurations of every role on one device; the models counted as transformers counts
    them (Llama 3.2 1B: 1,235,814,400 parameters; Qwen2.5 0.5B: 494,032,768, both with tied embeddings)."""
    from rpegc.core.cost.params import param_count
    from rpegc.tools.validate import GRIDS

    grid = build_grid(1, grid="gpu")
    assert len(grid) >= 10 and {c.role for c in grid} == {"generation", "inference", "training"}
    assert {c.dtype for c in grid} == {"bf16"} and all(c.devices == 1 for c in grid)
    archs = GRIDS["gpu"].archs
    assert param_count(archs["llama3.2-1b"], "policy") == 1_235_814_400
    assert param_count(archs["qwen2.5-0.5b"], "policy") == 494_032_768
    assert {c.dtype for c in build_grid(1, quick=True, grid="gpu")} == {"bf16"}
    with pytest.raises(RpegError, match="unknown --grid"):
        build_grid(1, grid="tpu")


def test_memory_grid_covers_every_role_strategy_and_precision():
    """The CPU memory grid (peak tensor bytes with --isolated): >= 40 configurations, each role under dp, pp and tp,
    both precisions, a GQA model and a tied head with q/k/v biases."""
    grid = build_grid(2, grid="memory")
    assert len(grid) >= 40 and {c.dtype for c in grid} == {"fp32", "bf16"}
    for role in ("generation", "inference", "training"):
        mine = [c for c in grid if c.role == role]
        assert {(c.dp, c.pp, c.tp) for c in mine} >= {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)}
    archs = {c.arch for c in grid}
    assert any(a.kv_heads < a.heads for a in archs) and any(a.tied and a.qkv_bias for a in archs)


def test_bf16_cases_are_priced_in_bf16():
    """The prediction follows the case's dtype: bf16 serving weights are half the float32 ones."""
    from rpegc.tools.validate import predict

    hw, arch = load_hardware("h200"), VALIDATION_ARCHS["small-256"]
    fp32, bf16 = (predict(Case("inference", "reference", "small-256", arch, 16, 1, 16, 16, 1, 1, 1, 1, dtype=d),
                          hw, CostOptions(), 8) for d in ("fp32", "bf16"))
    assert bf16.peak_bytes < fp32.peak_bytes and bf16.T_op <= fp32.T_op


def test_report_and_plot(tmp_path: Path):
    _, _, rows = _rows()
    text = report(rows, hw=load_hardware("gh200"), opts=CostOptions(dp_scalar_allreduces=4), devices=2,
                  source="unit test")
    assert "dp_scalar_allreduces = 4" in text
    for group in ("all", "generation", "inference", "training", "pp > 1", "dp > 1"):
        assert f"\n{group} " in text
    assert "With the default cost options" in text and "fastest repeat" in text
    assert "Peak memory (Fig. 5)" in text and "Largest errors" in text
    plot(rows, tmp_path / "v.png")
    plot(rows, tmp_path / "m.png", memory=True)
    assert (tmp_path / "v.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "m.png").stat().st_size > 0


def test_subsample_spreads_over_the_grid():
    from rpegc.tools.validate import subsample

    grid = build_grid(8)
    picked = subsample(grid, 120)
    assert len(picked) == 120 and picked[0] == grid[0] and picked[-1] == grid[-1]
    assert {c.role for c in picked} == {"generation", "inference", "training"}
    assert {c.model for c in picked} == set(VALIDATION_ARCHS)
    assert subsample(grid[:10], 120) == grid[:10]
    with pytest.raises(RpegError):
        subsample(grid, 0)
