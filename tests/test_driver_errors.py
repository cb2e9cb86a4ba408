"""User errors at the driver level (docs/architecture.md, IR to Passes and the driver): pipeline-string errors point
at the right column, absurd sizes are reported quickly instead of hanging, and module-level errors of a split chunk
point into that chunk. In-process `rpegc.cli.main(argv)`."""

from __future__ import annotations

import pathlib
import signal

import pytest

from fixtures.programs import ACTOR_GRAPH
from rpegc.cli import main

ROOT = pathlib.Path(__file__).parent.parent
PPO = ROOT / "examples" / "ppo.rpeg"
SMALL = ACTOR_GRAPH + """rpeg.cluster @c {racks = 1, nodes = 2, gpus = 4, hardware = "gh200"}
rpeg.plan @p for @g on @c {
  @gen   at (0, 0, 0) extent (1, 1, 4) dp = 2 pp = 1 tp = 2 mb = 1
  @train at (0, 1, 0) extent (1, 1, 4) dp = 1 pp = 2 tp = 2 mb = 8
}
"""
TIME_LIMIT = 20  # seconds; a correct run takes milliseconds (the CI machine is shared)
QUICK = 5  # seconds for the huge-size cases, so that a regression costs little time


class _TooSlow(BaseException):
    pass


def _alarm(signum, frame):
    raise _TooSlow()


def run(capsys, *argv, limit: int = TIME_LIMIT) -> tuple[object, str, str]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        code: object = main([str(a) for a in argv])
    except _TooSlow:
        code = f"still running after {limit} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- the -p pipeline string ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, col, words",
    [
        ("verify-wellformed,unrol{k=2}", 19, "unrol"),  # unknown pass: at its name
        ("unroll{k=two}", 10, "two"),  # wrong option type: at the value
        ("unroll{steps=2}", 8, "steps"),  # unknown option: at the option
        ("verify-wellformed,unroll{k=2", 29, "malformed pass pipeline"),  # unterminated: one past the end
        ("verify-wellformed,,unroll", 19, "malformed pass pipeline"),  # empty pass name: at the second comma
        ("unroll{k=2 q}x", 14, "malformed pass pipeline"),  # junk after the options: at the junk
    ],
)
def test_pipeline_errors_point_at_the_offending_column(capsys, spec, col, words):
    code, out, err = run(capsys, PPO, "-p", spec)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"<pipeline>:1:{col}: error: ") and words in lines[0]
    assert lines[1] == spec
    assert lines[2] == " " * (col - 1) + "^"


# --- absurd sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new",
    [
        ("B = 64,", "B = 999999999999999999999,"),
        ("gpus = 4,", "gpus = 999999999999999999999,"),
        ('arch = "tiny"', "layers = 999999999999999999999, hidden = 64, ffn = 256, vocab = 64, heads = 4"),
    ],
    ids=["batch", "gpus-per-node", "layers"],
)
def test_huge_sizes_are_reported_quickly(tmp_path, capsys, old, new):
    """A typo such as 21 nines must give an answer (a located error or a verdict) within seconds."""
    path = tmp_path / "huge.rpeg"
    assert old in SMALL
    path.write_text(SMALL.replace(old, new))
    code, _, err = run(capsys, path, "-p", "verify-wellformed", limit=QUICK)
    assert code in (0, 1), f"exit {code!r}: {err[:300]}"
    if code == 1:
        assert err.startswith(f"{path}:")


# --- locations of module-level errors in split chunks ----------------------------------------------------


def test_module_level_error_of_a_later_chunk_points_into_that_chunk(tmp_path, capsys):
    """A chunk that lacks `rpeg.workload` is reported at its own first line, not at line 1 of the file."""
    first = 'rpeg.workload {B = 64, R = 1, Lp = 128, Lr = 384, dtype = bf16}\n'
    second = 'rpeg.model @actor {arch = "tiny", kind = policy, trainable}\n'
    path = tmp_path / "two.rpeg"
    path.write_text(first + "// -----\n" + second)
    code, out, err = run(capsys, path, "--split-input-file")
    assert code == 1
    located = err.splitlines()[0]
    assert "has no rpeg.workload" in located
    line = int(located.split(":")[1])
    assert line >= 3, f"the error points at line {line}, which lies in the first chunk: {located}"
