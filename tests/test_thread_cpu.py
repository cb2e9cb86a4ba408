"""Where a run's host cores go (runtime/backends/torch/worker/thread_cpu.py): the main thread's time on a core and
waiting for one, and the other threads', read from Linux's per-thread scheduler statistics, and the summary's lines.
That a real run prints them is tests/test_torch_checkpoint_run.py's."""

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from rpegc.runtime.backends.torch.worker.thread_cpu import (BUSY_NOTE, WAIT_NOTE, CoreUse, ThreadCpu, cpu_lines,
                                                            read_thread_cpu, usage)

HAS_SCHEDSTAT = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat")


def spin(seconds: float) -> float:
    """Busy for `seconds` of this thread's CPU time; returns the CPU time it took (time.thread_time)."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        sum(range(1000))
    return time.thread_time() - t0


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no per-thread scheduler statistics here")
def test_the_main_threads_time_on_a_core_is_its_cpu_time():
    a = read_thread_cpu()
    cpu = spin(0.05)
    b = read_thread_cpu()
    assert a is not None and b is not None and b.at > a.at
    # schedstat and thread_time count the same scheduler clock; the reads themselves run between them (well under 5 ms)
    assert b.main_on - a.main_on == pytest.approx(cpu, abs=5e-3)
    assert b.main_wait >= a.main_wait >= 0 and b.others_on >= a.others_on


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no per-thread scheduler statistics here")
def test_another_threads_time_is_the_others():
    main = threading.get_native_id()
    took: list[float] = []
    done = threading.Event()
    before = read_thread_cpu(main)
    t = threading.Thread(target=lambda: (took.append(spin(0.05)), done.wait()))  # alive while read
    t.start()
    while not took:
        time.sleep(0.005)
    after = read_thread_cpu(main)
    done.set()
    t.join()
    assert after.others_on - before.others_on == pytest.approx(took[0], abs=5e-3)
    assert after.main_on - before.main_on < 0.5 * took[0]  # the main thread mostly slept meanwhile


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no per-thread scheduler statistics here")
def test_a_living_child_process_counts_apart():
    """Asked for (a worker's verifier pool): its descendants' threads, apart from its own; not asked, none."""
    code = ("import sys, time\nt = time.thread_time()\nwhile time.thread_time() - t < 0.1: sum(range(1000))\n"
            "print(time.thread_time(), flush=True)\nsys.stdin.readline()")
    before = read_thread_cpu(children=True)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ran = float(child.stdout.readline())  # its main thread's CPU time; its start-up's threads' beside it
        during = read_thread_cpu(children=True)
    finally:
        child.communicate("\n")
    assert during.children_on - before.children_on >= ran - 5e-3
    assert during.children_on - before.children_on < ran + 2.0  # an interpreter's start-up, not another process
    assert read_thread_cpu(children=True).children_on < during.children_on - 0.5 * ran  # its time leaves with it
    assert during.children_on > 0 and before.children_on >= 0 and read_thread_cpu().children_on == 0.0
    assert during.children_wait >= 0 and read_thread_cpu().children_wait == 0.0


def test_usage_is_cores_per_second_of_the_span():
    a, b = ThreadCpu(10.0, 1.0, 0.5, 2.0, 0.0, 0.1), ThreadCpu(12.0, 2.4, 0.9, 2.5, 1.2, 0.3)
    u = usage(a, b)
    assert (u.span_s, u.main, u.main_wait, u.others, u.children, u.children_wait) == pytest.approx(
        (2.0, 0.7, 0.2, 0.25, 0.6, 0.1))
    assert usage(None, b) is None and usage(a, None) is None and usage(b, b) is None


def test_the_byes_plain_form_comes_back_and_nothing_else_does():
    u = CoreUse(2.0, 0.7, 0.2, 0.25, 0.1, 0.02)
    assert CoreUse.from_plain(u.plain()) == u
    for bad in (None, [], {"span_s": 2.0}, dict(u.plain(), main="fast"), dict(u.plain(), main=float("nan")),
                dict(u.plain(), extra=1.0), dict(u.plain(), main=True)):
        assert CoreUse.from_plain(bad) is None


def test_the_summary_names_a_main_thread_that_waited():
    workers = {1: CoreUse(3.0, 0.6, 0.2, 0.12), 0: CoreUse(3.0, 0.7, 0.01, 0.11)}
    lines = cpu_lines(workers, CoreUse(3.0, 0.15, 0.1, 0.02))
    assert lines[1] == "  worker 0: main thread 0.70, waiting for a core 0.01; its other threads 0.11"
    assert lines[2] == "  worker 1: main thread 0.60, waiting for a core 0.20; its other threads 0.12"
    assert lines[3] == "  controller: 0.17"
    assert lines[4].startswith("note: worker 1's main thread waited for a core 33% of the time it ran")
    quiet = {0: replace(workers[0], main_wait=WAIT_NOTE * 0.7 * 0.9)}
    assert not any(line.startswith("note:") for line in cpu_lines(quiet, None))
    assert cpu_lines({}, None) == []


def test_no_note_for_a_pools_worker_an_idle_one_an_oversubscribed_run_or_a_priced_wait():
    waits = CoreUse(3.0, 0.6, 0.2, 0.12, 0.9, 0.11)
    pool = cpu_lines({0: waits, 1: waits}, None, pools=frozenset({1}))
    assert pool[1] == "  worker 0: main thread 0.60, waiting for a core 0.20; its other threads 0.12"
    assert pool[2] == ("  worker 1 (the verifier pool's): main thread 0.60, waiting for a core 0.20; its other threads "
                       "0.12; its pool processes 0.90, waiting for a core 0.11")
    assert pool[3].startswith("note: worker 0's")  # the device worker, not the pool's
    assert not any(line.startswith("note:") for line in cpu_lines({1: waits}, None, pools=frozenset({1})))
    idle = replace(waits, main=BUSY_NOTE / 2, main_wait=BUSY_NOTE)  # mostly waits for the others' results
    assert not any(line.startswith("note:") for line in cpu_lines({0: idle}, None))
    assert not any(line.startswith("note:") for line in cpu_lines({0: waits}, None, oversubscribed=True))
    assert not any(line.startswith("note:") for line in cpu_lines({0: waits}, None, priced=True))  # [overhead]
