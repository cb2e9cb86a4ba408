"""Issue 36, item 4: the same GRPO work through `rpeg-run --backend torch` and through TRL's GRPOTrainer, measured.

Workloads (`WORKLOADS`), each made here from nothing (no download):
- `arith`: the demo's (`make demo`, step 6; `python -m rpegc.tools.arith make DIR --warm-up 100`):
  a 2-layer Llama of hidden 64 (~0.1M parameters) and its arithmetic tokenizer, 100 supervised warm-up steps so the
  reward can move, 256 prompts `a+b=` with their answers, B = 8 prompts x R = 8 rollouts, Lp = 7 (the prompts'
  length), Lr = 4, the math verifier as the reward, 60 RL steps.
- `llama-large`: where the model's compute dominates: a 10-layer Llama of hidden 512 (~24M parameters; the same
  tokenizer and prompts, `arith.write_checkpoint`), B = 4 x R = 8, Lr = 64, 16 RL steps. Its weights are random (a
  warmed-up model answers in 3 tokens): about one sampled token in 30 is EOS, so responses average 25-45 tokens
  (arith's 3.5) and nearly every step has one that runs to Lr; its reward stays ~0, so its curve shows nothing and
  most groups have zero advantage (the backward pass runs all the same): the step time is the point.

Systems (`SYSTEMS`), run interleaved (rpeg-1 rpeg-2 trl-1 trl-ddp2, rpeg-1 rpeg-2 ..., per workload):
- `rpeg-1`: the program with `rpeg.cluster ... gpus = 1` (one CPU worker process, one thread), compiled with the
  demo's pipeline (the optimizer with an evaluation budget, so the plan is the same on any machine), then
  `rpeg-run PLAN --backend torch --quiet --data train.jsonl --reward math --rl-config examples/arith-rl.toml
  --run-dir RUN --trace T.jsonl --steps N --checkpoint-every N+1 --seed 0 --overwrite` (no checkpoint inside the
  run: TRL saves none).
- `rpeg-2`: the same with `gpus = 2`: the optimizer's 2-worker plan (a core each).
- `trl-1`: GRPOTrainer in one process, `torch.set_num_threads(1)`, the same checkpoint, tokenizer, prompts (as one
  user message each: TRL applies the tokenizer's chat template, as rpeg-run's `chat_template = "auto"` does), reward
  (`rewards.math_answer`), R, B, Lr, temperature 1, lr 3e-4 constant, beta 0, loss_type dapo (token-mean over the
  global batch: rpeg's GRPO default), fp32, gradient checkpointing off (TRL 1.16 defaults it on; rpeg's plans
  train with `recompute = none`), no vLLM (`trl_worker`).
- `trl-ddp2`: the same in 2 DDP processes (`torchrun --nproc_per_node 2`, gloo, one thread each), each generating
  and training half of every step's rollouts.
bench/trl_mapping.md maps every setting and says what cannot match.

Measured per run (one CSV row per run and repeat, `bench/results/trl_side_by_side.csv`):
- s/step: the mean (and median) of the intervals between consecutive step ends after step 0 (rpeg: its
  metrics.jsonl `time_s`, the same the runtime's steady state uses; TRL: `time.time()` in a callback's
  `on_step_end`); rpeg's predicted s/step (the schedule's, from the trace) beside it.
- tokens/s: response tokens generated in the steps after step 0 (EOS included) over their intervals.
- start-up: from the bench launching the command to the first step's start (`ready_s`) and end
  (`first_step_s`), on this process's wall clock: imports, model loading, worker and process-group start-up
  included. rpeg's run clock starts late in its process; its origin is found by polling metrics.jsonl every 20 ms
  (the smallest lag between a line's appearance and its `time_s`). rpeg-run's own start-up line (`rpeg_startup_s`:
  its clock before the first node) is kept too. Compiling the plan (`compile_s`) is apart, done once per workload.
- peak memory: the largest sum over the launched process and all its descendants (rpeg: controller, fork server and
  workers; TRL: its process, or torchrun's agent and its 2 workers) of their resident set sizes, sampled every 50 ms
  with psutil (`peak_rss_mib`: pages shared between processes, e.g. torch's libraries or a forked worker's
  copy-on-write pages, count once per process), and of their proportional set sizes (`peak_pss_mib`, every 0.5 s from
  /proc/PID/smaps_rollup: shared pages split among their users, so the sum is the tree's own memory); and the
  largest single process's RSS.
- CPU: the CPU seconds (user + system) of every process of the tree over the run (`cpu_s`; a process is counted as
  last sampled, so one that exits loses at most 50 ms), `cores_used` = cpu_s / wall_s, and the most processes at
  once: what a system takes of the host besides its step time (rpeg's plan may place a verifier pool beside its
  workers).
- phases (medians over the steps after step 0): rollout (rpeg: its generation and reward vertices' spans in the
  trace, `vertex_spans`; TRL: `_generate_and_score_completions`, timed in `trl_worker`), train (rpeg: train_actor's
  span; TRL: the rest of its step), and rpeg's gen, ref and reward apart (TRL with beta 0 computes no reference
  log-probs).
- the reward curve: the mean reward of each step (`trl_side_by_side_curves.csv`, one row per step and run).

The plot (`trl_side_by_side.png`): per workload, s/step (median of repeats, the range as error bars; rpeg's
prediction as a marker) and the reward curves (mean over repeats). No test asserts a time. Usage:
    .venv/bin/pip install -e '.[bench]'      # trl==1.16.0 beside the pinned torch/transformers (pyproject.toml)
    .venv/bin/python bench/trl_side_by_side.py [--workload arith|llama-large|all] [--repeats 3] [--steps N]
        [--systems rpeg-1,rpeg-2,trl-1,trl-ddp2] [--quick] [--sync] [--out DIR] [--no-plot] [--keep DIR]
Run it alone on the machine: every system uses both cores of a 2-core host in its 2-process form.
--quick: arith, 6 steps, one repeat (~1 minute); with --workload llama-large or all, a shrunk large model (~1 minute
more). Full (the defaults: both workloads, 3 repeats): about 21 minutes on a 2-core host (arith ~4 min, llama-large
~17 min: ~5.3 s/step for both rpeg-1 and TRL in one process, the measurement of 2026-12-05 in bench/trl_mapping.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from whole_run import write_csv  # bench/: the atomic CSV writer of the whole-run bench

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TRL_VERSION = "1.16.0"  # the pin of pyproject.toml's `bench` extra
RL_CONFIG = ROOT / "examples" / "arith-rl.toml"
LR = 3e-4  # examples/arith-rl.toml's lr_actor
TEMPERATURE = 1.0  # examples/arith-rl.toml's temperature
SEED = 0
POLL_S = 0.02  # metrics.jsonl polling (rpeg's clock origin)
SAMPLE_S = 0.05  # RSS sampling of the process tree (psutil)
PSS_SAMPLE_S = 0.5  # PSS sampling (/proc/PID/smaps_rollup: ~2 ms a process, so less often)
# The demo's lowering (Makefile ARITH_OPT/ARITH_LOWER) with an evaluation budget instead of 5 s: the same plan on
# any machine and under any load (on arith both give the same plan).
PIPELINE = ("verify-wellformed,optimize{{evals=3000 seed=0 steps={k} summary=false{extra}}},unroll{{k={k}}},"
            "split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule")
SYNC = " taus=0"  # --sync: the optimizer keeps the program's staleness 0 (on-policy, as TRL)
# Every system runs with one thread per process: rpeg's workers set it themselves, TRL's in `trl_worker`.
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "TRANSFORMERS_VERBOSITY": "error", "WANDB_DISABLED": "true"}


@dataclass(frozen=True)
class Workload:
    name: str
    B: int  # prompts per step
    R: int  # rollouts per prompt
    # prompt tokens: the prompts' length with the chat template (`a+b=` is 7 tokens), so both systems work at the
    # same width (rpeg left-pads to Lp and refuses a longer prompt; TRL pads to the batch's longest)
    Lp: int
    Lr: int  # response tokens at most
    hidden: int
    layers: int
    warm_up: int  # supervised steps before RL (arith.warm_up; 0: a random model)
    steps: int  # RL steps of a full run
    max_positions: int = 64
    rows: int = 256  # training prompts


WORKLOADS = {
    "arith": Workload("arith", B=8, R=8, Lp=7, Lr=4, hidden=64, layers=2, warm_up=100, steps=60),
    "llama-large": Workload("llama-large", B=4, R=8, Lp=7, Lr=64, hidden=512, layers=10, warm_up=0, steps=16,
                            max_positions=128),
}
# --quick with the large workload: the same shape, a model small enough for a smoke run
QUICK_LARGE = replace(WORKLOADS["llama-large"], hidden=128, layers=2, Lr=16)


@dataclass(frozen=True)
class System:
    name: str
    kind: str  # rpeg | trl
    devices: int  # rpeg: CPU workers of the cluster; trl: DDP processes


# CSV columns of step phases (medians over the steps after step 0): rpeg's vertices' spans in its trace
# (`vertex_spans`), TRL's rollout phase timed in `trl_worker` (training: the rest of its step). rpeg only: the
# reference log-probs (TRL with beta 0 computes none), generation and reward apart.
PHASES = ("rollout", "train", "gen", "ref", "reward")

SYSTEMS = (System("rpeg-1", "rpeg", 1), System("rpeg-2", "rpeg", 2), System("trl-1", "trl", 1),
           System("trl-ddp2", "trl", 2))


@dataclass
class Prepared:
    """A workload's files: checkpoint (and tokenizer), prompts, and one compiled plan per rpeg system."""

    workload: Workload
    dir: Path
    ckpt: Path
    data: Path
    params: int
    plans: dict[str, Path]
    compile_s: dict[str, float]
    placements: dict[str, str]


# -- the workload's files ------------------------------------------------------------------------------------


def make_files(w: Workload, directory: Path) -> tuple[Path, Path, int]:
    """Checkpoint, tokenizer and prompts as `arith make DIR --warm-up N` writes them (its library functions, so the
    large model's size and positions can be set); returns (checkpoint dir, train.jsonl, parameters)."""
    from rpegc.tools import arith

    ckpt, data = directory / "ckpt", directory / "train.jsonl"
    arith.write_checkpoint(str(ckpt), hidden=w.hidden, layers=w.layers, max_positions=w.max_positions)
    if w.warm_up:
        loss = arith.warm_up(str(ckpt), steps=w.warm_up)
        print(f"{w.name}: {w.warm_up} supervised warm-up steps, last loss {loss:.3f}", flush=True)
    arith.write_dataset(str(data), w.rows, seed=0)
    return ckpt, data, count_params(ckpt)


def count_params(ckpt: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def without_reference(text: str) -> str:
    """The program without its reference model: both sides train with kl_coef = 0, and TRL's GRPOTrainer with
    beta = 0 loads no reference model, so rpeg-run's graph leaves it out too (docs/runtime.md, "A KL term needs
    ...")."""
    lines = [ln for ln in text.splitlines() if "@ref" not in ln and not ln.strip().startswith("%logp_ref")]
    out = "\n".join(lines).replace(", %W_ref", "").replace(", %logp_ref", "") + "\n"
    if "ref" in out.replace("reference", "").replace("prefer", ""):
        raise SystemExit("arith.grpo_program's reference lines changed; update "
                         "bench/trl_side_by_side.without_reference")
    return out


def program_text(w: Workload, ckpt: Path, devices: int) -> str:
    """arith's GRPO program (the one `arith make` writes) for this workload, on `devices` CPU workers: the cluster's
    `gpus` and the written plan (which the optimizer replaces) on them."""
    from rpegc.tools.arith import grpo_program

    text = without_reference(grpo_program(B=w.B, R=w.R, Lp=w.Lp, Lr=w.Lr, ckpt=str(ckpt)))
    text = text.replace("gpus = 2,", f"gpus = {devices},")
    if f"gpus = {devices}," not in text:
        raise SystemExit("arith.grpo_program has no `rpeg.cluster ... gpus = 2, ...` line to set the workers in")
    return text.replace("extent (1, 1, 2) dp = 2", f"extent (1, 1, {devices}) dp = {devices}")


def compile_plan(src: Path, out: Path, steps: int, sync: bool = False) -> Optional[float]:
    """`rpegc SRC -p PIPELINE -o OUT` in a process of its own; returns its wall time, or None (with the compiler's
    error printed) when it fails: that system is then left out of the workload."""
    start = time.perf_counter()
    pipeline = PIPELINE.format(k=steps, extra=SYNC if sync else "")
    done = subprocess.run([str(BIN / "rpegc"), str(src), "-p", pipeline, "-o", str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"warning: cannot compile {src}; its system is left out:\n{done.stderr.strip()}", flush=True)
        return None
    return time.perf_counter() - start


def placements(plan: Path) -> str:
    """The compiled plan's placements and staleness, one line (what the optimizer chose): `vertex@first+devices:
    d.p.t.m.` for a device placement, the line's own words otherwise (e.g. a verifier's `pool = 1`)."""
    text = plan.read_text()
    m = re.search(r"^rpeg\.plan [^{]*\{\n(.*?)^\}", text, flags=re.M | re.S)
    parts = []
    for line in (m.group(1).splitlines() if m else []):
        f = re.match(r"\s*@(\w+)\s+at \(0, 0, (\d+)\) extent \(1, 1, (\d+)\) dp = (\d+) pp = (\d+) tp = (\d+) "
                     r"mb = (\d+)", line)
        if f:
            parts.append(f"{f[1]}@{f[2]}+{f[3]}:d{f[4]}p{f[5]}t{f[6]}m{f[7]}")
        elif line.strip():
            name, _, rest = line.strip().partition(" ")
            parts.append(f"{name.lstrip('@')}:{rest.strip().replace(' ', '')}")
    tau = re.search(r"rpeg\.staleness \{([^}]*)\}", text)
    return " ".join(parts) + (f" tau({tau.group(1).replace(' ', '')})" if tau else "")


def prepare(w: Workload, directory: Path, steps: int, systems: list[System], sync: bool = False) -> Prepared:
    directory.mkdir(parents=True, exist_ok=True)
    ckpt, data, params = make_files(w, directory)
    plans, compile_s, placed = {}, {}, {}
    for s in systems:
        if s.kind != "rpeg":
            continue
        src, out = directory / f"grpo-{s.devices}.rpeg", directory / f"grpo-{s.devices}.exec.rpeg"
        src.write_text(program_text(w, ckpt, s.devices))
        took = compile_plan(src, out, steps, sync)
        if took is None:
            continue
        compile_s[s.name], plans[s.name], placed[s.name] = took, out, placements(out)
        print(f"{w.name}/{s.name}: compiled in {compile_s[s.name]:.1f} s: {placed[s.name]}", flush=True)
    print(f"{w.name}: {params / 1e6:.2f}M parameters, B = {w.B}, R = {w.R}, Lp = {w.Lp}, Lr = {w.Lr}, {steps} steps",
          flush=True)
    return Prepared(w, directory, ckpt, data, params, plans, compile_s, placed)


# -- running a command and watching it ------------------------------------------------------------------------


@dataclass
class Watched:
    launch: float  # time.time() when the command was started
    exit_s: float  # its wall time
    rc: int
    peak_rss: int  # bytes: the process tree's largest summed RSS
    peak_proc_rss: int  # bytes: the largest single process's RSS
    peak_pss: Optional[int]  # bytes: the process tree's largest summed PSS (shared pages split among their users)
    cpu_s: float  # CPU seconds (user + system) of every process of the tree, as last sampled
    processes: int  # the most processes the tree had at once
    seen: dict[int, float]  # step -> time.time() its metrics line was first seen (rpeg's metrics.jsonl)
    output: str


def _metric_steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def watch(cmd: list[str], env: dict[str, str], log: Path, metrics: Optional[Path] = None,
          timeout_s: float = 7200) -> Watched:
    """Run `cmd` (its output to `log`), sampling its process tree's RSS and polling `metrics` for new step lines."""
    import psutil

    with open(log, "w") as out:
        launch = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
        root = psutil.Process(proc.pid)
        peak = peak_proc = most = 0
        peak_pss: Optional[int] = None
        cpu: dict[int, float] = {}
        seen: dict[int, float] = {}
        last_sample = last_pss = 0.0
        while proc.poll() is None:
            now = time.time()
            if now - last_sample >= SAMPLE_S:
                last_sample = now
                tree = [root] + _children(root)
                most = max(most, len(tree))
                total = 0
                for p in tree:
                    try:
                        rss = p.memory_info().rss
                        times = p.cpu_times()
                    except psutil.Error:
                        continue
                    cpu[p.pid] = times.user + times.system
                    total += rss
                    peak_proc = max(peak_proc, rss)
                peak = max(peak, total)
                if now - last_pss >= PSS_SAMPLE_S:
                    last_pss = now
                    shares = [pss(p.pid) for p in tree]
                    if all(v is not None for v in shares):
                        peak_pss = max(peak_pss or 0, sum(shares))
            if metrics is not None:
                for rec in _metric_steps(metrics):
                    seen.setdefault(rec["step"], now)
            if now - launch > timeout_s:
                proc.kill()
                break
            time.sleep(POLL_S)
        rc = proc.wait()
        exit_s = time.time() - launch
    return Watched(launch, exit_s, rc, peak, peak_proc, peak_pss, sum(cpu.values()), most, seen, log.read_text())


def pss(pid: int) -> Optional[int]:
    """A process's proportional set size in bytes (Linux), None where it cannot be read (or it has exited)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _children(p) -> list:
    import psutil

    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


# -- the systems -----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One run's per-step record: step end times on the bench's clock (s since launch), rewards, response tokens."""

    ends: list[float]
    rewards: list[float]
    tokens: list[float]
    ready_s: float  # launch -> the first step's start
    phases: dict[str, list[float]] = field(default_factory=dict)  # phase -> its seconds in each step after step 0
    predicted_s: Optional[float] = None  # rpeg: the schedule's steady-state s/step
    rpeg_startup_s: Optional[float] = None  # rpeg: its own start-up line (run clock before the first node)


def run_rpeg(p: Prepared, s: System, steps: int, work: Path, tag: str) -> tuple[Run, Watched]:
    from rpegc.runtime.report import steady_state, startup_time
    from rpegc.runtime.trace import read_trace

    run_dir, trace = work / f"{tag}.run", work / f"{tag}.trace.jsonl"
    cmd = [str(BIN / "rpeg-run"), str(p.plans[s.name]), "--backend", "torch", "--quiet", "--data", str(p.data),
           "--reward", "math", "--rl-config", str(RL_CONFIG), "--run-dir", str(run_dir), "--trace", str(trace),
           "--steps", str(steps), "--checkpoint-every", str(steps + 1), "--seed", str(SEED), "--overwrite"]
    # a kept directory's earlier run of this tag (--keep): its metrics would be polled as this run's start-up
    shutil.rmtree(run_dir, ignore_errors=True)
    w = watch(cmd, {**os.environ, **THREAD_ENV}, work / f"{tag}.log", metrics=run_dir / "metrics.jsonl")
    if w.rc != 0:
        raise SystemExit(f"{tag}: rpeg-run failed ({w.rc}):\n{w.output[-3000:]}")
    recs = sorted(_metric_steps(run_dir / "metrics.jsonl"), key=lambda r: r["step"])
    # the run clock's origin on the wall clock: a line appears after its time_s, never before
    origin = min(w.seen[r["step"]] - r["time_s"] for r in recs if r["step"] in w.seen)
    t = read_trace(str(trace))
    steady = steady_state(t)
    first = min(r.start for r in t.nodes.values() if r.step == t.header.first_step)
    return Run(ends=[origin + r["time_s"] - w.launch for r in recs],
               rewards=[r.get("reward", float("nan")) for r in recs],
               tokens=[r.get("response_tokens", float("nan")) for r in recs], ready_s=origin + first - w.launch,
               phases=vertex_spans(t), predicted_s=steady.predicted_s if steady else None,
               rpeg_startup_s=startup_time(t)), w


PHASE_OF = {"gen": "gen", "ref_inf": "ref", "train_actor": "train"}  # any other vertex scores: the reward


def vertex_spans(trace) -> dict[str, list[float]]:
    """Per phase (`PHASE_OF`: gen, ref, reward, train), its span in each step after the first (its op nodes' first
    start to last finish), and the rollout phase (generation + reward: what TRL's `_generate_and_score_completions`
    does)."""
    first = trace.header.first_step
    spans: dict[tuple[str, int], list[float]] = {}
    for r in trace.nodes.values():
        if r.kind == "op" and r.step > first:
            phase = PHASE_OF.get(r.id.split("#")[0], "reward")
            lo_hi = spans.setdefault((phase, r.step), [r.start, r.finish])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], r.start), max(lo_hi[1], r.finish)
    out: dict[str, list[float]] = {}
    for (phase, _), (lo, hi) in sorted(spans.items(), key=lambda kv: kv[0][1]):
        out.setdefault(phase, []).append(hi - lo)
    if out.get("gen") and len(out.get("reward", [])) == len(out["gen"]):
        out["rollout"] = [g + r for g, r in zip(out["gen"], out["reward"])]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_trl(p: Prepared, s: System, steps: int, work: Path, tag: str) -> tuple[Run, Watched]:
    out_dir, steps_file = work / f"{tag}.trl", work / f"{tag}.steps.jsonl"
    spec = {"ckpt": str(p.ckpt), "data": str(p.data), "out": str(out_dir), "steps_file": str(steps_file),
            "B": p.workload.B, "R": p.workload.R, "Lr": p.workload.Lr, "steps": steps, "processes": s.devices}
    me = [str(Path(__file__).resolve()), "trl-worker", json.dumps(spec)]
    # a kept directory's earlier run of this tag (--keep): its step lines would be read as this run's (rank 0 appends)
    steps_file.unlink(missing_ok=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    if s.devices == 1:
        cmd = [sys.executable] + me
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(s.devices),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port())] + me
    w = watch(cmd, {**os.environ, **THREAD_ENV}, work / f"{tag}.log")
    if w.rc != 0:
        raise SystemExit(f"{tag}: TRL failed ({w.rc}):\n{w.output[-3000:]}")
    recs = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    begin = [r for r in recs if r.get("event") == "begin"]
    recs = sorted((r for r in recs if r.get("event") == "step"), key=lambda r: r["step"])
    n = p.workload.B * p.workload.R
    rollout = [r["rollout_s"] for r in recs[1:]]
    # training: the rest of the step (the loss's forward and backward, the optimizer, the callbacks)
    train = [b["wall"] - a["wall"] - r for a, b, r in zip(recs, recs[1:], rollout)]
    return Run(ends=[r["wall"] - w.launch for r in recs], rewards=[r["reward"] for r in recs],
               tokens=[r["mean_length"] * n for r in recs], ready_s=begin[0]["wall"] - w.launch,
               phases={"rollout": rollout, "train": train}), w


def trl_worker(spec: dict) -> int:
    """One TRL process (torchrun starts one per rank): GRPOTrainer on the workload's files, one thread; rank 0
    writes a line per step (its end on time.time(), reward, mean completion length) to spec['steps_file']."""
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from rpegc.runtime.backends.torch.rl.rewards import math_answer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rows = [json.loads(line) for line in open(spec["data"], encoding="utf-8") if line.strip()]
    # a text prompt as one user message: TRL then applies the tokenizer's chat template with the generation prompt,
    # as rpeg-run's data config `chat_template = "auto"` does
    dataset = Dataset.from_list([{"prompt": r["prompt"] if isinstance(r["prompt"], list)
                                  else [{"role": "user", "content": r["prompt"]}],
                                  "answer": r["answer"], "data_source": r.get("data_source", "")} for r in rows])

    def math_verifier(completions, answer, data_source, **_):
        """rpeg-run's `--reward math` (rewards.math_answer) in TRL's reward-function signature."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [math_answer(src, text, truth)["score"] for text, truth, src in zip(texts, answer, data_source)]

    class StepClock(TrainerCallback):
        """Rank 0's step ends (time.time()) and logged metrics, and the time of each step's rollout phase."""

        def __init__(self, path: str):
            self.path, self.end, self.rollout = path, None, float("nan")

        def _write(self, rec: dict) -> None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")

        def on_train_begin(self, args, state, control, **kw):
            if state.is_world_process_zero:
                self._write({"event": "begin", "wall": time.time()})

        def on_step_end(self, args, state, control, **kw):
            self.end = time.time()

        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs and "reward" in logs:
                self._write({"event": "step", "step": state.global_step - 1, "wall": self.end,
                             "reward": logs["reward"], "mean_length": logs.get("completions/mean_length", float("nan")),
                             "rollout_s": self.rollout})

    clock = StepClock(spec["steps_file"])

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer timing its rollout phase (generation, reward, advantages: `_generate_and_score_completions`)."""

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            clock.rollout = time.perf_counter() - start
            return out

    n = spec["B"] * spec["R"]
    config = GRPOConfig(
        output_dir=spec["out"], use_cpu=True, ddp_backend="gloo" if spec["processes"] > 1 else None,
        per_device_train_batch_size=n // spec["processes"], gradient_accumulation_steps=1,
        num_generations=spec["R"], max_completion_length=spec["Lr"], temperature=TEMPERATURE, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch_fused", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        beta=0.0, loss_type="dapo", epsilon=0.2, scale_rewards="group", num_iterations=1,
        max_steps=spec["steps"], logging_steps=1, save_strategy="no", report_to="none", seed=SEED,
        bf16=False, fp16=False, disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=True,
        log_completions=False, gradient_checkpointing=False)
    tokenizer = AutoTokenizer.from_pretrained(spec["ckpt"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(spec["ckpt"], local_files_only=True, dtype=torch.float32)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=[math_verifier], args=config, train_dataset=dataset,
                               processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    return 0


# -- rows, summary, plot ---------------------------------------------------------------------------------------


def row_of(p: Prepared, s: System, rep: int, steps: int, run: Run, w: Watched) -> dict:
    intervals = [b - a for a, b in zip(run.ends, run.ends[1:])]
    steady_tokens = sum(run.tokens[1:])
    finite = [r for r in run.rewards if r == r]
    tail = finite[-10:]
    return {
        "workload": p.workload.name, "system": s.name, "repeat": rep, "steps": len(run.ends), "devices": s.devices,
        "params_M": round(p.params / 1e6, 3), "B": p.workload.B, "R": p.workload.R, "Lp": p.workload.Lp,
        "Lr": p.workload.Lr,
        # the mean interval is the throughput: rpeg's pipelined plans (staleness 1) finish steps in bursts, whose
        # median interval understates the step (runtime/report.py)
        "s_per_step": statistics.fmean(intervals) if intervals else float("nan"),
        "s_per_step_median": statistics.median(intervals) if intervals else float("nan"),
        "predicted_s_per_step": run.predicted_s if run.predicted_s is not None else "",
        "tokens_per_s": steady_tokens / sum(intervals) if intervals else float("nan"),
        "response_len": statistics.fmean(run.tokens) / (p.workload.B * p.workload.R),
        "ready_s": run.ready_s, "first_step_s": run.ends[0], "wall_s": w.exit_s,
        "cpu_s": w.cpu_s, "cores_used": w.cpu_s / w.exit_s, "processes": w.processes,
        "rpeg_startup_s": run.rpeg_startup_s if run.rpeg_startup_s is not None else "",
        "compile_s": p.compile_s.get(s.name, ""),
        "peak_rss_mib": w.peak_rss / 2**20, "peak_pss_mib": w.peak_pss / 2**20 if w.peak_pss is not None else "",
        "peak_proc_rss_mib": w.peak_proc_rss / 2**20,
        **{f"{phase}_s": statistics.median(run.phases[phase]) if run.phases.get(phase) else "" for phase in PHASES},
        "reward_first": finite[0] if finite else float("nan"),
        "reward_last10": statistics.fmean(tail) if tail else float("nan"),
        "plan": p.placements.get(s.name, f"TRL {TRL_VERSION}, {s.devices} process(es)"),
    }


def curve_rows(p: Prepared, s: System, rep: int, run: Run) -> list[dict]:
    n = p.workload.B * p.workload.R
    return [{"workload": p.workload.name, "system": s.name, "repeat": rep, "step": k, "reward": r,
             "response_len": t / n, "step_end_s": e}
            for k, (e, r, t) in enumerate(zip(run.ends, run.rewards, run.tokens))]


def summarise(rows: list[dict]) -> list[dict]:
    """Per workload and system: medians over repeats (s/step, tokens/s, start-up, peak memory), the range of s/step."""
    out = []
    for key in dict.fromkeys((r["workload"], r["system"]) for r in rows):
        rs = [r for r in rows if (r["workload"], r["system"]) == key]
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("s_per_step", "s_per_step_median", "tokens_per_s", "ready_s", "first_step_s", "peak_rss_mib",
                "reward_last10", "response_len", "cores_used")}
        psss = [r["peak_pss_mib"] for r in rs if r["peak_pss_mib"] != ""]
        med["peak_pss_mib"] = statistics.median(psss) if psss else None
        pred = [r["predicted_s_per_step"] for r in rs if r["predicted_s_per_step"] != ""]
        for phase in ("rollout_s", "train_s"):
            got = [r[phase] for r in rs if r[phase] != ""]
            med[phase] = statistics.median(got) if got else None
        out.append({"workload": key[0], "system": key[1], "repeats": len(rs), **med,
                    "s_per_step_min": min(r["s_per_step"] for r in rs),
                    "s_per_step_max": max(r["s_per_step"] for r in rs),
                    "predicted_s_per_step": pred[0] if pred else None})
    return out


def verdicts(summary: list[dict]) -> list[str]:
    """The issue's targets, per workload: rpeg-1 against trl-1, and rpeg-2 against rpeg-1 and trl-ddp2 where rpeg's
    prediction says 2 workers beat one."""
    lines = []
    for wname in dict.fromkeys(r["workload"] for r in summary):
        by = {r["system"]: r for r in summary if r["workload"] == wname}
        if "rpeg-1" in by and "trl-1" in by:
            a, b = by["rpeg-1"]["s_per_step"], by["trl-1"]["s_per_step"]
            lines.append(f"{wname}: one device: rpeg-1 {a:.3f} s/step vs trl-1 {b:.3f}: TRL/rpeg {b / a:.2f}x "
                         f"({'met' if a <= b else 'NOT met'}: rpeg at least as fast)")
        if "rpeg-2" in by and "rpeg-1" in by:
            p1, p2 = by["rpeg-1"]["predicted_s_per_step"], by["rpeg-2"]["predicted_s_per_step"]
            m1, m2 = by["rpeg-1"]["s_per_step"], by["rpeg-2"]["s_per_step"]
            says = p1 is not None and p2 is not None and p2 < p1
            pred = f"predicted {p2:.3f} vs {p1:.3f} s/step" if p1 is not None and p2 is not None else "no prediction"
            line = f"{wname}: two workers: rpeg-2 {m2:.3f} s/step vs rpeg-1 {m1:.3f} (speed-up {m1 / m2:.2f}x; {pred}"
            if "trl-ddp2" in by:
                d = by["trl-ddp2"]["s_per_step"]
                line += f"); trl-ddp2 {d:.3f} s/step"
                if says:
                    line += f": {'met' if m2 < m1 and m2 < d else 'NOT met'} (rpeg-2 faster than both)"
                else:
                    line += ": the prediction does not say 2 workers are faster; no target"
            else:
                line += ")"
            lines.append(line)
    return lines


def report(summary: list[dict]) -> None:
    def opt(v: Optional[float]) -> str:
        return f"{v:8.3f}" if v is not None else f"{'':8s}"

    print(f"\n{'workload':12s} {'system':9s} {'s/step':>8s} {'(median)':>8s} {'pred':>8s} {'rollout':>8s} {'train':>8s} "
          f"{'tok/s':>8s} {'ready':>7s} {'1st step':>8s} {'RSS MiB':>8s} {'PSS MiB':>8s} {'cores':>5s} {'len':>5s} "
          f"{'reward':>6s}")
    for r in summary:
        print(f"{r['workload']:12s} {r['system']:9s} {r['s_per_step']:8.3f} {r['s_per_step_median']:8.3f} "
              f"{opt(r['predicted_s_per_step'])} {opt(r['rollout_s'])} {opt(r['train_s'])} "
              f"{r['tokens_per_s']:8.0f} {r['ready_s']:6.1f}s {r['first_step_s']:7.1f}s {r['peak_rss_mib']:8.0f} "
              f"{r['peak_pss_mib'] if r['peak_pss_mib'] is not None else float('nan'):8.0f} {r['cores_used']:5.2f} "
              f"{r['response_len']:5.1f} {r['reward_last10']:6.3f}")
    print()
    for line in verdicts(summary):
        print(line)


def plot(summary: list[dict], curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in summary))
    colors = {"rpeg-1": "tab:blue", "rpeg-2": "tab:cyan", "trl-1": "tab:red", "trl-ddp2": "tab:orange"}
    fig, axes = plt.subplots(2, len(workloads), figsize=(max(7.0, 5.5 * len(workloads)), 8), squeeze=False)
    for j, wname in enumerate(workloads):
        rs = [r for r in summary if r["workload"] == wname]
        ax = axes[0][j]
        xs = range(len(rs))
        ax.bar(xs, [r["s_per_step"] for r in rs], color=[colors.get(r["system"], "grey") for r in rs],
               yerr=[[r["s_per_step"] - r["s_per_step_min"] for r in rs],
                     [r["s_per_step_max"] - r["s_per_step"] for r in rs]],
               capsize=3)
        for x, r in zip(xs, rs):
            if r["predicted_s_per_step"] is not None:
                ax.scatter([x], [r["predicted_s_per_step"]], marker="_", s=400, color="black", zorder=3,
                           label="rpeg predicted" if x == 0 else None)
            ax.annotate(f"{r['s_per_step']:.3g}", (x, r["s_per_step"]), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(list(xs), [r["system"] for r in rs])
        ax.set_ylabel("s/step (mean of step intervals after step 0)")
        ax.set_title(f"{wname}: step time (median of {rs[0]['repeats']} repeat(s), range)", fontsize=9)
        if any(r["predicted_s_per_step"] is not None for r in rs):
            ax.legend(fontsize=7)
        ax = axes[1][j]
        for system in dict.fromkeys(c["system"] for c in curves if c["workload"] == wname):
            cs = [c for c in curves if c["workload"] == wname and c["system"] == system]
            steps = sorted({c["step"] for c in cs})
            mean = [statistics.fmean(c["reward"] for c in cs if c["step"] == k) for k in steps]
            ax.plot(steps, mean, color=colors.get(system, "grey"), label=system, lw=1.2)
        ax.set_xlabel("RL step")
        ax.set_ylabel("mean reward (math verifier)")
        ax.set_title(f"{wname}: reward per step (mean over repeats)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("GRPO side by side: rpeg-run (torch backend, CPU workers)\n"
                 f"and TRL GRPOTrainer {TRL_VERSION} (1 process; 2 DDP processes, gloo)", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    print(f"wrote {path}")


# -- main ------------------------------------------------------------------------------------------------------


def check_trl() -> None:
    try:
        import trl
    except ImportError:
        raise SystemExit("TRL is not installed: .venv/bin/pip install -e '.[bench]' (trl==1.16.0)") from None
    if trl.__version__ != TRL_VERSION:
        print(f"warning: trl {trl.__version__} installed; the bench's mapping is for {TRL_VERSION}", file=sys.stderr)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trl-worker"]:
        return trl_worker(json.loads(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=(*WORKLOADS, "all"), default=None,
                    help="default: all (--quick: arith)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every system, in rounds (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the workload's: arith 60, "
                    "llama-large 16)")
    ap.add_argument("--systems", default=",".join(s.name for s in SYSTEMS),
                    help="comma-separated subset of " + ", ".join(s.name for s in SYSTEMS))
    ap.add_argument("--quick", action="store_true", help="6 steps, one repeat, arith unless --workload says else "
                    "(the large model shrunk)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (checkpoints, plans, logs, "
                    "traces); default: a temporary directory")
    ap.add_argument("--sync", action="store_true", help="rpeg plans keep staleness 0 (optimize{taus=0}): on-policy "
                    "like TRL; results get the suffix _sync")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.repeats < 1 or (args.steps is not None and args.steps < 2):
        ap.error("--repeats >= 1 and --steps >= 2 (s/step needs two step ends)")
    check_trl()
    by_name = {s.name: s for s in SYSTEMS}
    unknown = [n for n in args.systems.split(",") if n not in by_name]
    if unknown:
        ap.error(f"unknown system(s) {', '.join(unknown)}")
    systems = [by_name[n] for n in args.systems.split(",")]
    workload = args.workload or ("arith" if args.quick else "all")
    chosen = list(WORKLOADS) if workload == "all" else [workload]
    if args.quick:
        args.repeats, args.steps = 1, args.steps or 6
    workloads = [QUICK_LARGE if args.quick and n == "llama-large" else WORKLOADS[n] for n in chosen]
    if (os.cpu_count() or 1) < 2:
        print("warning: fewer than 2 cores; the 2-process systems share one and measure the host")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ("_quick" if args.quick else "") + ("_sync" if args.sync else "")
    work_root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rpeg-trl-"))
    rows: list[dict] = []
    curves: list[dict] = []
    try:
        for w in workloads:
            steps = args.steps or w.steps
            p = prepare(w, work_root / w.name, steps, systems, args.sync)
            for rep in range(args.repeats):
                for s in systems:
                    if s.kind == "rpeg" and s.name not in p.plans:
                        continue  # its plan did not compile
                    tag = f"{w.name}-{s.name}-{rep}"
                    start = time.perf_counter()
                    run, watched = (run_rpeg if s.kind == "rpeg" else run_trl)(p, s, steps, work_root / w.name, tag)
                    row = row_of(p, s, rep, steps, run, watched)
                    rows.append(row)
                    curves += curve_rows(p, s, rep, run)
                    pred = (f", predicted {row['predicted_s_per_step']:.3f}" if row["predicted_s_per_step"] != ""
                            else "")
                    print(f"[{rep}] {w.name:12s} {s.name:9s} {row['s_per_step']:.3f} s/step{pred}, "
                          f"{row['tokens_per_s']:.0f} tokens/s, ready {row['ready_s']:.1f} s, first step "
                          f"{row['first_step_s']:.1f} s, peak RSS {row['peak_rss_mib']:.0f} MiB, reward "
                          f"{row['reward_first']:.2f} -> {row['reward_last10']:.2f}, "
                          f"run {time.perf_counter() - start:.1f} s",
                          flush=True)
    finally:  # what ran is written even when a run failed
        write_csv(out / f"trl_side_by_side{suffix}.csv", rows)
        write_csv(out / f"trl_side_by_side_curves{suffix}.csv", curves)
        if not args.keep:
            shutil.rmtree(work_root, ignore_errors=True)
    if not rows:
        print("no run finished")
        return 1
    summary = summarise(rows)
    if not args.no_plot:
        plot(summary, curves, out / f"trl_side_by_side{suffix}.png")
    report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
