"""The candidate directory X_cand(v) (Def. A.18): every (sigma, Pi, mb) that satisfies P1-P8.

Paper: Sec. VI-B and App. A-J2a/A-J2f. The legality rules live in `plan_rules`; this module only
enumerates them, and every candidate it returns passes `plan_rules.is_legal`.

Which allocations exist. Under the nested placement order (TP innermost on consecutive GPUs of a node,
then PP, then DP) a strategy (dp, pp, tp) fixes the allocation's shape (`plan_rules.layout_extent`):
  (1, 1, g)          g = dp*pp*tp GPUs of one node, g | N_g;
  (1, n, N_g)        n whole nodes of one rack, 1 < n <= N_n;
  (r, N_n, N_g)      r whole racks, r > 1.
P7 then fixes the origins: every coordinate a multiple of the extent, with the block inside the
cluster. A node block (1, 1, g) has N_r * N_n * N_g/g origins, (1, n, N_g) has N_r * floor(N_n/n),
(r, N_n, N_g) has floor(N_r/r). The directory is small (tens of thousands of entries on 1024 GPUs)
and cheap: strategies are enumerated over divisors only, and the Alloc objects of one extent are
built once and shared by every strategy with that extent.

Order (deterministic): by allocation size, then pp, tp, mb ascending (dp follows from the size),
then origins in (rack, node, GPU) lexicographic order.
"""

from __future__ import annotations

from rpegc.core.check.plan_rules import (
    divisors,
    layout_extent,
    microbatch_choices,
    p8_ok,
)
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Model, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy


def legal_strategies(model: Model, workload: Workload, cluster: Cluster) -> list[Strategy]:
    """Every (dp, pp, tp, mb) that satisfies P1-P5 and P8 and has a P6 layout, in directory order."""
    layers = model.arch.layers
    out: list[tuple[int, int, int, int, int]] = []
    tps = divisors(cluster.gpus)  # P1
    pps = [d for d in divisors(layers) if d == 1 or d % 2 == 0]  # P2
    dps = [d for d in divisors(workload.B) if d <= cluster.num_devices]  # P3
    for tp in tps:
        for pp in pps:
            if not p8_ok(pp, tp, cluster):
                continue
            for dp in dps:
                if layout_extent(dp, pp, tp, cluster) is None:  # P6 and the packing half of P8
                    continue
                for mb in microbatch_choices(dp, pp, workload):  # P4, P5
                    out.append((dp * pp * tp, pp, tp, mb, dp))
    out.sort()
    return [Strategy(dp=dp, pp=pp, tp=tp, mb=mb) for _, pp, tp, mb, dp in out]


def aligned_origins(extent: tuple[int, int, int], cluster: Cluster) -> list[tuple[int, int, int]]:
    """P7: origins that are multiples of `extent` with the block inside the cluster, lexicographic."""
    e_r, e_n, e_g = extent
    return [
        (r, n, g)
        for r in range(0, cluster.racks - e_r + 1, e_r)
        for n in range(0, cluster.nodes - e_n + 1, e_n)
        for g in range(0, cluster.gpus - e_g + 1, e_g)
    ]


def allocations(extent: tuple[int, int, int], cluster: Cluster) -> list[Alloc]:
    """Every aligned allocation of one extent (the origin choices of a strategy)."""
    return [Alloc(origin=o, extent=extent) for o in aligned_origins(extent, cluster)]


# Bounds on one directory, checked (from counts, in microseconds) before anything is built. The optimizer
# keeps, per candidate, an Alloc, a device bitmask and a row of a candidates x devices boolean table
# (search/batched.py), so the table grows as candidates x devices, i.e. quadratically in the cluster size:
# 27k candidates x 1,024 GPUs = 28M cells for the paper's largest case (examples/ppo-1024.rpeg), 108k x
# 4,096 = 450M. A cluster of 20,000 nodes (80,000 GPUs) would need 2.2M candidates x 80,000 = 1.7e11 cells,
# which ended in a MemoryError after half a minute. 2**30 cells (1 GiB) admits 4,096 GPUs and refuses 8,192.
MAX_CANDIDATES = 1_000_000
MAX_DIRECTORY_CELLS = 2**30


def candidate_count(model: Model, workload: Workload, cluster: Cluster) -> int:
    """|X_cand(v)| of `enumerate_candidates`, counted without building it (one product per strategy)."""
    count = 0
    origins: dict[tuple[int, int, int], int] = {}
    for s in legal_strategies(model, workload, cluster):
        extent = layout_extent(s.dp, s.pp, s.tp, cluster)
        assert extent is not None
        if extent not in origins:
            e_r, e_n, e_g = extent
            origins[extent] = (cluster.racks // e_r) * (cluster.nodes // e_n) * (cluster.gpus // e_g)
        count += origins[extent]
    return count


def check_directory_size(model: Model, workload: Workload, cluster: Cluster, vertex: str) -> int:
    """The candidate count of a vertex invoking `model`; a located error (at the cluster) beyond the bounds."""
    count = candidate_count(model, workload, cluster)
    cells = count * cluster.num_devices
    if count > MAX_CANDIDATES or cells > MAX_DIRECTORY_CELLS:
        raise RpegError(
            cluster.loc,
            f"cluster @{cluster.name} ({cluster.num_devices} GPUs) is too large to optimize: the candidate "
            f"directory of @{vertex} would hold {count} placements x {cluster.num_devices} devices = {cells:.3g} "
            f"cells, more than the limit of {MAX_CANDIDATES} placements and {MAX_DIRECTORY_CELLS:.3g} cells "
            "(clusters up to ~4,096 GPUs fit); optimize a smaller cluster (fewer racks or nodes) or write the "
            "plan by hand",
        )
    return count


def enumerate_candidates(model: Model, workload: Workload, cluster: Cluster) -> list[tuple[Alloc, Strategy]]:
    """X_cand(v) for a vertex invoking `model`: all legal (allocation, strategy incl. mb), in directory order."""
    by_extent: dict[tuple[int, int, int], list[Alloc]] = {}
    out: list[tuple[Alloc, Strategy]] = []
    for s in legal_strategies(model, workload, cluster):
        extent = layout_extent(s.dp, s.pp, s.tp, cluster)
        assert extent is not None  # legal_strategies keeps only strategies with a layout
        allocs = by_extent.get(extent)
        if allocs is None:
            allocs = by_extent[extent] = allocations(extent, cluster)
        out.extend((a, s) for a in allocs)
    return out
