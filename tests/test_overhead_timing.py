"""What rpeg-calibrate --overhead measures (tools/overhead_timing.py): the `[overhead]` table of a CPU profile. The fit
is checked on synthetic operators (it recovers the terms, keeps them >= 0); the measurement end to end on a small grid
and a short real run. No test asserts a time: only that the values are >= 0 and load as a profile's."""

import tomllib

import pytest

from rpegc.core.cost.hardware import Hardware, load_hardware
from rpegc.tools import overhead_timing
from rpegc.tools.overhead_timing import fit_role, tokens


def test_the_fit_recovers_per_call_and_per_token_terms():
    calls = [1, 1, 2, 1, 2]
    toks = [64, 256, 256, 1024, 512]
    kernels = [1e-3, 4e-3, 5e-3, 9e-3, 6e-3]
    measured = [k + 2e-3 * c + 5e-6 * t for k, c, t in zip(kernels, calls, toks)]
    f = fit_role("training", calls, toks, kernels, measured)
    assert f.call == pytest.approx(2e-3, rel=1e-9) and f.token == pytest.approx(5e-6, rel=1e-9)
    assert f.mape_after == pytest.approx(0.0, abs=1e-12) and f.mape_before > 0.3 and f.points == 5


def test_the_fit_keeps_both_terms_non_negative():
    calls, toks = [1, 1, 1, 1], [64, 128, 256, 512]
    kernels = [1e-3, 2e-3, 4e-3, 8e-3]
    # a per-call cost, and kernels that overprice long operators: the per-token slope is negative, so it is 0
    measured = [k + 3e-3 - 2e-6 * t for k, t in zip(kernels, toks)]
    f = fit_role("inference", calls, toks, kernels, measured)
    assert f.token == 0.0 and f.call > 0
    # operators faster than their kernels: no overhead at all
    f = fit_role("inference", calls, toks, kernels, [0.5 * k for k in kernels])
    assert (f.call, f.token) == (0.0, 0.0)


def test_tokens_are_a_replicas_whole_sequences():
    assert tokens(4, 2, 8, 16) == 4 * 2 * 24


def test_the_overhead_table_loads_into_a_profile():
    """The whole measurement, as `rpeg-calibrate --machine --quick` runs it: a small grid and a 4-step run."""
    hw = load_hardware("cpu-reference")
    base = open(hw.source).read()
    text = base + overhead_timing.overhead_text(hw, base, overhead_timing.QUICK)
    loaded = Hardware.from_dict(tomllib.loads(text), source="t.toml")
    oh = loaded.overhead
    values = [oh.call(r) for r in overhead_timing.ROLES] + [oh.token(r) for r in overhead_timing.ROLES]
    assert all(v >= 0 for v in values) and oh.transfer >= 0 and oh.node > 0  # a real run's round trips take time
    assert "[overhead]" in text and "4-step GRPO of the tiny preset" in text
