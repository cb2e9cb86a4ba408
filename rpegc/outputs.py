"""Output files that never destroy what is there: the one module rpegc, rpeg-run, rpeg-calibrate and
rpeg-validate check and write their output files with.

The rules (docs/compiler.md, "Output files"):

- Every output is checked before the tool runs or writes anything (`check_outputs`): a non-empty path,
  an allowed extension, an existing directory the tool can create files in, not a directory, and not the
  same file as any input or as another output (same device and inode when both exist, else the same
  resolved path; so `./x`, `a/../x`, symlinks and hard links are all caught).
- A regular file, or a new path, is written to a temporary file beside it and renamed over it once
  complete (`PendingOutput`, `Outputs`), so a failed or interrupted run leaves no partial file and
  the earlier file intact.
- A symlink is followed: its target is replaced that way, in the target's directory, and the link
  stays a link (what `>` in a shell does, without the truncation window).
- A character device or FIFO (/dev/null, /dev/stdout, a named pipe) is written in place: renaming over
  it would replace the device with a regular file. Other special files (sockets, block devices) are
  refused.
- A new file gets mode 0666 & ~umask; a replaced file keeps its mode (and, for root, its owner).

Failures are `OutputError`s, printed as `PATH: error: cannot write <what>: <reason>`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

# The Gantt chart's file types (matplotlib's writers that tools.gantt uses); here, so that checking a --gantt path
# before a run does not import matplotlib (0.6 s).
GANTT_FORMATS = (".png", ".svg", ".pdf")

from rpegc.core.ir.errors import Loc, RpegError

TEMP_MARK = ".tmp-"  # in every temporary file's name: `.NAME.tmp-XXXXXXXX.EXT`


class OutputError(RpegError):
    """An output that cannot or must not be written; located at its path (no line or column)."""

    def __init__(self, path: str, message: str):
        super().__init__(Loc(shown(path), 0, 0), message)
        self.path = path

    def __str__(self) -> str:
        return f"{shown(self.path)}: error: {self.message}"


def shown(path: str) -> str:
    """A path as error messages show it; the empty path would vanish otherwise."""
    return path if path else "''"


@dataclass(frozen=True)
class Output:
    """One output of a run, as `check_outputs` sees it.

    what: names it in messages ("the trace"). suffixes: the extensions allowed (lower case, with the
    dot), empty for any. make_parents: the tool creates missing parent directories itself.
    directory: the path is a directory the tool fills; nothing else may lie inside it.
    """

    path: str
    what: str = "the output"
    suffixes: tuple[str, ...] = ()
    make_parents: bool = False
    directory: bool = False


# ---------------------------------------------------------------------------------------------------
# Checking, before anything runs


def check_outputs(outputs: Sequence[Output], inputs: Iterable[str] = ()) -> None:
    """Raise `OutputError` for the first output that cannot be written or would clobber an input or
    another output; writes nothing (a probe file is created and removed at once)."""
    inputs = [p for p in inputs if p]
    for i, out in enumerate(outputs):
        if out.directory:
            _check_directory_output(out)
        else:
            _check_file_output(out)
        for src in inputs:
            if _overlaps(out, src):
                raise OutputError(out.path, f"cannot write {out.what}: refusing to overwrite the input file "
                                            f"{shown(src)}; choose another path")
        for other in outputs[:i]:
            if _overlaps(out, other.path, other.directory):
                raise OutputError(out.path, f"cannot write {out.what}: {_overlap_reason(out, other)}; "
                                            "give each output its own path")


def _check_file_output(out: Output) -> None:
    fail = _failer(out)
    if not out.path:
        fail("the path is empty")
    ext = os.path.splitext(out.path)[1].lower()
    if out.suffixes and ext not in out.suffixes:
        fail(f"use a file name ending in {', '.join(out.suffixes)}")
    st = _stat(out.path)  # through symlinks, also /proc's (/dev/stdout of a pipe resolves to no path)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            fail("it is a directory")
        if _in_place(st):
            if not os.access(out.path, os.W_OK):
                fail("permission denied")
            return
        if not stat.S_ISREG(st.st_mode):
            fail("it is not a regular file, character device or FIFO")
    _check_directory(os.path.dirname(os.path.realpath(out.path)), out.make_parents, fail)


def _check_directory_output(out: Output) -> None:
    fail = _failer(out)
    if not out.path:
        fail("the path is empty")
    target = os.path.realpath(out.path)
    st = _stat(target)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        fail("it exists and is not a directory")
    _check_directory(target if st is not None else os.path.dirname(target), out.make_parents, fail)


def _check_directory(directory: str, make_parents: bool, fail) -> None:
    """`directory` (or, with make_parents, its nearest existing ancestor) must take new files."""
    if make_parents:
        while directory != os.path.dirname(directory) and _stat(directory) is None:
            directory = os.path.dirname(directory)
    st = _stat(directory)
    if st is None:
        fail(f"no such directory {directory}")
    if not stat.S_ISDIR(st.st_mode):
        fail(f"{directory} is not a directory")
    # Permission bits do not tell (root ignores them; read-only mounts, /proc): create a file to know.
    try:
        fd, probe = tempfile.mkstemp(prefix=".rpeg-probe" + TEMP_MARK, dir=directory)
    except OSError as e:
        fail(f"cannot create files in {directory}: {e.strerror or e}")
    os.close(fd)
    os.unlink(probe)


def _failer(out: Output):
    def fail(reason: str):
        raise OutputError(out.path, f"cannot write {out.what}: {reason}")

    return fail


def _overlap_reason(out: Output, other: Output) -> str:
    where = f"{other.what} ({shown(other.path)})"
    if same_file(out.path, other.path):
        return f"it is the same file as {where}"
    return f"it lies in {where}" if other.directory and _inside(out.path, other.path) else f"{where} lies in it"


def _overlaps(out: Output, path: str, path_is_directory: bool = False) -> bool:
    """Whether writing `out` would write the file `path`, or either lies inside the other's directory."""
    if not out.path or not path:
        return False
    return (same_file(out.path, path) or (out.directory and _inside(path, out.path))
            or (path_is_directory and _inside(out.path, path)))


def same_file(a: str, b: str) -> bool:
    """The same file: same device and inode when both exist (hard links, symlinks), else the same
    resolved path (a file not written yet)."""
    sa, sb = _stat(a), _stat(b)
    if sa is not None and sb is not None:
        return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
    return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, directory: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(directory).rstrip(os.sep) + os.sep)


def _stat(path: str) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except OSError:
        return None


def _in_place(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)


# ---------------------------------------------------------------------------------------------------
# Writing


class PendingOutput:
    """An output being written: write it at `path`; `commit()` makes it the output, `discard()` drops it.

    For a regular or new file `path` is a temporary file beside the target, with the target's extension
    (matplotlib picks the format by it); for a character device or FIFO it is the target itself.
    """

    def __init__(self, target: str, what: str = "the output"):
        self.target, self.what = target, what
        st = _stat(target)
        self._temporary = not (st is not None and _in_place(st))
        if not self._temporary:
            self.path = self._final = target  # open() follows the links; the device or pipe stays
            return
        self._final = os.path.realpath(target) if target else target
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise self.error("it is not a regular file, character device or FIFO")
        directory, name = os.path.split(self._final)
        base, ext = os.path.splitext(name)
        try:
            fd, self.path = tempfile.mkstemp(prefix=f".{base}{TEMP_MARK}", suffix=ext, dir=directory or ".")
        except OSError as e:
            raise self.error(e.strerror or str(e)) from None
        try:
            _take_mode(fd, st)
        finally:
            os.close(fd)

    def error(self, reason: str) -> OutputError:
        return OutputError(self.target, f"cannot write {self.what}: {reason}")

    def commit(self) -> None:
        if not self._temporary:
            return
        try:
            # Without the fsync a crash soon after the rename can leave an empty file in place of both.
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.path, self._final)
        except OSError as e:
            self.discard()
            raise self.error(e.strerror or str(e)) from None

    def discard(self) -> None:
        if self._temporary and os.path.lexists(self.path):
            os.unlink(self.path)

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
            return
        self.discard()
        if issubclass(exc_type, OSError):
            raise self.error(exc.strerror or str(exc)) from None


class Outputs:
    """The outputs of one run, committed together when the block succeeds and all discarded when it
    fails, so a failing run writes nothing. `open(path, what)` gives the path to write each one at."""

    def __init__(self) -> None:
        self._pending: list[PendingOutput] = []

    def open(self, target: str, what: str = "the output") -> str:
        self._pending.append(PendingOutput(target, what))
        return self._pending[-1].path

    def __enter__(self) -> "Outputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            for p in self._pending:
                p.commit()
            return
        for p in self._pending:
            p.discard()
        if issubclass(exc_type, OSError) and self._pending:
            raise self._pending[-1].error(exc.strerror or str(exc)) from None


class PendingDirectory:
    """A directory output written by several processes: they fill `path` (TARGET.partial, created empty
    here), `commit()` makes it TARGET, `discard()` drops it.

    The writers fsync their own files; `commit` fsyncs the directory, renames it over TARGET (an older
    TARGET is moved aside first and removed after) and fsyncs the parent, so a crash at any point leaves
    either the old TARGET or the new one complete, and at most a `.partial` the next run removes.
    """

    SUFFIX = ".partial"

    def __init__(self, target: str, what: str = "the output"):
        self.target, self.what = target, what
        self.path = target + self.SUFFIX
        try:
            if os.path.lexists(self.path):
                _remove_tree(self.path)
            os.makedirs(self.path)
        except OSError as e:
            raise self.error(e.strerror or str(e)) from None

    def error(self, reason: str) -> OutputError:
        return OutputError(self.target, f"cannot write {self.what}: {reason}")

    def commit(self) -> None:
        parent = os.path.dirname(os.path.abspath(self.target))
        old = os.path.join(parent, f".{os.path.basename(self.target)}{TEMP_MARK}old")
        try:
            fsync_path(self.path)
            if os.path.lexists(self.target):
                if os.path.lexists(old):
                    _remove_tree(old)
                os.replace(self.target, old)
            os.replace(self.path, self.target)
            fsync_path(parent)
            if os.path.lexists(old):
                _remove_tree(old)
        except OSError as e:
            raise self.error(e.strerror or str(e)) from None

    def discard(self) -> None:
        if os.path.lexists(self.path):
            _remove_tree(self.path)


def fsync_path(path: str) -> None:
    """fsync a file or directory by path (a directory's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: str) -> None:
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def write_text(target: str, text: str, what: str = "the output") -> None:
    with PendingOutput(target, what) as path, open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _take_mode(fd: int, st: Optional[os.stat_result]) -> None:
    """mkstemp creates 0600: give a new file 0666 & ~umask and a replaced one its old mode and owner."""
    if st is None:
        os.fchmod(fd, 0o666 & ~current_umask())
        return
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    if os.geteuid() == 0:
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass  # e.g. an id the filesystem cannot store: the content still must be written


def current_umask() -> int:
    """The process umask; read from /proc where possible, since setting it to read it races threads."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


__all__ = ["OutputError", "Output", "check_outputs", "same_file", "PendingOutput", "PendingDirectory", "fsync_path", "Outputs", "write_text",
           "current_umask", "shown", "TEMP_MARK"]
