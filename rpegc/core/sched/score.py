"""Throughput score, memory penalty, utilization and the throughput x utilization score.

Paper: Sec. IV-E and App. A-I (Eq. 4-6, Definitions A.15, A.16); docs/cost-model-spec.md Section 7 and
choices A18 (busy time counts every node whose reserved set contains the device, over the whole
device space) and A19 (Score_star is the best raw score so far, including the current one).

Every function takes Python floats or numpy arrays (the optimizer scores thousands of
configurations at once) and returns the same kind.
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np

Number = Union[float, np.ndarray]

BETA_OOM = 40.0  # penalty steepness beta_oom (Eq. 5)
DELTA = 0.10  # allowed throughput loss zeta/delta of the efficiency score (Eq. 6)
LAMBDA_FLOOR = 1e-12  # factor for plans below the throughput floor (Eq. 6)


def tokens_per_step(B: int, R: int, Lp: int, Lr: int) -> int:
    """W_step = B*R*(Lp + Lr): logical prompt+response tokens of one RL step."""
    return B * R * (Lp + Lr)


def score(makespan: Number, steps: int, B: int, R: int, Lp: int, Lr: int) -> Number:
    """Score = K_eval * B*R*(Lp+Lr) / MS in tokens/s (Eq. 4); MS must be positive."""
    return steps * tokens_per_step(B, R, Lp, Lr) / makespan


def memory_penalty(r_peak: Number, beta: float = BETA_OOM) -> Number:
    """exp(-beta * max(0, r_peak - 1)): 1 for feasible plans, steeply smaller above capacity."""
    if isinstance(r_peak, np.ndarray):
        return np.exp(-beta * np.maximum(0.0, r_peak - 1.0))
    return math.exp(-beta * max(0.0, r_peak - 1.0))


def score_pen(raw_score: Number, r_peak: Number, beta: float = BETA_OOM) -> Number:
    """Score_pen = Score * exp(-beta_oom * max(0, r_peak - 1)) (Eq. 5)."""
    return raw_score * memory_penalty(r_peak, beta)


def utilization(busy: Number, num_devices: int, makespan: Number) -> Number:
    """Util = sum_d t_busy(d) / (|D| * MS); `busy` = sum_d t_busy(d) = sum_x T(x)*|reserved(x)| (A18)."""
    return busy / (num_devices * makespan)


def score_eff(
    raw_score: Number,
    util: Number,
    best_so_far: Number,
    delta: float = DELTA,
    lambda_floor: float = LAMBDA_FLOOR,
) -> Number:
    """Score_eff = Score * Util above the floor (1 - delta) * Score_star, else Score * lambda_floor (Eq. 6).

    Score_star = max(best_so_far, raw_score) (A19), so the caller passes the best raw score of the
    candidates evaluated before this one (0 for the first).
    """
    if isinstance(raw_score, np.ndarray) or isinstance(best_so_far, np.ndarray):
        star = np.maximum(best_so_far, raw_score)
        return raw_score * np.where(raw_score >= (1.0 - delta) * star, util, lambda_floor)
    star = max(best_so_far, raw_score)
    return raw_score * (util if raw_score >= (1.0 - delta) * star else lambda_floor)


def p_eff(op_time: Number, makespan: Number) -> Number:
    """P_eff = sum of T over Op nodes / MS: how many operators run concurrently on average."""
    return op_time / makespan
