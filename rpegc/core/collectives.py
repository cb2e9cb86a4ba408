"""Alpha-beta costs of the collective primitives (paper Table II; spec 4) and tier selection.

Every primitive takes the message size `M` (bytes, with the convention of spec 4), the participant
count `p` and the `(alpha, beta)` pair of the chosen tier and family; each works on Python scalars
and, elementwise, on numpy arrays. A collective over one participant costs nothing.
"""

from __future__ import annotations

from rpegc.core.devices import TIERS
from rpegc.core.program import Alloc, Strategy


def allreduce(M, p, alpha, beta):
    """Ring AllReduce, M = per-GPU buffer: 2(p-1) alpha + 2 ((p-1)/p) M beta."""
    return 2 * (p - 1) * alpha + 2 * ((p - 1) / p) * M * beta


def allgather(M, p, alpha, beta):
    """Ring AllGather, M = final gathered buffer: (p-1) alpha + ((p-1)/p) M beta."""
    return (p - 1) * alpha + ((p - 1) / p) * M * beta


def reduce_scatter(M, p, alpha, beta):
    """Ring ReduceScatter, M = per-GPU input buffer: (p-1) alpha + ((p-1)/p) M beta."""
    return (p - 1) * alpha + ((p - 1) / p) * M * beta


def alltoall(M, p, alpha, beta):
    """Pairwise AlltoAll, M = aggregate bytes per GPU incl. the self-share: (p-1) alpha + M beta."""
    # The M*beta term has no (p-1) factor, so p = 1 needs the explicit zero (spec 4, rule 1).
    return (p > 1) * ((p - 1) * alpha + M * beta)


def p2p(M, alpha, beta):
    """Point-to-point transfer of M bytes: alpha + M beta."""
    return alpha + M * beta


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
    """Position of a tier in `devices.TIERS` (for array-valued tier arguments)."""
    return TIERS.index(tier)
