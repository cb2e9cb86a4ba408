"""GPU SMOKE CHECK of the torch backend's CUDA/NCCL path. NEEDS A CUDA GPU; not a test (CI has no GPU)
and, when written, never run: no GPU was lent to the task that wrote it. Run it on a GPU machine:

    .venv/bin/python -m rpegc.tools.gpu_smoke            # part 1 on cuda:0; part 2 with >= 4 GPUs
    .venv/bin/python -m rpegc.tools.gpu_smoke --device cpu   # part 1 against itself: checks the script runs

1. One backend `Worker` in this process on the device (a single-rank layout: no process group needed)
   runs the tiny GRPO step's operators (generation, reference log-probs, the rule reward, a training step)
   and a CPU worker runs the same. Tokens are drawn on the CPU from the device's probabilities, so they
   agree unless a draw falls on a CDF boundary (reported, not failed); the GPU worker then gets the CPU's
   rollouts, and its reference log-probs, metrics and trained weights must match the CPU's to float32
   tolerance.
2. With at least 4 GPUs: `rpeg-run examples/grpo-tiny.rpeg --backend torch` with `--dist-backend nccl`
   (workers on cuda:0-3; TP through megatron-core's GPU path where the plan uses TP) and with gloo;
   both runs must verify and their final weights agree.
Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
B, R, LP, LR, MB = 8, 2, 4, 6, 2
RTOL, ATOL = 1e-4, 1e-5  # float32 forward passes on two devices
WEIGHTS_ATOL = 1e-3  # after an Adam step, whose first update is ~lr * sign(g): noise near g = 0 shows


def _worker(device: torch.device):
    from rpegc.core.ir.presets import lookup
    from rpegc.core.ir.program import Workload
    from rpegc.runtime.backends.torch.backend import model_seed
    from rpegc.runtime.backends.torch.layout import Layout
    from rpegc.runtime.backends.torch.reference import RunConfig, toy_rl_config
    from rpegc.runtime.backends.torch.worker import ModelSpec, standalone_worker

    arch = lookup("tiny")
    run = RunConfig(algorithm="grpo", actor=arch, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype="fp32"),
                    rl=toy_rl_config("grpo"), positions="learned")
    models = {"actor": ModelSpec("actor", "policy", arch, model_seed(0, "policy")),
              "ref": ModelSpec("ref", "reference", arch, model_seed(0, "reference"))}
    worker = standalone_worker(run, models, device=device)
    for m in models:
        worker.cmd_install({"model": m, "layout": Layout((0,), 1, 1, 1), "version": 0, "label": f"W:{m}"})
    return worker


def _op(worker, role: str, model: str, inputs: list[str], output: str, fields: list[str]) -> dict:
    layout = worker.entries[f"W:{model}"].layout
    cmd = {"type": "op", "node": role, "step": 0, "role": role, "model": model, "layout": layout, "mb": MB,
           "rows": {0: (0, B * R)}, "weights": f"W:{model}", "inputs": inputs, "outputs": {output: fields},
           "fields": fields, "prep": [], "tag": 0, "output": None, "version_out": None}
    if role == "training":
        cmd.update(outputs={}, fields=[], output=output, version_out=1)
    return worker.cmd_op(cmd)


def _fields(worker, label: str) -> dict[str, torch.Tensor]:
    return {f: t.cpu() for f, t in worker.entries[label].pieces[0].fields.items()}


def _step(worker, rollouts=None) -> dict:
    """The step's operators on `worker`; with `rollouts`, those replace its own generation's."""
    _op(worker, "generation", "actor", [], "Y", ["sequences", "mask", "old_logprobs"])
    generated = _fields(worker, "Y")
    if rollouts is not None:
        from rpegc.runtime.backends.torch.worker import Entry, Piece

        moved = {f: t.to(worker.device) for f, t in rollouts.items()}
        worker.entries["Y"] = Entry("data", pieces=[Piece(0, B * R, moved)])
    _op(worker, "inference", "ref", ["Y"], "ref", ["ref_logprobs"])
    _op(worker, "inference", "ref", ["Y"], "reward", ["scores", "task_scores"])
    info = _op(worker, "training", "actor", ["Y", "ref", "reward"], "W:actor:1", [])
    weights = {n: t.cpu() for n, t in worker.entries["W:actor:1"].shards.items()}
    return {"generated": generated, "ref": _fields(worker, "ref"), "metrics": info["metrics"], "weights": weights}


def one_worker(device: torch.device) -> list[str]:
    """Part 1; returns the failures."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cpu = _step(_worker(torch.device("cpu")))
    dev_worker = _worker(device)
    dev = _step(dev_worker, rollouts=cpu["generated"])
    failures = []
    same = (dev["generated"]["sequences"] == cpu["generated"]["sequences"]).all(-1).float().mean().item()
    print(f"part 1: {100 * same:.1f} % of the sequences sampled on {device} equal the CPU's")
    params = list(dev_worker.serving.values())[0].module.parameters()
    if {p.device for p in params} != {device}:
        failures.append(f"serving parameters are not all on {device}")
    try:
        torch.testing.assert_close(dev["ref"]["ref_logprobs"], cpu["ref"]["ref_logprobs"], rtol=RTOL, atol=ATOL)
    except AssertionError as e:
        failures.append(f"reference log-probs differ: {e}")
    for k, v in cpu["metrics"].items():
        if abs(dev["metrics"][k] - v) > RTOL * max(1.0, abs(v)):
            failures.append(f"metric {k}: {dev['metrics'][k]} on {device}, {v} on the CPU")
    worst = max((dev["weights"][n] - w).abs().max().item() for n, w in cpu["weights"].items())
    print(f"part 1: trained weights differ by at most {worst:.3g}")
    if worst > WEIGHTS_ATOL:
        failures.append(f"trained weights differ by {worst:.3g} > {WEIGHTS_ATOL}")
    return failures


def _rpeg_run(plan: str, run_dir: str, dist_backend: str) -> dict:
    cmd = [sys.executable, "-m", "rpegc.runtime.cli", plan, "--backend", "torch", "--dist-backend", dist_backend,
           "--run-dir", run_dir, "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    print(f"part 2: {dist_backend}: exit {out.returncode}; {out.stdout.strip().splitlines()[-1:]} {out.stderr[-2000:]}")
    if out.returncode != 0:
        return {}
    from rpegc.runtime.backends.torch.checkpoint import load_final

    return load_final(run_dir)


def four_workers() -> list[str]:
    """Part 2; returns the failures."""
    from rpegc.cli import main as rpegc_main

    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "grpo.exec.rpeg")
        if rpegc_main([os.path.join(ROOT, "examples/grpo-tiny.rpeg"), "-p", PIPELINE, "-o", plan]) != 0:
            return ["examples/grpo-tiny.rpeg did not compile"]
        nccl = _rpeg_run(plan, os.path.join(tmp, "nccl"), "nccl")
        gloo = _rpeg_run(plan, os.path.join(tmp, "gloo"), "gloo")
    if not nccl or not gloo:
        return ["an rpeg-run failed (output above)"]
    worst = max((nccl[m][n] - w).abs().max().item() for m in gloo for n, w in gloo[m].items())
    print(f"part 2: final weights of the nccl and gloo runs differ by at most {worst:.3g}")
    return [f"final weights differ by {worst:.3g} > {WEIGHTS_ATOL}"] if worst > WEIGHTS_ATOL else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_smoke", description="GPU smoke check of the torch backend (needs CUDA)")
    ap.add_argument("--device", default="cuda:0", help="device of part 1 (default cuda:0; cpu: a dry run)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: torch sees no CUDA device; this check needs a GPU (--device cpu: a dry run)")
        return 2
    failures = one_worker(device)
    if device.type == "cuda" and torch.cuda.device_count() >= 4:
        failures += four_workers()
    else:
        print("part 2: skipped (needs 4 CUDA devices)")
    for f in failures:
        print(f"FAILED: {f}")
    print("gpu_smoke: OK" if not failures else f"gpu_smoke: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
