"""The `rpegc` command line (DESIGN.md Section 5): output files, split input, diagnostics mode, pass
instrumentation and the JSON form. Runs `rpegc.cli.main(argv)` in-process; stdout/stderr via capsys."""

from __future__ import annotations

import json
import os
import pathlib
import re

import pytest

from programs import ACTOR_GRAPH
from rpegc.cli import main

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


def test_split_input_file_with_verify_diagnostics_prints_both_chunks(tmp_path, capsys):
    src = write(tmp_path, "two.rpeg", BAD + "// -----\n" + GOOD)
    code, out, err = run(capsys, src, "--split-input-file", "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, err) == (0, "")
    first, second = out.split("// -----\n")
    assert first.startswith(f"{src}:{BAD_LINE}:3: error: %X is read by @gen")
    assert second.startswith("rpeg.workload") and "rpeg.input %X" in second


def test_verify_diagnostics_prints_the_error_and_exits_zero(tmp_path, capsys):
    src = write(tmp_path, "bad.rpeg", BAD)
    code, out, err = run(capsys, src, "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{src}:{BAD_LINE}:3: error: %X is read by @gen but no vertex writes it (Def. A.2 (3)); list it in "
        "rpeg.input or add it to the writes of its producer",
        "  %X = rpeg.container tokens[B, Lp]",
        "  ^",
    ]


def test_verify_diagnostics_on_good_input_prints_the_module(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "--verify-diagnostics", "-p", "verify-wellformed")
    assert (code, err) == (0, "")
    assert out == GOOD


# --- pass instrumentation ---------------------------------------------------------------------------------


def test_print_between_passes_shows_the_ir_after_each_pass(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--print-between-passes")
    assert code == 0
    # The dumps go to stderr in .rpeg text (as mlir-opt's do), so stdout stays a clean module.
    assert "IR after verify-wellformed" in err
    after_verify = err.split("IR after verify-wellformed")[1]
    assert "rpeg.vertex @gen" in after_verify and "exec.op" not in after_verify  # before unroll
    assert "IR after" not in out
    assert out.rstrip().endswith("}")
    assert "exec.publish @train#0 -> @gen#1 (%W)" in out  # the final module in rpeg text


def test_time_passes_reports_every_pass(tmp_path, capsys):
    src = write(tmp_path, "in.rpeg", GOOD)
    code, out, err = run(capsys, src, "-p", "verify-wellformed,unroll{k=2}", "--time-passes")
    assert code == 0
    timings = re.findall(r"Pass ([\w-]+) took ([0-9.e-]+) seconds", err)
    assert "took" not in out  # stdout carries only the module
    assert [name for name, _ in timings] == ["verify-wellformed", "unroll"]
    assert all(float(t) >= 0 for _, t in timings)


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
                   '"train#1" -> "gen#2" [color="#cb181d", fontcolor="#cb181d", label="W"];']


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
