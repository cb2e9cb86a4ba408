"""Run-to-run stability over seeds (paper Fig. 12 right, Table X) and the effect of the search budget.

Part 1 (`stability.csv`): each Table X workload (64-1024 GPUs) is optimized with several seeds and the
same evaluation budget; per workload the best, mean and worst predicted throughput, the coefficient of
variation and each run's gap to the best run. The paper (200 seeds, 600 s each): CV 0.27-2.31%; all runs
within 6% of the best at 64-512 GPUs and within 11% at 1,024 GPUs.

Part 2 (`budget.csv`): one workload over increasing evaluation budgets, several seeds per budget, to check
that a larger budget is not systematically worse (mean, worst and best per budget).

Part 3 (`search_temperature.csv`, only with --temperatures, about 15 min): the SA temperatures
(t_init, t_warm), which the paper does not give, compared over six workloads x 5 seeds at 6,000 evaluations:
the measurement behind the defaults in rpegc/search/anneal.py.

Budgets are evaluation counts, not seconds, so the committed results do not depend on the load of the
machine that produced them; `eval_throughput.csv` converts them to CPU time.

Usage: python bench/stability.py [--quick] [--seeds K] [--evals N] [--max-gpus G] [--temperatures]
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import case, common_args, print_table, search, strong_scaling, table_x, table_xi, write_csv

import statistics

from rpegc.search.anneal import SearchConfig

TEMPERATURES = ((0.005, 0.01), (0.01, 0.05), (0.02, 0.1))  # (t_init, t_warm); the first was the old default

PAPER = {64: "within 6%", 128: "within 6%", 256: "within 6%", 512: "within 6%", 1024: "within 11%"}


def spread(scores: list[float]) -> dict:
    best, mean = max(scores), statistics.mean(scores)
    cv = statistics.pstdev(scores) / mean if len(scores) > 1 else 0.0
    return {"runs": len(scores), "best_tok_s": round(best, 1), "mean_tok_s": round(mean, 1),
            "worst_tok_s": round(min(scores), 1), "cv": f"{cv:.2%}", "worst_gap_to_best": f"{1 - min(scores) / best:.1%}",
            "runs_within_6pct": sum(s >= 0.94 * best for s in scores), "runs_within_11pct": sum(s >= 0.89 * best for s in scores)}


def stability_rows(cases, seeds: int, evals: int) -> list[dict]:
    rows = []
    for c in cases:
        runs = [search(c, evals=evals, seed=s) for s in range(seeds)]
        scores = [r.result.evaluation.score for r in runs]
        structures = sorted({r.result.variant.label() for r in runs})
        rows.append({**c.labels(), **spread(scores), "evals_per_run": evals,
                     "cpu_s_per_run": round(statistics.mean(r.cpu_s for r in runs), 1),
                     "structures": "; ".join(structures), "paper": PAPER.get(c.gpus, ""),
                     "scores": " ".join(f"{s:.0f}" for s in scores)})
        print(f"{c.name}: CV {rows[-1]['cv']}, worst gap {rows[-1]['worst_gap_to_best']}", flush=True)
    return rows


def budget_rows(c, budgets: list[int], seeds: int) -> list[dict]:
    rows = []
    for evals in budgets:
        runs = [search(c, evals=evals, seed=s) for s in range(seeds)]
        scores = [r.result.evaluation.score for r in runs]
        rows.append({**c.labels(), "evals_per_run": evals, **spread(scores),
                     "cpu_s_per_run": round(statistics.mean(r.cpu_s for r in runs), 1),
                     "scores": " ".join(f"{s:.0f}" for s in scores)})
        print(f"{c.name} evals={evals}: mean {rows[-1]['mean_tok_s']:,.0f} worst {rows[-1]['worst_tok_s']:,.0f}", flush=True)
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
    ap.add_argument("--evals", type=int, default=3000, help="uncached evaluations per run (full mode)")
    ap.add_argument("--max-gpus", type=int, default=256, help="largest Table X workload (the paper goes to 1024)")
    ap.add_argument("--temperatures", action="store_true", help="also compare SA temperatures (part 3)")
    args = ap.parse_args()
    if args.quick:
        cases, seeds, evals, budgets, bseeds = table_x(64), 2, 150, [100, 300], 2
    else:
        cases, seeds, evals, budgets, bseeds = table_x(args.max_gpus), args.seeds, args.evals, [500, 1500, 4500, 13500], 5
    suffix = "_quick" if args.quick else ""
    rows = stability_rows(cases, seeds, evals)
    path = write_csv(f"stability{suffix}.csv", rows, args.out)
    print_table(rows, ["case", "A/C/R", "runs", "best_tok_s", "mean_tok_s", "cv", "worst_gap_to_best", "paper", "structures"])
    brows = budget_rows(table_x(64)[0], budgets, bseeds)
    bpath = write_csv(f"budget{suffix}.csv", brows, args.out)
    print_table(brows, ["case", "evals_per_run", "runs", "mean_tok_s", "worst_tok_s", "best_tok_s", "cv", "cpu_s_per_run"])
    if not args.no_plot:
        plot(rows, brows, path.with_suffix(".png"))
    print(f"wrote {path} and {bpath}")
    if args.temperatures:
        trows = temperature_rows(2 if args.quick else 5, 150 if args.quick else 6000)
        tpath = write_csv(f"search_temperature{suffix}.csv", trows, args.out)
        print_table(trows, ["case", "t_init", "t_warm", "mean_tok_s", "worst_tok_s", "best_tok_s", "cv"])
        print(f"wrote {tpath}")
    return 0


def plot(rows: list[dict], brows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for i, r in enumerate(rows):
        scores = [float(s) for s in r["scores"].split()]
        best = max(scores)
        a.scatter([i] * len(scores), [s / best for s in scores], alpha=0.6)
    a.axhline(0.94, color="k", ls="--", lw=0.7, label="6% gap (paper, 64-512 GPUs)")
    a.set_xticks(range(len(rows)), [f"{r['gpus']} GPUs\n{r['A/C/R']}" for r in rows], fontsize=8)
    a.set_ylabel("score / best score over seeds")
    a.set_title("Run-to-run stability (Fig. 12 right analogue)")
    a.legend(fontsize=7)
    xs = [r["evals_per_run"] for r in brows]
    for key, style in (("best_tok_s", "^-"), ("mean_tok_s", "o-"), ("worst_tok_s", "v-")):
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
