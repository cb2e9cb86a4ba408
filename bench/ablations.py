"""Ablations A1-A9 (paper Table IV) on the Table XI workloads, and the generation-PP cost caveat (spec A7).

Table XI workloads: MEM-TIGHT (16 GPUs, 50 GB HBM imposed analytically, 13/13/13B, B = 128, Lr = 896),
WIDE (128 GPUs, 7/7/7B, B = 1024, Lr = 384), HETERO (32 GPUs, 34/7/7B, B = 512, Lr = 128) and DEEP
(64 GPUs on two racks, 7/70/70B, B = 512, Lr = 128). Each configuration (the full system with tau in
{0, 1}, and each of A1..A9 switched off alone) runs with the same evaluation budget over several seeds;
the table reports the mean throughput and its change against the full system, per workload and on
average. The paper's Table IV (5 seeds, 600 s each): A1 -9.2%, A2 -16.1%, A3 -4.3%, A7 -2.2%, A9 -2.8%,
A4/A5/A6/A8 < 1% on average.

Second table (`generation_pp.csv`): the spec's cost model charges no pipeline P2P for generation
(cost-model ambiguity A7, `generation_pp = "none"`), so the optimizer may pick deep pipelines for
generation. The alternative `generation_pp = "prefill"` prices the prefill like inference at Lp. For a few
workloads: the plan chosen under each model, and the default model's plan re-priced under "prefill".

Usage: python bench/ablations.py [--quick] [--evals N] [--seeds K]
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import SEARCH_DEFAULTS, Run, case, common_args, print_table, search, table_x, table_xi, write_csv

import statistics

from rpegc.core.cost.options import CostOptions
from rpegc.search.evaluator import Evaluator
from rpegc.search.optimizer import ABLATIONS

PAPER = {"A1": "-9.2%", "A2": "-16.1%", "A3": "-4.3%", "A4": "<1%", "A5": "<1%", "A6": "<1%", "A7": "-2.2%",
         "A8": "<1%", "A9": "-2.8%"}


def ablation_rows(cases, configs, seeds: int, evals: int) -> list[dict]:
    runs: dict = {}
    for c in cases:
        for name in configs:
            ablate = frozenset() if name == "full" else frozenset({name})
            runs[c.name, name] = [search(c, evals=evals, seed=s, ablate=ablate) for s in range(seeds)]
            mean = statistics.mean(r.result.evaluation.score for r in runs[c.name, name])
            print(f"{c.name} {name}: {mean:,.0f} tok/s", flush=True)
    rows = []
    for name in configs:
        row = {"config": name, "what": "full system (tau in {0,1})" if name == "full" else ABLATIONS[name]}
        changes = []
        for c in cases:
            scores = [r.result.evaluation.score for r in runs[c.name, name]]
            full = statistics.mean(r.result.evaluation.score for r in runs[c.name, "full"])
            change = statistics.mean(scores) / full - 1.0
            changes.append(change)
            row[f"{c.name}_tok_s"] = round(statistics.mean(scores), 1)
            row[f"{c.name}_change"] = f"{change:+.1%}"
            row[f"{c.name}_feasible"] = all(r.result.evaluation.feasible for r in runs[c.name, name])
        row["avg_change"] = f"{statistics.mean(changes):+.1%}"
        row["paper_avg"] = PAPER.get(name, "")
        row["seeds"], row["evals_per_run"] = seeds, evals
        rows.append(row)
    return rows


def generation_pp_rows(cases, evals: int) -> list[dict]:
    """Plans under generation_pp = none (spec) and = prefill, and the spec plan re-priced under prefill."""
    prefill = CostOptions(generation_pp="prefill")
    rows = []
    for c in cases:
        spec = search(c, evals=evals, seed=0)
        alt = search(c, evals=evals, seed=0, cost=prefill)
        r = spec.result
        ev = Evaluator(c.hw, prefill, SEARCH_DEFAULTS["steps"])
        cv = ev.compile(r.variant)
        repriced = ev.evaluate_one(r.variant, cv.choice_of(r.program.plan))
        rows.append({**c.labels(), **_plan_cells("spec", spec), **_plan_cells("prefill", alt),
                     "spec_plan_under_prefill_tok_s": round(repriced.score, 1),
                     "spec_plan_loss_under_prefill": f"{repriced.score / r.evaluation.score - 1:+.1%}",
                     "prefill_search_vs_spec_plan_repriced": f"{alt.result.evaluation.score / repriced.score - 1:+.1%}"})
        print(f"{c.name}: gen {rows[-1]['spec_gen']} (spec) vs {rows[-1]['prefill_gen']} (prefill)", flush=True)
    return rows


def _plan_cells(prefix: str, run: Run) -> dict:
    r = run.result
    g = r.program.plan.placement("gen")
    s = g.strategy
    return {f"{prefix}_tok_s": round(r.evaluation.score, 1), f"{prefix}_structure": r.variant.label(),
            f"{prefix}_gen": f"{g.alloc.size} GPUs dp{s.dp} pp{s.pp} tp{s.tp} mb{s.mb}"}


def main() -> int:
    ap = common_args(__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=2500, help="uncached evaluations per run (full mode)")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    cases = table_xi()
    configs = ["full"] + list(ABLATIONS)
    seeds, evals = args.seeds, args.evals
    gen_cases = [case("ppo-example-64", 7, 7, 7, 512, 128, 384, 2, 8)] + table_x(64)
    if args.quick:
        cases, configs, seeds, evals = cases[:1], ["full", "A1", "A2", "A7"], 1, 150
        gen_cases = gen_cases[:1]
    rows = ablation_rows(cases, configs, seeds, evals)
    suffix = "_quick" if args.quick else ""
    path = write_csv(f"ablations{suffix}.csv", rows, args.out)
    print_table(rows, ["config", "what"] + [f"{c.name}_change" for c in cases] + ["avg_change", "paper_avg"])
    gen = generation_pp_rows(gen_cases, evals)
    gpath = write_csv(f"generation_pp{suffix}.csv", gen, args.out)
    print_table(gen, ["case", "spec_tok_s", "spec_gen", "prefill_tok_s", "prefill_gen", "spec_plan_under_prefill_tok_s",
                      "spec_plan_loss_under_prefill"])
    if not args.no_plot:
        plot(rows, [c.name for c in cases], path.with_suffix(".png"))
    print(f"wrote {path} and {gpath}")
    return 0


def plot(rows: list[dict], names: list[str], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab = [r for r in rows if r["config"] != "full"]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    width = 0.8 / (len(names) + 1)
    for k, n in enumerate(names + ["avg"]):
        key = f"{n}_change" if n != "avg" else "avg_change"
        ys = [float(r[key].rstrip("%")) for r in ab]
        ax.bar([i + (k - len(names) / 2) * width for i in range(len(ab))], ys, width, label=n)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(ab)), [r["config"] for r in ab])
    ax.set_ylabel("throughput change vs full (%)")
    ax.set_title("Ablations (Table IV analogue), Table XI workloads")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
