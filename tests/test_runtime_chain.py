"""Chained dispatch (runtime/controller.py, "plan" policy): a node whose unfinished predecessors are already
handed to the backend is offered early, `Backend.chain` decides. On the sim backend, which has no control
delay to save, a chained run has exactly the starts and finishes of an unchained one and verifies; every
node is handed over once; at most `lookahead` nodes wait ahead of a chained one; nothing is chained under
"alg2" or with lookahead 0; a bad lookahead is a located error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.sim import SimBackend
from rpegc.runtime.controller import RunOptions, run
from rpegc.runtime.plan import build_run_plan
from rpegc.runtime.verify import verify
from fixtures.runtime_plans import colocated_plan, disaggregated_plan, scheduled

PLANS = {
    "colocated": lambda: scheduled(colocated_plan(0), 3),
    "disaggregated": lambda: scheduled(disaggregated_plan(1, quantiles=True), 3),
    "zero-time-transfers": lambda: scheduled(disaggregated_plan(1, quantiles=True), 3, zero_every=3),
}
RUN_PLANS = {name: build_run_plan(make()) for name, make in PLANS.items()}


class Recording(SimBackend):
    """A sim backend that records how each node was handed over: submitted, or chained behind which nodes,
    and how many nodes then waited ahead of it (what the controller's lookahead bounds)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.submitted: list[str] = []
        self.after: dict[str, tuple[str, ...]] = {}
        self.depths: list[int] = []

    def _start(self, d):
        self.submitted.append(d.id)
        super()._start(d)

    def chain(self, d, after):
        depth = 1 + max((self.depth(a) for a in after if a in self._finish), default=0)
        self.depths.append(depth)
        self.after[d.id] = after
        return super().chain(d, after)

    def depth(self, node: str) -> int:
        """0 for a node whose predecessors all finished when it was handed over or since; else one more than
        the deepest of the predecessors it was chained behind that are still unfinished."""
        if node not in self.after:
            return 0
        return 1 + max((self.depth(a) for a in self.after[node] if a in self._finish), default=-1)

    run_op = transfer = reshard = _start


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(PLANS)), jitter=st.sampled_from([0.0, 0.3, 0.6]), seed=st.integers(0, 50),
       lookahead=st.integers(1, 3))
def test_a_chained_run_has_the_times_of_an_unchained_one(name, jitter, seed, lookahead):
    plan = RUN_PLANS[name]
    plain = run(plan, SimBackend(jitter=jitter, seed=seed), RunOptions(policy="plan", lookahead=0))
    backend = Recording(jitter=jitter, seed=seed)
    chained = run(plan, backend, RunOptions(policy="plan", lookahead=lookahead))
    for node, rec in plain.trace.nodes.items():
        got = chained.trace.nodes[node]
        assert (got.start, got.finish) == (rec.start, rec.finish), node
    assert verify(plan, chained.trace) == []
    assert sorted(backend.submitted + list(backend.after)) == sorted(n.id for n in plan.nodes)  # each once
    assert backend.after, "nothing was chained"
    assert max(backend.depths) <= lookahead
    recs = chained.trace.nodes
    assert all(recs[n].dispatch == recs[n].start for n in backend.submitted)  # submitted: started at once
    assert any(recs[n].dispatch < recs[n].start for n in backend.after)  # chained: waited in the queue


def test_the_lookahead_is_used_up_to_its_bound():
    backend = Recording()
    run(RUN_PLANS["colocated"], backend, RunOptions(policy="plan", lookahead=3))
    assert max(backend.depths) == 3


@pytest.mark.parametrize("options", [RunOptions(policy="alg2"), RunOptions(policy="plan", lookahead=0)],
                         ids=["alg2", "lookahead-0"])
def test_nothing_is_chained_under_alg2_or_without_lookahead(options):
    backend = Recording()
    result = run(RUN_PLANS["disaggregated"], backend, options)
    assert backend.after == {}
    assert all(r.dispatch == r.start for r in result.trace.nodes.values())


class Refusing(Recording):
    def chain(self, d, after):
        self.asked = getattr(self, "asked", 0) + 1
        return False


def test_a_node_the_backend_refuses_to_chain_is_dispatched_when_ready():
    plan = RUN_PLANS["disaggregated"]
    backend = Refusing()
    result = run(plan, backend, RunOptions(policy="plan"))
    assert backend.asked > 0
    assert sorted(backend.submitted) == sorted(n.id for n in plan.nodes)
    assert verify(plan, result.trace) == []


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_lookahead_is_an_error(bad):
    with pytest.raises(RpegError, match="lookahead"):
        run(RUN_PLANS["colocated"], SimBackend(), RunOptions(lookahead=bad))
