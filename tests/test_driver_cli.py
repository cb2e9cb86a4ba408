"""The `rpegc` command line (docs/architecture.md, Passes and the driver): output files, split input, diagnostics
mode, pass instrumentation and the JSON form. Runs `rpegc.cli.main(argv)` in-process; stdout/stderr via capsys."""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

from fixtures.programs import ACTOR_GRAPH
from rpegc.cli import main
from rpegc.dialects import rpeg

ROOT = pathlib.Path(__file__).parent.parent
FIG18 = ROOT / "lit_tests" / "Inputs" / "fig18-4gpu.rpeg"
LOWER = "verify-wellformed,unroll{k=1},split-quantiles,insert-comm,insert-reshard"

GOOD = ACTOR_GRAPH
# Same graph without `rpeg.input %X`: %X is read but never produced (Def. A.2 (3)).
BAD = GOOD.replace("  rpeg.input %X\n", "")
BAD_LINE = 4  # the declaration of %X in BAD


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def leftovers(directory: pathlib.Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


# --- -o ---------------------------------------------------------------------------------------------


def test_output_file_gets_exactly_what_stdout_would(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, printed, _ = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}")
    assert code == 0
    out = tmp_path / "out.rpeg"
    code, stdout, stderr = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "-o", out)
    assert (code, stdout, stderr) == (0, "", "")
    assert out.read_text() == printed
    assert "exec.graph @g steps = 2" in printed
    assert leftovers(tmp_path, {"in.rpeg", "out.rpeg"}) == []  # no temporary file left behind


def test_output_replaces_an_existing_file_whole(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    out = write(tmp_path, "out.rpeg", "old content\n" * 10_000)
    assert run(capsys, src, "-o", out)[0] == 0
    assert out.read_text().startswith("rpeg.workload") and "old content" not in out.read_text()


def test_output_refuses_to_overwrite_the_input(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, _, err = run(capsys, src, "-o", src)
    assert code == 1
    assert err.startswith(f"{src}: error: cannot write the output: refusing to overwrite the input file")
    assert src.read_text() == GOOD
    # The same file under another name (a symlink) is still the input.
    link = tmp_path / "link.rpeg"
    link.symlink_to(src)
    code, _, err = run(capsys, src, "-o", link)
    assert code == 1 and "refusing to overwrite the input file" in err
    assert src.read_text() == GOOD
    assert leftovers(tmp_path, {"in.rpeg", "link.rpeg"}) == []


def test_output_is_not_created_when_the_input_is_bad(tmp_path, capsys):
    src = write(tmp_path, "bad.rpeg", BAD)
    out = tmp_path / "out.rpeg"
    code, stdout, err = run(capsys, src, "-p", "verify-wellformed", "-o", out)
    assert code == 1 and stdout == ""
    assert err.startswith(f"{src}:{BAD_LINE}:3: error: %X is read by @gen")
    assert not out.exists()
    assert leftovers(tmp_path, {"bad.rpeg"}) == []


def test_output_keeps_the_previous_file_when_the_run_fails(tmp_path, capsys):
    src = write(tmp_path, "bad.rpeg", BAD)
    out = write(tmp_path, "out.rpeg", "previous result\n")
    assert run(capsys, src, "-p", "verify-wellformed", "-o", out)[0] == 1
    assert out.read_text() == "previous result\n"
    assert leftovers(tmp_path, {"bad.rpeg", "out.rpeg"}) == []


def test_output_into_a_missing_directory_is_a_user_error(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, _, err = run(capsys, src, "-o", tmp_path / "no" / "such" / "dir.rpeg")
    assert code == 1
    assert err == f"{tmp_path / 'no' / 'such' / 'dir.rpeg'}: error: cannot write the output: no such directory {tmp_path / 'no' / 'such'}\n"


# --- --split-input-file and --verify-diagnostics -------------------------------------------------------


def test_split_input_file_reports_lines_of_the_whole_file(tmp_path, capsys):
    text = GOOD + "\n// -----\n" + BAD
    src = write(tmp_path, "two.rpeg", text)
    offset = len((GOOD + "\n// -----\n").splitlines())
    code, out, err = run(capsys, src, "--split-input-file", "-p", "verify-wellformed")
    assert code == 1 and out == ""
    assert err.startswith(f"{src}:{offset + BAD_LINE}:3: error: %X is read by @gen")
    # the source line under the error is the one of the second chunk
    assert err.splitlines()[1] == "  %X = rpeg.container tokens[B, Lp]"
    assert text.splitlines()[offset + BAD_LINE - 1] == "  %X = rpeg.container tokens[B, Lp]"


# BAD with the diagnostic it must produce stated on the line above %X (mlir-opt's expected-error comments)
EXPECTING = BAD.replace("  %X = rpeg.container", "  // expected-error @+1 {{is read by @gen but no vertex writes it}}\n"
                                                 "  %X = rpeg.container")


def test_split_input_file_with_verify_diagnostics_prints_the_good_chunks(tmp_path, capsys):
    src = write(tmp_path, "two.rpeg", EXPECTING + "// -----\n" + GOOD)
    code, out, err = run(capsys, src, "--split-input-file", "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, err) == (0, "")
    assert out.startswith("rpeg.workload") and "rpeg.input %X" in out and out.count("rpeg.graph") == 1


def test_verify_diagnostics_passes_when_every_diagnostic_is_expected(tmp_path, capsys):
    src = write(tmp_path, "bad.rpeg", EXPECTING)
    assert run(capsys, src, "--verify-diagnostics", "-p", "verify-wellformed") == (0, "", "")
    same_line = BAD.replace("  %X = rpeg.container tokens[B, Lp]",
                            "  %X = rpeg.container tokens[B, Lp]  // expected-error {{no vertex writes it}}")
    below = BAD.replace("  %X = rpeg.container", "  // expected-error @below {{no vertex writes it}}\n"
                                                  "  // expected-error @below {{another}}\n  %X = rpeg.container")
    assert run(capsys, write(tmp_path, "same.rpeg", same_line), "--verify-diagnostics", "-p", "verify-wellformed")[0] == 0
    code, _, err = run(capsys, write(tmp_path, "below.rpeg", below), "--verify-diagnostics", "-p", "verify-wellformed")
    assert code == 1 and err.splitlines() == [  # @below skips the other expectation's line; "another" is not produced
        f"{tmp_path / 'below.rpeg'}:5:6: error: expected error \"another\" was not produced (on line 6)"]


def test_verify_diagnostics_fails_on_an_unexpected_or_a_missing_diagnostic(tmp_path, capsys):
    src = write(tmp_path, "bad.rpeg", BAD)
    code, out, err = run(capsys, src, "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, out) == (1, "")
    assert err == (f"{src}:{BAD_LINE}:3: error: unexpected error: %X is read by @gen but no vertex writes it "
                   "(Def. A.2 (3)); list it in rpeg.input or add it to the writes of its producer\n")
    wrong = write(tmp_path, "wrong.rpeg", EXPECTING.replace("@+1", "@+2"))
    code, out, err = run(capsys, wrong, "--verify-diagnostics", "-p", "verify-wellformed")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{wrong}:{BAD_LINE + 1}:3: error: unexpected error: %X is read by @gen but no vertex writes it (Def. A.2 (3)); "
        "list it in rpeg.input or add it to the writes of its producer",
        f"{wrong}:{BAD_LINE}:6: error: expected error \"is read by @gen but no vertex writes it\" was not produced "
        f"(on line {BAD_LINE + 2})",
    ]


def test_verify_diagnostics_on_good_input_prints_the_module(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, err) == (0, "")
    assert out == GOOD
    warned = write(tmp_path, "warned.rpeg", GOOD + "// expected-warning @-1 {{never}}\n")
    code, out, err = run(capsys, warned, "--verify-diagnostics", "-p", "verify-wellformed")
    assert code == 1 and "expected warning \"never\" was not produced" in err


# --- pass instrumentation ---------------------------------------------------------------------------------


def test_print_between_passes_shows_the_ir_between_passes(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--print-between-passes")
    assert code == 0
    # The dumps go to stderr in .rpeg text (as mlir-opt's do), so stdout stays a clean module; the header is
    # mlir-opt's, not the `// -----` of split input files.
    header = "// -----// IR Dump After VerifyWellformedPass (verify-wellformed) //----- //"
    assert header in err and "IR Dump After UnrollPass" not in err  # between passes: not after the last
    after_verify = err.split(header)[1]
    assert "rpeg.vertex @gen" in after_verify and "exec.op" not in after_verify  # before unroll
    assert "IR Dump" not in out
    assert out.rstrip().endswith("}")
    assert "exec.publish @train#0 -> @gen#1 (%W)" in out  # the final module in rpeg text


def dumps(err: str) -> list[str]:
    return re.findall(r"^// -----// IR Dump After (.*) //----- //$", err, flags=re.M)


def test_print_ir_after_all_and_after_change(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--print-ir-after-all")
    assert code == 0 and "IR Dump" not in out
    assert dumps(err) == ["VerifyWellformedPass (verify-wellformed)", "UnrollPass (unroll)"]
    assert err.split("(unroll) //----- //\n")[1].strip() == out.strip()  # after the last pass: the output
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--print-ir-after-change")
    assert code == 0 and dumps(err) == ["UnrollPass (unroll)"]  # verify-wellformed changes nothing


def test_print_ir_after_failure_shows_the_module_the_failing_pass_left(tmp_path, capsys):
    bad = pathlib.Path(__file__).resolve().parent.parent / "lit_tests" / "verify" / "a2-1-interface.rpeg"
    code, out, err = run(capsys, str(bad), "-p", "verify-wellformed", "--print-ir-after-failure")
    assert code == 1 and out == ""
    assert dumps(err) == ["VerifyWellformedPass Failed (verify-wellformed)"]
    dumped = err.split("//----- //\n")[1]
    assert "rpeg.edge @gen -> @train" in dumped or "rpeg.data @gen -> @train" in dumped
    assert "error: data edge @gen -> @train carries %X" in err
    code, out, err = run(capsys, str(bad), "-p", "verify-wellformed")
    assert code == 1 and dumps(err) == []


def test_time_passes_prints_mlirs_timing_report(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--time-passes")
    assert code == 0
    assert "Execution time report" not in out  # stdout carries only the module
    total = float(re.search(r"Total Execution Time: ([0-9.]+) seconds", err).group(1))
    rows = re.findall(r"^ +([0-9.]+) \( *([0-9.]+)%\)  ([\w-]+)$", err, flags=re.M)
    assert [name for _, _, name in rows] == ["parse", "verify-wellformed", "unroll", "output", "Total"]
    assert rows[-1][1] == "100.0"
    assert sum(float(t) for t, _, _ in rows[:-1]) == pytest.approx(total, abs=5e-4 * len(rows))  # 4 decimals each
    assert sum(float(p) for _, p, _ in rows[:-1]) == pytest.approx(100.0, abs=0.05 * len(rows))


def test_after_an_rpegc_pass_only_the_ops_it_built_are_verified(capsys, monkeypatch):
    # rpegc's passes keep the op of a section they leave unchanged (here the graph) and never edit one in place;
    # verifying all of them again after every pass made a 150,000-container program 2.4x slower.
    verified: list[str] = []
    original = rpeg.ContainerOp.verify_

    def counted(op):
        verified.append(op.ident.data)
        original(op)

    monkeypatch.setattr(rpeg.ContainerOp, "verify_", counted)
    code, out, err = run(capsys, str(FIG18), "-p", LOWER)
    assert code == 0, err
    assert "exec.graph @" in out
    assert verified and len(verified) == len(set(verified))  # each container once: after parsing


def test_list_passes_describes_every_rpegc_pass_and_its_options(capsys):
    code, out, err = run(capsys, "--list-passes")
    assert code == 0 and err == ""
    from rpegc.registry import PASSES

    names = [line for line in out.splitlines() if line and not line.startswith((" ", "(", "rpegc passes"))]
    assert names == list(PASSES)  # rpegc's passes, in pipeline order; xDSL's are only counted
    unroll = out.split("\nunroll\n")[1].split("\n\n")[0]
    assert "Alg. 3" in unroll and "k: int = 2" in unroll and "K_eval" in unroll
    optimize = out.split("\noptimize\n")[1].split("\n\n")[0]
    assert optimize.index("budget: int | float = 60") < optimize.index("hardware: str") < optimize.index("decode_rows")
    assert "taus: tuple[int, ...] = 0,1" in optimize and "staleness candidates" in optimize
    assert "canonicalize" not in out and "passes of xDSL itself" in out


def test_list_passes_names_xdsls_passes_only_when_asked(capsys):
    assert re.search(r"\bcanonicalize,", run(capsys, "--list-passes", "--all-passes")[1])
    code, _, err = run(capsys, "--all-passes")
    assert code == 1 and "--all-passes goes with --list-passes" in err


def test_help_does_not_list_xdsls_passes_or_targets(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "convert-arith-to-riscv" not in out and "arm-asm" not in out and "--list-passes" in out


@pytest.mark.parametrize("tool", ["rpegc", "rpeg-run", "rpeg-calibrate", "rpeg-validate"])
def test_every_tool_prints_its_version_and_what_it_runs_on(tool, capsys):
    import importlib
    from importlib.metadata import version

    import rpegc

    entry = {"rpegc": "rpegc.cli", "rpeg-run": "rpegc.runtime.cli", "rpeg-calibrate": "rpegc.tools.calibrate",
             "rpeg-validate": "rpegc.tools.validate"}[tool]
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(entry).main(["--version"])
    out = capsys.readouterr().out
    assert exit_.value.code in (0, None)
    assert out == f"{tool} {rpegc.__version__} (xdsl {version('xdsl')}, torch {version('torch')}, " \
                  f"megatron-core {version('megatron-core')}, python {__import__('platform').python_version()})\n"


def test_explain_without_output_prints_the_explanation_only(tmp_path, capsys):
    src = str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "grpo-tiny.rpeg")
    out_file = tmp_path / "out.rpeg"
    code, out, err = run(capsys, src, "-p", "verify-wellformed", "--explain")
    assert code == 0 and out == "" and "Cost model for graph" in err
    code, out, err = run(capsys, src, "-p", "verify-wellformed", "--explain", "-o", str(out_file))
    assert code == 0 and out == "" and "Cost model for graph" in err and "rpeg.graph" in out_file.read_text()


def test_explain_prices_with_the_pipelines_cost_options(capsys):
    """--explain explains what the pipeline's last pricing pass priced: its options and its hardware."""
    src = str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "grpo-tiny.rpeg")
    lower = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard"
    code, _, err = run(capsys, src, "-p", f"{lower},annotate-cost{{accounting=spec hardware=h200}}",
                       "--explain")
    assert code == 0 and "options: accounting=spec" in err and "hardware 'h200'" in err
    code, _, err = run(capsys, src, "-p", f"{lower},annotate-cost", "--explain")
    assert code == 0 and "baseline options" in err


# --- emitters -----------------------------------------------------------------------------------------------


NODE_KEYS = ["id", "kind", "vertex", "step", "phase", "role", "model", "devices", "dp", "pp", "tp", "mb",
             "bytes", "version_in", "version_out"]


def test_emit_json_has_the_documented_schema(capsys):
    code, out, _ = run(capsys, FIG18, "-p", LOWER, "--emit=json")
    assert code == 0
    data = json.loads(out)
    assert (data["graph"], data["steps"], data["lowered"]) == ("ppo", 1, True)
    ids = [n["id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    for node in data["nodes"]:
        assert list(node)[: len(NODE_KEYS)] == NODE_KEYS, node["id"]
    by_id = {n["id"]: n for n in data["nodes"]}
    expected = {"kind": "op", "vertex": "gen", "step": 0, "phase": 2, "role": "generation", "model": "actor",
                "devices": [0], "bytes": 0, "version_in": {"actor": 0}, "version_out": {}}
    assert {k: by_id["gen#0.q2"][k] for k in expected} == expected
    assert by_id["train_critic#0"]["version_out"] == {"critic": 1}
    assert by_id["train_critic#0"]["devices"] == [0, 1, 2, 3]
    comms = [n for n in data["nodes"] if n["kind"] == "comm"]
    assert all(n["bytes"] > 0 and n["vertex"] is None for n in comms)
    assert sorted(n["bytes"] for n in comms if n.get("container") == "Y") == sorted([32768, 22938, 9830] * 3)
    assert data["edges"] and all(len(e) == 2 and e[0] in by_id and e[1] in by_id for e in data["edges"])
    assert ["gen#0.q1", "gen#0.q2"] in data["edges"]


def test_emit_json_of_a_scheduled_module_has_times(capsys):
    pytest.importorskip("rpegc.passes.annotate_cost")
    code, out, _ = run(capsys, FIG18, "-p", LOWER + ",annotate-cost,schedule", "--emit=json")
    assert code == 0
    data = json.loads(out)
    for n in data["nodes"]:
        assert 0 <= n["start"] <= n["finish"], n["id"]
        assert n["finish"] - n["start"] == pytest.approx(n["time"], abs=1e-9)
    assert data["schedule"]["makespan"] == pytest.approx(max(n["finish"] for n in data["nodes"]))


def test_emit_dot_colours_publication_edges(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, _ = run(capsys, src, "-p", "unroll{k=3}", "--emit=dot")
    assert code == 0 and out.startswith('digraph "g_exec" {')
    red = [line.strip() for line in out.splitlines() if 'color="#cb181d"' in line]
    assert red == ['"train#0" -> "gen#1" [color="#cb181d", fontcolor="#cb181d", label="W"];',
                   '"train#1" -> "gen#2" [color="#cb181d", fontcolor="#cb181d", label="W"];',
                   '"legend_pub_from" -> "legend_pub_to" [color="#cb181d", fontcolor="#cb181d", label="publication (new weights)", fontsize=9];']


def test_emit_dot_draws_verify_vertices_and_their_pools(tmp_path, capsys):
    """A verify vertex (issue 36) in the graph and, lowered, its pool and the device core it shares."""
    text = open("examples/grpo-verify.rpeg").read().replace("gpus = 1,", "gpus = 2,")
    src = write(tmp_path, "v.rpeg", text.replace("@ref_inf     at (0, 0, 0)", "@ref_inf     at (0, 0, 1)"))
    code, out, _ = run(capsys, src, "--emit=dot")
    assert code == 0 and '"score" [label="score\\nverify @rule", fillcolor="#e5d8a6"];' in out
    assert "legend_verify" in out
    code, out, _ = run(capsys, src, "-p", LOWER + ",annotate-cost,schedule", "--emit=dot")
    assert code == 0 and 'label="score#0\\nverify @rule\\npool of 1, sharing [1]"' in out
    code, out, _ = run(capsys, write(tmp_path, "in.rpeg", GOOD), "--emit=dot")
    assert code == 0 and "legend_verify" not in out


def test_emit_mlir_round_trips_through_the_mlir_frontend(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, mlir, _ = run(capsys, src, "-p", "unroll{k=2}", "--emit=mlir")
    assert code == 0 and mlir.startswith("builtin.module")
    generic = write(tmp_path, "in.mlir", mlir)
    code, text, _ = run(capsys, generic)
    assert code == 0
    assert text == run(capsys, src, "-p", "unroll{k=2}")[1]


def test_unknown_emit_is_an_argparse_error(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    with pytest.raises(SystemExit) as info:
        main([str(src), "--emit=yaml"])
    assert info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["in.rpeg"]


def test_emit_json_is_read_back_by_the_json_frontend(tmp_path, capsys):
    """`rpegc x.json` prints the same module as the run that wrote the JSON (the runtime's input form)."""
    code, text, _ = run(capsys, FIG18, "-p", LOWER)
    assert code == 0
    out = tmp_path / "plan.json"
    assert run(capsys, FIG18, "-p", LOWER, "--emit=json", "-o", out)[0] == 0
    code, again, err = run(capsys, out)
    assert (code, err) == (0, "")
    assert again == text


def test_bad_json_is_a_located_error(tmp_path, capsys):
    path = write(tmp_path, "bad.json", '{"format": "rpegc-program",\n "workload": [1, 2,\n')
    code, _, err = run(capsys, path)
    assert code == 1
    assert err.startswith(f"{path}:3:1: error: invalid JSON")


def test_every_rpegc_pass_has_a_lit_golden_named_after_it():
    from rpegc.registry import PASSES

    goldens = pathlib.Path(__file__).resolve().parent.parent / "lit_tests" / "passes"
    assert sorted(p.stem for p in goldens.glob("*.rpeg")) == sorted(PASSES)
    for name in PASSES:  # and it runs that pass
        runs = [line for line in (goldens / f"{name}.rpeg").read_text().splitlines() if "RUN: " in line]
        assert any(re.search(rf"-p '?[^ ]*\b{name}\b", line) for line in runs), name
