"""The optimizer against the exact optimum of instances small enough to enumerate (issue 16, item 5).

Each instance's whole plan space (every structural variant, every combination of directory entries) is scored
by the batched evaluator (`rpegc/search/exhaustive.py`); then `optimize` runs with several seeds and evaluation
budgets, and each result is compared with the exact optimum. Target: the default budget finds the exact
optimum in 8 of 8 seeds.

Instances: the six-vertex PPO graph of examples/ppo-8gpu.rpeg with 7B models on 2 GH200s (its best plan needs
actor-critic sharing and tau = 1), the GRPO graph of examples/grpo.rpeg with 7B models on 4 GH200s, and
examples/grpo-tiny.rpeg as written (4 CPU devices).

Usage: python bench/enumeration.py [--quick] [--seeds K] [--evals 300,1000,3000]
Writes bench/results/enumeration.csv (--quick: enumeration_quick.csv, one instance, 2 seeds, 1,000 evaluations).
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import common_args, print_table, write_csv

import re
import statistics
import time
from dataclasses import replace
from pathlib import Path

from rpegc.core.cost.options import CostOptions
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.ir.program import Program
from rpegc.core.ir.geometry import Cluster
from rpegc.search.exhaustive import exhaustive_optimum
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str, workload: str | None = None, cluster: Cluster | None = None,
            arch: tuple[str, str] | None = None) -> Program:
    """An example without its plan, with another workload line, cluster or model preset (old, new)."""
    text = (EXAMPLES / name).read_text()
    if arch is not None:
        text = text.replace(*arch)
    if workload is not None:
        text = re.sub(r"^rpeg\.workload \{.*\}$", workload, text, count=1, flags=re.M)
    p = replace(parse(text, name), plan=None)
    return replace(p, cluster=cluster) if cluster is not None else p


def instances() -> dict[str, Program]:
    small = "rpeg.workload {{B = {B}, R = {R}, Lp = 128, Lr = 384, dtype = bf16}}"
    return {
        "ppo-7b-2gpu": example("ppo-8gpu.rpeg", small.format(B=8, R=1), Cluster("c", 1, 1, 2, "gh200"),
                               ("llama2-13b", "llama2-7b")),
        "grpo-7b-4gpu": example("grpo.rpeg", small.format(B=8, R=4), Cluster("c", 1, 1, 4, "gh200")),
        "grpo-tiny": example("grpo-tiny.rpeg"),
    }


def rows(names: list[str], budgets: list[int], seeds: int) -> list[dict]:
    out = []
    for name in names:
        p = instances()[name]
        hw = load_hardware(p.cluster.hardware)
        start = time.process_time()
        best = exhaustive_optimum(p, hw)
        enum_s = time.process_time() - start
        print(f"{name}: optimum {best.score:,.1f} tok/s ({best.variant.label()}) of {best.plans:,} plans "
              f"({best.feasible:,} feasible), enumerated in {enum_s:.1f} CPU s", flush=True)
        for evals in budgets:
            ratios, cpu = [], []
            for seed in range(seeds):
                t = time.process_time()
                r = optimize(p, OptimizeOptions(budget_s=0, evals=evals, seed=seed), hw, CostOptions())
                cpu.append(time.process_time() - t)
                ratios.append(r.evaluation.score / best.score)
            hits = sum(x >= 1 - 1e-12 for x in ratios)
            out.append({"instance": name, "plans": best.plans, "feasible": best.feasible,
                        "optimum_tok_s": round(best.score, 1), "optimum_structure": best.variant.label(),
                        "enumeration_cpu_s": round(enum_s, 1), "evals": evals, "seeds": seeds,
                        "exact_optimum": f"{hits}/{seeds}", "median_ratio": round(statistics.median(ratios), 5),
                        "worst_ratio": round(min(ratios), 5), "cpu_s_per_run": round(statistics.mean(cpu), 2),
                        "ratios": " ".join(f"{x:.5f}" for x in ratios)})
            print(f"  evals={evals}: exact optimum {hits}/{seeds}, worst {min(ratios):.5f}", flush=True)
    return out


def main() -> None:
    ap = common_args(__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--evals", default="300,1000,3000")
    args = ap.parse_args()
    names = ["ppo-7b-2gpu"] if args.quick else list(instances())
    budgets = [1000] if args.quick else [int(x) for x in args.evals.split(",")]
    result = rows(names, budgets, 2 if args.quick else args.seeds)
    print_table(result, ["instance", "plans", "evals", "exact_optimum", "median_ratio", "worst_ratio", "cpu_s_per_run"])
    print(f"wrote {write_csv('enumeration_quick.csv' if args.quick else 'enumeration.csv', result, args.out)}")


if __name__ == "__main__":
    main()
