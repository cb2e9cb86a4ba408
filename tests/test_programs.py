"""rpegc.programs writes the standard programs: each shipped example that is a standard graph parses equal to the
product function's output with the example's own arguments (and its plan), and each program the repository used to
write as a template (bench/workloads.py, tools/overhead_timing.py, arith, the DPO and torch fixtures) is the
example's graph with the differences its callers rely on."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from rpegc.core.ir.presets import PRESETS
from rpegc.programs import PAPER_QUANTILES, Cluster, Model, Verifier, Workload, dpo, grpo, ppo
from rpegc.syntax.parser import parse

from fixtures.programs import EXAMPLES, load_bench

TINY = Model("tiny")
LLAMA = Model("llama2-7b")
PAPER = Workload(512, 1, 128, 384)
TINY_GRPO = Workload(16, 4, 4, 6, "fp32")
TINY_QUANTILES = ((0.5, "Lr/2"), (1.0, "Lr"))

EXAMPLE_PROGRAMS = {
    "ppo": lambda plan: ppo(PAPER, LLAMA, quantiles=PAPER_QUANTILES, algorithm="ppo", cluster=Cluster(2, 8, 4),
                            plan=plan),
    "ppo-8gpu": lambda plan: ppo(PAPER, LLAMA, quantiles=PAPER_QUANTILES, algorithm="ppo", cluster=Cluster(1, 2, 4),
                                 plan=plan),
    "ppo-async": lambda plan: ppo(PAPER, LLAMA, staleness={"actor": 1, "critic": 0}, quantiles=PAPER_QUANTILES,
                                  algorithm="ppo", cluster=Cluster(1, 2, 4), plan=plan),
    "ppo-tiny": lambda plan: ppo(Workload(32, 1, 4, 6, "fp32"), TINY, direct_edges=True, algorithm="ppo",
                                 cluster=Cluster(1, 2, 4, "cpu", name="cpu8"), plan=plan),
    "grpo": lambda plan: grpo(Workload(64, 8, 128, 384), LLAMA, quantiles=PAPER_QUANTILES, cluster=Cluster(2, 8, 4),
                              plan=plan),
    "grpo-tiny": lambda plan: grpo(TINY_GRPO, TINY, direct_edges=True, quantiles=TINY_QUANTILES,
                                   cluster=Cluster(1, 1, 4, "cpu", name="cpu4"), plan=plan),
    "grpo-tiny-2": lambda plan: grpo(TINY_GRPO, TINY, direct_edges=True, quantiles=TINY_QUANTILES,
                                     cluster=Cluster(1, 1, 2, "cpu", name="cpu2"), plan=plan),
    "grpo-verify": lambda plan: grpo(TINY_GRPO, TINY, reward=Verifier("rule"), reward_vertex="score",
                                     direct_edges=True, cluster=Cluster(1, 1, 1, "cpu", name="cpu1"), plan=plan),
    "dpo": lambda plan: dpo(PAPER, LLAMA, cluster=Cluster(1, 4, 4), plan=plan),
}


def example(name: str):
    return parse((EXAMPLES / f"{name}.rpeg").read_text(), f"{name}.rpeg")


def plan_text(name: str) -> str:
    """The example's plan, from `rpeg.plan` to the end of the file."""
    text = (EXAMPLES / f"{name}.rpeg").read_text()
    return text[re.search(r"^rpeg\.plan ", text, flags=re.M).start():]


@pytest.mark.parametrize("name", sorted(EXAMPLE_PROGRAMS))
def test_a_standard_example_is_the_product_function_with_its_arguments(name):
    assert parse(EXAMPLE_PROGRAMS[name](plan_text(name)), "made.rpeg") == example(name)


def test_the_examples_differ_so_the_comparison_can_fail():
    made = EXAMPLE_PROGRAMS["ppo"](plan_text("ppo"))
    assert parse(made, "made.rpeg") != example("ppo-8gpu")
    assert parse(made.replace("rpeg.algorithm ppo\n", ""), "made.rpeg") != example("ppo")


def graph_of(program, **changes):
    return dataclasses.replace(program.graph, **changes)


@pytest.mark.parametrize("tau", [0, 1])
def test_the_benchmark_ppo_is_the_paper_example_in_the_paper_form(tau):
    program = load_bench("workloads").ppo_program(34, 7, 13, B=256, Lp=128, Lr=896, racks=1, nodes=8, tau=tau)
    assert program.graph == graph_of(example("ppo"), algorithm=None, staleness=(("actor", tau), ("critic", tau)))
    w = program.workload
    assert (w.B, w.R, w.Lp, w.Lr, w.dtype) == (256, 1, 128, 896, "bf16")
    paper_form = {"gated": False, "tied": True, "norms": False}
    want = [("actor", "policy", "llama2-34b"), ("ref", "reference", "llama2-34b"), ("critic", "critic", "llama2-7b"),
            ("reward", "reward", "llama2-13b")]
    assert [(m.name, m.kind, m.preset) for m in program.models] == want
    assert all(m.arch == dataclasses.replace(PRESETS[m.preset], **paper_form) for m in program.models)
    assert (program.cluster.racks, program.cluster.nodes, program.cluster.gpus) == (1, 8, 4)


def test_the_torch_tests_ppo_is_the_tiny_example_without_its_algorithm_line():
    pytest.importorskip("torch")
    from fixtures.torch_runs import PPO4

    program = parse(PPO4, "ppo4.rpeg")
    assert program.graph == graph_of(example("ppo-tiny"), algorithm=None)
    assert program.workload.B == 16 and program.cluster.num_devices == 4 and program.plan is not None


def test_the_control_program_is_grpo_tiny_with_staleness_1_and_no_quantiles():
    from rpegc.tools.overhead_timing import control_program

    program = parse(control_program("profile.toml", 2), "control.rpeg")
    assert program.graph == graph_of(example("grpo-tiny"), quantiles=(), staleness=(("actor", 1),))
    assert (program.cluster.gpus, program.cluster.hardware) == (2, "profile.toml")
    assert program.plan.placement("train_actor").alloc.origin == (0, 0, 1)  # training on the last worker


def test_the_arith_program_is_grpo_verify_with_the_math_verifier(tmp_path):
    from rpegc.tools import arith

    text = arith.grpo_program(B=8, R=8, Lp=12, Lr=4, ckpt=str(tmp_path), algorithm="dapo", oversample=2)
    assert text.startswith("// dapo on the arithmetic prompts")  # the file `arith make` writes explains itself
    program = parse(text.replace(f'hf = "{tmp_path}"', 'arch = "tiny"'), "grpo.rpeg")
    renamed = (EXAMPLES / "grpo-verify.rpeg").read_text().replace("@score", "@verify").replace("rule", "math")
    want = parse(renamed, "grpo-verify.rpeg")
    assert program.graph == graph_of(want, algorithm="dapo") and program.verifiers == want.verifiers
    assert (program.workload.B, program.workload.oversample) == (8, 2) and program.plan.pool("verify").size == 1


def test_the_dpo_fixture_is_the_dpo_example():
    from fixtures.dpo import TWO, dpo_text

    program = parse(dpo_text(8, 12, 4, TINY) + TWO, "dpo.rpeg")
    assert program.graph == example("dpo").graph
    assert [(m.name, m.kind, m.trainable, m.preset) for m in program.models] == [
        ("policy", "policy", True, "tiny"), ("ref", "reference", False, "tiny")]


def test_without_a_reference_nothing_of_it_is_left():
    text = grpo(TINY_GRPO, TINY, reference=False)
    program = parse(text, "noref.rpeg")
    assert "ref" not in text.replace("reference", "")
    assert [v.name for v in program.graph.vertices] == ["gen", "reward_inf", "train_actor"]
    assert program.graph.inputs == ("X", "W_reward")
    assert {m.kind for m in parse(ppo(PAPER, LLAMA, reference=False), "p.rpeg").models} == {"policy", "critic",
                                                                                         "reward"}


def test_the_critic_reads_the_old_logprobs_where_asked():
    def critic_reads(**kw):
        return parse(ppo(PAPER, LLAMA, **kw), "p.rpeg").graph.vertex("train_critic").reads

    assert "logp" in critic_reads(direct_edges=True) and "logp" not in critic_reads()
    assert "logp" in critic_reads(critic_reads_logp=True) and "logp" not in critic_reads(direct_edges=True,
                                                                                        critic_reads_logp=False)
    edges = parse(ppo(PAPER, LLAMA, critic_reads_logp=True), "p.rpeg").graph.data_edges
    assert not any(e.src == "gen" and e.dst.startswith("train") for e in edges)  # read from device memory


def test_models_verifiers_and_clusters_are_written_as_given():
    scorer = Verifier("scoring.py:score", per_response=0.25)
    text = ppo(PAPER, Model("llama2-7b", attrs=(("gated", False),)), critic=Model("llama2-13b"), reward=scorer,
               staleness={}, header=("first", "", "last"), cluster=Cluster(1, 2, 4, "cpu", name="my cluster"))
    program = parse(text, "p.rpeg")
    assert text.startswith("// first\n//\n// last\n")
    assert [(m.name, m.preset, m.arch.gated) for m in program.models] == [
        ("actor", "llama2-7b", False), ("ref", "llama2-7b", False), ("critic", "llama2-13b", True)]
    assert [(v.name, v.fn, v.per_response) for v in program.verifiers] == [("scoring.py:score", "scoring.py:score",
                                                                           0.25)]
    assert program.graph.vertex("verify").model == "scoring.py:score" and program.graph.staleness == ()
    assert (program.cluster.name, program.cluster.num_devices) == ("my cluster", 8)


def test_a_model_is_a_preset_or_a_checkpoint():
    for bad in (dict(), dict(arch="tiny", hf="ckpt")):
        with pytest.raises(ValueError, match="exactly one of arch and hf"):
            Model(**bad)
    assert Model(hf="ckpt").fields() == 'hf = "ckpt"'


def test_the_module_imports_without_torch_or_xdsl():
    code = "import sys, rpegc.programs; print(sorted({'torch', 'xdsl'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
