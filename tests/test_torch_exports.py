"""When the controller asks for a checkpoint's parts (runtime/backends/torch/checkpoints/exports.py): a model's master
and Adam state of version k+1 as soon as its training of step k completes, before its training of step k+1 can be
dispatched, even when another model's training of step k is still running (mixed staleness: PPO's actor one step stale,
its critic on-policy, each trained on devices of its own, so the critic's step k+1 may train before the actor's step k
ends). The demo's optimized PPO plan failed that way: its checkpoint at boundary 14 found the critic's master at
version 15. A fake pool records the commands; the real writing is tested by the checkpoint and resume tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from rpegc.runtime.backends.torch.channel.commands import Command  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.exports import Exports  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout  # noqa: E402
from rpegc.runtime.plan import Artifact  # noqa: E402

ACTOR, CRITIC = Layout((0,), 1, 1, 1), Layout((1,), 1, 1, 1)


class FakePool:
    world = 2

    def __init__(self):
        self.sent: list[tuple[int, dict]] = []

    def send(self, rank: int, msg: Command) -> None:
        self.sent.append((rank, msg))

    def exports(self) -> list[tuple[int, dict]]:
        return [(r, m) for r, m in self.sent if m.type == "export"]


def training(model: str, step: int, layout: Layout):
    out = Artifact("weights", model, step + 1, None, None)
    node = SimpleNamespace(step=step, node=SimpleNamespace(model=model, role="training"))
    return SimpleNamespace(node=node, outputs=[out]), out, layout


@pytest.fixture
def run(tmp_path):
    nodes = [SimpleNamespace(kind="op", node=SimpleNamespace(model=m, role="training")) for m in ("actor", "critic")]
    plan = SimpleNamespace(nodes=nodes, steps=20, tau={"actor": 1, "critic": 0}, hash="h", retained=())
    pool, holdings = FakePool(), {}
    exports = Exports(plan, pool, SimpleNamespace(holdings=holdings), run_dir=str(tmp_path), every=1, keep=2,
                      identity={}, metrics={}, resumed_at=None)

    def complete(model: str, step: int) -> None:
        d, out, layout = training(model, step, ACTOR if model == "actor" else CRITIC)
        holdings[out] = SimpleNamespace(layout=layout)
        exports.after_training(d)

    return exports, pool, complete


def masters(pool: FakePool) -> list[tuple[int, str, int]]:
    return [(r, m, v) for r, msg in pool.exports() for m, _, v, _ in msg.masters]


def test_a_model_checkpoints_its_master_when_its_own_training_of_the_step_completes(run):
    exports, pool, complete = run
    complete("critic", 13)  # the critic's step 13 ends first; the actor's still trains
    assert masters(pool) == [(1, "critic", 14)]  # asked for now, before train_critic#14 can be dispatched
    assert not any(msg.rng for _, msg in pool.exports())  # the checkpoint is not complete yet
    complete("critic", 14)  # the critic races ahead (its step 14 trains before the actor's step 13 ends)
    complete("actor", 13)
    assert masters(pool) == [(1, "critic", 14), (1, "critic", 15), (0, "actor", 14)]
    rng = [(r, msg.dir) for r, msg in pool.exports() if msg.rng]
    assert [r for r, _ in rng] == [0, 1]  # boundary 14 complete: every worker's RNG state into its directory
    assert all(d.endswith("step-000014.partial") or "step-000014" in d for _, d in rng)
    assert set(exports.open) == {14, 15}  # both wait for their files; 15 for the actor's step 14 too
    parts = {msg.part for _, msg in pool.exports()}
    assert parts == {"actor", "critic", ""}  # one file per rank and part: nothing overwrites another


def test_the_index_is_written_once_every_part_is_in(run):
    exports, pool, complete = run
    complete("actor", 0)
    complete("critic", 0)
    assert len(exports.jobs) == 3 and not exports.checkpoints
    for export_id in list(exports.jobs):
        job = exports.jobs[export_id]
        for rank in sorted(job.ranks):
            exports.report(rank, {"export": export_id, "file": f"rank-{rank}-{export_id}.safetensors", "bytes": 0,
                                  "sha256": "", "tensors": {}, "write_s": 0.5})
    assert exports.checkpoints and exports.checkpoints[0].endswith("step-000001")
    stat = exports.io_stats[-1]
    assert stat["files"] == 4 and stat["write_s"] == pytest.approx(1.0)  # a rank's two parts, one after the other
