"""The [attention] table (rpegc/core/cost/attention.py): read and checked with the profile, priced per layer, row and
query head of every attention call an operator makes (0 beyond the table, for another head size, without a table),
and written by the calibration from its timings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rpegc.core.cost.attention import AttentionTable, decode_attention, layer_attention
from rpegc.core.cost.hardware import PROFILE_DIR, Hardware, load_hardware
from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.optime import op_time
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.ir.training import Training

from fixtures.calibration import calibration
from fixtures.spec_example import HW_DICT

# A model of head size 16 (hidden 64, 4 query heads over 2 key heads) and rows of 4 + 6 tokens
ARCH = Arch(layers=4, hidden=64, ffn=128, vocab=32, heads=4, kv_heads=2, gated=True, tied=False, norms=True)
WL = Workload(8, 4, 4, 6, "fp32")
N = 12  # positions the table covers
FORWARD = tuple(1e-6 * (1 + i) for i in range(N))
BACKWARD = tuple(3e-6 * (1 + i) for i in range(N))
DECODE = tuple(2e-7 * (1 + i) for i in range(N))
TABLE = {"head_dim": 16, "forward": list(FORWARD), "backward": list(BACKWARD), "decode": list(DECODE)}
HW = Hardware.from_dict(HW_DICT)
HW_ATT = Hardware.from_dict({**HW_DICT, "attention": TABLE})
PLAN = dict(dp=2, pp=2, tp=2, mb=2, gpus_per_node=8)
LAYERS, ROWS, HEADS = 4 / 2, 32 / 2, 4 / 2  # a stage's layers, a replica's rows, a TP shard's query heads


def both(role: str, kind: str, wl: Workload = WL, arch: Arch = ARCH, **kw):
    return (op_time(role, arch, kind, wl, **PLAN, hw=HW, **kw), op_time(role, arch, kind, wl, **PLAN, hw=HW_ATT, **kw))


def test_each_role_pays_its_calls_attention_per_layer_row_and_query_head():
    base, timed = both("inference", "reference")  # log-probs: a row less its last token, 9 positions
    assert timed.T_op - base.T_op == pytest.approx(LAYERS * ROWS * HEADS * FORWARD[8])
    base, timed = both("inference", "reward")  # a reward model reads the whole row
    assert timed.T_op - base.T_op == pytest.approx(LAYERS * ROWS * HEADS * FORWARD[9])
    base, timed = both("generation", "policy")
    assert timed.prefill_time - base.prefill_time == pytest.approx(LAYERS * ROWS * HEADS * FORWARD[3])
    # the decode steps feed back the response's first 5 tokens, one query over 5 .. 9 keys
    assert timed.decode_time - base.decode_time == pytest.approx(LAYERS * ROWS * HEADS * sum(DECODE[4:9]))
    for recompute, forwards in (("none", 1), ("interval", 2), ("full", 2)):
        train = Training(precision="mixed", zero=2, recompute=recompute, schedule="1f1b")
        base, timed = both("training", "policy", train=train)
        assert timed.T_op - base.T_op == pytest.approx(LAYERS * ROWS * HEADS * (forwards * FORWARD[8] + BACKWARD[8]))


def test_what_the_table_does_not_cover_is_priced_by_flops_alone():
    long = Workload(8, 4, 13, 6, "fp32")  # a prompt of 13 positions: every call beyond the table
    base, timed = both("inference", "reference", wl=long)
    assert timed.T_op == base.T_op
    base, timed = both("generation", "policy", wl=long)
    assert timed.prefill_time == base.prefill_time and timed.decode_time == base.decode_time
    wide = dataclasses.replace(ARCH, hidden=128)  # head size 32
    base, timed = both("inference", "reference", arch=wide)
    assert timed.T_op == base.T_op
    assert HW.attention is None and load_hardware("gh200").attention is None  # the spec's profiles: none
    spec = CostOptions(accounting="spec")  # the spec's rows: Lp + Lr positions
    base, timed = both("inference", "reference", opts=spec)
    assert timed.T_op - base.T_op == pytest.approx(LAYERS * ROWS * HEADS * FORWARD[9])


def test_the_functions_take_the_search_paths_arrays():
    import numpy as np

    table = HW_ATT.attention
    tp, rows = np.array([1, 2, 4]), np.array([64.0, 32.0, 16.0])
    got = layer_attention(table, ARCH, 2, tp, rows, 5)
    assert got == pytest.approx(2 * rows * 4 / tp * FORWARD[4])
    assert decode_attention(table, ARCH, 2, tp, rows, 4, 1) == pytest.approx(0 * rows)  # one token: no decode step
    assert decode_attention(None, ARCH, 2, tp, rows, 4, 6) == pytest.approx(0 * rows)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "att.toml"
    path.write_text(text)
    return str(path)


GOOD = (PROFILE_DIR / "gh200.toml").read_text()
SECTION = "\n[attention]\nhead_dim = 16\nforward = [1e-6, 2e-6]\nbackward = [3e-6, 4e-6]\ndecode = [2e-7, 3e-7]\n"


def test_the_table_is_read_and_checked(tmp_path):
    hw = load_hardware(write(tmp_path, GOOD + SECTION))
    assert hw.attention == AttentionTable(16, (1e-6, 2e-6), (3e-6, 4e-6), (2e-7, 3e-7))
    for bad, message in ((SECTION.replace("[1e-6, 2e-6]", "[1e-6, -2e-6]"),
                          "key 'attention.forward[1]' = -2e-06 is outside the allowed range"),
                         (SECTION.replace("decode = [2e-7, 3e-7]", "decode = [2e-7]"),
                          "the [attention] lists must cover the same positions; got forward 2, backward 2, decode 1"),
                         (SECTION.replace("head_dim = 16", "head_dim = 0"), "key 'attention.head_dim' = 0 must be"),
                         (SECTION.replace("backward = [3e-6, 4e-6]", "backward = 3e-6"),
                          "key 'attention.backward' must be a list of 1 to 4096 numbers"),
                         (SECTION + "prefill = [1e-6]\n", "unknown key 'attention.prefill'")):
        with pytest.raises(RpegError) as info:
            load_hardware(write(tmp_path, GOOD + bad))
        assert message in info.value.message


class _AttentionPool:
    """A worker whose attention takes FORWARD, with the backward's time beside, over two repeats."""

    def run(self, fn, positions, dtype, min_time, repeats):
        return [[([f * 1.3, f], [f + b, (f + b) * 1.1], [d, d * 1.2])
                 for f, b, d in zip(FORWARD[:positions], BACKWARD, DECODE)], None]


def test_the_calibration_writes_its_timings_as_the_table(tmp_path: Path):
    from rpegc.tools.calibrate import _attention_campaign, cpu_plan, profile_text

    plan = dataclasses.replace(cpu_plan(), kernel_statistic="min", attention_positions=N)
    table = _attention_campaign(_AttentionPool(), plan)
    assert len(table.forward) == plan.attention_positions == N and table.head_dim == 16
    assert table.forward == pytest.approx(FORWARD) and table.decode == pytest.approx(DECODE)
    assert table.backward == pytest.approx(BACKWARD)  # the forward with its backward, less the forward
    cal = calibration()
    cal.attention = table
    hw = load_hardware(write(tmp_path, profile_text(cal)))
    assert hw.attention.forward == pytest.approx(FORWARD, rel=1e-5)
    assert hw.attention.backward == pytest.approx(BACKWARD, rel=1e-5)
    cal.attention = None
    assert load_hardware(write(tmp_path, profile_text(cal))).attention is None  # not measured: not priced
