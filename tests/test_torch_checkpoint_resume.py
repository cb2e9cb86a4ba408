"""A model whose checkpoint exceeds 64 MiB trains with a checkpoint per step on 2 CPU workers, is killed,
and resumes under the same plan and under other plans and ends with the weights of the uninterrupted run.

The actor has 2 blocks of hidden 512, ffn 2048 (8.4M parameters): a checkpoint holds its float32 weights
and both Adam moments, about 100 MB, which the old control channel (an 8 MiB TCPStore payload) could
not carry. Each worker writes its own shards into the run directory; the resumed runs read them back
resharded into another layout.

Plans: A trains with dp = 2, B with tp = 2, C with pp = 2 (2 microbatches); all generate, score and
compute reference log-probs with dp = 2, so every resumed run samples the same tokens.

Tolerances. Resuming under A must reproduce the uninterrupted run bit for bit. Under B and C the resumed
step's gradient g2 is recomputed in another layout: C's two microbatches are the rows of A's two
replicas and their gradients are added once either way, B sums the attention and MLP reductions (at most
n = ffn = 2048 terms) in two TP halves, another order. The runs use Adam eps = 1 so that the update
u = m/(sqrt(v) + eps) is Lipschitz in g2: with |g| <= grad_clip = 1, |du/dg2| <= (1-b1)/(1-b1^2) +
(1-b2)/(1-b2^2) * |m| * |g2| / sqrt(v) <= 0.53 + 0.5 * sqrt(2) < 2 (sqrt(v) >= |g2| / sqrt(2) at step 2).
A reordered sum of n terms of the gradient's scale (<= grad_clip) differs by at most 2 n u (u = 2^-24),
so |dw| <= lr * 2 * 2 n u, plus the rounding of w - lr * u itself (2 u |w|). (With torch's eps = 1e-8
Adam's update is sign-like and turns such rounding differences of near-zero gradient entries into
differences up to 2 lr; see tests/test_torch_bf16.py.)
"""

from __future__ import annotations

import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rpegc.runtime.backends.base import BackendError  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import (complete_checkpoints, load_checkpoint,  # noqa: E402
                                                    load_final, read_index)
from fixtures.programs import grpo_two_workers  # noqa: E402
from fixtures.torch_runs import compile_plan  # noqa: E402
from fixtures.torch_runs import LR, RL, U

FFN = 2048

WORKLOAD = "rpeg.workload {B = 4, R = 4, Lp = 4, Lr = 4, dtype = fp32}"
ACTOR = "rpeg.model @actor  {layers = 2, hidden = 512, ffn = 2048, vocab = 64, heads = 8, gated = true, kind = policy, trainable}"
REF = "rpeg.model @ref    {layers = 2, hidden = 512, ffn = 2048, vocab = 64, heads = 8, gated = true, kind = reference}"
TRAIN = {"A": "  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1",
         "B": "  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 1 tp = 2 mb = 1",
         "C": "  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 2"}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = {}
    for name, line in TRAIN.items():
        d = tmp_path_factory.mktemp(f"plan{name}")
        out[name] = compile_plan(d, "big.rpeg", steps=2, text=grpo_two_workers(WORKLOAD, ACTOR, REF, line, quantiles=False))
    return out


def backend(run_dir: str, **options) -> TorchBackend:
    return TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, rl=RL, **options)


@pytest.fixture(scope="module")
def uninterrupted(plans, tmp_path_factory):
    b = backend(str(tmp_path_factory.mktemp("full")))
    run(plans["A"], b)
    return b


@pytest.fixture(scope="module")
def killed(plans, tmp_path_factory):
    """A run of plan A killed (SIGKILL of worker 0) in step 1's training, after step 1's checkpoint."""
    run_dir = str(tmp_path_factory.mktemp("killed") / "run")
    b = backend(run_dir, fault="kill:train_actor#1")
    with pytest.raises(BackendError, match="killed by signal 9 while running node train_actor#1"):
        run(plans["A"], b)
    return run_dir


def test_the_checkpoint_exceeds_64_mib_and_each_worker_wrote_its_own_shards(killed, uninterrupted):
    (step, path), = complete_checkpoints(killed)
    assert step == 1 and sorted(os.listdir(os.path.dirname(path))) == ["step-000001"]  # no .partial left
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    # a file per rank and part: the actor's (written as its training of step 0 ended) and the RNG states
    assert files == ["rank-00000-actor.safetensors", "rank-00000.safetensors", "rank-00001-actor.safetensors",
                     "rank-00001.safetensors"]
    sizes = [os.path.getsize(os.path.join(path, f)) for f in files]
    assert sum(sizes) > 64 * 2 ** 20
    assert min(sizes[0], sizes[2]) > 0.4 * sum(sizes)  # the two data-parallel replicas share the writing
    index = read_index(path)
    assert index["step"] == 1 and index["versions"] == {"actor": [1]} and index["optimizer"] == ["actor"]
    n_actor = sum(torch.Size(t["shape"]).numel() for k, t in index["tensors"].items() if k.startswith("weights/"))
    assert n_actor > 8_000_000
    saved = load_checkpoint(path)
    assert set(saved["optimizer"]["actor"]) == set(saved["versions"]["actor"][1])
    assert all(int(s["step"]) == 1 and s["exp_avg"].shape == s["exp_avg_sq"].shape
               for s in saved["optimizer"]["actor"].values())
    assert sorted(saved["rng"]) == [0, 1]
    # what the uninterrupted run reported writing is what lies on disk
    stat = next(s for s in uninterrupted.io_stats if s["what"] == "checkpoint")
    assert stat["step"] == 1 and stat["files"] == 4 and stat["bytes"] == sum(sizes)


def test_the_cost_model_prices_the_files_the_checkpoint_holds(killed, plans):
    """core/cost/checkpoint.py's files, tensors and bytes per worker are the checkpoint's: a file per rank for the
    actor and one for its RNG state, every tensor of the index (the learned position embedding's and the RNG states'
    included), and the masters' and Adam moments' bytes (the spec-form model leaves its 2.5 K norm weights out of
    W_shard: 3e-4 of 8.4 M)."""
    from rpegc.core.cost.checkpoint import rank_writes

    (_, path), = complete_checkpoints(killed)
    index = read_index(path)
    writes = rank_writes(plans["A"].program)
    assert [(w.device, w.files) for w in writes] == [(0, 2), (1, 2)]
    assert sum(w.tensors for w in writes) == len(index["tensors"])
    state = sum(torch.Size(t["shape"]).numel() * 4 for k, t in index["tensors"].items()
                if k.startswith("weights/") or k.endswith("/exp_avg") or k.endswith("/exp_avg_sq"))
    assert sum(w.bytes for w in writes) == pytest.approx(state, rel=5e-4)


def test_the_final_weights_are_sharded_files_in_the_run_directory(uninterrupted):
    on_disk = load_final(uninterrupted.run_dir)
    assert set(on_disk) == {"actor"}
    assert all(torch.equal(on_disk["actor"][n], w) for n, w in uninterrupted.final_weights["actor"].items())
    assert not os.path.exists(os.path.join(uninterrupted.run_dir, "final.pt"))


def _resume(killed: str, plan, tmp_path) -> TorchBackend:
    run_dir = str(tmp_path / "resumed")
    shutil.copytree(killed, run_dir)
    b = backend(run_dir, resume=True)
    rest = b.prepare(plan)
    assert {n.step for n in rest.nodes} == {1}
    run(rest, b)
    return b


def test_resuming_under_the_same_plan_reaches_the_uninterrupted_weights_bit_for_bit(plans, killed, uninterrupted,
                                                                                     tmp_path):
    resumed = _resume(killed, plans["A"], tmp_path)
    for name, w in uninterrupted.final_weights["actor"].items():
        assert torch.equal(resumed.final_weights["actor"][name], w), name
    assert resumed.metrics[1] == uninterrupted.metrics[1]


@pytest.mark.parametrize("other", ["B", "C"])
def test_resuming_under_another_plan_reshards_and_agrees_within_fp32_rounding(plans, killed, uninterrupted,
                                                                              tmp_path, other):
    assert plans[other].hash != plans["A"].hash
    resumed = _resume(killed, plans[other], tmp_path)
    atol = LR * 2 * 2 * FFN * U  # the module docstring
    for name, w in uninterrupted.final_weights["actor"].items():
        got = resumed.final_weights["actor"][name]
        torch.testing.assert_close(got, w, rtol=2 * U, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    assert resumed.metrics[1]["reward"] == uninterrupted.metrics[1]["reward"]  # the same sampled tokens
