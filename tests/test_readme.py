"""The commands and code blocks of the README and of docs/ work as written, and their links lead somewhere.

Every fenced block carries an info string: `sh` blocks are run command by command in one scratch
directory (with a copy of examples/ and .venv/bin on PATH), `rpeg` blocks must compile through the whole
lowering pipeline, `python` blocks run as a script in such a directory, `text` blocks are documentation. A command runs exactly as printed, except:
`[--opt ...]` marks optional arguments, which are run too; a command holding the placeholder `'...'` is
not run; a pipe into a tool this machine lacks (Graphviz's `dot`) runs up to that pipe; and the few
commands listed in NOT_RUN, STAND_INS and INTERRUPTED below, each with its reason. Every entry of those lists
must still be a command of the README or a page of docs/, so none of them outlives the text it excuses. Each
block runs in a scratch directory of its own, so a page's blocks never depend on another page's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rpegc.cli import PRESET_PIPELINE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the README and every page of docs/, in a fixed order
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
INFO_STRINGS = ("sh", "rpeg", "python", "text")
LOWERING = "verify-wellformed,unroll{k=8},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
COMMAND_SECONDS = 300

# Commands of the README this test does not run, and why.
NOT_RUN = {
    "make demo": "the quickstart itself; run on a fresh clone before every submission",
    "make test": "this suite",
    "source .venv/bin/activate": "the test puts .venv/bin on PATH itself",
    "rpeg-calibrate -o cpu.toml": "about 4 minutes of measurements (its arguments are parsed below; "
                                  "tests/test_calibrate_fits.py covers the fits)",
    "rpeg-validate --hardware cpu.toml": "about 3.5 minutes of measurements (its arguments are parsed below; "
                                         "tests/test_validate_smoke.py runs a small grid)",
    "rpeg-calibrate -o bench/results/whole_run_cpu.toml": "about 4 minutes of measurements, and it would replace "
                                                          "the committed profile (its arguments are parsed below)",
    ".venv/bin/python bench/whole_run.py --hardware bench/results/whole_run_cpu.toml":
        "about 9 minutes of measurements; tests/test_bench_smoke.py runs its --quick mode",
}
# Commands run in a faster form that produces the same kind of output.
STAND_INS = {
    "rpegc examples/ppo.rpeg -O -o plan.exec.rpeg": (
        f"rpegc examples/ppo.rpeg -p '{PRESET_PIPELINE.replace('optimize', 'optimize{evals=300}')}' -o plan.exec.rpeg",
        "-O gives the optimizer a 60 s wall-clock budget; 300 evaluations run the same preset pipeline"),
    "rpegc examples/grpo-tiny.rpeg -p 'verify-wellformed,optimize{budget=5 steps=20},unroll{k=20},split-quantiles,"
    "insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule' -o g.exec.rpeg": (
        "rpegc examples/grpo-tiny.rpeg -p 'verify-wellformed,optimize{evals=3000 steps=20},unroll{k=20},"
        "split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule' -o g.exec.rpeg",
        "a 5 s wall-clock budget, run as 3,000 evaluations (under a second)"),
    "rpegc mine/grpo.rpeg -O -o mine.exec.rpeg --summary": (
        f"rpegc mine/grpo.rpeg -p '{PRESET_PIPELINE.replace('optimize', 'optimize{evals=300}')}' -o mine.exec.rpeg "
        "--summary", "the same: a 60 s budget, run as 300 evaluations"),
}
# Commands interrupted (SIGINT) once step N is done, because the README's next command resumes them.
INTERRUPTED = {"rpeg-run g.exec.rpeg --backend torch --run-dir run/ --trace g.jsonl": 3}


@dataclass(frozen=True)
class Block:
    info: str
    body: str
    line: int
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(text: str, page: str = "README.md") -> list[Block]:
    return [Block(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1, page)
            for m in FENCE.finditer(text)]


def all_blocks() -> list[Block]:
    """The blocks of the README and of every page of docs/."""
    return [b for page in PAGES for b in blocks(page.read_text(), str(page.relative_to(ROOT)))]


def commands(body: str) -> list[str]:
    """The commands of an `sh` block: continuation lines joined, trailing `# comments` dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#\s.*$", "", line).strip()
        if line:
            out.append(re.sub(r"\s+", " ", line))
    return out


def readme_commands() -> list[str]:
    return [c for b in all_blocks() if b.info == "sh" for c in commands(b.body)]


def runnable(command: str) -> str:
    """The command with its optional `[...]` arguments in, and pipes into missing tools cut off."""
    command = re.sub(r"\[(-[^\]]*)\]", r"\1", command)
    parts = command.split(" | ")
    kept = [parts[0]]
    for part in parts[1:]:
        tool = part.split()[0]
        if shutil.which(tool, path=_path()) is None:
            break
        kept.append(part)
    return " | ".join(kept)


def _path() -> str:
    return f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=_path(), PYTHONUNBUFFERED="1")


def _check(command: str, proc_rc: int, output: str) -> None:
    assert proc_rc == 0, f"`{command}` exited {proc_rc}:\n{output[-3000:]}"
    for bad in ("Traceback", "internal error"):
        assert bad not in output, f"`{command}` printed {bad!r}:\n{output[-3000:]}"


def _run(command: str, cwd: Path) -> None:
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=COMMAND_SECONDS)
    _check(command, proc.returncode, proc.stdout)


def _run_interrupted(command: str, cwd: Path, after_step: int) -> None:
    proc = subprocess.Popen(shlex.split(command), cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"step {after_step} done"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=COMMAND_SECONDS)[0]
    output = "".join(seen) + rest
    assert any(s.startswith(f"step {after_step} done") for s in seen), output[-3000:]
    assert "Traceback" not in output and "internal error" not in output, output[-3000:]


def test_every_block_says_what_it_is():
    for b in all_blocks():
        assert b.info in INFO_STRINGS, f"{b.where}: a code block needs one of {INFO_STRINGS}, not {b.info!r}"


def test_the_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; the rest belongs in a page of docs/ (README's map)"
    mapped = set(LINK.findall(README.read_text()))
    for page in PAGES[1:]:
        assert (f"docs/{page.name}", "") in mapped, f"README.md's map of docs/ does not link {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_lead_to_files(page):
    """Relative links of the README and docs/ name files of the repository (web links are not followed)."""
    for target, _anchor in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: link to {target}, which does not exist"


def test_nothing_cites_a_file_outside_the_repository():
    """Code and docs cite docs/ (the cost model's spec, the architecture), never a path outside the checkout."""
    texts = [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.md")]
    for folder in ("rpegc", "dialects", "passes", "runtime", "tools", "tests", "bench", "lit_tests", "examples"):
        texts += [f for f in (ROOT / folder).rglob("*") if f.suffix in (".py", ".rpeg", ".toml", ".test", ".md")
                  and "Output" not in f.parts]
    outside = re.compile(r"\.\./shared/|(?<![\w/-])spec/cost-model\.md|(?<![\w/-])DESIGN\.md")
    for path in texts:
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if path.name != "test_readme.py" and outside.search(line):
                pytest.fail(f"{path.relative_to(ROOT)}:{i}: cites a file outside the repository: {line.strip()}")


def test_the_exceptions_name_commands_that_are_in_the_readme():
    present = set(readme_commands())
    for listed in (NOT_RUN, STAND_INS, INTERRUPTED):
        stale = set(listed) - present
        assert not stale, f"no longer in the README, remove from the test's lists: {sorted(stale)}"


@pytest.mark.parametrize("tool", ["rpeg-calibrate", "rpeg-validate"])
def test_commands_not_run_have_valid_arguments(tool):
    from rpegc.tools import calibrate, validate

    parser = {"rpeg-calibrate": calibrate, "rpeg-validate": validate}[tool].build_parser()
    uses = [c for c in NOT_RUN if c.startswith(tool + " ")]
    assert uses
    for command in uses:
        parser.parse_args(shlex.split(command)[1:])


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.info == "rpeg"], ids=lambda b: b.where)
def test_rpeg_blocks_compile(block, tmp_path):
    source = tmp_path / "readme.rpeg"
    source.write_text(block.body)
    _run(f"rpegc readme.rpeg -p '{LOWERING}' -o readme.exec.rpeg --summary", tmp_path)
    assert "exec.schedule" in (tmp_path / "readme.exec.rpeg").read_text()


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.info == "sh"], ids=lambda b: b.where)
def test_sh_block_runs_as_written(block, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    ran = 0
    for command in commands(block.body):
        if command in NOT_RUN or "'...'" in command:
            continue
        if command in INTERRUPTED:
            _run_interrupted(runnable(command), tmp_path, INTERRUPTED[command])
        else:
            _run(runnable(STAND_INS.get(command, (command,))[0]), tmp_path)
        ran += 1
    assert ran or all(c in NOT_RUN for c in commands(block.body))


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.info == "python"], ids=lambda b: b.where)
def test_python_block_runs_as_written(block, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "readme.py").write_text(block.body)
    _run(f"{shlex.quote(sys.executable)} readme.py", tmp_path)
