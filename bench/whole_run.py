"""Issue 14, items 5 and 6: whole-run validation and the paper's Table V on the torch backend, measured.

Item 5 (whole-run fidelity): every plan below is compiled with the calibrated CPU profile (the cluster's
`hardware = "cpu"`: this machine's profile, rpegc/core/cost/machine.py), executed by
`rpeg-run`'s controller on the torch backend with 2 worker processes (one per core of a 2-core host: never
more workers than cores) and compared on the steady state (rpegc.runtime.report): the median interval
between step completions after the first step, measured against the schedule's. The workloads are
bench/whole_run/*.rpeg (GRPO and PPO, 4-block models of hidden 256 whose operators are predicted at 39-650 ms; reward
inference runs the reward model, `--reward model`, as the plan prices it). Reported: MAPE and Spearman rho
over the plans, the steady-state node error, and the control overhead (report, reaction and command
between a node becoming able to start and its start, per node and on each step's critical chain).

Item 6 (Table V): per workload, the greedy and concurrent baselines (Sec. VIII-B, `optimize{baseline=..}`)
against the optimized plan, all executed on the same runtime; predicted gain next to measured gain.
`optimized` searches the structure too (actor-critic sharing, staleness); `optimized-sync` keeps the
module's structure (tau = 0, separate models), as the paper's Table V does.

Also measured: the controller's cost per node on the sim backend at 2,048 devices (a 70B PPO, concurrent
baseline, unrolled 8 and 32 steps): run wall time / nodes, controller and simulated backend together.

Writes bench/results/whole_run.csv (one row per plan and repeat), whole_run_summary.csv (medians over
repeats), whole_run_table_v.csv, whole_run_control_sim.csv and whole_run.png (predicted vs measured).
No test asserts a time. Usage:
    .venv/bin/python bench/whole_run.py [--repeats 2] [--steps 6] [--quick] [--out DIR] [--no-plot]
About 12 minutes on 2 cores with 2 repeats (--quick: one workload, two plans, ~1 minute).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rpegc.tools.validate import spearman

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD_DIR = ROOT / "bench" / "whole_run"
PIPELINE = "verify-wellformed,{optimize}unroll{{k={k}}},split-quantiles,insert-comm,insert-reshard,{annotate},schedule"
SEARCH = "evals=3000 seed=0 steps={k}"  # an evaluation budget: the same plan on any machine

BOTH = "at (0, 0, 0) extent (1, 1, 2)"
DEV0 = "at (0, 0, 0) extent (1, 1, 1)"
DEV1 = "at (0, 0, 1) extent (1, 1, 1)"


def strategy(dp: int = 1, pp: int = 1, tp: int = 1, mb: int = 1) -> str:
    return f"dp = {dp} pp = {pp} tp = {tp} mb = {mb}"


DP2, TP2, PP2, ONE = strategy(dp=2), strategy(tp=2), strategy(pp=2, mb=2), strategy()
GRPO = ("gen", "ref_inf", "reward_inf", "train_actor")
PPO = ("gen", "ref_inf", "reward_inf", "critic_inf", "train_actor", "train_critic")


@dataclass(frozen=True)
class PlanSpec:
    name: str
    kind: str  # hand | greedy | concurrent | optimized
    placements: Optional[dict[str, str]] = None  # vertex -> "at ... extent ... dp = .." (hand plans)
    optimize: str = ""  # the optimize pass (search plans)


def hand(name: str, **placements: str) -> PlanSpec:
    return PlanSpec(name, "hand", placements=placements)


def same(vertices: tuple[str, ...], where: str) -> dict[str, str]:
    return {v: where for v in vertices}


def search_plans() -> list[PlanSpec]:
    return [PlanSpec("greedy", "greedy", optimize="baseline=greedy"),
            PlanSpec("concurrent", "concurrent", optimize="baseline=concurrent"),
            PlanSpec("optimized", "optimized", optimize=SEARCH),
            PlanSpec("optimized-sync", "optimized", optimize=SEARCH + " taus=0 ac=false")]


PLANS: dict[str, list[PlanSpec]] = {
    "grpo": [
        hand("all-dp2", **same(GRPO, f"{BOTH} {DP2}")),
        hand("all-tp2", **same(GRPO, f"{BOTH} {TP2}")),
        hand("train-tp2", **{**same(GRPO, f"{BOTH} {DP2}"), "train_actor": f"{BOTH} {TP2}"}),
        hand("train-pp2", **{**same(GRPO, f"{BOTH} {DP2}"), "train_actor": f"{BOTH} {PP2}"}),
        hand("split", gen=f"{DEV0} {ONE}", ref_inf=f"{DEV1} {ONE}", reward_inf=f"{DEV1} {ONE}",
             train_actor=f"{DEV0} {ONE}"),
    ] + search_plans(),
    "ppo": [
        hand("all-dp2", **same(PPO, f"{BOTH} {DP2}")),
        hand("all-tp2", **same(PPO, f"{BOTH} {TP2}")),
        hand("split", gen=f"{DEV0} {ONE}", ref_inf=f"{DEV1} {ONE}", reward_inf=f"{DEV1} {ONE}",
             critic_inf=f"{DEV1} {ONE}", train_actor=f"{DEV0} {ONE}", train_critic=f"{DEV1} {ONE}"),
    ] + search_plans(),
    "grpo-long": [hand("all-dp2", **same(GRPO, f"{BOTH} {DP2}"))] + search_plans(),
}


def program_text(workload: str, spec: PlanSpec) -> str:
    """The workload's module with its plan block replaced by a hand plan's placements (search plans keep
    the file's plan: the optimizer replaces it)."""
    text = (WORKLOAD_DIR / f"{workload}.rpeg").read_text()
    if spec.placements is None:
        return text
    m = re.search(r"^rpeg\.plan (@\w+ for @\w+ on @\w+) \{\n(.*?)^\}", text, flags=re.M | re.S)
    if m is None:
        raise SystemExit(f"{workload}.rpeg has no plan block")
    body = "".join(f"  @{v} {where}\n" for v, where in spec.placements.items())
    return text[:m.start()] + f"rpeg.plan {m.group(1)} {{\n{body}}}" + text[m.end():]


def pipeline(optimize: str, steps: int, hardware: Optional[str]) -> str:
    """The lowering, with `optimize` (its options; "" for none) first, and the profile `hardware` (None:
    the cluster's own: this machine's, rpegc/core/cost/machine.py) for both the optimizer and the cost annotation."""
    hw = f'hardware="{hardware}"' if hardware else ""
    opt = f"optimize{{{' '.join(x for x in (optimize, hw) if x)}}}," if optimize else ""
    return PIPELINE.format(optimize=opt, k=steps, annotate=f"annotate-cost{{{hw}}}" if hw else "annotate-cost")


def compile_plan(work: Path, workload: str, spec: PlanSpec, steps: int, hardware: Optional[str]) -> Path:
    src, out = work / f"{workload}-{spec.name}.rpeg", work / f"{workload}-{spec.name}.exec.rpeg"
    src.write_text(program_text(workload, spec))
    rpegc(src, pipeline(spec.optimize.format(k=steps), steps, hardware), out)
    return out


def rpegc(src: Path, pipeline: str, out: Path) -> None:
    """Compile `src` with `pipeline` into `out`; the optimizer's report is shown only if compiling fails."""
    import contextlib
    import io

    from rpegc.cli import main as rpegc_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = rpegc_main([str(src), "-p", pipeline, "-o", str(out)])
    if rc != 0:
        raise SystemExit(f"cannot compile {src}:\n{err.getvalue()}")


def placement_summary(plan) -> str:
    """One line per plan: structure and each vertex's allocation and strategy (what dedupes plans)."""
    p = plan.program
    parts = []
    for pl in p.plan.placements if p.plan else ():
        s = pl.strategy
        parts.append(f"{pl.vertex}@{pl.alloc.origin[2]}+{pl.alloc.extent[2]}:d{s.dp}p{s.pp}t{s.tp}m{s.mb}")
    taus = ",".join(f"{m}={t}" for m, t in sorted(plan.tau.items()))
    return " ".join(parts) + f" tau({taus})"


def measure(plan_path: Path, steps: int, lookahead: int = 2) -> dict:
    from rpegc.runtime.controller import RunOptions, run
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.report import control_overhead, steady_state
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend
    from rpegc.runtime.verify import compare, verify

    plan = load_plan(str(plan_path), steps=steps)
    result = run(plan, TorchBackend(seed=0, reward="model"), RunOptions(lookahead=lookahead))
    violations = verify(plan, result.trace)
    if violations:
        raise SystemExit(f"{plan_path}: the trace does not verify: {violations[0]}")
    steady = steady_state(result.trace)
    control = control_overhead(plan.pred_ids(), result.trace)
    assert steady is not None and steady.predicted_s and control is not None
    ops = [n for n in plan.nodes if n.kind == "op"]
    cmp = compare(plan, result.trace)
    steady_ops = [t.rel_error for t in cmp.nodes if t.kind == "op" and t.step in set(cmp.steady_steps)]
    return {
        "predicted_s": steady.predicted_s,
        "measured_s": steady.measured_s,
        "ratio": steady.measured_s / steady.predicted_s,
        "node_error": cmp.steady_abs_rel_error,  # every node, transfers included (predicted in microseconds)
        "op_error": statistics.fmean(abs(e) for e in steady_ops if e is not None),
        "control_ms_per_node": 1000 * control.per_node_s,
        "control_ms_per_step": 1000 * control.critical_s,
        "control_share": control.step_share,
        "startup_s": steady.startup_s,
        "nodes_per_step": len(plan.nodes) / plan.steps,
        "transfers_per_step": sum(1 for n in plan.nodes if n.is_transfer) / plan.steps,
        "min_op_predicted_ms": 1000 * min(n.node.finish - n.node.start for n in ops),
        "placements": placement_summary(plan),
    }


def sim_control(work: Path, ks: tuple[int, ...]) -> list[dict]:
    """Controller cost per node on the sim backend at 2,048 devices (70B PPO, concurrent baseline)."""
    from rpegc.runtime.backends.sim import SimBackend
    from rpegc.runtime.controller import run
    from rpegc.runtime.plan import load_plan

    sys.path.insert(0, str(ROOT / "bench"))
    from workloads import ppo_text

    src = work / "ppo-2048.rpeg"
    src.write_text(ppo_text(70, 70, 70, B=2048, Lp=128, Lr=384, racks=4, nodes=128, name="ppo-2048"))
    rows = []
    for k in ks:
        out = work / f"ppo-2048-k{k}.exec.rpeg"
        rpegc(src, pipeline("baseline=concurrent", k, None), out)
        plan = load_plan(str(out))
        walls = []
        for _ in range(5):
            start = time.perf_counter()
            run(plan, SimBackend())
            walls.append(time.perf_counter() - start)
        wall = statistics.median(walls)
        rows.append({"devices": 2048, "steps": k, "nodes": len(plan.nodes),
                     "transfers": sum(1 for n in plan.nodes if n.is_transfer),
                     "wall_s": round(wall, 4), "ms_per_node": round(1000 * wall / len(plan.nodes), 4)})
        print(f"sim, 2048 devices, {k} steps: {len(plan.nodes)} nodes in {wall:.3f} s, "
              f"{1000 * wall / len(plan.nodes):.3f} ms per node", flush=True)
    return rows


def twins(compiled: dict[tuple[str, str], tuple[PlanSpec, Path]]) -> dict[tuple[str, str], str]:
    """(workload, plan) -> the earlier plan of its workload it compiled to (same placements and staleness);
    such a plan is measured once, under its first name."""
    from rpegc.runtime.plan import load_plan

    first: dict[tuple[str, str], str] = {}
    out: dict[tuple[str, str], str] = {}
    for (w, name), (_, path) in compiled.items():
        key = (w, placement_summary(load_plan(str(path))))
        if key in first:
            out[(w, name)] = first[key]
        else:
            first[key] = name
    return out


def summarise(rows: list[dict], same: dict[tuple[str, str], str],
              order: list[tuple[str, str, str]]) -> list[dict]:
    """One row per (workload, plan, kind) of `order`: medians over repeats (measured_min_s: the fastest
    repeat); a plan that compiled to an earlier one's placements shows that plan's measurements, marked
    `same_as`, and is counted once in the statistics."""
    out: list[dict] = []
    for w, name, kind in order:
        twin = same.get((w, name), "")
        rs = [r for r in rows if (r["workload"], r["plan"]) == (w, twin or name)]
        first = rs[0]
        row = {"workload": w, "plan": name, "kind": kind}
        row.update({k: first[k] for k in ("placements", "predicted_s", "nodes_per_step", "transfers_per_step",
                                          "min_op_predicted_ms")})
        for k in ("measured_s", "node_error", "op_error", "control_ms_per_node", "control_ms_per_step", "control_share",
                  "startup_s"):
            row[k] = statistics.median(r[k] for r in rs)
        row["measured_min_s"] = min(r["measured_s"] for r in rs)
        row["ratio"] = row["measured_s"] / row["predicted_s"]
        row["repeats"] = len(rs)
        row["spread"] = (max(r["measured_s"] for r in rs) - row["measured_min_s"]) / row["measured_s"]
        row["same_as"] = twin
        out.append(row)
    return out


def statistics_of(summary: list[dict], measured: str = "measured_s") -> tuple[int, float, float]:
    """(distinct plans, whole-run MAPE, Spearman rho) over the plans measured under their own name."""
    uniq = [r for r in summary if not r["same_as"]]
    mape = statistics.fmean(abs(r["predicted_s"] - r[measured]) / r[measured] for r in uniq)
    return len(uniq), mape, spearman([r["predicted_s"] for r in uniq], [r[measured] for r in uniq])


def table_v(summary: list[dict]) -> list[dict]:
    rows = []
    for w in dict.fromkeys(r["workload"] for r in summary):
        by = {r["plan"]: r for r in summary if r["workload"] == w}
        for opt in ("optimized", "optimized-sync"):
            for base in ("greedy", "concurrent"):
                if opt in by and base in by:
                    o, b = by[opt], by[base]
                    rows.append({"workload": w, "optimized": opt, "baseline": base,
                                 "baseline_predicted_s": b["predicted_s"], "baseline_measured_s": b["measured_s"],
                                 "optimized_predicted_s": o["predicted_s"], "optimized_measured_s": o["measured_s"],
                                 "predicted_gain": b["predicted_s"] / o["predicted_s"],
                                 "measured_gain": b["measured_s"] / o["measured_s"]})
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)
    print(f"wrote {path}")


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 7.5))
    markers = {"hand": "o", "greedy": "s", "concurrent": "^", "optimized": "*"}
    colors = dict(zip(dict.fromkeys(r["workload"] for r in summary), ("tab:blue", "tab:orange", "tab:green")))
    lo = min(min(r["predicted_s"], r["measured_s"]) for r in summary) * 0.8
    hi = max(max(r["predicted_s"], r["measured_s"]) for r in summary) * 1.2
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey", alpha=0.15, label="±20%")
    placed: list[tuple[float, float]] = []
    drawn = [r for r in summary if not r["same_as"]]
    for r in summary:
        if r["same_as"]:
            continue  # drawn as its twin, whose label names it
        ax.scatter(r["predicted_s"], r["measured_s"], marker=markers[r["kind"]], color=colors[r["workload"]],
                   s=90 if r["kind"] == "optimized" else 45, zorder=3)
        alias = [x["plan"] for x in summary if x["workload"] == r["workload"] and x["same_as"] == r["plan"]]
        label = f"{r['workload']}/{r['plan']}" + (f" (= {', '.join(alias)})" if alias else "")
        near = sum(1 for p, m in placed if abs(p / r["predicted_s"] - 1) < 0.06 and abs(m / r["measured_s"] - 1) < 0.04)
        placed.append((r["predicted_s"], r["measured_s"]))
        # a point just right of this one at about the same height: the label goes to the left
        crowded = any(1 < x["predicted_s"] / r["predicted_s"] < 1.35 and abs(x["measured_s"] / r["measured_s"] - 1) < 0.05
                      for x in drawn)
        ax.annotate(label, (r["predicted_s"], r["measured_s"]), fontsize=6.5, xytext=(-5 if crowded else 5, -3 - 9 * near),
                    textcoords="offset points", ha="right" if crowded else "left")
    for w, c in colors.items():
        ax.scatter([], [], color=c, label=w)
    for k, m in markers.items():
        ax.scatter([], [], color="grey", marker=m, label=k)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted steady-state step time (s)")
    ax.set_ylabel("measured steady-state step time (s)")
    n, err, rho = statistics_of(summary)
    ax.set_title(f"Whole runs on the torch backend, 2 CPU workers (one per core): {n} distinct plans\n"
                 f"steady-state step, median of repeats: MAPE {100 * err:.1f} %, Spearman rho {rho:.3f}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=130)
    os.replace(tmp, path)
    print(f"wrote {path}")


def report(summary: list[dict], tv: list[dict]) -> None:
    uniq = [r for r in summary if not r["same_as"]]
    print(f"\n{'workload':10s} {'plan':15s} {'predicted':>9s} {'measured':>9s} {'m/p':>6s} {'op err':>8s} "
          f"{'ctl/node':>8s} {'ctl/step':>8s} {'spread':>6s}  placements")
    for r in summary:
        print(f"{r['workload']:10s} {r['plan']:15s} {r['predicted_s']:9.3f} {r['measured_s']:9.3f} {r['ratio']:6.3f} "
              f"{100 * r['op_error']:7.1f}% {r['control_ms_per_node']:6.2f}ms {100 * r['control_share']:7.2f}% "
              f"{100 * r['spread']:5.1f}%  {('= ' + r['same_as']) if r['same_as'] else r['placements']}")
    n, mape, rho = statistics_of(summary)
    _, mape_min, rho_min = statistics_of(summary, "measured_min_s")
    shares = sorted(r["control_share"] for r in uniq)
    print(f"\ndistinct plans {n} of {len(summary)}: whole-run MAPE {100 * mape:.1f} %, Spearman rho {rho:.3f} "
          f"(fastest repeat: MAPE {100 * mape_min:.1f} %, rho {rho_min:.3f}); control "
          f"{statistics.fmean(r['control_ms_per_node'] for r in uniq):.2f} ms per node, "
          f"{100 * statistics.median(shares):.2f} % of a step (median), {100 * shares[-1]:.2f} % at most")
    if tv:
        print(f"\n{'workload':10s} {'optimized':15s} {'baseline':10s} {'pred gain':>9s} {'meas gain':>9s}")
        for r in tv:
            print(f"{r['workload']:10s} {r['optimized']:15s} {r['baseline']:10s} {r['predicted_gain']:9.3f} "
                  f"{r['measured_gain']:9.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="RL steps per run (the first is start-up)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every plan, rounds over all plans")
    ap.add_argument("--quick", action="store_true", help="GRPO only, two plans, 4 steps, one repeat")
    ap.add_argument("--workloads", default=",".join(PLANS), help="comma-separated subset of " + ", ".join(PLANS))
    ap.add_argument("--hardware", default=None, metavar="TOML",
                    help="profile to predict with (default: the cluster's, this machine's profile); calibrate "
                         "this machine first with `rpeg-calibrate -o FILE`")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--lookahead", type=int, default=2,
                    help="commands a worker may hold queued (rpeg-run --lookahead; 0: the controller hands over one "
                         "node at a time); other than 2, the files get the suffix _lookaheadN")
    ap.add_argument("--no-sim", action="store_true", help="skip the 2,048-device sim controller measurement")
    args = ap.parse_args()
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in PLANS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(PLANS)}")
    plans = {w: PLANS[w] for w in workloads}
    if args.quick:
        plans = {"grpo": [PLANS["grpo"][0], PLANS["grpo"][4]]}  # all-dp2 and split
        args.steps, args.repeats = 4, 1
    if (os.cpu_count() or 1) < 2:
        print("warning: fewer than 2 cores; the 2 workers share them and measure the host, not the plan")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ("_quick" if args.quick else "") + (f"_lookahead{args.lookahead}" if args.lookahead != 2 else "")
    with tempfile.TemporaryDirectory(prefix="rpeg-whole-run-") as tmp:
        work = Path(tmp)
        hardware = os.path.abspath(args.hardware) if args.hardware else None
        compiled = {(w, s.name): (s, compile_plan(work, w, s, args.steps, hardware))
                    for w, specs in plans.items() for s in specs}
        same = twins(compiled)
        for (w, name), twin in same.items():
            print(f"{w}/{name} compiled to the plan of {w}/{twin}: measured once")
        rows: list[dict] = []
        for rep in range(args.repeats):
            for (w, name), (spec, path) in compiled.items():
                if (w, name) in same:
                    continue
                t0 = time.perf_counter()
                row = {"workload": w, "plan": name, "kind": spec.kind, "repeat": rep, **measure(path, args.steps, args.lookahead)}
                rows.append(row)
                print(f"[{rep}] {w:10s} {name:15s} predicted {row['predicted_s']:.3f} s/step, measured "
                      f"{row['measured_s']:.3f} ({row['ratio']:.3f}), control {row['control_ms_per_node']:.2f} ms/node, "
                      f"run {time.perf_counter() - t0:.1f} s", flush=True)
        sim_rows = [] if args.no_sim or args.quick else sim_control(work, (8, 32))
    summary = summarise(rows, same, [(w, s.name, s.kind) for w, specs in plans.items() for s in specs])
    tv = table_v(summary)
    write_csv(out / f"whole_run{suffix}.csv", rows)
    write_csv(out / f"whole_run_summary{suffix}.csv", summary)
    write_csv(out / f"whole_run_table_v{suffix}.csv", tv)
    write_csv(out / f"whole_run_control_sim{suffix}.csv", sim_rows)
    if not args.no_plot:
        plot(summary, out / f"whole_run{suffix}.png")
    report(summary, tv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
