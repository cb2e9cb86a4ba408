"""Verifiable toy tasks and the single-process reference trainer: a tiny actor visibly learns with PPO and GRPO."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import Graph, Model, Program, Workload  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms.rollout import ReferenceTrainer  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from rpegc.runtime.backends.torch.run_config import config_from_program, toy_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms import default_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.tasks import make_task  # noqa: E402

torch.set_num_threads(1)


def test_pattern_task_scores_the_fraction_of_correct_tokens():
    task = make_task("pattern", vocab=64, prompt_len=3, response_len=6)
    prompts = task.prompts(4, seed=0, step=0)
    assert torch.equal(prompts, task.prompts(4, seed=0, step=0))
    assert not torch.equal(prompts, task.prompts(4, seed=0, step=1))
    assert not torch.isin(prompts, torch.tensor(task.pattern)).any()  # prompts never contain target tokens
    target = task.targets(prompts)
    assert target[0].tolist() == [5, 2, 7, 3, 5, 2]
    wrong = target.clone()
    wrong[1, :3] = 0
    mask = torch.ones(4, 6)
    mask[2, 4:] = 0  # an early stop: the masked positions count as misses
    torch.testing.assert_close(task.score(prompts, wrong, mask), torch.tensor([1.0, 0.5, 4 / 6, 1.0]))


def test_reverse_task_targets_the_reversed_prompt():
    task = make_task("reverse", vocab=10, prompt_len=3, response_len=4)
    assert task.targets(torch.tensor([[1, 2, 3]])).tolist() == [[3, 2, 1, 3]]


def test_bad_tasks_are_user_errors():
    with pytest.raises(RpegError, match="pattern, reverse"):
        make_task("sort", 64, 3, 4)
    with pytest.raises(RpegError, match="vocab"):
        make_task("pattern", 8, 3, 4)


def improvement(metrics):
    rewards = [m["reward"] for m in metrics]
    return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5


# Measured over seeds 0-15 (30 steps): PPO gains 0.17-0.73, GRPO 0.32-0.93 in mean reward (from ~0.02).
@pytest.mark.parametrize("algorithm, margin", [("ppo", 0.1), ("grpo", 0.2)])
def test_reward_rises_on_the_toy_task(algorithm, margin):
    result = run_reference(toy_config(algorithm), steps=30, seed=0)
    assert improvement(result.metrics) > margin
    assert set(result.weights) == ({"actor", "critic"} if algorithm == "ppo" else {"actor"})


def test_reference_runs_are_reproducible_and_weights_change():
    cfg = toy_config("ppo", shared_actor_critic=True, B=8)
    a, b = run_reference(cfg, 2, seed=3), run_reference(cfg, 2, seed=3)
    assert [m["reward"] for m in a.metrics] == [m["reward"] for m in b.metrics]
    assert all(torch.equal(a.weights["actor"][k], b.weights["actor"][k]) for k in a.weights["actor"])
    init = ReferenceTrainer(cfg, seed=3).weights()["actor"]
    assert not torch.equal(init["value_head.weight"], a.weights["actor"]["value_head.weight"])
    assert "value_loss" in a.metrics[-1] and "critic" not in a.weights


def test_staleness_makes_generation_use_an_older_actor_version():
    cfg = dataclasses.replace(toy_config("grpo", B=4), tau_actor=1)
    trainer = ReferenceTrainer(cfg, seed=0)
    fresh = ReferenceTrainer(toy_config("grpo", B=4), seed=0)
    for k in range(2):
        trainer.step(k)
        fresh.step(k)
    # at step 2 the stale run generates with version 1, the synchronous run with version 2
    stale_exp, *_ = trainer.collect(2)
    assert trainer.actor_versions.for_step(2, 1)[0] == 1
    fresh_exp, *_ = fresh.collect(2)
    assert not torch.equal(stale_exp.old_logprobs, fresh_exp.old_logprobs)


def program(*kinds, staleness=()):
    tiny = lookup("tiny")
    models = tuple(Model(name=k, kind=k, trainable=k in ("policy", "critic", "actor_critic"), arch=tiny)
                   for k in kinds)
    graph = Graph("g", (), (), (), (), (), (), staleness=staleness)
    return Program(Workload(B=4, R=2, Lp=3, Lr=4), models, graph=graph)


def test_run_config_follows_the_program():
    ppo = config_from_program(program("policy", "reference", "critic", "reward", staleness=(("policy", 1),)))
    assert (ppo.algorithm, ppo.tau_actor, ppo.tau_critic, ppo.critic) == ("ppo", 1, 0, lookup("tiny"))
    assert (ppo.workload.B, ppo.workload.R, ppo.workload.Lp, ppo.workload.Lr) == (4, 2, 3, 4)
    grpo = config_from_program(program("policy", "reference", "reward"))
    assert grpo.algorithm == "grpo" and grpo.rl.kl_estimator == "k3"
    shared = config_from_program(program("actor_critic", "reference", "reward"), reward="model")
    assert shared.algorithm == "ppo" and shared.shared_actor_critic and shared.reward_arch == lookup("tiny")
    metrics = run_reference(shared, 1, seed=0).metrics  # the frozen reward model path runs
    assert metrics[0]["score"] != metrics[0]["reward"]


def test_a_named_algorithm_is_the_runs_and_an_unnamed_one_is_inferred():
    p = program("policy", "reference", "reward")
    assert config_from_program(p).algorithm_inferred
    named = dataclasses.replace(p, graph=dataclasses.replace(p.graph, algorithm="grpo"))
    cfg = config_from_program(named)
    assert cfg.algorithm == "grpo" and not cfg.algorithm_inferred
    wrong = dataclasses.replace(p, graph=dataclasses.replace(p.graph, algorithm="ppo"))
    with pytest.raises(RpegError, match="PPO needs a critic"):
        config_from_program(wrong)


def test_programs_the_backend_cannot_run_are_user_errors():
    with pytest.raises(RpegError, match="no policy"):
        config_from_program(program("critic", "reward"))
    with pytest.raises(RpegError, match="only one"):
        config_from_program(program("actor_critic", "critic"))
    with pytest.raises(RpegError, match="kind reward"):
        config_from_program(program("policy"), reward="model")
    with pytest.raises(RpegError, match="replaces the policy"):
        config_from_program(program("policy", "actor_critic"))
    p = program("policy", "reference")
    rows = p.workload.B * p.workload.R
    with pytest.raises(RpegError, match=f"ppo_minibatches = {rows + 1} exceeds the {rows} sequences"):
        config_from_program(p, rl=default_rl_config("grpo", ppo_minibatches=rows + 1))
    other = dataclasses.replace(program("policy", "reference"), models=(
        Model("actor", "policy", True, lookup("tiny")), Model("ref", "reference", False, lookup("tiny-4l"))))
    with pytest.raises(RpegError, match="initial actor"):
        config_from_program(other)


@pytest.mark.parametrize("algorithm, settings", [("grpo", {}), ("ppo", {"kl_in_reward": False})])
def test_without_a_reference_the_oracle_runs_none_and_trains_as_with_a_zero_kl_coefficient(algorithm, settings):
    """A run whose graph has no reference inference vertex builds and runs no reference model and has no KL (TRL's
    beta = 0). Its KL coefficient is 0, so a run with the reference and the same settings adds 0 x KL to its loss and
    zero to its gradients: the same weights, bit for bit, and the same metrics but the KL's."""
    with_ref = toy_config(algorithm, B=4, kl_coef=0.0, **settings)
    without = dataclasses.replace(with_ref, has_reference=False)
    assert ReferenceTrainer(without, seed=0).reference is None
    a, b = run_reference(with_ref, 2, seed=0), run_reference(without, 2, seed=0)
    assert all({"kl", "kl_loss"} <= set(m) for m in a.metrics)
    assert all(not {"kl", "kl_loss"} & set(m) for m in b.metrics)
    for m, n in zip(a.metrics, b.metrics):
        assert {k: v for k, v in m.items() if k not in ("kl", "kl_loss", "time_s")} == \
            {k: v for k, v in n.items() if k != "time_s"}
    for role in a.weights:
        assert all(torch.equal(a.weights[role][k], b.weights[role][k]) for k in a.weights[role]), role


@pytest.mark.parametrize("algorithm, settings, asked", [("grpo", {}, "kl_coef = 0.01 asks"),
                                                        ("ppo", {"kl_coef": 0.0}, "kl_in_reward = true asks")])
def test_the_oracle_refuses_a_kl_term_without_a_reference(algorithm, settings, asked):
    cfg = dataclasses.replace(toy_config(algorithm, B=4, **settings), has_reference=False)
    with pytest.raises(RpegError, match=asked):
        run_reference(cfg, 1, seed=0)
