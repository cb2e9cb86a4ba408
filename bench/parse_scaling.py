"""Parse and verification time vs input size (issue 13 item 5): near-linear, not quadratic.

Two generated inputs, each at sizes N = 1k, 4k, 16k, 64k (--quick: 1k, 4k):
  * `containers`: examples/ppo-8gpu.rpeg with N extra unused containers (one line each), through
    `parse`, `check_graph` (verify-wellformed's check), the driver `rpegc FILE -p verify-wellformed` and the
    driver through the whole lowering (`lower_s`: LOWER below, issue 33's 150k-container program);
  * `workload-keys`: one line `rpeg.workload {B = 1, B = 1, ...}` with N keys, rejected at the repeated key
    (the time to the error, and the length of the printed error).
Times are `time.process_time()` of this process (the load of a shared machine does not count). The
`growth` column is the time ratio to the previous size (4x the input: about 4 when linear, 16 when
quadratic). Writes bench/results/parse_scaling.csv. Usage: python bench/parse_scaling.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ppo-8gpu.rpeg")
LOWER = "verify-wellformed,unroll{k=4},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"


def containers_text(n: int) -> str:
    src = open(EXAMPLE, encoding="utf-8").read()
    i = src.index("  %X ")
    extra = "".join(f"  %u{k} = rpeg.container tokens[B, Lp]\n" for k in range(n))
    return src[:i] + extra + src[i:]


def keys_text(n: int) -> str:
    return "rpeg.workload {" + ", ".join(["B = 1"] * n) + "}\n"


def timed(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def driver(text: str, pipeline: str = "verify-wellformed") -> tuple[float, int, int]:
    """(seconds, exit code, characters written to stderr) of `rpegc FILE -p PIPELINE -o /dev/null`."""
    from rpegc.cli import main

    with tempfile.NamedTemporaryFile("w", suffix=".rpeg", delete=False, encoding="utf-8") as f:
        f.write(text)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sec, code = timed(lambda: main([f.name, "-p", pipeline, "-o", os.devnull]))
    finally:
        os.unlink(f.name)
    return sec, int(code or 0), len(err.getvalue())


def measure(case: str, n: int) -> dict:
    from rpegc.core.ir.errors import RpegError
    from rpegc.core.check.wellformed import check_graph
    from rpegc.syntax.parser import parse

    text = containers_text(n) if case == "containers" else keys_text(n)
    row = {"case": case, "n": n, "bytes": len(text.encode())}

    def parse_or_error():
        try:
            return parse(text, "bench.rpeg")
        except RpegError as e:
            return e

    row["parse_s"], program = timed(parse_or_error)
    if case == "containers":
        row["verify_s"], errors = timed(lambda: check_graph(program))
        assert not errors, errors[0]
        row["lower_s"], code, _ = driver(text, LOWER)
        assert code == 0
    else:
        row["verify_s"] = row["lower_s"] = ""
    row["driver_s"], row["exit"], row["stderr_chars"] = driver(text)
    row["driver_us_per_item"] = round(row["driver_s"] / n * 1e6, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="*")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    sizes = args.sizes or ([1000, 4000] if args.quick else [1000, 4000, 16000, 64000])
    rows = []
    for case in ("containers", "workload-keys"):
        previous = None
        for n in sizes:
            row = measure(case, n)
            row["growth"] = "" if previous is None else round(row["driver_s"] / max(previous, 1e-9), 2)
            previous = row["driver_s"]
            rows.append(row)
            print(f"{case:14s} n={n:6d} {row['bytes']:9d} B  parse {row['parse_s']:7.2f} s  "
                  f"driver {row['driver_s']:7.2f} s  growth x{row['growth'] or '-'}  "
                  f"lower {row['lower_s'] and round(row['lower_s'], 2) or '-'} s  "
                  f"stderr {row['stderr_chars']} chars", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "parse_scaling_quick.csv" if args.quick else "parse_scaling.csv")
    fields = ["case", "n", "bytes", "parse_s", "verify_s", "driver_s", "driver_us_per_item", "growth", "lower_s",
              "exit", "stderr_chars"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.3f}" if isinstance(r[k], float) else r[k]) for k in fields})
    print(path)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
