"""The shipped examples, compiled by the core passes (no xDSL), run on the sim backend and verify:
the 'plan' policy replays the schedule exactly, 'alg2' with jitter stays valid (paper Sec. VII)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from rpegc.core.cost.annotate import annotate
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.sched.schedule import schedule_program
from rpegc.runtime.backends.sim import SimBackend
from rpegc.runtime.controller import RunOptions, run
from rpegc.runtime.plan import build_run_plan
from rpegc.syntax.json_form import program_from_json, program_to_json
from rpegc.syntax.parser import parse
from fixtures.runtime_plans import lower

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.rpeg")))


def compiled(path: str, k: int):
    with open(path) as f:
        p = parse(f.read(), path)
    p = lower(p, k)
    return schedule_program(annotate(p, load_hardware(p.cluster.hardware)))


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_runs_and_verifies(path):
    from rpegc.runtime.verify import verify

    p = compiled(path, 3)
    p = program_from_json(json.loads(json.dumps(program_to_json(p))), "p.json")  # what rpeg-run reads
    plan = build_run_plan(p)
    exact = run(plan, SimBackend(), RunOptions(policy="plan"))
    assert exact.makespan == p.exec.schedule.makespan
    assert verify(plan, exact.trace) == []
    noisy = run(plan, SimBackend(jitter=0.3, seed=1), RunOptions(policy="alg2", reserve="endpoints"))
    assert verify(plan, noisy.trace) == []
