"""Strict JSON text for every JSON file rpegc reads and writes (plans, traces), with located errors.

Python's `json` accepts `NaN`, `Infinity` and numbers that overflow to infinity (`1e400`), writes them
back as the non-standard `NaN`/`Infinity`, raises RecursionError on deeply nested input and reports no
positions for values. This module:

- `loads(text, file)`: parse strictly (no NaN/Infinity, no overflowing numbers, nesting at most
  `MAX_DEPTH`), every failure an RpegError at `file:line:col`;
- `dumps(value, **kw)`: `json.dumps(..., allow_nan=False)`; a NaN or infinity is a bug in the writer;
- `locate(text, path)`: the line and column of the value at a JSON path such as `nodes[17].bytes`,
  found by walking the text with json.decoder's own scanning primitives (`scanstring` for keys,
  `JSONDecoder.raw_decode` to step over values). It is used only when reporting an error.

No xDSL: the runtime reads plans and traces through this module.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from json.decoder import scanstring
from typing import Any, Optional, Union

from rpegc.core.ir.errors import Loc, RpegError

# An rpegc program nests 6 levels deep (top, rpeg_graph, containers, [i], dims, [j]); a trace record 2.
# Anything far deeper is not one of our files, and json's recursive decoder would overflow the stack.
MAX_DEPTH = 64

PathStep = Union[str, int]

_WS = re.compile(r"[ \t\n\r]*")
# Tokens that matter outside strings: a string (skipped), a bracket, a non-finite constant, a number.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|NaN|-?Infinity|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?')
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*|[0-9]+")
_PATH_STEP = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_\-]*|[0-9]+)|\[([0-9]+)\]|\[("(?:[^"\\]|\\.)*")\]')


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _first_bad_token(text: str) -> tuple[int, str]:
    """Offset and reason of the first token that makes the text non-strict (too deep, non-finite)."""
    depth = 0
    for m in _TOKENS.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == '"':
            continue
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return m.start(), (f"the JSON nests arrays and objects more than {MAX_DEPTH} levels deep; "
                                   "an rpegc file nests at most a few levels")
        elif c in "]}":
            depth -= 1
        elif tok in ("NaN", "Infinity", "-Infinity"):
            return m.start(), f"'{tok}' is not a JSON number; give a finite number"
        elif not math.isfinite(float(tok)):
            return m.start(), f"the number {tok} is too large (it is not finite as a double); give a finite number"
    return 0, ""


def loads(text: str, file: str, line: int = 0) -> Any:
    """Parse `text` strictly; errors are RpegErrors at `file:line:col`. With `line` > 0 the text is that
    one line of a file (a JSON-lines record) and errors are located on it."""

    def where(offset: int) -> Loc:
        ln, col = line_col(text, offset)
        return Loc(file, line or ln, col)

    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise RpegError(where(e.pos), f"invalid JSON: {e.msg}") from None
    except (_NonFinite, RecursionError):
        offset, reason = _first_bad_token(text)
        raise RpegError(where(offset), reason or "the JSON is nested too deeply") from None
    # The decoder recurses once per level, so a document that parses may still nest deeper than
    # anything that reads it expects: bound it here, once, for every reader.
    if _deeper_than(value, MAX_DEPTH):
        offset, reason = _first_bad_token(text)
        raise RpegError(where(offset), reason or f"the JSON nests more than {MAX_DEPTH} levels deep")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if d > limit:
            return True
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return False


class NonFiniteError(ValueError):
    """A value to be written holds NaN or an infinity; `path` is where (e.g. `nodes[3].time`)."""

    def __init__(self, path: str):
        super().__init__(f"the value at {path or 'the top level'} is not a finite number; JSON has no NaN or "
                         "infinity")
        self.path = path


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that refuses NaN and infinities (they are not JSON): NonFiniteError names the path."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        raise NonFiniteError(_non_finite_path(value, "") or "") from None


def _non_finite_path(v: Any, path: str) -> Optional[str]:
    if isinstance(v, float) and not math.isfinite(v):
        return path
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else ()
    for k, x in items:
        found = _non_finite_path(x, join(path, k if isinstance(k, int) else str(k)))
        if found is not None:
            return found
    return None


# ----------------------------------------------------------------------------------------------
# JSON paths
# ----------------------------------------------------------------------------------------------


def join(path: str, key: PathStep) -> str:
    """`path.key`, `path[3]`, or `path["odd key"]` for a key that is not a bare name."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _BARE_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def parse_path(path: str) -> list[PathStep]:
    """`nodes[17].alloc.extent[0]` -> ["nodes", 17, "alloc", "extent", 0]; stops at what it cannot read."""
    out: list[PathStep] = []
    pos = 0
    while pos < len(path):
        m = _PATH_STEP.match(path, pos)
        if m is None:
            break
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(2) is not None:
            out.append(int(m.group(2)))
        else:
            out.append(json.loads(m.group(3)))
        pos = m.end()
    return out


def locate_offset(text: str, path: list[PathStep]) -> int:
    """Offset of the value at `path` in the JSON `text`, or of the deepest enclosing value found."""
    decoder = json.JSONDecoder()  # stepping over values of a document that already parsed

    def ws(i: int) -> int:
        return _WS.match(text, i).end()  # type: ignore[union-attr]

    pos = ws(0)
    try:
        for step in path:
            if isinstance(step, int):
                if text[pos] != "[":
                    return pos
                i = ws(pos + 1)
                for _ in range(step):
                    if text[i] == "]":
                        return pos
                    _, i = decoder.raw_decode(text, i)
                    i = ws(i)
                    if text[i] != ",":
                        return pos
                    i = ws(i + 1)
                if text[i] == "]":
                    return pos
                pos = i
            else:
                if text[pos] != "{":
                    return pos
                i = ws(pos + 1)
                found: Optional[int] = None
                while text[i] == '"':
                    key, i = scanstring(text, i + 1)
                    i = ws(i)
                    if text[i] != ":":
                        return pos
                    i = ws(i + 1)
                    if key == step:
                        found = i  # json keeps the last of duplicate keys; so do we
                    _, i = decoder.raw_decode(text, i)
                    i = ws(i)
                    if text[i] == ",":
                        i = ws(i + 1)
                if found is None:
                    return pos
                pos = found
    except (IndexError, ValueError):
        return pos
    return pos


def element_locs(text: str, path: str, file: str) -> list[Loc]:
    """The location of every element of the array at `path` (one walk over it): what the reader gives
    exec nodes and edges, so that later errors about one of them (in passes, in the runtime) point at it."""
    start = locate_offset(text, parse_path(path))
    if start >= len(text) or text[start] != "[":
        return []
    decoder = json.JSONDecoder()
    newlines = [m.start() for m in re.finditer("\n", text)]
    out: list[Loc] = []

    def ws(i: int) -> int:
        return _WS.match(text, i).end()  # type: ignore[union-attr]

    i = ws(start + 1)
    try:
        while text[i] != "]":
            line = bisect.bisect_left(newlines, i)  # newlines before offset i
            out.append(Loc(file, line + 1, i - (newlines[line - 1] + 1 if line else 0) + 1))
            _, i = decoder.raw_decode(text, i)
            i = ws(i)
            if text[i] != ",":
                break
            i = ws(i + 1)
    except (IndexError, ValueError):
        pass
    return out


def locate(text: str, path: str) -> tuple[int, int]:
    """1-based (line, column) of the value at the JSON path `path` (e.g. `nodes[17].bytes`) in `text`."""
    return line_col(text, locate_offset(text, parse_path(path)))
