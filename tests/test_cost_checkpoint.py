"""What a run's checkpoint costs (core/cost/checkpoint.py, issue 36): the files, tensors and bytes each worker writes at
a boundary, priced with the profile's [host] checkpoint terms; the boundaries a cadence writes at. That the files a
real run writes are these is tests/test_torch_checkpoint_resume.py's."""

import dataclasses
import math

import pytest

from rpegc.core.cost.checkpoint import (STATE_BYTES, VERSION_BYTES, RankWrite, checkpoint_steps, checkpoint_time,
                                        layer_tensors, node_write_time, rank_write_time, rank_writes, stage_tensors,
                                        version_kept)
from rpegc.core.cost.hardware import Hardware, load_hardware
from rpegc.core.cost.memory import weight_shard
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Arch
from rpegc.syntax.parser import parse

PPO = parse(open("examples/ppo-tiny.rpeg").read(), "ppo-tiny.rpeg")
HW = dataclasses.replace(load_hardware("cpu-reference"), checkpoint_file=1e-3, checkpoint_tensor=2e-5,
                         checkpoint_rate=5e8)


def test_each_device_writes_its_replicas_share_of_every_model_it_trains_and_its_rng_state():
    writes = {w.device: w for w in rank_writes(PPO)}
    assert sorted(writes) == list(range(8))  # every placed device writes its RNG state
    actor, critic = PPO.model("actor"), PPO.model("critic")
    assert actor.hf is None and critic.hf is None  # presets: the backend learns their position embeddings
    positions = (PPO.workload.Lp + PPO.workload.Lr) * actor.arch.hidden
    a = (float(weight_shard(actor.arch, actor.kind, 1, 2)) + positions) / 2  # train_actor: dp 2 tp 2 on node 0
    c = (float(weight_shard(critic.arch, critic.kind, 2, 1)) + positions) / 2  # train_critic: dp 2 pp 2 on node 1
    for d in range(4):
        assert writes[d].files == 2 and writes[d].bytes == pytest.approx(a * STATE_BYTES)
        assert writes[d].tensors == pytest.approx(stage_tensors(actor.arch, actor.kind, 1, True) / 2 * 4 + 1)
    for d in range(4, 8):
        assert writes[d].files == 2 and writes[d].bytes == pytest.approx(c * STATE_BYTES)
        assert writes[d].tensors == pytest.approx(stage_tensors(critic.arch, critic.kind, 2, True) / 2 * 4 + 1)


def test_staleness_adds_the_kept_float32_versions():
    text = open("examples/ppo-tiny.rpeg").read()
    stale = parse(text.replace("{@actor = 0, @critic = 0}", "{@actor = 2, @critic = 0}"), "s.rpeg")
    fresh, kept = rank_writes(PPO)[0], rank_writes(stale)[0]
    assert kept.bytes == pytest.approx(fresh.bytes * (STATE_BYTES + 2 * 4) / STATE_BYTES)
    assert kept.tensors - 1 == pytest.approx((fresh.tensors - 1) * (4 + 2) / 4)


def test_a_stale_model_keeps_min_tau_every_versions_a_checkpoint_copied_by_its_training_ranks():
    text = open("examples/ppo-tiny.rpeg").read()
    stale = parse(text.replace("{@actor = 0, @critic = 0}", "{@actor = 2, @critic = 0}"), "s.rpeg")
    assert all(w.keep_tensors == w.keep_bytes == 0 for w in rank_writes(PPO))  # on-policy: nothing kept
    one = {w.device: w for w in rank_writes(stale, every=1)}
    for every, keeps in ((1, 1), (2, 2), (20, 2)):  # a version a step, at most tau of them a checkpoint
        for w in rank_writes(stale, every=every):
            if w.device < 4:  # the actor's training ranks: their share of a float32 version each
                per_version = one[w.device].keep_bytes
                assert w.keep_bytes == pytest.approx(keeps * per_version) and per_version > 0
                assert per_version == pytest.approx((w.bytes / (STATE_BYTES + 2 * VERSION_BYTES)) * VERSION_BYTES)
                assert w.keep_tensors == pytest.approx(keeps * (one[w.device].tensors - 1) / (4 + 2))
            else:
                assert w.keep_tensors == w.keep_bytes == 0
    kept = dataclasses.replace(HW, checkpoint_keep_tensor=3e-6, checkpoint_keep_rate=1e10)
    w = rank_writes(stale, every=20)[0]
    assert rank_write_time(w, kept) == pytest.approx(rank_write_time(w, HW) + w.keep_tensors * 3e-6
                                                    + w.keep_bytes / 1e10)
    assert checkpoint_time(stale, kept, every=20) > checkpoint_time(stale, kept, every=1) > checkpoint_time(stale, HW)


@pytest.mark.parametrize("version,tau,every,kept", [
    (2, 1, 3, True), (3, 1, 3, False), (1, 2, 3, True), (19, 1, 1, False),  # boundary 20 is the last step's: none
    (4, 0, 1, False), (5, 2, 0, False),
])
def test_a_version_is_kept_where_a_checkpoint_within_tau_saves_it(version, tau, every, kept):
    assert version_kept(version, tau, 20, every) is kept


def test_a_checkpoint_costs_its_slowest_worker_and_nothing_without_the_profile_rate():
    per = [w.files * 1e-3 + w.tensors * 2e-5 + w.bytes / 5e8 for w in rank_writes(PPO)]
    assert checkpoint_time(PPO, HW) == pytest.approx(max(per))
    assert checkpoint_time(PPO, load_hardware("cpu-reference")) is None  # the shipped profile does not measure it


def test_the_ranks_of_a_node_share_its_disk():
    # ppo-tiny: train_actor's 4 ranks on node 0, train_critic's on node 1 (gpus = 4); every rank of a node writes the
    # same, so each waits for the disk parts of the node's 3 others
    shared = dataclasses.replace(HW, checkpoint_disk_rate=2e9)
    writes = rank_writes(PPO)
    per = [w.files * 1e-3 + w.tensors * 2e-5 + w.bytes / 5e8 + 3 * w.bytes / 2e9 for w in writes]
    assert checkpoint_time(PPO, shared) == pytest.approx(max(per))
    assert checkpoint_time(PPO, shared) > checkpoint_time(PPO, HW)
    # unequal ranks: the small one may finish last, behind the large one's disk part
    big, small = RankWrite(0, 2, 10, 4e8), RankWrite(1, 1, 1, 0.0)
    own = {w: rank_write_time(w, shared) for w in (big, small)}
    assert node_write_time([big, small], shared) == pytest.approx(max(own[big], own[small] + 4e8 / 2e9))
    assert node_write_time([big, small], HW) == pytest.approx(max(rank_write_time(w, HW) for w in (big, small)))


def test_the_stage_tensors_are_the_backends_models_parameters():
    torch = pytest.importorskip("torch")  # noqa: F841
    from rpegc.runtime.backends.torch.model.transformer import NetOptions, TransformerModel, arch_net

    archs = [Arch(2, 64, 128, 50, 4, 2, gated=True), Arch(3, 32, 64, 40, 4, 4, qkv_bias=True),
             Arch(2, 32, 64, 40, 2, 2, gated=True, qk_norm=True, post_norms=True)]
    for arch in archs:
        for kind in ("policy", "critic", "actor_critic"):
            opts = dataclasses.replace(arch_net(arch, NetOptions(max_seq=16)), qkv_bias=arch.qkv_bias)
            model = TransformerModel(arch, kind, opts)
            assert stage_tensors(arch, kind, 1) == len(list(model.parameters())), (arch, kind)
            if arch.layers == 2:  # pp = 2: a layer each, the embedding on one side, the heads on the other
                first = TransformerModel(arch, kind, opts, stage=(0, 1, True, False))
                last = TransformerModel(arch, kind, opts, stage=(1, 2, False, True))
                worst = max(len(list(first.parameters())), len(list(last.parameters())))
                assert stage_tensors(arch, kind, 2) == worst > layer_tensors(arch)


@pytest.mark.parametrize("first,steps,every,expected", [
    (0, 60, 20, (20, 40)),  # never after the last step: the final weights are written instead
    (0, 61, 20, (20, 40, 60)),
    (0, 5, 1, (1, 2, 3, 4)),
    (21, 60, 20, (40,)),  # a resumed run: the boundaries after its first step
    (0, 60, 0, ()),
])
def test_the_boundaries_are_the_exports_boundaries(first, steps, every, expected):
    assert checkpoint_steps(first, steps, every) == expected
    # runtime/backends/torch/checkpoints/exports.py: after step k's training, a checkpoint at k + 1 when due
    assert expected == tuple(k + 1 for k in range(first, steps) if every and (k + 1) % every == 0 and k + 1 < steps)


def test_the_profile_keys_are_checked():
    base = load_hardware("cpu-reference")
    text = open(base.source).read()
    assert "checkpoint_rate" not in text
    import tomllib
    d = tomllib.loads(text)
    d["host"].update(checkpoint_file=0.0005, checkpoint_tensor=2.5e-5, checkpoint_rate=7e8)
    assert Hardware.from_dict(d, source="t.toml").checkpoint_disk_rate is None  # optional
    d["host"]["checkpoint_disk_rate"] = 2e9
    hw = Hardware.from_dict(d, source="t.toml")
    assert (hw.checkpoint_file, hw.checkpoint_tensor, hw.checkpoint_rate) == (0.0005, 2.5e-5, 7e8)
    assert hw.checkpoint_disk_rate == 2e9
    assert hw.checkpoint_keep_rate is None and hw.checkpoint_keep_tensor == 0  # optional: keeps free
    d["host"].update(checkpoint_keep_tensor=3e-6, checkpoint_keep_rate=1e10)
    hw = Hardware.from_dict(d, source="t.toml")
    assert (hw.checkpoint_keep_tensor, hw.checkpoint_keep_rate) == (3e-6, 1e10)
    assert hw.checkpoint_commit == 0.0  # optional: the controller's commit unpriced
    d["host"]["checkpoint_commit"] = 2.7e-3
    assert Hardware.from_dict(d, source="t.toml").checkpoint_commit == 2.7e-3
    for key, bad in (("checkpoint_rate", 0), ("checkpoint_rate", -1.0), ("checkpoint_file", -1e-3),
                     ("checkpoint_tensor", "fast"), ("checkpoint_rate", math.inf), ("checkpoint_disk_rate", 0),
                     ("checkpoint_disk_rate", 1e13), ("checkpoint_keep_rate", 0), ("checkpoint_keep_tensor", -1.0),
                     ("checkpoint_commit", -1e-3)):
        d["host"][key] = bad
        with pytest.raises(RpegError, match=f"host.{key}"):
            Hardware.from_dict(d, source="t.toml")
        d["host"].update(checkpoint_file=0.0005, checkpoint_tensor=2.5e-5, checkpoint_rate=7e8,
                         checkpoint_disk_rate=2e9, checkpoint_keep_tensor=3e-6, checkpoint_keep_rate=1e10,
                         checkpoint_commit=2.7e-3)


def test_the_controllers_commit_is_priced_per_checkpoint_and_per_tensor_its_index_lists():
    """[host] checkpoint_commit, checkpoint_commit_tensor: the controller's index, rename and pruning of a checkpoint
    once its parts are in, a fixed part and one per tensor of every rank's files; left out, 0."""
    from rpegc.core.cost.checkpoint import commit_time, rank_writes

    assert commit_time(PPO, HW) == 0.0
    hw = dataclasses.replace(HW, checkpoint_commit=2e-3, checkpoint_commit_tensor=5e-6)
    tensors = sum(w.tensors for w in rank_writes(PPO))
    assert tensors > 0 and commit_time(PPO, hw) == pytest.approx(2e-3 + 5e-6 * tensors)
