"""The version line every rpegc tool prints for `--version`: the tool, rpegc's version and the versions of what
it runs on (xDSL, torch, Python), read from the installed packages' metadata without importing them."""

from __future__ import annotations

import argparse
import platform
from importlib.metadata import PackageNotFoundError, version

from rpegc import __version__

REPORTED = ("xdsl", "torch", "megatron-core")


def installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def version_line(tool: str) -> str:
    """E.g. `rpegc 0.1.0 (xdsl 0.74.0, torch 2.13.0, megatron-core 0.16.1, python 3.11.7)`."""
    parts = [f"{p} {installed(p)}" for p in REPORTED] + [f"python {platform.python_version()}"]
    return f"{tool} {__version__} ({', '.join(parts)})"


class PrintVersion(argparse.Action):
    """`--version` of an argparse tool: the version line, unwrapped, then exit 0 (argparse's own action wraps
    it to the terminal's width)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help="print the "
                 "versions of rpegc and of what it runs on, then exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line(parser.prog.split()[0]))
        parser.exit()
