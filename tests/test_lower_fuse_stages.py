"""fuse-stages and what reads its fusions (issue 34, items 1-3): the plan's rules for `rpeg.fuse`, the exec fusion's
checks, the fused time on the members, their summed transient memory and the scheduler running the members as one
unit (docs/stage-fusion.md); tests/test_runtime_fused.py runs the result."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rpegc import api
from rpegc.core.check.fusion_rules import check_exec_fusions, check_plan_fusions
from rpegc.core.cost.annotate import annotate, placement_time
from rpegc.core.cost.fused import fused_time, member_pipeline
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.cost.residency import OpPlacement
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import Microtask
from rpegc.runtime.plan import build_run_plan

SOURCE = (Path(__file__).resolve().parents[1] / "lit_tests" / "Inputs" / "ppo-fused-2.rpeg").read_text()
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard"


def lowered(source: str = SOURCE, fuse: bool = True):
    return api.run_pipeline(source, LOWER + (",fuse-stages" if fuse else ""), "ppo-fused-2.rpeg")


def _with_plan(old: str, new: str) -> str:
    assert old in SOURCE
    return SOURCE.replace(old, new)


@pytest.mark.parametrize("old, new, message", [
    ("rpeg.fuse (@train_actor, @train_critic)", "rpeg.fuse (@train_actor, @critic_inf)",
     "@critic_inf is not a training vertex"),
    ("dp = 1 pp = 2 tp = 1 mb = 4\n  rpeg.fuse", "dp = 2 pp = 1 tp = 1 mb = 1\n  rpeg.fuse",
     "members share their devices and stages"),
    ("rpeg.fuse (@train_actor, @train_critic)",
     "rpeg.fuse (@train_actor, @train_critic)\n  rpeg.fuse (@train_critic, @train_actor)", "is already fused"),
    ("@train_critic at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 4",
     "@train_critic at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 4 schedule = gpipe",
     "fused members train with schedule = 1f1b"),
])
def test_an_illegal_fusion_is_a_located_plan_error(old, new, message):
    p = api.parse(_with_plan(old, new), "bad.rpeg")
    errors = check_plan_fusions(p)
    assert errors and message in errors[0].message
    assert errors[0].loc.line == next(i for i, line in enumerate(new.join(SOURCE.split(old)).splitlines(), 1)
                                      if "rpeg.fuse" in line and i >= errors[0].loc.line)
    with pytest.raises(RpegError, match=message):
        lowered(_with_plan(old, new))


def test_members_differing_only_in_microbatches_fuse():
    p = lowered(_with_plan("@train_critic at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 4",
                           "@train_critic at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 2"))
    (first, _) = p.exec.fusions
    assert sum(t.member == 1 for t in first.stages[0]) == 4  # the critic's 2 forwards and 2 backwards


def test_one_fusion_per_step_over_the_members_nodes():
    p = lowered()
    assert [(f.id, f.members) for f in p.exec.fusions] == [
        ("fuse0#0", ("train_actor#0", "train_critic#0")), ("fuse0#1", ("train_actor#1", "train_critic#1"))]
    assert p.exec.fusions[0].stages == p.exec.fusions[1].stages
    assert check_exec_fusions(p) == []
    unfused = lowered(fuse=False)
    assert unfused.exec.nodes == p.exec.nodes and unfused.exec.edges == p.exec.edges  # the members keep their nodes


def _replace_stages(p, stages):
    f = dataclasses.replace(p.exec.fusions[0], stages=stages)
    return dataclasses.replace(p, exec=dataclasses.replace(p.exec, fusions=(f,) + p.exec.fusions[1:]))


def test_an_exec_fusion_that_cannot_run_is_refused_by_every_reader(tmp_path):
    p = lowered()
    stages = p.exec.fusions[0].stages
    cases = [
        (stages[:1], "lists 1 stage(s); the members have pp = 2"),
        ((stages[0][1:], stages[1]), "stage 0 must run each member's forward and backward"),
        ((tuple(reversed(stages[0])), stages[1]), "cannot run"),
        ((stages[0] + (Microtask(0, "F", 9, 0),), stages[1]), "stage 0 must run"),
    ]
    for i, (bad, message) in enumerate(cases):
        broken = _replace_stages(p, bad)
        assert message in check_exec_fusions(broken)[0].message
        for form, write in ((".json", api.to_json), (".rpeg", api.to_text), (".mlir", api.to_mlir)):
            path = tmp_path / f"bad{i}{form}"
            path.write_text(write(broken))
            with pytest.raises(RpegError, match=re.escape(message)):
                api.load(str(path))
        with pytest.raises(RpegError, match=re.escape(message)):
            build_run_plan(broken)


def test_members_take_the_fused_time_and_their_transients_add_up():
    p = lowered()
    hw = load_hardware("cpu")
    unfused_source = _with_plan("  rpeg.fuse (@train_actor, @train_critic)\n", "")
    fused, apart = annotate(p, hw), annotate(lowered(unfused_source, fuse=False), hw)
    actor, critic = (fused.exec.node(f"train_{m}#0") for m in ("actor", "critic"))
    times = tuple(placement_time(p, OpPlacement(n.vertex, "training", n.model, n.alloc, n.strategy), hw)
                  for n in (actor, critic))
    pipes = tuple(member_pipeline(t, 4, p.workload.training().forward_equivalents) for t in times)
    expected = fused_time(times, pipes, p.exec.fusions[0].stages)
    assert actor.time == critic.time == pytest.approx(expected.total, rel=1e-12)
    alone = [apart.exec.node(f"train_{m}#0").time for m in ("actor", "critic")]
    assert alone == pytest.approx(list(expected.unfused), rel=1e-12) and expected.total < sum(alone)
    # both members' transients at once on their devices: more than either alone, at most both
    t_fused = dict(fused.exec.memory.transient)[0]
    t_apart = dict(apart.exec.memory.transient)[0]
    assert t_apart < t_fused <= 2 * t_apart


def test_the_scheduler_runs_the_members_as_one_unit():
    p = api.run_pipeline(SOURCE, LOWER + ",fuse-stages,annotate-cost,schedule", "ppo-fused-2.rpeg")
    for k in range(2):
        actor, critic = p.exec.node(f"train_actor#{k}"), p.exec.node(f"train_critic#{k}")
        assert (actor.start, actor.finish) == (critic.start, critic.finish)
        assert actor.finish - actor.start == pytest.approx(actor.time, rel=1e-12)
        for e in p.exec.edges:  # every predecessor of a member is done before the fusion starts
            if e.dst in (actor.id, critic.id):
                assert p.exec.node(e.src).finish <= actor.start + 1e-12
    assert p.exec.schedule.makespan == max(n.finish for n in p.exec.nodes)


def test_a_plan_fusion_left_unlowered_is_not_priced_apart():
    p = lowered(fuse=False)
    with pytest.raises(RpegError, match="run fuse-stages after insert-reshard") as e:
        annotate(p, load_hardware("cpu"))
    assert e.value.loc == p.plan.fusions[0].loc


def test_explain_shows_the_fusion_and_both_members_memory():
    p = api.run_pipeline(SOURCE, LOWER + ",fuse-stages,annotate-cost,schedule", "ppo-fused-2.rpeg")
    text = api.explain(p)
    head, row = text.split("Fused operators")[1].splitlines()[1:3]
    assert row.split()[:3] == ["fuse0", "train_actor,", "train_critic"]
    assert row.split()[3] == f"{p.exec.node('train_actor#0').time:.4e}"  # T_fused: what annotate-cost gave
    assert "train_actor activations" in text and "train_critic activations" in text
    assert "materialized" not in text.split("Memory per device")[1]  # the critic's transient is its own, not weights


def test_members_joined_by_data_edges_may_not_fuse():
    """F5: a fusion runs its members together, so a member may not wait for another's output."""
    source = (SOURCE.replace("  %v        = rpeg.container values[B*R, Lr]\n",
                             "  %v        = rpeg.container values[B*R, Lr]\n  %adv      = rpeg.container values[B*R, Lr]\n")
              .replace("%r, %v) writes(%W_actor)", "%r, %v) writes(%W_actor, %adv)")
              .replace("reads(%W_critic, %Y, %logp, %logp_ref, %r, %v)", "reads(%W_critic, %Y, %logp, %logp_ref, %r, %v, %adv)")
              .replace("  rpeg.publish @train_actor", "  rpeg.data @train_actor -> @train_critic (%adv)\n  rpeg.publish @train_actor"))
    p = api.parse(source, "joined.rpeg")
    errors = check_plan_fusions(p)
    assert errors and "data edges lead from @train_actor to @train_critic" in errors[0].message
    with pytest.raises(RpegError, match="neither may wait for the other"):
        lowered(source)
    apart = api.run_pipeline(source.replace("  rpeg.fuse (@train_actor, @train_critic)\n", ""), LOWER, "joined.rpeg")
    joined = dataclasses.replace(apart.exec, fusions=lowered().exec.fusions)
    assert any("a path leads from @train_actor#0 to @train_critic#0" in e.message
               for e in check_exec_fusions(dataclasses.replace(apart, exec=joined)))
