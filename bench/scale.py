"""Issue 32, item 7: the largest Llama-shaped model that trains GRPO on the 2 CPU workers of this machine.

Climbs a ladder of Llama-shaped actors (vocabulary 32,000, head size 128, SwiGLU, untied head; the reference model
the same, the reward model one small layer over the same vocabulary) with GRPO on both workers (every vertex
dp = 2, B = 2, R = 2, Lp = Lr = 16) and, per size, runs `--steps` RL steps with `rpeg-run` and records: seconds per
step (the measured makespan over the steps), the peak resident size of the largest process (rpeg-run or a worker,
start-up included, polled from /proc: what an older checkout can be measured by too) and, where rpeg-run prints
them, each worker's measured peak (resident memory above its start-up size) and the cost model's peak of its
device. The climb stops at the first size that fails (a worker killed for memory, say); the memory check is off,
since a run's failure is what is measured. Runs alone (2 worker processes, one per core). Appends to
bench/results/scale.csv.

`--bin` names the virtual environment's bin/ whose `rpegc` and `rpeg-run` run, so the same ladder measures an
older checkout ("before": `git worktree add /tmp/old e4f20b7 && make -C /tmp/old install`, then, from outside
this repository, since workers start with the working directory on their path: `cd /tmp &&
/tmp/old/.venv/bin/python REPO/bench/scale.py --bin /tmp/old/.venv/bin --no-arch-flags --dtype fp32 --label before`).
Usage:
    .venv/bin/python bench/scale.py [--dtype bf16] [--label after] [--sizes 134m,271m] [--steps 2] [--bin DIR]
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {  # name -> (layers, hidden, ffn); heads = hidden / 128
    "60m": (8, 512, 1536), "134m": (12, 768, 2048), "193m": (14, 896, 2432), "271m": (16, 1024, 2816),
    "551m": (16, 1536, 4096), "664m": (20, 1536, 4096), "778m": (24, 1536, 4096), "953m": (16, 2048, 5632),
}
VOCAB = 32000
MEMORY = re.compile(r"worker (\d+) \(device (\d+)\): ([\d,.]+) MiB measured, ([\d,.]+) MiB predicted")
MAKESPAN = re.compile(r"makespan: measured ([\d.]+) s")


def arch_text(layers: int, hidden: int, ffn: int, flags: bool) -> str:
    heads = max(1, hidden // 128)
    text = f"layers = {layers}, hidden = {hidden}, ffn = {ffn}, vocab = {VOCAB}, heads = {heads}, gated = true"
    return text + (", tied = false, norms = true" if flags else "")


def program(size: str, dtype: str, flags: bool) -> str:
    """examples/grpo-tiny-2.rpeg with the ladder's actor and reference, a one-layer reward model and dp 2 everywhere."""
    text = (ROOT / "examples" / "grpo-tiny-2.rpeg").read_text()
    text = text[text.index("rpeg.workload"):text.index("rpeg.plan")]
    text = text.replace("B = 16, R = 4, Lp = 4, Lr = 6, dtype = fp32",
                        f"B = 2, R = 2, Lp = 16, Lr = 16, dtype = {dtype}")
    big, small = arch_text(*SIZES[size], flags), arch_text(1, 128, 256, flags)
    for model, arch in (("@actor  ", big), ("@ref    ", big), ("@reward ", small)):
        text = text.replace(f'{model}{{arch = "tiny"', f"{model}{{{arch}")
    both = "(0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1"
    rows = "\n".join(f"  @{v:<11} at {both}" for v in ("gen", "ref_inf", "reward_inf", "train_actor"))
    return text + f"rpeg.plan @p for @grpo on @cpu2 {{\n{rows}\n}}\n"


def parameters(size: str) -> int:
    """N_m of the ladder's actor (core's count: the torch backend builds what it counts)."""
    from rpegc.core.cost.params import param_count
    from rpegc.core.ir.program import Arch

    layers, d, f = SIZES[size]
    heads = max(1, d // 128)
    return param_count(Arch(layers=layers, hidden=d, ffn=f, vocab=VOCAB, heads=heads, kv_heads=heads, gated=True,
                            tied=False, norms=True), "policy")


def _high_water(pid: int) -> int:
    """VmHWM of a process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def run_watched(cmd: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run `cmd`; also the largest resident high-water mark of it and its descendants (start-up included), polled
    every 0.2 s: the mark only grows, so the last reading before a process ends holds its peak."""
    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = psutil.Popen(cmd, stdout=out, stderr=err, text=True)
        marks: dict[int, int] = {}
        while proc.poll() is None:
            try:
                family = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                family = []
            for p in family:
                marks[p.pid] = max(marks.get(p.pid, 0), _high_water(p.pid))
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()), max(marks.values(), default=0)


def run(size: str, dtype: str, steps: int, bin_dir: Path, tmp: Path, flags: bool) -> dict:
    src, exe = tmp / f"{size}.rpeg", tmp / f"{size}.exec.rpeg"
    src.write_text(program(size, dtype, flags))
    lower = f"verify-wellformed,unroll{{k={steps}}},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
    subprocess.run([str(bin_dir / "rpegc"), str(src), "-p", lower, "-o", str(exe)], check=True)
    t0 = time.monotonic()
    out, peak = run_watched([str(bin_dir / "rpeg-run"), str(exe), "--backend", "torch", "--no-memory-check"])
    row = {"size": size, "parameters": parameters(size), "dtype": dtype, "steps": steps,
           "wall_s": round(time.monotonic() - t0, 1), "ok": out.returncode == 0}
    if out.returncode != 0:
        row["error"] = (out.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    row["max_rss_mib"] = round(peak / 2**20, 1)
    span = MAKESPAN.search(out.stdout)
    row["s_per_step"] = round(float(span.group(1)) / steps, 2) if span else ""
    for rank, _, measured, predicted in MEMORY.findall(out.stdout):
        row[f"worker{rank}_measured_mib"] = float(measured.replace(",", ""))
        row[f"worker{rank}_predicted_mib"] = float(predicted.replace(",", ""))
    return row


COLUMNS = ("label", "size", "parameters", "dtype", "steps", "ok", "s_per_step", "wall_s", "max_rss_mib",
           "worker0_measured_mib",
           "worker0_predicted_mib", "worker1_measured_mib", "worker1_predicted_mib", "error")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--label", default="after", help="what the rows measure (after, before)")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, climbed in order: {', '.join(SIZES)}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bin", default=str(Path(sys.executable).parent), help="bin/ of the venv whose tools run")
    ap.add_argument("--arch-flags", action=argparse.BooleanOptionalAction, default=True,
                    help="write the tied/norms flags (--no-arch-flags for checkouts from before they existed)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale.csv"))
    args = ap.parse_args()
    out = Path(args.out)
    new = not out.exists()
    with tempfile.TemporaryDirectory() as tmp, open(out, "a", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        if new:
            writer.writeheader()
        for size in args.sizes.split(","):
            row = {"label": args.label, **run(size, args.dtype, args.steps, Path(args.bin), Path(tmp), args.arch_flags)}
            writer.writerow(row)
            fh.flush()
            print(row, flush=True)
            if not row["ok"]:
                break


if __name__ == "__main__":
    main()
