"""Weak scaling (paper Fig. 6 and 7, App. B): 3 sweeps x 4 sizes x 3 (B, Lr) regimes = 36 modelled cases.

Sweeps (App. B): actor growth 7/13/34/70B on 8/16/32/64 GPUs (critic and reward 7B); critic/reward growth
on 8-64 GPUs (actor 7B); joint growth on 16/32/64/128 GPUs (actor and critic 7/13/34/70B, reward
7/7/13/13B). Regimes (B, Lr) in {(512, 128), (256, 384), (128, 896)}, Lp = 128. Per case: the greedy
and concurrent baselines, the optimizer with the throughput objective and with the throughput x
utilization objective (delta = 0.1), both with the same evaluation budget.

Paper's claims: RPEG improves throughput by 5-60% over the concurrent heuristic where that baseline is
feasible and finds feasible plans in all cases, including those with OOM baselines; gains are largest for
long responses; the utilization objective trades 1-3% throughput for up to +25 pp utilization, reaching
78-100% scheduled utilization.

Usage: python bench/weak_scaling.py [--quick] [--evals N] [--seed S]
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import WEAK_REGIMES, WEAK_SWEEPS, common_args, objectives_row, print_table, weak_scaling, write_csv


def main() -> int:
    ap = common_args(__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=3000, help="uncached evaluations per search (full mode)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cases = weak_scaling()
    evals = args.evals
    if args.quick:  # the smallest case of each sweep in the long-response regime, tiny budgets
        cases = [c for c in cases if c.Lr == 896 and c.gpus == min(g for g, *_ in WEAK_SWEEPS[c.extra["sweep"]])]
        evals = 200
    rows = []
    for c in cases:
        rows.append(objectives_row(c, evals, args.seed))
        r = rows[-1]
        print(f"{c.name}: {r['gain_vs_concurrent']} vs concurrent, util {r['rpeg_util']:.0%} -> {r['rpeg_util_util']:.0%}",
              flush=True)
    path = write_csv("weak_scaling_quick.csv" if args.quick else "weak_scaling.csv", rows, args.out)
    print_table(rows, ["case", "A/C/R", "concurrent_tok_s", "concurrent_feasible", "greedy_feasible", "rpeg_tok_s",
                       "gain_vs_concurrent", "rpeg_util", "rpeg_util_util", "util_gain_pp", "util_tput_change"])
    summarize(rows)
    if not args.no_plot:
        plot(rows, path.with_name(path.stem + "_throughput.png"), "tok_s", "predicted throughput (tokens/s)")
        plot(rows, path.with_name(path.stem + "_utilization.png"), "util", "predicted GPU utilization")
    print(f"wrote {path}")
    return 0


def summarize(rows: list[dict]) -> None:
    gains = [float(r["gain_vs_concurrent"].rstrip("%")) for r in rows if r["gain_vs_concurrent"].endswith("%")]
    oom = [r for r in rows if r["concurrent_feasible"] is False or r["greedy_feasible"] is False]
    found = [r for r in oom if r["rpeg_feasible"] is True]
    if gains:
        print(f"gain over concurrent where feasible: {min(gains):+.1f}% .. {max(gains):+.1f}% over {len(gains)} cases "
              f"(paper: +5..+60%)")
    print(f"cases with an OOM baseline: {len(oom)}, RPEG feasible in {len(found)} of them")
    pp = [r["util_gain_pp"] for r in rows]
    cost = [float(r["util_tput_change"].rstrip("%")) for r in rows]
    print(f"util objective: {min(pp):+.1f}..{max(pp):+.1f} pp utilization, {min(cost):+.1f}..{max(cost):+.1f}% throughput "
          f"(paper: up to +25 pp for 1-3% throughput)")


def plot(rows: list[dict], path, metric: str, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = list(dict.fromkeys(r["sweep"] for r in rows))
    regimes = [(B, Lr) for B, Lr in WEAK_REGIMES if any(r["B"] == B and r["Lr"] == Lr for r in rows)]
    fig, axes = plt.subplots(len(sweeps), len(regimes), figsize=(4 * len(regimes), 3 * len(sweeps)), squeeze=False)
    series = (("greedy", "Greedy"), ("concurrent", "Concurrent"), ("rpeg", "RPEG (throughput)"),
              ("rpeg_util", "RPEG (util)"))
    for i, sweep in enumerate(sweeps):
        for j, (B, Lr) in enumerate(regimes):
            ax = axes[i][j]
            sel = [r for r in rows if r["sweep"] == sweep and r["B"] == B and r["Lr"] == Lr]
            for k, (key, label) in enumerate(series):
                xs = [x + (k - 1.5) * 0.2 for x in range(len(sel))]
                ys = [r[f"{key}_{metric}"] if r[f"{key}_feasible"] is True else 0.0 for r in sel]
                ax.bar(xs, ys, 0.2, label=label)
                for x, r in zip(xs, sel):
                    if r[f"{key}_feasible"] is False:
                        ax.annotate("OOM", (x, 0), rotation=90, ha="center", va="bottom", fontsize=6)
            for x, r in enumerate(sel):
                top = max(float(r[f"{key}_{metric}"] or 0) for key, _ in series if r[f"{key}_feasible"] is True)
                note = r["gain_vs_concurrent"] if metric == "tok_s" else f"{r['util_gain_pp']:+.0f}pp"
                ax.annotate(note, (x, top), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(sel)), [f"{r['gpus']}G\n{r['A/C/R']}" for r in sel], fontsize=7)
            ax.set_title(f"{sweep}, B={B}, Lr={Lr}", fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
