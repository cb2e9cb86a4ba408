"""When the controller asks for a checkpoint's parts (runtime/backends/torch/checkpoints/exports.py): a model's master
and Adam state of version k+1 right behind its training of step k in its ranks' queues, the moment that training is
sent, before its training of step k+1 can be, even when another model's training of step k is still to come (mixed
staleness: PPO's actor one step stale, its critic on-policy, each trained on devices of its own, so the critic's step
k+1 may train before the actor's step k). The demo's optimized PPO plan once failed that way: its checkpoint at
boundary 14 found the critic's master at version 15. Versions are kept for later checkpoints only where one saves
them. A fake pool records the commands; the real writing is tested by the checkpoint and resume tests."""

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


def new_run(run_dir: str, every: int):
    nodes = [SimpleNamespace(kind="op", node=SimpleNamespace(model=m, role="training")) for m in ("actor", "critic")]
    plan = SimpleNamespace(nodes=nodes, steps=20, tau={"actor": 1, "critic": 0}, hash="h", retained=())
    pool, holdings = FakePool(), {}
    exports = Exports(plan, pool, SimpleNamespace(holdings=holdings), run_dir=run_dir, every=every, keep=2,
                      identity={}, metrics={}, resumed_at=None)

    def send(model: str, step: int) -> None:
        d, out, layout = training(model, step, ACTOR if model == "actor" else CRITIC)
        holdings[out] = SimpleNamespace(layout=layout)
        exports.training_sent(d)

    return exports, pool, send


@pytest.fixture
def run(tmp_path):
    return new_run(str(tmp_path), every=1)


def masters(pool: FakePool) -> list[tuple[int, str, int]]:
    return [(r, m, v) for r, msg in pool.exports() for m, _, v, _ in msg.masters]


def test_a_model_checkpoints_its_master_when_its_own_training_of_the_step_completes(run):
    exports, pool, send = run
    send("critic", 13)  # the critic's step 13 ends first; the actor's still trains
    assert masters(pool) == [(1, "critic", 14)]  # asked for now, before train_critic#14 can be dispatched
    assert not any(msg.rng for _, msg in pool.exports())  # the checkpoint is not complete yet
    send("critic", 14)  # the critic races ahead (its step 14 trains before the actor's step 13 ends)
    send("actor", 13)
    assert masters(pool) == [(1, "critic", 14), (1, "critic", 15), (0, "actor", 14)]
    rng = [(r, msg.dir) for r, msg in pool.exports() if msg.rng]
    assert [r for r, _ in rng] == [0, 1]  # boundary 14 complete: every worker's RNG state into its directory
    assert all(d.endswith("step-000014.partial") or "step-000014" in d for _, d in rng)
    assert set(exports.open) == {14, 15}  # both wait for their files; 15 for the actor's step 14 too
    parts = {msg.part for _, msg in pool.exports()}
    assert parts == {"actor", "critic", ""}  # one file per rank and part: nothing overwrites another


def test_the_index_is_written_once_every_part_is_in(run):
    exports, pool, send = run
    send("actor", 0)
    send("critic", 0)
    assert len(exports.jobs) == 3 and not exports.checkpoints
    for export_id in list(exports.jobs):
        job = exports.jobs[export_id]
        for rank in sorted(job.ranks):
            exports.report(rank, {"export": export_id, "file": f"rank-{rank}-{export_id}.safetensors", "bytes": 0,
                                  "sha256": "", "tensors": {}, "write_s": 0.4, "start": 2.0, "finish": 2.5})
    assert exports.checkpoints and exports.checkpoints[0].endswith("step-000001")
    stat = exports.io_stats[-1]
    assert stat["files"] == 4 and stat["write_s"] == pytest.approx(1.0)  # a rank's two parts, one after the other


def test_a_version_is_kept_only_where_a_later_checkpoint_saves_it(tmp_path):
    exports, pool, send = new_run(str(tmp_path), every=3)
    for k in range(6):  # versions 1-6; checkpoints at boundaries 3 and 6 save the actor's versions 2 and 5 beside
        send("actor", k)  # the newer masters (tau = 1)
        send("critic", k)
    kept = [msg.label for _, msg in pool.sent if msg.type == "keep"]
    assert kept == ["weights @actor v2 @pool", "weights @actor v5 @pool"]
    assert [v for _, m, v in masters(pool)] == [3, 3, 6, 6]
    windows = [(r, w[1]) for r, msg in pool.exports() for w in msg.window]
    assert windows == [(0, 2), (0, 5)]  # each checkpoint saves the version kept for it


def test_a_run_that_stops_removes_the_checkpoints_it_was_writing(tmp_path):
    exports, pool, send = new_run(str(tmp_path), every=1)
    send("actor", 0)  # boundary 1's part is asked for with the training: its directory exists before it trains
    partial = [p for p in (tmp_path / "checkpoints").iterdir()]
    assert [p.name for p in partial] == ["step-000001.partial"]
    exports.discard_open()  # the training failed: the workers are stopped, nothing of boundary 1 stays
    assert list((tmp_path / "checkpoints").iterdir()) == [] and not exports.open
