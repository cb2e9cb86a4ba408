"""The measurement pool of rpeg-calibrate / rpeg-validate binds each CPU worker's main thread to its
own core (and leaves the transport threads free), so concurrent workers do not slow each other down."""

from __future__ import annotations

import os

import pytest

from rpegc.runtime.backends.torch.pinning import cores_to_pin
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


def test_tensor_bytes_counts_what_torch_holds_at_its_height():
    """The peak between two readings counts what was allocated inside the block and is still live (the
    persistent tensor), plus the transients at their height; what was allocated before the block is not
    counted, and neither is what comes after the window."""
    import time

    import torch

    from rpegc.tools.measure import TensorBytes

    before = torch.empty(1 << 20, dtype=torch.uint8)  # allocated before the block: not counted
    with TensorBytes() as held:
        del before
        state = torch.empty(3 << 20, dtype=torch.uint8)
        t0 = time.time_ns()
        a = torch.empty(5 << 20, dtype=torch.uint8)
        b = torch.empty(7 << 20, dtype=torch.uint8)
        del a, b
        c = torch.empty(2 << 20, dtype=torch.uint8)
        t1 = time.time_ns()
        torch.empty(64 << 20, dtype=torch.uint8)  # after the window
    assert held.peak(t0, t1) == (3 + 5 + 7) << 20
    assert held.peak(t1, time.time_ns()) >= (64 + 3 + 2) << 20
    assert state.numel() and c.numel()
