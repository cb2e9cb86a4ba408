"""What a worker held at its peak (runtime/backends/torch/worker/peak_memory.py): the CPU meter sees an allocation made
after it started and not what was there before, the heap meter under it a transient gone before it is read and a
free made on another thread, and the summary's lines name each worker, its ratio, and warn beyond 15%."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.backends.torch.worker.host_memory import HeapMeter, heap_in_use  # noqa: E402
from rpegc.runtime.backends.torch.worker.peak_memory import PeakMeter, WorkerPeak, peak_lines  # noqa: E402

MIB = 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_the_cpu_meter_sees_what_was_allocated_after_it_started():
    before = torch.ones(64 * MIB // 4)  # resident before the start: start-up size, not counted
    gc.collect()
    gc.disable()  # nothing else is freed in the window, so the resident size only grows by what is allocated
    try:
        meter = PeakMeter(torch.device("cpu"))
        meter.start()
        held = torch.ones(96 * MIB // 4)  # touched, so resident
        peak = meter.peak()
    finally:
        gc.enable()
    # other threads may free a little in the window (earlier tests' meters, torch's pools): 1 MiB of slack below
    assert peak is not None and 95 * MIB <= peak < 96 * MIB + 64 * MIB
    resident = meter.resident()
    assert resident is not None and 95 * MIB <= resident < 96 * MIB + 64 * MIB
    del held, before


@pytest.mark.skipif(heap_in_use() is None, reason="needs glibc's mallinfo2")
def test_the_heap_meter_sees_a_freed_transient_and_a_free_made_on_another_thread():
    """What torch's profiler misses (it drops the frees other threads make, as gloo's do after a collective), the
    heap meter counts: a tensor freed by another thread is gone from it."""
    meter = HeapMeter().start()
    try:
        transient = torch.ones(64 * MIB // 4)
        time.sleep(0.05)  # the sampler reads it
        del transient
        held = [torch.ones(32 * MIB // 4)]
        freer = threading.Thread(target=held.clear)
        freer.start()
        freer.join()
        peak = meter.peak() - meter.base
        now = heap_in_use() - meter.base
    finally:
        meter.stop()
    # the heap may also shrink by what other threads free in the window (a few KiB measured), hence the 1 MiB slack
    assert 63 * MIB <= peak < 64 * MIB + 16 * MIB
    assert now < 16 * MIB  # the 32 MiB freed on the other thread is gone


def test_the_summary_names_each_worker_and_warns_beyond_15_percent_and_64_mib():
    peaks = [WorkerPeak(0, 0, 1000 * MIB, 1100 * MIB), WorkerPeak(1, 1, 1000 * MIB, 1500 * MIB),
             WorkerPeak(2, 2, 100 * MIB, None)]
    lines = peak_lines(peaks, "the C heap's allocations")
    assert lines[1] == "  worker 0 (device 0): 1,100.0 MiB measured, 1,000.0 MiB predicted (1.10x)"
    assert lines[2] == "  worker 1 (device 1): 1,500.0 MiB measured, 1,000.0 MiB predicted (1.50x)"
    assert len(lines) == 4 and lines[3].startswith("warning: 1 of 2 workers") and "worker 1, 1.50x" in lines[3]
    assert peak_lines([WorkerPeak(0, 0, 100 * MIB, 90 * MIB)], "x")[-1].endswith("(0.90x)")  # within: no warning
    # a process's own growth is no plan's: 40 MiB over a 1 MiB prediction is 41x, but no warning
    assert not peak_lines([WorkerPeak(0, 0, 1 * MIB, 41 * MIB)], "x")[-1].startswith("warning")
    assert peak_lines([WorkerPeak(0, 0, 1 * MIB, 66 * MIB)], "x")[-1].startswith("warning")
    assert peak_lines([WorkerPeak(0, 0, 1.0, None)], "x") == []  # nothing measured: nothing said
    assert peak_lines([WorkerPeak(0, 0, 100 * MIB, 90 * MIB, 120 * MIB)], "x")[-1].endswith("(0.90x; 120.0 MiB resident)")


@pytest.mark.skipif(heap_in_use() is None, reason="needs glibc's mallinfo2")
def test_a_worker_keeps_no_matrix_product_workspace_after_the_product():
    """worker_env, imported before torch as the pool's fork server does, leaves no cached MKL workspace in the heap
    after products (~15 MiB with MKL's cache on): what the heap meter counts is what the plan prices."""
    code = ("import rpegc.runtime.backends.torch.worker.env, torch\n"
            "from rpegc.runtime.backends.torch.worker.host_memory import heap_in_use\n"
            "torch.set_num_threads(1)\n"
            "base = heap_in_use()\n"
            "for n in (64, 256, 512, 1024):\n"
            "    a = torch.randn(n, n); c = a @ a; del a, c\n"
            "print(heap_in_use() - base)\n")
    env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) < MIB


def test_freed_memory_goes_back_to_the_system_only_when_there_is_much_of_it_and_the_host_is_short(monkeypatch):
    """release_freed trims the heap when it holds TRIM_MIN_FREE bytes free and the host has less than LOW_AVAILABLE
    of its RAM available, and leaves the rest for malloc to reuse (a trim at every command of a small model's run made
    its steps ~12% slower, and before every training forward of a 24M-parameter model ~30% slower: the pages fault
    in again)."""
    from rpegc.runtime.backends.torch.worker import host_memory

    trims = []
    free = {"bytes": 0}

    class Info:
        @property
        def fordblks(self):
            return free["bytes"]

    monkeypatch.setattr(host_memory, "_TRIM", lambda pad: trims.append(pad))
    monkeypatch.setattr(host_memory, "_MALLINFO2", Info)
    short, plenty = (lambda: host_memory.LOW_AVAILABLE / 2), (lambda: host_memory.LOW_AVAILABLE)
    free["bytes"] = host_memory.TRIM_MIN_FREE - 1
    host_memory.release_freed(short)
    assert trims == []
    free["bytes"] = host_memory.TRIM_MIN_FREE
    host_memory.release_freed(plenty)
    assert trims == []  # much free, but the host has memory to spare: kept for the next phase
    host_memory.release_freed(short)
    assert trims == [0]
    host_memory.release_freed(lambda: None)  # a host that cannot say what it has available: trim
    assert trims == [0, 0]
    monkeypatch.setattr(host_memory, "_MALLINFO2", None)  # a C library that cannot say what it holds free: trim
    host_memory.release_freed(short)
    assert trims == [0, 0, 0]


def test_host_available_is_a_share_of_the_host_ram():
    from rpegc.runtime.backends.torch.worker.host_memory import host_available

    share = host_available()
    assert share is not None and 0.0 < share <= 1.0
