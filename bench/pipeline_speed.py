"""Issue 5 target: the whole lowering + cost + schedule pipeline on a 1,024-GPU PPO plan, end to end.

Runs `rpegc examples/ppo-1024.rpeg -p <pipeline> --time-passes` as a fresh process several times (process
start, imports, parsing, passes and printing included), and reports the median wall time and the median time
of each pass. Writes bench/results/pipeline_speed.csv. Usage: python bench/pipeline_speed.py [--repeats N]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=8},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"


def run_once(example: str) -> tuple[float, dict[str, float]]:
    rpegc = os.path.join(os.path.dirname(sys.executable), "rpegc")
    start = time.perf_counter()
    out = subprocess.run([rpegc, example, "-p", PIPELINE, "--time-passes"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    passes = {m.group(1): float(m.group(2)) for m in re.finditer(r"Pass (\S+) took ([0-9.eE-]+) seconds", out.stderr)}
    return wall, passes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--example", default="examples/ppo-1024.rpeg")
    args = ap.parse_args()
    runs = [run_once(args.example) for _ in range(args.repeats)]
    walls = [w for w, _ in runs]
    names = list(runs[0][1])
    rows = [("end-to-end (process start included)", statistics.median(walls))]
    rows += [(f"pass {n}", statistics.median(r[1][n] for r in runs)) for n in names]
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "pipeline_speed.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["what", "median_seconds", "repeats", "example"])
        for what, sec in rows:
            w.writerow([what, f"{sec:.4f}", args.repeats, args.example])
    for what, sec in rows:
        print(f"{what:45s} {sec * 1e3:8.1f} ms")
    print(f"target <= 2 s end to end: {'met' if rows[0][1] <= 2.0 else 'NOT met'} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
