"""`workload.dtype = bf16` in the torch backend: serving copies and serving forwards in bf16, training in
float32 (spec/cost-model.md Sec. 6: s_b bytes per parameter for serving copies and weight transfers, float32
master weights and Adam moments on training devices).

What holds, measured on this CPU (torch 2.13, oneDNN bf16 kernels):
- DP and PP serving round the same values in the same order as the single process: with the RMSNorm
  statistic in float32 the bf16 forward of a sequence does not depend on how many rows share its
  replica or microbatch (checked below for 2+ rows; a 1-row decode takes another attention path and can
  differ in the last bit). So rollouts, sampling log-probs and reference log-probs are bit-identical to
  the reference, and a distributed run matches it to the fp32 tolerances of
  tests/test_torchrun_equivalence.py (the remaining noise is float32 training, as there).
- TP serving sums bf16 partial products across ranks and rounds each partial to bf16, another order and
  more roundings than the single process's one GEMM: log-probs differ by bf16 rounding (~1e-3 relative).
  Its test checks identical tokens and rewards, the KL within 1e-4 absolute (measured 2e-6) and the
  gradient norm within 1e-3 relative (measured 5e-7), and compares no weights: Adam's sign-like first
  update turns such differences in near-zero gradient entries into differences up to 2 * lr.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.errors import RpegError  # noqa: E402
from rpegc.core.presets import lookup  # noqa: E402
from rpegc.core.program import Workload  # noqa: E402
from rpegc.runtime.backend import BackendError  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.torch_backend.backend import TorchBackend, model_seed, run_config  # noqa: E402
from rpegc.runtime.torch_backend.checkpoint import (FORMAT, Reader, build_index, latest_checkpoint,  # noqa: E402
                                                    load_checkpoint)
from rpegc.runtime.torch_backend.generation import generate  # noqa: E402
from rpegc.runtime.torch_backend.layout import Layout, replica_rows  # noqa: E402
from rpegc.runtime.torch_backend.models import (NetOptions, build_model, export_weights,  # noqa: E402
                                                serving_dtype)
from rpegc.runtime.torch_backend.parallel import param_shapes  # noqa: E402
from rpegc.runtime.torch_backend.reference import RunConfig, run_reference, toy_config, toy_rl_config  # noqa: E402
from rpegc.runtime.torch_backend.rl import response_forward  # noqa: E402
from rpegc.runtime.torch_backend.worker import Entry, ModelSpec, Piece, Worker, standalone_worker  # noqa: E402
from test_torchrun_equivalence import PPO4, assert_same_run, compile_plan, run_torch  # noqa: E402

ARCH = lookup("tiny")
B, R, LP, LR, MB = 4, 2, 4, 5, 2
SINGLE = Layout((0,), 1, 1, 1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "examples/grpo-tiny.rpeg")) as _f:
    GRPO_BF16 = _f.read().replace("dtype = fp32", "dtype = bf16")


# ---------------------------------------------------------------------------------------------------
# The dtype decision and the bf16 forward


def test_the_workload_dtype_chooses_the_serving_dtype():
    assert serving_dtype(Workload(1, 1, 1, 1, "fp32")) == torch.float32
    assert serving_dtype(Workload(1, 1, 1, 1, "bf16")) == torch.bfloat16
    assert serving_dtype(Workload(1, 1, 1, 1, "fp16")) == torch.float16
    with pytest.raises(RpegError, match="fp32, bf16, fp16"):
        serving_dtype(Workload(1, 1, 1, 1, "fp8"))
    assert toy_config("grpo", dtype="bf16").serving_dtype == torch.bfloat16


def test_a_bf16_forward_returns_float32_and_does_not_depend_on_the_batch_size():
    net = NetOptions(max_seq=LP + LR, positions="learned")
    model = build_model(ARCH, "actor_critic", 5, net).to(torch.bfloat16)
    prompts = torch.randint(0, ARCH.vocab, (32, LP), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = generate(model, prompts, range(32), seed=0, step=0, max_new_tokens=LR)
        fwd = response_forward(model, whole.sequences, LP)
        assert whole.logprobs.dtype == fwd.logprobs.dtype == fwd.values.dtype == torch.float32
        for rows in (16, 4, 2):
            parts = [(a, a + rows) for a in range(0, 32, rows)]
            split = [generate(model, prompts[a:b], range(a, b), seed=0, step=0, max_new_tokens=LR) for a, b in parts]
            assert torch.equal(torch.cat([s.sequences for s in split]), whole.sequences)
            assert torch.equal(torch.cat([s.logprobs for s in split]), whole.logprobs)
            split_fwd = torch.cat([response_forward(model, whole.sequences[a:b], LP).logprobs for a, b in parts])
            assert torch.equal(split_fwd, fwd.logprobs)


# ---------------------------------------------------------------------------------------------------
# One worker: what it keeps in which dtype


def _worker() -> Worker:
    run = RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype="bf16"),
                    rl=toy_rl_config("grpo"), positions="learned")
    models = {"actor": ModelSpec("actor", "policy", ARCH, model_seed(0, "policy")),
              "ref": ModelSpec("ref", "reference", ARCH, model_seed(0, "reference"))}
    worker = standalone_worker(run, models, device=torch.device("cpu"))
    for m in models:
        worker.cmd_install({"model": m, "layout": SINGLE, "version": 0, "label": f"W:{m}"})
    return worker


def _op(role: str, model: str, fields: list[str], inputs: list[str], output: str | None = None) -> dict:
    return {"type": "op", "node": role, "step": 0, "role": role, "model": model, "layout": SINGLE, "mb": MB,
            "rows": replica_rows(SINGLE, 0, B * R), "weights": f"W:{model}", "inputs": inputs,
            "outputs": {"out": fields} if fields else {}, "fields": fields, "prep": [], "tag": 0,
            "output": output, "version_out": 1 if output else None}


def _n_params(kind: str, net: NetOptions = NetOptions(max_seq=LP + LR, positions="learned")) -> int:
    return sum(torch.Size(s).numel() for s in param_shapes(ARCH, kind, net).values())


def test_serving_copies_are_bf16_and_serving_ops_return_float32():
    worker = _worker()
    for m in ("actor", "ref"):
        entry = worker.entries[f"W:{m}"]
        assert {t.dtype for t in entry.shards.values()} == {torch.bfloat16}
        assert entry.nbytes() == 2 * _n_params(worker.setup.models[m].kind)  # s_b = 2 bytes per parameter
    info = worker.cmd_op(_op("generation", "actor", ["sequences", "mask", "old_logprobs"], []))
    assert info["versions_in"] == {"actor": 0}
    worker.entries["rollouts"] = worker.entries.pop("out")
    worker.cmd_op(_op("inference", "ref", ["ref_logprobs"], ["rollouts"]))
    ref_logprobs = worker.entries["out"].pieces[0].fields["ref_logprobs"]
    assert ref_logprobs.dtype == torch.float32
    assert worker.entries["rollouts"].pieces[0].fields["old_logprobs"].dtype == torch.float32
    # the serving modules compute in bf16; at version 0 the actor serves the reference's values
    for key, pm in worker.serving.items():
        assert {p.dtype for p in pm.module.parameters()} == {torch.bfloat16}, key
    torch.testing.assert_close(ref_logprobs, worker.entries["rollouts"].pieces[0].fields["old_logprobs"],
                               rtol=0, atol=0)


def test_training_keeps_float32_master_and_adam_state_and_publishes_a_bf16_copy(tmp_path):
    worker = _worker()
    net = NetOptions(max_seq=LP + LR, positions="learned")
    initial = export_weights(build_model(ARCH, "policy", model_seed(0, "policy"), net))
    # the master starts from the float32 version 0, not from the bf16 serving copy it was cast from
    master0 = worker.master_shards("actor", SINGLE, worker.entries["W:actor"])
    assert all(torch.equal(master0[n], initial[n]) for n in initial)
    assert any(not torch.equal(worker.entries["W:actor"].shards[n].float(), initial[n]) for n in initial)

    worker.cmd_op(_op("generation", "actor", ["sequences", "mask", "old_logprobs"], []))
    worker.entries["rollouts"] = worker.entries.pop("out")
    worker.cmd_op(_op("inference", "ref", ["ref_logprobs"], ["rollouts"]))
    worker.entries["ref_lp"] = worker.entries.pop("out")
    scores = torch.linspace(0, 1, B * R)
    worker.entries["scores"] = Entry("data", pieces=[Piece(0, B * R, {"scores": scores, "task_scores": scores})])
    info = worker.cmd_op(_op("training", "actor", [], ["rollouts", "ref_lp", "scores"], output="W:actor v1"))
    assert info["versions_out"] == {"actor": 1}

    state = worker.training[("actor", SINGLE)]
    master = state.pm.params()
    assert {p.dtype for p in master.values()} == {torch.float32}
    moments = [v for s in state.optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(master) and {v.dtype for v in moments} == {torch.float32}
    published = worker.entries["W:actor v1"]
    assert published.version == 1 and published.nbytes() == 2 * _n_params("policy")
    for n, p in master.items():
        assert torch.equal(published.shards[n], p.detach().to(torch.bfloat16)), n
    assert any(not torch.equal(published.shards[n].float(), p.detach()) for n, p in master.items())

    # checkpoints and final weights save the master, not its bf16 copy
    reply = worker.cmd_export({"export": 1, "dir": str(tmp_path), "weights": [["W:actor v1", "weights/actor/v1/"]],
                               "optimizer": [["actor", SINGLE]]})
    assert reply["file"] == "rank-00000.safetensors" and "payload" not in reply  # a file, not bytes in a message
    reader = Reader(str(tmp_path), index=build_index(FORMAT, [reply]))
    assert all(torch.equal(reader.read(f"weights/actor/v1/{n}"), p.detach()) for n, p in master.items())
    assert all(reader.read(f"weights/actor/v1/{n}").dtype == torch.float32 for n in master)


# ---------------------------------------------------------------------------------------------------
# Distributed runs against the reference


PLAN_DP_PP = """rpeg.plan @p for @grpo on @cpu4 {
  @gen         at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @ref_inf     at (0, 0, 2) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 2
  @reward_inf  at (0, 0, 2) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 2
}
"""


def test_bf16_grpo_with_dp_and_pp_serving_matches_the_reference(tmp_path):
    # generation dp 2 in two quantile phases, reference inference pp 2 with 2 microbatches, training
    # dp 2 x pp 2 in float32; the published actor travels as a bf16 copy
    text = GRPO_BF16[:GRPO_BF16.index("rpeg.plan @p")] + PLAN_DP_PP
    plan = compile_plan(tmp_path, "grpo-bf16.rpeg", steps=2, text=text)
    backend, result = run_torch(plan)
    assert run_config(plan.program).serving_dtype == torch.bfloat16
    assert_same_run(plan, backend, rl={}, weights_atol=5e-5)  # the fp32 test's tolerances
    assert {t.dtype for t in backend.final_weights["actor"].values()} == {torch.float32}
    ref = run_reference(run_config(plan.program), 1, seed=0)
    assert backend.metrics[0]["kl"] == ref.metrics[0]["kl"] == 0.0  # same bf16 values on both sides
    # The publication Comm moves version 1 to the generation devices 0-1, which each hold one of the two
    # training pipeline stages and receive the other: one full copy in all, at 2 bytes per parameter.
    publication = [r for r in result.trace.nodes.values() if r.kind == "comm" and dict(r.consumed) == {"actor": 1}]
    n_actor = _n_params("policy", run_config(plan.program).net)
    assert publication and all(r.bytes == 2 * n_actor for r in publication)


def test_bf16_ppo_with_colocated_reshards_matches_the_reference(tmp_path):
    # PPO4 of the fp32 test with reference inference dp 2 instead of tp 2 (no TP in serving): generation
    # and tp-2 actor training share devices 0-1 (bf16 Reshards both ways, and training starts its float32
    # master from version 0 itself, not from the bf16 copy both read), critic inference pp 2 and critic
    # training dp 2 share devices 2-3. Final weights within 2e-5: the float32 masters, not bf16 copies.
    ref_tp2 = "@ref_inf      at (0, 0, 2) extent (1, 1, 2) dp = 1 pp = 1 tp = 2"
    ref_dp2 = "@ref_inf      at (0, 0, 2) extent (1, 1, 2) dp = 2 pp = 1 tp = 1"
    assert ref_tp2 in PPO4
    text = PPO4.replace("dtype = fp32", "dtype = bf16").replace(ref_tp2, ref_dp2)
    plan = compile_plan(tmp_path, "ppo4-bf16.rpeg", steps=2, text=text)
    rl = {"adam_eps": 1e-5}
    backend, result = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)
    moved = [r.bytes for r in result.trace.nodes.values() if r.kind == "reshard" and r.bytes]
    assert moved and all(b % 2 == 0 for b in moved)


def test_bf16_with_tp_serving_agrees_within_bf16_rounding(tmp_path):
    # grpo-tiny as it is (reference inference tp 2): see the module docstring for the tolerances
    plan = compile_plan(tmp_path, "grpo-tp-bf16.rpeg", steps=1, text=GRPO_BF16)
    assert any(n.kind == "op" and n.node.role == "inference" and n.node.strategy.tp == 2 for n in plan.nodes)
    backend, _ = run_torch(plan)
    got, want = backend.metrics[0], run_reference(run_config(plan.program), 1, seed=0).metrics[0]
    assert got["reward"] == pytest.approx(want["reward"], rel=1e-6)  # generation is dp only: same tokens
    assert got["kl"] == pytest.approx(want["kl"], abs=1e-4)
    assert got["actor_grad_norm"] == pytest.approx(want["actor_grad_norm"], rel=1e-3)


def test_a_resumed_bf16_run_reaches_the_uninterrupted_weights_bit_for_bit(tmp_path):
    # Checkpoints hold the float32 masters (and, for tau = 1, the older version generation still reads),
    # so resuming restarts training from exact values and re-creates the same bf16 serving copies.
    text = GRPO_BF16.replace("rpeg.staleness {@actor = 0}", "rpeg.staleness {@actor = 1}")
    plan = compile_plan(tmp_path, "grpo-bf16-tau1.rpeg", steps=3, text=text)
    full = TorchBackend(seed=0, tp_impl="torch", run_dir=str(tmp_path / "full"), checkpoint_every=1)
    run(plan, full)
    run_dir = str(tmp_path / "run")
    failed = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, fault="raise:train_actor#2")
    with pytest.raises(BackendError):
        run(plan, failed)
    saved = load_checkpoint(latest_checkpoint(run_dir))
    assert saved["step"] == 2 and sorted(saved["versions"]["actor"]) == [1, 2]
    master = saved["versions"]["actor"][2]  # full float32 values, not a bf16 copy widened back
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in master.values())
    resumed = TorchBackend(seed=0, tp_impl="torch", run_dir=run_dir, checkpoint_every=1, resume=True)
    run(resumed.prepare(plan), resumed)
    for name, weights in full.final_weights["actor"].items():
        assert torch.equal(resumed.final_weights["actor"][name], weights), name
