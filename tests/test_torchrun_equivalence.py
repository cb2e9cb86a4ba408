"""Semantics preserved: at tau = 0 a distributed torch-backend run of a legal plan gives
the losses and weights of the single-process reference (`reference.run_reference`) with the same seeds;
tau = 1 changes only which versions are read, and the trace shows them.

Tolerances. Per-step statistics (rewards, losses, gradient norms) within `STAT_REL` relative, or `STAT_REL`
absolute for those near zero (derived at `STAT_REL`; measured ~1e-8 relative on this machine). Weights are
compared after Adam, whose first updates are about lr * sign(g): for gradient entries near zero it turns
float32 summation noise (a different reduction order over replicas, shards and microbatches) into
differences up to lr. PPO's whitened advantages make the policy gradient a sum of cancelling terms with
many such entries (measured: 1e-3 after 3 steps with Adam's eps = 1e-8), so the PPO test runs both sides
with eps = 1e-5 (measured difference then 5e-6); GRPO needs nothing (measured 1e-5 with the defaults).
"""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.backends.torch.rl.algorithms.rollout import ReferenceTrainer  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from fixtures.torch_runs import PPO4, STAT_REL, assert_same_run, compile_plan, logits_of, model_names, run_torch


def chained(plan, trace) -> list[str]:
    """Nodes handed to their workers before a predecessor finished (chained dispatch, controller.py)."""
    preds, recs = plan.pred_ids(), trace.nodes
    return [r.id for r in recs.values() if any(recs[p].finish > r.dispatch for p in preds.get(r.id, ()) if p in recs)]


def test_grpo_with_phases_comm_dp_tp_and_pipeline_matches_the_reference(tmp_path):
    # generation dp 2 in two quantile phases, reference inference tp 2, reward dp 2, training pp 2 x tp 2
    # with 2 microbatches; Comm nodes move every container and the published actor between them.
    plan = compile_plan(tmp_path, "examples/grpo-tiny.rpeg", steps=2)
    kinds = {n.kind for n in plan.nodes}
    assert kinds == {"op", "comm"} and any(n.node.phase for n in plan.nodes)
    backend, result = run_torch(plan)
    assert_same_run(plan, backend, rl={}, weights_atol=5e-5)
    assert chained(plan, result.trace)  # the same results with nodes queued behind running ones
    moved = [r for r in result.trace.nodes.values() if r.kind == "comm"]
    assert all(r.bytes > 0 for r in moved)
    assert any(dict(r.consumed) == {"actor": 1} for r in moved)  # the publication Comm moved version 1


def test_ppo_with_reshards_pipelined_inference_and_whitening_over_replicas_matches_the_reference(tmp_path):
    # generation dp 2 and actor training tp 2 share devices 0-1 (Reshard both ways); critic inference pp 2
    # with 2 microbatches and critic training dp 2 share devices 2-3 (Reshard); PPO whitens advantages
    # with statistics summed over the data-parallel replicas.
    plan = compile_plan(tmp_path, "ppo4.rpeg", steps=2, text=PPO4)
    assert sum(n.kind == "reshard" for n in plan.nodes) >= 3
    rl = {"adam_eps": 1e-5}
    backend, result = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)
    assert any(result.trace.nodes[n].kind == "reshard" for n in chained(plan, result.trace))  # queued too
    assert any("names no algorithm; running PPO" in w for w in backend.warnings)  # PPO4 names none
    moved = {r.id: r.bytes for r in result.trace.nodes.values() if r.kind == "reshard"}
    # into a replicated layout every rank fetches the shards it lacks; into a sharded one it slices locally
    assert any(b > 0 for b in moved.values()) and any(b == 0 for b in moved.values())


@pytest.mark.parametrize("fields, loss", [
    ("zero = 2 recompute = full", {"loss_agg_mode": "seq-mean-token-mean", "kl_estimator": "k2", "policy_loss": "gspo",
                                   "adv_estimator": "rloo", "clip_eps_high": 0.28}),
    ("zero = 0 recompute = none schedule = gpipe", {"loss_agg_mode": "seq-mean-token-sum-norm",
                                                    "adv_estimator": "reinforce_plus_plus_baseline",
                                                    "overlong_buffer": 3})])
def test_the_training_fields_of_the_plan_train_the_reference_weights(tmp_path, fields, loss):
    """A trainer on dp 2 x pp 2 with 4 microbatches, training as the plan's placement says: ZeRO-2 reducing after
    each microbatch's backward with every layer recomputed, or ZeRO-0 without recomputation on the GPipe schedule.
    Both give the statistics and weights of the single-process reference (the bounds above: four microbatches on
    two replicas sum the gradients in another order than one batch, and with Adam's default eps 2 of the 105k
    weights differed by up to 1e-4, so both sides run with eps = 1e-5 as the PPO test does). Each runs a loss
    aggregation other than token-mean (per-sequence weights and a normaliser summed over the replicas' shards) and a
    GRPO variant: GSPO's sequence ratios with RLOO's baseline and DAPO's clip-higher, or REINFORCE++ with a group
    baseline, whose advantages are whitened with statistics summed over the replicas, of scores with DAPO's
    overlong shaping."""
    text = open("examples/grpo-tiny.rpeg").read().replace(
        "@train_actor at (0, 0, 0) extent (1, 1, 4) dp = 1 pp = 2 tp = 2 mb = 2",
        f"@train_actor at (0, 0, 0) extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 4 {fields}")
    assert fields in text
    plan = compile_plan(tmp_path, "grpo-trained.rpeg", steps=2, text=text)
    train = next(n.node.strategy.train for n in plan.nodes if n.kind == "op" and n.node.role == "training")
    assert " ".join(f"{k} = {v}" for k, v in train.items()) == fields  # the exec plan carries them
    rl = {"adam_eps": 1e-5, **loss}
    backend, _ = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)


def test_a_qwen3_shaped_model_trained_with_tp_and_pp_matches_the_reference(tmp_path):
    """Per-head q/k norms and a head dimension (24) other than hidden / heads (16): training pp 2 x tp 2, reference
    inference tp 2. Each TP rank normalises its own heads with the replicated norm weights, so their gradients are
    summed over the TP group; the reference trains the whole model in one process. The advantages are REINFORCE++'s:
    discounted returns of per-token rewards with the KL penalty in them, whitened over the batch."""
    qwen3 = 'arch = "tiny", head_dim = 24, qk_norm = true'
    text = open("examples/grpo-tiny.rpeg").read().replace('arch = "tiny", kind = policy', f"{qwen3}, kind = policy")
    text = text.replace('arch = "tiny", kind = reference', f"{qwen3}, kind = reference")
    plan = compile_plan(tmp_path, "grpo-qwen3.rpeg", steps=2, text=text)
    arch = next(m.arch for m in plan.program.models if m.kind == "policy")
    assert (arch.qk_norm, arch.head_dim, arch.hidden // arch.heads) == (True, 24, 16)
    rl = {"adam_eps": 1e-5, "adv_estimator": "reinforce_plus_plus", "kl_in_reward": True, "kl_estimator": "k1"}
    backend, _ = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)
    moved = backend.final_weights[model_names(plan)["actor"]]["layers.0.attn.q_norm.weight"]
    assert (moved - 1).abs().max() > 1e-4  # the norms trained


def test_a_gemma3_checkpoint_with_a_sliding_window_trained_with_dr_grpo_on_tp_and_pp_matches_the_reference(tmp_path):
    """A random Gemma 3 text checkpoint (`gemma3_text`, written by transformers: the .rpeg arch fields express only its
    post-norms, q/k norms and head_dim; its sliding window, GeGLU FFN, 1 + w norms, sqrt(d) embedding scale and
    query_pre_attn_scalar live in config.json): layer 0 sees the last 4 keys of Lp + Lr = 10, layer 1 all of them,
    head_dim 24 of hidden 32, the query scaled by 20 ** -0.5, tied embeddings. Training on the plan's pp 2 x tp 2 (the
    sliding-window layer on one stage, the full one on the other; each TP rank with 2 of the 4 heads and the
    replicated q/k norms), reference inference tp 2, under `rpeg.algorithm dr_grpo` (no std scaling, token sums over
    the constant N x Lr): the statistics and weights of the single-process reference. Bounds: STAT_REL for the
    statistics; for the weights, Adam's first sign-like step (module docstring) made Adam's default eps give 2.8e-5,
    so both sides run eps = 1e-5 as the Qwen3 test does (measured 5e-6; bound 2e-5, and the weights moved ~1e-2)."""
    pytest.importorskip("transformers")
    from rpegc.tools import arith
    from rpegc.runtime.backends.torch.model.hf import hf_net
    from rpegc.runtime.backends.torch.model.transformer import NetOptions

    ckpt = str(tmp_path / "gemma3")
    arith.write_checkpoint(ckpt, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=24, max_positions=32, tie=True,
                           model="gemma3_text", sliding_window=4, query_pre_attn_scalar=20)
    text = open("examples/grpo-tiny.rpeg").read().replace("rpeg.algorithm grpo", "rpeg.algorithm dr_grpo")
    for kind in ("policy", "reference"):
        text = text.replace(f'arch = "tiny", kind = {kind}', f'hf = "{ckpt}", kind = {kind}')
    plan = compile_plan(tmp_path, "grpo-gemma3.rpeg", steps=2, text=text)
    arch = next(m.arch for m in plan.program.models if m.kind == "policy")
    assert (arch.post_norms, arch.qk_norm, arch.head_dim, arch.tied) == (True, True, 24, True)
    rl = {"adam_eps": 1e-5}
    cfg = run_config(plan.program, rl=rl)
    assert (cfg.rl.norm_adv_by_std, cfg.rl.loss_agg_mode) == (False, "seq-mean-token-sum-norm")  # Dr. GRPO's
    net = hf_net(ckpt, NetOptions(max_seq=10))
    assert (net.mlp, net.embed_scale, net.sliding_window, net.sliding_layers) == ("geglu", True, 4, (0,))
    # the window matters: version 0's logits over Lp + Lr positions change when layer 0 sees every key
    x = torch.randint(9, arch.vocab, (2, 10), generator=torch.Generator().manual_seed(0))
    initial = ReferenceTrainer(cfg, seed=0).weights()["actor"]
    full = dataclasses.replace(net, sliding_layers=(), sliding_window=None)
    assert (logits_of(initial, arch, net, x) - logits_of(initial, arch, full, x)).abs().max() > 1e-2  # measured 0.3
    backend, _ = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=2e-5)
    trained = backend.final_weights[model_names(plan)["actor"]]
    for name in ("layers.0.attn_post_norm.weight", "layers.1.mlp_post_norm.weight", "layers.0.attn.k_norm.weight"):
        assert (trained[name] - initial[name]).abs().max() > 1e-4, name  # Gemma's norms trained (from 0: 1 + w)


def test_staleness_one_changes_only_the_versions_generation_reads(tmp_path):
    text = open("examples/grpo-tiny.rpeg").read().replace("rpeg.staleness {@actor = 0}", "rpeg.staleness {@actor = 1}")
    plan = compile_plan(tmp_path, "grpo-tau1.rpeg", steps=3, text=text)
    backend, result = run_torch(plan)
    read = {r.id: dict(r.consumed)["actor"] for r in result.trace.nodes.values()
            if r.kind == "op" and r.id.startswith("gen#")}
    assert read == {f"gen#{k}.q{q}": max(0, k - 1) for k in range(3) for q in (1, 2)}
    # the graph's reward model runs, as the plan prices it, though the toy rule trains (its score: compared below)
    assert all("reward_model_score" in backend.metrics[k] for k in range(3))
    assert_same_run(plan, backend, rl={}, weights_atol=5e-5)  # the reference also reads max(0, k - 1)


def test_a_frozen_reward_model_scores_instead_of_the_rule(tmp_path):
    plan = compile_plan(tmp_path, "examples/grpo-tiny.rpeg", steps=1)
    backend, _ = run_torch(plan, reward="model")
    ref = run_reference(run_config(plan.program, reward="model"), 1, seed=0)
    got, want = backend.metrics[0], ref.metrics[0]
    assert got["score"] == pytest.approx(want["score"], rel=STAT_REL) and got["score"] != got["reward"]
    assert got["reward"] == pytest.approx(want["reward"])  # the rule is still measured and reported
    for n, w in ref.weights["actor"].items():
        torch.testing.assert_close(backend.final_weights["actor"][n], w, rtol=0, atol=5e-5)


DIGITS_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    digits = [c for c in solution_str if c.isdigit()]
    return {"score": len(digits) / 4, "acc": float("".join(digits) == ground_truth)}
"""


def test_a_checkpoint_on_a_dataset_with_truncated_sampling_and_minibatches_matches_the_reference(tmp_path):
    """A Hugging Face checkpoint (actor and reference read from it by the workers' slices and whole by the
    reference), prompts of different lengths from a JSONL file (left-padded, masked, positions from the first
    real token), top-k/top-p sampling, responses ended by the tokenizer's EOS and scored by a file.py:function
    plugin, two PPO epochs of two minibatches, through generation dp 2, reference tp 2, reward dp 2 and
    training dp 2 x pp 2 with microbatches."""
    pytest.importorskip("transformers")
    from rpegc.tools import arith

    ckpt = tmp_path / "ckpt"
    arith.write_checkpoint(str(ckpt), hidden=32, layers=2, max_positions=32)
    arith.write_dataset(str(tmp_path / "train.jsonl"), 24, seed=5, max_operand=99)
    (tmp_path / "digits.py").write_text(DIGITS_REWARD)
    text = open("examples/grpo-tiny.rpeg").read().replace("Lp = 4, Lr = 6", "Lp = 12, Lr = 5")
    text = text.replace('arch = "tiny", kind = policy', f'hf = "{ckpt}", kind = policy')
    text = text.replace('arch = "tiny", kind = reference', f'hf = "{ckpt}", kind = reference')
    text = text.replace("extent (1, 1, 4) dp = 1 pp = 2 tp = 2 mb = 2", "extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 2")
    plan = compile_plan(tmp_path, "grpo-data.rpeg", steps=2, text=text)
    rl = {"top_k": 12, "top_p": 0.9, "ppo_epochs": 2, "ppo_minibatches": 2, "lr_actor": 1e-3}
    config = {"data": {"path": str(tmp_path / "train.jsonl")}, "reward": f"{tmp_path / 'digits.py'}:compute_score"}
    backend, _ = run_torch(plan, rl=rl, **config)
    assert_same_run(plan, backend, rl=rl, weights_atol=5e-5, **config)
    cfg = run_config(plan.program, rl=rl, **config)
    assert cfg.actor_hf == str(ckpt) and cfg.data.tokenizer == str(ckpt)
    ref = ReferenceTrainer(cfg, seed=0)
    from safetensors.torch import load_file

    embed = load_file(str(ckpt / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(ref.weights()["actor"]["embed.weight"], embed.float())  # version 0 is the checkpoint
    pads = ref.prompts.batch(16, 0, 0).pads
    assert pads.min() < pads.max()  # the prompts really differ in length
    assert all(m["response_length"] < 5 for m in backend.metrics.values())  # some responses ended at EOS
    assert "accuracy" in backend.metrics[0] and backend.metrics[0]["reward_failures"] == 0
