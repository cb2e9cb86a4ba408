"""Lowering decisions and payloads: when a Comm, a Reshard or a bare precedence edge is needed.

Paper: App. A-G (Def. A.8 payloads, Def. A.9 quantiles, Def. A.10 shadow pairs, Alg. 4 stages 2-4);
docs/cost-model-spec.md Sections 5.1 (payloads) and 5.3 (when lowering creates nodes).

The rules look only at allocations, layouts, tau and sizes, so the lowering passes (on ExecGraph)
and the optimizer's compact evaluator take identical decisions by calling these functions.
"""

from __future__ import annotations

from typing import Collection, Optional, Sequence

import numpy as np

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import ExecNode
from rpegc.core.cost.params import param_count
from rpegc.core.ir.program import Graph, Model, Program, Vertex, container_bytes
from rpegc.core.ir.geometry import Alloc, Strategy, overlap

# Actions a lowering rule can take.
NONE = "none"  # nothing is added
DEP = "dep"  # a bare precedence edge
COMM = "comm"  # a Comm node (data or weight transfer)
RESHARD = "reshard"  # a Reshard node (weight layout change on the same devices)
ACTIONS = (NONE, DEP, COMM, RESHARD)  # the codes of the array forms: ACTIONS[code]


def pairwise_same(coordinates: np.ndarray) -> np.ndarray:
    """Which pairs of V entries agree in every coordinate, per configuration: [B, V, k] -> [B, V, V]. Of
    origins and extents: `same_devices`; of (dp, pp, tp) layouts: `same_layout`."""
    return np.all(coordinates[:, :, None, :] == coordinates[:, None, :, :], axis=3)


def disjoint(a: Alloc, b: Alloc) -> bool:
    return overlap(a, b) == 0


def same_devices(a: Optional[Alloc], b: Optional[Alloc]) -> bool:
    """sigma(u) = sigma(v) as device sets (spec 5.3); a box with positive extent has one (origin, extent). None is the
    host's verifier pool (a verify vertex): the same place only as another pool."""
    if a is None or b is None:
        return a is b
    return a.origin == b.origin and a.extent == b.extent


def same_layout(a: Strategy, b: Strategy) -> bool:
    """Pi(u) = Pi(v): (dp, pp, tp) agree; the microbatch count does not change the weight layout."""
    return a.layout() == b.layout()


def is_shadow(tau, n_overlap):
    """Def. A.10 from the overlap count: tau(m) > 0 and disjoint allocations (numbers or arrays)."""
    return (tau > 0) & (n_overlap == 0)


def is_shadow_pair(tau: int, u: Alloc, v: Alloc) -> bool:
    """Def. A.10: tau(m) > 0 and disjoint allocations."""
    return bool(is_shadow(tau, overlap(u, v)))


def data_action(src: Alloc, dst: Alloc) -> str:
    """Stage 2: a data edge needs a Comm exactly when the allocations differ."""
    return data_rule(same_devices(src, dst))


def data_rule(same: bool) -> str:
    return DEP if same else COMM


def publication_rule(same: bool, same_lay: bool) -> str:
    """Stage 4: Comm across allocations, Reshard on the same devices in another layout, else precedence."""
    if not same:
        return COMM
    return DEP if same_lay else RESHARD


def pair_rule(shadow: bool, same: bool, same_lay: bool) -> str:
    """Stage 3 for a consecutive within-step pair of one trainable model: nothing for a shadow pair or the same
    layout on the same devices, Reshard for another layout there, else precedence."""
    if shadow:
        return NONE
    if same:
        return NONE if same_lay else RESHARD
    return DEP


def publication_action(src: Alloc, src_strategy: Strategy, dst: Alloc, dst_strategy: Strategy) -> str:
    """`publication_rule` of a publication edge's two placements."""
    return publication_rule(same_devices(src, dst), same_layout(src_strategy, dst_strategy))


def pair_action(tau: int, u: Alloc, u_strategy: Strategy, v: Alloc, v_strategy: Strategy) -> str:
    """`pair_rule` of a within-step pair's two placements."""
    return pair_rule(is_shadow_pair(tau, u, v), same_devices(u, v), same_layout(u_strategy, v_strategy))


# The array forms: each rule tabulated over its boolean inputs, then indexed by boolean arrays.
_PUBLICATION = np.array([[ACTIONS.index(publication_rule(a, b)) for b in (False, True)] for a in (False, True)])
_PAIR = np.array([[[ACTIONS.index(pair_rule(s, a, b)) for b in (False, True)] for a in (False, True)]
                  for s in (False, True)])


def data_codes(same: np.ndarray) -> np.ndarray:
    """`data_rule` of a boolean array, as ACTIONS codes."""
    return np.where(same, ACTIONS.index(data_rule(True)), ACTIONS.index(data_rule(False)))


def publication_codes(same: np.ndarray, same_lay: np.ndarray) -> np.ndarray:
    """`publication_rule` of boolean arrays, as ACTIONS codes."""
    return _PUBLICATION[same.astype(np.intp), same_lay.astype(np.intp)]


def pair_codes(shadow: np.ndarray, same: np.ndarray, same_lay: np.ndarray) -> np.ndarray:
    """`pair_rule` of boolean arrays, as ACTIONS codes."""
    return _PAIR[shadow.astype(np.intp), same.astype(np.intp), same_lay.astype(np.intp)]


def is_phase_pair(src_role: str, src: Alloc, dst_role: str, dst: Alloc) -> bool:
    """Quantile splitting applies to a generation -> inference data edge on disjoint devices (Alg. 4 l.3)."""
    return src_role == "generation" and dst_role == "inference" and disjoint(src, dst)


def data_read(graph: Graph, v: Vertex) -> tuple[str, ...]:
    """The containers an Op of vertex `v` binds as its data inputs: those its incoming data edges carry.

    Weights are read by version, not as data. A read without a data edge binds nothing: graph inputs are
    everywhere from the start, and the paper's PPO lets training read Y "from device memory", which is not
    modelled as a transfer."""
    weights = {c.name for c in graph.containers if c.is_weights}
    delivered = {e.container for e in graph.data_edges if e.dst == v.name}
    return tuple(c for c in v.reads if c in delivered and c not in weights)


def data_written(graph: Graph, v: Vertex) -> tuple[str, ...]:
    """The containers an Op of vertex `v` binds as its data outputs (its weights are a new version)."""
    weights = {c.name for c in graph.containers if c.is_weights}
    return tuple(c for c in v.writes if c not in weights)


def phase_shares(graph: Graph) -> tuple[float, ...]:
    """f_q - f_{q-1} (f_0 = 0) of the graph's quantiles, after checking Def. A.9 (0 < f_1 < ... < f_Q = 1)."""
    previous = 0.0
    shares = []
    for q in graph.quantiles:
        if not previous < q.f <= 1.0:
            raise RpegError(
                q.loc,
                f"quantile fraction {q.f} must lie in (0, 1] and exceed the previous one ({previous}); "
                "write the quantiles with strictly increasing cumulative fractions",
            )
        # Rounding drops float noise (0.15000000000000002) so printed shares read as the user wrote them.
        shares.append(round(q.f - previous, 12))
        previous = q.f
    if shares and abs(previous - 1.0) > 1e-9:
        raise RpegError(
            graph.quantiles_loc,
            f"the last quantile fraction is {previous}, but all responses must finish by the last "
            "quantile; end the quantile list with f = 1.0",
        )
    return tuple(shares)


def phase_share(src: ExecNode, dst: ExecNode) -> Optional[float]:
    """The payload share of a data edge between quantile sub-nodes, None for a whole-container edge.

    split-quantiles connects generation phase q to inference phase q and nothing else joins two
    sub-nodes of the same phase index, so equal phases identify a phase edge."""
    if src.phase is None or dst.phase is None or src.phase != dst.phase or src.role != "generation":
        return None
    return src.fraction


def published_weights(p: Program, container: Optional[str], publisher: ExecNode) -> tuple[str, int]:
    """The model whose weights a publication edge carries and the version its training op produced.

    The model is the weights container's model (mu(u) if the container is not a declared weights
    container); the version is the publisher's version_out, k' + 1."""
    model = publisher.model
    if p.graph is not None and container is not None:
        try:
            c = p.graph.container(container)
        except KeyError:
            c = None
        if c is not None and c.is_weights and c.model is not None:
            model = c.model
    return model, dict(publisher.version_out).get(model, publisher.step + 1)


def data_bytes(full_bytes: int, share: Optional[float]) -> int:
    """|a|s(a), or |a|s(a)(f_q - f_{q-1}) for a quantile phase edge (rounded to whole bytes)."""
    return full_bytes if share is None else round(full_bytes * share)


def publication_bytes(weight_bytes: int, src: Alloc, dst: Alloc) -> int:
    """N_m s_b (n_max - n_overlap) / n_max: devices in the intersection produce their shard locally."""
    return int(publication_bytes_of(weight_bytes, max(src.size, dst.size), overlap(src, dst)))


def publication_bytes_of(weight_bytes, n_max, n_overlap):
    """`publication_bytes` from the larger allocation's size and the overlap count (integers or integer
    arrays), rounded to the nearest byte, half to even (Python's round of the exact fraction)."""
    q, r = divmod(weight_bytes * (n_max - n_overlap), n_max)
    up = (2 * r > n_max) | ((2 * r == n_max) & (q % 2 == 1))
    return q + up


def weight_bytes(p: Program, model: Optional[str], loc: Optional[Loc] = None) -> int:
    """N_m s_b: the full parameter volume of a model (Reshard payload, disjoint publication payload)."""
    m = _model(p, model, loc)
    return param_count(m.arch, m.kind) * p.workload.s_b


def container_payload(p: Program, container: Optional[str], loc: Optional[Loc] = None) -> int:
    """|a| s(a) of a container of the program's graph."""
    if p.graph is None:
        raise RpegError(loc, "the module has no rpeg.graph, so container sizes are unknown; keep the graph in the module")
    try:
        c = p.graph.container(container) if container is not None else None
    except KeyError:
        c = None
    if c is not None:
        return container_bytes(c, p.workload, lambda name: _params(p, name, c.loc))
    raise RpegError(loc, f"edge carries unknown container '%{container}'; declare it in graph @{p.graph.name}")


def _params(p: Program, name: Optional[str], loc: Optional[Loc]) -> int:
    m = _model(p, name, loc)
    return param_count(m.arch, m.kind)


def _model(p: Program, name: Optional[str], loc: Optional[Loc]) -> Model:
    if name is not None:
        try:
            return p.model(name)
        except KeyError:
            pass
    raise RpegError(loc, f"unknown model '@{name}'; declare it with rpeg.model")


def model_pairs(vertices: Sequence[tuple[str, str]], trainable: Collection[str]) -> list[tuple[str, str, str]]:
    """Pairs(m) for every trainable m: (m, u, v) for consecutive vertices invoking m (stage 3).

    `vertices` are (vertex, model) in topological order of G°; frozen models are never resharded."""
    last: dict[str, str] = {}
    pairs = []
    for vertex, model in vertices:
        if model not in trainable:
            continue
        if model in last:
            pairs.append((model, last[model], vertex))
        last[model] = vertex
    return pairs
