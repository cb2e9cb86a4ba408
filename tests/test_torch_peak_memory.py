"""What a worker held at its peak (runtime/backends/torch/peak_memory.py): the CPU meter sees an allocation made
after it started and not what was there before, and the summary's lines name each worker, its ratio, and warn
beyond 15%."""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")

from rpegc.runtime.backends.torch.peak_memory import PeakMeter, WorkerPeak, peak_lines  # noqa: E402

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
    assert peak is not None and 96 * MIB <= peak < 96 * MIB + 64 * MIB
    del held, before


def test_the_summary_names_each_worker_and_warns_beyond_15_percent_and_64_mib():
    peaks = [WorkerPeak(0, 0, 1000 * MIB, 1100 * MIB), WorkerPeak(1, 1, 1000 * MIB, 1500 * MIB),
             WorkerPeak(2, 2, 100 * MIB, None)]
    lines = peak_lines(peaks, "resident memory")
    assert lines[1] == "  worker 0 (device 0): 1,100.0 MiB measured, 1,000.0 MiB predicted (1.10x)"
    assert lines[2] == "  worker 1 (device 1): 1,500.0 MiB measured, 1,000.0 MiB predicted (1.50x)"
    assert len(lines) == 4 and lines[3].startswith("warning: 1 of 2 workers") and "worker 1, 1.50x" in lines[3]
    assert peak_lines([WorkerPeak(0, 0, 100 * MIB, 90 * MIB)], "x")[-1].endswith("(0.90x)")  # within: no warning
    # a process's own growth is no plan's: 40 MiB over a 1 MiB prediction is 41x, but no warning
    assert not peak_lines([WorkerPeak(0, 0, 1 * MIB, 41 * MIB)], "x")[-1].startswith("warning")
    assert peak_lines([WorkerPeak(0, 0, 1 * MIB, 66 * MIB)], "x")[-1].startswith("warning")
    assert peak_lines([WorkerPeak(0, 0, 1.0, None)], "x") == []  # nothing measured: nothing said
