"""Every placement of the shipped example plans is a member of its vertex's candidate directory."""

from __future__ import annotations

import pathlib

import pytest

from rpegc.core.check.candidates import enumerate_candidates
from rpegc.syntax.parser import parse

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.rpeg"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_placements_are_candidates(path):
    p = parse(path.read_text(), str(path))
    assert p.plan is not None
    directories = {}
    for pl in p.plan.placements:
        model = p.model(p.graph.vertex(pl.vertex).model)
        if model.name not in directories:
            directories[model.name] = set(enumerate_candidates(model, p.workload, p.cluster))
        assert (pl.alloc, pl.strategy) in directories[model.name], pl.vertex
