"""Run-to-run stability over seeds (paper Fig. 12 right, Table X) and the effect of the search budget.

Part 1 (`stability.csv`): each Table X workload (64-1024 GPUs) is optimized with several seeds under the
same wall-clock budget (default 60 s per run, the search on every core: jobs=0); per workload the best,
median, mean and worst predicted throughput, the coefficient of variation and each run's gap to the best
plan any run found (with --long F, one more run per workload with F times the mean evaluations of its runs is
part of "any run"; an evaluation budget, run after all the timed runs, so it need not have the machine alone).
Wall-clock budgets make these numbers depend on the machine: the table records its cores and evaluations.
The paper (200 seeds, 600 s on six cores each): CV 0.27-2.31%; all runs within 6% of the best at 64-512
GPUs and within 11% at 1,024 GPUs. The target (issue 16): CV <= 1% and every seed within 2% (5% at 1,024).

Part 2 (`budget.csv`): one workload over increasing evaluation budgets, several seeds per budget (budgets
in evaluations, so this part does not depend on the machine): the median must not fall with more budget.

Part 3 (`search_temperature.csv`, only with --temperatures, about 15 min): the SA temperatures
(t_init, t_warm), which the paper does not give, compared over six workloads x 5 seeds at 6,000 evaluations:
the measurement behind the defaults in rpegc/search/anneal.py.

Usage: python bench/stability.py [--quick] [--seeds K] [--budget S] [--long F] [--max-gpus G] [--only G,..]
       [--no-budget-part] [--no-stability-part] [--temperatures]
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import case, common_args, print_table, search, strong_scaling, table_x, table_xi, write_csv

import statistics

from rpegc.search.anneal import SearchConfig

TEMPERATURES = ((0.005, 0.01), (0.01, 0.05), (0.02, 0.1))  # (t_init, t_warm); the first was the old default

PAPER = {64: "within 6%", 128: "within 6%", 256: "within 6%", 512: "within 6%", 1024: "within 11%"}
TARGET = {1024: 0.05}  # every seed within 2% of the best (5% at 1,024 GPUs)


def spread(scores: list[float], best: float = 0.0) -> dict:
    """Statistics of one cell; gaps against `best` (the best any run found, these runs included)."""
    best = max(best, max(scores))
    mean = statistics.mean(scores)
    cv = statistics.pstdev(scores) / mean if len(scores) > 1 else 0.0
    return {"runs": len(scores), "best_tok_s": round(max(scores), 1), "median_tok_s": round(statistics.median(scores), 1),
            "mean_tok_s": round(mean, 1), "worst_tok_s": round(min(scores), 1), "cv": f"{cv:.2%}",
            "worst_gap_to_best": f"{1 - min(scores) / best:.1%}",
            "runs_within_2pct": sum(s >= 0.98 * best for s in scores),
            "runs_within_6pct": sum(s >= 0.94 * best for s in scores), "runs_within_11pct": sum(s >= 0.89 * best for s in scores)}


def stability_rows(cases, seeds: int, budget_s: float, long_factor: float, on_rows=None) -> list[dict]:
    """Every workload's runs under the wall-clock budget first, then (long_factor > 1) one long run per workload
    with long_factor times the mean evaluations of its runs: an evaluation budget, so the long runs need not
    have the machine to themselves. `on_rows` gets the rows after each of the two phases (to write them)."""
    runs = {}
    for c in cases:
        runs[c.name] = [search(c, evals=0, budget_s=budget_s, seed=s) for s in range(seeds)]
        print(f"{c.name}: " + " ".join(f"{r.result.evaluation.score:.0f}" for r in runs[c.name]), flush=True)
    rows = [_stability_row(c, runs[c.name], budget_s, None) for c in cases]
    if on_rows is not None:
        on_rows(rows)
    if long_factor <= 1:
        return rows
    for k, c in enumerate(cases):
        evals = round(long_factor * statistics.mean(r.result.stats.evaluations for r in runs[c.name]))
        rows[k] = _stability_row(c, runs[c.name], budget_s, search(c, evals=evals, seed=seeds))
        print(f"{c.name}: long run ({evals:,} evaluations) {rows[k]['long_run_tok_s']:,.0f}", flush=True)
        if on_rows is not None:
            on_rows(rows)
    return rows


def _stability_row(c, runs, budget_s: float, long_run) -> dict:
    scores = [r.result.evaluation.score for r in runs]
    long_score = 0.0 if long_run is None else long_run.result.evaluation.score
    target = TARGET.get(c.gpus, 0.02)
    cell = spread(scores, long_score)
    return {**c.labels(), **cell, "budget_s": budget_s, "jobs": runs[0].result.jobs,
            "long_run_tok_s": "" if long_run is None else round(long_score, 1),
            "long_run_evals": "" if long_run is None else long_run.result.stats.evaluations,
            "long_run_cpu_s": "" if long_run is None else round(long_run.cpu_s, 1),
            "evals_per_run": round(statistics.mean(r.result.stats.evaluations for r in runs)),
            "cpu_s_per_run": round(statistics.mean(r.cpu_s for r in runs), 1),
            "evals_per_cpu_s": round(sum(r.result.stats.evaluations for r in runs) / sum(r.cpu_s for r in runs)),
            "target": f"CV <= 1%, all within {target:.0%}",
            "target_met": float(cell["cv"].rstrip("%")) <= 1.0 and min(scores) >= (1 - target) * max(max(scores), long_score),
            "structures": "; ".join(sorted({r.result.variant.label() for r in runs})), "paper": PAPER.get(c.gpus, ""),
            "scores": " ".join(f"{s:.0f}" for s in scores)}


def budget_rows(c, budgets: list[int], seeds: int) -> list[dict]:
    rows = []
    for evals in budgets:
        runs = [search(c, evals=evals, seed=s) for s in range(seeds)]
        scores = [r.result.evaluation.score for r in runs]
        rows.append({**c.labels(), "evals_per_run": evals, **spread(scores),
                     "cpu_s_per_run": round(statistics.mean(r.cpu_s for r in runs), 1),
                     "scores": " ".join(f"{s:.0f}" for s in scores)})
        print(f"{c.name} evals={evals}: median {rows[-1]['median_tok_s']:,.0f} worst {rows[-1]['worst_tok_s']:,.0f}",
              flush=True)
    return rows


def temperature_rows(seeds: int, evals: int) -> list[dict]:
    xi = {c.name: c for c in table_xi()}
    cases = ([case("ppo-example-64", 7, 7, 7, 512, 128, 384, 2, 8)] + table_x(64) + strong_scaling((16, 32))
             + [xi["HETERO"], xi["MEM-TIGHT"]])
    rows = []
    for c in cases:
        for t_init, t_warm in TEMPERATURES:
            cfg = SearchConfig(t_init=t_init, t_warm=t_warm)
            scores = [search(c, evals=evals, seed=s, search_config=cfg).result.evaluation.score for s in range(seeds)]
            rows.append({**c.labels(), "t_init": t_init, "t_warm": t_warm, "evals_per_run": evals, **spread(scores),
                         "scores": " ".join(f"{x:.0f}" for x in scores)})
            print(f"{c.name} t={t_init}/{t_warm}: mean {rows[-1]['mean_tok_s']:,.0f} worst {rows[-1]['worst_tok_s']:,.0f}",
                  flush=True)
    return rows


def main() -> int:
    ap = common_args(__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--budget", type=float, default=60.0, help="wall-clock seconds per run (full mode)")
    ap.add_argument("--long", type=float, default=0.0,
                    help="one more run per workload with this many times the evaluations of its runs")
    ap.add_argument("--max-gpus", type=int, default=1024, help="largest Table X workload")
    ap.add_argument("--only", default="", help="comma list of GPU counts to run (default: all up to --max-gpus)")
    ap.add_argument("--budget-seeds", type=int, default=8)
    ap.add_argument("--no-budget-part", action="store_true", help="skip part 2")
    ap.add_argument("--no-stability-part", action="store_true", help="skip part 1 (keeps stability.csv as it is)")
    ap.add_argument("--temperatures", action="store_true", help="also compare SA temperatures (part 3)")
    args = ap.parse_args()
    if args.quick:
        cases, seeds, budget, budgets, bseeds = table_x(64), 2, 3.0, [300, 1000], 2
    else:
        only = {int(g) for g in args.only.split(",") if g}
        cases = [c for c in table_x(args.max_gpus) if not only or c.gpus in only]
        seeds, budget, budgets, bseeds = args.seeds, args.budget, [3000, 10000, 30000, 100000], args.budget_seeds
    suffix = "_quick" if args.quick else ""
    path = args.out / f"stability{suffix}.csv"
    rows = []
    if not args.no_stability_part:
        rows = stability_rows(cases, seeds, budget, args.long,
                              on_rows=lambda rs: write_csv(path.name, rs, args.out))
        print_table(rows, ["case", "A/C/R", "runs", "best_tok_s", "median_tok_s", "cv", "worst_gap_to_best",
                           "runs_within_2pct", "evals_per_cpu_s", "target_met", "structures"])
    brows = []
    if not args.no_budget_part:
        brows = budget_rows(table_x(64)[0], budgets, bseeds)
        bpath = write_csv(f"budget{suffix}.csv", brows, args.out)
        print_table(brows, ["case", "evals_per_run", "runs", "median_tok_s", "worst_tok_s", "best_tok_s", "cv",
                            "cpu_s_per_run"])
        print(f"wrote {bpath}")
    if not args.no_plot:
        plot(rows or read_rows(path), brows or read_rows(args.out / f"budget{suffix}.csv"), path.with_suffix(".png"))
    if rows:
        print(f"wrote {path}")
    if args.temperatures:
        trows = temperature_rows(2 if args.quick else 5, 150 if args.quick else 6000)
        tpath = write_csv(f"search_temperature{suffix}.csv", trows, args.out)
        print_table(trows, ["case", "t_init", "t_warm", "mean_tok_s", "worst_tok_s", "best_tok_s", "cv"])
        print(f"wrote {tpath}")
    return 0


def read_rows(path) -> list[dict]:
    """A results CSV written earlier, numbers as numbers (to redraw the figure with one part rerun)."""
    import csv

    def num(x: str):
        try:
            return float(x) if "." in x else int(x)
        except ValueError:
            return x

    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [{k: num(v) for k, v in row.items()} for row in csv.DictReader(f)]


def plot(rows: list[dict], brows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for i, r in enumerate(rows):
        scores = [float(s) for s in r["scores"].split()]
        best = max(scores + [float(r["long_run_tok_s"] or 0)])
        a.scatter([i] * len(scores), [s / best for s in scores], alpha=0.6)
    a.axhline(0.98, color="g", ls="--", lw=0.7, label="2% gap (target)")
    a.axhline(0.94, color="k", ls="--", lw=0.7, label="6% gap (paper, 64-512 GPUs)")
    a.set_xticks(range(len(rows)), [f"{r['gpus']} GPUs\n{r['A/C/R']}" for r in rows], fontsize=8)
    a.set_ylabel("score / best score any run found")
    a.set_title(f"Run-to-run stability, {rows[0]['budget_s']:.0f} s per run (Fig. 12 right analogue)", fontsize=9)
    a.legend(fontsize=7)
    if not brows:
        b.set_visible(False)
    xs = [r["evals_per_run"] for r in brows]
    for key, style in (("best_tok_s", "^-"), ("median_tok_s", "o-"), ("worst_tok_s", "v-")):
        b.plot(xs, [r[key] for r in brows], style, label=key.split("_")[0])
    b.set_xscale("log")
    b.set_xlabel("evaluation budget per run")
    b.set_ylabel("predicted throughput (tokens/s)")
    b.set_title(f"Budget vs result, {brows[0]['case']} ({brows[0]['runs']} seeds)")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
