"""Passes plug in through the `xdsl.universe` entry point (docs/architecture.md, Passes and the driver) and rpeg-run
backends through `rpegc.backends`, in real subprocesses.

tests/plugin/ holds a researcher's package, rpegc_plugin_demo, with a dist-info that advertises its
Universe and its backend; putting the folder on PYTHONPATH is all it takes for `rpegc` to run its
`max-vertices` and `max-comms` passes (the latter declares the stage it needs, which the driver checks) and for
`rpeg-run` to run plans on its `slow-sim` backend with its own `--slowdown` option.
The same entry point lets `xdsl-opt` run rpegc's own passes on `rpegc --emit=mlir` output.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from fixtures.plugins import install_plugin

ROOT = pathlib.Path(__file__).parent.parent
PLUGIN = ROOT / "tests" / "plugin"
PPO = ROOT / "examples" / "ppo.rpeg"
BIN = pathlib.Path(sys.executable).parent


def run(tool: str, *args: str, plugin: bool | pathlib.Path = False,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    """`tool` in a subprocess; `plugin`: True for tests/plugin on the path, or another plugin folder."""
    env = dict(os.environ)
    env.pop("RPEGC_DEBUG", None)
    if plugin:
        folder = PLUGIN if plugin is True else plugin
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([str(BIN / tool), *args], input=stdin, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def graph_line(path: pathlib.Path) -> int:
    (line,) = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("rpeg.graph @")]
    return line


def test_plugin_pass_reports_a_located_error():
    result = run("rpegc", str(PPO), "-p", "verify-wellformed,max-vertices{n=5}", plugin=True)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == (f"{PPO}:{graph_line(PPO)}:1: error: graph @ppo has 6 vertices, more than "
                        "max-vertices{n=5} allows")
    assert lines[1] == "rpeg.graph @ppo {" and lines[2] == "^"
    assert "Traceback" not in result.stderr


def test_plugin_pass_accepts_a_graph_within_its_limit():
    result = run("rpegc", str(PPO), "-p", "max-vertices{n=10},unroll{k=1}", plugin=True)
    assert result.returncode == 0, result.stderr
    assert "exec.graph @ppo steps = 1 {" in result.stdout


def test_a_plugin_pass_that_edits_an_op_in_place_is_verified_after():
    # The graph op is kept unchanged through unroll, so verifying only new ops would miss the plugin's edit.
    result = run("rpegc", str(PPO), "-p", "verify-wellformed,unroll{k=1},retype-in-place,split-quantiles",
                 plugin=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == f'{PPO}: error: "two" should be of base attribute integer'


def test_a_plugin_pass_that_needs_a_lowered_module_is_refused_before_the_lowering():
    result = run("rpegc", str(PPO), "-p", "max-comms{n=1},unroll{k=1}", plugin=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "<pipeline>:1:1: error: max-comms needs a lowered module; run unroll{k=..}, split-quantiles, insert-comm, "
        "insert-reshard first", "max-comms{n=1},unroll{k=1}", "^"]


def test_a_plugin_pass_runs_where_it_declares_and_the_passes_after_it_are_checked():
    lowered = "unroll{k=1},split-quantiles,insert-comm,insert-reshard"
    result = run("rpegc", str(PPO), "-p", f"{lowered},max-comms{{n=1}}", plugin=True)
    assert result.returncode == 1 and "has 14 Comm nodes, more than max-comms{n=1} allows" in result.stderr
    result = run("rpegc", str(PPO), "-p", "max-vertices{n=10},schedule", plugin=True)  # declared: no stage change
    assert result.returncode == 1
    assert result.stderr.startswith("<pipeline>:1:20: error: schedule needs a lowered module with node times")


def test_without_the_plugin_the_pass_is_unknown():
    result = run("rpegc", str(PPO), "-p", "max-vertices{n=5}")
    assert result.returncode == 1
    assert result.stderr.startswith("<pipeline>:1:1: error: ") and "max-vertices" in result.stderr


def test_xdsl_opt_runs_rpegc_passes_on_emitted_mlir():
    mlir = run("rpegc", str(PPO), "--emit=mlir")
    assert mlir.returncode == 0, mlir.stderr
    result = run("xdsl-opt", "-p", "verify-wellformed,unroll{k=2}", stdin=mlir.stdout)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count('"exec.op"') == 12
    assert '"exec.publish"() <{container = "W_actor", dst = @"gen#1", src = @"train_actor#0"}>' in result.stdout


def test_a_plugin_backend_runs_plans_with_its_own_options(tmp_path):
    plan = tmp_path / "ppo.exec.rpeg"
    pipeline = "unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
    lower = run("rpegc", str(PPO), "-p", pipeline, "-o", str(plan))
    assert lower.returncode == 0, lower.stderr
    helped = run("rpeg-run", "--help", plugin=True)
    assert "slow-sim" in helped.stdout and "--slowdown X" in helped.stdout

    def makespan(*args: str, plugin: bool) -> float:
        result = run("rpeg-run", str(plan), "--quiet", *args, plugin=plugin)
        assert result.returncode == 0, result.stderr
        (line,) = [x for x in result.stdout.splitlines() if x.startswith("makespan:")]
        return float(line.split()[2])

    sim = makespan(plugin=False)
    # both makespans are printed with 6 significant digits: each is within 5e-6 relative of its value
    assert makespan("--backend", "slow-sim", "--slowdown", "3", plugin=True) == pytest.approx(3 * sim, rel=2e-5)
    wrong = run("rpeg-run", str(plan), "--slowdown", "3", plugin=True)
    assert wrong.returncode == 1 and "--slowdown applies to the slow-sim backend only" in wrong.stderr
    bad = run("rpeg-run", str(plan), "--backend", "slow-sim", "--slowdown", "0", plugin=True)
    assert bad.returncode == 1 and "--slowdown 0.0: give a factor > 0" in bad.stderr
    unknown = run("rpeg-run", str(plan), "--backend", "slow-sim")
    assert unknown.returncode == 1 and "invalid choice: 'slow-sim'" in unknown.stderr


@pytest.mark.parametrize("target,message", [
    ("broken_backend:NOWHERE", "backend 'broken' (broken_backend:NOWHERE, entry point group rpegc.backends) cannot be "
                               "loaded: AttributeError"),
    ("broken_backend:NOT_A_SPEC", "entry point 'broken' of group rpegc.backends (broken_backend:NOT_A_SPEC) must name "
                                  "a BackendSpec called 'broken'"),
])
def test_a_broken_backend_plugin_is_a_one_line_error(tmp_path, target, message):
    install_plugin(tmp_path, "broken_backend", "NOT_A_SPEC = 42\n", "rpegc.backends", {"broken": target})
    result = run("rpeg-run", str(PPO), plugin=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rpeg-run: error: {message}"), result.stderr
