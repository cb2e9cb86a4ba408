"""Comm and Reshard node times and quantile sub-node times (paper App. A-G, D; spec 5.2-5.3, [A16], [A17]):
what `annotate-cost` assigns. The payloads these times take are the lowering's (`lower/rules.py`:
`data_bytes`, `publication_bytes`, `weight_bytes`), stored in a node's `bytes`. Numeric arguments may be numpy
arrays.
"""

from __future__ import annotations

import numpy as np

from rpegc.core.cost.collectives import alltoall
from rpegc.core.ir.geometry import Alloc, span_tier, span_tier_index
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.cost.hardware import Hardware
from rpegc.core.ir.exec_graph import ExecNode


def comm_time(payload, n_src, n_dst, alpha, beta):
    """T_xfer = alpha + payload / min(n_src, n_dst) * beta: balanced concurrent send/recv pairs."""
    return alpha + payload / np.minimum(n_src, n_dst) * beta


def reshard_time(n_params, s_b, p, alpha, beta):
    """T_reshard = A2A(N_m s_b / p, p): every GPU of the allocation exchanges its share."""
    return alltoall(n_params * s_b / p, p, alpha, beta)


def comm_node_time(payload, src: Alloc, dst: Alloc, hw: Hardware) -> float:
    """T_xfer of a Comm node between two allocations, at tier(sigma(u) ∪ sigma(v))."""
    tier = span_tier_index(src.origin, src.extent, dst.origin, dst.extent)
    return comm_node_time_at(payload, tier, src.size, dst.size, hw)


def comm_node_time_at(payload, tier, n_src, n_dst, hw: Hardware):
    """T_xfer of Comm nodes at TIERS index `tier` between allocations of n_src and n_dst GPUs (numbers, or
    arrays for many configurations: the batched evaluator's form)."""
    alpha, beta = hw.p2p(tier)
    return comm_time(payload, n_src, n_dst, alpha, beta)


def reshard_node_time(n_params, s_b, alloc: Alloc, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> float:
    """T_reshard of a Reshard node on `alloc`, at tier(sigma(u)) with the family of [A16]."""
    tier = span_tier(alloc)
    alpha, beta = hw.coll(tier) if opts.alltoall_family == "collective" else hw.p2p(tier)
    return reshard_time(n_params, s_b, alloc.size, alpha, beta)


def priced_node_time(t, hw: Hardware, transfer: bool = False, full=True, weights=False):
    """A node's time as the schedule takes it: what it runs for (`t`), a transfer's fixed cost beside its link
    ([overhead] `transfer`, or `transfer_weights` where it moves a model's weights: `weights`, `moves_weights`) and the
    runtime's control round trip before it ([overhead] `node`, or `node_free` on a host the plan leaves a core of:
    `full` False, core/cost/contention.py); all 0 in the spec's model. Numbers or arrays (the batched evaluator's
    form, `transfer`, `full` and `weights` too)."""
    return (t + transfer * hw.overhead.transfer_cost(weights)) + hw.overhead.round_trip(full)


def moves_weights(n: ExecNode) -> bool:
    """Whether an exec node moves a model's weights (a publication's Comm, a Reshard) rather than a data field."""
    return n.kind != "op" and n.model is not None


def generation_phase_time(prefill_time, decode_time, q: int, t_q, t_prev, t_last):
    """T(gen_q) = 1[q=1] T_pf + T_dec (t_q - t_{q-1}) / t_Q ([A17]; t_0 = 0)."""
    return (q == 1) * prefill_time + decode_time * (t_q - t_prev) / t_last


def inference_phase_time(op_time, fraction):
    """T(inf_q) = T_op(inference) (f_q - f_{q-1}) ([A17])."""
    return op_time * fraction
