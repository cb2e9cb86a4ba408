"""Where a TOML document says something: positions for located errors (hardware profiles, RL configs).

`tomllib` parses without positions; these find the line of a decode error and of a dotted key so a bad
value is reported at `file:line:col`.
"""

from __future__ import annotations

import re
import tomllib


def decode_error_position(err: tomllib.TOMLDecodeError) -> tuple[int | None, int | None]:
    line = getattr(err, "lineno", None)  # Python >= 3.14
    if line:
        return int(line), getattr(err, "colno", None)
    match = re.search(r"\(at line (\d+), column (\d+)", str(err))
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def key_position(text: str, dotted: str) -> tuple[int | None, int | None]:
    """1-based (line, column) defining `dotted` (e.g. 'collective.intra_node.beta'), else of its table header."""
    table, _, leaf = dotted.rpartition(".")
    current = ""
    header: tuple[int | None, int | None] = (None, None)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0]
        indent = len(line) - len(line.lstrip())
        line = line.strip()
        found = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
        if found:
            current = re.sub(r"\s*\.\s*", ".", found.group(1))
            if (current == dotted or current == table) and header[0] is None:
                header = (number, indent + 1)
            continue
        if current == table and re.match(rf"{re.escape(leaf)}\s*=", line):
            return number, indent + 1
        if current == "" and table and re.match(rf"{re.escape(dotted)}\s*=", line):
            return number, indent + 1
        if current == "" and not table and re.match(rf"{re.escape(dotted)}\s*=", line):
            return number, indent + 1
    return header
