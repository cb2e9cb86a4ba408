"""Input files that cannot hang or exhaust a tool: the one way rpegc, rpeg-run and the torch backend open a file a
user names (a plan, a trace, an RL config, a reward function's file).

A named pipe blocks a reader until something writes to it, and a character device (/dev/zero) never ends, so an
input is opened without blocking (O_NONBLOCK), must be a regular file, and is read only up to a bound that is far
above what the file can hold (its `limit`): a larger file is refused by its size before a byte of it is read.
Failures are `RpegError`s located at the path: `PATH: error: cannot read <what>: <reason>`.
"""

from __future__ import annotations

import os
import stat

from rpegc.core.ir.errors import Loc, RpegError, utf8_text

MIB = 1 << 20
MAX_MODULE_BYTES = 1 << 30  # a module or plan (.rpeg, .json, .mlir): one of 150,000 containers is 6 MB


def read_input(path: str, what: str, limit: int) -> bytes:
    """The bytes of input file `path`, `what` naming it in errors, refused above `limit` bytes."""

    def fail(reason: str) -> RpegError:
        return RpegError(Loc(path or "''", 0, 0), f"cannot read {what}: {reason}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise fail("it is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise fail("it is not a regular file (a pipe or a device is not read: it may never end)")
        if st.st_size > limit:
            raise fail(f"it holds {st.st_size:,} bytes, more than the {limit:,} such a file can need")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 16 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise fail(f"it holds more than the {limit:,} bytes such a file can need")
        return b"".join(chunks)
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    finally:
        os.close(fd)


def read_input_text(path: str, what: str, limit: int) -> str:
    """`read_input` decoded as UTF-8, a leading byte-order mark dropped; a non-UTF-8 byte is located."""
    return utf8_text(read_input(path, what, limit), path, f"{what} is not UTF-8 text")
