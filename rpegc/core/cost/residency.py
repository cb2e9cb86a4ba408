"""Device-level memory: residency of each model on each GPU, persistent state S(m, d), transient
peaks A(v, d), peak(d), r_peak and MemFeasible (paper App. D-I, Sec. V-D2; spec 6.5-6.6, [A13]-[A15]).

Input is the set of placed operators (vertex, role, model, allocation, strategy), so the same
function serves `annotate-cost` (taken from the exec graph) and the optimizer (taken from a
candidate plan). Per-device quantities are numpy arrays indexed by flat device id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.memory import (
    FROZEN,
    NONE,
    SHADOW,
    TRAINING,
    OpMemory,
    copy_bytes,
    memory_ratio,
    op_memory,
    transient_bytes,
)
from rpegc.core.ir.program import Model, Workload
from rpegc.core.ir.training import Training
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy, alloc_ids

SERVING_ROLES = ("generation", "inference")


@dataclass(frozen=True)
class OpPlacement:
    """One operator as memory sees it: quantile sub-nodes and unrolled steps share one placement."""

    vertex: str
    role: str
    model: str
    alloc: Alloc
    strategy: Strategy

    def training(self, wl: Workload) -> Optional[Training]:
        """How the operator trains (its placement's training fields over the workload's); None when it serves."""
        return wl.training(self.strategy.train) if self.role == "training" else None


@dataclass(frozen=True)
class DeviceMemory:
    """Per-device accounting (arrays of length #D) with what `explain` needs to break it down."""

    ops: tuple[OpPlacement, ...]
    op_memory: tuple[OpMemory, ...]
    residency: Mapping[str, np.ndarray]  # model -> residency code per device
    persistent_by_model: Mapping[str, np.ndarray]
    persistent: np.ndarray
    transient: np.ndarray
    transient_owner: np.ndarray  # index into `ops` of the operator giving A(v, d); -1 if none
    peak: np.ndarray
    m_eff: float
    r_peak: float
    feasible: bool
    fused: tuple[tuple[int, ...], ...] = ()  # indices into `ops` of each fusion's members (their transients add up)


@dataclass(frozen=True)
class OpTerms:
    """What device memory needs of one operator, per configuration (arrays of length B): its training state
    S on a training GPU, its serving copy's bytes, and its transient A(v, d) without and with a resident copy."""

    train_state: np.ndarray
    copy: np.ndarray
    transient: np.ndarray
    transient_with_copy: np.ndarray

    @staticmethod
    def of(mem: OpMemory, s_b: int, opts: CostOptions = DEFAULT_OPTIONS) -> "OpTerms":
        without, with_copy = transient_bytes(mem, np.array([False, True]), opts)
        return OpTerms(np.array([mem.state]), np.array([copy_bytes(mem.W_shard, s_b)]), np.array([without]),
                       np.array([with_copy]))


@dataclass(frozen=True)
class MemoryArrays:
    """`device_memory` of B configurations at once (B x #D arrays)."""

    residency: Mapping[str, np.ndarray]
    persistent_by_model: Mapping[str, np.ndarray]
    persistent: np.ndarray
    transient: np.ndarray
    transient_owner: np.ndarray

    @property
    def peak(self) -> np.ndarray:
        return self.persistent + self.transient


def device_memory_arrays(
    roles: tuple[str, ...],
    op_models: tuple[str, ...],
    masks: tuple[np.ndarray, ...],
    terms: tuple[OpTerms, ...],
    models: Mapping[str, Model],
    tau: Mapping[str, int],
    fused: tuple[tuple[int, ...], ...] = (),
) -> MemoryArrays:
    """peak(d) = sum_m S(m, d) + max_{v: d in sigma(v)} A(v, d) for every device of B configurations (spec
    6.5-6.6): operator i has role roles[i], model op_models[i], devices masks[i] (B x #D booleans) and
    memory terms[i] (arrays of length B, or of length 1 for every configuration alike). Each group of `fused`
    (operator indices on the same devices) runs as one fused operator, whose A(v, d) is the sum of its members'
    (docs/stage-fusion.md)."""
    B, n = masks[0].shape if masks else (1, 0)
    residency: dict[str, np.ndarray] = {}
    persistent_by_model: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(op_models):
        res, state = _model_state(name, models[name], tau.get(name, 0), roles, op_models, masks, terms, B, n)
        residency[name], persistent_by_model[name] = res, state
    persistent = np.zeros((B, n))
    for state in persistent_by_model.values():
        persistent = persistent + state
    transient = np.zeros((B, n))
    owner = np.full((B, n), -1)
    own = []
    for model, t in zip(op_models, terms):
        res = residency[model]
        holds_copy = (res == SHADOW) | (res == FROZEN)
        own.append(np.where(holds_copy, t.transient_with_copy[:, None], t.transient[:, None]))
    for group in fused:  # the members' transients coexist
        total = sum(own[i] for i in group)
        for i in group:
            own[i] = total
    for i, (mask, a) in enumerate(zip(masks, own)):
        larger = mask & (a > transient)  # the first operator of the largest A(v, d) owns the device
        transient = np.where(larger, a, transient)
        owner = np.where(larger, i, owner)
    return MemoryArrays(residency, persistent_by_model, persistent, transient, owner)


MAX_COVERING_OPS = 62  # a covering is coded in one int64


def device_peaks(
    roles: tuple[str, ...],
    op_models: tuple[str, ...],
    masks: tuple[np.ndarray, ...],
    terms: tuple[OpTerms, ...],
    models: Mapping[str, Model],
    tau: Mapping[str, int],
    fused: tuple[tuple[int, ...], ...] = (),
) -> np.ndarray:
    """`device_memory_arrays(...).peak` (B x #D), computed once per covering instead of once per device.

    Devices are homogeneous, so a device's memory depends only on which operators cover it: the rules run on
    the batch's distinct coverings (a handful, against hundreds of devices at 512 GPUs), each row seeing only
    the coverings its devices have, and the peaks are indexed back to the devices."""
    if not masks or len(masks) > MAX_COVERING_OPS:
        return device_memory_arrays(roles, op_models, masks, terms, models, tau, fused).peak
    B = masks[0].shape[0]
    index, bits = device_coverings(masks)
    present = np.zeros((B, len(bits)), dtype=bool)
    rows = np.arange(B)[:, None]
    present[rows, index] = True
    covering_masks = tuple(bits[None, :, i] & present for i in range(len(masks)))
    return device_memory_arrays(roles, op_models, covering_masks, terms, models, tau, fused).peak[rows, index]


def device_coverings(masks: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(index B x #D of each device's covering among the batch's distinct coverings, the coverings as rows of
    operator flags, S x #ops), a covering being the set of operators whose devices include the device."""
    n_ops = len(masks)
    code = np.zeros(masks[0].shape, dtype=np.int64)
    for i, m in enumerate(masks):
        code |= m.astype(np.int64) << i
    if n_ops <= 16:  # a table over every possible covering is small: no sort
        codes = np.flatnonzero(np.bincount(code.ravel(), minlength=1 << n_ops))
        rank = np.zeros(1 << n_ops, dtype=np.int64)
        rank[codes] = np.arange(len(codes))
        index = rank[code]
    else:
        codes, index = np.unique(code, return_inverse=True)
        index = index.reshape(code.shape)
    return index, ((codes[:, None] >> np.arange(n_ops)[None, :]) & 1).astype(bool)


def _model_state(name, model, tau, roles, op_models, masks, terms, B, n):
    """Residency codes and S(m, d) of one model over all devices (spec 6.5, first rule wins)."""
    train_state = np.zeros((B, n))
    copy_state = np.zeros((B, n))
    in_training = np.zeros((B, n), dtype=bool)
    for role, m, mask, t in zip(roles, op_models, masks, terms):
        if m == name and role == "training":
            in_training |= mask
            train_state = np.where(mask, np.maximum(train_state, t.train_state[:, None]), train_state)
    res = np.where(in_training, TRAINING, NONE)
    for role, m, mask, t in zip(roles, op_models, masks, terms):
        if m != name or role not in SERVING_ROLES:
            continue
        # [A15]: the largest serving layout of the model touching the device defines the copy.
        copy_state = np.where(mask, np.maximum(copy_state, t.copy[:, None]), copy_state)
        if model.trainable:
            if tau <= 0:
                continue
            # A shadow copy needs bounded staleness and a serving allocation disjoint from training [A14].
            allowed = ~np.any(in_training & mask, axis=1)
            code = SHADOW
        else:
            allowed = np.ones(B, dtype=bool)
            code = FROZEN
        res = np.where(mask & (res == NONE) & allowed[:, None], code, res)
    state = np.where(res == TRAINING, train_state, np.where((res == SHADOW) | (res == FROZEN), copy_state, 0.0))
    return res, state


def device_memory(
    ops: tuple[OpPlacement, ...],
    models: Mapping[str, Model],
    tau: Mapping[str, int],
    cluster: Cluster,
    wl: Workload,
    hw: Hardware,
    opts: CostOptions = DEFAULT_OPTIONS,
    fused: tuple[tuple[str, ...], ...] = (),
) -> DeviceMemory:
    """peak(d) = sum_m S(m, d) + max_{v: d in sigma(v)} A(v, d) for every device (spec 6.6): the one
    configuration `ops` places, through `device_memory_arrays`; `fused` names the vertices of each fusion."""
    n = cluster.num_devices
    mems = tuple(
        op_memory(op.role, models[op.model].arch, models[op.model].kind, wl,
                  dp=op.strategy.dp, pp=op.strategy.pp, tp=op.strategy.tp, mb=op.strategy.mb,
                  train=op.training(wl), opts=opts)
        for op in ops
    )
    masks = []
    for op in ops:
        mask = np.zeros((1, n), dtype=bool)
        mask[0, alloc_ids(op.alloc, cluster)] = True
        masks.append(mask)
    groups = _fused_indices(ops, fused)
    arrays = device_memory_arrays(tuple(op.role for op in ops), tuple(op.model for op in ops), tuple(masks),
                                  tuple(OpTerms.of(m, wl.s_b, opts) for m in mems),
                                  models, tau, groups)
    peak = arrays.peak[0]
    m_eff = hw.M_eff
    return DeviceMemory(
        ops=tuple(ops),
        op_memory=mems,
        residency={k: v[0] for k, v in arrays.residency.items()},
        persistent_by_model={k: v[0] for k, v in arrays.persistent_by_model.items()},
        persistent=arrays.persistent[0],
        transient=arrays.transient[0],
        transient_owner=arrays.transient_owner[0],
        peak=peak,
        m_eff=m_eff,
        r_peak=memory_ratio(peak, m_eff),
        feasible=bool(np.all(peak <= m_eff)),
        fused=groups,
    )


def _fused_indices(ops: tuple[OpPlacement, ...], fused: tuple[tuple[str, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The indices into `ops` of each fusion's members (named by vertex), each fusion once (every step repeats it)."""
    index = {op.vertex: i for i, op in enumerate(ops)}
    return tuple(dict.fromkeys(tuple(index[v] for v in group if v in index) for group in fused))
