"""rpeg-validate: run real operators of the torch backend and compare their latency with the cost model.

Paper Sec. VIII-A (Fig. 4: predicted vs measured operator latency, MAPE, Spearman rho, fraction of
correctly ordered pairs; Fig. 5: the same for peak memory) and App. C-A2 (the model is evaluated with
the calibrated profile). docs/cost-model-spec.md Sec. 3 gives the prediction, `rpegc.core.cost.optime.op_time`.

A configuration is one operator (generation, inference or training of one model kind) of one tiny
model on one workload (B, R, Lp, Lr) under one strategy (dp, pp, tp, mb) on the first dp*pp*tp
devices. It is executed by the torch backend's own worker code (`runtime/backends/torch/worker/operators.py`,
`Operators.op`: the same function the backend runs for an Op node, with its TP/PP/DP execution in
`parallel/parallel_model.py`), inside worker processes of `rpegc.tools.measure.WorkerPool`. The latency of one run is
the slowest rank's time from a common barrier to the end of its part; a configuration's latency is the
median of warm repeats. Memory (Fig. 5) is measured with --isolated (each operator alone on its devices; the
default under `--backend nccl`): on CUDA torch.cuda.max_memory_allocated (`--grid gpu`: ~1B models in bf16), on
CPU workers what the C heap held allocated (`host_memory.HeapMeter`; `--grid memory`).

Outputs (in --out, default a new ./rpeg-validate-YYYYmmdd-HHMMSS/): validation.csv (one row per configuration, predicted_s
and measured_s among the columns), validation.png (log-log scatter with the +-25% band, like Fig. 4)
and report.md (the printed report). `--from CSV` re-predicts saved measurements with another profile
or other cost options without running anything.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import math
import platform
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from rpegc.core.cost.options import CostOptions, cost_options
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import Hardware, load_hardware
from rpegc.core.cost.memory import op_memory
from rpegc.core.cost.optime import op_time
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import ARCH_FLAGS, ARCH_SIZES, Arch, Workload
from rpegc.core.ir.training import FIELDS as TRAIN_FIELDS, TrainSpec, Training
from rpegc.outputs import Output, OutputError, PendingOutput, check_outputs, write_text
from rpegc.runtime.speed_probe import witness_seconds
from rpegc.tools.measure import Progress, WorkerPool, default_backend, device_count, mape
from rpegc.version import PrintVersion

ROLES = ("generation", "inference", "training")
BAND = 0.25  # the +-25% band of Fig. 4

# Tiny models the torch backend trains on a CPU: the two presets and one wider model, so the grid spans
# 16x in FLOPs per token at fixed depth.
VALIDATION_ARCHS: dict[str, Arch] = {
    "tiny": lookup("tiny"),
    "tiny-4l": lookup("tiny-4l"),
    "small-256": Arch(layers=4, hidden=256, ffn=1024, vocab=256, heads=8, kv_heads=8, gated=True, tied=False,
                      norms=True),  # counted as the backend builds it, like the presets
}
MEMORY_ARCHS: dict[str, Arch] = {
    "mem-gqa": Arch(layers=4, hidden=256, ffn=1024, vocab=16000, heads=4, kv_heads=2, gated=True, tied=False,
                    norms=True),
    "mem-tied": Arch(layers=6, hidden=192, ffn=512, vocab=8000, heads=6, kv_heads=6, gated=True, qkv_bias=True,
                     tied=True, norms=True),
}
# (B, R, Lp, Lr): a short and a longer workload; R = 1 (PPO-style), sequences = B.
VALIDATION_WORKLOADS: tuple[tuple[int, int, int, int], ...] = ((16, 1, 16, 16), (32, 1, 32, 32))


@dataclass(frozen=True)
class Grid:
    """The models and workloads one validation campaign sweeps, and the precision it runs them in."""

    archs: dict[str, Arch]
    workloads: tuple[tuple[int, int, int, int], ...]
    dtypes: tuple[str, ...]  # of the workloads: fp32, bf16 (bf16 serving, mixed-precision training)
    help: str
    trainings: bool = False  # training operators under every other training choice too (`training_variants`)


GRIDS: dict[str, Grid] = {
    # The torch backend's float32 path on CPU workers (s_b = 4).
    "cpu": Grid(VALIDATION_ARCHS, VALIDATION_WORKLOADS, ("fp32",), "tiny models in fp32 (CPU workers)"),
    # GPU-sized models in the paper's precision: Llama 3.2 1B and the Qwen2.5 0.5B shape (q/k/v biases,
    # a 152k vocabulary), GRPO-shaped workloads (R = 4).
    "gpu": Grid({"llama3.2-1b": lookup("llama3.2-1b"), "qwen2.5-0.5b": lookup("qwen2.5-0.5b")},
                ((8, 4, 128, 128), (16, 4, 256, 256)), ("bf16",), "~1B models in bf16 (CUDA devices)"),
    # Peak memory on CPU workers (with --isolated): models whose embedding, head and layers all weigh, GQA and a
    # tied head with q/k/v biases, GRPO-shaped workloads, both precisions.
    "memory": Grid(MEMORY_ARCHS, ((8, 2, 32, 32), (8, 4, 16, 48)), ("fp32", "bf16"),
                   "~10M-parameter models in fp32 and bf16, training under each precision, ZeRO stage, recomputation "
                   "and schedule, for peak memory on CPU workers (--isolated)", trainings=True),
}
# (role, model kind) of the operators: actor generation, reference inference, actor training.
VALIDATION_OPERATORS: tuple[tuple[str, str], ...] = (("generation", "policy"), ("inference", "reference"),
                                                     ("training", "policy"))
MODEL_NAMES = {"policy": "actor", "reference": "ref", "critic": "critic", "reward": "reward"}
# How the torch backend executes what docs/cost-model-spec.md Sec. 9 leaves open. Validation predicts with
# these (they describe the implementation measured, they are not fitted); the CSV and the report keep
# the prediction with the default cost options too (predicted_default_s). `--spec-defaults` drops them.
BACKEND_COST_OPTIONS: dict[str, object] = {
    # [A1] training recomputes as each case's training says (core/ir/training.py): not an option.
    # [A20] Operators.op_generation calls generate() once per microbatch: mb separate decode loops.
    "tp_decode": "per_microbatch",
    # [A7] schedules.generate pipelines decode as a loop: each token's activations cross every stage
    # boundary and the sampled ids return to stage 0 before the next step of that microbatch.
    "generation_pp": "wavefront",
}


# ---------------------------------------------------------------------------------------------------
# Configurations


@dataclass(frozen=True)
class Case:
    """One operator configuration."""

    role: str
    kind: str
    model: str  # a VALIDATION_ARCHS name (or any name when `arch` is given explicitly)
    arch: Arch
    B: int
    R: int
    Lp: int
    Lr: int
    dp: int
    pp: int
    tp: int
    mb: int
    dtype: str = "fp32"  # of the workload: fp32, or bf16 (bf16 serving, mixed-precision training)
    train: TrainSpec = TrainSpec()  # a training operator's fields beside the workload's defaults
    positions: str = "learned"  # the net's position encoding (models.POSITION_KINDS): the toy presets' learned ones

    @property
    def devices(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def id(self) -> str:
        trained = "".join(f"-{k}{v}" for k, v in self.train.items())
        return (f"{self.role[:3]}-{self.kind}-{self.model}-B{self.B}R{self.R}Lp{self.Lp}Lr{self.Lr}"
                f"-d{self.dp}p{self.pp}t{self.tp}m{self.mb}" + ("" if self.dtype == "fp32" else f"-{self.dtype}")
                + trained)

    @property
    def training(self) -> Optional[Training]:
        """How a training case trains (its fields over the workload's); None for a serving one."""
        return self.workload.training(self.train) if self.role == "training" else None

    @property
    def strategy(self) -> str:
        return f"dp{self.dp} pp{self.pp} tp{self.tp} mb{self.mb}"

    @property
    def workload(self) -> Workload:
        return Workload(B=self.B, R=self.R, Lp=self.Lp, Lr=self.Lr, dtype=self.dtype)

    @property
    def suite(self) -> tuple:
        """Cases sharing one backend worker setup (same architecture and workload)."""
        return (self.model, self.arch, self.B, self.R, self.Lp, self.Lr, self.dtype, self.positions)


def legal_strategies(arch: Arch, sequences: int, devices: int) -> list[tuple[int, int, int, int]]:
    """(dp, pp, tp, mb) on 1, 2, 4, 8 devices (at most `devices`) that satisfy the plan rules of spec 1.4.

    TP divides heads, KV heads and FFN; PP divides the layers and is 1 or even; dp divides the
    sequences; mb = 1 without PP, else mb in {pp, 2 pp} with mb | sequences/dp and at least 8
    sequences per microbatch.
    """
    out = []
    for p in (1, 2, 4, 8):
        if p > devices:
            break
        for dp, pp in itertools.product(_divisors(p), repeat=2):
            if p % (dp * pp):
                continue
            tp = p // (dp * pp)
            if arch.heads % tp or arch.kv_heads % tp or arch.ffn % tp:
                continue
            if pp > 1 and (pp % 2 or arch.layers % pp):
                continue
            if sequences % dp:
                continue
            if pp == 1:
                out.append((dp, 1, tp, 1))
                continue
            local = sequences // dp
            for mb in (pp, 2 * pp):
                if local % mb == 0 and local // mb >= 8:
                    out.append((dp, pp, tp, mb))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def subsample(cases: Sequence[Case], limit: int) -> list[Case]:
    """At most `limit` cases, evenly spaced through the grid's order (deterministic)."""
    if limit < 1:
        raise RpegError(None, f"--max-configs must be >= 1, got {limit}")
    if len(cases) <= limit:
        return list(cases)
    picks = sorted({int(round(i)) for i in np.linspace(0, len(cases) - 1, limit)})
    return [cases[i] for i in picks]


def build_grid(devices: int, quick: bool = False, grid: str = "cpu") -> list[Case]:
    """The validation grid: models x workloads x operators x legal strategies on up to `devices`.

    `quick`: the tiny model on one short workload, in the grid's precision (a smoke test of the grid's path)."""
    if grid not in GRIDS:
        raise RpegError(None, f"unknown --grid '{grid}'; use one of {', '.join(GRIDS)}")
    g = GRIDS[grid]
    if quick:
        arch = VALIDATION_ARCHS["tiny"]
        strategies = [s for s in legal_strategies(arch, 16, devices) if s[1] * s[2] == 1 or s[0] == 1][:3]
        return [Case(role, kind, "tiny", arch, 16, 1, 8, 8, *s, dtype=dtype)
                for dtype in g.dtypes for role, kind in VALIDATION_OPERATORS for s in strategies]
    cases = []
    for (name, arch), (B, R, Lp, Lr), dtype in itertools.product(g.archs.items(), g.workloads, g.dtypes):
        for role, kind in VALIDATION_OPERATORS:
            for s in legal_strategies(arch, B * R, devices):
                case = Case(role, kind, name, arch, B, R, Lp, Lr, *s, dtype=dtype)
                variants = training_variants(case) if g.trainings and role == "training" else (TrainSpec(),)
                cases += [replace(case, train=t) for t in variants]
    return cases


def training_variants(case: Case) -> list[TrainSpec]:
    """The workload's training and, one field at a time, each other choice that applies to the case's strategy:
    recomputation none and full; ZeRO 0 and 1 where dp > 1; GPipe where pp > 1; fp32 on a bf16 workload."""
    out = [TrainSpec(), TrainSpec(recompute="none"), TrainSpec(recompute="full")]
    out += [TrainSpec(zero=z) for z in (0, 1)] if case.dp > 1 else []
    out += [TrainSpec(schedule="gpipe")] if case.pp > 1 else []
    out += [TrainSpec(precision="fp32")] if case.dtype != "fp32" else []
    return out


# ---------------------------------------------------------------------------------------------------
# Metrics (pure)


def ranks(x) -> np.ndarray:
    """1-based ranks with ties given their average rank."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(x.size)
    sorted_x = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson correlation of the (tie-averaged) ranks; nan if undefined."""
    ra, rb = ranks(a), ranks(b)
    if ra.size < 2 or np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def pairs_ordered(predicted, measured) -> float:
    """Fraction of pairs the prediction orders like the measurement (pairs with equal measurements skipped;
    a predicted tie of a measured difference counts as wrong)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    i, j = np.triu_indices(p.size, k=1)
    dm = np.sign(m[i] - m[j])
    keep = dm != 0
    if not np.any(keep):
        return float("nan")
    return float(np.mean(np.sign(p[i] - p[j])[keep] == dm[keep]))


@dataclass(frozen=True)
class Scores:
    n: int
    mape: float
    spearman: float
    pairs: float
    within_band: float  # fraction with |pred/meas - 1| <= BAND
    bias: float  # median of pred/meas - 1 (negative: the model underpredicts)


def scores(predicted, measured) -> Scores:
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    rel = p / m - 1.0
    return Scores(int(p.size), mape(p, m), spearman(p, m), pairs_ordered(p, m),
                  float(np.mean(np.abs(rel) <= BAND)), float(np.median(rel)))


# ---------------------------------------------------------------------------------------------------
# Prediction


@dataclass(frozen=True)
class Prediction:
    T_op: float
    T_gemm: float
    T_bubble: float
    T_tp: float
    T_pp: float
    T_dp: float
    T_non_gemm: float
    T_opt: float
    peak_bytes: float  # persistent state plus the operator's transient peak on its worst device


def predict(case: Case, hw: Hardware, opts: CostOptions, gpus_per_node: int) -> Prediction:
    """T_op of spec 3 and the isolated operator's per-device memory peak of spec 6 (all devices on one node), without
    the speed witness a run's operator ends with: the harness times its operators without it (`_OpRuns`)."""
    wl = case.workload
    hw = replace(hw, overhead=replace(hw.overhead, witness=0.0))
    t = op_time(case.role, case.arch, case.kind, wl, dp=case.dp, pp=case.pp, tp=case.tp, mb=case.mb,
                gpus_per_node=gpus_per_node, hw=hw, opts=opts, train=case.training, rope=case.positions == "rope")
    mem = op_memory(case.role, case.arch, case.kind, wl, dp=case.dp, pp=case.pp, tp=case.tp, mb=case.mb,
                    train=case.training, opts=opts)
    # Alone on its devices: a training operator keeps its Adam state; a serving one loads its weights.
    peak = mem.state + mem.A_core if case.role == "training" else mem.A_with_weights
    return Prediction(float(t.T_op), float(t.T_gemm), float(t.T_bubble), float(t.T_tp), float(t.T_pp),
                      float(t.T_dp), float(t.T_non_gemm), float(t.T_opt), float(peak))


# ---------------------------------------------------------------------------------------------------
# Execution through the torch backend's worker (runs in the pool's processes)


def _layout(case: Case):
    from rpegc.runtime.backends.torch.parallel.layout import Layout

    return Layout(tuple(range(case.devices)), case.dp, case.pp, case.tp)


def _init_groups(ctx, layouts) -> int:
    """Every process group the grid needs, created once on every rank in one order: the backend's
    TP/PP/DP groups (`parallel.ProcessGroups`) and one group per allocation for the start barrier."""
    import warnings

    from rpegc.runtime.backends.torch.parallel.parallel_model import ProcessGroups

    # megatron-core's TP layers warn about a CUDA setting on every construction; it does not apply here.
    warnings.filterwarnings("ignore", message="When using async grad allreduce")
    ctx.state["groups"] = ProcessGroups(layouts)
    for layout in layouts:
        ctx.group(layout.ranks)
    ctx.repin()  # the new groups' transport threads were started pinned with this thread
    return len(ctx.state["groups"])


def _run_condition(ctx) -> None:
    """A CPU worker of the grid runs its operators in a run's worker's condition (worker/process.py): its heap meter
    sampling every RUN_SAMPLE_S on a thread left free of its core, and the interpreter's switch interval a worker
    sets. In runs on the 2-core VM the meter's wake-ups and the interpreter's hand-overs cost a Python-heavy generation
    5-8 % (docs/calibration.md, "The speed witness"), which an operator timed without them did not show."""
    if ctx.is_cuda:
        return
    from rpegc.runtime.backends.torch.worker.host_memory import RUN_SAMPLE_S, HeapMeter
    from rpegc.runtime.backends.torch.worker.process import SWITCH_INTERVAL_S

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ctx.state["meter"] = HeapMeter(RUN_SAMPLE_S).start()
    ctx.repin()  # the meter's thread was started bound with this one


def _backend_worker(ctx, case: Case, seed: int, tp_impl: str):
    """The backend's `Worker` for the case's model and workload (one per suite, reused across strategies)."""
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config
    from rpegc.runtime.backends.torch.worker.process import ModelSpec, standalone_worker

    workers = ctx.state.setdefault("workers", {})
    if case.suite in workers:
        return workers[case.suite]
    arch = case.arch
    run = RunConfig(algorithm="ppo", actor=arch, workload=case.workload, rl=toy_rl_config("ppo"),
                    critic=arch, reward="model", reward_arch=arch, positions=case.positions)
    models = {MODEL_NAMES[k]: ModelSpec(MODEL_NAMES[k], k, arch, model_seed(seed, k)) for k in MODEL_NAMES}
    # No layouts: the groups were created once for the whole grid (`_init_groups`) and are shared.
    worker = standalone_worker(run, models, rank=ctx.rank, world=ctx.world, seed=seed, tp_impl=tp_impl,
                               device=ctx.device, groups=ctx.state["groups"])
    workers[case.suite] = worker
    return worker


def _batch_fields(case: Case, seed: int) -> dict:
    """Synthetic inputs of every row of the batch (identical on every rank): what generation, the
    inference operators and the advantage computation would have produced."""
    import torch

    BR, ell = case.B * case.R, case.Lp + case.Lr
    gen = torch.Generator().manual_seed(seed)
    return {
        "sequences": torch.randint(8, case.arch.vocab, (BR, ell), generator=gen),
        "mask": torch.ones(BR, case.Lr),
        "old_logprobs": -2.0 * torch.rand(BR, case.Lr, generator=gen),
        "ref_logprobs": -2.0 * torch.rand(BR, case.Lr, generator=gen),
        "values": 0.1 * torch.randn(BR, case.Lr, generator=gen),
        "scores": torch.rand(BR, generator=gen),
        "task_scores": torch.rand(BR, generator=gen),
    }


_OUTPUT_FIELDS = {("generation", "policy"): ("sequences", "mask", "old_logprobs"),
                  ("inference", "reference"): ("ref_logprobs",), ("inference", "policy"): ("old_logprobs",),
                  ("inference", "critic"): ("values",), ("inference", "reward"): ("scores", "task_scores")}
_TRAINING_INPUTS = ("sequences", "mask", "old_logprobs", "ref_logprobs", "scores", "task_scores", "values")


def _op_command(worker, case: Case, layout, rank: int, seed: int):
    """The Op command the backend would send for this operator, with its inputs already on this rank."""
    from rpegc.runtime.backends.torch.channel.commands import Op
    from rpegc.runtime.backends.torch.parallel.layout import replica_rows

    model = MODEL_NAMES[case.kind]
    weights = f"W:{model}:{layout.dp}.{layout.pp}.{layout.tp}"
    if not worker.holds(weights):
        worker.install(weights, model, layout)
    rows = replica_rows(layout, 0, case.B * case.R)
    lo, hi = rows[rank]
    cmd = Op(node=case.id, tag=0, ranks=list(layout.ranks), step=0, role=case.role, model=model, layout=layout,
             mb=case.mb, rows=rows, weights=weights, inputs=[], outputs={}, fields=[], prep=[], output=None,
             version_out=None)
    batch = {f: t.to(worker.device) for f, t in _batch_fields(case, seed).items()}
    if case.role == "training":
        worker.put_rows("experience", lo, hi, {f: batch[f][lo:hi] for f in _TRAINING_INPUTS})
        # the last reader of the version it trains, as in a run's steps (`_OpRuns`)
        return replace(cmd, inputs=["experience"], output=f"{weights}@1", version_out=1, train=case.training, take=True)
    out = list(_OUTPUT_FIELDS[(case.role, case.kind)])
    if case.role == "inference":
        worker.put_rows("rollouts", lo, hi, {f: batch[f][lo:hi] for f in ("sequences", "mask")})
        cmd = replace(cmd, inputs=["rollouts"])
    return replace(cmd, outputs={"result": out}, fields=out)


def _measure_case(ctx, case: Case, repeats: int, warmup: int, seed: int, tp_impl: str, isolated: bool = False):
    """Seconds of each timed run of the operator on this rank and its peak memory (None where not measured).

    `isolated`: the worker holds this operator's model alone and is dropped afterwards, so the peak is the
    operator's own (its state and transients), as the cost model prices an operator alone. The peak is the
    allocator's accounting: on CUDA `max_memory_allocated` of the last run; on CPU workers (isolated only) the most
    the C heap held allocated during one more run after the warm-ups, above what it held before the worker was
    built, so its weights and optimizer state are in it (`host_memory.HeapMeter`)."""
    import torch

    from rpegc.runtime.backends.torch.worker.host_memory import OPERATOR_SAMPLE_S, HeapMeter

    layout = _layout(case)
    if ctx.rank not in layout.ranks:
        return None
    peak = None
    if isolated:
        _drop_workers(ctx)
    if isolated and not ctx.is_cuda:
        meter = HeapMeter(OPERATOR_SAMPLE_S).start()
        try:
            op = _OpRuns(ctx, _backend_worker(ctx, case, seed, tp_impl), case, layout, seed)
            for _ in range(max(1, warmup)):  # the first training run creates the optimizer state
                op.run()
            meter.reset()
            op.run()
            peak = float(meter.peak() - meter.base) if meter.available else None
        finally:
            meter.stop()
        warmup = 0
    else:
        op = _OpRuns(ctx, _backend_worker(ctx, case, seed, tp_impl), case, layout, seed)
    samples = []
    for _ in range(warmup + repeats):
        if ctx.is_cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        samples.append(op.run())
        if ctx.is_cuda:
            peak = float(torch.cuda.max_memory_allocated(ctx.device))
    if isolated:
        _drop_workers(ctx)
    return samples[warmup:], peak


WITNESS = "witness"  # a worker's ctx.state key: the speed witnesses it ran after its operators


class _OpRuns:
    """Repeated runs of one operator on this rank. A training operator runs as a run's consecutive steps do: each
    trains the version the one before published, as its last reader (it takes that copy over, as the plan lets it),
    so the training state is loaded once and no run re-reads version 0."""

    def __init__(self, ctx, worker, case: Case, layout, seed: int):
        self.ctx, self.worker, self.layout = ctx, worker, layout
        self.cmd = _op_command(worker, case, layout, ctx.rank, seed)

    def run(self) -> float:
        """Seconds of one run, from a barrier of the operator's devices; after it, outside the time, the speed
        witness a run's worker ends an operator with, kept for the calibration (`take_witness`)."""
        self.ctx.barrier(self.layout.ranks)
        t0 = time.perf_counter()
        self.worker.execute(self.cmd)
        self.ctx.sync()
        seconds = time.perf_counter() - t0
        self.ctx.state.setdefault(WITNESS, []).append(witness_seconds())
        if self.cmd.role == "training":
            base, version = self.cmd.output.rsplit("@", 1)[0], self.cmd.version_out
            self.cmd = replace(self.cmd, weights=self.cmd.output, output=f"{base}@{version + 1}",
                               version_out=version + 1)
        return seconds


def take_witness(ctx) -> list[float]:
    """The speed witnesses this rank ran after its operators (`_OpRuns.run`) since the last call; runs in the pool's
    processes (tools/overhead_timing.py takes them after every round of its grid)."""
    return ctx.state.pop(WITNESS, [])


def _drop_workers(ctx) -> None:
    """Free every cached backend worker (and the device memory it held)."""
    import gc

    import torch

    ctx.state.pop("workers", None)
    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class Row:
    """One CSV row: the configuration, what was measured and what the model predicts."""

    case: Case
    measured: tuple[float, ...]  # per warm repeat, the slowest rank's seconds
    measured_peak: Optional[float]  # bytes on the worst device (CUDA), else None
    pred: Prediction
    pred_default: Prediction  # with the default cost options

    @property
    def measured_s(self) -> float:
        return float(np.median(self.measured))


Samples = list[tuple[tuple[float, ...], Optional[float]]]  # per case: the slowest rank's seconds per repeat, its peak


def measure(cases: Sequence[Case], devices: int, *, repeats: int, warmup: int = 1, seed: int = 0,
            tp_impl: str = "auto", quiet: bool = False, backend: str = "gloo", isolated: bool = False,
            after_round: Optional[Callable[[WorkerPool], None]] = None) -> Samples:
    """Run every case on a pool of `devices` workers; per case the slowest rank's seconds per repeat and its peak.

    Repeats are rounds over the whole grid (the first round warms every case up), so a burst of load from other
    processes lands on one repeat of many cases, not on every repeat of one case, and the median discards it;
    each case keeps its backend state (modules, optimizer) between rounds; a CPU worker runs them as a run's does
    (`_run_condition`). `isolated` (what --isolated selects,
    by default on CUDA devices): each case runs its repeats back to back on a worker holding its model alone,
    and its peak memory is measured (`_measure_case`). `after_round(pool)` runs on the same workers after every round
    (what else the caller times at the grid's moments, as tools/overhead_timing.py its kernels; not with
    `isolated`).
    """
    from rpegc.runtime.backends.torch.parallel.tensor_parallel import resolve_tp_impl

    tp_impl, _ = resolve_tp_impl(tp_impl, any(c.tp > 1 for c in cases))  # as the torch backend resolves it
    if isolated and after_round is not None:
        raise ValueError("validate.measure: after_round needs rounds over the grid; isolated runs each case alone")
    if isolated:
        return _measure_isolated(cases, devices, repeats=repeats, warmup=warmup, seed=seed, tp_impl=tp_impl,
                                 quiet=quiet, backend=backend)
    if any(c.devices > devices for c in cases):
        raise RpegError(None, f"a configuration needs more than the {devices} devices; raise --devices")
    layouts = sorted({_layout(c) for c in cases}, key=lambda L: (L.ranks, L.dp, L.pp, L.tp))
    progress = Progress(len(cases) * repeats + 1, quiet, "starting workers")
    samples: list[list[float]] = [[] for _ in cases]
    peaks: list[Optional[float]] = [None] * len(cases)
    try:
        with WorkerPool(devices, backend) as pool:
            pool.run(_init_groups, layouts)
            pool.run(_run_condition)
            progress.step("process groups ready")
            for round_ in range(repeats):
                for i, case in enumerate(cases):
                    per_rank = [r for r in pool.run(_measure_case, case, 1, warmup if round_ == 0 else 0, seed, tp_impl)
                                if r is not None]
                    samples[i].append(max(r[0][0] for r in per_rank))
                    ranks_peak = [r[1] for r in per_rank if r[1] is not None]
                    if ranks_peak:
                        peaks[i] = max(ranks_peak + ([peaks[i]] if peaks[i] is not None else []))
                    progress.step(f"{case.id} ({round_ + 1}/{repeats})")
                if after_round is not None:
                    after_round(pool)
    finally:
        progress.close()
    return [(tuple(s), p) for s, p in zip(samples, peaks)]


def _measure_isolated(cases: Sequence[Case], devices: int, *, repeats: int, warmup: int, seed: int, tp_impl: str,
                      quiet: bool, backend: str) -> Samples:
    """`measure` with every case alone, its warm-ups and repeats back to back. A case whose operator fails
    (say it runs out of device memory) is reported on stderr and gets no samples; the pool is restarted and
    the grid goes on. `tp_impl` is resolved (megatron or torch)."""
    layouts = sorted({_layout(c) for c in cases}, key=lambda L: (L.ranks, L.dp, L.pp, L.tp))
    # A GPU worker's host threads draw version 0 and feed the device: the host's cores are shared out.
    threads = max(1, device_count("gloo") // devices) if backend == "nccl" else 1
    progress = Progress(len(cases), quiet, "starting workers")
    out: Samples = []
    pool: Optional[WorkerPool] = None
    try:
        for case in cases:
            try:
                if pool is None:
                    pool = WorkerPool(devices, backend, threads=threads)
                    pool.run(_init_groups, layouts)
                per_rank = [r for r in pool.run(_measure_case, case, repeats, warmup, seed, tp_impl, True)
                            if r is not None]
            except RpegError as err:
                print(f"rpeg-validate: configuration {case.id} failed: {err.message}", file=sys.stderr)
                out.append(((), None))
                pool = None  # a failed pool is closed; the next case starts a new one
                progress.step(f"{case.id} FAILED")
                continue
            samples = tuple(max(r[0][i] for r in per_rank) for i in range(repeats))
            peaks = [r[1] for r in per_rank if r[1] is not None]
            out.append((samples, max(peaks) if peaks else None))
            progress.step(case.id)
    finally:
        if pool is not None:
            pool.close()
        progress.close()
    return out


def make_rows(cases: Sequence[Case], measured, hw: Hardware, opts: CostOptions, gpus_per_node: int) -> list[Row]:
    return [Row(c, m, peak, predict(c, hw, opts, gpus_per_node), predict(c, hw, CostOptions(), gpus_per_node))
            for c, (m, peak) in zip(cases, measured)]


# ---------------------------------------------------------------------------------------------------
# CSV

CSV_COLUMNS = ("case", "role", "kind", "model", "layers", "hidden", "ffn", "vocab", "heads", "kv_heads", *ARCH_FLAGS,
               "B", "R", "Lp", "Lr", "dtype", "dp", "pp", "tp", "mb", *TRAIN_FIELDS, "devices", "repeats", "measured_s",
               "measured_min_s", "measured_max_s", "predicted_s", "predicted_default_s", "rel_error", "T_gemm", "T_bubble", "T_tp",
               "T_pp", "T_dp", "T_non_gemm", "T_opt", "predicted_peak_bytes", "measured_peak_bytes", "samples_s")


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with PendingOutput(str(path), "the validation CSV") as tmp, open(tmp, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(CSV_COLUMNS)
        for r in rows:
            c, a, p = r.case, r.case.arch, r.pred
            out.writerow([c.id, c.role, c.kind, c.model, a.layers, a.hidden, a.ffn, a.vocab, a.heads, a.kv_heads,
                          *(int(getattr(a, f)) for f in ARCH_FLAGS), c.B, c.R, c.Lp, c.Lr, c.dtype,
                          c.dp, c.pp, c.tp, c.mb, *(_csv_train(c, f) for f in TRAIN_FIELDS),
                          c.devices, len(r.measured),
                          f"{r.measured_s:.6g}", f"{min(r.measured):.6g}", f"{max(r.measured):.6g}",
                          f"{p.T_op:.6g}", f"{r.pred_default.T_op:.6g}", f"{p.T_op / r.measured_s - 1:.4f}",
                          f"{p.T_gemm:.6g}", f"{p.T_bubble:.6g}", f"{p.T_tp:.6g}", f"{p.T_pp:.6g}", f"{p.T_dp:.6g}",
                          f"{p.T_non_gemm:.6g}", f"{p.T_opt:.6g}", f"{p.peak_bytes:.6g}",
                          "" if r.measured_peak is None else f"{r.measured_peak:.6g}",
                          " ".join(f"{s:.6g}" for s in r.measured)])


_OLD_CSV_FLAGS = {"gated": 1, "qkv_bias": 0, "tied": 0, "norms": 1, "qk_norm": 0, "post_norms": 0}


def _csv_train(c: Case, field: str) -> str:
    """A training case's resolved field (empty for a serving one)."""
    return "" if c.training is None else str(getattr(c.training, field))


def _read_train(rec: dict, dtype: str) -> TrainSpec:
    """The training fields of a row that differ from its workload's defaults (a CSV from before the columns trained
    with the defaults)."""
    default = Workload(1, 1, 1, 1, dtype).training()
    values = {f: (int(rec[f]) if f == "zero" else rec[f]) for f in TRAIN_FIELDS if rec.get(f)}
    return TrainSpec(**{f: v for f, v in values.items() if v != getattr(default, f)})


def _csv_dtype(value: Optional[str]) -> str:
    """A row's dtype; a CSV from before the column measured the float32 path."""
    value = value or "fp32"
    if value not in ("fp32", "bf16"):
        raise ValueError(f"dtype '{value}' is not fp32 or bf16")
    return value


def read_csv(path: Path) -> list[tuple[Case, tuple[float, ...], Optional[float]]]:
    """Cases and measurements of a validation CSV (to re-predict them with another profile)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise RpegError(None, f"cannot read {path}: {err.strerror}; pass a CSV written by rpeg-validate") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in ("role", "kind", "model", "layers", "B", "dp", "samples_s") if c not in (reader.fieldnames or [])]
    if missing:
        raise RpegError(None, f"{path} lacks the columns {', '.join(missing)}; pass a CSV written by rpeg-validate")
    out = []
    for line, rec in enumerate(reader, start=2):
        try:
            # A CSV from before a flag's column measured what the backend builds: a gated (SwiGLU) FFN, norms, an
            # untied LM head, no q/k/v biases
            arch = Arch(*(int(rec[k]) for k in ARCH_SIZES),
                        **{f: bool(int(rec.get(f) or _OLD_CSV_FLAGS[f])) for f in ARCH_FLAGS})
            dtype = _csv_dtype(rec.get("dtype"))
            case = Case(rec["role"], rec["kind"], rec["model"], arch,
                        *(int(rec[k]) for k in ("B", "R", "Lp", "Lr", "dp", "pp", "tp", "mb")),
                        dtype=dtype, train=_read_train(rec, dtype) if rec["role"] == "training" else TrainSpec())
            samples = tuple(float(s) for s in rec["samples_s"].split())
            peak = float(rec["measured_peak_bytes"]) if rec.get("measured_peak_bytes") else None
        except (KeyError, ValueError, TypeError, RpegError) as err:
            raise RpegError(None, f"{path}, line {line}: malformed row ({err}); regenerate it with rpeg-validate") from None
        if not samples:
            raise RpegError(None, f"{path}, line {line}: no measured samples")
        out.append((case, samples, peak))
    return out


# ---------------------------------------------------------------------------------------------------
# Report and plot


def _fmt(s: Scores) -> str:
    rho = "  n/a" if math.isnan(s.spearman) else f"{s.spearman:5.3f}"
    pairs = "  n/a" if math.isnan(s.pairs) else f"{s.pairs:5.1%}"
    return f"{s.n:4d}  {s.mape:6.1%}  {rho}  {pairs}  {s.within_band:6.1%}  {s.bias:+6.1%}"


def groups_of(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    """The rows overall, per role, and per parallelism class (what a systematic error shows up in)."""
    out = [("all", list(rows))]
    out += [(role, [r for r in rows if r.case.role == role]) for role in ROLES]
    classes = (("pp = 1", lambda c: c.pp == 1), ("pp > 1", lambda c: c.pp > 1), ("tp > 1", lambda c: c.tp > 1),
               ("dp > 1", lambda c: c.dp > 1), ("one device", lambda c: c.devices == 1))
    out += [(name, [r for r in rows if pred(r.case)]) for name, pred in classes]
    for role in ROLES:
        out.append((f"{role}, pp = 1", [r for r in rows if r.case.role == role and r.case.pp == 1]))
    return [(name, rs) for name, rs in out if rs]


def _score_table(rows: Sequence[Row], predicted, measured) -> list[str]:
    """The scores of `predicted(row)` against `measured(row)` overall and per group, as a fenced block."""
    lines = ["```", "group                      n    MAPE    rho   pairs  +-25%    bias"]
    for name, rs in groups_of(rows):
        lines.append(f"{name:<24} {_fmt(scores([predicted(r) for r in rs], [measured(r) for r in rs]))}")
    return lines + ["```"]


def report(rows: Sequence[Row], *, hw: Hardware, opts: CostOptions, devices: int, source: str,
           failed: Sequence[str] = ()) -> str:
    changed = [f"{f.name} = {getattr(opts, f.name)!r}" for f in fields(CostOptions)
               if getattr(opts, f.name) != getattr(CostOptions(), f.name)]
    lines = [
        "# Cost-model validation (paper Sec. VIII-A, Fig. 4)",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, host {platform.node()}",
        f"- measurements: {source}",
        f"- hardware profile: {hw.source} ({hw.name}); devices: {devices}",
        f"- cost options: {', '.join(changed) if changed else 'the spec defaults'}",
        f"- latency = median of the warm repeats of the slowest rank; configurations: {len(rows)}",
        *([f"- FAILED (no measurement; errors on stderr): {', '.join(failed)}"] if failed else []),
        "",
        *_score_table(rows, lambda r: r.pred.T_op, lambda r: r.measured_s),
    ]
    fastest = scores([r.pred.T_op for r in rows], [min(r.measured) for r in rows])
    lines += ["", f"Against the fastest repeat instead of the median (less disturbed by other processes): "
              f"MAPE {fastest.mape:.1%}, rho {fastest.spearman:.3f}, pairs {fastest.pairs:.1%}, bias {fastest.bias:+.1%}."]
    if any(r.pred_default.T_op != r.pred.T_op for r in rows):
        s = scores([r.pred_default.T_op for r in rows], [r.measured_s for r in rows])
        lines += ["", f"With the default cost options: n {s.n}, MAPE {s.mape:.1%}, rho {s.spearman:.3f}, "
                  f"pairs {s.pairs:.1%}, bias {s.bias:+.1%}."]
    mem = [r for r in rows if r.measured_peak is not None]
    if mem:
        lines += ["", "Peak memory (Fig. 5), predicted peak of the worst device against the most any of the "
                  "operator's workers held (the allocator's accounting: the GPU's, or the C heap's on CPU workers):",
                  "",
                  *_score_table(mem, lambda r: r.pred.peak_bytes, lambda r: r.measured_peak)]
        worst_mem = sorted(mem, key=lambda r: -abs(r.pred.peak_bytes / r.measured_peak - 1))[:8]
        lines += ["", "Largest memory errors:", "```"]
        lines += [f"{r.case.id:<48} measured {r.measured_peak / 2**20:9.1f} MiB  predicted "
                  f"{r.pred.peak_bytes / 2**20:9.1f} MiB  ({r.pred.peak_bytes / r.measured_peak - 1:+.0%})"
                  for r in worst_mem]
        lines.append("```")
    else:
        lines += ["", "Peak memory (Fig. 5): not measured; on CPU workers it is measured with --isolated."]
    worst = sorted(rows, key=lambda r: -abs(r.pred.T_op / r.measured_s - 1))[:8]
    lines += ["", "Largest errors:", "```"]
    lines += [f"{r.case.id:<48} measured {r.measured_s * 1e3:8.2f} ms  predicted {r.pred.T_op * 1e3:8.2f} ms  "
              f"({r.pred.T_op / r.measured_s - 1:+.0%})" for r in worst]
    lines.append("```")
    lines += ["", "Columns: MAPE = mean |pred - meas| / meas; rho = Spearman rank correlation; pairs = fraction of "
              "configuration pairs ordered correctly; +-25% = fraction inside the band; bias = median pred/meas - 1."]
    return "\n".join(lines) + "\n"


_MARKERS = {"dp": "o", "tp": "s", "pp": "^", "mixed": "D", "single": "x"}
_COLOURS = {"generation": "#4C72B0", "inference": "#55A868", "training": "#C44E52"}


def _shape(case: Case) -> str:
    used = [k for k, v in (("dp", case.dp), ("pp", case.pp), ("tp", case.tp)) if v > 1]
    return "single" if not used else used[0] if len(used) == 1 else "mixed"


def plot(rows: Sequence[Row], path: Path, *, memory: bool = False) -> None:
    """Predicted vs measured on log-log axes, y = x and the +-25% band (Fig. 4; Fig. 5 with memory)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    use = [r for r in rows if not memory or r.measured_peak is not None]
    if not use:
        return
    meas = np.array([r.measured_peak if memory else r.measured_s for r in use])
    pred = np.array([r.pred.peak_bytes if memory else r.pred.T_op for r in use])
    scale = 1.0 if memory else 1e3
    unit = "bytes" if memory else "ms"
    fig = Figure(figsize=(6.2, 5.6), dpi=130)
    ax = fig.add_subplot(1, 1, 1)
    lo = min(meas.min(), pred.min()) * scale / 1.5
    hi = max(meas.max(), pred.max()) * scale * 1.5
    grid = np.geomspace(lo, hi, 50)
    ax.fill_between(grid, grid * (1 - BAND), grid * (1 + BAND), color="#DDDDDD", label=f"+-{BAND:.0%}")
    ax.plot(grid, grid, color="black", linewidth=1)
    for r, m, p in zip(use, meas, pred):
        ax.scatter(m * scale, p * scale, marker=_MARKERS[_shape(r.case)], color=_COLOURS[r.case.role],
                   s=22, linewidths=1.0, alpha=0.85)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    s = scores(pred, meas)
    what = "peak memory" if memory else "operator latency"
    ax.set_title(f"Predicted vs measured {what}\nMAPE {s.mape:.1%}, Spearman {s.spearman:.3f}, "
                 f"pairs {s.pairs:.1%} (n = {s.n})", fontsize=9)
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=role) for role, c in _COLOURS.items()]
    handles += [Line2D([], [], color="grey", marker=m, linestyle="", label=name) for name, m in _MARKERS.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    with PendingOutput(str(path), "the validation plot") as tmp:
        fig.savefig(tmp)


# ---------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rpeg-validate", description=(
        "Run generation, inference and training operators of the torch backend over a grid of tiny models, "
        "workloads and (dp, pp, tp, mb) strategies, and compare their latency with the cost model "
        "(paper Sec. VIII-A, Fig. 4)."))
    ap.add_argument("--version", action=PrintVersion)
    ap.add_argument("--hardware", required=True, help="calibrated profile (a path or a shipped name), e.g. cpu.toml")
    ap.add_argument("--devices", type=int, default=None, help="worker processes (default: CPU cores, at most 8)")
    ap.add_argument("--out", default=None,
                    help="directory for validation.csv/.png and report.md (default: a new directory "
                         "./rpeg-validate-YYYYmmdd-HHMMSS, so no earlier results are replaced)")
    ap.add_argument("--repeats", type=int, default=5, help="timed warm repeats per configuration (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="cpu",
                    help="models and precision: " + "; ".join(f"{k}: {g.help}" for k, g in GRIDS.items()))
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                    help="gloo = CPU worker processes, nccl = CUDA devices, whose peak memory is measured too "
                         "(auto: nccl if CUDA is visible)")
    ap.add_argument("--isolated", action=argparse.BooleanOptionalAction, default=None,
                    help="run each configuration's repeats back to back on a worker holding its model alone and "
                         "measure its peak memory, the operator's own: max_memory_allocated on CUDA (the default "
                         "there), the C heap's allocations on CPU workers")
    ap.add_argument("--quick", action="store_true", help="a handful of configurations (smoke test)")
    ap.add_argument("--max-configs", type=int, default=120,
                    help="run at most this many configurations, evenly spread over the grid (default 120; the "
                         "grid has 81 on 2 devices, 177 on 4, 279 on 8)")
    ap.add_argument("--cost-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a cost-model option of rpegc.core.cost.options (repeatable), on top of the options that "
                         "describe the torch backend (tp_decode=per_microbatch, generation_pp=wavefront)")
    ap.add_argument("--spec-defaults", action="store_true",
                    help="start from the default cost options instead of the backend's")
    ap.add_argument("--from", dest="from_csv", default=None,
                    help="re-predict the measurements of this validation CSV instead of running anything")
    ap.add_argument("--tp-impl", default="auto", help="tensor-parallel implementation: auto, megatron or torch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return ap


def _parse_options(items: Sequence[str], spec_defaults: bool = False) -> CostOptions:
    values: dict[str, object] = {} if spec_defaults else dict(BACKEND_COST_OPTIONS)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise RpegError(None, f"--cost-option '{item}' is not NAME=VALUE, e.g. decode_rows=local_batch")
        values[name.strip()] = value.strip()
    return cost_options(values)


def fresh_out_dir(now: Optional[datetime.datetime] = None) -> Path:
    """The default --out: a directory named after the time that does not exist yet."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    out, n = Path(f"rpeg-validate-{stamp}"), 1
    while out.exists():
        n += 1
        out = Path(f"rpeg-validate-{stamp}-{n}")
    return out


def output_names(repredicted: bool) -> dict[str, str]:
    """The files rpeg-validate writes in --out, by what they are."""
    suffix = "-repredicted" if repredicted else ""
    return {"CSV": f"validation{suffix}.csv", "plot": f"validation{suffix}.png",
            "memory plot": "validation-memory.png", "report": f"report{suffix}.md"}


def check_cli_outputs(args: argparse.Namespace) -> Path:
    """Every output file in --out against --hardware, --from and each other, before anything runs."""
    from rpegc.core.cost.hardware import _resolve

    out = Path(args.out) if args.out is not None else fresh_out_dir()
    if args.out == "":
        raise OutputError("", "cannot write the results: the path is empty")
    wanted = [Output(str(out / name), f"the {what}", make_parents=True)
              for what, name in output_names(bool(args.from_csv)).items()]
    check_outputs(wanted, inputs=[str(_resolve(args.hardware, None)), args.from_csv or ""])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = check_cli_outputs(args)
        hw = load_hardware(args.hardware)
        opts = _parse_options(args.cost_option, args.spec_defaults)
        if args.repeats < 1 or args.warmup < 0:
            raise RpegError(None, "--repeats must be >= 1 and --warmup >= 0")
        failed: list[str] = []
        if args.from_csv:
            saved = read_csv(Path(args.from_csv))
            cases = [c for c, _, _ in saved]
            measured = [(s, p) for _, s, p in saved]
            devices = max(c.devices for c in cases)
            source = f"re-predicted from {args.from_csv}"
        else:
            backend = default_backend() if args.backend == "auto" else args.backend
            if backend == "nccl" and device_count("nccl") < 1:
                raise RpegError(None, "--backend nccl needs CUDA devices, but torch sees none; use --backend gloo")
            devices = args.devices if args.devices is not None else min(8, device_count(backend))
            if devices < 1:
                raise RpegError(None, f"--devices must be >= 1, got {devices}")
            cases = subsample(build_grid(devices, args.quick, args.grid), args.max_configs)
            isolated = args.isolated if args.isolated is not None else backend == "nccl"
            measured = measure(cases, devices, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                               tp_impl=args.tp_impl, quiet=args.quiet, backend=backend, isolated=isolated)
            source = f"measured now, {args.repeats} repeats after {args.warmup} warm-up"
            source += (", each configuration alone on its devices with its repeats back to back" if isolated
                       else ", in rounds over the grid")
            failed = [c.id for c, (samples, _) in zip(cases, measured) if not samples]
            cases, measured = [c for c, m in zip(cases, measured) if m[0]], [m for m in measured if m[0]]
            if not cases:
                raise RpegError(None, "every configuration failed (errors above)")
            cores = device_count("gloo")
            if backend == "gloo" and devices > cores:
                source += (f"; WARNING: {devices} workers on {cores} cores time-share, so the devices are not "
                           "independent as the cost model assumes")
        gpus_per_node = hw.gpus_per_node or devices
        rows = make_rows(cases, measured, hw, opts, gpus_per_node)
        text = report(rows, hw=hw, opts=opts, devices=devices, source=source, failed=failed)
        names = output_names(bool(args.from_csv))
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / names["CSV"])
        plot(rows, out / names["plot"])
        if any(r.measured_peak is not None for r in rows):
            plot(rows, out / names["memory plot"], memory=True)
        write_text(str(out / names["report"]), text, "the report")
    except OutputError as err:
        print(err, file=sys.stderr)
        return 1
    except RpegError as err:
        print(f"rpeg-validate: error: {err.message}", file=sys.stderr)
        return 1
    print(text, end="")
    print(f"wrote {out}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
