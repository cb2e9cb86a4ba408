"""Located user errors shared by the parser, the passes, the optimizer and the runtime.

Every user-facing failure is an `RpegError`: it carries a source location and a message that says
what to change. The driver renders it as `file:line:col: error: ...` with the source line and a caret.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A position in a source file; line and col are 1-based."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOC = Loc("<unknown>", 0, 0)


class RpegError(Exception):
    """A user error at a source location (bad input, never a bug in rpegc)."""

    def __init__(self, loc: Loc | None, message: str, source: str | None = None):
        super().__init__(message)
        self.loc = loc or UNKNOWN_LOC
        self.message = message
        # The text of the file `loc` points into, when the reader of the error may not have it (e.g. a
        # hardware profile read by a pass): render() prints its line and caret from it.
        self.source = source

    def __str__(self) -> str:
        return f"{self.loc}: error: {self.message}"

    def quoted(self) -> str:
        """The message with its location, for quoting inside another message (a worker's error in the run's):
        `file:line:col: msg`, `file: msg` without a line, the message alone without a file."""
        if self.loc.line > 0:
            return f"{self.loc}: {self.message}"
        return self.message if self.loc.file in ("", UNKNOWN_LOC.file) else f"{self.loc.file}: {self.message}"


class RpegErrors(RpegError):
    """Several independent located errors found in one check (e.g. the verifier reports all)."""

    def __init__(self, errors: list[RpegError]):
        assert errors
        super().__init__(errors[0].loc, errors[0].message, errors[0].source)
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


# The most characters of a source line an error prints: a generated file may hold a megabyte on one line.
EXCERPT_WIDTH = 120
_ELLIPSIS = "..."


def excerpt(line: str, col: int, width: int = EXCERPT_WIDTH) -> tuple[str, int]:
    """At most `width` characters of `line` around 1-based `col`, with `...` where it was cut, and the
    1-based column of that position within the excerpt (where the caret goes)."""
    if len(line) <= width:
        return line, col
    i = min(max(0, col - 1), len(line))
    start = max(0, min(i - width // 2, len(line) - width))
    end = min(len(line), start + width)
    head = _ELLIPSIS if start > 0 else ""
    tail = _ELLIPSIS if end < len(line) else ""
    return head + line[start:end] + tail, len(head) + (i - start) + 1


def render(error: RpegError, source: str | None) -> str:
    """`file:line:col: error: msg`, then (an excerpt of) the source line and a caret under the column."""
    parts = []
    lines: list[str] | None = None  # split once, however many errors point into the source
    for err in getattr(error, "errors", [error]):
        text = f"{err.loc}: error: {err.message}"
        own = getattr(err, "source", None)
        if own is not None and err.loc.line > 0:
            own_lines = own.splitlines()
            if err.loc.line <= len(own_lines):
                line, col = excerpt(own_lines[err.loc.line - 1], err.loc.col)
                text += f"\n{line}\n{' ' * max(0, col - 1)}^"
        elif source is not None and err.loc.line > 0:
            if lines is None:
                lines = source.splitlines()
            if err.loc.line <= len(lines):
                line, col = excerpt(lines[err.loc.line - 1], err.loc.col)
                text += f"\n{line}\n{' ' * max(0, col - 1)}^"
        parts.append(text)
    return "\n".join(parts)


def utf8_text(raw: bytes, path: str, message: str) -> str:
    """`raw` decoded as UTF-8 with a leading byte-order mark dropped (columns count from after it); a byte that is
    not UTF-8 is an RpegError saying `message`, located at its line and column of `path`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        col = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise RpegError(Loc(path, line, col), message) from None
    return text.removeprefix("\ufeff")


def error_line(e: BaseException) -> str:
    """An exception raised inside a library as one line: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
