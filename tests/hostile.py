"""Shared pieces of the hostile-input tests: seeded byte-level mutators (deleted, duplicated and truncated
lines, swapped tokens, wrong numbers, stray bytes with invalid UTF-8, cut spans; deterministic for a seed)
and a guarded in-process call of a command's `main` that turns a hang into an outcome."""

from __future__ import annotations

import random
import re
import signal
from typing import Callable, Sequence

TOKEN = re.compile(rb"@[A-Za-z_][\w#.]*|%[A-Za-z_]\w*|\d+|[A-Za-z_][\w.]*|[{}()\[\],=]")
NUMBER = re.compile(rb"\d+")
WRONG_NUMBERS = (b"0", b"-1", b"3", b"7", b"65", b"2", b"1.5", b"999999999999999999999")
STRAY = (b"\xff", b"\xfe\xff", b"\xc3", b"\x00", b"{", b"}", b"(", b"@", b"%", b"//", b"\"", b"->", b"\t", b"\r")


def _delete_line(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def _duplicate_line(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    lines.insert(i, lines[i])
    return b"\n".join(lines)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _swap_tokens(rng: random.Random, data: bytes) -> bytes:
    tokens = list(TOKEN.finditer(data))
    if len(tokens) < 2:
        return data
    a, b = sorted(rng.sample(tokens, 2), key=lambda m: m.start())
    if a.end() > b.start():
        return data
    return data[: a.start()] + b.group() + data[a.end() : b.start()] + a.group() + data[b.end() :]


def _wrong_number(rng: random.Random, data: bytes) -> bytes:
    numbers = list(NUMBER.finditer(data))
    if not numbers:
        return data
    m = rng.choice(numbers)
    return data[: m.start()] + rng.choice(WRONG_NUMBERS) + data[m.end() :]


def _stray_bytes(rng: random.Random, data: bytes) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.choice(STRAY) + data[i:]


def _cut_span(rng: random.Random, data: bytes) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + data[i + rng.randrange(1, 30) :]


MUTATIONS = (_delete_line, _duplicate_line, _truncate, _swap_tokens, _wrong_number, _stray_bytes, _cut_span)


def mutants(count: int, seed: int, sources: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """`count` (description, bytes) pairs, each one to three mutations of one source; deterministic."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        name, data = rng.choice(sources)
        applied = []
        for _ in range(rng.randrange(1, 4)):
            if not data:
                break
            mutation = rng.choice(MUTATIONS)
            data = mutation(rng, data)
            applied.append(mutation.__name__.lstrip("_"))
        out.append((f"case {i}: {name} with {', '.join(applied)}", data))
    return out


class _Hang(BaseException):
    """Raised by the alarm; a BaseException so that a command's `except Exception` cannot swallow it."""


def _on_alarm(signum, frame):
    raise _Hang()


def call_guarded(main: Callable[[list[str]], int], argv: list[str], seconds: int) -> object:
    """main(argv) with a wall-clock limit: its exit code, 'hang', or 'raised X' for an exception that escaped
    main (a user would see its traceback). SIGALRM, so main thread only."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(seconds)
    try:
        return main(argv)
    except _Hang:
        return "hang"
    except Exception as err:
        return f"raised {type(err).__name__}: {err}"[:300]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
