"""A backend's rpeg-run options declared once: each is a field of the backend's options dataclass carrying its help
and how it is spelled on the command line (`cli_option`), and `add_declared_options` makes the argparse options
from the fields, so the flag, its default, its choices and its help cannot disagree with the dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Optional, Sequence

from rpegc.core.ir.options import HELP

CLI = "cli"  # the field metadata key of what argparse needs beyond the help


def cli_option(default: Any, help: str, *, metavar: Optional[str] = None, choices: Optional[Sequence[str]] = None,
               repeat: bool = False, cli: bool = True) -> Any:
    """A backend option: `--name-with-dashes` for the field `name_with_dashes`, its type from the default (a
    bool is a flag that sets it), `repeat`: each use appends a value; `cli=False`: a field rpeg-run fills itself
    (the seed)."""
    extra = {"metavar": metavar, "choices": tuple(choices) if choices is not None else None, "repeat": repeat,
             "cli": cli}
    return dataclasses.field(default=default, metadata={HELP: help, CLI: extra})


def add_declared_options(group: argparse._ArgumentGroup, options: type) -> None:
    """One argparse option per field of `options` declared with `cli_option`, in declaration order."""
    hints = {f.name: f for f in dataclasses.fields(options)}
    for f in hints.values():
        extra = f.metadata.get(CLI)
        if extra is None or not extra["cli"]:
            continue
        flag = "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {"help": f.metadata[HELP], "dest": f.name, "default": f.default}
        if isinstance(f.default, bool):
            kw["action"] = "store_true"
        else:
            kw["action"] = "append" if extra["repeat"] else "store"
            if extra["metavar"]:
                kw["metavar"] = extra["metavar"]
            if extra["choices"]:
                kw["choices"] = extra["choices"]
            elif not extra["repeat"]:
                kw["type"] = _value_type(options, f.name)
        group.add_argument(flag, **kw)


def _value_type(options: type, name: str):
    """The argparse type of a field: its annotation's int or float (Optional[...] unwrapped), else str."""
    hint = typing.get_type_hints(options)[name]
    kinds = typing.get_args(hint) or (hint,)
    return next((t for t in (int, float) if t in kinds), str)
