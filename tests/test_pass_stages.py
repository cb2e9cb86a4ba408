"""The pass-order check of the driver (rpegc/cli.py, `check_pass_order`) reads each pass's stage declaration
(rpegc/core/ir/stages.py): every rpegc pass declares one, a plugin's pass that declares one is checked like
rpegc's own, and one that declares nothing stops the check. The refusals are pinned word for word."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from xdsl.passes import ModulePass

import rpegc
from rpegc.cli import UsageError, check_pass_order, scan_pipeline
from rpegc.core.ir.stages import LOWERED, UNROLLED, PassStages
from rpegc.registry import PASSES

PPO = Path(__file__).resolve().parent.parent / "examples" / "ppo.rpeg"
LOWERING = "unroll{k=1},split-quantiles,insert-comm,insert-reshard"


def plugin_pass(name: str, stages: Optional[PassStages]) -> type[ModulePass]:
    """A plugin's pass that changes nothing, declaring `stages` (None: declaring nothing)."""
    attrs = {"name": name, "apply": lambda self, ctx, op: None}
    if stages is not None:
        attrs["stages"] = stages
    return dataclass(frozen=True)(type(name.title().replace("-", "") + "Pass", (ModulePass,), attrs))


PLUGINS = (plugin_pass("needs-lowered", PassStages(needs=LOWERED)),
           plugin_pass("makes-unrolled", PassStages(produces=UNROLLED)), plugin_pass("undeclared", None))
AVAILABLE = {**PASSES, **{cls.name: (lambda cls=cls: cls) for cls in PLUGINS}}


@pytest.fixture(scope="module")
def inputs() -> dict:
    """examples/ppo.rpeg at each stage: cyclic, unrolled, lowered, lowered with node times."""
    cyclic = rpegc.load(str(PPO))
    lowered = rpegc.run_pipeline(cyclic, LOWERING)
    return {"cyclic": cyclic, "unrolled": rpegc.run_pipeline(cyclic, "unroll{k=1}"), "lowered": lowered,
            "timed": rpegc.run_pipeline(lowered, "annotate-cost")}


def refusal(program, spec: str):
    """The located refusal of `spec` on `program` as (column, message); None when the order is accepted."""
    try:
        check_pass_order(spec, scan_pipeline(spec), program, AVAILABLE)
    except UsageError as err:
        head, spec_line, caret = err.text.splitlines()
        where, message = head.split(": error: ")
        col = int(where.rsplit(":", 1)[1])
        assert spec_line == spec and caret == " " * (col - 1) + "^"
        return col, message
    return None


def test_every_rpegc_pass_declares_its_stages():
    for name, factory in PASSES.items():
        assert isinstance(vars(factory()).get("stages"), PassStages), f"{name} declares no `stages`"


ORDER = "split-quantiles, insert-comm, insert-reshard"
ONCE = f"the lowering passes run once, in the order {ORDER}"
REFUSALS = [  # (input stage, pipeline, column, message)
    ("cyclic", "schedule", 1, "schedule needs a lowered module with node times; run unroll{k=..}, split-quantiles, "
                              "insert-comm, insert-reshard, fuse-stages, annotate-cost first"),
    ("unrolled", "schedule", 1, "schedule needs a lowered module with node times; run split-quantiles, insert-comm, "
                                "insert-reshard, fuse-stages, annotate-cost first"),
    ("lowered", "verify-wellformed,schedule", 19, "schedule needs node times; run annotate-cost before schedule"),
    ("cyclic", "unroll{k=1},share-actor-critic", 13,
     "share-actor-critic transforms the cyclic graph G°, but unroll at column 1 already unrolled it; "
     "share-actor-critic runs before unroll, once"),
    ("cyclic", f"{LOWERING},unroll", 56,
     "unroll unrolls the cyclic graph, but insert-reshard at column 41 already lowered it; unroll runs before "
     "unroll, once"),
    ("timed", "unroll{k=1}", 1,
     "unroll unrolls the cyclic graph, but the input module is already unrolled it; unroll runs before unroll, once"),
    ("lowered", "optimize", 1,
     "optimize transforms the cyclic graph G°, but the input module is already unrolled it; optimize runs before "
     "unroll, once"),
    ("cyclic", "insert-comm", 1, "insert-comm needs an unrolled module; run unroll{k=..} before insert-comm"),
    ("lowered", "split-quantiles", 1,
     f"split-quantiles cannot run on a lowered module (the input module is already ran insert-reshard); {ONCE}"),
    ("cyclic", f"{LOWERING},insert-comm", 56,
     "insert-comm cannot run on a lowered module (insert-reshard at column 41 already ran insert-reshard); "
     f"{ONCE}"),
    ("unrolled", "insert-comm,split-quantiles", 13,
     f"split-quantiles must run before insert-comm; the lowering order is {ORDER}"),
    ("unrolled", "insert-comm,insert-comm", 13,
     "insert-comm already ran in this pipeline; run each lowering pass once"),
    ("cyclic", "unroll{k=1},split-quantiles,insert-reshard", 29,
     f"insert-reshard needs insert-comm first; the lowering order is {ORDER}"),
    ("unrolled", "fuse-stages", 1,
     "fuse-stages needs a lowered module; run unroll{k=..}, split-quantiles, insert-comm, insert-reshard first"),
    ("lowered", "annotate-cost,fuse-stages", 15,
     "fuse-stages changes what annotate-cost prices; run it before annotate-cost"),
    ("cyclic", "annotate-cost", 1,
     "annotate-cost needs a lowered module; run unroll{k=..}, split-quantiles, insert-comm, insert-reshard, "
     "fuse-stages first"),
]


@pytest.mark.parametrize("stage, spec, col, message", REFUSALS)
def test_refusals_are_located_and_worded_from_the_declarations(inputs, stage, spec, col, message):
    assert refusal(inputs[stage], spec) == (col, message)


@pytest.mark.parametrize("stage, spec", [
    ("cyclic", f"verify-wellformed,share-actor-critic,optimize,{LOWERING},fuse-stages,annotate-cost,schedule"),
    ("unrolled", "insert-reshard"),  # what ran on an input module is unknown: insert-comm may have
    ("lowered", "fuse-stages,annotate-cost,schedule,verify-wellformed"),
    ("timed", "schedule"),
])
def test_orders_that_can_run_are_accepted(inputs, stage, spec):
    assert refusal(inputs[stage], spec) is None


def test_a_plugin_pass_that_needs_a_lowered_module_is_refused_before_it(inputs):
    message = ("needs-lowered needs a lowered module; run unroll{k=..}, split-quantiles, insert-comm, insert-reshard "
               "first")
    assert refusal(inputs["cyclic"], "verify-wellformed,needs-lowered,unroll{k=1}") == (19, message)
    assert refusal(inputs["cyclic"], "unroll{k=1},needs-lowered") == (13, message)
    assert refusal(inputs["cyclic"], f"{LOWERING},needs-lowered,annotate-cost,schedule") is None
    assert refusal(inputs["lowered"], "needs-lowered") is None


def test_a_plugin_pass_that_makes_a_stage_is_followed(inputs):
    assert refusal(inputs["cyclic"], "makes-unrolled,insert-comm,insert-reshard") is None
    assert refusal(inputs["cyclic"], "makes-unrolled,split-quantiles,insert-reshard") == (
        32, f"insert-reshard needs insert-comm first; the lowering order is {ORDER}")
    assert refusal(inputs["cyclic"], "makes-unrolled,optimize") == (
        16, "optimize transforms the cyclic graph G°, but makes-unrolled at column 1 already unrolled it; optimize "
            "runs before unroll, once")


def test_a_pass_that_declares_nothing_ends_the_check(inputs):
    assert refusal(inputs["cyclic"], "undeclared,schedule") is None
    assert refusal(inputs["cyclic"], "schedule,undeclared") is not None
