"""The device space D = [N_r] x [N_n] x [N_g] (Def. A.3): flat ids, coordinates and tiers (spec 4)."""

from __future__ import annotations

from typing import Iterable

from rpegc.core.program import Cluster

TIERS = ("intra_node", "inter_node", "inter_rack")  # fastest to slowest


def coords(device: int, cluster: Cluster) -> tuple[int, int, int]:
    """(rack, node, gpu) of a flat device id `(rack*N_n + node)*N_g + gpu`."""
    node_global, gpu = divmod(device, cluster.gpus)
    rack, node = divmod(node_global, cluster.nodes)
    return rack, node, gpu


def tier(devices: Iterable[int], cluster: Cluster) -> str:
    """Slowest tier spanned by a device set: same node, else same rack, else across racks."""
    nodes = {d // cluster.gpus for d in devices}
    if len(nodes) <= 1:
        return "intra_node"
    racks = {n // cluster.nodes for n in nodes}
    return "inter_node" if len(racks) == 1 else "inter_rack"


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
