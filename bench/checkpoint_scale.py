"""Issue 14, item 1 ("Data plane") at scale: a >= 50M-parameter GRPO run on 2 CPU workers with a checkpoint
every step, killed and resumed under another plan; measured, not modelled (no test asserts a time).

Reports: training steps/s of the uninterrupted run (a step = generation, reference and reward inference,
training; wall clock between step completions), checkpoint write MB/s (bytes of all shard files / the
slowest worker's serialise + write + fsync: the workers write in parallel), read MB/s (every tensor of the
checkpoint read back as the 2 ranks of a tp = 2 layout need it, through `checkpoint.Reader`, one
process), the SHA-256 verification a resume does first, and the disk's plain copy bandwidth beside them
(one shard file copied with fsync: the limit the writes can reach on this disk). Reads come from the page
cache when the file was just written (this script never drops caches on a shared machine), so the read
figures are an upper bound of a cold read. Resume time: `prepare` (index, identity, SHA-256 of every
file) and the wall time of the resumed run up to the end of its first step, against an uninterrupted step.

Writes bench/results/checkpoint_scale.csv. Usage:
    .venv/bin/python bench/checkpoint_scale.py [--layers 6 --hidden 768 --ffn 3072] [--out DIR]
Takes a few minutes on 2 cores (never more than 2 worker processes).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=%d},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"

sys.path.insert(0, os.path.join(ROOT, "tests"))  # the test suite's builder of variants of examples/grpo-tiny-2.rpeg
from fixtures.programs import grpo_two_workers  # noqa: E402

WORKLOAD = "rpeg.workload {B = 4, R = 2, Lp = 4, Lr = 8, dtype = fp32}"
MODEL = "rpeg.model @{name} {{layers = {layers}, hidden = {hidden}, ffn = {ffn}, vocab = 64, heads = 12, kind = {kind}}}"
TRAIN = {"dp2": "  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1",
         "tp2": "  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 1 tp = 2 mb = 1"}


def compile_plan(directory: str, name: str, text: str, steps: int):
    from rpegc.cli import main as rpegc_main
    from rpegc.runtime.plan import load_plan

    src, out = os.path.join(directory, f"{name}.rpeg"), os.path.join(directory, f"{name}.exec.rpeg")
    with open(src, "w") as f:
        f.write(text)
    if rpegc_main([src, "-p", PIPELINE % steps, "-o", out]) != 0:
        raise SystemExit(f"cannot compile {src}")
    return load_plan(out)


def copy_bandwidth(path: str) -> float:
    """MB/s of a plain copy of `path` (read, write, fsync), as a tool like cp + sync would do it."""
    dst = path + ".copy"
    start = time.perf_counter()
    with open(path, "rb") as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 24)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - start
    size = os.path.getsize(dst)
    os.remove(dst)
    return size / seconds / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    args = ap.parse_args()

    from rpegc.runtime.backends.base import BackendError
    from rpegc.runtime.controller import StepProgress, run
    from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
    from rpegc.runtime.backends.torch.controller.backend import TorchBackend
    from rpegc.runtime.backends.torch.parallel.layout import Layout, rank_pieces

    work = args.work or tempfile.mkdtemp(prefix="rpeg-ckpt-bench-", dir=os.environ.get("TMPDIR"))
    os.makedirs(work, exist_ok=True)
    shape = {"layers": args.layers, "hidden": args.hidden, "ffn": args.ffn}
    actor = MODEL.format(name="actor ", kind="policy, trainable", **shape)
    ref = MODEL.format(name="ref   ", kind="reference", **shape)
    plans = {k: compile_plan(work, k, grpo_two_workers(WORKLOAD, actor, ref, line, quantiles=False), args.steps)
             for k, line in TRAIN.items()}
    rows: list[tuple[str, float, str, str]] = []

    def record(what: str, value: float, unit: str, note: str = "") -> None:
        rows.append((what, value, unit, note))
        print(f"{what:42s} {value:12.4g} {unit:6s} {note}", flush=True)

    # 1. uninterrupted, a checkpoint every step
    finish: dict[int, float] = {}

    def on_step(s: StepProgress) -> None:
        finish[s.step] = time.perf_counter()

    full_dir = os.path.join(work, "full")
    full = TorchBackend(seed=0, tp_impl="torch", run_dir=full_dir, checkpoint_every=1, timeout_s=1800)
    t0 = time.perf_counter()
    run(plans["dp2"], full, on_step=on_step)
    total = time.perf_counter() - t0
    n_params = sum(t.numel() for t in full.final_weights["actor"].values())
    record("actor parameters", n_params, "", f"layers {args.layers}, hidden {args.hidden}, ffn {args.ffn}")
    steady = [finish[k] - finish[k - 1] for k in range(1, args.steps)]
    record("steps/s (steps 1.., with checkpoints)", len(steady) / sum(steady), "1/s",
           f"run of {args.steps} steps took {total:.1f} s incl. launch and final weights")
    for s in full.io_stats:
        record(f"{s['what']} {s['step']} write", s["bytes"] / s["write_s"] / 1e6, "MB/s",
               f"{s['bytes'] / 1e6:.1f} MB in {s['files']} files, slowest worker {s['write_s']:.2f} s")
    ck = ckpt.latest_checkpoint(full_dir)
    assert ck is not None
    biggest = max((os.path.join(ck, f) for f in os.listdir(ck) if f.endswith(".safetensors")), key=os.path.getsize)
    record("disk plain copy (read + write + fsync)", copy_bandwidth(biggest), "MB/s",
           f"{os.path.getsize(biggest) / 1e6:.1f} MB shard file")

    # 2. read back: verification, then every tensor as the 2 ranks of a tp = 2 layout need it
    index = ckpt.read_index(ck)
    size = sum(f["bytes"] for f in index["files"].values())
    start = time.perf_counter()
    ckpt.verify_files(ck, index)
    record("resume verification (SHA-256)", size / (time.perf_counter() - start) / 1e6, "MB/s", f"{size / 1e6:.1f} MB")
    reader = ckpt.Reader(ck, index=index)
    tp2 = Layout((0, 1), 1, 1, 2)
    prefix = ckpt.weights_key("actor", index["step"], "")
    shapes = {k[len(prefix):]: tuple(v["shape"]) for k, v in index["tensors"].items() if k.startswith(prefix)}
    start = time.perf_counter()
    for r in tp2.ranks:
        for name, piece in rank_pieces(shapes, tp2, r, args.layers).items():
            for key in [ckpt.weights_key("actor", index["step"], name)] + reader.keys(ckpt.adam_key("actor", name, "")):
                if reader.shape(key):
                    reader.read_piece(key, piece)
                else:
                    reader.read(key)
    seconds = time.perf_counter() - start
    record("checkpoint read, resharded to tp = 2", reader.bytes_read / seconds / 1e6, "MB/s",
           f"{reader.bytes_read / 1e6:.1f} MB (page cache warm)")

    # 3. killed after step 1's checkpoint, resumed under the tp = 2 plan
    kill_dir = os.path.join(work, "killed")
    killed = TorchBackend(seed=0, tp_impl="torch", run_dir=kill_dir, checkpoint_every=1, timeout_s=1800,
                          fault="kill:train_actor#1")
    try:
        run(plans["dp2"], killed)
    except BackendError:
        pass
    resumed = TorchBackend(seed=0, tp_impl="torch", run_dir=kill_dir, checkpoint_every=1, resume=True, timeout_s=1800)
    start = time.perf_counter()
    rest = resumed.prepare(plans["tp2"])
    record("resume prepare (index, identity, SHA-256)", time.perf_counter() - start, "s")
    first: dict[str, float] = {}
    start = time.perf_counter()
    run(rest, resumed, on_step=lambda s: first.setdefault("t", time.perf_counter()))
    record("resume to the end of its first step", first["t"] - start, "s",
           f"launch + reshard on load + one step; an uninterrupted step takes {sum(steady) / len(steady):.1f} s")
    worst = max((resumed.final_weights["actor"][n] - w).abs().max().item() for n, w in full.final_weights["actor"].items())
    record("final weights, resumed tp = 2 vs uninterrupted", worst, "max|dw|", "Adam eps 1e-8: sign-like updates")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "checkpoint_scale.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["what", "value", "unit", "note"])
        for what, value, unit, note in rows:
            w.writerow([what, f"{value:.6g}", unit, note])
    print(f"wrote {path}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
