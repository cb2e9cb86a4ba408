"""Parsing and verification stay near-linear in the input size, and errors print a bounded excerpt.

No wall-clock time is asserted (bench/parse_scaling.py measures it): the tests check the structure that makes
the work linear — lookups by name are indexed, the garbage collector does not rescan the growing parse tree,
"did you mean" compares with a bounded number of names, an error renders the source once — and that a huge
one-line input yields a short error."""

from __future__ import annotations

import gc

import pytest

from fixtures.programs import ACTOR_GRAPH
from rpegc.core.ir.errors import EXCERPT_WIDTH, Loc, RpegError, RpegErrors, excerpt, render
from rpegc.core.ir.program import Container, Graph
from rpegc.syntax import parser
from rpegc.syntax.parser import parse
from fixtures.spies import CountingTuple, spy_close_matches


def with_unused_containers(n: int) -> str:
    extra = "".join(f"  %u{i} = rpeg.container tokens[B, Lp]\n" for i in range(n))
    head, tail = ACTOR_GRAPH.split("  %X =", 1)
    return head + extra + "  %X =" + tail


def test_parse_of_n_and_4n_containers_completes_with_every_container():
    for n in (250, 1000):
        p = parse(with_unused_containers(n))
        assert len(p.graph.containers) == n + 3
        assert p.graph.container(f"u{n - 1}").name == f"u{n - 1}"


def test_parse_does_not_run_the_cycle_collector():
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    text = with_unused_containers(2000)  # some 100k objects: dozens of collections with the collector on
    gc.callbacks.append(count)
    try:
        parse(text)
    finally:
        gc.callbacks.remove(count)
    # At most the one young collection when the collector is switched back on: it scans the new objects once.
    assert len(collections) <= 1
    assert gc.isenabled()


def test_graph_lookups_by_name_are_indexed():
    containers = CountingTuple(Container(f"c{i}", "tokens") for i in range(1000))
    g = Graph("g", containers, (), (), (), (), ())
    CountingTuple.iterations = 0
    for i in range(1000):
        assert g.container(f"c{i}").name == f"c{i}"
    assert CountingTuple.iterations == 1  # one pass builds the index, not one per lookup
    with pytest.raises(KeyError):
        g.container("missing")


def test_did_you_mean_compares_with_a_bounded_number_of_names(monkeypatch):
    seen = spy_close_matches(monkeypatch, parser)
    names = [f"u{i}" for i in range(20000)]
    assert parser._close("u1999x", names, "%") == " (did you mean %u1999?)"
    assert parser._close("a_very_long_name_nobody_declared", names) == ""
    assert max(seen) <= parser._MAX_SUGGESTION_CANDIDATES


def test_excerpt_of_a_long_line_keeps_the_caret_under_the_column():
    line = "x" * 5000 + "HERE" + "y" * 5000
    text, col = excerpt(line, 5001)
    assert len(text) <= EXCERPT_WIDTH + 6 and text.startswith("...") and text.endswith("...")
    assert text[col - 1:col + 3] == "HERE"
    assert excerpt("short line", 3) == ("short line", 3)
    head, col = excerpt(line, 1)
    assert col == 1 and head.endswith("...") and not head.startswith("...")
    tail, col = excerpt(line, len(line) + 1)  # one past the end (an error at end of input)
    assert tail.startswith("...") and col == len(tail) + 1


def test_error_on_a_megabyte_line_prints_a_bounded_excerpt():
    text = "rpeg.workload {" + ", ".join(["B = 1"] * 20000) + "}\n"
    with pytest.raises(RpegError) as info:
        parse(text, "dup.rpeg")
    out = render(info.value, text)
    assert out.splitlines()[0] == "dup.rpeg:1:23: error: attribute 'B' is given twice in rpeg.workload; keep one"
    source_line, caret = out.splitlines()[1:]
    assert len(source_line) <= EXCERPT_WIDTH + 6 and source_line.endswith("...")
    assert source_line[len(caret) - 1:len(caret) + 5] == "B = 1,"


def test_render_splits_the_source_once_for_many_errors():
    class Source(str):
        splits = 0

        def splitlines(self, *args):
            Source.splits += 1
            return super().splitlines(*args)

    source = Source("line one\nline two\n")
    errors = RpegErrors([RpegError(Loc("f", 1 + i % 2, 1), f"e{i}") for i in range(500)])
    assert render(errors, source).count("error:") == 500
    assert Source.splits == 1


def test_many_unknown_references_get_a_bounded_number_of_hints(monkeypatch):
    calls = spy_close_matches(monkeypatch, parser)
    n = 1000
    text = with_unused_containers(n).replace("  rpeg.input %X\n", "  rpeg.input %X\n" + "".join(
        f"  rpeg.output %zz{i}\n" for i in range(n)))
    with pytest.raises(RpegErrors) as info:
        parse(text, "refs.rpeg")
    unknown = [e for e in info.value.errors if "unknown container %zz" in e.message]
    assert len(unknown) == n
    assert len(calls) == parser._MAX_HINTS and max(calls) <= parser._MAX_SUGGESTION_CANDIDATES
