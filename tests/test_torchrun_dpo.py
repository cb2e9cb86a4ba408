"""DPO on the torch backend (runtime/backends/torch/rl/algorithms/dpo.py): the reference model scores
both sides of given preference pairs, the policy trains on the DPO loss; at tau = 0 a distributed run of any
layout gives the single-process oracle's (`DPOTrainer`) statistics and weights, within the tolerances of
tests/test_torchrun_equivalence.py (the same float32 summation-order argument: a sequence's log-probability is
a sum over <= Lr token log-probs, the loss a mean over <= B pairs). A real checkpoint trains on a JSONL
preference dataset on 2 workers and exports."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms.dpo import dpo_loss, sides  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms.dpo import DPOTrainer  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from rpegc.programs import Model  # noqa: E402
from rpegc.syntax.parser import parse  # noqa: E402
from fixtures.torch_runs import STAT_ABS, STAT_REL, compile_plan, run_torch  # noqa: E402
from fixtures.dpo import TWO, dpo_text, preference_rows

FOUR = """rpeg.cluster @c4 {racks = 1, nodes = 1, gpus = 4, hardware = "cpu"}
rpeg.plan @p for @dpo on @c4 {
  @ref_chosen   at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @ref_rejected at (0, 0, 2) extent (1, 1, 2) dp = 1 pp = 1 tp = 2 mb = 1
  @train_policy at (0, 0, 0) extent (1, 1, 4) dp = 1 pp = 2 tp = 2 mb = 2
}
"""
TINY = dpo_text(16, 4, 6, Model("tiny"))


# Adam's first steps are about lr * sign(g): for gradient entries near zero (rows of tokens few pairs use) they
# turn float32 summation noise into differences up to lr, so both sides run with eps = 1e-5 (as the PPO test of
# tests/test_torchrun_equivalence.py does); the statistics need nothing.
RL = {"adam_eps": 1e-5}


def assert_matches_the_oracle(plan, backend, rl=RL, **config):
    cfg = run_config(plan.program, rl=rl, **config)
    assert cfg.algorithm == "dpo"
    ref = run_reference(cfg, plan.steps, seed=0)
    for k, want in enumerate(ref.metrics):
        got = backend.metrics[k]
        for key in ("dpo_loss", "reward_margin", "chosen_reward", "rejected_reward", "actor_grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=STAT_REL, abs=STAT_ABS), (k, key)
        if k > 0:  # at step 0 the policy is the reference: every margin is 0 up to rounding, its sign noise
            assert got["reward_accuracy"] == want["reward_accuracy"], k
    initial = DPOTrainer(cfg, seed=0).weights()["actor"]
    got, want = backend.final_weights["policy"], ref.weights["actor"]
    assert set(got) == set(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=5e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert max((want[n] - initial[n]).abs().max().item() for n in want) > 5e-3  # it trained
    return ref


def test_dpo_with_dp_tp_and_a_pipelined_trainer_matches_the_oracle(tmp_path):
    """Reference inference dp 2 on devices 0-1 (chosen) and tp 2 on 2-3 (rejected), training pp 2 x tp 2 with
    2 microbatches on all four: Comm nodes move the reference log-probs between the layouts."""
    plan = compile_plan(tmp_path, "dpo4.rpeg", steps=3, text=TINY + FOUR)
    assert any(n.kind == "comm" for n in plan.nodes)
    backend, _ = run_torch(plan, rl=RL)
    ref = assert_matches_the_oracle(plan, backend)
    assert ref.metrics[-1]["reward_accuracy"] > ref.metrics[0]["reward_accuracy"]  # the toy pairs are learnt


def test_the_pair_sides_are_the_trainers_first_and_second_input_reads():
    p = parse(TINY + FOUR, "d.rpeg")
    assert sides(p) == {"chosen": "chosen", "rejected": "rejected"}
    swapped = TINY.replace("reads(%W_policy, %chosen, %rejected,", "reads(%W_policy, %rejected, %chosen,")
    assert sides(parse(swapped + FOUR, "d.rpeg")) == {"rejected": "chosen", "chosen": "rejected"}
    one = TINY.replace("reads(%W_policy, %chosen, %rejected,", "reads(%W_policy, %chosen,")
    with pytest.raises(RpegError, match="must read two graph-input token containers"):
        sides(parse(one + FOUR, "d.rpeg"))


def test_the_dpo_loss_is_the_papers():
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -1.5])
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5, num_pairs=4.0)
    margin = 0.5 * ((pc - rc) - (pr - rr))  # [0.5, -0.75]
    assert loss.item() == pytest.approx(float(-torch.nn.functional.logsigmoid(margin).sum() / 4))
    assert stats["reward_correct"] == 1 and stats["reward_margin"] == pytest.approx(-0.25)


def test_dpo_refuses_what_it_has_no_use_for(tmp_path):
    text = TINY.replace("rpeg.model @ref ", 'rpeg.model @rm {arch = "tiny", kind = reward}\nrpeg.model @ref ')
    with pytest.raises(RpegError, match="DPO has no reward"):
        run_config(parse(text + FOUR, "d.rpeg"))
    with pytest.raises(RpegError, match="R must be 1"):
        run_config(parse(TINY.replace("R = 1", "R = 2") + FOUR, "d.rpeg"))


def test_a_checkpoint_on_a_preference_dataset_with_minibatches_matches_the_oracle(tmp_path):
    """(prompt, chosen, rejected) chat rows tokenized with the tokenizer of a Hugging Face checkpoint made here
    (policy and reference read from it): prompts of different lengths left-padded, responses of different
    lengths right-padded and masked; reference dp 2, training dp 2 in two minibatches of pairs."""
    pytest.importorskip("transformers")
    from rpegc.tools import arith

    ckpt = tmp_path / "ckpt"
    arith.write_checkpoint(str(ckpt), hidden=32, layers=2, max_positions=32)
    (tmp_path / "pairs.jsonl").write_text(preference_rows(24, seed=4))
    two = TWO.replace("extent (1, 1, 2) dp = 1 pp = 1 tp = 2 mb = 1", "extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1")
    assert two != TWO
    plan = compile_plan(tmp_path, "dpo2.rpeg", steps=2, text=dpo_text(8, 12, 4, Model(hf=str(ckpt))) + two)
    config = {"data": {"path": str(tmp_path / "pairs.jsonl"), "answer_key": ""}}
    rl = dict(RL, ppo_minibatches=2)
    backend, _ = run_torch(plan, rl=rl, **config)
    assert_matches_the_oracle(plan, backend, rl=rl, **config)
    pairs = DPOTrainer(run_config(plan.program, **config), seed=0).pairs.pairs(8, 0, 0)
    assert pairs.pads.min() < pairs.pads.max() and pairs.chosen_mask.sum(-1).min() < pairs.chosen_mask.sum(-1).max()
