"""What running an operator costs on this machine beyond its kernels: the `[overhead]` table of a CPU profile
(rpegc/core/cost/hardware.py, priced in core/cost/optime.py and on every exec node by core/cost/annotate.py).

- `operator_overheads(hw, check=...)`: the torch backend's generation, inference and training operators (the worker's
  own code, through rpeg-validate's runner) of two small models over `FULL.shapes` on one worker. Per role, the time the
  profile's kernel terms (`hw`, the campaign's other tables) leave unexplained is fitted as `call * microbatches +
  token * tokens` (a replica's rows times their prompt and response), least squares in relative error with both terms
  >= 0, each operator's time the campaign's statistic of its repeats (its fastest in a `--machine` profile, as the
  kernels'). Small models spend most of an operator here. The kernels are subtracted as they ran beside the operators:
  after every round of the grid the same worker times the kernel campaign's narrow forwards again (`KernelCheck`),
  and the profile's forward terms (F_peak, t_layer) are brought to that moment and condition by how long those took
  against in the campaign (`kernel_scale`); rpeg-calibrate writes them so (`moved_kernels`), so the profile prices
  kernels and overheads as one moment on one worker saw them. The grid's training recomputes nothing (recompute =
  none); at `recompute_shapes` it is timed recomputing too (interval), and what that costs beyond its kernels and the
  training terms is fitted the same way (`recompute_call`, `recompute_token`, per recomputed forward).
- `control_runs(hw_text, ...)`: the runtime's control round trip per exec node (a completion's report, the
  controller's reaction, the next command; `runtime/report.control_overhead`, as rpeg-run prints it) and a transfer's
  cost beside its link's terms, from short real runs of a GRPO plan, priced with `hw_text`: on one worker (a core left
  free for the runtime's threads: `node_free`) and on a worker per core (`node`, `transfer` of a data field and
  `transfer_weights` of a model's weights); the operator time the runtime's threads take per exec node where they have
  no core of their own (`contention`, core/cost/contention.py) is what the second run's operators waited for a core
  (each node's `waited` in its trace). What an operator's time grows by with siblings computing on the
  host's other cores (`co_busy`) compares the program data-parallel on two workers with one's share on one worker.
  What it grows by with other operators or processes there (`co_run`) comes from the kernel campaign
  (`calibrate._co_running`) and is written with this table.
- `overhead_table(hw, hw_text)`: both as the `[overhead]` table `rpeg-calibrate` appends to a CPU profile.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from rpegc.core.cost.hardware import Hardware, Overhead
from rpegc.core.cost.options import CostOptions, cost_options
from rpegc.core.cost.transfer import moves_weights
from rpegc.core.cost.work import forward_length
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Arch
from rpegc.core.ir.training import TrainSpec
from rpegc.programs import Cluster, Model, Workload, grpo
from rpegc.tools.measure import mape, summarize

ROLES = ("generation", "inference", "training")


@dataclass(frozen=True)
class OverheadPlan:
    """What the overhead campaign measures."""

    models: tuple[tuple[str, str], ...]  # (rpeg-validate preset or llama-small, position encoding)
    shapes: tuple[tuple[int, int, int, int], ...]  # (B, R, Lp, Lr)
    repeats: int  # timed runs of each operator (the campaign's statistic of them), after WARMUP
    steps: int  # of the control run: a transfer's extra time is bimodal (whether an endpoint is busy), so its median
    # holds still only over ~200 transfers (docs/calibration.md)
    # Shapes whose training is timed recomputing its activations too (recompute = interval; the grid's others train
    # without, recompute = none): what a recomputed forward costs beyond its kernels (`recompute_*`)
    recompute_shapes: tuple[tuple[int, int, int, int], ...] = ()


# Two small models whose operators are mostly overhead: rpeg-validate's `tiny` preset (the toy presets' learned
# positions, full attention) and a small Llama-style model as a Hugging Face checkpoint builds it (RoPE, grouped-query
# attention), whose operators cost ~10-30% more beside the same kernels; the fit takes both. The shapes reach 64-128
# rows of 12-16 tokens: with 64 rows of 8-24 tokens at most, the kernels explained the grid's generations within 15 %
# and the fit put the per-token term at 0.6 us, where a grid up to 128 rows finds 3-9 us (docs/calibration.md).
LLAMA_SMALL = Arch(layers=2, hidden=96, ffn=192, vocab=128, heads=6, kv_heads=2, gated=True, tied=False, norms=True)
FULL = OverheadPlan(models=(("tiny", "learned"), ("llama-small", "rope")),
                    shapes=((4, 4, 4, 4), (16, 4, 4, 4), (4, 4, 4, 16), (16, 4, 4, 16), (8, 4, 16, 8), (16, 4, 12, 4),
                            (32, 4, 8, 4)),
                    repeats=5, steps=40, recompute_shapes=((4, 4, 4, 4), (4, 4, 4, 16), (16, 4, 12, 4), (32, 4, 8, 4)))
QUICK = OverheadPlan(models=(("tiny", "rope"),), shapes=((4, 4, 4, 4), (8, 4, 4, 8)), repeats=2, steps=4,
                     recompute_shapes=((4, 4, 4, 4), (8, 4, 4, 8)))  # smoke
# What the table fits: each role's operators, and a training step's recomputation beyond its kernels
FITS = ROLES + ("recompute",)
RECOMPUTING = "+recompute"  # the model name of the recomputing training cases (a backend worker of their own)
WARMUP = 2


@dataclass(frozen=True)
class RoleFit:
    """One role's fitted terms and how well they explain its operators."""

    role: str
    call: float  # s per microbatch
    token: float  # s per token of one row
    points: int
    mape_before: float  # of the kernel terms alone
    mape_after: float  # with the fitted terms


def tokens(case, opts: CostOptions) -> int:
    """The tokens whose per-token overhead an operator (validate.Case) of one replica pays (core/cost/optime.py):
    a generation's every prompt and response token, a teacher-forced forward's `forward_length` a row."""
    per_row = case.Lp + case.Lr if case.role == "generation" else forward_length(case.kind, case.Lp, case.Lr, opts)
    return case.B * case.R * per_row


def fit_role(role: str, calls: Sequence[float], toks: Sequence[float], kernels: Sequence[float],
             measured: Sequence[float]) -> RoleFit:
    """`call` and `token` >= 0 minimising the relative error of kernels + call * calls + token * toks."""
    m = np.asarray(measured, dtype=float)
    extra, w = (m - np.asarray(kernels, dtype=float)) / m, 1.0 / m
    X = np.stack([np.asarray(calls, dtype=float) * w, np.asarray(toks, dtype=float) * w], axis=1)
    best = (0.0, 0.0)
    for cols in ((0, 1), (0,), (1,)):  # both terms, else the one that fits alone (non-negative least squares)
        c, *_ = np.linalg.lstsq(X[:, cols], extra, rcond=None)
        if (c >= 0).all():
            coef = [0.0, 0.0]
            for j, v in zip(cols, c):
                coef[j] = float(v)
            if _sq(X, extra, coef) < _sq(X, extra, best):
                best = (coef[0], coef[1])
    fitted = np.asarray(kernels, dtype=float) + best[0] * np.asarray(calls, dtype=float) + best[1] * np.asarray(
        toks, dtype=float)
    return RoleFit(role, best[0], best[1], len(m), mape(kernels, m), mape(fitted, m))


def _sq(X: np.ndarray, y: np.ndarray, coef) -> float:
    return float(np.sum((y - X @ np.asarray(coef)) ** 2))


@dataclass(frozen=True)
class KernelCheck:
    """Forwards of the kernel campaign to time again beside the operators, with what each took in the campaign.

    The campaign times its forwards with every device busy; the operators run on one worker a minute later.
    Subtracted as the campaign timed them, the kernels left a residual of the wrong size whenever the two moments or
    conditions differed (the generation's call term clipped to 0 in 7 of 17 profiles; docs/calibration.md)."""

    forwards: tuple[tuple[Any, float], ...]  # (calibrate.ForwardCase, its seconds in the campaign)
    statistic: str  # the campaign's statistic of a forward's repeats (measure.STATISTICS)
    dtype: str
    # The campaign's own worker function that times one forward (calibrate._measure_forward: ctx, case, dtype,
    # min_time, repeats, busy ranks), handed over so that this module does not import the calibration's.
    time_forward: Callable[..., Optional[list[float]]]
    repeats: int = 3  # per forward and round of the operators' grid
    co_run: Any = None  # calibrate.CoRunning: the campaign's `[overhead] co_run`, written with this table


@dataclass(frozen=True)
class OperatorFits:
    """Every role's fit, and the kernels' time beside the operators against their campaign's."""

    roles: tuple[RoleFit, ...]
    kernel_scale: float  # 1.0 where nothing was checked
    checked: int  # forwards timed again
    statistic: str  # of each operator's repeats: the campaign's (median where nothing was checked)
    # per round of the grid, s of the speed witness after each of its operators (validate._OpRuns)
    witness: tuple[tuple[float, ...], ...] = ()

    @property
    def witness_rounds(self) -> list[float]:
        """Each round's median speed witness (rounds where none ran left out)."""
        return [float(np.median(r)) for r in self.witness if r]

    @property
    def witness_s(self) -> float:
        """The [overhead] witness, what a run's operator pays for its witness and what a run's workers' witnesses are
        held against: the fastest round's median, as the operators keep their fastest repeat where the campaign does
        (the rounds' medians' median where it keeps the median; 0.0 where none ran): the speed their prices describe."""
        rounds = self.witness_rounds
        return summarize(rounds, self.statistic) if rounds else 0.0


def moved_forward_terms(F_peak: float, t_layer: float, scale: float) -> tuple[float, float]:
    """(F_peak, t_layer) that make every forward's kernel time (W / (F_peak eta) + layers t_layer) `scale` times as
    long: what the fit subtracts (`moved_kernels`) and what rpeg-calibrate writes (calibrate.profile_mapping)."""
    return F_peak / scale, t_layer * scale


def moved_kernels(hw: Hardware, scale: float) -> Hardware:
    """`hw` with every forward's kernel time `scale` times as long (`moved_forward_terms`)."""
    F_peak, t_layer = moved_forward_terms(hw.F_peak, hw.t_layer, scale)
    return replace(hw, F_peak=F_peak, t_layer=t_layer,
                   F_peak_fp32=None if hw.F_peak_fp32 is None else hw.F_peak_fp32 / scale)


def kernel_scale(now: Sequence[Sequence[float]], campaign: Sequence[float], statistic: str) -> float:
    """The median over forwards of their time beside the operators (the campaign's statistic of the repeats `now[i]`)
    over their time in the campaign."""
    ratios = [summarize(samples, statistic) / then for samples, then in zip(now, campaign) if samples and then > 0]
    if not ratios:
        raise RpegError(None, "no kernel forward was timed beside the operators")
    return float(np.median(ratios))


def operator_overheads(hw: Hardware, plan: OverheadPlan = FULL, quiet: bool = True,
                       check: Optional[KernelCheck] = None) -> OperatorFits:
    """Every role's fit over the backend's operators on one worker (~15 s), against the kernel terms of `hw` moved by
    `check`'s forwards timed after every round on the same worker (`moved_kernels`; none: as `hw` prices them)."""
    from rpegc.tools import validate

    cases = grid_cases(plan)
    now: list[list[float]] = [[] for _ in (check.forwards if check else ())]
    witness: list[tuple[float, ...]] = []

    def after_round(pool) -> None:
        witness.append(tuple(pool.run(validate.take_witness)[0]))
        for samples, (case, _) in zip(now, check.forwards if check else ()):
            samples += pool.run(check.time_forward, case, check.dtype, 0.0, check.repeats, 1)[0]

    measured = validate.measure(cases, 1, repeats=plan.repeats, warmup=WARMUP, quiet=quiet, after_round=after_round)
    scale = kernel_scale(now, [t for _, t in check.forwards], check.statistic) if check else 1.0
    statistic = check.statistic if check else "median"
    bare = replace(moved_kernels(hw, scale), overhead=Overhead())
    opts = cost_options(validate.BACKEND_COST_OPTIONS)  # the options that describe the torch backend
    timed = [(c, summarize(m[0], statistic)) for c, m in zip(cases, measured)]
    fits = {}
    for role in ROLES:
        picked = [(c, s) for c, s in timed if c.role == role and not recomputes(c)]
        fits[role] = _fit(role, picked, [validate.predict(c, bare, opts, 1).T_op for c, _ in picked], opts)
    # a recomputing step less its kernels (the recomputed forward's among them) and the training fit's terms
    picked = [(c, s) for c, s in timed if recomputes(c)]
    train = fits["training"]
    base = [validate.predict(c, bare, opts, 1).T_op + train.call * c.mb + train.token * tokens(c, opts)
            for c, _ in picked]
    fits["recompute"] = _fit("recompute", picked, base, opts)
    return OperatorFits(tuple(fits[name] for name in FITS), scale, len(now), statistic, tuple(witness))


def grid_cases(plan: OverheadPlan) -> list:
    """The overheads' operators (validate.Case): every role of every model at every shape, training without
    recomputation, and the recompute shapes' training recomputing (a model name of its own: one backend worker trains
    one way)."""
    from rpegc.tools import validate

    archs = {**validate.VALIDATION_ARCHS, "llama-small": LLAMA_SMALL}
    plain, recomputing = TrainSpec(recompute="none"), TrainSpec(recompute="interval")
    cases = [validate.Case(role, kind, name, archs[name], B, R, Lp, Lr, 1, 1, 1, 1, positions=positions,
                           train=plain if role == "training" else TrainSpec())
             for name, positions in plan.models for B, R, Lp, Lr in plan.shapes
             for role, kind in validate.VALIDATION_OPERATORS]
    return cases + [validate.Case("training", "policy", name + RECOMPUTING, archs[name], B, R, Lp, Lr, 1, 1, 1, 1,
                                  positions=positions, train=recomputing)
                    for name, positions in plan.models for B, R, Lp, Lr in plan.recompute_shapes]


def recomputes(case) -> bool:
    """Whether a grid case (validate.Case) is a training step that recomputes its activations."""
    return case.training is not None and case.training.recompute != "none"


def _fit(name: str, picked: list, kernels: list[float], opts: CostOptions) -> RoleFit:
    if not picked:  # a plan without recompute shapes
        return RoleFit(name, 0.0, 0.0, 0, 0.0, 0.0)
    return fit_role(name, [c.mb for c, _ in picked], [tokens(c, opts) for c, _ in picked], kernels,
                    [s for _, s in picked])


# The control program's plan: generation and the inferences on the first worker, training on the last.
CONTROL_PLAN = """rpeg.plan @p for @grpo on @c {{
  @gen at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @ref_inf at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @reward_inf at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, {last}) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
}}
"""
# ... and every vertex data-parallel over the first `n` workers, each with the control program's prompts: siblings
# computing on `n` cores at once (`ControlRuns.co_busy`), each what the control program computes on one worker alone.
SIBLINGS_PLAN = """rpeg.plan @p for @grpo on @c {{
  @gen at (0, 0, 0) extent (1, 1, {n}) dp = {n} pp = 1 tp = 1 mb = 1
  @ref_inf at (0, 0, 0) extent (1, 1, {n}) dp = {n} pp = 1 tp = 1 mb = 1
  @reward_inf at (0, 0, 0) extent (1, 1, {n}) dp = {n} pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, {n}) dp = {n} pp = 1 tp = 1 mb = 1
}}
"""
PROMPTS = 4  # the control program's B


def control_program(profile: str, devices: int, siblings: int = 0) -> str:
    """A GRPO of the tiny preset with a toy reward model (its rule runs there) on `devices` workers of the hardware
    profile `profile`, training with staleness 1 (as the demo's plans overlap it): the runtime's own round trips and
    transfers, with every core busy as in a run. `siblings` > 0: every vertex data-parallel over that many workers,
    each with PROMPTS prompts (`ControlRuns.co_busy`)."""
    plan = SIBLINGS_PLAN.format(n=siblings) if siblings else CONTROL_PLAN.format(last=devices - 1)
    return grpo(Workload(PROMPTS * max(1, siblings), 4, 4, 4, "fp32"), Model("tiny"), direct_edges=True,
                staleness={"actor": 1}, cluster=Cluster(1, 1, devices, profile, name="c"), plan=plan)


@dataclass(frozen=True)
class ControlFit:
    """What a short real run says of the runtime beside its operators."""

    node: float  # s per node: report, reaction, command (runtime/report.control_overhead)
    transfer: float  # s per transfer of a data field beside its link's priced time (median over the steady ones)
    nodes: int  # steady nodes measured
    transfers: int  # steady transfers of data fields measured
    devices: int
    op_s: float  # the operators' measured time of a steady step (the median step's sum)
    nodes_per_step: float
    forward_s: float = 0.0  # the same of its generation and inference operators (no collective in them)
    # the median over steps of the time its operators' threads waited for a core while they ran (trace `waited`);
    # None where the workers could not measure it (no per-thread scheduler statistics)
    op_wait_s: Optional[float] = None
    # the same as `transfer` of the transfers that move a model's weights (transfer.moves_weights), and how many; None
    # where the run has none
    transfer_weights: Optional[float] = None
    weight_transfers: int = 0


def control_run(hw_text: str, steps: int, devices: int, siblings: int = 0) -> ControlFit:
    """The runtime's control round trip and a transfer's fixed cost in a run of `control_program` (`siblings`: its
    data-parallel form) over `steps` steps on `devices` workers, priced with the profile `hw_text` (TOML, without
    [overhead]): rpegc lowers it, rpeg-run runs it and its trace says."""
    from rpegc.cli import main as rpegc_main
    from rpegc.runtime.cli import main as run_main
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.report import control_overhead, steady_state
    from rpegc.runtime.trace import read_trace
    from rpegc.runtime.verify import compare

    with tempfile.TemporaryDirectory(prefix="rpeg-overhead-") as tmp:
        d = Path(tmp)
        (d / "profile.toml").write_text(hw_text, encoding="utf-8")
        (d / "grpo.rpeg").write_text(control_program(str(d / "profile.toml"), devices, siblings), encoding="utf-8")
        pipeline = (f"verify-wellformed,unroll{{k={steps}}},split-quantiles,insert-comm,insert-reshard,fuse-stages,"
                    "annotate-cost,schedule")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = rpegc_main([str(d / "grpo.rpeg"), "-p", pipeline, "-o", str(d / "grpo.exec.rpeg")])
            if rc == 0:
                rc = run_main([str(d / "grpo.exec.rpeg"), "--backend", "torch", "--quiet",
                               "--trace", str(d / "trace.jsonl")])
        if rc != 0:
            raise RpegError(None, "the control round trip's run failed:\n" + out.getvalue()[-2000:])
        plan = load_plan(str(d / "grpo.exec.rpeg"))
        trace = read_trace(str(d / "trace.jsonl"))
    control, steady = control_overhead(plan.pred_ids(), trace), steady_state(trace)
    if control is None or steady is None:
        raise RpegError(None, "the control round trip's run has no steady state")
    timed = [t for t in compare(plan, trace).nodes if steady.first_step <= t.step <= steady.last_step]
    moved = [t for t in timed if t.kind != "op" and t.predicted_time is not None]
    heavy = [moves_weights(plan.nodes[plan.index[t.id]].node) for t in moved]
    extra = [t.measured_time - t.predicted_time for t, w in zip(moved, heavy) if not w]
    weights = [t.measured_time - t.predicted_time for t, w in zip(moved, heavy) if w]
    transfer = max(0.0, float(np.median(extra))) if extra else 0.0
    ops = [t for t in timed if t.kind == "op"]
    forwards = [t for t in ops if plan.nodes[plan.index[t.id]].node.role != "training"]
    waits = [trace.nodes[t.id].waited for t in ops]
    return ControlFit(control.per_node_s, transfer, control.nodes, len(extra), devices, step_median(ops),
                      len(timed) / max(1, len({t.step for t in ops})), step_median(forwards),
                      step_median(ops, waits) if ops and None not in waits else None,
                      max(0.0, float(np.median(weights))) if weights else None, len(weights))


def step_median(timed, values: Optional[Sequence[float]] = None) -> float:
    """The median over steps of the measured time of the nodes `timed` of each step (or the sum of their `values`)."""
    per_step: dict[int, float] = {}
    for i, t in enumerate(timed):
        per_step[t.step] = per_step.get(t.step, 0.0) + (t.measured_time if values is None else values[i])
    return float(np.median(list(per_step.values()))) if per_step else 0.0


@dataclass(frozen=True)
class ControlRuns:
    """The control program where the runtime's threads have a core to themselves (`free`: one worker) and where the
    workers take every core (`full`: one per core); either is None where the host's cores cannot give it. `pair` is
    its data-parallel form on two workers (siblings computing at once) and `alone` what each of them computes, on one
    worker (the control program there: on a 2-core host the free run itself); None where the host has one core."""

    free: Optional[ControlFit]
    full: Optional[ControlFit]
    pair: Optional[ControlFit] = None
    alone: Optional[ControlFit] = None
    cores: int = 2  # the host's

    @property
    def contention(self) -> float:
        """s of operator time the runtime's threads take from the operators per exec node on a host without a free
        core (core/cost/contention.py): what the full run's operators waited for a core in a steady step (their main
        threads runnable while another thread had their core), over its nodes; 0 where one of the runs is missing.
        Where the workers cannot measure their waits, the full run's operator time beyond the free run's: a
        difference of two runs, which the machine's moment moves as much as the contention (docs/calibration.md,
        "Where the runtime's threads wait, measured per node")."""
        if self.free is None or self.full is None:
            return 0.0
        if self.full.op_wait_s is not None:
            return self.full.op_wait_s / self.full.nodes_per_step
        return max(0.0, self.full.op_s - self.free.op_s) / self.full.nodes_per_step

    @property
    def co_busy(self) -> float:
        """What an operator's time grows by with every other core of its host computing a sibling
        (contention.co_busy_stretch): the pair's generation and inference operators against the same on one worker
        (`alone`), beyond the contention stretch the pair's host prices where it takes every core, scaled from the
        pair's one sibling to the host's other cores; 0 where a run is missing."""
        pair, alone = self.pair, self.alone
        if pair is None or alone is None or alone.forward_s <= 0 or pair.op_s <= 0:
            return 0.0
        floating = 1.0 + (self.contention * pair.nodes_per_step / (pair.devices * pair.op_s)
                          if pair.devices >= self.cores else 0.0)
        return max(0.0, pair.forward_s / (alone.forward_s * floating) - 1.0) * (self.cores - 1) / (pair.devices - 1)

    @property
    def transfers(self) -> ControlFit:
        """The run whose transfers price a transfer's fixed cost (the one with two workers)."""
        return max((r for r in (self.full, self.free) if r is not None), key=lambda r: r.devices)


def control_runs(hw_text: str, steps: int, cores: int) -> ControlRuns:
    """The control program on one worker (a core left for the runtime's threads) and on a worker per core, on a
    host of `cores` cores: a 2-core host gives both; a 1-core host only the full run; a larger one only runs on two
    workers, which leave its other cores free (the full condition would need a worker per core). Where there are two
    cores or more, the pair too, held against the program on one worker (`ControlRuns.co_busy`): on a 2-core host
    that is the free run, one worker start-up (3-6 s of the first-use calibration) less."""
    alone = control_run(hw_text, steps, 1)
    if cores <= 1:
        return ControlRuns(None, alone, cores=cores)
    pair = control_run(hw_text, steps, 2, siblings=2)
    if cores == 2:
        return ControlRuns(alone, control_run(hw_text, steps, 2), pair, alone, cores)
    return ControlRuns(control_run(hw_text, steps, 2), None, pair, alone, cores)


@dataclass(frozen=True)
class OverheadTable:
    """The `[overhead]` table's TOML, and the scale of the kernel terms it was fitted against (`moved_kernels`)."""

    text: str
    kernel_scale: float


def overhead_table(hw: Hardware, hw_text: str, plan: OverheadPlan = FULL, quiet: bool = True,
                   check: Optional[KernelCheck] = None) -> OverheadTable:
    """The `[overhead]` table of this machine's profile, every value with how it was measured; `hw` is the profile
    so far (its kernel terms), `hw_text` the same as TOML, `check` the campaign's forwards (`operator_overheads`):
    the profile's F_peak and t_layer must be moved by the table's `kernel_scale` to price what it was fitted to."""
    from rpegc.runtime.report import host_cores

    operators = operator_overheads(hw, plan, quiet, check)
    fits = {f.role: f for f in operators.roles}
    runs = control_runs(hw_text, plan.steps, host_cores())
    shapes = ", ".join(f"{B}x{R}/{Lp}+{Lr}" for B, R, Lp, Lr in plan.shapes)
    models = " and ".join(f"{name} ({positions} positions)" for name, positions in plan.models)
    kernels = (f"the kernel terms x {operators.kernel_scale:.3g} (F_peak and t_layer moved so): {operators.checked} "
               "of the campaign's forwards took that long against the campaign's time, timed after every round"
               if operators.checked else "the kernel terms as the profile prices them")
    lines = ["", "# What operators cost beyond their kernels on this machine (tools/overhead_timing.py): the backend's "
             f"operators of {models}",
             f"# over B x R / Lp + Lr = {shapes} on one worker ({operators.statistic} of {plan.repeats}), "
             f"less {kernels},", "# fitted per role in relative error; the runtime's own costs from short real runs.",
             "[overhead]"]
    for role in ROLES:
        f = fits[role]
        lines += [f"{role}_call = {f.call:.6g}    # s per microbatch; {f.points} operators, MAPE {f.mape_before:.1%} "
                  f"without the overhead, {f.mape_after:.1%} with it"
                  + (" (training without recomputation)" if role == "training" else ""),
                  f"{role}_token = {f.token:.6g}    # s per "
                  + ("token (prompt and response) of a row" if role == "generation" else
                     "token a row runs (work.forward_length)") + "; same fit"]
    f = fits["recompute"]
    if f.points:
        lines += [f"recompute_call = {f.call:.6g}    # s per microbatch of a recomputed forward beyond its kernels: "
                  f"{f.points} training operators recomputing (interval) less their kernels and the training terms, "
                  f"MAPE {f.mape_before:.1%} without it, {f.mape_after:.1%} with it",
                  f"recompute_token = {f.token:.6g}    # s per token a row runs; same fit"]
    return OverheadTable("\n".join(lines + control_lines(runs, plan.steps) + co_run_lines(check)
                                   + witness_lines(operators) + [""]), operators.kernel_scale)


def witness_lines(operators: OperatorFits) -> list[str]:
    """The `witness` key: the speed witness after the grid's operators (`OperatorFits.witness_s`; none where none
    ran)."""
    if not operators.witness:
        return []
    how = ("the fastest round's median (the operators keep their fastest repeat)" if operators.statistic == "min"
           else "the median of the rounds' medians")
    rounds = ", ".join(f"{1e3 * s:.3g}" for s in operators.witness_rounds)
    return [f"witness = {operators.witness_s:.6g}    # s per operator: the speed witness (runtime/speed_probe.py) a "
            f"run's workers end every operator with and are held against, timed after each of the grid's "
            f"{sum(map(len, operators.witness))} operators, {how}; the rounds' medians {rounds} ms"]


def co_run_lines(check: Optional[KernelCheck]) -> list[str]:
    """The `co_run` key where the campaign measured it (`calibrate._co_running`)."""
    c = check.co_run if check is not None else None
    if c is None:
        return []
    return [f"co_run = {c.value:.6g}    # an operator's time grows by this with other operators or processes on every "
            f"other core: the median of {c.forwards} narrow forwards on {c.busy} workers at once against one alone, "
            "alternated (the first worker's time)"]


def contention_source(runs: ControlRuns) -> str:
    """How `contention` was measured (`ControlRuns.contention`), for its line's comment."""
    full, free = runs.full, runs.free
    assert full is not None and free is not None
    if full.op_wait_s is not None:
        return (f"a steady step's operators on {full.devices} workers waited {1e3 * full.op_wait_s:.4g} ms for a core "
                f"(they took {1e3 * full.op_s:.4g} ms, {1e3 * free.op_s:.4g} on {free.devices})")
    return (f"a steady step's operators {1e3 * full.op_s:.4g} ms on {full.devices} workers against "
            f"{1e3 * free.op_s:.4g} ms on {free.devices}")


def control_lines(runs: ControlRuns, steps: int) -> list[str]:
    """The [overhead] keys of the runtime's own costs, each with the run it was measured in."""
    def run(r: ControlFit) -> str:
        return f"a {steps}-step GRPO of the tiny preset on {r.devices} worker(s)"

    t = runs.transfers
    lines = [f"transfer = {t.transfer:.6g}    # s per transfer of a data field beside its link's terms: median over "
             f"{t.transfers} transfers of {run(t)}"]
    if t.transfer_weights is not None:
        lines.append(f"transfer_weights = {t.transfer_weights:.6g}    # s per transfer of a model's weights beside its "
                     f"link's terms: median over {t.weight_transfers} of the same run's")
    node = runs.full or runs.free
    where = "every core taken" if runs.full is not None else "cores left free: no run here takes every core"
    lines.append(f"node = {node.node:.6g}    # s per exec node: report, reaction, command (rpeg-run's control "
                 f"overhead over {node.nodes} nodes of {run(node)}; {where})")
    if runs.full is not None and runs.free is not None:
        lines += [f"node_free = {runs.free.node:.6g}    # the same on {run(runs.free)}, a core left free",
                  f"contention = {runs.contention:.6g}    # s of operator time per exec node taken by the runtime's "
                  f"threads: {contention_source(runs)}, over {runs.full.nodes_per_step:.3g} nodes a step"]
    if runs.pair is not None and runs.alone is not None:
        lines.append(f"co_busy = {runs.co_busy:.6g}    # an operator's time grows by this with its siblings on every "
                     f"other core: a steady step's generation and inference {1e3 * runs.pair.forward_s:.4g} ms data-"
                     f"parallel on {run(runs.pair)} against {1e3 * runs.alone.forward_s:.4g} ms of one's share on "
                     f"{runs.alone.devices}, beyond the contention stretch")
    return lines
