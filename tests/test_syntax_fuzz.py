"""Mutation fuzzing of the reader: damaged examples either parse or fail with a located RpegError.

Mutations: delete, duplicate and swap lines, truncate, swap @symbols / %containers, change numbers,
insert stray bytes. A fixed seed keeps the run reproducible; any other exception fails the test.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Program
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.rpeg"))
STRAY = ["\x00", "{", "}", "(", ")", "[", "]", ",", "=", "->", "@", "%", '"', "\\", "#", "-", ".", "1e", "é", "\t",
         "// ", "rpeg.", "exec.op", "\n", "@\"", "%\"\\u12", "9" * 30, "inf", "lowered"]
SYMBOL = re.compile(r"[@%][A-Za-z_][A-Za-z0-9_.#]*")
NUMBER = re.compile(r"\b\d+(\.\d+)?\b")
# An exec stage too, so that the mutations also reach exec.* statements.
EXEC_TAIL = """exec.graph @ppo steps = 1 lowered {
  exec.op @gen#0 generation @actor step 0 order 0 at (0, 0, 0) extent (1, 1, 4) dp = 2 pp = 1 tp = 2 mb = 1 reads {@actor = 0}
  exec.op @ref_inf#0.q1 inference @ref step 0 order 1 phase 1 of 2 fraction 0.5 {time = 1.5, start = 0.0}
  exec.comm @c0 step 0 order 1 (%Y) from (0, 0, 0) extent (1, 1, 4) to (0, 1, 0) extent (1, 1, 4) bytes = 81920
  exec.reshard @r0 step 0 order 4 @actor version 1 at (0, 0, 0) extent (1, 2, 4) from (dp = 2, pp = 2, tp = 2, mb = 8) to (dp = 2, pp = 1, tp = 2, mb = 1) bytes = 10
  exec.data @gen#0 -> @ref_inf#0.q1 (%Y)
  exec.dep @gen#0 -> @c0
  exec.memory {m_eff = 8.6e10, r_peak = 0.71, feasible = true}
  exec.device 0 {peak = 1.0, persistent = 0.5, transient = 0.5}
  exec.schedule {makespan = 12.5, score = 1.2e5, score_pen = 1.2e5, util = 0.61, p_eff = 3.2}
}
"""


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    kind = rng.randrange(7)
    if kind == 0 and lines:  # delete a line
        del lines[rng.randrange(len(lines))]
    elif kind == 1 and lines:  # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
    elif kind == 2 and len(lines) > 1:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == 3:  # truncate anywhere
        return text[: rng.randrange(len(text) + 1)]
    elif kind == 4:  # swap two symbols
        found = [m for m in SYMBOL.finditer(text)]
        if len(found) >= 2:
            a, b = rng.sample(found, 2)
            if a.start() > b.start():
                a, b = b, a
            return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]
    elif kind == 5:  # change a number
        found = [m for m in NUMBER.finditer(text)]
        if found:
            m = rng.choice(found)
            new = rng.choice(["0", "-1", "3", "7", "64", "1.5", "100000", "-0.0", "2e9"])
            return text[: m.start()] + new + text[m.end() :]
    else:  # insert stray bytes
        pos = rng.randrange(len(text) + 1)
        return text[:pos] + rng.choice(STRAY) + text[pos:]
    return "".join(lines)


def test_mutated_examples_parse_or_fail_with_a_location():
    rng = random.Random(20260)
    sources = [p.read_text() for p in EXAMPLES]
    sources.append(sources[EXAMPLES.index(next(p for p in EXAMPLES if p.name == "ppo-8gpu.rpeg"))] + EXEC_TAIL)
    assert parse(sources[-1]).exec is not None  # the exec tail itself is valid
    outcomes = {"parsed": 0, "error": 0}
    for i in range(320):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 3)):
            text = mutate(text, rng)
        try:
            result = parse(text, "fuzz.rpeg")
        except RpegError as err:
            for e in getattr(err, "errors", [err]):
                assert e.loc.file == "fuzz.rpeg" and e.loc.line >= 1 and e.loc.col >= 1, (i, str(e))
                assert e.message, i
            outcomes["error"] += 1
        else:
            assert isinstance(result, Program)
            assert parse(print_program(result)) == result  # whatever parses also round-trips
            outcomes["parsed"] += 1
    # Both outcomes occur, so the mutations neither all break nor all miss the syntax.
    assert outcomes["parsed"] > 20 and outcomes["error"] > 100, outcomes


ALPHABET = st.sampled_from(list("{}()[],=-><@%#.\"\\/ \n\t0123456789eBRLpr_") + ["rpeg.", "exec.", "inf", "x"])


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(ALPHABET, max_size=60).map("".join)))
def test_random_text_never_escapes_as_another_exception(text):
    try:
        parse(text, "rand.rpeg")
    except RpegError as err:
        assert all(e.loc.line >= 1 and e.loc.col >= 1 for e in getattr(err, "errors", [err]))
