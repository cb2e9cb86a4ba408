"""The [host] checkpoint terms' fit (tools/checkpoint_timing.py): t = t_file + tensors t_tensor + bytes / rate by least
squares in relative error, a fixed term that fits below 0 left out; a time that does not grow with the bytes is
refused. The measurement itself is tests/test_verifier_timing.py's (the [host] table loads, no file is left)."""

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.tools.checkpoint_timing import SHAPES, fit_writes


def test_the_fit_recovers_the_three_terms():
    seconds = [5e-4 + t * 2e-5 + b / 8e8 for t, b in SHAPES]
    fit = fit_writes(SHAPES, seconds)
    assert fit.file_s == pytest.approx(5e-4, rel=1e-6) and fit.tensor_s == pytest.approx(2e-5, rel=1e-6)
    assert fit.rate == pytest.approx(8e8, rel=1e-6) and fit.mape < 1e-9 and fit.points == len(SHAPES)


def test_a_fixed_term_below_zero_is_left_out_and_the_others_refitted():
    # files faster than the bytes' line predicts for one tensor: the file term would fit below 0
    seconds = [t * 3e-5 + b / 5e8 for t, b in SHAPES]
    seconds[0] *= 0.5
    fit = fit_writes(SHAPES, seconds)
    assert fit.file_s == 0.0 and fit.tensor_s > 0 and fit.rate > 0


def test_a_time_that_does_not_grow_with_the_bytes_is_refused():
    with pytest.raises(RpegError, match="does not grow with the bytes"):
        fit_writes(SHAPES, [1e-3] * len(SHAPES))
