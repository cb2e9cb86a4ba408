"""Alpha-beta costs of the collective primitives (paper Table II; spec 4); which tier a collective uses is
geometry.py's.

Every primitive takes the message size `M` (bytes, with the convention of spec 4), the participant
count `p` and the `(alpha, beta)` pair of the chosen tier and family; each works on Python scalars
and, elementwise, on numpy arrays. A collective over one participant costs nothing.
"""

from __future__ import annotations


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


