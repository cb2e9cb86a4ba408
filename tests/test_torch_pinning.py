"""CPU workers of the torch backend run bound to one core each when they fit (runtime/backends/torch/pinning.py),
as rpeg-calibrate's pool measured the profile; with more workers than cores, or a launcher that does not say
how many workers share the node, nothing is bound."""

from __future__ import annotations

import glob
import os
import re

import pytest

from rpegc.runtime.backends.torch.pinning import cores_to_pin, local_workers, pin_cpu_worker
from fixtures.programs import compile_example

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def test_the_local_launcher_counts_every_worker_and_torchrun_says_how_many_share_the_node():
    assert local_workers(4, {}) == 4
    assert local_workers(8, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == 2
    assert local_workers(8, {"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "3"}) == 3
    assert local_workers(8, {"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2(x4)"}) is None  # not one count
    assert local_workers(8, {"RANK": "3"}) is None


def test_nothing_is_bound_without_a_count_beyond_the_cores_or_under_nccl():
    assert pin_cpu_worker(0, None, "gloo") is None
    assert pin_cpu_worker(0, len(CORES) + 1, "gloo") is None
    assert pin_cpu_worker(0, 1, "nccl") is None
    assert cores_to_pin(len(CORES) + 1, "gloo") is None


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores for two bound workers")
def test_two_workers_on_two_cores_run_bound_to_distinct_cores(tmp_path):
    pytest.importorskip("torch")
    from rpegc.runtime.controller import run
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.backends.torch.backend import TorchBackend

    plan_file = str(tmp_path / "g.exec.rpeg")
    compile_example("grpo-tiny-2", plan_file, steps=1)
    run(load_plan(plan_file), TorchBackend(seed=0, run_dir=str(tmp_path / "run")))
    bound = []
    for path in sorted(glob.glob(str(tmp_path / "run" / "workers" / "worker-*.log"))):
        with open(path) as f:
            found = re.findall(r"main thread bound to core (\d+)", f.read())
        assert len(found) == 1, path
        bound.append(int(found[0]))
    assert len(bound) == 2 and len(set(bound)) == 2 and set(bound) <= set(CORES)
