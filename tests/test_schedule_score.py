"""Scores (Eq. 4-6, spec 7) against the worked example in docs/cost-model-spec.md 8.7."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rpegc.core.sched.score import memory_penalty, p_eff, score, score_eff, score_pen, tokens_per_step, utilization

MS = 1.676318 + 0.2504039 + 0.9874231  # spec 8.7: the co-located chain gen -> ref-inf -> train
WL = dict(B=64, R=1, Lp=512, Lr=128)


def test_spec_87_score():
    assert MS == pytest.approx(2.914145, rel=1e-6)
    assert tokens_per_step(**WL) == 64 * 640
    assert score(MS, 1, **WL) == pytest.approx(1.405558e4, rel=1e-6)
    assert score(MS, 8, **WL) == pytest.approx(8 * 1.405558e4, rel=1e-6)


@pytest.mark.parametrize(
    "r_peak, factor", [(0.186440, 1.0), (0.745759, 1.0), (1.0, 1.0), (1.118639, 8.690270e-3), (1.1, math.exp(-4))]
)
def test_spec_87_memory_penalty(r_peak, factor):
    assert memory_penalty(r_peak) == pytest.approx(factor, rel=1e-5)
    assert score_pen(1.405558e4, r_peak) == pytest.approx(1.405558e4 * factor, rel=1e-5)


def test_spec_87_utilization():
    # Every one of the 8 GPUs is busy the whole time; with only 4 of 8 busy, Util = 0.5.
    assert utilization(MS * 8, 8, MS) == pytest.approx(1.0)
    assert utilization(MS * 4, 8, MS) == pytest.approx(0.5)


def test_spec_87_score_eff_floor():
    s = score(MS, 1, **WL)
    assert score_eff(s, 1.0, s) == pytest.approx(1.405558e4, rel=1e-6)
    assert score_eff(s, 1.0, 2 * s) == pytest.approx(1.405558e-8, rel=1e-6)
    assert score_eff(s, 0.5, 0.0) == pytest.approx(0.5 * s)  # the first candidate is its own Score_star
    # Exactly at the floor (1 - delta) * Score_star still counts as above it.
    assert score_eff(90.0, 0.7, 100.0) == pytest.approx(63.0)
    assert score_eff(89.0, 0.7, 100.0) == pytest.approx(89e-12)
    assert score_eff(89.0, 0.7, 100.0, delta=0.2) == pytest.approx(89 * 0.7)


def test_p_eff():
    assert p_eff(6.0, 2.0) == 3.0


def test_numpy_arrays_give_the_same_numbers_as_scalars():
    ms = np.array([MS, 2 * MS, 0.5 * MS])
    r = np.array([0.5, 1.05, 1.2])
    util = np.array([1.0, 0.4, 0.9])
    raw = score(ms, 1, **WL)
    assert isinstance(raw, np.ndarray)
    best = float(raw.max())
    pen = score_pen(raw, r)
    eff = score_eff(raw, util, best)
    for i in range(3):
        s = score(float(ms[i]), 1, **WL)
        assert raw[i] == pytest.approx(s)
        assert pen[i] == pytest.approx(score_pen(s, float(r[i])))
        assert eff[i] == pytest.approx(score_eff(s, float(util[i]), best))
    assert isinstance(memory_penalty(1.2), float)
