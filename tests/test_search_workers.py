"""The search in worker processes (search/workers.py): with an evaluation budget the result does not depend
on jobs=, the workers end with the search, and a worker that dies is a clear error, not a hang."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import load_hardware
from rpegc.search.anneal import SearchConfig
from rpegc.search.directory import DirectoryRules
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.search.space import structural_candidates
from rpegc.search.workers import AnnealTask, ProcessPool, Problem
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def ppo():
    return parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")


def test_two_processes_find_what_one_finds(ppo):
    options = OptimizeOptions(budget_s=0, evals=1500, steps=2, seed=4)
    one = optimize(ppo, OptimizeOptions(**{**options.__dict__, "jobs": 1}))
    two = optimize(ppo, OptimizeOptions(**{**options.__dict__, "jobs": 2}))
    assert one.jobs == 1 and two.jobs == 2
    assert two.program.plan == one.program.plan and two.variant.key == one.variant.key
    assert two.evaluation == one.evaluation
    assert two.stats.evaluations == one.stats.evaluations == 1500
    assert [v.evaluations for v in two.variant_stats] == [v.evaluations for v in one.variant_stats]


def test_small_budgets_stay_in_this_process_unless_jobs_is_given(ppo):
    r = optimize(ppo, OptimizeOptions(budget_s=0, evals=300, steps=2))
    assert r.jobs == 1


@pytest.mark.parametrize("reaped", [True, False], ids=["send-fails", "send-or-receive-fails"])
def test_a_dead_worker_is_a_located_error_and_the_pool_closes(ppo, reaped):
    """Reaped first, the task's send meets a broken pipe; killed just before, either the send or the receive
    fails, depending on how fast the kernel closes the dead worker's end. Both are the same error."""
    hw = load_hardware(ppo.cluster.hardware)
    variants = tuple(structural_candidates(ppo))
    pool = ProcessPool(Problem(variants, hw, CostOptions(), 2, True, DirectoryRules(), SearchConfig(), 0), 2)
    try:
        os.kill(pool.procs[1].pid, signal.SIGKILL)
        if reaped:
            pool.procs[1].join()
        with pytest.raises(RpegError, match="search worker 1 died .*jobs=1"):
            pool.anneal([AnnealTask(0, 20, 0.0, ()), AnnealTask(1, 20, 0.0, ())], None)
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.procs)
