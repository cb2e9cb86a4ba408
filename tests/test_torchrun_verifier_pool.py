"""A verify vertex runs for real (issue 36): the worker of the plan's pool device scores the responses it received in
a pool of host processes of the plan's size (runtime/backends/torch/controller/verifier_pool.py), writes the rewards the
trainers read, and the trace verifies; the plan's verifier is what runs (--reward may only repeat it)."""

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.controller.run_description import reward_spec
from rpegc.runtime.backends.torch.controller.verifier_pool import VerifierPool, chunks, merge
from rpegc.runtime.backends.torch.rl.rewards import Scored
from rpegc.syntax.parser import parse
from fixtures.torch_runs import compile_plan, run_torch

SOURCE = open("examples/grpo-verify.rpeg").read()


class Example:
    def __init__(self, answer):
        self.source, self.answer, self.extra = "t", answer, {}


def test_rows_are_dealt_out_evenly_and_merged_in_order():
    assert chunks(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert chunks(2, 4) == [(0, 1), (1, 2)]
    a = Scored(scores=[1.0], accuracies=[None])
    b = Scored(scores=[0.0, 1.0], accuracies=[1.0, 0.0])
    b.failures.add(5, "raised X")
    merged = merge([a, b])
    assert merged.scores == [1.0, 0.0, 1.0] and merged.accuracies == [None, 1.0, 0.0]
    assert (merged.failures.count, merged.failures.first) == (1, "sequence 5: raised X")


def test_a_pool_of_processes_scores_as_the_function_does_in_order():
    texts = [" 4", "5", "x", "7 "]
    examples = [Example("4"), Example("4"), Example("x"), Example("7")]
    pool = VerifierPool("exact_match", 2)
    try:
        scored = pool.score_texts(texts, examples, [0, 1, 2, 3])
    finally:
        pool.close()
    assert scored.scores == [1.0, 0.0, 1.0, 1.0] and scored.witness == []  # a run without witnesses


def test_the_plans_verifier_is_the_reward_and_another_reward_is_refused():
    p = parse(SOURCE, "v.rpeg")
    assert reward_spec(p, None) == reward_spec(p, "rule") == "rule"
    with pytest.raises(RpegError, match=r"v.rpeg:25:3: error: --reward math: the plan's verify vertex @score runs "
                                        r"'rule' \(rpeg.verifier @rule\), and the plan is priced for it"):
        reward_spec(p, "math")


@pytest.mark.parametrize("pool, held", [(1, (1,)), (2, (0, 1))])
def test_a_verify_vertex_trains_on_the_pools_rewards_and_the_trace_verifies(tmp_path, pool, held):
    """The pool is one past the cluster's one device; a pool of 2 on the 2-core host shares device 0's core and
    holds it: its verify nodes run between the device's nodes, never beside them (the trace's `device` rule, which
    run_torch verifies)."""
    plan = compile_plan(tmp_path, "v.rpeg", steps=3, text=SOURCE.replace("pool = 1", f"pool = {pool}"))
    backend, result = run_torch(plan)  # run_torch verifies the trace
    scored = [r for r in result.trace.nodes.values() if r.id.startswith("score#")]
    assert [r.devices for r in scored] == [held] * 3
    assert all(r.inputs == (f"data %Y#{r.step} @pool",) for r in scored)
    rewards = [m["reward"] for m in (backend.step_metrics(k) for k in range(3))]
    assert all(0.0 <= r <= 1.0 for r in rewards) and len(set(rewards)) > 1
    assert not any(r.witness for r in result.trace.nodes.values())  # the profile prices no speed witness


def witnessed_profile(tmp_path) -> str:
    """The reference profile with the speed witness priced ([overhead] witness, [host] verify_witness)."""
    from rpegc.core.cost.hardware import load_hardware

    text = open(load_hardware("cpu-reference").source).read()
    assert "[overhead]" not in text and "\n[host]\n" in text
    path = tmp_path / "witnessed.toml"
    path.write_text(text.replace("\n[host]\n", "\n[host]\nverify_witness = 3e-4\n") + "\n[overhead]\nwitness = 2e-4\n")
    return str(path)


def test_every_operator_ends_with_the_speed_witness_where_the_profile_prices_it(tmp_path):
    """Where the plan's profile prices it ([overhead] witness), the workers end each operator with the speed witness
    (runtime/speed_probe.py), the toy rule's verify operator among them (its worker scores the rows itself): one per
    node of one rank, none in a transfer. A reward function's pool ends each share with it instead (the next test)."""
    from rpegc.runtime.backends.torch.controller.backend import runs_witness

    assert not runs_witness(compile_plan(tmp_path, "p.rpeg", steps=1, text=SOURCE).program)  # the profile has none
    text = SOURCE.replace('hardware = "cpu"', f'hardware = "{witnessed_profile(tmp_path)}"')
    plan = compile_plan(tmp_path, "v.rpeg", steps=3, text=text)
    assert runs_witness(plan.program)
    _, result = run_torch(plan)  # run_torch verifies the trace
    ops = [r for r in result.trace.nodes.values() if r.kind == "op"]
    assert any(r.id.startswith("score#") for r in ops) and {len(r.witness) for r in ops} == {1}
    assert all(0 < r.witness[0] < 0.5 for r in ops)
    assert not any(r.witness for r in result.trace.nodes.values() if r.kind != "op")  # transfers run none


def test_a_pools_processes_end_their_shares_with_the_speed_witness():
    texts = [" 4", "5", "x", "7 "]
    examples = [Example("4"), Example("4"), Example("x"), Example("7")]
    pool = VerifierPool("exact_match", 2, witness=True)
    try:
        scored = pool.score_texts(texts, examples, [0, 1, 2, 3])
    finally:
        pool.close()
    assert scored.scores == [1.0, 0.0, 1.0, 1.0]
    assert len(scored.witness) == 2 and all(0 < s < 0.5 for s in scored.witness)  # one per process


def test_a_reward_function_in_a_reward_models_place_is_named_as_unpriced():
    from dataclasses import replace

    from rpegc.runtime.backends.torch.controller.run_description import run_config

    from rpegc.runtime.backends.torch.controller.run_record import unpriced_reward

    tiny = parse(open("examples/grpo-tiny.rpeg").read(), "g.rpeg")
    assert unpriced_reward(tiny, run_config(tiny)) is None  # the toy rule: microseconds
    note = unpriced_reward(tiny, replace(run_config(tiny), reward="exact_match"))
    assert "the plan prices @reward_inf as the inference of reward model @reward, which runs, but this run trains " \
           "on the scores of 'exact_match'" in note
    assert unpriced_reward(parse(SOURCE, "v.rpeg"), run_config(parse(SOURCE, "v.rpeg"))) is None


def test_the_plan_hash_follows_the_verifier_and_its_pool(tmp_path):
    from dataclasses import replace

    from rpegc.runtime.plan import plan_hash

    p = compile_plan(tmp_path, "v.rpeg", steps=1, text=SOURCE).program
    bigger = replace(p, exec=replace(p.exec, nodes=tuple(n.with_(pool=2) if n.pool else n for n in p.exec.nodes)))
    shared = replace(p, exec=replace(p.exec, nodes=tuple(n.with_(shares=(0,)) if n.pool else n for n in p.exec.nodes)))
    other = replace(p, verifiers=(replace(p.verifiers[0], per_response=1e-3),))
    assert len({plan_hash(p), plan_hash(bigger), plan_hash(shared), plan_hash(other)}) == 4


def test_rpeg_run_names_the_pool_beside_the_devices(tmp_path):
    from rpegc.runtime.cli import _devices_text

    plan = compile_plan(tmp_path, "v.rpeg", steps=1, text=SOURCE)
    assert _devices_text(plan) == "1 device and a verifier pool"
    shared = compile_plan(tmp_path, "s.rpeg", steps=1, text=SOURCE.replace("pool = 1", "pool = 2"))
    assert _devices_text(shared) == "1 device and a verifier pool sharing the core of device 0"
    tiny = compile_plan(tmp_path, "t.rpeg", steps=1, text=open("examples/grpo-tiny-2.rpeg").read())
    assert _devices_text(tiny) == "2 devices"
