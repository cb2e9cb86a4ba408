"""One core per CPU worker: the binding that rpeg-calibrate measures under and the torch backend runs under.

Paper App. C-A2 (a profile holds what was measured on the target system, as the runtime will run). One CPU
worker process stands for one device, so its compute must not migrate or share a core with another worker:
on this project's 2-vCPU VM two unpinned single-threaded workers slow each other's small kernels down up to
3x (bench/validation/README.md), and a TP decode, which meets the other rank at every layer's AllReduce, loses
most. gloo's transport threads stay free: they wake when the main thread waits, and pinned to its core they
would queue behind it. So do the worker's own command reader, sender and heap meter: a thread inherits its creator's
binding, so the worker starts them before it binds its main thread (`thread_cores` says where they may run).

The worker of a verifier pool (cost/host.py) is bound to the cores of its pool's processes, which inherit its
binding: a core of their own each where the plan gives them one, and the cores of the devices whose cores the plan
says they share (the plan runs the pool and those devices one after the other) (`core_slots`).
"""

from __future__ import annotations

import os
import threading
from typing import Mapping, Optional

# Launchers' names for the number of workers on this node (torchrun, then Slurm's plain-integer form).
LOCAL_WORLD_VARS = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def cores_to_pin(local_workers: int, backend: str) -> Optional[list[int]]:
    """One core per worker of this node when the CPU workers fit on its cores, else None (no pinning)."""
    if backend != "gloo" or not can_pin():
        return None
    cores = sorted(os.sched_getaffinity(0))
    return cores[:local_workers] if local_workers <= len(cores) else None


def pin_main_thread(core: int | frozenset, free: frozenset) -> None:
    """Bind the calling (main) thread to `core` (or a set of cores) and every other thread of the process to `free`
    (the cores the process was given). Threads start with their creator's mask: call it again after creating
    threads (process groups)."""
    main = threading.get_native_id()
    mine = set(core) if isinstance(core, frozenset) else {core}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mine if int(tid) == main else free)
        except OSError:
            pass  # the thread exited meanwhile
    os.sched_setaffinity(0, mine)


def thread_cores() -> dict[str, tuple[int, ...]]:
    """The cores each of this process's Python threads other than the calling one may run on, by thread name."""
    out = {}
    for t in threading.enumerate():
        if t is not threading.current_thread() and t.native_id is not None:
            try:
                out[t.name] = tuple(sorted(os.sched_getaffinity(t.native_id)))
            except OSError:
                pass  # the thread exited meanwhile
    return out


def core_slots(devices: int, pool_processes: int = 0,
               shared_ranks: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """Per rank of a locally launched run, the slots (indexes into the host's cores) its main thread is bound to:
    the `devices` device workers one each, in rank order; the verifier pool's worker (the last rank, where the plan
    has a pool of `pool_processes` processes) a new slot for each process that shares no device's core, and the
    slots of the device ranks whose cores its processes share (`shared_ranks`); at least one slot."""
    slots = tuple((r,) for r in range(devices))
    if not pool_processes:
        return slots
    own = tuple(range(devices, devices + max(0, pool_processes - len(shared_ranks))))
    return slots + ((tuple(sorted(own + tuple(shared_ranks))) or (devices,)),)


def pin_slots(slots: tuple[int, ...], count: int, backend: str) -> Optional[tuple[int, ...]]:
    """Bind this CPU worker's main thread to the cores of `slots` when the run's `count` slots fit on the host's
    cores; those cores, or None (not pinned)."""
    cores = cores_to_pin(count, backend)
    if cores is None or not all(0 <= s < len(cores) for s in slots):
        return None
    mine = frozenset(cores[s] for s in slots)
    pin_main_thread(mine, frozenset(os.sched_getaffinity(0)))
    return tuple(sorted(mine))


def local_workers(world: int, env: Mapping[str, str]) -> Optional[int]:
    """How many workers share this node: all of them for the local launcher (an empty `env`), else the
    launcher's count; None where it does not say."""
    if not env:
        return world
    for name in LOCAL_WORLD_VARS:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def pin_cpu_worker(local_rank: int, local_count: Optional[int], backend: str) -> Optional[int]:
    """Bind this CPU worker's main thread to core number `local_rank` of the node when all `local_count`
    workers fit on its cores; the core, or None (not pinned)."""
    cores = cores_to_pin(local_count, backend) if local_count else None
    if cores is None or not 0 <= local_rank < len(cores):
        return None
    pin_main_thread(cores[local_rank], frozenset(os.sched_getaffinity(0)))
    return cores[local_rank]
