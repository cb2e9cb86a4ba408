"""Fused training on the torch backend (issue 34, items 5 and 6; docs/stage-fusion.md): PPO's actor and critic train
on the same 2 workers (as 2-stage pipelines of 4 microbatches, as 2 data-parallel replicas, or tensor-parallel), their
microtasks interleaved as the plan's exec.fusion orders them (runtime/backends/torch/worker/interleave.py). Each member runs the same kernels on the same microbatches in
the same order as it does unfused, so the final weights are bit-identical to the unfused run of the same plan."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fixtures.cli import rpeg_run  # noqa: E402
from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import load_final  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT / "lit_tests" / "Inputs" / "ppo-fused-2.rpeg").read_text()
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard"
FUSE = "  rpeg.fuse (@train_actor, @train_critic)\n"


def _compiled(d: Path, name: str, source: str, pipeline: str) -> str:
    (d / f"{name}.rpeg").write_text(source)
    out = str(d / f"{name}.exec.rpeg")
    assert rpegc_main([str(d / f"{name}.rpeg"), "-p", pipeline, "-o", out]) == 0
    return out


PIPELINED = "dp = 1 pp = 2 tp = 1 mb = 4"
LAYOUTS = [PIPELINED, "dp = 2 pp = 1 tp = 1 mb = 1", "dp = 1 pp = 1 tp = 2 mb = 1"]


@pytest.fixture(scope="module", params=LAYOUTS)
def runs(request, tmp_path_factory):
    """The same PPO with both trainers in `layout`, fused and apart."""
    d = tmp_path_factory.mktemp("fused")
    source = SOURCE.replace(PIPELINED, request.param)
    fused = _compiled(d, "fused", source, LOWER + ",fuse-stages,annotate-cost,schedule")
    apart = _compiled(d, "apart", source.replace(FUSE, ""), LOWER + ",annotate-cost,schedule")
    out = {}
    for name, plan in (("fused", fused), ("apart", apart)):
        run_dir = d / f"run-{name}"
        result = rpeg_run(plan, "--backend", "torch", "--run-dir", str(run_dir), "--trace", str(d / f"{name}.jsonl"))
        assert result.returncode == 0, result.stderr
        assert "verification: OK" in result.stdout + result.stderr
        out[name] = (result, run_dir, d / f"{name}.jsonl", plan)
    return out


def test_a_fused_run_trains_the_weights_of_the_unfused_run_bit_for_bit(runs):
    fused, apart = load_final(str(runs["fused"][1])), load_final(str(runs["apart"][1]))
    assert set(fused) == set(apart) == {"actor", "critic"}
    for model in fused:
        assert fused[model].keys() == apart[model].keys()
        for name, t in fused[model].items():
            assert torch.equal(t, apart[model][name]), (model, name)


def test_the_members_ran_together_and_the_trace_verifies(runs):
    import json

    _, _, trace, plan = runs["fused"]
    nodes = {r["id"]: r for r in map(json.loads, trace.read_text().splitlines()) if r.get("type") == "node"}
    for k in range(2):
        actor, critic = nodes[f"train_actor#{k}"], nodes[f"train_critic#{k}"]
        assert (actor["start"], actor["finish"]) == (critic["start"], critic["finish"])
    verified = rpeg_run("verify", plan, str(trace))
    assert verified.returncode == 0, verified.stderr


def test_the_trace_records_each_microtask_and_verify_checks_their_order(runs):
    import dataclasses

    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.trace import read_trace
    from rpegc.runtime.verify import verify

    _, _, trace_path, plan_path = runs["fused"]
    plan, trace = load_plan(plan_path), read_trace(str(trace_path))
    fusion = plan.program.exec.fusions[0]
    actor = trace.nodes[fusion.members[0]]
    critic = trace.nodes[fusion.members[1]]
    for rec in (actor, critic):
        assert {t[0] for t in rec.microtasks} == set(rec.workers)  # every worker of the member reported
    assert verify(plan, trace) == []
    # the critic's first microtask on worker 0 moved before everything: another order than the plan's
    first = min(t[4] for t in actor.microtasks if t[0] == 0)
    moved = tuple((r, s, k, j, first - 1e-3, first - 5e-4) if (r, k, j) == (0, "F", 0) else (r, s, k, j, a, b)
                  for r, s, k, j, a, b in critic.microtasks)
    tampered = dataclasses.replace(trace, nodes={**trace.nodes, critic.id: dataclasses.replace(critic, microtasks=moved)})
    assert [v.rule for v in verify(plan, tampered)] == ["fusion"]
    # a worker whose records of one member are missing
    partial = tuple(t for t in critic.microtasks if t[0] != 1)
    lost = dataclasses.replace(trace, nodes={**trace.nodes, critic.id: dataclasses.replace(critic, microtasks=partial)})
    assert [v.message for v in verify(plan, lost)] == [f"{critic.id} has no microtask records from worker(s) [1]"]


def test_the_gantt_chart_draws_each_microtask_over_its_member(runs, tmp_path):
    from rpegc.runtime.cli import gantt_panels
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.trace import read_trace
    from rpegc.tools.gantt import draw_bars

    _, _, trace_path, plan_path = runs["fused"]
    plan, trace = load_plan(plan_path), read_trace(str(trace_path))
    (_, predicted), (_, measured) = gantt_panels(plan, trace)
    fusions = plan.program.exec.fusions
    blocks = [b for b in predicted if b.kind == "training"]
    assert [b.label for b in blocks] == [f"{f.id}: train_actor + train_critic" for f in fusions]  # one per fusion
    for vertex in ("train_actor", "train_critic"):
        ran = [t for r in trace.nodes.values() if plan.node(r.id).node.vertex == vertex for t in r.microtasks]
        bars = [b for b in measured if b.kind == vertex]
        assert sorted((b.devices, b.label) for b in bars) == sorted(
            (((d for d, rank in trace.header.workers.items() if rank == t[0]).__next__(),), f"{t[2]}{t[3]}")
            for t in ran)
    draw_bars([("predicted", predicted), ("measured", measured)], str(tmp_path / "fused.png"))
    assert (tmp_path / "fused.png").stat().st_size > 0
