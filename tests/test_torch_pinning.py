"""CPU workers of the torch backend run bound to one core each when they fit
(runtime/backends/torch/controller/pinning.py),
as rpeg-calibrate's pool measured the profile; with more workers than cores, or a launcher that does not say
how many workers share the node, nothing is bound."""

from __future__ import annotations

import glob
import math
import os
import re

import pytest

from rpegc.runtime.backends.torch.controller.pinning import core_slots, cores_to_pin, local_workers, pin_cpu_worker
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


def test_a_pools_worker_is_bound_to_its_own_cores_and_those_of_the_devices_it_shares():
    assert core_slots(2) == ((0,), (1,))
    assert core_slots(1, 1) == ((0,), (1,))  # a core of its own
    assert core_slots(1, 2, (0,)) == ((0,), (0, 1))  # one of its own, one shared with device rank 0
    assert core_slots(2, 1, (1,)) == ((0,), (1,), (1,))
    assert core_slots(2, 2, (0, 1)) == ((0,), (1,), (0, 1))
    assert core_slots(2, 1, ()) == ((0,), (1,), (2,))  # the device it would share is not the plan's


def bound_cores(run_dir) -> list[tuple[int, ...]]:
    out = []
    for path in sorted(glob.glob(str(run_dir / "workers" / "worker-*.log"))):
        with open(path) as f:
            found = re.findall(r"main thread bound to cores? ([\d, ]+)$", f.read(), re.M)
        assert len(found) == 1, path
        out.append(tuple(int(c) for c in found[0].split(", ")))
    return out


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores for two bound workers")
def test_a_pool_sharing_a_devices_core_is_bound_beside_that_devices_worker(tmp_path):
    pytest.importorskip("torch")
    from fixtures.torch_runs import compile_plan
    from rpegc.runtime.controller import run
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend

    text = open("examples/grpo-verify.rpeg").read().replace("gpus = 1,", "gpus = 2,")
    text = text.replace("@ref_inf     at (0, 0, 0)", "@ref_inf     at (0, 0, 1)")  # both devices: no core left
    plan = compile_plan(tmp_path, "v.rpeg", steps=1, text=text)
    assert plan.node("score#0").node.shares == (1,)
    backend = TorchBackend(seed=0, run_dir=str(tmp_path / "run"))
    run(plan, backend)
    assert bound_cores(tmp_path / "run") == [(CORES[0],), (CORES[1],), (CORES[1],)]  # rank 2: the pool's worker
    assert backend.header_options(plan)["local_workers"] == 2  # 3 workers, one run beside another: 2 cores


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores for two bound workers")
def test_two_workers_on_two_cores_run_bound_to_distinct_cores(tmp_path):
    pytest.importorskip("torch")
    from rpegc.runtime.controller import run
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend

    plan_file = str(tmp_path / "g.exec.rpeg")
    compile_example("grpo-tiny-2", plan_file, steps=1)
    result = run(load_plan(plan_file), TorchBackend(seed=0, run_dir=str(tmp_path / "run")))
    if os.path.exists("/proc/thread-self/schedstat"):  # each node's worker thread's wait for a core, in the trace
        waits = [r.waited for r in result.trace.nodes.values()]
        assert waits and all(w is not None and math.isfinite(w) and w >= 0 for w in waits)
    bound = bound_cores(tmp_path / "run")
    assert len(bound) == 2 and len(set(bound)) == 2 and {c for (c,) in bound} <= set(CORES)
    # The worker's own threads (its command reader, transfer sender and heap meter) stay on every core: bound beside
    # the operators, they took from them while the other core idled.
    for threads in helper_cores(tmp_path / "run"):
        assert {"rpeg-commands", "rpeg-sender", "heap-meter"} <= set(threads)
        assert all(set(on) == set(CORES) for on in threads.values())


def helper_cores(run_dir) -> list[dict[str, tuple[int, ...]]]:
    """Per worker log, the cores its other threads may run on, by thread name."""
    out = []
    for path in sorted(glob.glob(str(run_dir / "workers" / "worker-*.log"))):
        with open(path) as f:
            found = re.findall(r"its other threads may run on: (.*)$", f.read(), re.M)
        assert len(found) == 1, path
        out.append({name: tuple(int(c) for c in cores.split(", "))
                    for name, cores in re.findall(r"(\S+) cores? ([\d, ]+)(?:; |$)", found[0])})
    return out
