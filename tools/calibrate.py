"""rpeg-calibrate: measure the hardware parameters of the cost model on this machine's devices.

Paper Sec. V-A3 and App. C-A2 ("automated hardware calibration"); docs/cost-model-spec.md Sec. 1.3, 3, 4.
The campaign measures, on the devices the torch backend runs on (CPU worker processes with one
thread each, or CUDA devices under NCCL):

    BW_mem           contiguous copies (bytes read + written per second)
    F_peak, gamma_M, gamma_K, t_layer
                     --eta-from layers (default): one least-squares fit, in relative error, of
                     t = W / (F_peak * eta(rows, k)) + layers * t_layer (spec 3.2 plus a fixed time per
                     layer call, not in the source) over forwards of the backend's transformer layers,
                     both prefill-shaped (rows = b * seq) and decode steps with the KV cache (rows = b),
                     at several widths k. --eta-from gemm (the paper's split): the gammas from isolated
                     GEMM shape sweeps, F_peak from the same forwards through min(F_peak*eta, I*BW_mem).
                     On CPU the isolated GEMM misses the ~30 framework kernels around every layer's
                     GEMMs, which dominate decode steps; bench/validation/README.md shows the effect.
    c_ng             the tensor-parallel-replicated non-GEMM kernels of one layer (two RMSNorms, two
                     residual adds) at the reference batch B_cal (spec 3.5, [A10])
    alpha, beta      AllReduce sweeps (collective family) and send/recv ping-pong sweeps (P2P family),
                     least squares of the alpha-beta forms of spec 4 in relative error

Every microbenchmark is warm and repeated; a point's value is the median of all its repeats over all
rounds (`--statistic min`: the fastest), the statistic rpeg-validate reports for the operators, so the
profile predicts the latency validation measures; `--machine` keeps the kernels' fastest (`machine_plan` says why).
The result
is a hardware profile TOML (the schema of rpegc/core/cost/hardware.py) with the fitted values, the quality
of every fit and the date. Tiers a machine cannot reach (a single host reaches only
`intra_node`) get the intra-node values, and the file says so.

The fit functions are pure functions on arrays (no torch), tested on synthetic data.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import math
import platform
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

import numpy as np

from rpegc.core.ir.geometry import TIERS
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost import machine
from rpegc.core.cost.attention import AttentionTable
from rpegc.tools.overhead_timing import FULL, QUICK, KernelCheck, moved_forward_terms, overhead_table
from rpegc.tools.verifier_timing import built_in_scorers, measure_host
from rpegc.core.cost.hardware import Hardware, load_hardware
from rpegc.core.cost.optime import rotated_per_token
from rpegc.core.cost.params import layer_gemm_params
from rpegc.core.ir.program import Arch, Workload
from rpegc.core.cost.work import decode_flops_per_rollout, forward_flops_per_sequence
from rpegc.outputs import Output, OutputError, PendingOutput, check_outputs, write_text
from rpegc.tools.measure import (STATISTICS, Progress, WorkerPool, default_backend, device_count, mape,
                                 summarize, time_per_call, time_repeats)
from rpegc.runtime.speed_probe import SpeedReference, at_usual_speed, fresh_probe_seconds
from rpegc.version import PrintVersion

DEFAULT_EPS_RT = 0.10  # paper Sec. IV-E: reserved runtime fraction
BACKEND_POSITIONS = "learned"  # position embedding of the torch backend's models (its run_config default)


# ---------------------------------------------------------------------------------------------------
# Pure fit functions


@dataclass(frozen=True)
class EtaFit:
    """F(rows, k) = scale * rows/(rows + gamma_M) * k/(k + gamma_K), fitted in log space; or, by
    `fit_eta_overhead`, t = W / F(rows, k) + layers * t_layer fitted in relative time error."""

    scale: float  # FLOP/s at full saturation of the swept GEMMs
    gamma_M: float
    gamma_K: float
    mape: float  # mean |F_fit - F| / F over the points (= mean |t_fit - t| / t)
    points: int
    t_layer: float = 0.0  # s per layer call, fitted by fit_eta_overhead only


@dataclass(frozen=True)
class LinkFit:
    """seconds = alpha * a + beta * b (a, b: the alpha and beta coefficients of a primitive)."""

    alpha: float
    beta: float
    mape: float
    points: int
    note: str = ""  # set when a constraint (alpha >= 0, beta > 0) was active


@dataclass(frozen=True)
class ScaleFit:
    """One fitted scale (F_peak) with its relative error over the points."""

    value: float
    mape: float
    points: int


def eta(rows, widths, gamma_M, gamma_K):
    """GEMM utilisation of spec 3.2: rows/(rows + gamma_M) * k/(k + gamma_K)."""
    rows, widths = np.asarray(rows, dtype=float), np.asarray(widths, dtype=float)
    return rows / (rows + gamma_M) * (widths / (widths + gamma_K))


def _gamma_grid(values: np.ndarray, n: int) -> np.ndarray:
    # Up to 2x the largest swept size: beyond it the data cannot tell a saturation constant from a
    # lower F scale (throughput just grows linearly over the sweep: a ridge of equally good fits), and
    # the bound keeps F_peak a ceiling near the measurements instead of an extrapolation far beyond.
    lo, hi = float(values.min()), float(values.max())
    return np.concatenate([[0.0], np.geomspace(lo / 100.0, hi * 2.0, n)])


def _eta_objective(log_f, rows, widths, gm, gk):
    """Sum of squared log residuals for every (gamma_M, gamma_K) pair; the scale is solved exactly."""
    log_r = np.log(rows[None, :] / (rows[None, :] + gm[:, None]))  # [nM, N]
    log_k = np.log(widths[None, :] / (widths[None, :] + gk[:, None]))  # [nK, N]
    resid = log_f[None, None, :] - log_r[:, None, :] - log_k[None, :, :]
    log_scale = resid.mean(axis=-1)
    return ((resid - log_scale[..., None]) ** 2).sum(axis=-1), log_scale


def fit_eta(rows, widths, flops_per_s) -> EtaFit:
    """Least squares of log F = log A + log(rows/(rows+gamma_M)) + log(k/(k+gamma_K)).

    Log space weighs every shape alike (a GEMM at 1 row counts as much as one at 1000). For fixed
    gammas the best log A is the mean residual, so only the two gammas are searched: a log grid over
    [min/100, 2*max] plus 0, then two zoomed grids around the best pair.
    """
    r = np.asarray(rows, dtype=float)
    k = np.asarray(widths, dtype=float)
    f = np.asarray(flops_per_s, dtype=float)
    if not (r.shape == k.shape == f.shape) or r.size < 3:
        raise RpegError(None, "the GEMM fit needs at least 3 points with rows, width and FLOP/s each")
    if np.any(r <= 0) or np.any(k <= 0) or np.any(f <= 0):
        raise RpegError(None, "GEMM sweep points must have positive rows, width and throughput")
    log_f = np.log(f)
    gm, gk = _gamma_grid(r, 90), _gamma_grid(k, 90)
    best = (0.0, 0.0)
    for _ in range(3):
        sse, _ = _eta_objective(log_f, r, k, gm, gk)
        i, j = np.unravel_index(np.argmin(sse), sse.shape)
        best = (float(gm[i]), float(gk[j]))
        gm = _zoom(gm, i)
        gk = _zoom(gk, j)
    sse, log_scale = _eta_objective(log_f, r, k, np.array([best[0]]), np.array([best[1]]))
    scale = float(np.exp(log_scale[0, 0]))
    fitted = scale * eta(r, k, *best)
    return EtaFit(scale, best[0], best[1], mape(fitted, f), int(r.size))


def _overhead_objective(work, layers, seconds, rows, widths, gm, gk):
    """For every (gamma_M, gamma_K) pair: the least squares of t ~ u * W/eta + t0 * layers in relative
    error (u = 1/F, t0 >= 0, solved exactly: two unknowns), its sum of squares, u and t0."""
    x = work[None, None, :] / (rows[None, None, :] / (rows[None, None, :] + gm[:, None, None])
                               * (widths[None, None, :] / (widths[None, None, :] + gk[None, :, None])))
    a, b = x / seconds, np.broadcast_to(layers / seconds, x.shape)
    saa, sab, sbb = (a * a).sum(-1), (a * b).sum(-1), (b * b).sum(-1)
    sa, sb = a.sum(-1), b.sum(-1)
    det = saa * sbb - sab * sab
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(det > 0, (sa * sbb - sb * sab) / det, 0.0)
        t0 = np.where(det > 0, (saa * sb - sab * sa) / det, -1.0)
        # No overhead visible (t0 < 0), or timing noise that makes more work look faster (u <= 0, a
        # negative F_peak): the pure roofline, whose u = sa/saa is positive for positive data.
        clamp = (t0 < 0) | (u <= 0)
        u = np.where(clamp, sa / saa, u)
        t0 = np.where(clamp, 0.0, t0)
    sse = ((u[..., None] * a + t0[..., None] * b - 1.0) ** 2).sum(-1)
    return np.where(u > 0, sse, np.inf), u, t0


def fit_eta_overhead(rows, widths, work, layers, seconds) -> EtaFit:
    """Least squares of t = W / (A * eta(rows, k)) + layers * t_layer in relative error.

    A forward is GEMM time on the eta roofline plus a fixed time per layer call (dispatch): on CPU
    workers the second dominates small models, and eta alone can only mimic it with a cost that grows
    with the GEMM width. For fixed gammas the problem is linear in (1/A, t_layer); the gammas are
    searched as in `fit_eta`.
    """
    r, k, w, n, t = (np.asarray(v, dtype=float) for v in (rows, widths, work, layers, seconds))
    if not (r.shape == k.shape == w.shape == n.shape == t.shape) or r.size < 4:
        raise RpegError(None, "the forward fit needs at least 4 points with rows, width, work, layers and time each")
    if np.any(r <= 0) or np.any(k <= 0) or np.any(w <= 0) or np.any(n <= 0) or np.any(t <= 0):
        raise RpegError(None, "forward points must have positive rows, width, work, layers and time")
    gm, gk = _gamma_grid(r, 60), _gamma_grid(k, 60)
    best = (0.0, 0.0)
    for _ in range(3):
        sse, _, _ = _overhead_objective(w, n, t, r, k, gm, gk)
        i, j = np.unravel_index(np.argmin(sse), sse.shape)
        best = (float(gm[i]), float(gk[j]))
        gm, gk = _zoom(gm, i), _zoom(gk, j)
    _, u, t0 = _overhead_objective(w, n, t, r, k, np.array([best[0]]), np.array([best[1]]))
    scale, t_layer = 1.0 / float(u[0, 0]), float(t0[0, 0])
    fitted = w / (scale * eta(r, k, *best)) + n * t_layer
    return EtaFit(scale, best[0], best[1], mape(fitted, t), int(r.size), t_layer)


def _zoom(grid: np.ndarray, i: int) -> np.ndarray:
    """A finer grid between the neighbours of grid[i] (0 stays a candidate when it was best)."""
    lo = grid[max(i - 1, 0)]
    hi = grid[min(i + 1, grid.size - 1)]
    positive_lo = lo if lo > 0 else (grid[1] / 10.0 if grid.size > 1 and grid[1] > 0 else 1e-9)
    fine = np.geomspace(positive_lo, max(hi, positive_lo * 1.0001), 60)
    return np.concatenate([[0.0], fine]) if lo == 0 else fine


def fit_alpha_beta(alpha_terms, beta_terms, seconds) -> LinkFit:
    """Least squares of seconds ~ alpha * a + beta * b in relative error (each row divided by its time).

    Relative error keeps small messages (which fix alpha) from being drowned by large ones (which fix
    beta). alpha is clamped at 0 and beta at a positive floor, as the profile requires; the note says
    when that happened.
    """
    a = np.asarray(alpha_terms, dtype=float)
    b = np.asarray(beta_terms, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if not (a.shape == b.shape == t.shape) or t.size < 2:
        raise RpegError(None, "an alpha-beta fit needs at least 2 points with coefficients and times each")
    if np.any(t <= 0):
        raise RpegError(None, "alpha-beta sweep times must be positive")
    w = 1.0 / t
    design = np.stack([a * w, b * w], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    note = ""
    if alpha < 0:
        alpha, note = 0.0, "alpha clamped at 0"
        beta = float(np.dot(b * w, np.ones_like(t)) / np.dot(b * w, b * w))
    if beta <= 0:
        floor = 1e-15
        beta, note = floor, (note + "; " if note else "") + f"beta floored at {floor:g} s/B (no bandwidth term visible)"
        if np.dot(a * w, a * w) > 0:
            alpha = max(0.0, float(np.dot(a * w, np.ones_like(t) - b * w * beta) / np.dot(a * w, a * w)))
    return LinkFit(float(alpha), float(beta), mape(alpha * a + beta * b, t), int(t.size), note)


def allreduce_terms(message_bytes, participants):
    """(alpha, beta) coefficients of a ring AllReduce of a per-GPU buffer M over p GPUs (spec 4)."""
    m = np.asarray(message_bytes, dtype=float)
    p = np.asarray(participants, dtype=float)
    return 2 * (p - 1), 2 * (p - 1) / p * m


def p2p_terms(message_bytes):
    """(alpha, beta) coefficients of a point-to-point transfer of M bytes: 1 and M."""
    m = np.asarray(message_bytes, dtype=float)
    return np.ones_like(m), m


def fit_f_peak(work_per_device, eta_values, memory_ceiling, seconds) -> ScaleFit:
    """F_peak minimising sum (log t_pred - log t)^2, t_pred = W / min(F_peak * eta, I * BW_mem).

    `memory_ceiling` is I * BW_mem per point (FLOP/s); a point that stays memory-bound for every
    candidate F_peak carries no information about it and does not move the fit.
    """
    w = np.asarray(work_per_device, dtype=float)
    e = np.asarray(eta_values, dtype=float)
    c = np.asarray(memory_ceiling, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if not (w.shape == e.shape == c.shape == t.shape) or t.size < 1:
        raise RpegError(None, "the F_peak fit needs at least one forward with work, eta, ceiling and time")
    if np.any(t <= 0) or np.any(w <= 0) or np.any(e <= 0):
        raise RpegError(None, "forward timings, work and eta must be positive")
    direct = w / (t * e)  # F_peak each point implies when compute-bound
    lo, hi = math.log(direct.min() / 10.0), math.log(direct.max() * 10.0)

    def sse(log_f: np.ndarray) -> np.ndarray:
        f = np.exp(log_f)[:, None]
        predicted = w[None, :] / np.minimum(f * e[None, :], c[None, :])
        return ((np.log(predicted) - np.log(t)[None, :]) ** 2).sum(axis=1)

    grid = np.linspace(lo, hi, 400)
    for _ in range(3):
        i = int(np.argmin(sse(grid)))
        step = grid[1] - grid[0]
        grid = np.linspace(grid[i] - step, grid[i] + step, 200)
    best = float(np.exp(grid[int(np.argmin(sse(grid)))]))
    predicted = w / np.minimum(best * e, c)
    return ScaleFit(best, mape(predicted, t), int(t.size))


# ---------------------------------------------------------------------------------------------------
# What to sweep


@dataclass(frozen=True)
class ForwardCase:
    """One forward timing of the backend's model: `batch` x `seq` new tokens after `context` cached
    positions (context 0: a teacher-forced forward, as in prefill and inference; seq 1 with a context:
    one decode step with the KV cache)."""

    name: str
    arch: Arch
    batch: int
    seq: int
    context: int = 0

    @property
    def rows(self) -> int:
        """GEMM rows of the model's eta (spec 3.2): b_loc * ell, with ell = 1 for a decode step."""
        return self.batch * self.seq

    @property
    def width(self) -> int:
        """Local GEMM width k = min(d, d_ff) (one device, no TP)."""
        return min(self.arch.hidden, self.arch.ffn)

    def work(self) -> float:
        """The model's FLOPs of this forward: a teacher-forced forward over `seq` tokens, or one decode step at
        context + 1 (spec 2)."""
        if self.context == 0:
            return float(self.batch * forward_flops_per_sequence(self.arch, "policy", self.seq))
        return float(self.batch * decode_flops_per_rollout(self.arch, self.context, 2))


@dataclass(frozen=True)
class SweepPlan:
    """The measurement campaign. `cpu_plan`/`gpu_plan` give the defaults; `quick` a tiny smoke version."""

    dtype: str  # Workload dtype of what is measured ("fp32" on CPU, "bf16" on GPUs)
    eta_from: str  # "layers": F_peak, gamma_M, gamma_K from forwards of the backend's layers; "gemm": the
    # gammas from isolated GEMMs and F_peak from the forwards (the paper's split)
    copy_bytes: tuple[int, ...]
    gemm_rows: tuple[int, ...]
    gemm_widths: tuple[int, ...]
    gemm_full: int  # the unsharded GEMM dimension (hidden size of the swept layer)
    forwards: tuple[ForwardCase, ...]
    B_cal: int
    ng_seq: int
    ng_hidden: int
    message_bytes: tuple[int, ...]
    min_time: float  # seconds per timed repeat of a short kernel
    repeats: int
    # Passes over the forward and link sweeps; a point pools its repeats of every pass, so a burst of
    # load from other processes lands on a few of its samples, not all.
    rounds: int = 3
    statistic: str = "median"  # of a link point's pooled repeats: "median" or "min" (STATISTICS)
    kernel_statistic: str = "median"  # of a copy's, a forward's and the non-GEMM layer's repeats (STATISTICS)
    link_gap_s: float = 0.0  # compute before every message of the link sweeps (`_Gap`); 0 = back to back
    link_iterations: int = 200  # most messages per timed repeat of a link point (`link_iterations`)
    probe_runs: int = 3  # speed probes after the campaign, in a fresh process (the fastest is kept; CPU only)
    # One layer's RoPE rotations timed for the [compute] rope_* terms: (batch, seq, heads, kv_heads, head_dim) of its
    # queries and keys (`_measure_rope`); none: the profile leaves them out (not priced).
    rope_shapes: tuple[tuple[int, int, int, int, int], ...] = ()
    # The attention kernel timed per row and query head for the [attention] table (`_measure_attention`): at 1 ..
    # `attention_positions` positions, head size ATTENTION_HEAD_DIM; 0: the profile leaves it out (priced by FLOPs)
    attention_positions: int = 0


def _geometric(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= factor
    return tuple(out)


ETA_SOURCES = ("layers", "gemm")
def slowest_rank(per_rank: Sequence[Optional[Sequence[float]]]) -> list[float]:
    """Per repeat, the slowest busy rank (idle ranks return None): what a collective operation takes."""
    return [max(xs) for xs in zip(*[r for r in per_rank if r is not None])]

# Two-layer models of the torch backend's family (hidden 64 and 128 like its tiny presets, 256, 512; gated
# SwiGLU FFNs like them, so the fit's work W counts the gate projection the forwards compute), timed on
# prefill-shaped forwards and on decode steps with the KV cache: the shapes generation, inference and
# training run.
CPU_LAYER_ARCHS = {
    "d64": Arch(layers=2, hidden=64, ffn=256, vocab=64, heads=4, kv_heads=4, gated=True),
    "d128": Arch(layers=2, hidden=128, ffn=512, vocab=64, heads=4, kv_heads=4, gated=True),
    "d256": Arch(layers=2, hidden=256, ffn=1024, vocab=256, heads=8, kv_heads=8, gated=True),
    "d512": Arch(layers=2, hidden=512, ffn=2048, vocab=256, heads=8, kv_heads=8, gated=True),
}
CPU_PREFILL_SHAPES = ((1, 32), (4, 32), (16, 32), (8, 128))  # (batch, seq)
CPU_DECODE_BATCHES = (1, 4, 16, 64)
CPU_DECODE_CONTEXT = 48
# Compute between two messages of the CPU link sweeps: the backend's tiny TP decode computes a median
# 0.54 ms between two megatron AllReduces (measured), so the sweeps send at that granularity (`_Gap`).
# On this project's VM an AllReduce costs 0.39 ms back to back, 0.75 ms after 0.2 ms of compute and
# 1.2 ms after 0.5-1 ms (measured): it saturates there. GPU sweeps send back to back:
# NCCL progresses on the device, and host compute would not model a GPU kernel anyway.
CPU_LINK_GAP_S = 5e-4
# The [attention] table's head size and calls: the head size of the overheads' models (tools/overhead_timing.py) and
# of the demo's, ATTENTION_ROWS rows of ATTENTION_HEADS heads per call (the time per row and head holds within ~5 %
# from 256 row-heads up on the 2-core VM, ~25 % more at 64), each point a loop of ATTENTION_MIN_TIME s (32 lengths x 3
# calls x 3 repeats, ~2 s)
ATTENTION_HEAD_DIM = 16
ATTENTION_ROWS, ATTENTION_HEADS = 64, 4
ATTENTION_MIN_TIME = 0.004
CPU_ATTENTION_POSITIONS = 32  # the demo's rows run 10-16 positions, the overheads' grid 8-24
# The rotations of the CPU backend's small models' heads (head_dim 16; grouped-query keys too) over decode steps and
# prefill-shaped calls: 96 to 131k elements of queries and keys, whose tensors stay in a core's cache as the
# operators' do (with head_dim 32 the largest point's queries, 512 KiB, took 2-5x as long per element).
CPU_ROPE_SHAPES = tuple((b, t, h, kv, hd) for h, kv, hd in ((4, 4, 16), (4, 2, 16))
                        for b, t in ((1, 1), (16, 1), (64, 1), (4, 32), (16, 16), (64, 16)))


def _layer_forwards(archs: dict[str, Arch], prefill, decode, context: int) -> tuple[ForwardCase, ...]:
    out = []
    for name, arch in archs.items():
        out += [ForwardCase(f"{name} fwd b{b} s{t}", arch, b, t) for b, t in prefill]
        out += [ForwardCase(f"{name} dec b{b} c{context}", arch, b, 1, context) for b in decode]
    return tuple(out)


def cpu_plan(quick: bool = False, eta_from: str = "layers") -> SweepPlan:
    if quick:
        two = {k: CPU_LAYER_ARCHS[k] for k in ("d64", "d128")}  # two widths, so gamma_K is identifiable
        forwards = _layer_forwards(two, ((2, 16), (8, 16)), (1, 8), 16)
        return SweepPlan("fp32", eta_from, (1 << 22,), (1, 16, 256), (16, 128), 128, forwards, 8, 32, 128,
                         (1 << 10, 1 << 16, 1 << 20), 0.004, 2, rounds=1, link_gap_s=CPU_LINK_GAP_S, probe_runs=1,
                         rope_shapes=((1, 1, 4, 4, 16), (16, 16, 4, 4, 16)), attention_positions=4)
    forwards = _layer_forwards(CPU_LAYER_ARCHS, CPU_PREFILL_SHAPES, CPU_DECODE_BATCHES, CPU_DECODE_CONTEXT)
    return SweepPlan(
        dtype="fp32",
        eta_from=eta_from,
        copy_bytes=(1 << 24, 1 << 26, 1 << 27),
        gemm_rows=_geometric(1, 2048),
        gemm_widths=_geometric(8, 512),
        gemm_full=256,
        forwards=forwards,
        B_cal=8,
        ng_seq=64,
        ng_hidden=128,
        message_bytes=_geometric(1 << 8, 1 << 24, 4),
        min_time=0.02,
        repeats=5,
        link_gap_s=CPU_LINK_GAP_S,
        rounds=5,  # a shared VM's speed drifts over minutes: five passes pool more of it
        rope_shapes=CPU_ROPE_SHAPES,
        attention_positions=CPU_ATTENTION_POSITIONS,
    )


def machine_plan(eta_from: str = "layers") -> SweepPlan:
    """`rpeg-calibrate --machine` (what `hardware = "cpu"` runs on first use, core/cost/machine.py): the CPU
    campaign's forwards (every width and shape: fewer made the fit 17 points of validation MAPE worse) in fewer
    passes and shorter repeats, one copy size, fewer and shorter link points (48 messages at most per repeat: 200 took
    28 of the 55 s; five sizes, a factor 16 apart below 1 MiB, 7 s where eight a factor 4 apart took 9.7 and fitted
    alpha and beta as far apart as their own repeats: docs/calibration.md), 45-90 s on 2 cores (the machine's
    moment); the full campaign stays for validation.

    The kernels keep their fastest repeat: this VM's cores switch between two speeds ~1.5x apart for seconds at a
    time, and a minute's campaign with the median caught one or the other per point, so five calibrations back to
    back priced the same plan 1.56x apart (with the fastest: 1.09x; docs/calibration.md, "Two speeds"). The
    operators beyond their kernels keep their fastest repeat too (`overhead_timing`, fitted against the kernels as they
    ran beside them: with medians, three profiles of four in a slow quarter hour fitted the training call at 10-11 ms
    against 5.5 and priced the 2-worker GRPO at 0.67-0.90x its runs). The links keep medians: their fastest repeat
    misses gloo's timer stalls (STATISTICS)."""
    return dataclasses.replace(cpu_plan(eta_from=eta_from), copy_bytes=(1 << 26,),
                               message_bytes=(1 << 8, 1 << 12, 1 << 16, 1 << 20, 1 << 22), min_time=0.01, repeats=3,
                               rounds=2, kernel_statistic="min", link_iterations=48)


def gpu_plan(quick: bool = False, eta_from: str = "layers") -> SweepPlan:
    big = Arch(layers=2, hidden=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32, gated=True)
    mid = Arch(layers=2, hidden=2048, ffn=5632, vocab=32000, heads=16, kv_heads=16, gated=True)
    if quick:
        return SweepPlan("bf16", eta_from, (1 << 28,), (16, 1024, 8192), (256, 4096), 4096,
                         _layer_forwards({"4k": big}, ((4, 512),), (8,), 512), 8, 512, 4096,
                         (1 << 12, 1 << 20, 1 << 26), 0.01, 2, rounds=1)
    forwards = _layer_forwards({"4k": big, "2k": mid}, ((1, 512), (4, 512), (8, 2048)), (1, 8, 64, 256), 1024)
    rope = tuple((b, t, 32, kv, 128) for kv in (32, 8) for b, t in ((1, 1), (64, 1), (256, 1), (4, 512), (8, 2048)))
    return SweepPlan("bf16", eta_from, (1 << 28, 1 << 30), _geometric(16, 16384), _geometric(128, 16384), 8192,
                     forwards, 8, 1024, 4096, _geometric(1 << 12, 1 << 28, 4), 0.05, 5, rope_shapes=rope)


# ---------------------------------------------------------------------------------------------------
# Measurements (run on every worker; idle ranks return None)


_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def _measure_copy(ctx, nbytes: int, dtype: str, min_time: float, repeats: int):
    if ctx.rank != 0:
        return None
    import torch

    elems = nbytes // torch.tensor([], dtype=_dtype(dtype)).element_size()
    src = torch.randn(elems, device=ctx.device).to(_dtype(dtype))
    dst = torch.empty_like(src)
    timing = time_per_call(lambda: dst.copy_(src), min_time=min_time, repeats=repeats, sync=ctx.sync)
    return 2 * src.numel() * src.element_size(), timing.samples  # read + write


def _measure_gemm(ctx, rows: int, width: int, full: int, dtype: str, min_time: float, repeats: int):
    """Seconds (repeats) of the column-parallel [rows, full] @ [full, width] and the row-parallel
    [rows, width] @ [width, full] GEMMs (the two local GEMM shapes of a TP-sharded layer)."""
    if ctx.rank != 0:
        return None
    import torch

    dt = _dtype(dtype)
    x_col = torch.randn(rows, full, device=ctx.device).to(dt)
    w_col = torch.randn(full, width, device=ctx.device).to(dt)
    x_row = torch.randn(rows, width, device=ctx.device).to(dt)
    w_row = torch.randn(width, full, device=ctx.device).to(dt)
    with torch.no_grad():
        col = time_per_call(lambda: torch.matmul(x_col, w_col), min_time=min_time, repeats=repeats, sync=ctx.sync)
        row = time_per_call(lambda: torch.matmul(x_row, w_row), min_time=min_time, repeats=repeats, sync=ctx.sync)
    return col.samples, row.samples


def _measure_forward(ctx, case: ForwardCase, dtype: str, min_time: float, repeats: int, busy: int = 1):
    """Seconds of one forward of the backend's model: teacher-forced over [batch, seq] tokens, or (with a
    context) one decode step of `seq` tokens after `context` cached positions. Ranks 0..busy-1 run it
    at the same time (a device's throughput while its neighbours compute too)."""
    if ctx.rank >= busy:
        return None
    import torch

    from rpegc.runtime.backends.torch.model.transformer import NetOptions, arch_net, build_model

    # Learned positions, as the torch backend builds its models (backend.run_config). The model code
    # creates some tensors (the attention mask) without a device: the default-device context puts them
    # on the worker's device.
    net = NetOptions(max_seq=case.context + case.seq, positions=BACKEND_POSITIONS)
    with torch.device(ctx.device), torch.no_grad():
        model = build_model(case.arch, "policy", seed=0, opts=arch_net(case.arch, net)).to(ctx.device, _dtype(dtype))
        model.eval()
        tokens = torch.randint(0, case.arch.vocab, (case.batch, case.seq), device=ctx.device)
        cache = model.new_cache(case.batch, case.context + case.seq) if case.context else None

        def forward() -> None:
            if cache is not None:
                cache.length = case.context  # every call is the same decode step
            model(tokens, cache)

        forward()  # warm before the start line, so the busy ranks overlap
        if busy > 1:
            ctx.barrier(range(busy))
        # One call per sample, as an operator calls the model once per microbatch (or decode step)
        # among other work: a tight loop of calls keeps caches hotter than any operator sees them.
        timing = time_repeats(forward, repeats, warmup=1, sync=ctx.sync)
    return timing.samples


def _measure_non_gemm(ctx, batch: int, seq: int, hidden: int, dtype: str, min_time: float, repeats: int):
    """Seconds of the non-GEMM kernels a TP rank runs on the full hidden state in one layer: the
    attention and MLP RMSNorms and the two residual adds (the backend's own modules)."""
    if ctx.rank != 0:
        return None
    import torch

    from rpegc.runtime.backends.torch.model.transformer import RMSNorm

    dt = _dtype(dtype)
    norm_a = RMSNorm(hidden, 1e-6).to(ctx.device, dt)
    norm_m = RMSNorm(hidden, 1e-6).to(ctx.device, dt)
    x = torch.randn(batch, seq, hidden, device=ctx.device).to(dt)
    branch = torch.randn_like(x)

    def layer() -> None:
        h = norm_a(x)
        y = x + branch  # attention output joins the residual stream
        h = norm_m(y)
        y + h  # MLP output joins the residual stream

    with torch.no_grad():
        return time_per_call(layer, min_time=min_time, repeats=repeats, sync=ctx.sync).samples


def _measure_rope(ctx, batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, dtype: str, min_time: float,
                  repeats: int):
    """Seconds of one layer's RoPE rotation of its queries [batch, heads, seq, head_dim] and keys (kv_heads), the
    backend's own functions on the attention's layout (the tables at the call's positions, then both rotations): the
    forward, and the forward with its backward (the gradients of queries and keys from given ones, as a layer's
    backward passes them on)."""
    if ctx.rank != 0:
        return None
    import torch

    from rpegc.runtime.backends.torch.model.transformer import apply_rope, positioned_rope, rope_tables

    dt = _dtype(dtype)
    cos, sin = (x.to(ctx.device, dt) for x in rope_tables(seq, head_dim, 10000.0))
    positions = torch.arange(seq, device=ctx.device)
    # laid out as the attention's projections give them: [batch, seq, heads, head_dim] seen as [batch, heads, seq, ...]
    q = torch.randn(batch, seq, heads, head_dim, device=ctx.device).to(dt).requires_grad_()
    k = torch.randn(batch, seq, kv_heads, head_dim, device=ctx.device).to(dt).requires_grad_()
    grads = tuple(torch.randn(batch, n, seq, head_dim, device=ctx.device).to(dt) for n in (heads, kv_heads))

    def forward():
        c, s = positioned_rope(cos, sin, positions)
        return apply_rope(q.transpose(1, 2), c, s), apply_rope(k.transpose(1, 2), c, s)

    def forward_backward() -> None:
        torch.autograd.grad(forward(), (q, k), grads)

    with torch.no_grad():
        ahead = time_per_call(forward, min_time=min_time, repeats=repeats, sync=ctx.sync).samples
    both = time_per_call(forward_backward, min_time=min_time, repeats=repeats, sync=ctx.sync).samples
    return ahead, both


def _measure_attention(ctx, positions: int, dtype: str, min_time: float, repeats: int):
    """Seconds per row and query head of one attention call at 1 .. `positions` positions, as the backend's layer calls
    it (transformer.Attention: the projections' [rows, positions, heads, head size] seen as [rows, heads, ...], its
    boolean mask): a forward over as many queries and keys, that forward's backward (the forward with its backward,
    less the forward), and a decode step's one query over as many cached keys. Per length, (forward, backward, decode)
    lists of repeats."""
    if ctx.rank != 0:
        return None
    import torch
    import torch.nn.functional as F

    from rpegc.runtime.backends.torch.model.transformer import attention_mask

    dt, b, h, hd = _dtype(dtype), ATTENTION_ROWS, ATTENTION_HEADS, ATTENTION_HEAD_DIM
    per = 1.0 / (b * h)

    def projected(n: int, grad: bool = False):
        return torch.randn(b, n, h, hd, device=ctx.device).to(dt).requires_grad_(grad).transpose(1, 2)

    out = []
    for n in range(1, positions + 1):
        mask = attention_mask(None, 0, n, ctx.device)
        q, k, v = (projected(n, grad=True) for _ in range(3))
        upstream = torch.randn(b, h, n, hd, device=ctx.device).to(dt)
        cache = torch.zeros(2, b, h, n + 1, hd, device=ctx.device).to(dt)  # a decode step's keys and values
        one, last = projected(1), attention_mask(None, n - 1, 1, ctx.device)

        def forward():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        def forward_backward() -> None:
            torch.autograd.grad(forward(), (q, k, v), upstream)

        def decode():
            return F.scaled_dot_product_attention(one, cache[0, :, :, :n], cache[1, :, :, :n], attn_mask=last)

        with torch.no_grad():
            ahead = time_per_call(forward, min_time=min_time, repeats=repeats, sync=ctx.sync).samples
            step = time_per_call(decode, min_time=min_time, repeats=repeats, sync=ctx.sync).samples
        both = time_per_call(forward_backward, min_time=min_time, repeats=repeats, sync=ctx.sync).samples
        out.append(([t * per for t in ahead], [t * per for t in both], [t * per for t in step]))
    return out


def link_iterations(plan: SweepPlan, nbytes: int) -> int:
    """Messages per timed repeat of a link point, the same on every rank (collectives must match): more of small
    ones, up to `plan.link_iterations`, about 64 of the largest."""
    return int(min(plan.link_iterations, max(3, 64 * max(plan.message_bytes) // max(nbytes, 1))))


class _Gap:
    """About `seconds` of compute on the worker's device between two messages of a link sweep.

    The backend never sends back to back: a TP AllReduce follows half a layer, a pipeline transfer a
    stage's forward. Where the transport needs a thread woken on a core that computes (gloo on CPU
    workers), a message after compute costs more than one after another message -- on this project's
    VM 2-3x, from scheduler stalls -- so the sweeps time messages the way the backend sends them and
    subtract the compute. The compute is timed as it runs (`spent`), not once alone: this VM's cores switch
    between two speeds ~1.5x apart for seconds at a time (docs/calibration.md, "Two speeds"), and a gap timed
    alone at the fast speed and subtracted from a sweep at the slow one left some send/recv points at zero,
    which fitted p2p alpha = 0. CPU only: a CUDA gap would be asynchronous (the GPU sweeps have none).
    """

    def __init__(self, ctx, seconds: float):
        import torch

        self.calls = 0
        self.spent = 0.0  # seconds of compute in every call so far
        if seconds <= 0:
            return
        self._x = torch.randn(64, 256, device=ctx.device)
        self._w = torch.randn(256, 256, device=ctx.device)
        one = time_per_call(self._matmul, min_time=0.01, repeats=3, sync=ctx.sync).median
        self.calls = max(1, round(seconds / max(one, 1e-9)))

    def _matmul(self) -> None:
        self._x @ self._w

    def __call__(self) -> None:
        if not self.calls:
            return
        start = time.perf_counter()
        for _ in range(self.calls):
            self._matmul()
        self.spent += time.perf_counter() - start


def _message_buffer(ctx, nbytes: int, dtype: str):
    """A buffer of `nbytes` (at least one element) on the worker's device."""
    import torch

    dt = _dtype(dtype)
    return torch.ones(max(1, nbytes // torch.tensor([], dtype=dt).element_size()), dtype=dt, device=ctx.device)


def _seconds_per_iteration(ctx, ranks: list[int], repeats: int, iters: int, body: Callable[[], None], gap: _Gap,
                           gaps_in_turn: bool) -> list[float]:
    """Per repeat, the mean seconds of `iters` calls of `body`, started together on `ranks`, less the compute of the
    gaps in them: the slowest rank's (a collective waits for every rank) or, `gaps_in_turn`, every rank's (a ping-pong
    runs them one after another)."""
    import torch
    import torch.distributed as dist

    samples = []
    for _ in range(repeats):
        ctx.barrier(ranks)
        before = gap.spent
        t0 = time.perf_counter()
        for _ in range(iters):
            body()
        ctx.sync()
        elapsed = time.perf_counter() - t0
        spent = torch.tensor([gap.spent - before], dtype=torch.float64, device=ctx.device)
        if gap.calls:  # every rank has gaps or none (one gap_s); back-to-back sweeps (the GPUs') exchange nothing
            dist.all_reduce(spent, op=dist.ReduceOp.SUM if gaps_in_turn else dist.ReduceOp.MAX, group=ctx.group(ranks))
        samples.append(max(elapsed - float(spent), 1e-9 * iters) / iters)
    return samples


def _measure_allreduce(ctx, participants: int, nbytes: int, dtype: str, repeats: int, iters: int,
                       gap_s: float = 0.0):
    """Seconds per AllReduce of an `nbytes` per-rank buffer over ranks 0..participants-1, each after
    `gap_s` of compute on every rank (the compute subtracted; see `_Gap`)."""
    import torch.distributed as dist

    ranks = list(range(participants))
    group = ctx.group(ranks)
    if ctx.rank not in ranks:
        return None
    buf = _message_buffer(ctx, nbytes, dtype)
    gap = _Gap(ctx, gap_s)
    dist.all_reduce(buf, group=group)  # warm-up: connection setup and buffers

    def step() -> None:
        gap()
        dist.all_reduce(buf, group=group)

    return tuple(_seconds_per_iteration(ctx, ranks, repeats, iters, step, gap, gaps_in_turn=False))


def _measure_p2p(ctx, nbytes: int, dtype: str, repeats: int, iters: int, gap_s: float = 0.0):
    """One-way seconds of a send/recv of `nbytes` between ranks 0 and 1 (half a ping-pong round trip),
    each send after `gap_s` of compute on the sender (the compute subtracted; see `_Gap`)."""
    import torch.distributed as dist

    ranks = [0, 1]
    group = ctx.group(ranks)
    if ctx.rank not in ranks:
        return None
    buf = _message_buffer(ctx, nbytes, dtype)
    peer = 1 - ctx.rank
    gap = _Gap(ctx, gap_s)

    def ping_pong() -> None:
        if ctx.rank == 0:
            gap()
            dist.send(buf, peer, group=group)
            dist.recv(buf, peer, group=group)
        else:
            dist.recv(buf, peer, group=group)
            gap()
            dist.send(buf, peer, group=group)

    ping_pong()
    times = _seconds_per_iteration(ctx, ranks, repeats, iters, ping_pong, gap, gaps_in_turn=True)
    return tuple(t / 2 for t in times)


# ---------------------------------------------------------------------------------------------------
# The campaign


@dataclass(frozen=True)
class CoRunning:
    """`[overhead] co_run` as the campaign measured it (`_co_running`)."""

    value: float
    forwards: int
    busy: int  # workers computing at once


@dataclass(frozen=True)
class RopeFits:
    """[compute] rope_*: seconds = call + element * (rotated query and key elements) of one layer's RoPE rotations,
    fitted over the plan's `rope_shapes` (relative error): the forward's, and the forward's with its backward (the
    backward's terms are the difference of the two fits: per point, the two timings' difference was noise-dominated
    where the forward's tensors left the cache)."""

    forward: LinkFit  # alpha: s per call, beta: s per element
    with_backward: LinkFit

    @property
    def backward(self) -> tuple[float, float]:
        """(s per call, s per element) of the backward alone."""
        return (max(self.with_backward.alpha - self.forward.alpha, 0.0),
                max(self.with_backward.beta - self.forward.beta, 0.0))


@dataclass
class Calibration:
    """Everything the campaign found: the profile's values, the fits behind them and the raw points."""

    name: str
    devices: int
    backend: str
    plan: SweepPlan
    BW_mem: float = 0.0
    eta_fit: Optional[EtaFit] = None
    f_peak_fit: Optional[ScaleFit] = None
    c_ng: float = 0.0
    coll_fit: Optional[LinkFit] = None
    p2p_fit: Optional[LinkFit] = None
    M_GPU: float = 0.0
    memory_source: str = ""
    memory_bound: int = 0  # forwards the fitted roofline calls memory-bound
    concurrent: bool = False  # forwards timed on every device at once
    raw: list[tuple[str, str, float, float]] = field(default_factory=list)  # (kind, point, x, seconds)
    forwards: list[tuple[ForwardCase, float]] = field(default_factory=list)  # each forward's seconds (kernel statistic)
    date: str = ""
    links_from: Optional[Hardware] = None  # where the link terms were copied from instead of measured
    speed_probe_s: Optional[float] = None  # runtime/speed_probe.py's probe after the campaign (CPU workers)
    # The narrow forwards' time beside the operators over their campaign time (`kernel_check`): F_peak and t_layer are
    # brought to the operators' moment and condition by it, so a profile's compute terms price one of each.
    kernel_scale: float = 1.0
    co_run: Optional[CoRunning] = None  # the narrow forwards beside every core busy against alone (`_co_running`)
    rope: Optional[RopeFits] = None  # one layer's RoPE rotations (`_rope_campaign`); None: not measured
    attention: Optional[AttentionTable] = None  # the attention kernel per row and head (`_attention_campaign`)

    @property
    def world(self) -> int:
        """Worker processes of the campaign: two at least when the links are measured."""
        return self.devices if self.links_from is not None else max(self.devices, 2)

    def hardware(self) -> Hardware:
        """The calibrated profile as the cost model reads it."""
        return Hardware.from_dict(profile_mapping(self), source=f"<calibration {self.name}>")


def _steps(plan: SweepPlan, world: int) -> int:
    coll_points = (world - 1) * len(plan.message_bytes) if world > 1 else 0
    p2p_points = len(plan.message_bytes) if world > 1 else 0
    gemm_points = len(plan.gemm_rows) * len(plan.gemm_widths) if plan.eta_from == "gemm" else 0
    rounds = plan.rounds * (len(plan.forwards) + coll_points + p2p_points)
    return len(plan.copy_bytes) + gemm_points + 1 + bool(plan.rope_shapes) + bool(plan.attention_positions) + rounds


def calibrate(devices: int, backend: str, plan: SweepPlan, *, name: str = "cpu", quiet: bool = False,
              concurrent: bool = False, pool_factory: Callable[[int, str], WorkerPool] = WorkerPool,
              links_from: Optional[Hardware] = None) -> Calibration:
    """Run the campaign on `devices` workers (at least 2, so links can be measured) and fit everything.

    `concurrent` times the forwards on every device at once: the ceiling of a device whose neighbours
    are busy too (devices that share cores, caches or memory bandwidth), instead of one device alone.
    `links_from` copies the collective and point-to-point terms from that profile instead of measuring
    them (one CUDA device reaches no link; NCCL cannot put two ranks on one GPU).
    """
    if backend == "nccl" and devices < 2 and links_from is None:
        raise RpegError(None, "one CUDA device reaches no link to measure; pass --links-from PROFILE (e.g. h200) "
                              "to take the collective and p2p terms from a profile, or use 2 or more devices")
    cal = Calibration(name=name, devices=devices, backend=backend, plan=plan, concurrent=concurrent,
                      date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), links_from=links_from)
    progress = Progress(_steps(plan, cal.world if links_from is None else 1), quiet)
    try:
        with pool_factory(cal.world, backend) as pool:
            _compute_campaign(pool, plan, cal, progress)
            if links_from is None:
                _link_campaign(pool, plan, cal, cal.world, progress)
            else:
                cal.coll_fit, cal.p2p_fit = copied_links(links_from)
    finally:
        progress.close()
    cal.M_GPU, cal.memory_source = _device_memory(backend, devices)
    if backend == "gloo":  # the machine's speed as it was calibrated, for rpeg-run to compare with its own
        cal.speed_probe_s = fresh_probe_seconds(plan.probe_runs)
    return cal


def _compute_campaign(pool: WorkerPool, plan: SweepPlan, cal: Calibration, progress: Progress) -> None:
    busy = cal.devices if cal.concurrent else 1
    copies = []
    for nbytes in plan.copy_bytes:
        moved, samples = pool.run(_measure_copy, nbytes, plan.dtype, plan.min_time, plan.repeats)[0]
        seconds = summarize(samples, plan.kernel_statistic)
        copies.append(moved / seconds)
        cal.raw.append(("copy", f"{nbytes} B buffer", moved, seconds))
        progress.step(f"memory copy {nbytes >> 20} MiB")
    # The largest buffer is the one that leaves the caches: the "HBM" figure of the model.
    cal.BW_mem = copies[-1]

    s_b = Workload(1, 1, 1, 1, plan.dtype).s_b
    pooled: dict[int, list[float]] = {i: [] for i in range(len(plan.forwards))}
    for round_ in range(plan.rounds):
        for i, case in enumerate(plan.forwards):
            pooled[i] += slowest_rank(pool.run(_measure_forward, case, plan.dtype, plan.min_time, plan.repeats, busy))
            progress.step(f"forward {case.name} ({round_ + 1}/{plan.rounds})")
    forwards = [(case, summarize(pooled[i], plan.kernel_statistic)) for i, case in enumerate(plan.forwards)]
    cal.forwards = forwards
    cal.raw += [("forward", case.name, case.work(), seconds) for case, seconds in forwards]
    if plan.eta_from == "layers":
        cal.eta_fit = fit_eta_overhead([c.rows for c, _ in forwards], [c.width for c, _ in forwards],
                                       [c.work() for c, _ in forwards], [c.arch.layers for c, _ in forwards],
                                       [t for _, t in forwards])
        cal.f_peak_fit = ScaleFit(cal.eta_fit.scale, cal.eta_fit.mape, cal.eta_fit.points)
    else:
        cal.eta_fit = _gemm_sweep(pool, plan, cal, progress)
        terms = [roofline_terms(c, s_b, cal.eta_fit.gamma_M, cal.eta_fit.gamma_K, cal.BW_mem) for c, _ in forwards]
        cal.f_peak_fit = fit_f_peak([w for w, _, _ in terms], [e for _, e, _ in terms], [m for _, _, m in terms],
                                    [t for _, t in forwards])
    for case, _ in forwards:
        _, e, ceiling = roofline_terms(case, s_b, cal.eta_fit.gamma_M, cal.eta_fit.gamma_K, cal.BW_mem)
        cal.memory_bound += ceiling < cal.f_peak_fit.value * e

    cal.c_ng = summarize(pool.run(_measure_non_gemm, plan.B_cal, plan.ng_seq, plan.ng_hidden, plan.dtype,
                                  plan.min_time, plan.repeats)[0], plan.kernel_statistic)
    cal.raw.append(("non_gemm", f"b={plan.B_cal} seq={plan.ng_seq} d={plan.ng_hidden}", 0.0, cal.c_ng))
    progress.step("non-GEMM layer")
    if plan.rope_shapes:
        cal.rope = _rope_campaign(pool, plan)
        progress.step("RoPE rotations")
    if plan.attention_positions:
        cal.attention = _attention_campaign(pool, plan)
        progress.step("attention")
    if cal.concurrent and cal.devices > 1:
        cal.co_run = _co_running(pool, plan, cal.devices)


def _rope_campaign(pool: WorkerPool, plan: SweepPlan) -> RopeFits:
    """`RopeFits` of one worker's timings of `plan.rope_shapes` (the kernel statistic of each point's repeats)."""
    elements, ahead, both = [], [], []
    for b, t, h, kv, hd in plan.rope_shapes:
        fwd, fwd_bwd = pool.run(_measure_rope, b, t, h, kv, hd, plan.dtype, plan.min_time, plan.repeats)[0]
        elements.append(float(b * t * rotated_per_token(h, kv, hd)))
        ahead.append(summarize(fwd, plan.kernel_statistic))
        both.append(summarize(fwd_bwd, plan.kernel_statistic))
    ones = [1.0] * len(elements)
    return RopeFits(fit_alpha_beta(ones, elements, ahead), fit_alpha_beta(ones, elements, both))


def _attention_campaign(pool: WorkerPool, plan: SweepPlan) -> AttentionTable:
    """The [attention] table of one worker's timings (the kernel statistic of each point's repeats; a backward is the
    forward with its backward less the forward, never below 0)."""
    points = pool.run(_measure_attention, plan.attention_positions, plan.dtype, ATTENTION_MIN_TIME, plan.repeats)[0]
    stat = plan.kernel_statistic
    forward = tuple(summarize(f, stat) for f, _, _ in points)
    backward = tuple(max(summarize(fb, stat) - fw, 0.0) for (_, fb, _), fw in zip(points, forward))
    return AttentionTable(ATTENTION_HEAD_DIM, forward, backward, tuple(summarize(d, stat) for _, _, d in points))


CO_RUN_ROUNDS = 2  # alone and beside, alternated


def _co_running(pool: WorkerPool, plan: SweepPlan, busy: int) -> CoRunning:
    """What a forward's time grows by where every other core computes one too (`[overhead] co_run`): the narrow
    forwards (`CHECK_WIDTH`, the operators' sizes) on the first worker alone and on `busy` workers at once, alternated
    so both see one moment; per forward the first worker's statistic beside over alone (not the slowest rank's: that
    would add the wait for the slower, which siblings have and operators of different vertices do not), the median
    over forwards, less 1."""
    narrow = [case for case in plan.forwards if case.width <= CHECK_WIDTH]
    alone: dict[int, list[float]] = {i: [] for i in range(len(narrow))}
    beside: dict[int, list[float]] = {i: [] for i in range(len(narrow))}
    for _ in range(CO_RUN_ROUNDS):
        for i, case in enumerate(narrow):
            alone[i] += pool.run(_measure_forward, case, plan.dtype, plan.min_time, plan.repeats, 1)[0]
            beside[i] += pool.run(_measure_forward, case, plan.dtype, plan.min_time, plan.repeats, busy)[0]
    ratios = [summarize(beside[i], plan.kernel_statistic) / summarize(alone[i], plan.kernel_statistic)
              for i in range(len(narrow))]
    return CoRunning(max(0.0, float(np.median(ratios)) - 1.0), len(narrow), busy)


CHECK_WIDTH = 128  # the campaign's forwards the operators' overheads time again: as narrow as their models (64, 96)


def kernel_check(cal: Calibration) -> Optional[KernelCheck]:
    """The campaign's narrow forwards, to time again beside the operators (`overhead_timing.operator_overheads`): on
    one worker alone, as the operators run, so the scale holds the campaign's condition (every device busy) as well
    as its moment. None where the campaign timed none."""
    narrow = tuple((case, seconds) for case, seconds in cal.forwards if case.width <= CHECK_WIDTH)
    return KernelCheck(narrow, cal.plan.kernel_statistic, cal.plan.dtype, _measure_forward,
                       co_run=cal.co_run) if narrow else None


def _gemm_sweep(pool: WorkerPool, plan: SweepPlan, cal: Calibration, progress: Progress) -> EtaFit:
    """The paper's GEMM-shape sweep: both local GEMMs of a TP-sharded layer at every (rows, k)."""
    rows, widths, flops = [], [], []
    for r in plan.gemm_rows:
        for k in plan.gemm_widths:
            col, row = pool.run(_measure_gemm, r, k, plan.gemm_full, plan.dtype, plan.min_time, plan.repeats)[0]
            work = 2.0 * r * k * plan.gemm_full
            for orientation, samples in (("col", col), ("row", row)):
                seconds = summarize(samples, plan.kernel_statistic)
                rows.append(r)
                widths.append(k)
                flops.append(work / seconds)
                cal.raw.append((f"gemm_{orientation}", f"rows={r} k={k} n={plan.gemm_full}", work, seconds))
            progress.step(f"GEMM rows={r} k={k}")
    return fit_eta(rows, widths, flops)


def roofline_terms(case: ForwardCase, s_b: int, gamma_M: float, gamma_K: float, BW_mem: float) -> tuple[float, float, float]:
    """(W, eta, I * BW_mem) of a forward on one device, as spec 3.1-3.2 price it.

    Omega_W reads the layer weights once; Omega_A reads and writes b * ell * d activations per layer,
    with ell the new tokens (1 for a decode step).
    """
    arch = case.arch
    omega_w = arch.layers * layer_gemm_params(arch) * s_b
    omega_a = 2 * case.rows * arch.hidden * arch.layers * s_b
    work = case.work()
    return work, float(eta(case.rows, case.width, gamma_M, gamma_K)), work / (omega_w + omega_a) * BW_mem


def _link_campaign(pool: WorkerPool, plan: SweepPlan, cal: Calibration, world: int, progress: Progress) -> None:
    coll = [(p, m) for p in range(2, world + 1) for m in plan.message_bytes]
    pooled: dict[tuple[str, int, int], list[float]] = {}
    for round_ in range(plan.rounds):
        for p, nbytes in coll:
            per_rank = pool.run(_measure_allreduce, p, nbytes, plan.dtype, plan.repeats,
                                link_iterations(plan, nbytes), plan.link_gap_s)
            pooled.setdefault(("allreduce", p, nbytes), []).extend(slowest_rank(per_rank))
            progress.step(f"AllReduce p={p} {nbytes} B ({round_ + 1}/{plan.rounds})")
        for nbytes in plan.message_bytes:
            per_rank = pool.run(_measure_p2p, nbytes, plan.dtype, plan.repeats, link_iterations(plan, nbytes),
                                plan.link_gap_s)
            pooled.setdefault(("p2p", 2, nbytes), []).extend(slowest_rank(per_rank))
            progress.step(f"send/recv {nbytes} B ({round_ + 1}/{plan.rounds})")
    best = {key: summarize(samples, plan.statistic) for key, samples in pooled.items()}
    ar = [(p, m, best[("allreduce", p, m)]) for p, m in coll]
    a, b = allreduce_terms([m for _, m, _ in ar], [p for p, _, _ in ar])
    cal.coll_fit = fit_alpha_beta(a, b, [t for *_, t in ar])
    cal.raw += [("allreduce", f"p={p} M={m}", float(m), t) for p, m, t in ar]
    pp = [(m, best[("p2p", 2, m)]) for m in plan.message_bytes]
    a, b = p2p_terms([m for m, _ in pp])
    cal.p2p_fit = fit_alpha_beta(a, b, [t for _, t in pp])
    cal.raw += [("p2p", f"M={m}", float(m), t) for m, t in pp]


def copied_links(hw: Hardware) -> tuple[LinkFit, LinkFit]:
    """The intra-node collective and p2p terms of `hw` as fits of no points (what the report prints)."""
    note = f"copied from {hw.source}, not measured"
    (ca, cb), (pa, pb) = hw.coll("intra_node"), hw.p2p("intra_node")
    return LinkFit(float(ca), float(cb), 0.0, 0, note), LinkFit(float(pa), float(pb), 0.0, 0, note)


def _device_memory(backend: str, devices: int) -> tuple[float, str]:
    """M_GPU: a CUDA device's capacity, or on CPU the machine's RAM shared by its worker processes."""
    if backend == "nccl":
        import torch

        total = min(torch.cuda.get_device_properties(i).total_memory for i in range(devices))
        return float(total), "torch.cuda.get_device_properties(...).total_memory (smallest device)"
    import psutil

    total = psutil.virtual_memory().total
    return float(total) / devices, f"psutil RAM {total} B / {devices} worker processes"


# ---------------------------------------------------------------------------------------------------
# The profile file


def _per_node_lines(cal: Calibration) -> list[str]:
    """A GPU host bounds the GPUs of a node; CPU workers are processes, any number of them per node."""
    if cal.backend == "nccl":
        return [f"gpus_per_node = {cal.devices}               # the GPUs of this host form one node"]
    return [f"# gpus_per_node is left out: calibrated with {cal.devices} worker processes, but a cluster may run any",
            "# number of CPU worker processes per node; a profile that states it refuses clusters with more."]


def profile_mapping(cal: Calibration) -> dict:
    """The nested mapping the TOML profile holds (the schema of rpegc.core.cost.hardware)."""
    if cal.eta_fit is None or cal.f_peak_fit is None or cal.coll_fit is None or cal.p2p_fit is None:
        raise RpegError(None, "the calibration is incomplete; run every measurement before writing a profile")
    coll = {"alpha": cal.coll_fit.alpha, "beta": cal.coll_fit.beta}
    p2p = {"alpha": cal.p2p_fit.alpha, "beta": cal.p2p_fit.beta}
    per_node = {"gpus_per_node": cal.devices} if cal.backend == "nccl" else {}
    F_peak, t_layer = moved_forward_terms(cal.f_peak_fit.value, cal.eta_fit.t_layer, cal.kernel_scale)
    return {
        "name": cal.name,
        "description": _description(cal),
        **per_node,
        "compute": {"F_peak": F_peak, "BW_mem": cal.BW_mem, "gamma_M": cal.eta_fit.gamma_M,
                    "gamma_K": cal.eta_fit.gamma_K, "c_ng": cal.c_ng, "B_cal": float(cal.plan.B_cal),
                    "t_layer": t_layer, **rope_keys(cal.rope)},
        "memory": {"M_GPU": cal.M_GPU, "eps_rt": DEFAULT_EPS_RT},
        # One host reaches only the intra-node tier; the others repeat it so the profile is complete.
        "collective": _link_tiers(cal, coll, "coll"),
        "p2p": _link_tiers(cal, p2p, "p2p"),
        **attention_keys(cal.attention),
    }


def attention_keys(table: Optional[AttentionTable]) -> dict:
    """The [attention] table of the profile (none where the campaign timed no attention)."""
    if table is None:
        return {}
    return {"attention": {"head_dim": table.head_dim, "forward": list(table.forward), "backward": list(table.backward),
                          "decode": list(table.decode)}}


def _attention_lines(cal: Calibration) -> list[str]:
    t = cal.attention
    if t is None:
        return []

    def values(xs) -> str:
        return "[" + ", ".join(_num(x) for x in xs) + "]"

    return [
        "",
        "# The attention kernel (core/cost/attention.py): seconds per row and query head of one layer's call at 1, 2,",
        f"# ... positions, head size {t.head_dim}, timed as the backend calls it ({ATTENTION_ROWS} rows x "
        f"{ATTENTION_HEADS} heads, its boolean mask; the {cal.plan.kernel_statistic} of {cal.plan.repeats} repeats) on "
        "one worker",
        "[attention]",
        f"head_dim = {t.head_dim}",
        f"forward = {values(t.forward)}    # a forward over as many queries and keys",
        f"backward = {values(t.backward)}    # its backward (the forward with its backward, less the forward)",
        f"decode = {values(t.decode)}    # one query over as many cached keys (a decode step)",
    ]


def rope_keys(rope: Optional[RopeFits]) -> dict:
    """The [compute] rope_* keys of the fits (none where the campaign timed no rotation)."""
    if rope is None:
        return {}
    call, element = rope.backward
    return {"rope_call": rope.forward.alpha, "rope_element": rope.forward.beta,
            "rope_backward_call": call, "rope_backward_element": element}


def _rope_lines(cal: Calibration, c: dict) -> list[str]:
    if cal.rope is None:
        return []
    f, b = cal.rope.forward, cal.rope.with_backward
    return [
        f"rope_call = {_num(c['rope_call'])}    # s per layer call; one layer's RoPE rotation of its queries and keys "
        f"(the backend's apply_rope), least squares of call + element * elements in relative error over {f.points} "
        f"shapes ({min(e[0] * e[1] for e in cal.plan.rope_shapes)}-{max(e[0] * e[1] for e in cal.plan.rope_shapes)} "
        f"tokens) on one worker, MAPE {f.mape:.1%}",
        f"rope_element = {_num(c['rope_element'])}    # s per rotated query or key element; same fit",
        f"rope_backward_call = {_num(c['rope_backward_call'])}    # s per layer call of its backward: the same fit of "
        f"the forward with its backward (MAPE {b.mape:.1%}) less the forward's",
        f"rope_backward_element = {_num(c['rope_backward_element'])}    # s per element; the same difference",
    ]


def _link_tiers(cal: Calibration, measured: dict, family: str) -> dict:
    """Every tier's (alpha, beta): the profile's own where they were copied, else the intra-node fit."""
    if cal.links_from is None:
        return {t: dict(measured) for t in TIERS}
    terms = getattr(cal.links_from, family)
    return {t: dict(zip(("alpha", "beta"), map(float, terms(t)))) for t in TIERS}


def _description(cal: Calibration) -> str:
    unit = "CUDA device (NCCL)" if cal.backend == "nccl" else "single-threaded CPU worker process (gloo)"
    return f"calibrated on {platform.node() or 'this machine'}: {cal.devices} x {unit}, {cal.plan.dtype}"


def _us(seconds: float) -> str:
    return f"{1e6 * seconds:.3g}"


def _num(x: float) -> str:
    return f"{x:.6g}" if x != 0 else "0.0"


def _compute_lines(cal: Calibration, c: dict) -> list[str]:
    """F_peak, BW_mem and the gammas with how each was obtained (the two --eta-from methods)."""
    e, f, p = cal.eta_fit, cal.f_peak_fit, cal.plan
    moved = (f"; then x {1 / cal.kernel_scale:.3g}: the operators' moment on one worker, where the narrow forwards "
             f"took {cal.kernel_scale:.3g}x their campaign time ([overhead])" if cal.kernel_scale != 1.0 else "")
    bw = f"BW_mem = {_num(c['BW_mem'])}      # B/s; contiguous copy of {p.copy_bytes[-1] >> 20} MiB (read + write bytes)"
    if p.eta_from == "layers":
        return [
            f"F_peak = {_num(c['F_peak'])}      # FLOP/s; one least-squares fit of t = W / (F_peak * eta) + layers * t_layer "
            f"in relative error over {f.points} forwards of the backend's layers (prefill-shaped and decode steps"
            f"{', every device busy at once' if cal.concurrent else ', one device busy'}), MAPE {f.mape:.1%}{moved}",
            bw,
            f"gamma_M = {_num(c['gamma_M'])}    # rows; same fit (rows = b*ell, ell = 1 for a decode step)",
            f"gamma_K = {_num(c['gamma_K'])}    # columns; same fit (k = min(d, d_ff) of widths "
            f"{sorted({fc.width for fc in p.forwards})})",
            f"t_layer = {_num(c['t_layer'])}    # s per layer per forward call (dispatch; not in the source); same fit"
            + (f", x {cal.kernel_scale:.3g}" if moved else ""),
        ]
    return [
        f"F_peak = {_num(c['F_peak'])}      # FLOP/s; transformer forwards of the backend's model, fitted through "
        f"min(F_peak*eta, I*BW_mem): {f.points} forwards, MAPE {f.mape:.1%}{moved}",
        bw,
        f"gamma_M = {_num(c['gamma_M'])}    # rows; GEMM shape sweep ({e.points} GEMMs, n = {p.gemm_full}), "
        f"least squares of log F, MAPE {e.mape:.1%}",
        f"gamma_K = {_num(c['gamma_K'])}    # columns; same fit (GEMM saturation scale {e.scale:.4g} FLOP/s)",
    ]


def profile_text(cal: Calibration) -> str:
    """The profile as TOML, every value with a comment saying how it was obtained."""
    m = profile_mapping(cal)
    c, e, f = m["compute"], cal.eta_fit, cal.f_peak_fit
    p = cal.plan
    lines = [
        f"# Hardware profile calibrated by rpeg-calibrate on {cal.date} (paper App. C-A2).",
        f"# Devices: {cal.devices} x {'CUDA device under NCCL' if cal.backend == 'nccl' else 'CPU worker process with torch.set_num_threads(1), gloo'}.",
        f"# Kernels run in {p.dtype}: use workloads with dtype = {p.dtype} (s_b = {Workload(1, 1, 1, 1, p.dtype).s_b}) with this profile.",
        "# beta is an inverse bandwidth (s/B): beta = 1 / bandwidth.",
        f'name = "{m["name"]}"',
        f'description = "{m["description"]}"',
        *_per_node_lines(cal),
        "",
        "[compute]",
    ] + _compute_lines(cal, c) + [
        f"c_ng = {_num(c['c_ng'])}          # s per layer; 2 RMSNorm + 2 residual adds at b = B_cal, "
        f"seq = {p.ng_seq}, d = {p.ng_hidden}",
        f"B_cal = {p.B_cal}                   # sequences; reference batch of the c_ng measurement",
        *_rope_lines(cal, c),
        "",
        "[memory]",
        f"M_GPU = {_num(cal.M_GPU)}         # B; {cal.memory_source}",
        f"eps_rt = {DEFAULT_EPS_RT}                 # paper Sec. IV-E: reserved runtime fraction (not measured)",
    ]
    for family, fit, how in (("collective", cal.coll_fit, "AllReduce sweep"), ("p2p", cal.p2p_fit, "send/recv ping-pong sweep")):
        for tier in TIERS:
            lines.append("")
            lines.append(f"[{family}.{tier}]")
            if cal.links_from is not None:
                values = m[family][tier]
                lines.append(f"alpha = {_num(values['alpha'])}     # s; {fit.note}")
                lines.append(f"beta = {_num(values['beta'])}      # s/B; {fit.note}")
            elif tier == "intra_node":
                note = f"; {fit.note}" if fit.note else ""
                lines.append(f"alpha = {_num(fit.alpha)}     # s; {how}, {fit.points} points, MAPE {fit.mape:.1%}{note}")
                lines.append(f"beta = {_num(fit.beta)}      # s/B = 1/{1 / fit.beta / 1e9:.3g} GB/s; same fit")
            else:
                lines.append(f"alpha = {_num(fit.alpha)}     # s; not reachable on one host: the intra_node value")
                lines.append(f"beta = {_num(fit.beta)}      # s/B; not reachable on one host: the intra_node value")
    lines += _attention_lines(cal)
    lines += [
        "",
        "[meta]",
        f'date = "{cal.date}"                 # when the campaign ran',
        f'host = "{platform.node()}"          # where it ran',
        f'machine = "{platform.machine()}"    # CPU architecture',
        f'machine_key = "{machine.machine_key()}"  # what a CPU profile depends on (core/cost/machine.py): '
        + ", ".join(f"{k} {v}" for k, v in machine.machine_identity().items() if k != "flags"),
        f'torch = "{machine.package_version("torch")}"        # the kernels measured',
        f'backend = "{cal.backend}"           # torch.distributed backend of the links',
        f"devices = {cal.devices}                  # worker processes (CPU) or CUDA devices",
        f'dtype = "{p.dtype}"                 # element type of the compute measurements',
        f"fit_mape = {{ eta = {e.mape:.4f}, forward = {f.mape:.4f}, collective = {cal.coll_fit.mape:.4f}, "
        f"p2p = {cal.p2p_fit.mape:.4f} }}  # relative error of each fit",
        f'eta_from = "{p.eta_from}"           # what F_peak and the gammas were fitted to',
        f"concurrent_forwards = {'true' if cal.concurrent else 'false'}  # forwards timed on every device at once",
        f"statistic = \"{cal.plan.statistic}\"  # of each link point's pooled warm repeats ({cal.plan.repeats} x "
        f"{cal.plan.rounds} rounds)",
        f"kernel_statistic = \"{cal.plan.kernel_statistic}\"  # of each copy's, forward's and non-GEMM layer's",
        f"eta_saturation_flops = {_num(e.scale)}  # scale of the eta fit, FLOP/s",
        *([f"speed_probe_s = {_num(cal.speed_probe_s)}  # runtime/speed_probe.py's probe on one thread after the "
           "campaign (rpeg-run compares)"] if cal.speed_probe_s is not None else []),
        f"memory_bound_forwards = {cal.memory_bound}  # forwards the fitted roofline calls memory-bound",
        f"copy_bandwidths = [{', '.join(_num(moved / s) for kind, _, moved, s in cal.raw if kind == 'copy')}]"
        f"  # B/s per copy size {[b >> 20 for b in p.copy_bytes]} MiB",
        ('tiers_measured = []  # the links were copied from another profile' if cal.links_from is not None
         else 'tiers_measured = ["intra_node"]  # the only tier one host reaches'),
        f"non_gemm_seq = {p.ng_seq}              # sequence length of the c_ng measurement",
        f"non_gemm_hidden = {p.ng_hidden}          # hidden size of the c_ng measurement",
    ]
    return "\n".join(lines) + "\n"


def write_raw(cal: Calibration, path: Path) -> None:
    """Every measured point of the campaign as CSV: kind, point, x (bytes or FLOPs), seconds."""
    with PendingOutput(str(path), "the raw measurements") as tmp, open(tmp, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["kind", "point", "x", "seconds"])
        for kind, point, x, seconds in cal.raw:
            out.writerow([kind, point, f"{x:.6g}", f"{seconds:.6g}"])


def _fit_quality(fit: LinkFit) -> str:
    return fit.note if fit.points == 0 else f"MAPE {fit.mape:.1%}"


def summary(cal: Calibration) -> str:
    e, f = cal.eta_fit, cal.f_peak_fit
    rows = [
        f"F_peak  {f.value:.4g} FLOP/s   (eta from {cal.plan.eta_from}; forward fit MAPE {f.mape:.1%})",
        f"BW_mem  {cal.BW_mem:.4g} B/s",
        f"gamma_M {e.gamma_M:.4g} rows   gamma_K {e.gamma_K:.4g} cols   (eta fit over {e.points}, MAPE {e.mape:.1%})",
        f"t_layer {e.t_layer:.4g} s per layer call",
        f"c_ng    {cal.c_ng:.4g} s/layer at B_cal = {cal.plan.B_cal}",
        *([f"rope    {cal.rope.forward.alpha:.4g} s + {cal.rope.forward.beta:.4g} s/element per layer call, backward "
           f"{cal.rope.backward[0]:.4g} s + {cal.rope.backward[1]:.4g} s/element"] if cal.rope else []),
        *([f"attn    {_us(min(a.forward))}-{_us(max(a.forward))} us per row and head of a forward at 1-{len(a.forward)} "
           f"positions (head size {a.head_dim}), backward {_us(min(a.backward))}-{_us(max(a.backward))}, decode "
           f"{_us(min(a.decode))}-{_us(max(a.decode))}"] if (a := cal.attention) else []),
        f"coll    alpha {cal.coll_fit.alpha:.4g} s  beta {cal.coll_fit.beta:.4g} s/B  ({_fit_quality(cal.coll_fit)})",
        f"p2p     alpha {cal.p2p_fit.alpha:.4g} s  beta {cal.p2p_fit.beta:.4g} s/B  ({_fit_quality(cal.p2p_fit)})",
        f"M_GPU   {cal.M_GPU:.4g} B  eps_rt {DEFAULT_EPS_RT}",
    ]
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rpeg-calibrate", description=(
        "Measure the cost model's hardware parameters on this machine's devices and write a hardware "
        "profile TOML (paper App. C-A2)."))
    ap.add_argument("--version", action=PrintVersion)
    ap.add_argument("-o", "--output", default=None,
                    help=f"profile to write (default: {DEFAULT_OUTPUT}, only if no such file exists: the default "
                         "never replaces a profile)")
    ap.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    ap.add_argument("--devices", type=int, default=None,
                    help="devices to calibrate: CPU worker processes (default: CPU cores, at most 8) or CUDA devices")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                    help="gloo = CPU worker processes, nccl = CUDA devices (auto: nccl if CUDA is visible)")
    ap.add_argument("--quick", action="store_true", help="a tiny sweep for smoke tests (seconds, rough values)")
    ap.add_argument("--machine", action="store_true",
                    help="calibrate this machine's CPU profile, the one `hardware = \"cpu\"` names, into the user's "
                         "cache (what the first use of `cpu` runs; this refreshes it): a shorter campaign, 45-90 s "
                         "on 2 cores")
    ap.add_argument("--eta-from", choices=ETA_SOURCES, default="layers",
                    help="fit F_peak, gamma_M, gamma_K on forwards of the backend's layers (default), or the gammas "
                         "on isolated GEMMs and F_peak on the forwards (the paper's split)")
    ap.add_argument("--statistic", choices=STATISTICS, default=None,
                    help="what every point keeps of its repeats: the median (what rpeg-validate reports) or the "
                         "fastest; by default the median, but --machine keeps the kernels' and operators' fastest "
                         "(docs/calibration.md, \"Two speeds\")")
    ap.add_argument("--solo", dest="concurrent", action="store_false", default=None,
                    help="time the forwards on one device while the others idle (default on GPUs) instead of on "
                         "every device at once (default for CPU workers, whose cores share caches and memory)")
    ap.add_argument("--concurrent", dest="concurrent", action="store_true", default=None,
                    help="time the forwards on every device at once (the default for CPU workers)")
    ap.add_argument("--raw", default=None, help="also write every measured point to this CSV")
    ap.add_argument("--links-from", default=None, metavar="PROFILE",
                    help="copy the collective and p2p terms from this profile (a path or a shipped name) instead of "
                         "measuring them; needed on one CUDA device, which reaches no link")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--overhead", action="store_true",
                    help="CPU workers: also measure what operators cost beyond their kernels and the runtime's "
                         "control round trip per node, the profile's [overhead] table (tools/overhead_timing.py; "
                         "~20 s more; --machine always does)")
    ap.add_argument("--verifier", default=None, metavar="SPEC",
                    help="only measure a reward function's seconds per response on this host (what "
                         "`rpeg.verifier {per_response = ...}` states): SPEC as --reward of rpeg-run, scored over "
                         "the ground truths of --data taken as responses; writes no profile")
    ap.add_argument("--data", default=None, metavar="FILE", help="--verifier: a JSON-lines dataset")
    ap.add_argument("--answer-key", default="answer", help="--verifier: the dataset's ground-truth field")
    return ap


def measure_verifier(args: argparse.Namespace) -> int:
    """`--verifier SPEC --data FILE`: t_resp of a reward function, printed with the line that states it."""
    from rpegc.runtime.backends.torch.rl.rewards import load_reward
    from rpegc.tools.verifier_timing import measure_dataset

    try:
        if args.data is None:
            raise RpegError(None, "--verifier needs --data FILE: the responses are the dataset's ground truths")
        load_reward(args.verifier)
        seconds = measure_dataset(args.verifier, args.data, args.answer_key)
    except RpegError as err:
        print(f"rpeg-calibrate: error: {err.message}", file=sys.stderr)
        return 1
    print(f"{args.verifier}: {seconds:.6g} s per response on one core of this host (median of the batches)")
    print(f'state it in the module: rpeg.verifier @v {{fn = "{args.verifier}", per_response = {seconds:.3g}}}')
    return 0


DEFAULT_OUTPUT = "cpu.toml"


def check_cli_outputs(args: argparse.Namespace) -> Path:
    """The profile and --raw paths, checked before anything is measured; the profile path to write."""
    if args.machine:
        if args.output is not None:
            raise OutputError(args.output, "--machine writes this machine's cached profile; drop -o (or drop "
                                           "--machine to write a profile of your own)")
        path = machine.cached_profile_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.raw is not None:
            check_outputs([Output(args.raw, "the raw measurements")])
        return path
    if args.output is None and Path(DEFAULT_OUTPUT).exists():
        raise OutputError(DEFAULT_OUTPUT, f"cannot write the profile: {DEFAULT_OUTPUT} exists and the default "
                                          f"output never replaces a file; pass -o {DEFAULT_OUTPUT} to replace it, "
                                          "or -o another path")
    output = args.output if args.output is not None else DEFAULT_OUTPUT
    wanted = [Output(output, "the profile")]
    if args.raw is not None:
        wanted.append(Output(args.raw, "the raw measurements"))
    check_outputs(wanted)
    return Path(output)


T = TypeVar("T")


def _at_speed(measure: Callable[[], T], reference: Optional[SpeedReference], quick: bool) -> T:
    """A part of the profile measured over seconds (the verifiers' medians, the operators' grid) at the speed of the
    fastest probe so far (`at_usual_speed`; not retaken in a smoke sweep)."""
    return measure() if quick or reference is None else at_usual_speed(measure, reference)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verifier is not None:
        return measure_verifier(args)
    try:
        output = check_cli_outputs(args)
        backend = default_backend() if args.backend == "auto" else args.backend
        available = device_count(backend)
        devices = args.devices if args.devices is not None else min(8, available)
        if devices < 1:
            raise RpegError(None, f"--devices must be >= 1, got {devices}")
        if backend == "nccl" and devices > available:
            raise RpegError(None, f"--devices {devices} but only {available} CUDA devices are visible; lower it")
        if args.machine and backend == "nccl":
            raise RpegError(None, "--machine calibrates the CPU profile `hardware = \"cpu\"` names; pass --backend "
                                  "gloo on a machine with CUDA devices")
        if args.machine and not args.quick:
            plan = machine_plan(args.eta_from)
        else:
            plan = (gpu_plan if backend == "nccl" else cpu_plan)(args.quick, args.eta_from)
        if args.statistic is not None:
            plan = dataclasses.replace(plan, statistic=args.statistic, kernel_statistic=args.statistic)
        # CPU workers share the host's caches, memory and (on a VM) possibly physical cores: measured
        # here, a layer call is 1.7x slower with the neighbour busy. In a plan every device is busy most
        # of the time, so that is the throughput to calibrate; GPUs do not share compute.
        # --overhead and --machine then move the forward terms to one worker's condition at the operators' moment,
        # which the runs measure (overhead_timing.moved_kernels; docs/calibration.md).
        concurrent = args.concurrent if args.concurrent is not None else backend == "gloo"
        links = load_hardware(args.links_from) if args.links_from is not None else None
        name = args.name or (machine.CPU if args.machine else output.stem)
        if (args.overhead or args.machine) and backend != "gloo":
            raise RpegError(None, "--overhead measures the torch backend's CPU workers; pass --backend gloo")
        with contextlib.ExitStack() as stack:
            # the host's built-in verifiers, timed in windows across the calibration (verifier_timing.BusyScorers)
            scorers = stack.enter_context(built_in_scorers(args.quick)) if backend == "gloo" else None
            if scorers is not None and not args.quick:
                scorers.window()
            cal = calibrate(devices, backend, plan, name=name, quiet=args.quiet,
                            concurrent=concurrent, links_from=links)
            reference = SpeedReference(cal.speed_probe_s) if cal.speed_probe_s is not None else None
            # the host: verifier pools, and checkpoint writes timed beside the profile
            host = (_at_speed(lambda: measure_host(output.parent, scorers, args.quick), reference, args.quick)
                    if scorers is not None else None)
            overheads = ""
            if args.overhead or args.machine:  # this machine's profile prices the operators as they run
                so_far = profile_text(cal) + host.text(scorers)  # what the overheads' control run is priced with
                table = _at_speed(lambda: overhead_table(cal.hardware(), so_far, QUICK if args.quick else FULL,
                                                         quiet=args.quiet, check=kernel_check(cal)),
                                  reference, args.quick)
                cal.kernel_scale, overheads = table.kernel_scale, table.text
                if not args.quick:
                    scorers.window()
            tables = (host.text(scorers) if host is not None else "") + overheads
        if reference is not None:  # the profile records the fastest probe of the calibration
            cal.speed_probe_s = reference.seconds
        text = profile_text(cal) + tables
        Hardware.from_dict(tomllib.loads(text), source=str(output))  # must load as a profile, before it replaces one
        write_text(str(output), text, "the profile")
        if args.raw:
            write_raw(cal, Path(args.raw))
    except OutputError as err:
        print(err, file=sys.stderr)
        return 1
    except RpegError as err:
        print(f"rpeg-calibrate: error: {err.message}", file=sys.stderr)
        return 1
    print(summary(cal))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
