"""GPU CHECK of the torch backend and the cost model on CUDA: equivalence, calibration, and predicted against
measured time and memory. Needs a CUDA GPU; not a test (CI has no GPU), but its dry run (`--device cpu`: the
same steps on one CPU worker at tiny sizes) is tested. Run it on a GPU machine:

    .venv/bin/python -m rpegc.tools.gpu_smoke --out DIR                # every step on the CUDA devices
    .venv/bin/python -m rpegc.tools.gpu_smoke --device cpu --out DIR   # the dry run

1. One backend `Worker` in this process on the device (a single-rank layout: no process group needed)
   runs the tiny GRPO step's operators (generation, reference log-probs, the rule reward, a training step)
   and a CPU worker runs the same. Tokens are drawn on the CPU from the device's probabilities, so they
   agree unless a draw falls on a CDF boundary (reported, not failed); the GPU worker then gets the CPU's
   rollouts, and its reference log-probs, metrics and trained weights must match the CPU's to float32
   tolerance.
2. Calibration: `rpeg-calibrate` on the visible CUDA devices under NCCL, bf16, written to DIR/calibrated.toml
   (raw points in DIR/calibration-raw.csv). One device reaches no link, so its collective and p2p terms are
   copied from `--profile` (the file says so).
3. Validation: `rpeg-validate --grid gpu` on one device in DIR/validation/: the Llama 3.2 1B and Qwen2.5 0.5B
   shapes on two GRPO-shaped workloads, bf16: generation with the KV cache, reference inference and the
   actor's training step (bf16 working weights and gradients, float32 masters and Adam state, recomputed
   layers), each operator alone on the device; its time against the calibrated profile's prediction (the
   shipped `--profile` where step 2 failed) and its peak `torch.cuda.max_memory_allocated` against the memory
   model's (CSV, plots, report.md).
4. With at least 4 GPUs: `rpeg-run examples/grpo-tiny.rpeg --backend torch` with `--dist-backend nccl`
   (workers on cuda:0-3; TP through megatron-core's GPU path where the plan uses TP) and with gloo;
   both runs must verify and their final weights agree.
Steps 2 and 3 run as their own processes under a time limit each. Exit status 0 when every step passed
(validation's accuracy is reported, not judged).

On a GPU machine with torch but without rpegc installed (it needs none of xDSL, lark or megatron-core for these
steps), from the repository root: link the package tree the way pyproject.toml maps it, then run the check:

    mkdir -p /tmp/pkg/rpegc && for f in rpegc/*; do ln -s $PWD/$f /tmp/pkg/rpegc/; done
    for d in dialects passes runtime tools; do ln -s $PWD/$d /tmp/pkg/rpegc/$d; done
    PYTHONPATH=/tmp/pkg python3 -m rpegc.tools.gpu_smoke --out $OUT/gpu
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rpegc.tools.measure import device_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule"
B, R, LP, LR, MB = 8, 2, 4, 6, 2
RTOL, ATOL = 1e-4, 1e-5  # float32 forward passes on two devices
WEIGHTS_ATOL = 1e-3  # after an Adam step, whose first update is ~lr * sign(g): noise near g = 0 shows


def _worker(device: torch.device):
    from rpegc.core.ir.presets import lookup
    from rpegc.core.ir.program import Workload
    from rpegc.runtime.backends.torch.controller.run_description import model_seed
    from rpegc.runtime.backends.torch.parallel.layout import Layout
    from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config
    from rpegc.runtime.backends.torch.worker.process import ModelSpec, standalone_worker

    arch = lookup("tiny")
    run = RunConfig(algorithm="grpo", actor=arch, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype="fp32"),
                    rl=toy_rl_config("grpo"), positions="learned")
    models = {"actor": ModelSpec("actor", "policy", arch, model_seed(0, "policy")),
              "ref": ModelSpec("ref", "reference", arch, model_seed(0, "reference")),
              "reward": ModelSpec("reward", "reward", arch, model_seed(0, "reward"))}
    worker = standalone_worker(run, models, device=device)
    for m in models:
        worker.install(f"W:{m}", m, Layout((0,), 1, 1, 1))
    return worker


def _op(worker, role: str, model: str, inputs: list[str], output: str, fields: list[str]) -> dict:
    from rpegc.runtime.backends.torch.channel.commands import Op

    layout = worker.entry(f"W:{model}").layout
    cmd = Op(node=role, tag=0, ranks=[0], step=0, role=role, model=model, layout=layout, mb=MB, rows={0: (0, B * R)},
             weights=f"W:{model}", inputs=inputs, outputs={output: fields}, fields=fields, prep=[], output=None,
             version_out=None)
    if role == "training":
        cmd = replace(cmd, outputs={}, fields=[], output=output, version_out=1)
    return worker.execute(cmd)


def _fields(worker, label: str) -> dict[str, torch.Tensor]:
    return {f: t.cpu() for f, t in worker.entry(label).pieces[0].fields.items()}


def _step(worker, rollouts=None) -> dict:
    """The step's operators on `worker`; with `rollouts`, those replace its own generation's."""
    _op(worker, "generation", "actor", [], "Y", ["sequences", "mask", "old_logprobs"])
    generated = _fields(worker, "Y")
    if rollouts is not None:
        worker.put_rows("Y", 0, B * R, {f: t.to(worker.device) for f, t in rollouts.items()})
    _op(worker, "inference", "ref", ["Y"], "ref", ["ref_logprobs"])
    _op(worker, "inference", "reward", ["Y"], "reward", ["scores", "task_scores"])  # the model runs, the rule trains
    info = _op(worker, "training", "actor", ["Y", "ref", "reward"], "W:actor:1", [])
    weights = {n: t.cpu() for n, t in worker.entry("W:actor:1").shards.items()}
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
    print(f"step 1: {100 * same:.1f} % of the sequences sampled on {device} equal the CPU's")
    params = list(dev_worker.holdings.serving.values())[0].module.parameters()
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
    print(f"step 1: trained weights differ by at most {worst:.3g}")
    if worst > WEIGHTS_ATOL:
        failures.append(f"trained weights differ by {worst:.3g} > {WEIGHTS_ATOL}")
    return failures


def _rpeg_run(plan: str, run_dir: str, dist_backend: str) -> dict:
    cmd = [sys.executable, "-m", "rpegc.runtime.cli", plan, "--backend", "torch", "--dist-backend", dist_backend,
           "--run-dir", run_dir, "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    print(f"step 4: {dist_backend}: exit {out.returncode}; {out.stdout.strip().splitlines()[-1:]} {out.stderr[-2000:]}")
    if out.returncode != 0:
        return {}
    from rpegc.runtime.backends.torch.checkpoints.shard_files import load_final

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
    print(f"step 4: final weights of the nccl and gloo runs differ by at most {worst:.3g}")
    return [f"final weights differ by {worst:.3g} > {WEIGHTS_ATOL}"] if worst > WEIGHTS_ATOL else []


@dataclass(frozen=True)
class ToolStep:
    """One of the steps that run a command-line tool of rpegc in its own process."""

    name: str
    module: str
    args: tuple[str, ...]
    limit_s: float


CALIBRATED = "calibrated.toml"


def calibration_step(out: Path, dry_run: bool, profile: str) -> ToolStep:
    """rpeg-calibrate on the CUDA devices, or at smoke-test sizes on one CPU worker (`dry_run`)."""
    where = ("--backend", "gloo", "--devices", "1") if dry_run else ("--backend", "nccl")
    # One device reaches no link (the dry run takes the same path).
    links = ("--links-from", profile) if dry_run or device_count("nccl") < 2 else ()
    quick = ("--quick",) if dry_run else ()
    return ToolStep("calibration", "rpegc.tools.calibrate",
                    (*where, *links, "-o", str(out / CALIBRATED), "--raw", str(out / "calibration-raw.csv"), "-q",
                     *quick), 60 if dry_run else 120)


def validation_step(out: Path, dry_run: bool, hardware: str) -> ToolStep:
    """rpeg-validate's GPU grid on one CUDA device, priced with `hardware`, or its quick form on one CPU worker."""
    where = ("--backend", "gloo") if dry_run else ("--backend", "nccl")
    repeats = ("--quick", "--repeats", "1", "--warmup", "0") if dry_run else ("--repeats", "3", "--warmup", "1")
    return ToolStep("validation", "rpegc.tools.validate",
                    ("--grid", "gpu", *where, "--devices", "1", "--hardware", hardware, "--out",
                     str(out / "validation"), "--isolated", "-q", *repeats), 90 if dry_run else 280)


def _text(output) -> str:
    """A subprocess's captured output (bytes when it was cut off by its timeout)."""
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def run_tool(step: ToolStep, log: Path) -> list[str]:
    """Run the step's tool, its output to `log` and the tail printed; returns the failures."""
    cmd = [sys.executable, "-m", step.module, *step.args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=step.limit_s)
    except subprocess.TimeoutExpired as err:
        output = _text(err.stdout) + _text(err.stderr)
        log.write_text(f"$ {' '.join(cmd)}\n{output}\nkilled after {step.limit_s:.0f} s\n")
        print(f"{step.name}: killed after {step.limit_s:.0f} s")
        return [f"{step.name} ran past its {step.limit_s:.0f} s (see {log})"]
    log.write_text(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}\nexit {done.returncode}\n")
    print(f"{step.name}: exit {done.returncode}")
    print(done.stdout[-3000:], end="")
    if done.returncode != 0:
        print(done.stderr[-3000:], end="")
        return [f"{step.name} exited {done.returncode} (see {log})"]
    return []


def guarded(name: str, step, *args) -> list[str]:
    """The step's failures; one that raises is a failure too (its traceback printed), so the later steps still run."""
    try:
        return step(*args)
    except Exception as err:  # a diagnostic run on a machine lent for minutes: report and go on
        traceback.print_exc()
        return [f"{name} raised {type(err).__name__}: {err}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_smoke", description="GPU check of the torch backend and the cost model "
                                 "(needs CUDA; --device cpu: a dry run on one CPU worker)")
    ap.add_argument("--device", default="cuda:0", help="device of step 1 (default cuda:0; cpu: a dry run)")
    ap.add_argument("--out", default=None, help="directory for the calibrated profile, the validation and the logs "
                    "(default: a new temporary directory, printed); must not exist or be empty")
    ap.add_argument("--profile", default="h200", help="shipped profile or path: the link terms one device cannot "
                    "measure, and the prediction if calibration fails (default h200)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: torch sees no CUDA device; this check needs a GPU (--device cpu: a dry run)")
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"gpu_smoke: error: {out} is not an empty directory; name a new directory with --out")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    failures = guarded("step 1", one_worker, device)
    dry_run = device.type == "cpu"
    failures += run_tool(calibration_step(out, dry_run, args.profile), out / "calibration.log")
    hardware = str(out / CALIBRATED)
    if not (out / CALIBRATED).is_file():
        hardware = args.profile
        print(f"validation: predicting with {hardware} (no calibrated profile)")
    failures += run_tool(validation_step(out, dry_run, hardware), out / "validation.log")
    if device.type == "cuda" and torch.cuda.device_count() >= 4:
        failures += guarded("step 4", four_workers)
    else:
        print("step 4: skipped (needs 4 CUDA devices)")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"gpu_smoke: results in {out}")
    print("gpu_smoke: OK" if not failures else f"gpu_smoke: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
