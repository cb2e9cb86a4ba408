"""The [host] checkpoint terms' fit (tools/checkpoint_timing.py): t = t_file + tensors t_tensor + bytes / rate by least
squares in relative error, a fixed term that fits below 0 left out; a time that does not grow with the bytes is
refused. The disk two writers share: the second's extra time is its bytes at the shared rate. The measurement itself is
tests/test_verifier_timing.py's (the [host] table loads, no file is left)."""

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.report import host_cores
from rpegc.tools.checkpoint_timing import (SHAPES, CheckpointProbe, _writers, disk_rate, fit_copies, fit_writes,
                                           shared_rate, time_together)


def test_the_fit_recovers_the_three_terms():
    seconds = [5e-4 + t * 2e-5 + b / 8e8 for t, b in SHAPES]
    fit = fit_writes(SHAPES, seconds)
    assert fit.file_s == pytest.approx(5e-4, rel=1e-6) and fit.tensor_s == pytest.approx(2e-5, rel=1e-6)
    assert fit.rate == pytest.approx(8e8, rel=1e-6) and fit.mape < 1e-9 and fit.points == len(SHAPES)


def test_the_kept_copies_fit_recovers_its_two_terms():
    seconds = [t * 3e-6 + b / 2e10 for t, b in SHAPES]
    assert fit_copies(SHAPES, seconds) == pytest.approx((3e-6, 2e10), rel=1e-6)
    many_small_faster = [b / 2e10 * (0.5 if t > 1 else 1.0) for t, b in SHAPES]  # the tensor term would fit below 0
    tensor_s, rate = fit_copies(SHAPES, many_small_faster)
    assert tensor_s == 0.0 and rate > 0


def test_the_probe_writes_parts_as_a_run_does_and_keeps_what_a_run_keeps(tmp_path):
    pytest.importorskip("torch")
    from rpegc.runtime.backends.torch.checkpoints.shard_files import complete_checkpoints, read_index
    from rpegc.runtime.backends.torch.controller.options import KEEP_CHECKPOINTS

    probe = CheckpointProbe(str(tmp_path))
    assert all(write > 0 and commit > 0 for write, commit in (probe.part(t, b) for t, b in SHAPES[:2] * 2))
    found = complete_checkpoints(str(tmp_path))
    assert [s for s, _ in found] == [3, 4][-KEEP_CHECKPOINTS:]  # committed, the older ones pruned
    index = read_index(found[-1][1])
    assert index["step"] == 4 and len(index["files"]) == 1 and len(index["tensors"]) == SHAPES[1][0]


def test_a_fixed_term_below_zero_is_left_out_and_the_others_refitted():
    # files faster than the bytes' line predicts for one tensor: the file term would fit below 0
    seconds = [t * 3e-5 + b / 5e8 for t, b in SHAPES]
    seconds[0] *= 0.5
    fit = fit_writes(SHAPES, seconds)
    assert fit.file_s == 0.0 and fit.tensor_s > 0 and fit.rate > 0


def test_a_time_that_does_not_grow_with_the_bytes_is_refused():
    with pytest.raises(RpegError, match="does not grow with the bytes"):
        fit_writes(SHAPES, [1e-3] * len(SHAPES))


def test_the_second_writers_extra_time_is_its_bytes_at_the_shared_rate():
    assert shared_rate(0.024, 0.040, 32 << 20) == pytest.approx((32 << 20) / 0.016)
    assert shared_rate(0.024, 0.0245, 32 << 20) is None  # within 5 %: the writes run in parallel
    assert shared_rate(0.024, 0.020, 32 << 20) is None


@pytest.mark.skipif(host_cores() < 2, reason="two writers need two cores")
def test_the_disk_probe_leaves_nothing_and_gives_a_rate_or_none(tmp_path):
    rate = disk_rate(tmp_path, nbytes=1 << 20, rounds=2)
    assert rate is None or rate > 0
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_dies_is_a_one_line_error(tmp_path):
    procs = _writers(str(tmp_path / "gone"), 1, 1024)  # its directory does not exist: the write fails
    try:
        with pytest.raises(RpegError, match="writer of the checkpoint disk probe exited"):
            time_together(procs)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()


def test_the_commits_fit_a_fixed_part_and_one_per_tensor_or_their_median():
    from rpegc.tools.checkpoint_timing import fit_commits

    assert fit_commits(SHAPES, [2e-3 + 4e-6 * t for t, _ in SHAPES]) == (pytest.approx(2e-3), pytest.approx(4e-6))
    fewer_tensors_slower = [3e-3 - 4e-6 * t for t, _ in SHAPES]
    assert fit_commits(SHAPES, fewer_tensors_slower) == (pytest.approx(sorted(fewer_tensors_slower)[2]), 0.0)
