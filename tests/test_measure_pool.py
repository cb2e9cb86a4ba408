"""The measurement pool of rpeg-calibrate / rpeg-validate binds each CPU worker's main thread to its
own core (and leaves the transport threads free), so concurrent workers do not slow each other down."""

from __future__ import annotations

import os

import pytest

from rpegc.runtime.backends.torch.controller.pinning import cores_to_pin
from rpegc.tools.measure import WorkerPool


def _affinities(ctx):
    import threading

    main = threading.get_native_id()
    ctx.group([0])  # a new group starts transport threads with the creator's mask; `group` re-pins
    others = [frozenset(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task") if int(t) != main]
    return ctx.core, frozenset(os.sched_getaffinity(0)), others


def test_cores_to_pin_only_when_the_workers_fit():
    cores = sorted(os.sched_getaffinity(0))
    assert cores_to_pin(len(cores), "gloo") == cores
    assert cores_to_pin(len(cores) + 1, "gloo") is None
    assert cores_to_pin(1, "nccl") is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pool_pins_main_threads_to_distinct_cores_and_frees_the_rest():
    allowed = frozenset(os.sched_getaffinity(0))
    with WorkerPool(2) as pool:
        result = pool.run(_affinities)
    assert [core for core, _, _ in result] == sorted(allowed)[:2]
    for core, main, others in result:
        assert main == {core}
        assert others and all(mask == allowed for mask in others)
    with WorkerPool(2, pin=False) as pool:
        assert all(core is None and main == allowed for core, main, _ in pool.run(_affinities))
