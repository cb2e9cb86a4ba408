"""The shipped examples are well-formed with legal plans, and errors in edited copies point at the right line."""

from __future__ import annotations

import pathlib

import pytest

from rpegc.core.check.plan_rules import check_plan
from rpegc.core.check.wellformed import check_graph, topological_order
from rpegc.syntax.parser import parse

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.rpeg"))
PPO = pathlib.Path(__file__).parent.parent / "examples" / "ppo.rpeg"


def line_of(text: str, fragment: str) -> int:
    (n,) = [i for i, line in enumerate(text.splitlines(), 1) if fragment in line]
    return n


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"ppo.rpeg", "grpo.rpeg", "dpo.rpeg", "ppo-ac-shared.rpeg"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_wellformed_and_its_plan_legal(path):
    p = parse(path.read_text(), str(path))
    assert check_graph(p) == []
    assert check_plan(p) == []
    assert sorted(topological_order(p.graph)) == sorted(v.name for v in p.graph.vertices)


def test_missing_publication_edge_points_at_the_reader():
    text = PPO.read_text()
    edited = text.replace("  rpeg.publish @train_critic -> @critic_inf (%W_critic)\n", "")
    (err,) = check_graph(parse(edited, "ppo.rpeg"))
    assert err.loc.line == line_of(edited, "rpeg.vertex @critic_inf")
    assert "add 'rpeg.publish @train_critic -> @critic_inf (%W_critic)'" in err.message


def test_illegal_microbatch_points_at_the_placement():
    text = PPO.read_text()
    line = next(s for s in text.splitlines() if s.strip().startswith("@train_actor"))
    assert line.endswith("mb = 8")
    edited = text.replace(line, line[: -len("mb = 8")] + "mb = 3")
    (err,) = check_plan(parse(edited, "ppo.rpeg"))
    assert err.loc.line == line_of(edited, "@train_actor  at")
    assert err.message.startswith("@train_actor: P5: mb = 3 does not divide the local batch B*R/dp = 128")


def test_data_cycle_points_at_its_first_edge():
    text = PPO.read_text()
    edited = text.replace(
        "  rpeg.publish @train_actor -> @gen (%W_actor)\n",
        "  rpeg.publish @train_actor -> @gen (%W_actor)\n  rpeg.data @train_critic -> @ref_inf (%v)\n",
    ).replace("reads(%W_ref, %Y)", "reads(%W_ref, %Y, %v)").replace(
        "writes(%W_critic)", "writes(%W_critic, %v)")
    errors = check_graph(parse(edited, "ppo.rpeg"))
    cycles = [e for e in errors if "form a cycle" in e.message]
    assert len(cycles) == 1
    assert cycles[0].loc.line == line_of(edited, "rpeg.data @ref_inf -> @train_critic")
    assert "cycle @ref_inf -> @train_critic -> @ref_inf" in cycles[0].message
