"""The public Python API (rpegc/api.py), used only through `import rpegc`: reading and writing every form
round-trips, the compiler functions run the passes with the passes' option names (the spec's Section 8.7 toy
schedules to its hand-derived makespan, optimize finds the enumerated optimum of grpo-tiny), bad options are
located errors, and importing rpegc loads neither xDSL nor the parser."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import rpegc

ROOT = pathlib.Path(__file__).resolve().parent.parent
GRPO = str(ROOT / "examples" / "grpo-tiny.rpeg")
TOY = str(ROOT / "lit_tests" / "passes" / "annotate-cost.rpeg")


def test_every_form_round_trips():
    p = rpegc.load(GRPO)
    text = rpegc.to_text(p)
    assert rpegc.to_text(rpegc.parse(text, "again.rpeg")) == text
    assert rpegc.to_text(rpegc.from_json(rpegc.to_json(p))) == text
    assert rpegc.to_text(rpegc.from_mlir(rpegc.to_mlir(p))) == text
    lowered = rpegc.lower(p, k=2)
    assert rpegc.to_text(rpegc.from_json(rpegc.to_json(lowered))) == rpegc.to_text(lowered)


def test_the_spec_toy_schedules_to_its_hand_derived_makespan():
    p = rpegc.schedule(rpegc.lower(rpegc.load(TOY), k=1), accounting="spec")  # the spec's literal form
    assert p.exec.schedule.makespan == pytest.approx(2.914145, rel=1e-6)  # docs/cost-model-spec.md 8.7
    assert [round(n.time, 6) for n in p.exec.nodes] == [1.676318, 0.250404, 0.987423]
    again = rpegc.run_pipeline(rpegc.load(TOY), "verify-wellformed,unroll{k=1},split-quantiles,insert-comm,"
                                                "insert-reshard,annotate-cost{accounting=spec},schedule")
    assert rpegc.to_text(again) == rpegc.to_text(p)


def test_cost_options_are_the_pass_options():
    lowered = rpegc.lower(rpegc.load(TOY), k=1)
    base = rpegc.schedule(lowered).exec.schedule.makespan
    other = rpegc.schedule(lowered, accounting="spec").exec.schedule.makespan
    assert other < base  # ZeRO-2 reduces once per step in the spec's form: training is cheaper
    assert "T_gemm" in rpegc.explain(lowered, accounting="spec")


def test_optimize_takes_the_pass_options_and_finds_the_enumerated_optimum():
    p = rpegc.optimize(rpegc.load(GRPO), evals=3000, seed=0, jobs=1)
    placements = {pl.vertex: (pl.alloc.origin[2], pl.alloc.extent[2], pl.strategy) for pl in p.plan.placements}
    # lit_tests/passes/optimize.rpeg: generation on one of the host's 2 cores, the trainer on the other
    assert all(extent == 1 for _, extent, _ in placements.values())
    assert {placements["gen"][0], placements["train_actor"][0]} == {0, 1}
    assert p.graph.tau("actor") == 1


@pytest.mark.parametrize("call,message", [
    (lambda p: rpegc.optimize(p, evals=-1), "optimize: "),
    (lambda p: rpegc.optimize(p, nonsense=1), "nonsense"),
    (lambda p: rpegc.lower(p, k=0), "unroll needs K_eval >= 1"),
    (lambda p: rpegc.run_pipeline(p, "unrol{k=2}"), "unrol"),
])
def test_bad_options_are_errors_that_say_what_to_change(call, message):
    with pytest.raises(rpegc.RpegError) as err:
        call(rpegc.load(GRPO))
    assert message in str(err.value)


def test_a_bad_module_is_a_located_error():
    with pytest.raises(rpegc.RpegError) as err:
        rpegc.parse("rpeg.workload {B = 64}\nrpeg.model @a {arch = \"nope\"}\n", "bad.rpeg")
    assert err.value.loc.file == "bad.rpeg" and err.value.loc.line >= 1


@pytest.mark.parametrize("old,new,message", [
    ("Lr = 6 : i64", "Lr = 6 : i32", "i64"),  # parses, but the dialect wants an i64
    ("Lr = 6 : i64", "Lr = 99999999999999999999 : i64", "out of range"),
    ("Lr = 6 : i64", "Lr = 6 : i64,,", "not an rpegc MLIR module"),
])
def test_bad_mlir_is_an_rpeg_error_naming_the_file(old, new, message):
    text = rpegc.to_mlir(rpegc.load(GRPO))
    assert old in text
    with pytest.raises(rpegc.RpegError) as err:
        rpegc.from_mlir(text.replace(old, new, 1), "bad.mlir")
    assert err.value.loc.file == "bad.mlir" and message in str(err.value)


def test_importing_rpegc_loads_neither_xdsl_nor_the_parser():
    code = "import sys, rpegc; bad = [m for m in sys.modules if m.split('.')[0] in ('xdsl', 'lark')]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
