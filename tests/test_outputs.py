"""rpegc/outputs.py: what an output path may be, and writing one never destroys what is there
(special files written in place, symlinks kept, modes from the umask or the replaced file, every
output against every input). The four command lines are driven against the same paths in
test_outputs_clis.py."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rpegc.outputs import TEMP_MARK, Output, OutputError, Outputs, PendingOutput, check_outputs, same_file, write_text

ROOT = Path(__file__).resolve().parent.parent


def leftovers(directory: Path) -> list[str]:
    """Temporary or probe files left behind."""
    return sorted(p.name for p in directory.iterdir() if TEMP_MARK in p.name)


def read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def reader():
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return t, got


def check_one(path, inputs=(), **kw) -> str:
    with pytest.raises(OutputError) as exc:
        check_outputs([Output(str(path), "the output", **kw)], inputs=[str(p) for p in inputs])
    return str(exc.value)


# --- special files are written in place, never renamed over ------------------------------------------


def require_dev_null() -> None:
    """Another process on the machine (an old rpegc run as root) may have replaced /dev/null already:
    say so instead of writing over whatever file is there now."""
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.fail("/dev/null is not a character device before the test: something else replaced it")


def test_dev_null_stays_a_character_device():
    require_dev_null()
    check_outputs([Output("/dev/null")])
    write_text("/dev/null", "discarded\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_dev_full_is_one_error_not_a_traceback():
    with pytest.raises(OutputError) as exc:
        write_text("/dev/full", "x" * 10)
    assert str(exc.value) == "/dev/full: error: cannot write the output: No space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_gets_the_text_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    check_outputs([Output(str(fifo))])
    thread, got = read_fifo(fifo)
    write_text(str(fifo), "through the pipe\n")
    thread.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and leftovers(tmp_path) == []


def test_dev_stdout_of_a_pipe_is_written_through():
    """/dev/stdout of a pipe resolves to no path (`pipe:[N]`): it is written by opening it, not renamed."""
    code = "from rpegc.outputs import check_outputs, Output, write_text; check_outputs([Output('/dev/stdout')]); " \
           "write_text('/dev/stdout', 'to the pipe')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "to the pipe", "")


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert "not a regular file, character device or FIFO" in check_one(path)


# --- symlinks: the target is replaced, the link stays -------------------------------------------------


def test_a_symlink_keeps_being_a_link_to_the_replaced_target(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "result.txt"
    target.write_text("old\n")
    link = tmp_path / "result.txt"
    link.symlink_to(target)
    write_text(str(link), "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []  # the temp file was beside the target


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "made.txt")
    write_text(str(link), "made\n")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "made\n"


# --- modes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_new_file_gets_the_umask_mode(tmp_path, umask, mode):
    out = tmp_path / "new.txt"
    code = (f"import os; os.umask({umask:#o}); from rpegc.outputs import write_text; "
            f"write_text({str(out)!r}, 'x')")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    assert stat.S_IMODE(out.stat().st_mode) == mode


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_replaced_file_keeps_its_mode(tmp_path, mode):
    out = tmp_path / "kept.txt"
    out.write_text("old")
    out.chmod(mode)
    write_text(str(out), "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == mode


# --- failures leave the earlier file and nothing else ----------------------------------------------


def test_a_failing_writer_leaves_the_earlier_file_and_no_temp_file(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("earlier\n")
    with pytest.raises(RuntimeError):
        with PendingOutput(str(out)) as path:
            Path(path).write_text("half")
            raise RuntimeError("the run failed")
    assert out.read_text() == "earlier\n" and leftovers(tmp_path) == []


def test_outputs_commit_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.png"
    b.write_text("earlier chart")
    with pytest.raises(RuntimeError):
        with Outputs() as files:
            Path(files.open(str(a))).write_text("module")
            Path(files.open(str(b), "the chart")).write_text("half a chart")
            raise RuntimeError("drawing failed")
    assert not a.exists() and b.read_text() == "earlier chart" and leftovers(tmp_path) == []
    with Outputs() as files:
        Path(files.open(str(a))).write_text("module")
        Path(files.open(str(b))).write_text("chart")
    assert a.read_text() == "module" and b.read_text() == "chart"


def test_the_temp_file_has_the_target_extension(tmp_path):
    with PendingOutput(str(tmp_path / "chart.svg")) as path:
        assert path.endswith(".svg") and os.path.dirname(path) == str(tmp_path)
        Path(path).write_text("<svg/>")


# --- checks before anything is written ---------------------------------------------------------------


def test_unwritable_paths_are_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("")
    assert check_one("") == "'': error: cannot write the output: the path is empty"
    assert check_one(tmp_path).endswith("cannot write the output: it is a directory")
    assert check_one(tmp_path / "no" / "x.txt").endswith(f"no such directory {tmp_path / 'no'}")
    assert check_one(tmp_path / "file" / "x.txt").endswith(f"{tmp_path / 'file'} is not a directory")
    # A directory no file can be created in, as root too (permission bits would not stop root).
    assert "cannot create files in /proc" in check_one("/proc/rpegc-out.txt")
    assert check_one(tmp_path / "chart.xyz", suffixes=(".png", ".svg")).endswith(
        "use a file name ending in .png, .svg")
    assert leftovers(tmp_path) == []


def test_make_parents_accepts_a_missing_directory_under_a_writable_one(tmp_path):
    check_outputs([Output(str(tmp_path / "new" / "dir" / "x.csv"), make_parents=True)])
    assert check_one(tmp_path / "x.csv" / "y.csv", make_parents=False).endswith("no such directory " + str(tmp_path / "x.csv"))
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("alias", ["same", "relative", "dotdot", "symlink", "hardlink"])
def test_an_output_onto_an_input_is_refused(tmp_path, monkeypatch, alias):
    (tmp_path / "a").mkdir()
    src = tmp_path / "a" / "in.rpeg"
    src.write_text("input\n")
    monkeypatch.chdir(tmp_path)
    out = {"same": str(src), "relative": "./a/in.rpeg", "dotdot": "a/../a/in.rpeg", "symlink": "link.rpeg",
           "hardlink": "hard.rpeg"}[alias]
    if alias == "symlink":
        os.symlink(src, "link.rpeg")
    if alias == "hardlink":
        os.link(src, "hard.rpeg")
    assert "refusing to overwrite the input file" in check_one(out, inputs=[src])
    assert src.read_text() == "input\n"


def test_two_outputs_onto_one_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match=r"it is the same file as the trace \(t.jsonl\)"):
        check_outputs([Output("t.jsonl", "the trace"), Output("./sub/../t.jsonl", "the chart")])
    os.mkdir("run")
    with pytest.raises(OutputError, match="it lies in the checkpoints"):
        check_outputs([Output("run/checkpoints", "the checkpoints", directory=True, make_parents=True),
                       Output("run/checkpoints/step-000001.pt", "the trace", make_parents=True)])


def test_a_directory_output(tmp_path):
    (tmp_path / "file").write_text("")
    check_outputs([Output(str(tmp_path / "run"), directory=True)])
    assert check_one(tmp_path / "file", directory=True).endswith("it exists and is not a directory")
    assert check_one(tmp_path / "a" / "run", directory=True).endswith(f"no such directory {tmp_path / 'a'}")
    check_outputs([Output(str(tmp_path / "a" / "run"), directory=True, make_parents=True)])


def test_same_file_for_files_not_written_yet(tmp_path):
    assert same_file(str(tmp_path / "x"), str(tmp_path / "d" / ".." / "x"))
    assert not same_file(str(tmp_path / "x"), str(tmp_path / "y"))
