"""Pipelined pipeline parallelism in the torch backend (docs/cost-model-spec.md Sec. 3.3: microbatches
in flight across stages for inference, training and generation [A6]).

With pp = 2 and mb = 4, the backend's own operators (`Operators.op`, run in two gloo worker processes)
give the outputs of pp = 1 and of the single-process functions. That the stages overlap is checked
without timing anything:
- a gate: the last stage may not compute microbatch 0's heads until stage 0 has run the forward of
  the LAST microbatch (training, 1F1B: of microbatch pp - 1, the first one after its warm-up). A schedule that synchronises the stages per microbatch (a broadcast, a blocking
  send, logits sent back before stage 0 goes on) never opens the gate and the operator fails on the
  gate's timeout; a pipelined one passes;
- each stage's recorded schedule (`ParallelModel.trace`): generation runs decode step by decode step
  over all microbatches (a wavefront), results are broadcast once at the end, not per microbatch;
  training runs 1F1B (at most pp microbatches' activations live on a stage), or GPipe where the plan says so.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.tools.measure import WorkerPool  # noqa: E402

B, LP, LR, MB = 8, 4, 6, 4
ARCH = lookup("tiny")
GATE_TIMEOUT_S = 20.0
FIELDS = {"generation": ("sequences", "mask", "old_logprobs"), "inference": ("ref_logprobs",)}


def _run_config():
    from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config

    return RunConfig(algorithm="ppo", actor=ARCH, workload=Workload(B=B, R=1, Lp=LP, Lr=LR, dtype="fp32"),
                     rl=toy_rl_config("ppo"), critic=ARCH, reward="model", reward_arch=ARCH, positions="learned")


def _layouts():
    from rpegc.runtime.backends.torch.parallel.layout import Layout

    return {1: Layout((0,), 1, 1, 1), 2: Layout((0, 1), 1, 2, 1)}


def _batch() -> dict:
    """Synthetic rollouts and experience of all B rows (what generation and inference would produce)."""
    gen = torch.Generator().manual_seed(3)
    return {"sequences": torch.randint(1, ARCH.vocab, (B, LP + LR), generator=gen), "mask": torch.ones(B, LR),
            "old_logprobs": -2.0 * torch.rand(B, LR, generator=gen), "ref_logprobs": -2.0 * torch.rand(B, LR, generator=gen),
            "values": 0.1 * torch.randn(B, LR, generator=gen), "scores": torch.rand(B, generator=gen),
            "task_scores": torch.rand(B, generator=gen)}


# ---------------------------------------------------------------------------------------------------
# Run in the worker processes (module-level: the pool pickles them by name)


def _setup(ctx, gate_path: str) -> None:
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.worker.process import ModelSpec, Worker, WorkerSetup

    names = {"policy": "actor", "reference": "ref", "critic": "critic", "reward": "reward"}
    models = {n: ModelSpec(n, k, ARCH, model_seed(0, k)) for k, n in names.items()}
    setup = WorkerSetup(world=ctx.world, seed=0, run=_run_config(), models=models,
                        layouts=tuple(_layouts().values()), tp_impl="torch", t0=time.time(), timeout_s=60.0)
    ctx.state["worker"] = Worker(setup, ctx.rank)
    ctx.state["gate"] = torch.distributed.FileStore(gate_path, ctx.world)


def _install_gate(pm, store, name: str, timeout_s: float, forwards: int = MB) -> dict:
    """Stage 0 opens gate `name` once it ran `forwards` forwards (default: the last microbatch's); the last stage
    waits for it (at most `timeout_s`, then goes on) before its first heads, microbatch 0's. Returns
    {"opened": bool} on the last stage once it waited: whether the gate opened in time."""
    state: dict = {}
    if pm.is_first:
        forward_layers, calls = pm.module.forward_layers, []

        def counted(*args, **kwargs):
            out = forward_layers(*args, **kwargs)
            calls.append(1)
            if len(calls) == forwards:
                store.set(name, "open")
            return out
        pm.module.forward_layers = counted
    if pm.is_last:
        heads = pm.module.heads

        def gated(h):
            if "opened" not in state:
                try:
                    store.wait([name], timedelta(seconds=timeout_s))
                    state["opened"] = True
                except RuntimeError:  # the store's timeout
                    state["opened"] = False
            return heads(h)
        pm.module.heads = gated
    return state


def _remove_gate(pm) -> None:
    for name in ("forward_layers", "heads"):
        pm.module.__dict__.pop(name, None)


def _op(ctx, role: str, pp: int, gated: bool, schedule: str = "1f1b") -> dict | None:
    """One operator under (dp, pp, tp, mb) = (1, pp, 1, MB): this rank's outputs and schedule trace (training: a
    fresh training state, on the pipeline `schedule`)."""
    from rpegc.core.ir.training import Training
    from rpegc.runtime.backends.torch.parallel.layout import replica_rows
    from rpegc.runtime.backends.torch.channel.commands import Op

    layout = _layouts()[pp]
    if ctx.rank not in layout.ranks:
        return None
    worker, batch = ctx.state["worker"], _batch()
    model = {"generation": "actor", "inference": "ref", "training": "actor"}[role]
    weights = f"W:{model}:pp{pp}"
    worker.install(weights, model, layout)
    rows = replica_rows(layout, 0, B)
    cmd = Op(node=f"{role}-pp{pp}", tag=0, ranks=list(layout.ranks), step=0, role=role, model=model, layout=layout,
             mb=MB, rows=rows, weights=weights, inputs=["batch"], outputs={}, fields=[], prep=[], output=None,
             version_out=None)
    worker.put_rows("batch", 0, B, batch)
    if role == "training":
        train = Training("fp32", 2, "interval", schedule)
        cmd = replace(cmd, output=f"{weights}:trained", version_out=1, train=train)
        worker.holdings.training.pop((model, layout), None)
        pm = worker.states.state(model, layout, train).pm
    else:
        cmd = replace(cmd, outputs={"result": list(FIELDS[role])}, fields=list(FIELDS[role]))
        pm, _ = worker.operators.serving_model(model, layout, weights)
    pm.trace = []
    # 1F1B training: stage 0 runs pp - 1 warm-up forwards and the first steady one before it needs a gradient
    forwards = min(pp, MB) if role == "training" and schedule == "1f1b" else MB
    gate = _install_gate(pm, ctx.state["gate"], f"{role}-pp{pp}", GATE_TIMEOUT_S, forwards) if gated else {}
    info = worker.execute(cmd)
    _remove_gate(pm)
    out = {"trace": [(e.what, e.key) for e in pm.trace], "metrics": info.get("metrics"), "gate": gate.get("opened")}
    if role == "training":
        out["weights"] = worker.entry(cmd.output).shards
    else:
        out["fields"] = worker.entry("result").pieces[0].fields
    return out


def _initial_actor(ctx) -> dict | None:
    """Version 0 of the actor as the single-process reference builds it."""
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.model.transformer import build_model, export_weights

    if ctx.rank != 0:
        return None
    return export_weights(build_model(ARCH, "policy", model_seed(0, "policy"), _run_config().net))


def _single_process(ctx, role: str) -> dict | None:
    """What the single-process functions give for the same rows, microbatch by microbatch (rank 0)."""
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.model.generation import expand_rollouts, generate
    from rpegc.runtime.backends.torch.model.transformer import build_model
    from rpegc.runtime.backends.torch.rl.step import response_forward

    if ctx.rank != 0:
        return None
    worker, cfg = ctx.state["worker"], _run_config()
    kind = "policy" if role == "generation" else "reference"
    model = build_model(ARCH, kind, model_seed(0, kind), cfg.net)
    chunks = [(j * B // MB, (j + 1) * B // MB) for j in range(MB)]
    if role == "generation":
        prompts = expand_rollouts(worker.operators.inputs.prompts.prompts(B, 0, 0), 1)
        rolls = [generate(model, prompts[a:b], range(a, b), seed=0, step=0, max_new_tokens=LR,
                          sampling=cfg.rl.sampling) for a, b in chunks]
        return {"sequences": torch.cat([r.sequences for r in rolls]), "mask": torch.cat([r.mask for r in rolls]),
                "old_logprobs": torch.cat([r.logprobs for r in rolls])}
    seqs = _batch()["sequences"]
    with torch.no_grad():
        return {"ref_logprobs": torch.cat([response_forward(model, seqs[a:b], LP, cfg.rl.temperature).logprobs
                                           for a, b in chunks])}


def _serialized_inference(ctx) -> bool | None:
    """Reference inference at pp = 2 the way the backend ran it before (one microbatch through the whole
    pipeline, broadcast, then the next), under a short gate: whether the gate opened (last stage)."""
    from rpegc.runtime.backends.torch.parallel.schedules import infer
    from rpegc.runtime.backends.torch.rl.step import response_forward

    layout = _layouts()[2]
    pm, _ = ctx.state["worker"].operators.serving_model("ref", layout, "W:ref:pp2")
    gate = _install_gate(pm, ctx.state["gate"], "serialized", timeout_s=1.0)
    seqs = _batch()["sequences"]
    for j in range(MB):
        rows = seqs[j * B // MB:(j + 1) * B // MB]
        infer(pm, [lambda v, s=rows: response_forward(v, s, LP).logprobs], [rows.shape[0]])
    _remove_gate(pm)
    return gate.get("opened")


# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    gate = tmp_path_factory.mktemp("gate") / "store"
    with WorkerPool(2, timeout_s=60.0) as p:
        p.run(_setup, str(gate))
        yield p


def _stage_events(trace, what: str):
    return [key for w, key in trace if w == what]


def test_pipelined_generation_matches_pp1_and_runs_as_a_wavefront(pool):
    piped = pool.run(_op, "generation", 2, True)
    assert piped[1]["gate"] is True  # stage 0 ran every microbatch's prefill before the last stage sampled one
    flat = pool.run(_op, "generation", 1, False)[0]
    single = pool.run(_single_process, "generation")[0]
    for f in FIELDS["generation"]:
        for rank in (0, 1):  # both stages hold the rollouts
            assert torch.equal(piped[rank]["fields"][f], flat["fields"][f]), (f, rank)
        assert torch.equal(flat["fields"][f], single[f]), f
    wavefront = [(step, j) for step in range(LR) for j in range(MB)]
    stage0, stage1 = piped[0]["trace"], piped[1]["trace"]
    assert _stage_events(stage0, "forward") == wavefront
    assert _stage_events(stage1, "forward") == wavefront and _stage_events(stage1, "sample") == wavefront
    for trace in (stage0, stage1):  # no per-step logits broadcast: only the rollouts, once, at the end
        assert [w for w, _ in trace[-3:]] == ["broadcast"] * 3 and _stage_events(trace[:-3], "broadcast") == []


def test_pipelined_inference_matches_pp1_and_broadcasts_once(pool):
    piped = pool.run(_op, "inference", 2, True)
    assert piped[1]["gate"] is True
    flat = pool.run(_op, "inference", 1, False)[0]
    single = pool.run(_single_process, "inference")[0]
    for rank in (0, 1):
        assert torch.equal(piped[rank]["fields"]["ref_logprobs"], flat["fields"]["ref_logprobs"])
    assert torch.equal(flat["fields"]["ref_logprobs"], single["ref_logprobs"])
    microbatches = [(j,) for j in range(MB)]
    for trace in (piped[0]["trace"], piped[1]["trace"]):
        assert trace == [("forward", key) for key in microbatches] + [("broadcast", ())]


def test_pipelined_training_matches_pp1(pool):
    piped = pool.run(_op, "training", 2, True)
    assert piped[1]["gate"] is True
    flat = pool.run(_op, "training", 1, False)[0]
    merged = {**piped[0]["weights"], **piped[1]["weights"]}
    assert set(piped[0]["weights"]).isdisjoint(piped[1]["weights"]) and set(merged) == set(flat["weights"])
    for name, want in flat["weights"].items():
        torch.testing.assert_close(merged[name], want, rtol=0, atol=1e-6, msg=name)
    initial = pool.run(_initial_actor)[0]
    moved = max((flat["weights"][n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-4  # the step trained: agreement is not the identity
    got, want = piped[1]["metrics"], flat["metrics"]
    for key in ("policy_loss", "actor_grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-5), key
    # 1F1B: stage 0 warms up with one forward, then alternates; the last stage alternates from the start
    steady = [e for j in range(1, MB) for e in (("forward", (j,)), ("backward", (j - 1,)))]
    assert piped[0]["trace"] == [("forward", (0,))] + steady + [("backward", (MB - 1,))]
    assert piped[1]["trace"] == [e for j in range(MB) for e in (("forward", (j,)), ("backward", (j,)))]


def test_gpipe_training_runs_every_forward_first_and_trains_the_weights_of_1f1b(pool):
    """GPipe (schedule = gpipe): each stage runs all MB forwards, then all backwards in order, holding every
    microbatch's activations; the gradients accumulate in the same order as under 1F1B, so the weights are bit for bit
    those of 1F1B."""
    gpipe = pool.run(_op, "training", 2, True, "gpipe")
    assert gpipe[1]["gate"] is True
    one_f_one_b = pool.run(_op, "training", 2, False, "1f1b")
    for rank in (0, 1):
        assert gpipe[rank]["trace"] == ([("forward", (j,)) for j in range(MB)] +
                                        [("backward", (j,)) for j in range(MB)])
        for name, want in one_f_one_b[rank]["weights"].items():
            assert torch.equal(gpipe[rank]["weights"][name], want), name


def test_the_gate_catches_a_schedule_that_synchronises_per_microbatch(pool):
    pool.run(_op, "inference", 2, False)  # installs the pp = 2 weights
    assert pool.run(_serialized_inference) == [None, False]
