"""The verifier pool on a node's host: what a verify vertex costs and where it runs (issue 36).

A verify vertex (`rpeg.vertex @score verify @math ...`, program.Verifier) scores every response with a reward
function of its text: a math checker, an exact match, a code sandbox. It runs on host CPU processes, not on a
device's model, so it overlaps the devices' work. Its plan is a pool of P processes (`@score pool = P`) on the host of
the cluster's first node, where the controller runs:

  T_verify = t_call + ceil(rows / P) * t_resp

with rows = the responses of a step (the drawn ones, B R: Workload.for_role), t_resp the seconds one call takes on
one core (the verifier's `per_response`, else the hardware profile's calibrated time of the built-in, [host.verify])
and t_call the fixed time of one operator (handing the responses to the pool, collecting the scores: [host]
verify_call). The pool's processes and the devices' worker processes share the host's cores (`pool_cores`): a
pool's processes take the cores the node's devices leave ([host] cores minus the node's devices), and those that
find none share a device's core, the node's last devices first. A device whose core a pool shares is reserved while
the verify node runs (the node's `shares`), so the schedule and the runtime run the two one after the other instead
of letting them contend for the core; a pool may not have more processes than the host has cores. A graph's pools
are one resource of the schedule (their nodes run one at a time), so the host keeps cores for the largest.

In the schedule the pool is one more resource (`pool_device`): its nodes, and the transfers into it, wait for
it as a device's do, but it is not a device (no memory, and no device-seconds but those of the devices whose cores
it shares, which its nodes hold). Its transfers cross the host link of the
first node: a Comm between a device allocation and the pool is priced as one between the allocation and the first
node's first device (`HOST_ALLOC`), the tier it spans.

The optimizer chooses the pool's size (`pool_sizes`) with the devices' placements: its arrays place a pool at
`search_alloc`, a one-slot box just past the first node's GPUs. That box is disjoint from every device allocation
(so every edge to or from it is a Comm, as for the pool) and lies on the first node with size 1, as HOST_ALLOC does,
so a transfer's tier and time are the pool's. A plan must leave the pools their cores, and every host a core per
device (`cores_needed`).
"""

from __future__ import annotations

import math
from typing import Optional

from rpegc.core.cost.contention import devices_per_host, taken_cores
from rpegc.core.cost.hardware import Hardware
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import ExecGraph
from rpegc.core.ir.geometry import Alloc, Cluster
from rpegc.core.ir.program import VERIFY, Program, Verifier

HOST_ALLOC = Alloc((0, 0, 0), (1, 1, 1))  # where the pool's links start: the host of the cluster's first node


def pool_device(cluster: Cluster) -> int:
    """The schedule's resource id of the pool: one past the cluster's devices."""
    return cluster.num_devices


def alloc_devices(alloc: Optional[Alloc], cluster: Cluster) -> tuple[int, ...]:
    """The flat device ids of an allocation; the verifier pool's (None) is the one id past the cluster's devices."""
    return (pool_device(cluster),) if alloc is None else alloc.devices(cluster)


def link_alloc(alloc: Optional[Alloc]) -> Alloc:
    """The allocation a transfer's link cost starts or ends at: the pool (None) is on the first node's host."""
    return HOST_ALLOC if alloc is None else alloc


def search_alloc(cluster: Cluster) -> Alloc:
    """The pool's stand-in in the optimizer's allocation arrays (module docstring); never a device's box."""
    return Alloc((0, 0, cluster.gpus), (1, 1, 1))


def pool_sizes(p: Program, hw: Hardware) -> tuple[int, ...]:
    """The pool sizes the optimizer chooses among: 1 up to the first node's host cores (and
    no more processes than a step has responses), largest (fastest) first."""
    if hw.host_cores is None:
        raise RpegError(p.cluster.loc, f"the graph has a verify vertex, whose pool of host processes the optimizer "
                                       f"sizes by the host's cores, but the hardware profile '{hw.source}' does not "
                                       "give them; add [host] cores = N to it")
    rows = p.workload.for_role(VERIFY)
    top = max(1, min(hw.host_cores, rows.B * rows.R, MAX_POOL))
    return tuple(range(top, 0, -1))


MAX_POOL = 256  # pool sizes the optimizer considers at most


def pool_cores(size: int, host_cores: int, cluster: Cluster) -> tuple[int, tuple[int, ...]]:
    """(own cores, shared devices) of a pool of `size` processes on the first node's host of `host_cores` cores: its
    processes take the cores the node's devices leave (one core per device, whether the plan uses it or not, so the
    rule does not depend on the rest of the plan), the others share the cores of the node's devices from the last
    down (flat ids)."""
    own = min(size, max(0, host_cores - cluster.gpus))
    shared = min(size - own, cluster.gpus)
    return own, tuple(range(cluster.gpus - 1, cluster.gpus - 1 - shared, -1))


def placed_devices(p: Program) -> set[int]:
    """The devices the plan's placements use (none without a plan)."""
    return {d for pl in p.plan.placements for d in pl.alloc.devices(p.cluster)} if p.plan is not None else set()


def shared_devices(size: int, host_cores: int, p: Program) -> tuple[int, ...]:
    """The devices of the plan whose cores a pool of `size` processes shares (`pool_cores`), ascending: a shared
    device the plan places nothing on leaves its core free, so the pool has it to itself."""
    used = placed_devices(p)
    return tuple(sorted(d for d in pool_cores(size, host_cores, p.cluster)[1] if d in used))


def pool_taken_cores(size: int, host_cores: int, cluster: Cluster, used) -> int:
    """Cores of the first node's host that a pool of `size` processes takes beside the plan's devices (`used`: their
    flat ids): its own, and those of the devices it shares that the plan leaves unused (core/cost/contention.py)."""
    own, shared = pool_cores(size, host_cores, cluster)
    return own + sum(1 for d in shared if d not in used)


def cores_needed(devices_per_host, own_cores):
    """Host cores the plan needs on its busiest host (`contention.taken_cores`): one per device of the plan on a node
    (a device's worker process: on a CPU profile the device is that core), and on the first node the own cores of
    its largest pool (`pool_cores`; the pools run one at a time). Last axis: hosts; numbers or the optimizer's
    arrays (a leading axis of configurations). More than a host has and the plan's workers share cores, which
    the cost model does not price (they would time-slice): the optimizer's plans keep within them."""
    return taken_cores(devices_per_host, own_cores).max(axis=-1)


def check_pool_transfers(graph: ExecGraph) -> None:
    """A Comm without a destination (source) allocation moves data into (out of) the verifier pool: it must feed (be
    fed by) a verify node; any other node without an allocation is a located error, and so is a node on devices that
    says it shares their cores."""
    verify = {n.id for n in graph.nodes if n.kind == "op" and n.role == VERIFY}
    feeds: dict[str, set[str]] = {}
    fed: dict[str, set[str]] = {}
    for e in graph.edges:
        feeds.setdefault(e.src, set()).add(e.dst)
        fed.setdefault(e.dst, set()).add(e.src)
    for n in graph.nodes:
        if n.shares and n.alloc is not None:
            raise RpegError(n.loc, f"node {n.id} shares the cores of devices {list(n.shares)}, but it runs on its "
                                   "allocation; only a node on the verifier pool (a verify node, a transfer into its "
                                   "pool) shares devices' cores: remove `shares`")
        if n.kind == "op" and n.role == VERIFY:
            continue
        to_pool = n.kind == "comm" and n.alloc is None and feeds.get(n.id, set()) & verify
        from_pool = n.kind == "comm" and n.src_alloc is None and fed.get(n.id, set()) & verify
        if n.alloc is None and not to_pool:
            what = "a device allocation" if n.kind == "op" else "a destination allocation"
            raise RpegError(n.loc, f"node {n.id} has no allocation; give it {what} (`at ... extent ...`), or let it "
                                   "feed a verify node (the verifier pool)")
        if n.kind != "op" and n.src_alloc is None and not from_pool:
            raise RpegError(n.loc, f"{n.kind} node {n.id} has no source allocation (`from ... extent ...`)")


def verify_time(rows: int, pool: int, per_response: float, call: float) -> float:
    """T_verify = t_call + ceil(rows / P) * t_resp: the responses dealt out evenly to P processes."""
    return call + math.ceil(rows / pool) * per_response


def per_response(verifier: Verifier, hw: Hardware) -> float:
    """t_resp of `verifier`: as it states, else the profile's calibrated time of the built-in it names."""
    if verifier.per_response is not None:
        return verifier.per_response
    calibrated = hw.per_response(verifier.fn)
    if calibrated is None:
        known = ", ".join(fn for fn, _ in hw.verify_s) or "none"
        raise RpegError(verifier.loc, f"verifier @{verifier.name} runs '{verifier.fn}', whose time per response the "
                                      f"hardware profile '{hw.source}' does not give (it calibrates: {known}); state "
                                      f"it, e.g. rpeg.verifier @{verifier.name} {{fn = \"{verifier.fn}\", "
                                      "per_response = 0.002}, or measure it with `rpeg-calibrate --verifier "
                                      f"{verifier.fn} --data FILE`")
    return calibrated


def verify_node_time(p: Program, verifier_name: str, pool: int, hw: Hardware) -> float:
    """T_verify of a verify operator of `p` on `pool` processes; its fixed time includes the speed witness that ends
    it where the run has witnesses (`verify_witness`)."""
    rows = p.workload.for_role(VERIFY)
    verifier = p.verifier(verifier_name)
    return verify_time(rows.B * rows.R, pool, per_response(verifier, hw), hw.verify_call + verify_witness(verifier, hw))


# The built-in verifiers a worker scores in its own process, without a pool (runtime/backends/torch/rl/rewards.py).
IN_WORKER = ("rule",)


def verify_witness(verifier: Verifier, hw: Hardware) -> float:
    """What the speed witness ending a verify operator costs, where the profile's runs have witnesses ([overhead]
    witness, else 0): each pool process's, all at once, after its share ([host] verify_witness), or the worker's
    where it scores the rows itself (`IN_WORKER`)."""
    if hw.overhead.witness <= 0:
        return 0.0
    return hw.overhead.witness if verifier.fn in IN_WORKER else hw.verify_witness


def check_pools(p: Program, hw: Hardware) -> None:
    """The plan's pools fit the first node's host: no pool has more processes than the host has cores, and the own
    cores of the largest (`pool_cores`) fit beside the plan's devices on that node (they do unless the node has more
    devices than its host has cores); a located error if not."""
    if p.plan is None or not p.plan.pools:
        return
    first = p.plan.pools[0]
    if hw.host_cores is None:
        raise RpegError(first.loc, f"the plan runs @{first.vertex} on a pool of host processes, but the hardware "
                                   f"profile '{hw.source}' does not give the host's cores; add [host] cores = N to it")
    for pool in p.plan.pools:
        if pool.size > hw.host_cores:
            raise RpegError(pool.loc, f"the plan runs @{pool.vertex} on {pool.size} host processes, but the first "
                                      f"node's host has {hw.host_cores} cores; use a pool of at most "
                                      f"{hw.host_cores} processes")
    used = placed_devices(p)
    own = max(pool_cores(pool.size, hw.host_cores, p.cluster)[0] for pool in p.plan.pools)
    devices = int(devices_per_host(used, p.cluster.gpus, p.cluster.racks * p.cluster.nodes)[0])
    if devices + own > hw.host_cores:
        raise RpegError(first.loc, f"the plan's devices on the first node take {devices} of its host's "
                                   f"{hw.host_cores} cores, and its verifier pool needs {own} of its own beside them; "
                                   "place fewer devices on the first node")
