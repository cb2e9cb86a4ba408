"""The device space and where operators sit in it: the cluster D = [N_r] x [N_n] x [N_g] (Def. A.3), box
allocations D(o, delta) (Def. A.4) and parallel strategies; from an allocation its flat device ids (as a tuple,
a numpy array or a bitmask), the overlap of two allocations, and the slowest link tier a set of devices, the
union of two allocations or a pipeline replica spans (spec 4). Every other module asks this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Union

import numpy as np

from rpegc.core.ir.errors import Loc
from rpegc.core.ir.frozen import loc_field
from rpegc.core.ir.training import NO_TRAIN_SPEC, TrainSpec

TIERS = ("intra_node", "inter_node", "inter_rack")  # fastest to slowest

# The largest GPU clusters built are ~10^5 devices; per-device tables (memory, schedule) stay small below this.
MAX_DEVICES = 2**20


@dataclass(frozen=True)
class Cluster:
    name: str
    racks: int
    nodes: int  # per rack
    gpus: int  # per node
    hardware: str  # a profile name in rpegc/hardware/ or a path to a TOML profile
    loc: Loc = loc_field()

    @property
    def num_devices(self) -> int:
        return self.racks * self.nodes * self.gpus

    def size_problem(self) -> Optional[str]:
        """Why the cluster is too large to model, or None. Both readers (text and JSON) ask."""
        if self.num_devices <= MAX_DEVICES:
            return None
        return (f"cluster @{self.name} has {self.num_devices:,} devices ({self.racks} x {self.nodes} x {self.gpus}); "
                f"rpegc models clusters of at most {MAX_DEVICES:,} devices; shrink racks, nodes or gpus")


@dataclass(frozen=True)
class Alloc:
    """A device allocation D(o, delta): a contiguous hyper-rectangle of the device space (Def. A.4)."""

    origin: tuple[int, int, int]
    extent: tuple[int, int, int]

    @property
    def size(self) -> int:
        return self.extent[0] * self.extent[1] * self.extent[2]

    def devices(self, cluster: Cluster) -> tuple[int, ...]:
        """Flat device ids `(rack*N_n + node)*N_g + gpu`, in rack, node, gpu order."""
        (o_r, o_n, o_g), (e_r, e_n, e_g) = self.origin, self.extent
        return tuple(
            (r * cluster.nodes + n) * cluster.gpus + g
            for r in range(o_r, o_r + e_r)
            for n in range(o_n, o_n + e_n)
            for g in range(o_g, o_g + e_g)
        )


@dataclass(frozen=True)
class Strategy:
    """How an operator runs on its allocation: Pi(v) = (P_d, P_p, P_t), its microbatch count and, for a training
    operator, the training fields its placement states (`training.TrainSpec`; the workload's apply otherwise)."""

    dp: int
    pp: int
    tp: int
    mb: int
    train: TrainSpec = NO_TRAIN_SPEC

    def bare(self) -> "Strategy":
        """The strategy without training fields (a Reshard's layouts carry none)."""
        return self if self.train.empty else Strategy(self.dp, self.pp, self.tp, self.mb)

    @property
    def size(self) -> int:
        return self.dp * self.pp * self.tp

    def layout(self) -> tuple[int, int, int]:
        """Pi(v) = (P_d, P_p, P_t); the microbatch count is not part of the weight layout."""
        return (self.dp, self.pp, self.tp)


# -- device ids and bitmasks ----------------------------------------------------------------------------

DeviceSet = Union[int, Iterable[int]]  # a bitmask (bit d = device d) or an iterable of device ids


def coords(device: int, cluster: Cluster) -> tuple[int, int, int]:
    """(rack, node, gpu) of a flat device id `(rack*N_n + node)*N_g + gpu`."""
    node_global, gpu = divmod(device, cluster.gpus)
    rack, node = divmod(node_global, cluster.nodes)
    return rack, node, gpu


def alloc_ids(alloc: Alloc, cluster: Cluster) -> np.ndarray:
    """`Alloc.devices` as a numpy array (the array form the residency and explain code index with)."""
    (o_r, o_n, o_g), (e_r, e_n, e_g) = alloc.origin, alloc.extent
    racks = np.arange(o_r, o_r + e_r)[:, None, None]
    nodes = np.arange(o_n, o_n + e_n)[None, :, None]
    gpus = np.arange(o_g, o_g + e_g)[None, None, :]
    return ((racks * cluster.nodes + nodes) * cluster.gpus + gpus).ravel()


def alloc_mask(alloc: Alloc, cluster: Cluster) -> int:
    """Bitmask of `alloc.devices(cluster)`, built one node (a contiguous GPU run) at a time."""
    (o_r, o_n, o_g), (e_r, e_n, e_g) = alloc.origin, alloc.extent
    run = ((1 << e_g) - 1) << o_g
    mask = 0
    for r in range(o_r, o_r + e_r):
        for n in range(o_n, o_n + e_n):
            mask |= run << ((r * cluster.nodes + n) * cluster.gpus)
    return mask


def device_mask(devices: DeviceSet) -> int:
    """Bitmask of a device set; an int is taken to be a bitmask already."""
    if isinstance(devices, int):
        if devices < 0:
            raise ValueError("a device bitmask must be non-negative")
        return devices
    mask = 0
    for d in devices:
        mask |= 1 << d
    return mask


def mask_devices(mask: int) -> tuple[int, ...]:
    """Device ids of a bitmask, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def id_ranges(ids: Iterable[int]) -> str:
    """'0-3,8,10-11' for a set of device (or node) ids; '-' for none."""
    ordered = sorted(int(i) for i in ids)
    if not ordered:
        return "-"
    parts, lo, prev = [], ordered[0], ordered[0]
    for i in ordered[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if i is not None:
            lo = prev = i
    return ",".join(parts)


# -- overlap -------------------------------------------------------------------------------------------

def overlap(a: Alloc, b: Alloc) -> int:
    """|sigma(a) ∩ sigma(b)|: allocations are boxes, so the overlap is a product of 1-D overlaps."""
    n = 1
    for oa, ea, ob, eb in zip(a.origin, a.extent, b.origin, b.extent):
        n *= max(0, min(oa + ea, ob + eb) - max(oa, ob))
    return n


def pairwise_overlaps(origins: np.ndarray, extents: np.ndarray) -> np.ndarray:
    """`overlap` of every pair of V box allocations in each of B configurations: [B, V, 3] -> [B, V, V]."""
    lo = np.maximum(origins[:, :, None, :], origins[:, None, :, :])
    hi = np.minimum((origins + extents)[:, :, None, :], (origins + extents)[:, None, :, :])
    return np.prod(np.maximum(0, hi - lo), axis=3)


# -- tiers ---------------------------------------------------------------------------------------------

def tier(devices: Iterable[int], cluster: Cluster) -> str:
    """Slowest tier spanned by a device set: same node, else same rack, else across racks."""
    nodes = {d // cluster.gpus for d in devices}
    if len(nodes) <= 1:
        return "intra_node"
    racks = {n // cluster.nodes for n in nodes}
    return "inter_node" if len(racks) == 1 else "inter_rack"


def span_tier_index(o_u, e_u, o_v, e_v):
    """Index in TIERS of the slowest tier spanned by the union of two box allocations (spec 4, rule 3), from
    their origins and extents: (rack, node, gpu) triples, or arrays of shape (3, B) for B pairs at once."""
    racks = (o_u[0] != o_v[0]) | (e_u[0] > 1) | (e_v[0] > 1)
    nodes = (o_u[1] != o_v[1]) | (e_u[1] > 1) | (e_v[1] > 1)
    # inter_rack (2) when racks, else inter_node (1) when nodes, else intra_node: arithmetic, so that
    # booleans and boolean arrays take the same expression
    return 2 * racks + nodes - nodes * racks


def span_tier(a: Alloc, b: Alloc | None = None) -> str:
    """Slowest tier spanned by allocation `a`, or by the union of `a` and `b` (spec 4, rule 3)."""
    b = a if b is None else b
    return TIERS[span_tier_index(a.origin, a.extent, b.origin, b.extent)]


def replica_tier(alloc: Alloc, strategy: Strategy) -> str:
    """Slowest tier spanned by one pipeline replica (the alternative of [A8]).

    Nested placement puts TP innermost, then PP, then DP, so replica i holds the i-th run of
    P_p*P_t devices of the allocation in (rack, node, gpu) order.
    """
    per_node = alloc.extent[2]
    per_rack = alloc.extent[1] * per_node
    width = strategy.pp * strategy.tp
    worst = 0
    for start in range(0, alloc.size, width):
        last = start + width - 1
        if start // per_rack != last // per_rack:
            worst = max(worst, 2)
        elif start // per_node != last // per_node:
            worst = max(worst, 1)
    return TIERS[worst]


def tier_index(tier: str) -> int:
    """Position of a tier in TIERS (for array-valued tier arguments)."""
    return TIERS.index(tier)
