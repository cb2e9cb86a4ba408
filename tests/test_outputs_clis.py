"""The four command lines (rpegc, rpeg-run, rpeg-calibrate, rpeg-validate) against hostile output paths:
/dev/null, /dev/full, a FIFO, a symlink, a directory, '', a missing parent, a parent that is a file, a
directory no file can be created in (/proc, real as root), the input under five names, a bad extension.
Each must exit 1 with one located line (0 where writing there is legitimate), leave the inputs
byte-identical, /dev/null a character device and no temporary file. In-process main() calls; rpeg-run
on the sim backend; rpeg-calibrate and rpeg-validate must fail before measuring (measuring raises here).
rpegc/outputs.py itself is tested in test_outputs.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fixtures.programs import ACTOR_GRAPH
from rpegc.outputs import TEMP_MARK
from rpegc.syntax.json_form import program_to_json
from fixtures.runtime_plans import disaggregated_plan, scheduled

ROOT = Path(__file__).resolve().parent.parent
HARDWARE = ROOT / "rpegc" / "hardware" / "gh200.toml"
INPUT = {"rpegc": "in.rpeg", "rpeg-run": "plan.json", "rpeg-calibrate": "out.toml", "rpeg-validate": "hw.toml"}


@pytest.fixture(scope="module")
def plan_text() -> str:
    return json.dumps(program_to_json(scheduled(disaggregated_plan(1), 1)))


@pytest.fixture
def ws(tmp_path, monkeypatch, plan_text) -> Path:
    """A working directory with every tool's input; measuring is forbidden."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.rpeg").write_text(ACTOR_GRAPH)
    (tmp_path / "plan.json").write_text(plan_text)
    shutil.copy(HARDWARE, tmp_path / "hw.toml")
    (tmp_path / "out.toml").write_text("# an earlier profile\n")  # rpeg-calibrate's -o, the other output is --raw
    (tmp_path / "file").write_text("a regular file\n")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "target.txt").write_text("old target\n")

    def measuring(*args, **kwargs):
        raise AssertionError("measuring started before the outputs were checked")

    monkeypatch.setattr("rpegc.tools.calibrate.calibrate", measuring)
    monkeypatch.setattr("rpegc.tools.validate.measure", measuring)
    return tmp_path


def invoke(cli: str, argv: list[str], capsys) -> tuple[int, str, str]:
    if cli == "rpegc":
        from rpegc.cli import main
    elif cli == "rpeg-run":
        from rpegc.runtime.cli import main
    elif cli == "rpeg-calibrate":
        from rpegc.tools.calibrate import main
    else:
        from rpegc.tools.validate import main
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def argv_for(cli: str, output: str) -> list[str]:
    """The command line writing its main output to `output` (rpeg-validate: the --out directory)."""
    return {"rpegc": ["in.rpeg", "-o", output],
            "rpeg-run": ["plan.json", "--quiet", "--trace", output],
            "rpeg-calibrate": ["--quick", "-q", "-o", "other.toml", "--raw", output],
            "rpeg-validate": ["--hardware", "hw.toml", "--quick", "-q", "--out", output]}[cli]


def snapshot(ws: Path) -> dict[str, bytes]:
    return {name: (ws / name).read_bytes() for name in ("in.rpeg", "plan.json", "hw.toml", "out.toml", "file")}


def assert_clean(ws: Path, before: dict[str, bytes], err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err
    assert snapshot(ws) == before, "an input file changed"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null was replaced"
    stray = [str(p.relative_to(ws)) for p in ws.rglob("*") if TEMP_MARK in p.name or p.name.endswith(".tmp")]
    assert stray == []


def assert_one_error(code: int, err: str, path: str, what: str) -> None:
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path or repr('')}") and f"error: cannot write {what}" in lines[0], err


CLIS = list(INPUT)
WHAT = {"rpegc": "the output", "rpeg-run": "the trace", "rpeg-calibrate": "the raw measurements",
        "rpeg-validate": "the CSV"}


# --- hostile paths that are errors for every tool -----------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("case", ["empty", "directory", "under a file", "unwritable directory", "missing parent"])
def test_an_unwritable_output_is_one_error_and_writes_nothing(ws, capsys, cli, case):
    require_dev_null()
    before = snapshot(ws)
    output = {"empty": "", "directory": "real", "under a file": "file/x", "unwritable directory": "/proc/rpegc-x",
              "missing parent": "no/such/x"}[case]
    if cli == "rpeg-validate":
        if case == "missing parent":
            output = "/proc/no/such"  # rpeg-validate creates a missing --out; not under /proc
        if case == "directory":
            (ws / "real" / "validation.csv").mkdir()  # --out may be a directory; its CSV may not
    code, out, err = invoke(cli, argv_for(cli, output), capsys)
    shown = output if cli != "rpeg-validate" or not output else f"{output}/validation.csv"
    what = "the results" if cli == "rpeg-validate" and case == "empty" else WHAT[cli]
    assert_one_error(code, err, shown, what)
    assert_clean(ws, before, err)
    assert not (ws / "no").exists()


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("alias", ["same", "relative", "dotdot", "symlink", "hardlink"])
def test_an_output_onto_an_input_is_refused(ws, capsys, cli, alias):
    """rpegc -o, rpeg-run --trace onto the plan, rpeg-calibrate --raw onto -o, rpeg-validate's CSV onto
    --hardware: under the same name, ./name, sub/../name, a symlink and a hard link."""
    require_dev_null()
    before = snapshot(ws)
    (ws / "sub").mkdir()
    target = INPUT[cli]
    alias_path = {"same": target, "relative": f"./{target}", "dotdot": f"sub/../{target}",
                  "symlink": "alias", "hardlink": "alias"}[alias]
    if alias == "symlink":
        os.symlink(target, "alias")
    if alias == "hardlink":
        os.link(target, "alias")
    if cli == "rpeg-validate":
        # The CSV (validation.csv in --out) is the hardware profile under another name.
        os.mkdir("val")
        if alias in ("symlink", "hardlink"):
            os.unlink("alias")
            (os.symlink if alias == "symlink" else os.link)(ws / "hw.toml", "val/validation.csv")
            argv = ["--hardware", "hw.toml", "--quick", "-q", "--out", "val"]
        else:
            shutil.copy("hw.toml", "val/validation.csv")
            hw = {"same": "val/validation.csv", "relative": "./val/validation.csv",
                  "dotdot": "sub/../val/validation.csv"}[alias]
            argv = ["--hardware", hw, "--quick", "-q", "--out", "val"]
        code, out, err = invoke(cli, argv, capsys)
        assert code == 1 and "refusing to overwrite the input file" in err, err
    elif cli == "rpeg-calibrate":
        code, out, err = invoke(cli, ["--quick", "-q", "-o", target, "--raw", alias_path], capsys)
        assert code == 1 and "it is the same file as the profile" in err, err
    else:
        code, out, err = invoke(cli, argv_for(cli, alias_path), capsys)
        assert_one_error(code, err, alias_path, WHAT[cli])
        assert "refusing to overwrite the input file" in err
    assert_clean(ws, before, err)


# --- special files and symlinks: written through, never replaced ------------------------------------


def require_dev_null() -> None:
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.fail("/dev/null is not a character device before the test: something else replaced it")


@pytest.mark.parametrize("cli", ["rpegc", "rpeg-run"])
def test_dev_null_is_written_and_stays_a_device(ws, capsys, cli):
    require_dev_null()
    before = snapshot(ws)
    code, out, err = invoke(cli, argv_for(cli, "/dev/null"), capsys)
    assert code == 0, err
    assert_clean(ws, before, err)


@pytest.mark.parametrize("cli", ["rpegc", "rpeg-run"])
def test_dev_full_is_one_error(ws, capsys, cli):
    before = snapshot(ws)
    code, out, err = invoke(cli, argv_for(cli, "/dev/full"), capsys)
    assert_one_error(code, err, "/dev/full", WHAT[cli])
    assert err.strip().endswith("No space left on device")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert_clean(ws, before, err)


@pytest.mark.parametrize("cli", ["rpegc", "rpeg-run"])
def test_a_fifo_is_written_through(ws, capsys, cli):
    os.mkfifo("pipe")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(Path("pipe").read_bytes()), daemon=True)
    reader.start()
    before = snapshot(ws)
    code, out, err = invoke(cli, argv_for(cli, "pipe"), capsys)
    reader.join(timeout=30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat("pipe").st_mode) and got and got[0]
    assert_clean(ws, before, err)


@pytest.mark.parametrize("cli", ["rpegc", "rpeg-run"])
def test_a_symlink_output_replaces_its_target_and_stays_a_link(ws, capsys, cli):
    os.symlink("real/target.txt", "link")
    before = snapshot(ws)
    code, out, err = invoke(cli, argv_for(cli, "link"), capsys)
    assert code == 0, err
    assert os.path.islink("link") and os.readlink("link") == "real/target.txt"
    assert (ws / "real" / "target.txt").read_text() != "old target\n"
    assert_clean(ws, before, err)


@pytest.mark.parametrize("cli", ["rpeg-calibrate", "rpeg-validate"])
@pytest.mark.parametrize("special", ["/dev/null", "fifo"])
def test_a_special_file_is_no_directory_for_validate_and_fine_for_calibrate(ws, capsys, cli, special):
    """rpeg-validate's --out is a directory: /dev/null or a FIFO is an error. rpeg-calibrate may write
    /dev/null (it would measure, so here the check only has to pass: measuring raises)."""
    require_dev_null()
    path = special
    if special == "fifo":
        os.mkfifo("pipe")
        path = "pipe"
    before = snapshot(ws)
    if cli == "rpeg-validate":
        code, out, err = invoke(cli, argv_for(cli, path), capsys)
        assert code == 1 and f"{path}/validation.csv: error: cannot write the CSV: " in err and "not a directory" in err
    else:
        with pytest.raises(AssertionError, match="measuring started"):
            invoke(cli, ["--quick", "-q", "-o", path], capsys)
        err = capsys.readouterr().err
    assert_clean(ws, before, err)


# --- every output checked before anything is written -------------------------------------------------


def test_rpegc_bad_gantt_extension_writes_no_module(ws, capsys):
    before = snapshot(ws)
    code, out, err = invoke("rpegc", ["in.rpeg", "-o", "out.rpeg", "--gantt", "chart.xyz"], capsys)
    assert_one_error(code, err, "chart.xyz", "the Gantt chart")
    assert not (ws / "out.rpeg").exists()
    assert_clean(ws, before, err)


def test_rpegc_gantt_of_an_unscheduled_module_writes_no_module(ws, capsys):
    (ws / "out.rpeg").write_text("earlier\n")
    code, out, err = invoke("rpegc", ["in.rpeg", "-o", "out.rpeg", "--gantt", "chart.png"], capsys)
    assert code == 1 and "--gantt needs a scheduled module" in err
    assert (ws / "out.rpeg").read_text() == "earlier\n" and not (ws / "chart.png").exists()


def test_rpegc_gantt_goes_through_a_symlink_and_commits_with_the_module(ws, capsys):
    os.symlink("real/chart.png", "chart.png")
    code, out, err = invoke("rpegc", ["plan.json", "-o", "out.json", "--emit", "json", "--gantt", "chart.png"], capsys)
    assert code == 0, err
    assert os.path.islink("chart.png") and (ws / "real" / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((ws / "out.json").read_text())


def test_rpegc_two_outputs_onto_one_file(ws, capsys):
    code, out, err = invoke("rpegc", ["plan.json", "-o", "x.png", "--gantt", "./x.png"], capsys)
    assert_one_error(code, err, "./x.png", "the Gantt chart")
    assert "same file as the output" in err and not (ws / "x.png").exists()


def test_rpegc_new_output_honours_the_umask(ws):
    code = ("import os, sys; os.umask(0o027); from rpegc.cli import main; "
            "sys.exit(main(['in.rpeg', '-o', 'out.rpeg']))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ws, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert stat.S_IMODE((ws / "out.rpeg").stat().st_mode) == 0o640


def test_rpegc_replaced_output_keeps_its_mode(ws, capsys):
    (ws / "out.rpeg").write_text("earlier\n")
    (ws / "out.rpeg").chmod(0o664)
    assert invoke("rpegc", ["in.rpeg", "-o", "out.rpeg"], capsys)[0] == 0
    assert stat.S_IMODE((ws / "out.rpeg").stat().st_mode) == 0o664


def test_rpeg_run_bad_gantt_extension_runs_nothing(ws, capsys):
    before = snapshot(ws)
    code, out, err = invoke("rpeg-run", ["plan.json", "--trace", "t.jsonl", "--gantt", "chart.xyz"], capsys)
    assert_one_error(code, err, "chart.xyz", "the Gantt chart")
    assert out == "" and not (ws / "t.jsonl").exists()
    assert_clean(ws, before, err)


def test_rpeg_run_gantt_onto_the_trace_or_the_plan(ws, capsys):
    code, _, err = invoke("rpeg-run", ["plan.json", "--trace", "g.png", "--gantt", "g.png"], capsys)
    assert code == 1 and "same file as the trace" in err
    os.link("plan.json", "plan.png")
    code, _, err = invoke("rpeg-run", ["plan.json", "--gantt", "plan.png"], capsys)
    assert code == 1 and "refusing to overwrite the input file plan.json" in err


def test_rpeg_run_dir_files_against_the_plan_and_the_trace(ws, capsys):
    os.makedirs("run/checkpoints")
    cases = [(["--run-dir", "run", "--trace", "run/final"], "cannot write the trace: it is the same file as the run directory's final weights"),
             (["--resume", "run", "--trace", "run/checkpoints/t.jsonl"], "cannot write the trace: it lies in the run directory's checkpoints (run/checkpoints)"),
             (["--run-dir", "plan.json"], "plan.json is not a directory"),
             (["--run-dir", "file"], "file is not a directory")]
    for extra, message in cases:
        code, out, err = invoke("rpeg-run", ["plan.json", "--backend", "torch", *extra], capsys)
        assert code == 1 and message in err, (extra, err)
        assert "Traceback" not in err and out == ""
    assert (ws / "plan.json").read_text().startswith("{")


# --- rpeg-run: a failed run leaves no trace, a failed verification keeps it ---------------------------


def test_rpeg_run_failing_run_leaves_no_partial_trace(ws, capsys, monkeypatch):
    from rpegc.core.ir.errors import RpegError

    (ws / "t.jsonl").write_text("an earlier trace\n")

    def dying_run(plan, backend, options, sink=None, **kw):
        sink({"type": "header"})
        raise RpegError(None, "worker 1 died")

    monkeypatch.setattr("rpegc.runtime.controller.run", dying_run)
    code, out, err = invoke("rpeg-run", ["plan.json", "--quiet", "--trace", "t.jsonl"], capsys)
    assert code == 1 and "worker 1 died" in err
    assert (ws / "t.jsonl").read_text() == "an earlier trace\n"
    assert_clean(ws, snapshot(ws), err)


def test_rpeg_run_failed_verification_keeps_the_trace(ws, capsys, monkeypatch):
    monkeypatch.setattr("rpegc.runtime.verify.verify", lambda plan, trace: ["[made-up] a violation"])
    code, out, err = invoke("rpeg-run", ["plan.json", "--quiet", "--trace", "t.jsonl"], capsys)
    assert code == 1 and "verification: FAILED" in out
    assert (ws / "t.jsonl").read_text().startswith('{"type":"header"')


def test_rpeg_run_failing_gantt_keeps_the_earlier_chart(ws, capsys, monkeypatch):
    from rpegc.core.ir.errors import RpegError

    (ws / "g.png").write_bytes(b"earlier chart")

    def half_drawn(panels, path, **kw):
        Path(path).write_bytes(b"half")
        raise RpegError(None, "drawing failed")

    monkeypatch.setattr("rpegc.tools.gantt.draw_bars", half_drawn)
    code, out, err = invoke("rpeg-run", ["plan.json", "--quiet", "--gantt", "g.png"], capsys)
    assert code == 1 and "drawing failed" in err
    assert (ws / "g.png").read_bytes() == b"earlier chart"
    assert_clean(ws, snapshot(ws), err)


# --- defaults never replace results -----------------------------------------------------------------


def test_rpeg_calibrate_default_output_never_replaces_a_profile(ws, capsys):
    (ws / "cpu.toml").write_text("# committed profile\n")
    code, out, err = invoke("rpeg-calibrate", ["--quick", "-q"], capsys)
    assert code == 1 and "cpu.toml: error: cannot write the profile: cpu.toml exists" in err
    assert "-o cpu.toml" in err and (ws / "cpu.toml").read_text() == "# committed profile\n"


def test_rpeg_validate_default_output_is_a_new_directory(ws, capsys):
    from rpegc.core.cost.options import CostOptions
    from rpegc.core.cost.hardware import load_hardware
    from rpegc.tools.validate import VALIDATION_ARCHS, Case, make_rows, write_csv

    tiny = VALIDATION_ARCHS["tiny"]
    cases = [Case("inference", "reference", "tiny", tiny, 16, 1, 8, 8, 1, 1, 1, 1)]
    write_csv(make_rows(cases, [((0.01, 0.012), None)], load_hardware("gh200"), CostOptions(), 8),
              ws / "saved.csv")
    for _ in range(2):
        code, out, err = invoke("rpeg-validate", ["--hardware", "hw.toml", "--from", "saved.csv"], capsys)
        assert code == 0, err
    made = sorted(p.name for p in ws.glob("rpeg-validate-*"))
    assert len(made) == 2  # the second run did not write over the first
    assert {p.name for p in (ws / made[0]).iterdir()} == {"validation-repredicted.csv", "validation-repredicted.png",
                                                          "report-repredicted.md"}


def test_fresh_out_dir_skips_existing_names(ws):
    import datetime

    from rpegc.tools.validate import fresh_out_dir

    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert fresh_out_dir(now) == Path("rpeg-validate-20260102-030405")
    os.mkdir("rpeg-validate-20260102-030405")
    assert fresh_out_dir(now) == Path("rpeg-validate-20260102-030405-2")


def test_rpeg_validate_from_csv_inside_out_is_refused(ws, capsys):
    os.mkdir("val")
    (ws / "val" / "validation-repredicted.csv").write_text("case\n")
    code, out, err = invoke("rpeg-validate", ["--hardware", "hw.toml", "--from", "val/validation-repredicted.csv",
                                              "--out", "val"], capsys)
    assert code == 1 and "refusing to overwrite the input file val/validation-repredicted.csv" in err
    assert (ws / "val" / "validation-repredicted.csv").read_text() == "case\n"
