"""The runtime's own threads on a host whose cores the plan takes (issue 36; docs/cost-model.md, "Hosts without a
free core").

A CPU run's operators run on the main threads of its worker processes, a core each (controller/pinning.py); the
controller and each worker's command reader, sender and gloo threads float. On a host where the plan's processes
take every core (a worker per device of the plan there and, on the first node, the cores its largest verifier pool
takes beside them: cost/host.pool_taken_cores) that floating work has no core of its own: it preempts the operators,
and the controller's reaction to a completion waits for a core. Two prices follow, from the `[overhead]` table
(calibrated by the overheads' control runs on one worker and on every core, tools/overhead_timing.py):

- a node's control round trip is `node` on such a host and `node_free` on one with a core left
  (`Overhead.round_trip`);
- the operators of such a host h stretch, a device's and a verifier pool's alike (the floating work preempts a pool's
  processes as it does the workers' main threads): an operator's time t becomes t (1 + c N_h / B_h), with c the
  operator time the floating work takes per exec node (`contention`), N_h the graph's exec nodes on h and B_h the
  core-seconds of its operators there (time x devices, a verify node's time x its pool's processes): the floating work
  of h's nodes, taken from its operators in proportion to their time. Where the operators are long (a model whose
  kernels dominate), the stretch goes to 1.

Beside that, two operators computing at once on one host's cores share its memory bandwidth and caches: the
operator of an allocation with k devices on a host (k of its cores computing together: a dp, tp or pp group) takes
`1 + b (k - 1) / (cores - 1)` times as long (`co_busy_stretch`; b = `[overhead] co_busy`, what one operator's time
grows by with every other core of its host computing its siblings, measured by the overheads' control runs: siblings
run in lockstep, each step waiting for the slower). Operators of different vertices that the schedule overlaps on a
host (a verifier pool scoring beside an inference, an asynchronous generation beside training) only share the cores'
memory bandwidth and caches: with the cores computing beside an operator counted over its scheduled interval, it takes
`1 + (b s + b' m) / (cores - 1)` times as long, s = min(k - 1, cores - 1) its siblings and m the mean over the
interval of the other cores computing there (other operators' devices, a pool's processes; all at most cores - 1), b'
= `[overhead] co_run`, measured by the kernel campaign's narrow forwards on every core against one alone
(`overlap_stretches`). The overlaps come from a first schedule of the times without them, and every path schedules
once more with the stretched times (one step of the fixed point: docs/cost-model.md, "Siblings on a host's cores").

A node is on the host of its first device (a verifier pool's nodes and the transfers into it on the first node's); a
fusion is one node (its members run as one command). Every function takes numbers or numpy arrays (the optimizer's
batched form: a leading axis of configurations).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numba import njit


def host_of(first_device, gpus: int):
    """The flat node (host) of a device id."""
    return first_device // gpus


def devices_per_host(device_ids, gpus: int, hosts: int) -> np.ndarray:
    """How many of `device_ids` (flat ids) each of the cluster's `hosts` hosts holds."""
    return np.bincount([host_of(d, gpus) for d in device_ids], minlength=hosts)


def taken_cores(devices_per_host, pool) -> np.ndarray:
    """Per host (last axis), the cores the plan's processes take there: a core per device the plan uses (its worker
    process's main thread) plus, on the first node, `pool` (the cores its largest verifier pool takes)."""
    taken = np.array(devices_per_host, dtype=np.int64, copy=True)
    taken[..., 0] += np.asarray(pool, dtype=np.int64)
    return taken


def full_hosts(devices_per_host, pool_taken, host_cores: Optional[int]) -> np.ndarray:
    """Per host (last axis), whether the plan's processes take all its cores (`taken_cores`, with the cores its
    largest pool takes beside the devices: cost/host.pool_taken_cores) reach the profile's [host] cores; nowhere where
    the profile does not give them."""
    taken = taken_cores(devices_per_host, pool_taken)
    if host_cores is None:
        return np.zeros(taken.shape, dtype=bool)
    return taken >= host_cores


def stretch(device_s, nodes, contention: float):
    """1 + c N / B (module docstring); 1 where a host runs no operator."""
    busy = np.asarray(device_s, dtype=float)
    return 1.0 + np.where(busy > 0, contention * np.asarray(nodes) / np.where(busy > 0, busy, 1.0), 0.0)


def host_stretches(hosts, device_s, counted, full, contention: float) -> np.ndarray:
    """Per host (the last axis of `full`), the factor its operators' times take: `hosts` is each node's host,
    `device_s` its operator's core-seconds (a device operator's time x devices, a verify node's x its pool's processes;
    0 for a transfer), `counted` whether it is a node of the lowered graph (not a relay, not a fusion's second member);
    the node axis is the last."""
    full = np.asarray(full, dtype=bool)
    out = np.ones(full.shape)
    if contention == 0:
        return out
    hosts, counted = np.asarray(hosts), np.asarray(counted, dtype=bool)
    # In whole nanoseconds, so that the sum is exact in any order: the pass pipeline and the optimizer's two
    # evaluators add the same nodes in different orders and must price the same plan alike to the last bit.
    ns = whole_ns(device_s)
    for h in range(full.shape[-1]):
        on = counted & (hosts == h)
        s = stretch((ns * on).sum(axis=-1) / 1e9, on.sum(axis=-1), contention)
        out[..., h] = np.where(full[..., h], s, 1.0)
    return out


def co_busy_stretch(devices_on_host, host_cores: Optional[int], co_busy: float):
    """1 + b (k - 1) / (cores - 1) (module docstring): `devices_on_host` (k) an operator's allocation's devices on one
    host, its extent's last axis; 1 where the profile gives no cores or the host has one."""
    k = np.asarray(devices_on_host, dtype=np.int64)
    if not co_busy or host_cores is None or host_cores < 2:
        return np.ones(k.shape)
    return 1.0 + co_busy * (np.minimum(k, host_cores) - 1) / (host_cores - 1)


def prices_overlaps(co_run: float, host_cores: Optional[int]) -> bool:
    """Whether operators that the schedule overlaps on a host are priced (`overlap_stretches`): a profile with co_run
    and hosts of two cores or more (a CPU profile's); the paths then schedule twice."""
    return bool(co_run) and host_cores is not None and host_cores >= 2


def whole_ns(seconds) -> np.ndarray:
    """Times in whole nanoseconds (int64): the overlaps are integrated so, exact in any order on every path."""
    return np.rint(np.asarray(seconds, dtype=float) * 1e9).astype(np.int64)


@njit(cache=True, nogil=True)
def overlap_stretches(start_ns, finish_ns, host, cores, computing, stretched, host_cores, co_busy, co_run,
                      out):  # pragma: no cover
    """Per row r (a configuration) and node i with `stretched[r, i]` (a device operator of k = cores[r, i] devices on
    its host), over its scheduled interval [start, finish) of length L: 1 + (b s L + b' (I - s L)) / ((cores - 1) L),
    with s = min(k - 1, cores - 1) its siblings, b = co_busy, b' = co_run and I the integral over the interval of
    min(others(t), cores - 1), others(t) the cores computing on its host at t beside its own first one: the `cores` of
    every `computing` node (an operator: its allocation's devices on the host; a verify node: its pool's processes)
    whose interval holds t, less 1 (at least its siblings, so I >= s L). Alone that is `co_busy_stretch`. Other
    nodes, and one of zero length, get 1.

    B x N arrays: start_ns, finish_ns (int64 ns: `whole_ns`), host, cores (int64), computing, stretched (bool); out
    (float) is written. One sweep per row over the computing nodes' starts and finishes sorted by time; per host the
    running count and the integral up to the last event (int64 core-ns), read at each node's start and finish."""
    B, N = start_ns.shape
    cap = host_cores - 1
    for r in range(B):
        for i in range(N):
            out[r, i] = 1.0
        M = 0
        H = 1
        for i in range(N):
            if computing[r, i] and finish_ns[r, i] > start_ns[r, i]:
                M += 1
                if host[r, i] + 1 > H:
                    H = host[r, i] + 1
        if M == 0:
            continue
        when = np.empty(2 * M, dtype=np.int64)
        node = np.empty(2 * M, dtype=np.int64)
        m = 0
        for i in range(N):
            if computing[r, i] and finish_ns[r, i] > start_ns[r, i]:
                when[m], node[m] = start_ns[r, i], i
                when[m + 1], node[m + 1] = finish_ns[r, i], -1 - i
                m += 2
        order = np.argsort(when, kind="mergesort")
        total = np.zeros(H, dtype=np.int64)
        integral = np.zeros(H, dtype=np.int64)
        last = np.zeros(H, dtype=np.int64)
        at_start = np.zeros(N, dtype=np.int64)
        at_finish = np.zeros(N, dtype=np.int64)
        for e in order:
            t, x = when[e], node[e]
            i = x if x >= 0 else -1 - x
            h = host[r, i]
            if total[h] > 0:
                integral[h] += min(total[h] - 1, cap) * (t - last[h])
            last[h] = t
            if x >= 0:
                at_start[i] = integral[h]
                total[h] += cores[r, i]
            else:
                at_finish[i] = integral[h]
                total[h] -= cores[r, i]
        for i in range(N):
            span = finish_ns[r, i] - start_ns[r, i]
            if stretched[r, i] and computing[r, i] and span > 0:
                siblings = min(cores[r, i] - 1, cap) * span
                others = at_finish[i] - at_start[i] - siblings
                out[r, i] = 1.0 + (co_busy * siblings + co_run * others) / (cap * span)
