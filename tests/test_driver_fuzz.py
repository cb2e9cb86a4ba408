"""Fuzzing the `rpegc` driver with mutated examples (docs/architecture.md, IR: bad input never gives a traceback).

Hundreds of seeded mutations of the shipped examples (deleted, duplicated and truncated lines, swapped
tokens, wrong numbers, stray bytes including invalid UTF-8) go through `rpegc -p verify-wellformed`
in-process. Each run must either succeed (exit 0) or fail as a user error: exit 1 with a first stderr line
`<file>:<line>:<col>: error: ...`. Exit 2 ("internal error") is a bug in rpegc, and so is a run that takes
longer than HANG_SECONDS. The input file is never modified.
"""

from __future__ import annotations

import hashlib
import pathlib
import re

import pytest

from fixtures.hostile import MUTATIONS, call_guarded, mutants as _mutants
from rpegc.cli import main

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.rpeg"))
CASES = 300
SEED = 20240611
HANG_SECONDS = 10  # the bound; a correct run takes milliseconds


def mutants(count: int, seed: int) -> list[tuple[str, bytes]]:
    return _mutants(count, seed, [(p.name, p.read_bytes()) for p in EXAMPLES])


def run_driver(argv: list[str], capsys) -> tuple[object, str, str]:
    """rpegc's main(argv) with a wall-clock limit; returns (exit code or 'hang', stdout, stderr)."""
    code = call_guarded(main, argv, HANG_SECONDS)
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
