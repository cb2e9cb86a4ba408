"""The optimizer's summary table and progress bar (stderr), as plain rows and as a rich rendering.

Rows: the chosen structure, best score and objective, how each training vertex trains in the chosen plan (its
ZeRO stage and recomputation are plan choices), whether its training operators run fused (stage fusion) and what
that gained, gains over the greedy and concurrent baselines
(Sec. VIII-B; "OOM" when a baseline does not fit), makespan, peak memory, utilization, evaluations,
evaluations per second, the cache hit rate, and per structural variant its best plan and what the search
spent on it (evaluations, chains, seconds).
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from rpegc.core.cost.host import shared_devices
from rpegc.search.optimizer import BaselineResult, OptimizeResult, Progress

GIB = 1024**3


def _gain(result: OptimizeResult, base: Optional[BaselineResult]) -> str:
    if base is None:
        return "n/a"
    b = base.evaluation
    if not b.feasible and b.r_host > 1.0 >= b.r_peak:
        return (f"baseline needs more host cores than a host has ({b.r_host:.2f}x); {b.score:,.0f} tok/s if it had "
                "them")
    if not b.feasible:
        return f"baseline OOM (r_peak {b.r_peak:.2f}); {b.score:,.0f} tok/s if it fit"
    gain = result.evaluation.score / b.score - 1.0
    return f"{gain:+.1%} ({b.score:,.0f} tok/s)"


def _training_rows(result: OptimizeResult) -> list[tuple[str, str]]:
    """One row per training vertex of the chosen plan: how it trains (resolved over the workload's fields)."""
    p = result.program
    if p.graph is None or p.plan is None:
        return []
    placed = {pl.vertex: pl for pl in p.plan.placements}
    rows = []
    for v in p.graph.vertices:
        if v.role == "training" and v.name in placed:
            t = p.workload.training(placed[v.name].strategy.train)
            rows.append((f"training @{v.name}", f"{t.precision}, ZeRO-{t.zero}, recompute {t.recompute}, "
                                                f"{t.schedule}"))
    return rows


def _pool_rows(result: OptimizeResult) -> list[tuple[str, str]]:
    """One row per verify vertex of the chosen plan: its pool and the host cores it shares (cost/host.py)."""
    p = result.program
    if p.plan is None or not p.plan.pools:
        return []
    cores = result.hardware.host_cores if result.hardware else None
    left = f" of the host's {cores} cores" if cores else ""
    rows = []
    for pool in p.plan.pools:
        shared = shared_devices(pool.size, cores, p) if cores else ()
        sharing = f", sharing the cores of device{'s' if len(shared) > 1 else ''} " \
                  f"{', '.join(map(str, shared))}" if shared else ""
        needed = f" (host cores needed: {result.evaluation.r_host:.0%})"
        rows.append((f"verifier @{pool.vertex}",
                     f"a pool of {pool.size} host process{'es' if pool.size > 1 else ''}{left}{sharing}{needed}"))
    return rows


def _fusion_row(result: OptimizeResult) -> list[tuple[str, str]]:
    """Stage fusion in the chosen plan: fused and what it gained, or why not."""
    f = result.fusion
    if f is None:
        return []
    which = "; ".join(" + ".join("@" + v for v in g) for g in f.groups)
    if f.chosen and f.fused is not None:
        gain = f.fused.makespan / f.apart.makespan - 1.0
        text = (f"{which} fused: makespan {f.fused.makespan:.3f} s against {f.apart.makespan:.3f} s apart "
                f"({gain:+.1%})")
    elif f.fused is None:
        text = "no training operators share devices and layout in this plan" + ("" if f.enabled else " (not searched)")
    elif not f.enabled:
        text = f"{which} could fuse: {f.fused.makespan:.3f} s against {f.apart.makespan:.3f} s apart (not searched)"
    else:
        text = (f"{which} could fuse, apart is better: {f.fused.makespan:.3f} s fused against "
                f"{f.apart.makespan:.3f} s apart" + ("" if f.fused.feasible else " (fused does not fit)"))
    return [("stage fusion", text)]


def summary_rows(result: OptimizeResult) -> list[tuple[str, str]]:
    e = result.evaluation
    peak = max(e.peak) if e.peak else e.r_peak
    s = result.stats
    rows = [
        ("structure", f"{result.variant.label()}  ({result.source})"),
        ("score", f"{e.score:,.0f} tokens/s  (makespan {e.makespan:.3f} s over the horizon)"),
        ("objective", f"{result.objective} = {result.value:,.4g}"),
        *_training_rows(result),
        *_pool_rows(result),
        *_fusion_row(result),
        *([("hardware", f"'{result.hardware.name}': {result.hardware.provenance()}")] if result.hardware else []),
        ("gain over greedy", _gain(result, result.greedy)),
        ("gain over concurrent", _gain(result, result.concurrent)),
        ("memory peak", f"{peak / GIB:.1f} GiB per GPU, r_peak = {e.r_peak:.3f}" + ("" if e.feasible else "  (OOM)")),
        ("utilization", f"{e.util:.1%}  (P_eff {e.p_eff:.2f})"),
        ("evaluations", f"{s.evaluations:,} in {result.seconds:.1f} s: {s.evaluations / max(result.seconds, 1e-9):,.0f}/s "
                        f"overall, {s.rate:,.0f}/s inside the evaluator"),
        ("cache hit rate", f"{s.hit_rate:.1%}  ({s.hits:,} hits)"),
        ("search", f"{result.chains} chains, {result.rounds} rounds"
                   + (f", polish {result.polish_evaluations:,} evaluations" if result.variant_stats else "")
                   + f", {result.jobs} process{'es' if result.jobs > 1 else ''}"),
    ]
    if result.variant_stats:
        for v in result.variant_stats:
            best = f"{v.best.score:,.0f} tokens/s" if v.best is not None else "no feasible plan"
            spent = "skipped" if v.skipped else f"{v.evaluations:,} evals, {v.chains} chains, {v.seconds:.1f} s"
            rows.append((f"  {v.label}", f"{best}  ({spent})"))
    else:
        for label, best in result.variants:
            rows.append((f"  {label}", f"{best.score:,.0f} tokens/s" if best is not None else "no feasible plan"))
    return rows


def summary_text(result: OptimizeResult) -> str:
    rows = summary_rows(result)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def print_summary(result: OptimizeResult, file: Optional[TextIO] = None) -> None:
    """The summary table on `file` (default: the stderr of the moment, not of import time)."""
    from rich.console import Console
    from rich.table import Table

    file = file or sys.stderr
    table = Table(title="rpegc optimize", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for k, v in summary_rows(result):
        table.add_row(k, v)
    Console(file=file, width=None if file.isatty() else 110).print(table)


class ProgressBar:
    """A rich progress bar over the search budget (seconds or evaluations), on stderr."""

    def __init__(self, budget_s: float, evals: int, file: Optional[TextIO] = None, force: bool = False):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.budget_s, self.evals = budget_s, evals
        self.start = time.perf_counter()
        self.progress = Progress(
            TextColumn("optimize"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
            console=Console(file=file or sys.stderr, force_terminal=force or None), transient=True,
        )
        self.task = self.progress.add_task("optimize", total=1.0, info="")

    def __enter__(self) -> "ProgressBar":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, progress: Progress) -> None:
        done = 0.0
        if self.budget_s > 0:
            done = max(done, (time.perf_counter() - self.start) / self.budget_s)
        if self.evals > 0:
            done = max(done, progress.evaluations / self.evals)
        best = f"best {progress.best.score:,.0f} tok/s" if progress.best else "no feasible plan yet"
        info = f"{progress.evaluations:,} evals, {best}"
        self.progress.update(self.task, completed=min(1.0, done), info=info)
