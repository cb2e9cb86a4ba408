"""The PPO and GRPO graphs of App. A-D (tests/fixtures/ppo_source.py) are well-formed, their plans legal, and
the topological order follows data edges, then declaration order."""

from __future__ import annotations


from rpegc.core.check.plan_rules import check_plan
from rpegc.core.check.wellformed import check_graph, topological_order
from fixtures.ppo_source import grpo_program, ppo_program


# --- tests -------------------------------------------------------------------------------------


def test_ppo_and_grpo_are_wellformed_and_their_plans_legal():
    for p in (ppo_program(), grpo_program()):
        assert check_graph(p) == []
        assert check_plan(p) == []


def test_ppo_topological_order_follows_data_edges_then_declaration_order():
    assert topological_order(ppo_program().graph) == [
        "gen", "ref_inf", "reward_inf", "critic_inf", "train_actor", "train_critic"
    ]
    assert topological_order(grpo_program().graph) == ["gen", "ref_inf", "reward_inf", "train_actor"]


def test_publication_edges_do_not_constrain_the_topological_order():
    # train_actor -> gen is a publication edge (next step), so gen still comes first.
    order = topological_order(ppo_program().graph)
    assert order.index("gen") < order.index("train_actor")
