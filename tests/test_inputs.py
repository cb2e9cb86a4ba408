"""Input files that cannot hang or exhaust a tool (rpegc/inputs.py; issue 33, item 4): a FIFO, a device or a
directory is refused without blocking, a file above its bound by its size before it is read, and text that is not
UTF-8 at its line and column."""

from __future__ import annotations

import os
import threading

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.inputs import read_input, read_input_text


def test_a_regular_file_is_read_whole_and_a_byte_order_mark_dropped(tmp_path):
    p = tmp_path / "a.toml"
    p.write_bytes(b"\xef\xbb\xbfclip_eps = 0.2\n")
    assert read_input(str(p), "the RL config", 1 << 20) == b"\xef\xbb\xbfclip_eps = 0.2\n"
    assert read_input_text(str(p), "the RL config", 1 << 20) == "clip_eps = 0.2\n"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "missing"])
def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = {"fifo": str(tmp_path / "pipe"), "device": "/dev/zero", "directory": str(tmp_path),
            "missing": str(tmp_path / "nope")}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # nothing ever writes to it: a blocking open would wait forever
    result: list = []
    reader = threading.Thread(target=lambda: result.append(_error(path)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert result, f"reading {kind} blocked"
    want = {"fifo": "it is not a regular file", "device": "it is not a regular file", "directory": "it is a directory",
            "missing": "No such file or directory"}[kind]
    assert result[0].startswith(f"{path}:0:0: error: cannot read the plan file: ") and want in result[0], result[0]


def _error(path: str) -> str:
    try:
        read_input(path, "the plan file", 1 << 20)
    except RpegError as e:
        return str(e)
    return "read"


def test_a_file_above_its_bound_is_refused_by_its_size(tmp_path):
    p = tmp_path / "big.toml"
    p.write_bytes(b"x" * 1001)
    with pytest.raises(RpegError, match="it holds 1,001 bytes, more than the 1,000"):
        read_input(str(p), "the RL config", 1000)
    assert len(read_input(str(p), "the RL config", 1001)) == 1001


def test_text_that_is_not_utf8_is_located(tmp_path):
    p = tmp_path / "bad.rpeg"
    p.write_bytes(b"ok\nab\xffcd\n")
    with pytest.raises(RpegError, match="the plan file is not UTF-8 text") as e:
        read_input_text(str(p), "the plan file", 1 << 20)
    assert (e.value.loc.line, e.value.loc.col) == (2, 3)
