"""ZeRO over the data-parallel group in the torch backend at each stage a plan may state (issue 32, items 1, 2 and 6;
paper App. B: ZeRO-2 for P_d > 1): with dp = 2 each replica keeps the Adam state (and in bf16 mixed precision the
float32 master weights) of its share of the parameters only under ZeRO 1 and 2, of all of them under ZeRO 0; ZeRO-2
reduces the gradients inside every microbatch's backward pass and keeps its share only; a training step gives the
weights of dp = 1 within float32 summation-order bounds, in bf16 within one bf16 rounding of a gradient. Run with
the backend's own operators (`Operators.op`) in two gloo worker processes."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.core.ir.training import Training  # noqa: E402
from rpegc.tools.measure import WorkerPool  # noqa: E402

B, R, LP, LR = 4, 2, 4, 6
N = B * R  # sequences
ARCH = lookup("tiny-4l")
MICROBATCHES = 4  # of dp = 1; dp = 2 runs half as many per replica, so every microbatch has the same two rows


def training(zero: int, precision: str = "fp32") -> Training:
    return Training(precision, zero, "interval", "1f1b")


def _run_config(dtype: str = "fp32"):
    from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config

    # Adam's eps 1e-5 (as the PPO equivalence test): its first step moves a weight by lr g / (|g| + eps), so the
    # float32 noise of a gradient summed in another order (~1e-7 of the terms summed) moves it by at most about
    # lr * noise / eps; with eps = 1e-8 an entry whose terms cancel to ~eps moved by up to 2e-3 lr here.
    return RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype=dtype),
                     rl=toy_rl_config("grpo", adam_eps=1e-5), positions="learned")


def _layouts():
    from rpegc.runtime.backends.torch.parallel.layout import Layout

    return {1: Layout((0,), 1, 1, 1), 2: Layout((0, 1), 2, 1, 1)}


def _setup(ctx) -> None:
    """A worker per dtype on every rank (making one creates process groups: every rank takes part)."""
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.worker.process import ModelSpec, Worker, WorkerSetup

    models = {"actor": ModelSpec("actor", "policy", ARCH, model_seed(0, "policy"))}
    for dtype in ("fp32", "bf16"):
        setup = WorkerSetup(world=ctx.world, seed=0, run=_run_config(dtype), models=models,
                            layouts=tuple(_layouts().values()), tp_impl="torch", t0=time.time(), timeout_s=60.0)
        ctx.state[dtype] = Worker(setup, ctx.rank)


def _worker(ctx, dtype: str):
    """The rank's worker of `dtype`, holding nothing: a training state trains one way per model and layout, and each
    run trains its own."""
    worker = ctx.state[dtype]
    worker.holdings.training.clear()
    worker.holdings.entries.clear()
    return worker


def _train(ctx, dp: int, zero: int, dtype: str = "fp32", rows: dict | None = None, mb: int = 0) -> dict | None:
    """One training step of the actor under (dp, 1, 1, MICROBATCHES / dp) at ZeRO stage `zero`; this rank's new
    weights, its masters and its Adam state's names. `rows`: each rank's rows (default: an even split); `mb`: the
    microbatches (default MICROBATCHES / dp)."""
    from rpegc.runtime.backends.torch.parallel.layout import replica_rows
    from rpegc.runtime.backends.torch.channel.commands import Op

    layout = _layouts()[dp]
    if ctx.rank not in layout.ranks:
        return None
    worker = _worker(ctx, dtype)
    gen = torch.Generator().manual_seed(3)
    batch = {"sequences": torch.randint(1, ARCH.vocab, (N, LP + LR), generator=gen), "mask": torch.ones(N, LR),
             "old_logprobs": -2.0 * torch.rand(N, LR, generator=gen),
             "ref_logprobs": -2.0 * torch.rand(N, LR, generator=gen), "scores": torch.rand(N, generator=gen),
             "task_scores": torch.rand(N, generator=gen)}
    worker.put_rows("batch", 0, N, batch)
    weights = f"W:dp{dp}"
    worker.install(weights, "actor", layout)
    precision = "fp32" if dtype == "fp32" else "mixed"
    worker.execute(Op(node=f"train-dp{dp}", tag=0, ranks=list(layout.ranks), step=0, role="training", model="actor",
                      layout=layout, mb=mb or MICROBATCHES // dp, rows=rows or replica_rows(layout, 0, N),
                      weights=weights, inputs=["batch"], outputs={}, fields=[], prep=[],
                      output=f"{weights}:trained", version_out=1, train=training(zero, precision), take=True))
    st = worker.holdings.training[("actor", layout)]
    names = {id(p): n for n, p in st.master.values.items()}
    return {"weights": {n: t.clone() for n, t in worker.entry(f"{weights}:trained").shards.items()},
            "state": sorted(names[id(p)] for p in st.master.optimizer.state),
            "owned": sorted(n for n, o in st.pm.grads.owner.items() if o == st.pm.d), "masters": st.master.export(),
            "module_dtypes": {p.dtype for p in st.pm.params().values()},
            "grads": [n for n, p in st.pm.params().items() if p.grad is not None],
            "holds_input": worker.holds(weights), "shares": st.shares}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, timeout_s=120) as p:
        p.run(_setup)
        yield p


@pytest.mark.parametrize("zero", [1, 2])
def test_each_replica_keeps_the_adam_state_of_its_share_only(pool, zero):
    ranks = pool.run(_train, 2, zero)
    shares = [set(r["state"]) for r in ranks]
    assert shares == [set(r["owned"]) for r in ranks]  # the optimizer made state for the owned share alone
    assert not shares[0] & shares[1] and shares[0] | shares[1] == set(ranks[0]["weights"])  # the shares tile it
    assert all(not r["grads"] for r in ranks)  # no gradient outlives the step
    sizes = [sum(ranks[0]["weights"][n].numel() for n in s) for s in shares]
    assert max(sizes) <= 0.6 * sum(sizes)  # balanced: about half each
    for name, t in ranks[0]["weights"].items():  # every replica has the updated weights
        assert torch.equal(t, ranks[1]["weights"][name]), name


def test_zero0_replicates_the_adam_state_and_every_replica_steps_everything(pool):
    ranks = pool.run(_train, 2, 0)
    for r in ranks:
        assert set(r["state"]) == set(r["weights"])  # every parameter's Adam state on each replica
        assert not r["grads"]
    for name, t in ranks[0]["weights"].items():  # the same all-reduced gradients, the same Adam updates
        assert torch.equal(t, ranks[1]["weights"][name]), name


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_zero_over_two_replicas_trains_the_weights_of_one(pool, zero):
    """The same microbatch gradients summed (the reduce adds what one replica accumulates; ZeRO-2 adds the per
    microbatch reductions); the replicas' statistic sums (token counts, advantage moments) and the global norm add
    in another order, a few float32 ulps of the gradients. Adam's first step moves each weight by about lr in the
    direction of its gradient, so the weights agree far within lr: no element's step differs by more than 1e-3 lr
    (one that flipped would differ by 2 lr)."""
    two = pool.run(_train, 2, zero)[0]
    one = pool.run(_train, 1, zero)[0]
    lr = _run_config().rl.lr_actor
    for name, want in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], want, rtol=0, atol=1e-3 * lr, msg=name)
    assert set(one["state"]) == set(one["weights"])  # one replica owns everything


def test_zero2_with_fewer_rows_than_microbatches_on_one_replica_still_pairs_its_reductions(pool):
    """Replica 0 has 2 rows (one prompt's group) for 4 microbatches, replica 1 has 6: replica 0 runs two backward
    passes and reduces zeros for the other two, so both make the same reductions; the step trains the weights ZeRO-1
    trains on the same microbatches (which reduces once: the sums differ in order only, bound as above)."""
    rows = {0: (0, 2), 1: (2, N)}
    ranks = pool.run(_train, 2, 2, "fp32", rows, 4)
    once = pool.run(_train, 2, 1, "fp32", rows, 4)[0]
    lr = _run_config().rl.lr_actor
    for name, want in once["weights"].items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name
        torch.testing.assert_close(ranks[0]["weights"][name], want, rtol=0, atol=1e-3 * lr, msg=name)


@pytest.mark.parametrize("zero", [0, 2])
def test_bf16_zero_keeps_float32_masters_of_its_share_and_trains_the_weights_of_one_replica(pool, zero):
    """Two microbatches of the same rows: dp 1 accumulates their bf16 gradients in bf16, round(a + b); dp 2 (one
    microbatch per replica) reduces the same two bf16 gradients in bf16, round(a + b) as well (ZeRO-2 adds that to
    its empty share exactly). What differs is float32 noise in the statistics (as in the float32 test), which can
    move a gradient entry across a bf16 rounding boundary: one bf16 ulp, at most 2^-7 of the entry. Adam's first step
    moves an entry by lr g / (|g| + eps), whose change under a relative change r of g is at most
    lr r eps |g| / (|g| + eps)^2 <= lr r / 4: the masters agree within lr (2^-9 + 1e-3). (More microbatches would add
    the bf16 terms in another order on each side, which an entry near zero does not bound.)"""
    two = pool.run(_train, 2, zero, "bf16", None, 1)
    one = pool.run(_train, 1, zero, "bf16", None, 2)[0]
    assert all(r["module_dtypes"] == {torch.bfloat16} for r in two + [one])
    for r in two:  # float32 masters and Adam state of what the replica steps, nothing else
        assert sorted(r["masters"]) == r["state"] == (sorted(r["weights"]) if zero == 0 else r["owned"])
        assert {t.dtype for t in r["masters"].values()} == {torch.float32}
    merged = {**two[0]["masters"], **two[1]["masters"]}
    assert sorted(merged) == sorted(one["masters"])
    lr = _run_config().rl.lr_actor
    for name, want in one["masters"].items():
        torch.testing.assert_close(merged[name], want, rtol=0, atol=lr * (2.0 ** -9 + 1e-3), msg=name)
    for name, t in two[0]["weights"].items():  # every replica serves the bf16 rounding of the masters
        assert torch.equal(t, two[1]["weights"][name]) and torch.equal(t, merged[name].to(torch.bfloat16)), name


def test_mixed_precision_publishes_its_working_copy_and_takes_the_input_over(pool):
    """One bf16 copy per model on a training worker (the memory model's M_w): the step took its input copy over
    (the entry is gone), and the version it published is the module's own tensors."""
    for r in pool.run(_train, 2, 2, "bf16"):
        assert not r["holds_input"] and r["shares"] == "W:dp2:trained"
    for r in pool.run(_train, 2, 2, "fp32"):  # float32: the masters stay, the published version is a copy
        assert not r["holds_input"] and r["shares"] is None


def _train_watching_the_backward(ctx, dp: int, bucket_bytes: int) -> dict | None:
    """`_train` under ZeRO-2 with buckets of `bucket_bytes`, noting every bucket reduced (its owner, its gradients,
    which gradients the replica held once it was launched, and whether a backward pass was running)."""
    from contextlib import contextmanager

    from rpegc.runtime.backends.torch.parallel.zero import ZeroGradients

    seen: list[dict] = []
    original_launch, original_ready = ZeroGradients._launch_reduce, ZeroGradients.reducing_as_ready
    inside = []

    def watched(self, owner, names, params):
        reduction = original_launch(self, owner, names, params)
        held = sorted(n for n, p in params.items() if p.grad is not None)
        seen.append({"owner": owner, "names": list(names), "held": held, "inside": bool(inside)})
        return reduction

    def ready(self):
        self.bucket_bytes, self._buckets = bucket_bytes, None
        inside.append(True)
        try:
            with original_ready(self):
                yield
        finally:
            inside.clear()

    ZeroGradients._launch_reduce = watched
    ZeroGradients.reducing_as_ready = contextmanager(ready)
    try:
        out = _train(ctx, dp, 2)
    finally:
        ZeroGradients._launch_reduce = original_launch
        ZeroGradients.reducing_as_ready = original_ready
    return None if out is None else {"seen": seen, "owned": out["owned"], "names": sorted(out["weights"]),
                                     "replica": ctx.rank}


@pytest.mark.parametrize("bucket_bytes", [1, 1 << 30])
def test_zero2_reduces_the_gradients_inside_every_backward_and_keeps_its_share_only(pool, bucket_bytes):
    """ZeRO-2 as the memory model prices it (M_grad = s_b W / P_d, a reduction per microbatch): during each
    microbatch's backward pass the completed gradients go to their owner bucket by bucket (one parameter each with
    1-byte buckets, while the backward still runs; with huge ones, one bucket per owner as it ends), every replica
    lets go of them at once, and both replicas reduce the same buckets in the same order; nothing is reduced outside
    a backward pass."""
    ranks = pool.run(_train_watching_the_backward, 2, bucket_bytes)
    assert [b["names"] for b in ranks[0]["seen"]] == [b["names"] for b in ranks[1]["seen"]]
    passes = MICROBATCHES // 2
    for r in ranks:
        assert all(b["inside"] for b in r["seen"])
        reduced = [n for b in r["seen"] for n in b["names"]]
        assert sorted(reduced) == sorted(r["names"] * passes)  # every parameter, once per microbatch
        mine = set(r["owned"])
        for b in r["seen"]:
            assert all((n in mine) == (b["owner"] == r["replica"]) for n in b["names"])  # one owner's bucket
            assert not set(b["names"]) & set(b["held"])  # dropped by owner and others alike
    buckets = len(ranks[0]["seen"]) // passes
    assert buckets == (len(ranks[0]["names"]) if bucket_bytes == 1 else 2)


def _train_counting_scalar_allreduces(ctx, zero: int) -> int | None:
    """`_train` at dp = 2, counting the AllReduces of a few numbers (not of gradients) on the replicas' group."""
    import torch.distributed as dist

    original, counted = dist.all_reduce, []

    def counting(tensor, *args, **kwargs):
        if tensor.numel() <= 16:
            counted.append(tensor.numel())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        out = _train(ctx, 2, zero)
    finally:
        dist.all_reduce = original
    return None if out is None else len(counted)


@pytest.mark.parametrize("zero", [0, 2])
def test_the_cost_model_prices_every_scalar_allreduce_of_a_training_step(pool, zero):
    """The latency-bound AllReduces of statistics a GRPO training step makes over its DP group are the ones the cost
    model prices under accounting = backend (`optime.backend_scalar_allreduces`): 4 + the gradient norm's under ZeRO
    >= 1. A statistic reduced more or less often than priced fails here."""
    from rpegc.core.cost.optime import backend_scalar_allreduces

    assert pool.run(_train_counting_scalar_allreduces, zero) == [backend_scalar_allreduces(zero)] * 2
