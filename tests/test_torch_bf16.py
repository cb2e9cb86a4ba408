"""`workload.dtype = bf16` in the torch backend: serving copies and serving forwards in bf16, training in bf16
mixed precision (docs/cost-model-spec.md Sec. 6: s_b bytes per parameter for serving copies, weight transfers, the
training working copy and its gradients; float32 master weights and Adam state for each replica's ZeRO share).

What a distributed bf16 run shares with the reference, and what it cannot (these tests must hold
on any x86-64 CPU, i.e. under every kernel path torch and oneDNN may pick: ATEN_CPU_CAPABILITY=default,
avx2, avx512, ONEDNN_MAX_CPU_ISA=AVX2, AMX; tests/test_numerics_isa.py re-runs the sensitive checks there):
- Publication is a discontinuous function of the master. A published version is bf16(master), and the
  masters of a distributed run and of the reference differ by float32 summation noise (another reduction
  order over replicas, shards and microbatches; after Adam up to lr in near-zero gradient entries). Any
  entry whose master lies near a bf16 rounding boundary then rounds the other way: the serving copies
  differ by one bf16 ulp (2u|w|, u = 2^-8) in a few entries (measured: 3 of 140224 after one GRPO step),
  the next step's KL by 4.7e-7 (2.4e-5 relative: bf16, not float32, noise), and a sampled token may flip,
  which changes everything after it. So no tolerance derived from float32 noise holds for a step >= 1
  served from independently trained masters, and none derived from bf16 either without bounding how
  many tokens flip. The equivalence tests therefore compare each step from the same state
  (`assert_same_steps`): step k of the reference starts from the distributed run's own checkpoint of
  boundary k (its serving copies, float32 masters and Adam state), so both serve the same bf16 copy by
  construction, and what remains is what one step adds: the layout dependence of the bf16 serving forward
  (none for DP/PP serving, below) and the rounding of bf16 training (`_bf16_training_bound`).
- bf16 training rounds every stored activation and gradient to bf16, and a distributed run rounds in
  another order than the single process: microbatch gradients are accumulated in bf16, replicas' gradients
  reduced in bf16, TP partial sums rounded per rank, and oneDNN may block a GEMM differently per row count
  (measured here: the training losses agree within 6e-5 under TP, the gradient norms within 1e-3 relative).
  The statistics the training forward makes (losses, gradient norms) are compared within the first-order bound
  derived in `_bf16_training_bound`; the weights within Adam's per-step bound (`_adam_step_bound`), since Adam's
  sign-like update turns a rounding difference in a near-zero gradient entry into up to two steps' difference.
- DP and PP serving split a batch by rows (replicas, microbatches). On every kernel path above, a
  sequence's bf16 forward does not depend on how many rows share its call (checked below for 32 down to
  2 rows, and measured for 1 row too; the RMSNorm statistic is float32, a bf16 mean would be reduced in
  another order per batch size), so rollouts and log-probs of the same copy are identical. Not
  identical across paths: a cached decode (one query position per call) and a teacher-forced forward
  (all positions in one call) block their bf16 GEMMs differently under ATEN_CPU_CAPABILITY=avx2, and
  their logits differ by ~1 bf16 ulp (measured 2.4e-3, log-probs 2.2e-3); the comparisons of generation
  with inference below use the bf16 bound derived in `_decode_vs_forward_bound`, or the same path on
  both sides.
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

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.runtime.backends.base import BackendError  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.channel.commands import Export, Op  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import model_seed, run_config  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import (FORMAT, Reader, build_index, checkpoint_path,
                                                                   # noqa: E402
                                                    latest_checkpoint, load_checkpoint)
from rpegc.runtime.backends.torch.model.generation import generate  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout, replica_rows  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import (NetOptions, build_model, cast_weights,  # noqa: E402
                                                export_weights, install_weights, serving_dtype)
from rpegc.runtime.backends.torch.model.transformer import param_shapes  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms.rollout import ReferenceTrainer  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from rpegc.runtime.backends.torch.run_config import RunConfig, toy_config, toy_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import response_forward  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import ModelSpec, Worker, standalone_worker  # noqa: E402
from fixtures.torch_runs import (PPO4, STAT_ABS, STAT_REL, compile_plan, model_names,  # noqa: E402
                                       run_torch)

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
    """Rows computed in batches of 32, 16, 4 or 2 agree: the same tokens, and log-probabilities within the
    rounding bound of two bf16 paths (oneDNN may block a GEMM differently per batch size: on an AVX-512 CPU
    two-row batches differ by 4e-5, under AVX2 not at all). A row that saw another row would differ by O(1)."""
    net = NetOptions(max_seq=LP + LR, positions="learned")
    model = build_model(ARCH, "actor_critic", 5, net).to(torch.bfloat16)
    prompts = torch.randint(0, ARCH.vocab, (32, LP), generator=torch.Generator().manual_seed(0))
    bound = _decode_vs_forward_bound(model)
    with torch.no_grad():
        whole = generate(model, prompts, range(32), seed=0, step=0, max_new_tokens=LR)
        fwd = response_forward(model, whole.sequences, LP)
        assert whole.logprobs.dtype == fwd.logprobs.dtype == fwd.values.dtype == torch.float32
        for rows in (16, 4, 2):
            parts = [(a, a + rows) for a in range(0, 32, rows)]
            split = [generate(model, prompts[a:b], range(a, b), seed=0, step=0, max_new_tokens=LR) for a, b in parts]
            assert torch.equal(torch.cat([s.sequences for s in split]), whole.sequences)
            assert (torch.cat([s.logprobs for s in split]) - whole.logprobs).abs().max().item() <= bound
            split_fwd = torch.cat([response_forward(model, whole.sequences[a:b], LP).logprobs for a, b in parts])
            assert (split_fwd - fwd.logprobs).abs().max().item() <= bound


U_BF16 = 2.0 ** -8  # bf16 unit roundoff: 8 significand bits, round to nearest


def _decode_vs_forward_bound(model, temperature: float = 1.0) -> float:
    """A bound on |log p(decode) - log p(teacher-forced forward)| of any token of a bf16 `model`.

    Why this bound: in exact arithmetic both paths compute the same logits z. In bf16 every stored tensor
    is its float32-accumulated value rounded once (relative error <= u; the float32 accumulation error,
    ~K * 2^-24 for a K-term dot product, is negligible beside it), and the two paths may round
    differently (another GEMM blocking, another attention kernel), so a stored value may differ by up to
    2u relative between them. A difference travels from layer to layer in the residual stream, which is
    rounded once by the embedding sum and twice per block, and every branch reads it through an RMSNorm
    that removes its scale; with the final norm's output h that is N = 2L + 2 roundings, and to first
    order (unit gain through the normalised branches) each path's h is within N u of the exact one, so
    |dh_k| <= 2 N u |h_k|. The logit z_i = bf16(sum_k W_ik h_k) then differs by at most
    2 N u S_i + 2 u |z_i| <= 2 (N + 1) u S_i, with S_i = sum_k |W_ik| |h_k| (the dot product's condition)
    <= ||W_i||_2 ||h||_2 <= ||W_i||_2 sqrt(d) max|g| (an RMSNorm output has unit rms before its gain g),
    whatever the tokens. A log-softmax moves by at most 2 max_i |dz_i| (the logit's own change plus the
    log-sum-exp's, at most the largest logit change). On the tiny actor: 0.17, measured 2.2e-3 (ATEN avx2)."""
    n = 2 * model.arch.layers + 2
    w = model.lm_head.weight.float()
    s = w.norm(dim=1).max().item() * model.arch.hidden ** 0.5 * model.norm.weight.float().abs().max().item()
    return 4 * (n + 1) * U_BF16 * s / temperature


# ---------------------------------------------------------------------------------------------------
# One worker: what it keeps in which dtype


def _worker() -> Worker:
    run = RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype="bf16"),
                    rl=toy_rl_config("grpo"), positions="learned")
    models = {"actor": ModelSpec("actor", "policy", ARCH, model_seed(0, "policy")),
              "ref": ModelSpec("ref", "reference", ARCH, model_seed(0, "reference"))}
    worker = standalone_worker(run, models, device=torch.device("cpu"))
    for m in models:
        worker.install(f"W:{m}", m, SINGLE)
    return worker


def _op(role: str, model: str, fields: list[str], inputs: list[str], output: str | None = None) -> Op:
    return Op(node=role, tag=0, ranks=list(SINGLE.ranks), step=0, role=role, model=model, layout=SINGLE, mb=MB,
              rows=replica_rows(SINGLE, 0, B * R), weights=f"W:{model}", inputs=inputs,
              outputs={"out": fields} if fields else {}, fields=fields, prep=[],
              output=output, version_out=1 if output else None)


def _n_params(kind: str, net: NetOptions = NetOptions(max_seq=LP + LR, positions="learned")) -> int:
    return sum(torch.Size(s).numel() for s in param_shapes(ARCH, kind, net).values())


def test_serving_copies_are_bf16_and_serving_ops_return_float32():
    worker = _worker()
    for m in ("actor", "ref"):
        entry = worker.entry(f"W:{m}")
        assert {t.dtype for t in entry.shards.values()} == {torch.bfloat16}
        assert entry.nbytes() == 2 * _n_params(worker.setup.models[m].kind)  # s_b = 2 bytes per parameter
    info = worker.execute(_op("generation", "actor", ["sequences", "mask", "old_logprobs"], []))
    assert info["versions_in"] == {"actor": 0}
    worker.holdings.entries["rollouts"] = worker.holdings.entries.pop("out")
    worker.execute(_op("inference", "ref", ["ref_logprobs"], ["rollouts"]))
    ref_logprobs = worker.entry("out").pieces[0].fields["ref_logprobs"]
    assert ref_logprobs.dtype == torch.float32
    assert worker.entry("rollouts").pieces[0].fields["old_logprobs"].dtype == torch.float32
    # the serving modules compute in bf16; at version 0 the actor serves the reference's values
    for key, pm in worker.holdings.serving.items():
        assert {p.dtype for p in pm.module.parameters()} == {torch.bfloat16}, key
    rollouts = worker.entry("rollouts").pieces[0].fields
    actor = build_model(ARCH, "policy", 0, worker.run.net).to(torch.bfloat16)
    install_weights(actor, worker.entry("W:actor").shards)
    with torch.no_grad():
        # the same teacher-forced path as the reference's inference: identical on every CPU
        assert torch.equal(response_forward(actor, rollouts["sequences"], LP).logprobs, ref_logprobs)
        # generation's log-probs come from cached decodes, another blocking of the same bf16 arithmetic
        bound = _decode_vs_forward_bound(actor)
    assert (rollouts["old_logprobs"] - ref_logprobs).abs().max().item() <= bound


def test_bf16_training_keeps_float32_masters_and_adam_state_and_publishes_its_bf16_working_copy(tmp_path):
    worker = _worker()
    net = NetOptions(max_seq=LP + LR, positions="learned")
    initial = export_weights(build_model(ARCH, "policy", model_seed(0, "policy"), net))
    # the master starts from the float32 version 0, not from the bf16 serving copy it was cast from
    master0 = worker.states.master_shards("actor", SINGLE, worker.entry("W:actor"))
    assert all(torch.equal(master0[n], initial[n]) for n in initial)
    assert any(not torch.equal(worker.entry("W:actor").shards[n].float(), initial[n]) for n in initial)

    worker.execute(_op("generation", "actor", ["sequences", "mask", "old_logprobs"], []))
    worker.holdings.entries["rollouts"] = worker.holdings.entries.pop("out")
    worker.execute(_op("inference", "ref", ["ref_logprobs"], ["rollouts"]))
    worker.holdings.entries["ref_lp"] = worker.holdings.entries.pop("out")
    scores = torch.linspace(0, 1, B * R)
    worker.put_rows("scores", 0, B * R, {"scores": scores, "task_scores": scores})
    info = worker.execute(_op("training", "actor", [], ["rollouts", "ref_lp", "scores"], output="W:actor v1"))
    assert info["versions_out"] == {"actor": 1}

    state = worker.holdings.training[("actor", SINGLE)]
    # mixed precision: the module (forward, backward, gradients) is bf16, the masters and Adam state float32
    assert {p.dtype for p in state.pm.params().values()} == {torch.bfloat16}
    master = state.master.values
    assert set(master) == set(state.pm.params()) and {p.dtype for p in master.values()} == {torch.float32}
    moments = [v for s in state.master.optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(master) and {v.dtype for v in moments} == {torch.float32}
    assert state.master.nbytes() == 12 * _n_params("policy") + 4 * len(master)  # spec 6.1's 12 B/param, step counts
    published = worker.entry("W:actor v1")
    assert published.version == 1 and published.nbytes() == 2 * _n_params("policy")
    for n, p in master.items():
        assert torch.equal(published.shards[n], p.detach().to(torch.bfloat16)), n
        assert torch.equal(state.pm.params()[n].detach(), published.shards[n]), n  # the working copy, published
    assert any(not torch.equal(published.shards[n].float(), p.detach()) for n, p in master.items())

    # checkpoints and final weights save the master, not its bf16 copy
    reply = worker.execute(Export(export=1, dir=str(tmp_path), weights=[["W:actor v1", "weights/actor/v1/"]],
                                  optimizer=[["actor", SINGLE]]))
    assert reply["file"] == "rank-00000.safetensors" and "payload" not in reply  # a file, not bytes in a message
    reader = Reader(str(tmp_path), index=build_index(FORMAT, [reply]))
    assert all(torch.equal(reader.read(f"weights/actor/v1/{n}"), p.detach()) for n, p in master.items())
    assert all(reader.read(f"weights/actor/v1/{n}").dtype == torch.float32 for n in master)


# ---------------------------------------------------------------------------------------------------
# Distributed runs against the reference


SERVING_KEYS = ("reward", "kl")  # of the serving forwards of a step, served the same bf16 copy on both sides
TRAINING_KEYS = ("policy_loss", "kl_loss", "value_loss", "actor_grad_norm", "critic_grad_norm")


def _bf16_training_bound(plan) -> float:
    """A first-order bound on how much a training statistic (a loss: a mean of per-token terms of order one, as
    STAT_ABS takes; or a gradient norm, relative) differs between two bf16 computations that round in different
    orders. As in `_decode_vs_forward_bound`: the residual stream is rounded once by the embedding sum and twice
    per block (N = 2L + 2 roundings), each path's output is within N u of the exact one and the head rounds once
    more, so two paths differ by at most 2 (N + 1) u relative; a gradient is rounded as often on its way back
    and then once per microbatch accumulated and once per reduction over replicas (mb + dp roundings more)."""
    trains = [n.node for n in plan.nodes if n.kind == "op" and n.node.role == "training"]
    layers = max(plan.program.model(n.model).arch.layers for n in trains)
    sums = max(n.strategy.mb + n.strategy.dp for n in trains)
    return 2 * (2 * layers + 3 + sums) * U_BF16


def _adam_step_bound(cfg) -> float:
    """The most two Adam steps from the same state can differ in one entry: each moves it by at most
    lr (1 - beta1) / sqrt(1 - beta2) (Kingma and Ba 2015, Sec. 2.1, for (1 - beta1) > sqrt(1 - beta2)), or lr."""
    b1, b2 = cfg.rl.adam_betas
    lr = max(cfg.rl.lr_actor, cfg.rl.lr_critic)
    return 2 * lr * max(1.0, (1 - b1) / (1 - b2) ** 0.5)


def _restart_from(trainer: ReferenceTrainer, saved: dict, names: dict[str, str], k: int) -> None:
    """Put the reference in the distributed run's state at step boundary k: its bf16 serving copies of
    version k, its float32 masters and Adam state."""
    models = {"actor": (trainer.actor, trainer.actor_master, trainer.actor_versions)}
    if trainer.critic is not None:
        models["critic"] = (trainer.critic, trainer.critic_master, trainer.critic_versions)
    for role, (model, master, store) in models.items():
        weights, adam = saved["versions"][names[role]][k], saved["optimizer"][names[role]]
        # the cast of the master, or of the serving copy itself (exact): the copy the run served
        store.versions[k] = cast_weights(weights, store.dtype)
        # every trained model's float32 master and Adam state, also where a Reshard moved its published
        # copy to another layout (PPO4's critic): the checkpoint reads them from the training state
        assert adam, f"the checkpoint of step {k} holds no Adam state of {role}"
        model.load_state_dict(weights)  # the bf16 working copy: the cast of the master
        master.load(weights)
        for n in master.names:
            master.set_adam_state(n, {key: v.clone() if isinstance(v, torch.Tensor) else v for key, v in adam[n].items()})


def assert_same_steps(plan, backend, run_dir: str, rl: dict) -> None:
    """Every step of a bf16 run against the reference started from the same state (module docstring):
    step 0 from the seeds, step k >= 1 from the run's checkpoint of boundary k (run with checkpoint_every=1).
    Both sides then serve the same bf16 copy, so the serving statistics agree within float32 noise (the
    tolerances of tests/test_torchrun_equivalence.py), the training statistics within `_bf16_training_bound`,
    and the final weights, one step from a common master, within `_adam_step_bound`."""
    cfg = run_config(plan.program, rl=rl)
    names = model_names(plan)
    trainer = ReferenceTrainer(cfg, seed=0)
    initial = trainer.weights()
    bound = _bf16_training_bound(plan)
    for k in range(plan.steps):
        if k:
            _restart_from(trainer, load_checkpoint(checkpoint_path(run_dir, k)), names, k)
        want, got = trainer.step(k), backend.metrics[k]
        for key in SERVING_KEYS:
            assert got[key] == pytest.approx(want[key], rel=STAT_REL, abs=STAT_ABS), (k, key)
        for key in TRAINING_KEYS:
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=bound, abs=bound), (k, key)
    final = trainer.weights()
    atol = _adam_step_bound(cfg)
    for role, name in names.items():
        for n, w in final[role].items():
            torch.testing.assert_close(backend.final_weights[name][n], w, rtol=0, atol=atol, msg=f"{role} {n}")
        moved = max((final[role][n] - initial[role][n]).abs().max().item() for n in final[role])
        assert moved > cfg.rl.lr_actor  # the runs trained (Adam moves an entry by about lr per step)


PLAN_DP_PP = """rpeg.plan @p for @grpo on @cpu4 {
  @gen         at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @ref_inf     at (0, 0, 2) extent (1, 1, 2) dp = 1 pp = 2 tp = 1 mb = 2
  @reward_inf  at (0, 0, 2) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 2
}
"""


def test_bf16_grpo_with_dp_and_pp_serving_matches_the_reference(tmp_path):
    # generation dp 2 in two quantile phases, reference inference pp 2 with 2 microbatches, training
    # dp 2 x pp 2 in bf16 mixed precision; the published actor travels as a bf16 copy
    text = GRPO_BF16[:GRPO_BF16.index("rpeg.plan @p")] + PLAN_DP_PP
    plan = compile_plan(tmp_path, "grpo-bf16.rpeg", steps=2, text=text)
    run_dir = str(tmp_path / "run")
    backend, result = run_torch(plan, run_dir=run_dir, checkpoint_every=1)
    assert run_config(plan.program).serving_dtype == torch.bfloat16
    assert_same_steps(plan, backend, run_dir, rl={})
    assert {t.dtype for t in backend.final_weights["actor"].values()} == {torch.float32}
    # Step 0 serves the actor's version 0, which is the reference model's copy: the KL is 0 in exact
    # arithmetic, and generation (cached decodes) and inference (one forward) differ by bf16 rounding only.
    actor = build_model(ARCH, "policy", model_seed(0, "policy"), run_config(plan.program).net)
    bound = _decode_vs_forward_bound(actor.to(torch.bfloat16))
    assert abs(backend.metrics[0]["kl"]) <= bound
    # The publication Comm moves version 1 to the generation devices 0-1, which each hold one of the two
    # training pipeline stages and receive the other: one full copy in all, at 2 bytes per parameter.
    publication = [r for r in result.trace.nodes.values() if r.kind == "comm" and dict(r.consumed) == {"actor": 1}]
    n_actor = _n_params("policy", run_config(plan.program).net)
    assert publication and all(r.bytes == 2 * n_actor for r in publication)


def test_bf16_ppo_with_colocated_reshards_matches_the_reference(tmp_path):
    # PPO4 of the fp32 test with reference inference dp 2 instead of tp 2 (no TP in serving): generation
    # and tp-2 actor training share devices 0-1 (bf16 Reshards both ways, and training starts its float32
    # master from version 0 itself, not from the bf16 copy both read), critic inference pp 2 and critic
    # training dp 2 share devices 2-3. Final weights: the float32 masters, not bf16 copies.
    ref_tp2 = "@ref_inf      at (0, 0, 2) extent (1, 1, 2) dp = 1 pp = 1 tp = 2"
    ref_dp2 = "@ref_inf      at (0, 0, 2) extent (1, 1, 2) dp = 2 pp = 1 tp = 1"
    assert ref_tp2 in PPO4
    text = PPO4.replace("dtype = fp32", "dtype = bf16").replace(ref_tp2, ref_dp2)
    plan = compile_plan(tmp_path, "ppo4-bf16.rpeg", steps=2, text=text)
    rl = {"adam_eps": 1e-5}
    run_dir = str(tmp_path / "run")
    backend, result = run_torch(plan, rl=rl, run_dir=run_dir, checkpoint_every=1)
    assert_same_steps(plan, backend, run_dir, rl=rl)
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


def test_an_fp32_trained_actor_serving_bf16_copies_matches_the_reference(tmp_path):
    """precision = fp32 on a bf16 workload (the plan's training field): the trainer computes in float32, its
    parameters are its masters (no float32 copy beside them), each version goes out as a bf16 copy; the reference
    trains the actor in float32 too (`RunConfig.actor_precision`), so every step agrees as the bf16 ones do."""
    plan_text = PLAN_DP_PP.replace("dp = 2 pp = 2 tp = 1 mb = 2", "dp = 2 pp = 2 tp = 1 mb = 2 precision = fp32 zero = 1")
    text = GRPO_BF16[:GRPO_BF16.index("rpeg.plan @p")] + plan_text
    plan = compile_plan(tmp_path, "grpo-bf16-fp32.rpeg", steps=2, text=text)
    cfg = run_config(plan.program)
    assert cfg.actor_precision == "fp32" and cfg.training_dtype("actor") == torch.float32
    run_dir = str(tmp_path / "run")
    backend, _ = run_torch(plan, run_dir=run_dir, checkpoint_every=1)
    assert_same_steps(plan, backend, run_dir, rl={})
