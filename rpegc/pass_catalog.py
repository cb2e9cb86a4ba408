"""What `rpegc --list-passes` prints: every pass of the multiverse that rpegc's registry (or a plugin) adds,
with the one-line summary and paper section of its module docstring and its options, each with type, default
and meaning, read from the pass dataclass (rpegc/core/ir/options.py). xDSL's own passes only with `--all-passes`."""

from __future__ import annotations

import sys
import textwrap
import typing
from dataclasses import MISSING, fields

from rpegc.core.ir.options import option_help
from rpegc.registry import PASSES as RPEGC_PASSES


def summary_line(cls: type) -> str:
    """The first sentence of the pass module's docstring, after the `name:` it starts with."""
    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip()
    first = " ".join(doc.split("\n\n")[0].split())
    head, sep, rest = first.partition(": ")
    return rest if sep and head.split("{")[0] == getattr(cls, "name", head) else first


def _type_name(cls: type, name: str) -> str:
    try:
        hint = typing.get_type_hints(cls)[name]
    except Exception:  # a plugin's annotation that does not resolve: show it as written
        return str(next(f.type for f in fields(cls) if f.name == name))
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return text or str(hint).replace("typing.", "")


def _default(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(x) for x in value) or '""'
    if isinstance(value, str):
        return f'"{value}"' if not value or not value.replace("_", "").replace("-", "").isalnum() else value
    return str(value)


WIDTH = 110


def _declared_at(cls: type, name: str) -> int:
    """How far up the class hierarchy the field `name` is declared (0: by `cls` itself)."""
    return next(i for i, c in enumerate(cls.__mro__) if name in c.__dict__.get("__annotations__", {}))


def _wrapped(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * indent)


def describe(name: str, cls: type) -> list[str]:
    """The pass's name, summary and options; its own options before those it inherits (e.g. the cost model's)."""
    lines = [name, *_wrapped(summary_line(cls), 4)]
    for f in sorted(fields(cls), key=lambda f: _declared_at(cls, f.name)):
        default = "" if f.default is MISSING else f" = {_default(f.default)}"
        lines.append(f"    {f.name}: {_type_name(cls, f.name)}{default}")
        lines += _wrapped(option_help(f), 8)
    return lines


def list_passes(available: dict, everything: bool = False) -> str:
    """The catalogue of `available` (name -> factory of the pass class): rpegc's passes in pipeline order, then
    any other plugin's; xDSL's own passes (`xdsl.transforms`, `xdsl.backend`, ...) only with `everything`."""
    ours = [n for n in RPEGC_PASSES if n in available]
    others = sorted(n for n in available if n not in RPEGC_PASSES)
    plugins, xdsl = [], []
    for n in others:
        cls = available[n]()
        (xdsl if cls.__module__.startswith("xdsl.") else plugins).append((n, cls))
    out = ["rpegc passes (-p 'a,b{opt=value ...}'):", ""]
    for n in ours:
        out += describe(n, available[n]()) + [""]
    if plugins:
        out += ["passes of other packages:", ""]
        for n, cls in plugins:
            out += describe(n, cls) + [""]
    if everything:
        out += [f"xDSL's own passes ({len(xdsl)}):", *_wrapped(", ".join(n for n, _ in xdsl), 4), ""]
    else:
        out.append(f"(and {len(xdsl)} passes of xDSL itself: --list-passes --all-passes)")
    return "\n".join(out).rstrip() + "\n"
