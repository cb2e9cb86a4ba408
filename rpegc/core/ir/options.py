"""Options documented where they are declared: `option(default, help)` is a dataclass field that carries its
meaning, which `rpegc --list-passes` prints beside the option's name, type and default (rpegc/pass_catalog.py).
Pass options and the cost model's switches are declared this way."""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any

HELP = "help"


def option(default: Any, help: str) -> Any:
    return field(default=default, metadata={HELP: help})


def option_help(f: Field) -> str:
    return f.metadata.get(HELP, "")


def required(help: str) -> Any:
    """A documented field without a default."""
    return field(metadata={HELP: help})


def same_as(declared: Field) -> Any:
    """A field with the default and help of an option declared elsewhere (a pass that spells another dataclass's
    options as its own)."""
    return option(declared.default, option_help(declared))
