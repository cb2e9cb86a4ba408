"""Lowering time vs the number of unrolled steps K (issue 13 item 4): linear in K, not quadratic.

For K = 8, 32, 64, 128, 256 (the largest K unroll accepts; --quick: 8, 64) runs, as a fresh process in the repository root,
    rpegc examples/ppo-8gpu.rpeg -p 'unroll{k=K},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule'
with --time-passes, and reports the CPU time of that process (getrusage of the child: the load of a shared
machine does not count), the seconds of each pass, the exec-graph nodes, and the growth of the CPU time over
the previous K (`steps_ratio` times the steps: about that ratio when linear). Writes bench/results/unroll_scaling.csv.
Usage: python bench/unroll_scaling.py [--quick] [--ks 8 64 ...] [--root DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSES = ("unroll", "split-quantiles", "insert-comm", "insert-reshard", "annotate-cost", "schedule")
RUN = "import sys; from rpegc.cli import main; sys.exit(main(sys.argv[1:]))"


def run(k: int, root: str, example: str) -> dict:
    pipeline = f"unroll{{k={k}}}," + ",".join(PASSES[1:])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", RUN, example, "-p", pipeline, "--time-passes", "--emit=json"],
                         capture_output=True, text=True, cwd=root)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        return {"k": k, "error": out.stderr.strip().splitlines()[0]}
    row = {"k": k, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}
    for m in re.finditer(r"Pass (\S+) took ([0-9.eE-]+) seconds", out.stderr):
        row[m.group(1)] = float(m.group(2))
    row["nodes"] = out.stdout.count('"kind":')  # exec nodes and edges of the JSON output
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ks", type=int, nargs="*")
    ap.add_argument("--root", default=ROOT, help="the rpegc checkout to measure (default: this one)")
    ap.add_argument("--example", default="examples/ppo-8gpu.rpeg")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    ks = args.ks or ([8, 64] if args.quick else [8, 32, 64, 128, 256])
    rows, previous = [], None
    for k in ks:
        row = run(k, args.root, args.example)
        if "error" in row:
            print(f"K={k}: {row['error']}", flush=True)
            rows.append(row)
            continue
        row["ms_per_step"] = row["cpu_s"] / k * 1e3
        row["growth"] = "" if previous is None else round(row["cpu_s"] / previous[1], 2)
        row["steps_ratio"] = "" if previous is None else k // previous[0]
        previous = (k, row["cpu_s"])
        rows.append(row)
        passes = "  ".join(f"{p} {row.get(p, 0):.2f}" for p in PASSES)
        print(f"K={k:5d} cpu {row['cpu_s']:7.2f} s  {row['ms_per_step']:6.1f} ms/step  growth x{row['growth'] or '-'}"
              f" (steps x{row['steps_ratio'] or '-'})  passes: {passes}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "unroll_scaling_quick.csv" if args.quick else "unroll_scaling.csv")
    fields = ["k", "cpu_s", "ms_per_step", "growth", "steps_ratio", *PASSES, "nodes", "error"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.3f}" if isinstance(r.get(k), float) else r.get(k, "")) for k in fields})
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
