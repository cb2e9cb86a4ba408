"""Device-level memory: residency of each model on each GPU, persistent state S(m, d), transient
peaks A(v, d), peak(d), r_peak and MemFeasible (paper App. D-I, Sec. V-D2; spec 6.5-6.6, [A13]-[A15]).

Input is the set of placed operators (vertex, role, model, allocation, strategy), so the same
function serves `annotate-cost` (taken from the exec graph) and the optimizer (taken from a
candidate plan). Per-device quantities are numpy arrays indexed by flat device id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from rpegc.core.cost_options import CostOptions
from rpegc.core.hardware import Hardware
from rpegc.core.memory import (
    FROZEN,
    NONE,
    SHADOW,
    TRAINING,
    OpMemory,
    copy_bytes,
    memory_ratio,
    op_memory,
    training_state_bytes,
    transient_bytes,
)
from rpegc.core.program import Alloc, Cluster, Model, Strategy, Workload

_DEFAULT = CostOptions()
SERVING_ROLES = ("generation", "inference")


@dataclass(frozen=True)
class OpPlacement:
    """One operator as memory sees it: quantile sub-nodes and unrolled steps share one placement."""

    vertex: str
    role: str
    model: str
    alloc: Alloc
    strategy: Strategy


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


def alloc_ids(alloc: Alloc, cluster: Cluster) -> np.ndarray:
    """Flat ids `(rack*N_n + node)*N_g + gpu` of an allocation, as a numpy array."""
    (o_r, o_n, o_g), (e_r, e_n, e_g) = alloc.origin, alloc.extent
    racks = np.arange(o_r, o_r + e_r)[:, None, None]
    nodes = np.arange(o_n, o_n + e_n)[None, :, None]
    gpus = np.arange(o_g, o_g + e_g)[None, None, :]
    return ((racks * cluster.nodes + nodes) * cluster.gpus + gpus).ravel()


def device_memory(
    ops: tuple[OpPlacement, ...],
    models: Mapping[str, Model],
    tau: Mapping[str, int],
    cluster: Cluster,
    wl: Workload,
    hw: Hardware,
    opts: CostOptions = _DEFAULT,
) -> DeviceMemory:
    """peak(d) = sum_m S(m, d) + max_{v: d in sigma(v)} A(v, d) for every device (spec 6.6)."""
    n = cluster.num_devices
    ids = [alloc_ids(op.alloc, cluster) for op in ops]
    mems = tuple(
        op_memory(op.role, models[op.model].arch, models[op.model].kind, wl,
                  dp=op.strategy.dp, pp=op.strategy.pp, tp=op.strategy.tp, mb=op.strategy.mb, opts=opts)
        for op in ops
    )
    residency: dict[str, np.ndarray] = {}
    persistent_by_model: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(op.model for op in ops):
        res, state = _model_state(name, models[name], tau.get(name, 0), ops, ids, mems, n, wl.s_b)
        residency[name], persistent_by_model[name] = res, state
    persistent = np.zeros(n)
    for state in persistent_by_model.values():
        persistent += state
    transient = np.zeros(n)
    owner = np.full(n, -1)
    for i, (op, dev, mem) in enumerate(zip(ops, ids, mems)):
        holds_copy = np.isin(residency[op.model][dev], (SHADOW, FROZEN))
        a = transient_bytes(mem, holds_copy, opts)
        larger = a > transient[dev]
        transient[dev[larger]] = a[larger]
        owner[dev[larger]] = i
    peak = persistent + transient
    m_eff = hw.M_eff
    return DeviceMemory(
        ops=tuple(ops),
        op_memory=mems,
        residency=residency,
        persistent_by_model=persistent_by_model,
        persistent=persistent,
        transient=transient,
        transient_owner=owner,
        peak=peak,
        m_eff=m_eff,
        r_peak=memory_ratio(peak, m_eff),
        feasible=bool(np.all(peak <= m_eff)),
    )


def _model_state(name, model, tau, ops, ids, mems, n, s_b):
    """Residency codes and S(m, d) of one model over all devices (spec 6.5, first rule wins)."""
    train_state = np.zeros(n)
    copy_state = np.zeros(n)
    in_training = np.zeros(n, dtype=bool)
    for op, dev, mem in zip(ops, ids, mems):
        if op.model == name and op.role == "training":
            in_training[dev] = True
            train_state[dev] = np.maximum(train_state[dev], training_state_bytes(mem.W_shard, op.strategy.dp))
    res = np.where(in_training, TRAINING, NONE)
    for op, dev, mem in zip(ops, ids, mems):
        if op.model != name or op.role not in SERVING_ROLES:
            continue
        # [A15]: the largest serving layout of the model touching the device defines the copy.
        copy_state[dev] = np.maximum(copy_state[dev], copy_bytes(mem.W_shard, s_b))
        if model.trainable:
            # A shadow copy needs bounded staleness and a serving allocation disjoint from training [A14].
            if tau <= 0 or in_training[dev].any():
                continue
            code = SHADOW
        else:
            code = FROZEN
        free = res[dev] == NONE
        res[dev[free]] = code
    state = np.where(res == TRAINING, train_state, np.where((res == SHADOW) | (res == FROZEN), copy_state, 0.0))
    return res, state
