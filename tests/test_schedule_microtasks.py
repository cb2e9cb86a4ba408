"""The microtask schedule of fused training operators (rpegc/core/sched/microtasks.py; issue 34, item 3): its
makespan against an independent longest-path computation over the same precedence graph, 1F1B's closed form for one
member, and the properties every fused order keeps (each microtask once, 1F1B's live bound, never slower than the
members one after another, never faster than a stage's work)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.sched.microtasks import (
    BACKWARD,
    FORWARD,
    MemberPipeline,
    Microtask,
    fused_schedule,
    live_peak,
    makespan,
    one_after_another,
)


def reference_makespan(schedule, members) -> float:
    """The longest path through the precedence graph of `schedule` (what each microtask needs, and each stage's
    order), by Kahn's topological order: written apart from `makespan`'s stage-by-stage replay."""
    pp = len(schedule)
    edges: dict[Microtask, list[Microtask]] = defaultdict(list)
    indegree: dict[Microtask, int] = defaultdict(int)
    tasks = [t for order in schedule for t in order]
    for order in schedule:
        for a, b in zip(order, order[1:]):
            edges[a].append(b)
            indegree[b] += 1
    for t in tasks:
        before = []
        if t.kind == FORWARD and t.stage > 0:
            before.append(Microtask(t.member, FORWARD, t.micro, t.stage - 1))
        if t.kind == BACKWARD:
            before.append(Microtask(t.member, FORWARD, t.micro, t.stage))
            if t.stage < pp - 1:
                before.append(Microtask(t.member, BACKWARD, t.micro, t.stage + 1))
        for a in before:
            edges[a].append(t)
            indegree[t] += 1
    ready = [t for t in tasks if indegree[t] == 0]
    start = {t: 0.0 for t in tasks}
    end = {}
    done = 0
    while ready:
        t = ready.pop()
        m = members[t.member]
        end[t] = start[t] + (m.forward if t.kind == FORWARD else m.backward)
        done += 1
        for u in edges[t]:
            start[u] = max(start[u], end[t])
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    assert done == len(tasks), "a cycle"
    return max(end.values())


def _stage_work(members) -> float:
    return sum(m.mb * (m.forward + m.backward) for m in members)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("mb", [1, 2, 3, 4, 8])
def test_one_member_runs_1f1b_at_the_bubble_formula(pp, mb):
    m = (MemberPipeline(mb, forward=1.0, backward=2.0),)
    schedule = fused_schedule(m, pp)
    assert makespan(schedule, m) == pytest.approx((mb + pp - 1) * 3.0, rel=1e-12)  # T_gemm (mb + pp - 1) / mb
    assert live_peak(schedule, m, (1.0,)) == min(mb, pp)  # spec 6.2's live microbatches
    for s, order in enumerate(schedule):  # stage s warms up with pp - s - 1 forwards, then alternates
        w = min(pp - s - 1, mb)
        expected = [(FORWARD, j) for j in range(w)]
        for j in range(mb - w):
            expected += [(FORWARD, w + j), (BACKWARD, j)]
        expected += [(BACKWARD, j) for j in range(mb - w, mb)]
        assert [(t.kind, t.micro) for t in order] == expected


members_strategy = st.lists(
    st.builds(MemberPipeline, mb=st.integers(1, 6), forward=st.floats(0.05, 3.0), backward=st.floats(0.05, 6.0)),
    min_size=1, max_size=3).map(tuple)


@settings(max_examples=120, deadline=None)
@given(members=members_strategy, pp=st.integers(1, 5))
def test_a_fused_order_is_valid_and_priced_as_the_reference_prices_it(members, pp):
    schedule = fused_schedule(members, pp)
    assert len(schedule) == pp
    for s, order in enumerate(schedule):
        expected = {Microtask(i, k, j, s) for i, m in enumerate(members) for j in range(m.mb) for k in "FB"}
        assert sorted(order) == sorted(expected)  # each of the stage's microtasks exactly once
        live = [0] * len(members)
        for t in order:  # 1F1B's bound holds for every member at every point of the order
            live[t.member] += 1 if t.kind == FORWARD else -1
            assert 0 <= live[t.member] <= pp - s
    fused = makespan(schedule, members)
    assert fused == pytest.approx(reference_makespan(schedule, members), rel=1e-12)
    serial = makespan(one_after_another(members, pp), members)
    alone = sum(makespan(fused_schedule((m,), pp), (m,)) for m in members)
    assert serial == pytest.approx(alone, rel=1e-12)  # one after another is what the members cost unfused
    assert fused <= serial * (1 + 1e-12)
    assert fused >= _stage_work(members) * (1 - 1e-12)  # no stage runs faster than its own work


def test_the_worked_example_fills_one_bubble():
    """docs/cost-model.md, "Fused training operators": actor (forward 1, backward 2) and critic (0.9, 1.8), 4
    microbatches each on 2 stages: 28.5 one after another, 25.6 fused (-10.2%), 4 live microbatches on stage 0."""
    actor, critic = MemberPipeline(4, 1.0, 2.0), MemberPipeline(4, 0.9, 1.8)
    members = (actor, critic)
    schedule = fused_schedule(members, 2)
    assert makespan(one_after_another(members, 2), members) == pytest.approx(28.5)
    assert makespan(schedule, members) == pytest.approx(25.6)
    assert live_peak(schedule, members, (1.0, 1.0)) == 4
    # the critic's forwards start on stage 0 while the actor's last backwards are still to come
    first_critic = next(i for i, t in enumerate(schedule[0]) if t.member == 1)
    assert any(t.member == 0 for t in schedule[0][first_critic:])


def test_an_order_that_cannot_run_is_refused():
    m = (MemberPipeline(1, 1.0, 2.0),)
    stuck = ((Microtask(0, BACKWARD, 0, 0), Microtask(0, FORWARD, 0, 0)),
             (Microtask(0, FORWARD, 0, 1), Microtask(0, BACKWARD, 0, 1)))
    with pytest.raises(ValueError, match="cannot run"):
        makespan(stuck, m)
