"""Run the whole test suite (pytest, then lit) and end with one line `N passed, N failed`.

`make test` calls this; CI reads the last line. Counts come from the JUnit XML both runners write.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def junit_counts(path: str) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a JUnit XML report; a missing report counts as one failure."""
    if not os.path.exists(path):
        return 0, 1, 0
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    return passed, failed, skipped


def parallel() -> list[str]:
    """pytest-xdist's options: a test process per core, two at most. Alone, the suite keeps one of two cores busy
    (14.0 min of CPU in 14.6 min); two processes, each module's tests in one of them (their module fixtures built
    once), take 9.9 min (tests/README.md). One core, or no pytest-xdist (an environment without the dev extra): none."""
    cores = min(2, len(os.sched_getaffinity(0)))
    return ["-n", str(cores), "--dist", "loadfile"] if cores > 1 and importlib.util.find_spec("xdist") else []


def main() -> int:
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        py_xml, lit_xml = os.path.join(tmp, "pytest.xml"), os.path.join(tmp, "lit.xml")
        # --durations: the slowest tests, printed with every run, are what to trim before adding (the suite's budget)
        py = subprocess.run([sys.executable, "-m", "pytest", "-q", "--durations=20", *parallel(),
                             f"--junitxml={py_xml}", "tests"], cwd=ROOT, env=env)
        lit = subprocess.run([os.path.join(BIN, "lit"), "-sv", f"--xunit-xml-output={lit_xml}", "lit_tests"],
                             cwd=ROOT, env=env)
        counts = [junit_counts(py_xml), junit_counts(lit_xml)]
    passed = sum(c[0] for c in counts)
    failed = sum(c[1] for c in counts)
    skipped = sum(c[2] for c in counts)
    # A runner that crashed without failing a test case still fails the run.
    if failed == 0 and (py.returncode not in (0,) or lit.returncode != 0):
        failed = 1
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
