"""T_op of fused training operators (rpegc/core/cost/fused.py; docs/stage-fusion.md; issue 34, item 3), on the worked
example of docs/cost-model-spec.md Section 8 (tests/fixtures/spec_example.py): one member alone is priced exactly as the
operator unfused, and a fusion is its schedule's makespan plus what each member pays outside its microtasks."""

from __future__ import annotations

import pytest

from rpegc.core.cost.fused import fused_time, member_pipeline
from rpegc.core.cost.optime import op_time
from rpegc.core.ir.training import Training
from rpegc.core.sched.microtasks import fused_schedule, makespan, one_after_another
from fixtures.spec_example import ARCH, HW, PLAN, SCALAR_AR, WL

TRAIN = Training("mixed", 2, "interval", "1f1b")


def timing(kind: str, **plan):
    return op_time("training", ARCH, kind, WL, **{**PLAN, **plan}, gpus_per_node=8, hw=HW, train=TRAIN)


@pytest.mark.parametrize("mb, pp", [(4, 2), (1, 2), (8, 2), (2, 1)])
def test_one_member_is_priced_as_the_operator_unfused(mb, pp):
    t = timing("policy", mb=mb, pp=pp)
    m = member_pipeline(t, mb, TRAIN.forward_equivalents)
    assert m.forward * TRAIN.forward_equivalents == pytest.approx(float(t.T_gemm) / mb, rel=1e-12)
    alone = fused_time((t,), (m,), fused_schedule((m,), pp))
    assert alone.total == pytest.approx(float(t.T_op), rel=1e-12)
    assert alone.saved == pytest.approx(0.0, abs=1e-12 * float(t.T_op))


def test_actor_and_critic_fused_on_the_spec_example():
    actor, critic = timing("policy"), timing("critic")
    members = tuple(member_pipeline(t, PLAN["mb"], TRAIN.forward_equivalents) for t in (actor, critic))
    schedule = fused_schedule(members, PLAN["pp"])
    fused = fused_time((actor, critic), members, schedule)
    # each member's T_op on the worked example as the backend runs it (a row less its last token: forward_length;
    # 1.0068190 and 0.9847996 at the spec's whole rows) with its five AllReduces of statistics
    assert fused.unfused == (pytest.approx(1.0053580 + 5 * SCALAR_AR, rel=1e-6),
                             pytest.approx(0.9833714 + 5 * SCALAR_AR, rel=1e-6))
    assert fused.makespan == pytest.approx(makespan(schedule, members), rel=1e-12)
    rest = sum(float(t.T_op - t.T_gemm - t.T_bubble) for t in (actor, critic))
    assert fused.total == pytest.approx(fused.makespan + rest, rel=1e-12)
    # the members' GEMMs and bubbles, one after another, are what the schedule replaces
    serial = makespan(one_after_another(members, PLAN["pp"]), members)
    assert serial == pytest.approx(sum(float(t.T_gemm + t.T_bubble) for t in (actor, critic)), rel=1e-12)
    assert fused.total == pytest.approx(1.8137587 + 10 * SCALAR_AR, rel=1e-6)  # docs/stage-fusion.md: 8.8% saved
    assert fused.saved == pytest.approx(0.0879812 * 1.9887295, rel=1e-5)  # fusing leaves the AllReduces as they are
