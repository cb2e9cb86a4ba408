"""`rpeg-run`: end to end through a subprocess, and its error paths (no tracebacks, non-zero exit)."""

from __future__ import annotations

import functools
import json
import os

import pytest

from rpegc.runtime.cli import main
from rpegc.syntax.json_form import program_to_json
from fixtures import cli
from fixtures.runtime_plans import disaggregated_plan, lower, scheduled

rpeg_run = functools.partial(cli.rpeg_run, timeout=120)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "ppo.exec.json"
    path.write_text(json.dumps(program_to_json(scheduled(disaggregated_plan(1), 4))))
    return str(path)


def test_run_then_verify_end_to_end(plan_file, tmp_path):
    trace = str(tmp_path / "run.jsonl")
    out = rpeg_run(plan_file, "--backend", "sim", "--steps", "3", "--trace", trace, "--jitter", "0.1", "--seed", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith("step ")) == 3  # a progress line per RL step
    assert "3 of 4 step(s)" in lines[0]
    assert any(line.startswith("makespan: measured") and "predicted" in line for line in lines)
    records = [json.loads(r) for r in open(trace)]
    nodes = sum(1 for r in records if r["type"] == "node")
    assert lines[-1] == f"verification: OK ({nodes} nodes, 0 violations)"
    assert records[0]["type"] == "header" and records[0]["steps"] == 3
    assert [r["step"] for r in records if r["type"] == "step"] == [0, 1, 2]
    assert records[-1]["type"] == "summary"

    ok = rpeg_run("verify", plan_file, trace)
    assert ok.returncode == 0 and "verification: OK" in ok.stdout, ok.stdout + ok.stderr

    # Tamper: claim that a generation node read a fresher actor version than staleness allows.
    tampered = tmp_path / "tampered.jsonl"
    with open(tampered, "w") as f:
        for r in records:
            if r["type"] == "node" and r["id"] == "gen#2.q1":
                r["consumed"]["actor"] = 2
            f.write(json.dumps(r) + "\n")
    bad = rpeg_run("verify", plan_file, str(tampered))
    assert bad.returncode == 1
    assert "verification: FAILED" in bad.stdout and "[version] gen#2.q1 consumed {@actor v2}" in bad.stdout
    assert "Traceback" not in bad.stderr


def test_plan_and_sim_policy_reproduce_predicted_makespan(plan_file, capsys):
    assert main([plan_file, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(measured/predicted 1.0000)" in out and "dispatch policy plan" in out
    steady = [line for line in out.splitlines() if line.startswith("steady state: ")]
    assert len(steady) == 1 and "(measured/predicted 1) over steps 1-3" in steady[0], out
    assert "mean |node time error| 0.00 %" in steady[0]
    assert "start-up" not in out and "oversubscribed" not in out  # the sim clock has neither


def test_gantt_is_drawn(plan_file, tmp_path, capsys):
    pytest.importorskip("rpegc.tools.gantt")
    png = tmp_path / "g.png"
    assert main([plan_file, "--quiet", "--steps", "1", "--gantt", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_errors_are_messages_not_tracebacks(plan_file, tmp_path, capsys):
    assert main([str(tmp_path / "missing.json")]) == 1
    assert "missing.json: error: cannot read the plan file" in capsys.readouterr().err

    assert main([plan_file, "--steps", "9"]) == 1
    err = capsys.readouterr().err
    assert "cannot run 9 steps: the plan was unrolled for 4 step(s)" in err and "unroll{k=9}" in err

    bad = tmp_path / "bad.json"
    bad.write_text("{\n  \"workload\": [}\n")
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:2:16: error: invalid JSON") and "^" in err

    unlowered = tmp_path / "unlowered.json"
    from rpegc.core.lower.unroll import unroll

    unlowered.write_text(json.dumps(program_to_json(unroll(disaggregated_plan(1), 2))))
    assert main([str(unlowered)]) == 1
    assert "not lowered" in capsys.readouterr().err

    no_times = tmp_path / "no_times.json"
    no_times.write_text(json.dumps(program_to_json(lower(disaggregated_plan(1), 1))))
    assert main([str(no_times)]) == 1
    assert "annotate-cost" in capsys.readouterr().err

    assert main([plan_file, "--jitter", "2"]) == 1
    assert "jitter 2.0 is out of range" in capsys.readouterr().err

    assert main(["verify", plan_file, str(tmp_path / "none.jsonl")]) == 1
    assert "cannot read the trace" in capsys.readouterr().err


def test_torch_backend_is_loaded_lazily(plan_file, capsys):
    rc = main([plan_file, "--backend", "torch", "--jitter", "0.1"])
    assert rc == 1 and "--jitter applies to the sim backend only" in capsys.readouterr().err
    try:
        import rpegc.runtime.backends.torch  # noqa: F401
    except ModuleNotFoundError:
        assert main([plan_file, "--backend", "torch"]) == 1
        assert "the torch backend is not available yet" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--jitter", "800", "--jitter-dist", "lognormal"], "jitter 800.0 is out of range; give 0 <= jitter < 1 for uniform"),
    (["--jitter", "nan"], "--jitter nan: give a finite jitter >= 0"),
    (["--jitter", "-0.1"], "--jitter -0.1: give a finite jitter >= 0"),
    (["--steps", "-1"], "--steps -1: run at least 1 step"),
    (["--steps", "0"], "--steps 0: run at least 1 step"),
    (["--checkpoint-every", "0"], "--checkpoint-every 0: checkpoint every N >= 1 steps"),
    (["--seed", "-3"], "--seed -3: give a seed in 0..2^63-1"),
    (["--lr", "inf"], "--lr inf: give a learning rate in (0, 1]"),
    (["--lr", "1e300"], "--lr 1e+300: give a learning rate in (0, 1]"),
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    (["--lookahead", "-1"], "--lookahead -1: give N >= 0 queued commands"),
])
def test_numeric_options_are_range_checked(plan_file, capsys, args, message):
    assert main([plan_file, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rpeg-run: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_lognormal_jitter_at_its_bound_runs_to_a_finite_makespan(plan_file, capsys):
    assert main([plan_file, "--jitter", "3", "--jitter-dist", "lognormal", "--seed", "7", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "verification: OK" in out and "nan" not in out and "inf" not in out


def test_a_node_time_no_clock_could_reach_is_refused_before_the_run():
    """1.7e308 s per node overflowed the simulated clock; 1e308 gave `makespan 1e+308` and verification OK
    (issue 33, item 5): a time above 1e9 s (32 years) is refused when the plan is read."""
    from dataclasses import replace

    from rpegc.core.ir.errors import RpegError
    from rpegc.runtime.plan import build_run_plan

    p = scheduled(disaggregated_plan(1), 1)
    g = p.exec
    for t in (1.7e308, 1e308, 1.01e9):
        huge = replace(p, exec=replace(g, nodes=tuple(n.with_(time=t) for n in g.nodes)))
        with pytest.raises(RpegError, match=r"times must be finite, >= 0 and at most 1e\+09 s"):
            build_run_plan(huge)


def _doc(plan_file):
    return json.loads(open(plan_file).read())


def test_inconsistent_json_plans_are_located_errors(plan_file, tmp_path, capsys):
    """Deep nesting, NaN times, steps the nodes do not cover, bad traces; exit 1."""
    deep = tmp_path / "deep.json"
    for text in ("[" * 100000, '{"a":' * 100000):
        deep.write_text(text)
        for argv in ([str(deep)], ["verify", str(deep), str(deep)]):
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"{deep}:1:") and "more than 64 levels deep" in err and "Traceback" not in err
    d = _doc(plan_file)
    d["steps"] = 1000000
    many = tmp_path / "many.json"
    many.write_text(json.dumps(d, indent=1))
    assert main([str(many)]) == 1
    err = capsys.readouterr().err
    line = next(i for i, s in enumerate(many.read_text().splitlines(), start=1) if '"steps"' in s)
    assert err.startswith(f"{many}:{line}:") and "'steps' is 1000000, but the nodes end at step 3" in err
    d = _doc(plan_file)
    d["nodes"][5]["start"] = float("nan")
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(d, indent=1))
    assert main([str(nan)]) == 1
    assert "'NaN' is not a JSON number" in capsys.readouterr().err


def test_verify_rejects_a_trace_with_nan_or_negative_values(plan_file, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    assert main([plan_file, "--trace", str(trace), "--quiet"]) == 0
    capsys.readouterr()
    lines = trace.read_text().splitlines()
    at = next(i for i, s in enumerate(lines) if '"type":"node"' in s)
    for bad in (lines[at].replace('"finish":', '"finish":NaN,"x":', 1), lines[at].replace('"bytes":0', '"bytes":-1')):
        assert bad != lines[at]
        tampered = tmp_path / "bad.jsonl"
        tampered.write_text("\n".join(lines[:at] + [bad] + lines[at + 1:]) + "\n")
        assert main(["verify", plan_file, str(tampered)]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(f"{tampered}:{at + 1}:") and "verification: OK" not in captured.out


def test_gantt_panels_start_after_startup_with_vertex_names_and_worker_rows(plan_file, tmp_path, capsys):
    from dataclasses import replace

    from rpegc.runtime.cli import gantt_panels, gantt_unit
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.trace import read_trace

    pytest.importorskip("rpegc.tools.gantt")
    trace_file = tmp_path / "t.jsonl"
    assert main([plan_file, "--quiet", "--steps", "2", "--trace", str(trace_file)]) == 0
    plan, trace = load_plan(plan_file, steps=2), read_trace(str(trace_file))
    (pname, predicted), (mname, measured) = gantt_panels(plan, trace)
    assert (pname, mname) == ("predicted", "measured") and gantt_unit(trace) == "GPU"
    vertices = {n.node.vertex for n in plan.nodes if n.kind == "op"}
    assert {b.short for b in measured if b.kind not in ("comm", "reshard")} == vertices
    # A wall-clock trace that spent 2 s starting up: the measured panel starts where the schedule does.
    late = {i: replace(r, start=r.start + 2.0, finish=r.finish + 2.0) for i, r in trace.nodes.items()}
    torch_trace = replace(trace, nodes=late, header=replace(trace.header, backend="torch", clock="wall",
                                                            options={"dist_backend": "gloo"}))
    (_, _), (name, shifted) = gantt_panels(plan, torch_trace)
    assert name == "measured, after start-up (2 s)"
    assert [t for b in shifted for t in (b.start, b.finish)] == pytest.approx(
        [t for b in measured for t in (b.start, b.finish)])
    assert gantt_unit(torch_trace) == "worker"
    nccl = replace(torch_trace, header=replace(torch_trace.header, options={"dist_backend": "nccl"}))
    assert gantt_unit(nccl) == "GPU"


def test_a_pipe_or_a_device_as_an_input_is_refused_at_once(plan_file, tmp_path, capsys):
    """A FIFO nobody writes to blocked rpeg-run forever, /dev/zero as --rl-config read without end (issue 33, 4)."""
    fifo = str(tmp_path / "plan.fifo")
    os.mkfifo(fifo)
    cases = [([fifo], f"{fifo}: error: cannot read the plan file: it is not a regular file"),
             (["verify", plan_file, fifo],
              f"{fifo}: error: cannot read the trace: it is not a regular file"),
             ([plan_file, "--backend", "torch", "--rl-config", "/dev/zero"],
              "/dev/zero: error: cannot read the RL config: it is not a regular file")]
    for args, message in cases:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_profile_calibrated_after_the_plan_was_compiled_is_named(tmp_path):
    """rpeg-run says when the profile that names the machine was calibrated after the plan file was written: the
    plan's node times are an earlier calibration's prices (`rpeg-calibrate --machine` refreshes the cached profile
    in place)."""
    from types import SimpleNamespace

    from rpegc.runtime.cli import _recalibrated_note

    plan = tmp_path / "p.exec.rpeg"
    plan.write_text("")
    os.utime(plan, (1_700_000_000, 1_700_000_000))  # 2023-11-14T22:13:20Z
    later = _recalibrated_note(str(plan), SimpleNamespace(calibrated="2026-12-06T19:45:01+00:00"))
    assert later.startswith("the profile was calibrated (2026-12-06T19:45:01+00:00) after the plan was compiled (")
    assert "compile it again to price it with this one" in later
    assert _recalibrated_note(str(plan), SimpleNamespace(calibrated="2023-11-14T22:13:19+00:00")) is None
    for unknown in ("", "yesterday", "2026-12-06T19:45:01"):  # no date, not a date, no time zone
        assert _recalibrated_note(str(plan), SimpleNamespace(calibrated=unknown)) is None
    assert _recalibrated_note(str(tmp_path / "gone.rpeg"), SimpleNamespace(calibrated="2026-12-06T19:45:01+00:00")) \
        is None
