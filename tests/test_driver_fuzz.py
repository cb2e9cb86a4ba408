"""Fuzzing the `rpegc` driver with mutated examples (DESIGN.md Section 4: bad input never gives a traceback).

Hundreds of seeded mutations of the shipped examples (deleted, duplicated and truncated lines, swapped
tokens, wrong numbers, stray bytes including invalid UTF-8) go through `rpegc -p verify-wellformed`
in-process. Each run must either succeed (exit 0) or fail as a user error: exit 1 with a first stderr line
`<file>:<line>:<col>: error: ...`. Exit 2 ("internal error") is a bug in rpegc, and so is a run that takes
longer than HANG_SECONDS. The input file is never modified.
"""

from __future__ import annotations

import hashlib
import pathlib
import random
import re
import signal

import pytest

from rpegc.cli import main

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.rpeg"))
CASES = 300
SEED = 20240611
HANG_SECONDS = 20  # generous: the CI machine is shared; a correct run takes milliseconds
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


def mutants(count: int, seed: int) -> list[tuple[str, bytes]]:
    """`count` (description, bytes) pairs, each one to three mutations of one example; deterministic."""
    rng = random.Random(seed)
    sources = [(p.name, p.read_bytes()) for p in EXAMPLES]
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
    """Raised by the alarm; a BaseException so that the driver's `except Exception` cannot swallow it."""


def _on_alarm(signum, frame):
    raise _Hang()


def run_driver(argv: list[str], capsys) -> tuple[object, str, str]:
    """main(argv) with a wall-clock limit; returns (exit code or 'hang', stdout, stderr)."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(HANG_SECONDS)
    try:
        code: object = main(argv)
    except _Hang:
        code = "hang"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_mutants_are_deterministic_and_varied():
    first, again = mutants(40, SEED), mutants(40, SEED)
    assert first == again
    assert len({data for _, data in first}) == 40
    used = {m for what, _ in mutants(CASES, SEED) for m in what.split(" with ")[1].split(", ")}
    assert used == {m.__name__.lstrip("_") for m in MUTATIONS}


def test_mutated_examples_give_located_errors_never_crashes(tmp_path, capsys):
    failures = []
    outcomes = {0: 0, 1: 0}
    for i, (what, data) in enumerate(mutants(CASES, SEED)):
        path = tmp_path / f"m{i}.rpeg"
        path.write_bytes(data)
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        code, _out, err = run_driver([str(path), "-p", "verify-wellformed"], capsys)
        first = err.splitlines()[0] if err else ""
        if hashlib.sha256(path.read_bytes()).hexdigest() != before:
            failures.append(f"{what}: the input file was modified")
        if code == 0:
            outcomes[0] += 1
        elif code == 1 and re.match(re.escape(str(path)) + r":\d+:\d+: error: \S", first):
            outcomes[1] += 1
        else:
            failures.append(f"{what}: exit {code!r}, stderr {err[:300]!r}\n--- input ---\n{data.decode('utf-8', 'replace')}")
    assert not failures, f"{len(failures)} of {CASES} mutants broke the driver:\n\n" + "\n\n".join(failures[:5])
    # The fuzzer must exercise both outcomes, or it tests nothing.
    assert outcomes[0] >= 5 and outcomes[1] >= CASES // 2, outcomes


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_unmutated_examples_pass(example, capsys):
    code, out, err = run_driver([str(example), "-p", "verify-wellformed"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("rpeg.workload")
