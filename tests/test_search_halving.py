"""Successive halving over the structural variants (search/halving.py): the rung sizes, exact shares of an
evaluation budget, and that the budget follows promise — the variants that found the better plans get more."""

from __future__ import annotations

from pathlib import Path

from rpegc.search.halving import rung_sizes, shares
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_rungs_halve_down_to_the_last_size():
    assert rung_sizes(6) == [6, 3, 2]
    assert rung_sizes(6, last=1) == [6, 3, 2, 1]
    assert rung_sizes(4) == [4, 2] and rung_sizes(2) == [2] and rung_sizes(1) == [1]
    assert rung_sizes(9) == [9, 5, 3, 2]


def test_shares_add_up_and_differ_by_at_most_one():
    for total, k in [(10, 3), (0, 4), (7, 7), (1000, 6)]:
        parts = shares(total, k)
        assert sum(parts) == total and len(parts) == k and max(parts) - min(parts) <= 1


def test_the_budget_follows_promise_and_is_spent_exactly():
    p = parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")
    r = optimize(p, OptimizeOptions(budget_s=0, evals=2000, steps=2, seed=0, jobs=1))
    assert r.stats.evaluations == 2000  # the annealing and the polish together
    assert 0 < r.polish_evaluations <= 2000
    spent = {v.label: v.evaluations for v in r.variant_stats}
    assert len(spent) == 6 and min(spent.values()) > 0  # every variant had its first share
    ranked = sorted(r.variant_stats, key=lambda v: -(v.best.score if v.best else 0.0))
    # the two most promising variants reach the last rung: each gets more than any variant dropped first
    assert min(spent[v.label] for v in ranked[:2]) > max(spent[v.label] for v in ranked[3:])
    assert r.variant.label() in {v.label for v in ranked[:2]}
