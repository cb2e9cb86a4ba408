"""The sharded checkpoint format of the torch backend (runtime/backends/torch/checkpoints/shard_files.py): workers'
shard files and the index, reshard on load, the run identity, crash safety and bad input. No worker
processes: standalone workers write and read the files as the backend's workers do."""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.outputs import PendingDirectory  # noqa: E402
from rpegc.runtime.backends.torch.channel.commands import Export  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import model_seed  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import build_model, export_weights  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import param_shapes  # noqa: E402
from rpegc.runtime.backends.torch.parallel.parallel_model import shard_of  # noqa: E402
from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import ModelSpec, Worker, WorkerSetup  # noqa: E402

ARCH = lookup("tiny")  # 2 blocks, heads 4, ffn 256: tp 1, 2 and 4 all shard it
RUN = RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=4, R=2, Lp=4, Lr=4, dtype="fp32"),
                rl=toy_rl_config("grpo"), positions="learned")
MODELS = {"actor": ModelSpec("actor", "policy", ARCH, model_seed(0, "policy"))}
SHAPES = param_shapes(ARCH, "policy", RUN.net)
LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (1, 1, 4), (4, 1, 1)]


def layout(dp: int, pp: int, tp: int) -> Layout:
    return Layout(tuple(range(dp * pp * tp)), dp, pp, tp)


def worker(rank: int, resume: str | None = None) -> Worker:
    setup = WorkerSetup(world=8, seed=0, run=RUN, models=MODELS, layouts=(), tp_impl="torch", t0=time.time(),
                        timeout_s=60.0, resume_file=resume)
    return Worker(setup, rank, channel=None, device=torch.device("cpu"))


def full_weights() -> dict[str, torch.Tensor]:
    return export_weights(build_model(ARCH, "policy", MODELS["actor"].seed, RUN.net))


def write_checkpoint(directory: str, src: Layout, version: int = 1) -> dict:
    """What the backend's checkpoint does for a version held in `src`: every rank of the layout writes its
    share of the pieces (and its RNG state), the controller indexes the reports."""
    reports = []
    for r in src.ranks:
        w = worker(r)
        w.install("W", "actor", src)
        w.entry("W").version = version
        reply = w.execute(Export(export=1, dir=directory, weights=[["W", ckpt.weights_key("actor", version, "")]],
                                 rng=True))
        assert set(reply) == {"export", "file", "bytes", "sha256", "tensors", "write_s"}
        json.dumps(reply)  # a plain message: no tensors, no objects
        reports.append(reply)
    index = ckpt.build_index(ckpt.FORMAT, reports, step=version, versions={"actor": [version]}, optimizer=[])
    ckpt.write_index(directory, index)
    return index


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = {}
    for src in LAYOUTS:
        d = str(tmp_path_factory.mktemp("ckpt-%d%d%d" % src))
        write_checkpoint(d, layout(*src))
        out[src] = d
    return out


@pytest.mark.parametrize("src", LAYOUTS, ids=lambda s: "from-dp%d-pp%d-tp%d" % s)
def test_any_source_layout_reads_back_exactly_into_any_target_layout(written, src):
    full = full_weights()
    directory = written[src]
    index = ckpt.read_index(directory)
    ckpt.verify_files(directory, index)
    # every tensor is tiled exactly once over the files, and reads back whole
    reader = ckpt.Reader(directory)
    for name, t in full.items():
        assert torch.equal(reader.read(ckpt.weights_key("actor", 1, name)), t), name
    # every rank of every target layout reads exactly its pieces (the workers' own resume path)
    for dst in LAYOUTS:
        target = layout(*dst)
        for r in target.ranks:
            got = worker(r, resume=directory).holdings.version_shards("actor", 1, target)
            want = shard_of(full, SHAPES, target, r, ARCH.layers)
            assert got.keys() == want.keys()
            assert all(torch.equal(got[n], want[n]) for n in want), (src, dst, r)
    assert sorted(ckpt.load_checkpoint(directory)["rng"]) == list(layout(*src).ranks)


def test_each_worker_writes_only_its_share_and_replicas_split_the_bytes(written):
    files = {f: os.path.getsize(os.path.join(written[(2, 1, 1)], f)) for f in os.listdir(written[(2, 1, 1)])
             if f.endswith(".safetensors")}
    assert sorted(files) == ["rank-00000.safetensors", "rank-00001.safetensors"]
    a, b = files.values()
    assert abs(a - b) < 0.2 * (a + b)
    # a piece replicated over TP is written by t = 0 only
    index = ckpt.read_index(written[(1, 1, 2)])
    norm = index["tensors"][ckpt.weights_key("actor", 1, "norm.weight")]["shards"]
    assert [s["file"] for s in norm] == ["rank-00000.safetensors"]
    wq = index["tensors"][ckpt.weights_key("actor", 1, "layers.0.attn.wq.weight")]["shards"]
    assert sorted((s["file"], s["offsets"][0]) for s in wq) == [("rank-00000.safetensors", 0),
                                                                ("rank-00001.safetensors", SHAPES["layers.0.attn.wq.weight"][0] // 2)]


def test_reader_reads_arbitrary_boxes_across_shards(tmp_path):
    t = torch.arange(7 * 10, dtype=torch.float32).reshape(7, 10)
    reps = [ckpt.write_shard_file(str(tmp_path / "a.safetensors"), {"x": (t[:, :3], ((0, 0), (7, 3)), (7, 10)),
                                                                     "s": (torch.tensor(2.0), ((), ()), ())}),
            ckpt.write_shard_file(str(tmp_path / "b.safetensors"), {"x": (t[:, 3:], ((0, 3), (7, 7)), (7, 10))})]
    ckpt.write_index(str(tmp_path), ckpt.build_index(ckpt.FORMAT, reps))
    r = ckpt.Reader(str(tmp_path))
    for off, ext in (((0, 0), (7, 10)), ((2, 1), (3, 5)), ((0, 3), (7, 1)), ((6, 9), (1, 1)), ((1, 2), (4, 2))):
        want = t[off[0]:off[0] + ext[0], off[1]:off[1] + ext[1]]
        assert torch.equal(r.read("x", (off, ext)), want), (off, ext)
    assert r.read("s").item() == 2.0 and r.read("s").dim() == 0


def test_the_index_refuses_shards_that_overlap_or_leave_a_gap(tmp_path):
    t = torch.zeros(4, 4)
    a = ckpt.write_shard_file(str(tmp_path / "a.safetensors"), {"x": (t[:, :2], ((0, 0), (4, 2)), (4, 4))})
    b = ckpt.write_shard_file(str(tmp_path / "b.safetensors"), {"x": (t[:, 1:3], ((0, 1), (4, 2)), (4, 4))})
    with pytest.raises(RpegError, match="overlap"):
        ckpt.build_index(ckpt.FORMAT, [a, b])
    with pytest.raises(RpegError, match="cover 8 of its 16 elements"):
        ckpt.build_index(ckpt.FORMAT, [a])


def _one_line(err: RpegError, path: str) -> None:
    text = str(err)
    assert "\n" not in text and path in text, text


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "header"])
def test_a_damaged_shard_file_is_a_one_line_error_naming_it(tmp_path, damage):
    d = str(tmp_path)
    write_checkpoint(d, layout(1, 1, 2))
    shard = os.path.join(d, "rank-00001.safetensors")
    data = open(shard, "rb").read()
    if damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
        open(shard, "wb").write(data)
    elif damage == "truncate":
        open(shard, "wb").write(data[: len(data) // 2])
    elif damage == "missing":
        os.remove(shard)
    else:
        open(shard, "wb").write(b"\xff" * len(data))
    index = ckpt.read_index(d)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.verify_files(d, index)
    _one_line(err.value, shard)
    if damage in ("truncate", "header", "missing"):  # unverified reads fail as clearly
        with pytest.raises(ckpt.CheckpointError) as err:
            ckpt.Reader(d).read(ckpt.weights_key("actor", 1, "layers.0.attn.wq.weight"))
        _one_line(err.value, shard)


@pytest.mark.parametrize("text, message", [
    (None, "the index is missing"),
    ("{not json", "cannot read the checkpoint index"),
    ('{"format": "other"}', "not a torch-backend index"),
    ("BROKEN_SHARDS", "its shards cover"),
    ("BAD_DTYPE", "has dtype 'float99', which is not a torch dtype"),
])
def test_a_broken_index_is_a_one_line_error_naming_it(tmp_path, text, message):
    d = str(tmp_path)
    write_checkpoint(d, layout(2, 1, 1))
    path = os.path.join(d, ckpt.INDEX)
    if text is None:
        os.remove(path)
    elif text == "BROKEN_SHARDS":
        index = json.load(open(path))
        key = ckpt.weights_key("actor", 1, "embed.weight")
        index["tensors"][key]["shards"] = [{"file": "rank-00000.safetensors", "offsets": [0, 0], "shape": [1, 1]}]
        open(path, "w").write(json.dumps(index))
    elif text == "BAD_DTYPE":  # found where the index is read (the controller, on resume), not by a worker later
        index = json.load(open(path))
        index["tensors"][ckpt.weights_key("actor", 1, "embed.weight")]["dtype"] = "float99"
        open(path, "w").write(json.dumps(index))
    else:
        open(path, "w").write(text)
    with pytest.raises(ckpt.CheckpointError, match=message) as err:
        ckpt.read_index(d)
    _one_line(err.value, path)


def test_the_run_identity_names_what_differs():
    shapes = {"actor": SHAPES}
    base = ckpt.run_identity(0, RUN, MODELS, shapes, {"actor": 0})
    assert ckpt.identity_difference(base, json.loads(json.dumps(base))) is None
    assert ckpt.identity_difference(base, ckpt.run_identity(1, RUN, MODELS, shapes, {"actor": 0})) == \
        "--seed is 0 in the checkpoint, 1 here"
    assert ckpt.identity_difference(base, ckpt.run_identity(0, RUN, MODELS, shapes, {"actor": 1})) == \
        "staleness @actor is 0 in the checkpoint, 1 here"
    other = RunConfig(**{**RUN.__dict__, "workload": Workload(B=8, R=2, Lp=4, Lr=4, dtype="fp32")})
    assert ckpt.identity_difference(base, ckpt.run_identity(0, other, MODELS, shapes, {"actor": 0})) == \
        "the run configuration workload.B is 4 in the checkpoint, 8 here"
    wide = {"actor": {**SHAPES, "norm.weight": (128,)}}
    assert "model @actor params.norm.weight is [64] in the checkpoint, [128] here" == \
        ckpt.identity_difference(base, ckpt.run_identity(0, RUN, MODELS, wide, {"actor": 0}))


def test_an_uncommitted_checkpoint_is_ignored_removed_and_leaves_the_previous_one(tmp_path):
    run_dir = str(tmp_path)
    for step in (1, 2, 3):
        p = PendingDirectory(ckpt.checkpoint_path(run_dir, step), "the checkpoint")
        write_checkpoint(p.path, layout(1, 1, 1), version=step)
        p.commit()
    # a crash while writing step 4: a .partial with one shard and no index
    crashed = PendingDirectory(ckpt.checkpoint_path(run_dir, 4), "the checkpoint")
    open(os.path.join(crashed.path, "rank-00000.safetensors"), "wb").write(b"\0" * 100)
    assert [s for s, _ in ckpt.complete_checkpoints(run_dir)] == [1, 2, 3]
    assert ckpt.latest_checkpoint(run_dir) == ckpt.checkpoint_path(run_dir, 3)
    ckpt.remove_partials(run_dir)
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step-000001", "step-000002", "step-000003"]
    assert ckpt.prune_checkpoints(run_dir, 2) == [ckpt.checkpoint_path(run_dir, 1)]
    assert [s for s, _ in ckpt.complete_checkpoints(run_dir)] == [2, 3]
    # committing over an existing checkpoint replaces it whole
    p = PendingDirectory(ckpt.checkpoint_path(run_dir, 3), "the checkpoint")
    write_checkpoint(p.path, layout(2, 1, 1), version=3)
    p.commit()
    assert sorted(os.listdir(ckpt.checkpoint_path(run_dir, 3))) == [
        "index.json", "rank-00000.safetensors", "rank-00001.safetensors"]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step-000002", "step-000003"]
