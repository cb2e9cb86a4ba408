"""The optimize pass (docs/architecture.md, Optimizer): it writes the chosen structure and plan into the module so the
rest of the pipeline lowers it, prints a summary on stderr, is reproducible, and reports bad options
and misplacement as located errors."""

from __future__ import annotations

from pathlib import Path

from rpegc.cli import main
from rpegc.core.check.plan_rules import check_plan
from rpegc.syntax.parser import parse

PPO = str(Path(__file__).resolve().parent.parent / "examples" / "ppo-8gpu.rpeg")
SEARCH = "optimize{budget=0 evals=120 steps=2 seed=1 summary=false}"


def run(capsys, pipeline: str):
    code = main([PPO, "-p", pipeline])
    out, err = capsys.readouterr()
    return code, out, err


def test_optimize_writes_structure_and_plan_that_the_pipeline_lowers(capsys):
    code, out, err = run(capsys, SEARCH)
    assert code == 0 and err == ""
    p = parse(out, "optimized.rpeg")
    assert p.plan is not None and check_plan(p) == []
    trainable = {m.name for m in p.models if m.trainable}
    assert {m for m, _ in p.graph.staleness} == trainable  # tau written for every trainable model
    code, out, _ = run(capsys, SEARCH + ",unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule")
    assert code == 0 and "exec.op" in out and "makespan" in out


def test_same_options_same_module(capsys):
    assert run(capsys, SEARCH)[1] == run(capsys, SEARCH)[1]


def test_summary_table_on_stderr(capsys):
    code, out, err = run(capsys, "optimize{budget=0 evals=60 steps=2}")
    assert code == 0
    for row in ("gain over greedy", "gain over concurrent", "memory peak", "cache hit rate", "evaluations"):
        assert row in err


def test_baseline_option_writes_the_baseline_plan(capsys):
    code, out, _ = run(capsys, "optimize{baseline=greedy summary=false steps=2}")
    p = parse(out, "greedy.rpeg")
    assert code == 0 and all(pl.alloc.size == p.cluster.num_devices for pl in p.plan.placements)


def test_bad_option_and_wrong_position_are_located_errors(capsys):
    code, _, err = run(capsys, "optimize{objective=fast steps=2}")
    assert code == 1 and err.startswith("<pipeline>:1:20: error: ") and "unknown objective 'fast'" in err
    code, _, err = run(capsys, "unroll{k=2}," + SEARCH)
    assert code == 1 and "before unroll" in err


def test_the_pass_spells_the_searchs_options_with_their_defaults_and_help():
    """OptimizeOptions declares each search option once; the pass's fields take its default and help."""
    import dataclasses

    from rpegc.core.ir.options import option_help
    from rpegc.passes.optimize import OptimizePass
    from rpegc.search.optimizer import OptimizeOptions

    assert OptimizePass().options() == OptimizeOptions()
    declared = {f.name: f for f in dataclasses.fields(OptimizeOptions)}
    spelled = {f.name: f for f in dataclasses.fields(OptimizePass)}
    for name in ("evals", "seed", "jobs", "objective", "delta", "taus", "ac", "steps", "baseline", "search_zero",
                 "search_recompute"):
        assert option_help(spelled[name]) == option_help(declared[name]) != ""
    assert option_help(spelled["budget"]) == option_help(declared["budget_s"])
    assert option_help(spelled["ablate"]).startswith(option_help(declared["ablate"]))
