"""The search objective: Score_pen (throughput) or Score_eff_pen (throughput x utilization).

Paper: Sec. IV-E and App. A-I, Eq. 4-6; docs/cost-model-spec.md Section 7 (A19: Score_star is the best raw
score so far, including the current candidate). The optimizer passes the best raw score among the
memory-feasible configurations evaluated so far, so an out-of-memory plan never raises the floor.
Ablation A8 replaces the soft penalty by hard rejection: an infeasible configuration scores -inf.
"""

from __future__ import annotations

import math

import numpy as np

from rpegc.core.ir.errors import RpegError
from rpegc.core.sched.score import memory_penalty, score_eff

OBJECTIVES = ("throughput", "util")


def check_objective(kind: str, delta: float) -> None:
    if kind not in OBJECTIVES:
        raise RpegError(None, f"unknown objective '{kind}'; use objective=throughput or objective=util")
    if not 0.0 <= delta < 1.0:
        raise RpegError(None, f"delta = {delta} must lie in [0, 1); the paper uses delta=0.1")


def objective_value(
    raw: float, util: float, r_peak: float, kind: str = "throughput", best_raw: float = 0.0, delta: float = 0.1,
    hard: bool = False,
) -> float:
    if hard and r_peak > 1.0:
        return -math.inf
    base = raw if kind == "throughput" else score_eff(raw, util, best_raw, delta)
    return float(base * memory_penalty(r_peak))


def objective_values(raw: np.ndarray, util: np.ndarray, r_peak: np.ndarray, kind: str = "throughput",
                     best_raw: float = 0.0, delta: float = 0.1, hard: bool = False) -> np.ndarray:
    """`objective_value` for arrays (one entry per configuration)."""
    return np.array([objective_value(float(a), float(b), float(c), kind, best_raw, delta, hard)
                     for a, b, c in zip(raw, util, r_peak)])
