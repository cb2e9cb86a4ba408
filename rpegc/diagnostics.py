"""`rpegc --verify-diagnostics` with mlir-opt's meaning: the input states the diagnostics it must produce, in
comments, and the run fails on any difference.

    rpeg.staleness {@actor = -1}   // expected-error {{staleness}}
    // expected-error @+1 {{is read by @gen but no vertex writes it}}
    %X = rpeg.container tokens[B, Lp]

`// expected-error|warning|note|remark [@+N | @-N | @above | @below] {{text}}`: a diagnostic of that severity
whose message contains `text`, on the comment's own line, N lines below or above it, or on the nearest line
above or below that is not itself only such a comment. Every diagnostic must be expected and every expectation
met; each failure is one located line (`unexpected error: ...`, `expected error "..." was not produced`). rpegc
reports errors only, so an expected warning, note or remark always fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rpegc.core.ir.errors import Loc, RpegError

SEVERITIES = ("error", "warning", "note", "remark")
_EXPECT = re.compile(r"expected-(error|warning|note|remark)(?:\s*@(\+\d+|-\d+|above|below))?\s*\{\{(.*?)\}\}")
_ONLY_EXPECTATIONS = re.compile(r"^\s*//(\s*expected-(error|warning|note|remark)[^/]*)+\s*$")


@dataclass(frozen=True)
class Expected:
    severity: str
    line: int  # where the diagnostic must be
    text: str
    at: Loc  # the comment that expects it


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    loc: Loc
    message: str


def expectations(source: str, file: str) -> list[Expected]:
    """The expectations written in `source` (lines numbered from 1; a split-input chunk keeps the file's)."""
    lines = source.splitlines()
    out = []
    for no, line in enumerate(lines, start=1):
        comment = line.find("//")
        if comment < 0:
            continue
        for m in _EXPECT.finditer(line, comment):
            severity, where, text = m.groups()
            out.append(Expected(severity, _target(lines, no, where), text, Loc(file, no, m.start() + 1)))
    return out


def _target(lines: list[str], no: int, where: str | None) -> int:
    if where is None:
        return no
    if where in ("above", "below"):
        step = -1 if where == "above" else 1
        i = no + step
        while 1 <= i <= len(lines) and _ONLY_EXPECTATIONS.match(lines[i - 1]):
            i += step
        return i
    return no + int(where)


def diagnostics(err: RpegError) -> list[Diagnostic]:
    return [Diagnostic("error", e.loc, e.message) for e in getattr(err, "errors", [err])]


def verify(found: list[Diagnostic], expected: list[Expected], file: str) -> list[str]:
    """The failures, one line each: diagnostics nobody expected, then expectations nothing met."""
    left = list(expected)
    failures = []
    for d in found:
        match = next((x for x in left if x.severity == d.severity and x.line == d.loc.line and x.text in d.message),
                     None)
        if match is None:
            where = d.loc if d.loc.line > 0 else Loc(file, 0, 0)
            failures.append(f"{where}: error: unexpected {d.severity}: {d.message}")
        else:
            left.remove(match)
    for x in left:
        failures.append(f"{x.at}: error: expected {x.severity} \"{x.text}\" was not produced (on line {x.line})")
    return failures
