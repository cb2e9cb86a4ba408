"""Issue 34, item 7: stage fusion measured on the torch backend, and the optimizer's use of it (docs/stage-fusion.md).

1. Runs. PPO on 2 CPU worker processes (lit_tests/Inputs/ppo-fused-2.rpeg) with every model the 43.7M Llama shape of
   bench/memory_runs.py and B = 32, Lp = 32, Lr = 16; actor and critic training both as 2-stage pipelines of 4
   microbatches on both workers, fused (`rpeg.fuse`, fuse-stages) against apart. Per run: the predicted (schedule) and
   measured (`rpeg-run --backend torch`, `rpegc.runtime.report.steady_state`) steady-state step and makespan; fused and
   apart runs alternate. The last fused run's Gantt chart (predicted, and measured with every microtask) is written.
2. Search. The optimizer (fixed evaluation budget, one process) with fusion allowed and with ablation A10, on the
   paper's Table X workloads and on `fusing_workload` (the same PPO with a 43.7M actor and 6.1M other models on 2 CPU
   workers of 0.7 GB: the actor trains only on both workers): the score, the structure, whether the plan fuses and
   its makespan fused and apart.

Run alone (2 worker processes on 2 cores). Writes bench/results/stage_fusion_runs.csv, stage_fusion_search.csv and
stage_fusion_gantt.png. Usage:
    .venv/bin/python bench/stage_fusion.py [--runs 2] [--steps 4] [--evals 3000] [--max-gpus 256] [--quick]
About 6 minutes (--quick: tiny models, one run each, the fusing workload only: under a minute).
"""

from __future__ import annotations

# workloads first: it pins numpy to one thread before numpy is imported.
from workloads import SEARCH_DEFAULTS, common_args, print_table, table_x, write_csv

import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from rpegc.core.cost.hardware import load_hardware
from rpegc.runtime.plan import load_plan
from rpegc.runtime.report import steady_state
from rpegc.runtime.trace import read_trace
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOURCE = ROOT / "lit_tests" / "Inputs" / "ppo-fused-2.rpeg"
ARCH = "layers = 8, hidden = 512, ffn = 1536, vocab = 16000, heads = 8, gated = true, tied = false, norms = true"
SMALL_ARCH = "layers = 2, hidden = 256, ffn = 768, vocab = 16000, heads = 4, gated = true, tied = false, norms = true"
FUSE = "  rpeg.fuse (@train_actor, @train_critic)\n"
LOWER = "verify-wellformed,unroll{{k={k}}},split-quantiles,insert-comm,insert-reshard,fuse-stages,annotate-cost,schedule"


def ppo_text(actor: str, others: str, workload: str = "Lp = 32, Lr = 16") -> str:
    """The fused PPO input with its models' shapes (`arch = ...` fields) and prompt and response lengths."""
    lines = []
    for line in SOURCE.read_text().replace("Lp = 4, Lr = 6", workload).splitlines():
        if line.startswith("rpeg.model @"):
            line = line.replace('arch = "tiny"', actor if line.startswith("rpeg.model @actor ") else others)
        lines.append(line)
    return "\n".join(lines) + "\n"


def fusing_workload():
    """(program, hardware) where the optimizer fuses: a 43.7M actor that trains only on both 0.7 GB workers (pp = 2)
    and a 6.1M critic that trains best beside it, in its pipeline bubbles."""
    return parse(ppo_text(ARCH, SMALL_ARCH), "fusing.rpeg"), replace(load_hardware("cpu"), M_GPU=0.7e9)


def one_run(text: str, name: str, steps: int, tmp: Path, gantt: Path | None) -> dict:
    src, exe, trace = tmp / f"{name}.rpeg", tmp / f"{name}.exec.rpeg", tmp / f"{name}.trace.jsonl"
    src.write_text(text)
    trace.unlink(missing_ok=True)
    subprocess.run([str(BIN / "rpegc"), str(src), "-p", LOWER.format(k=steps), "-o", str(exe)], check=True)
    cmd = [str(BIN / "rpeg-run"), str(exe), "--backend", "torch", "--quiet", "--no-memory-check", "--trace", str(trace)]
    out = subprocess.run(cmd + (["--gantt", str(gantt)] if gantt else []), capture_output=True, text=True)
    if out.returncode != 0 or "verification: OK" not in out.stdout + out.stderr:
        raise SystemExit(f"{name}: rpeg-run failed:\n{out.stdout}\n{out.stderr}")
    plan, t = load_plan(str(exe)), read_trace(str(trace))
    s = steady_state(t)
    assert s is not None and s.predicted_s is not None, "a run of >= 2 steps has a steady state"
    schedule = plan.program.exec.schedule
    first = min(r.start for r in t.nodes.values() if r.step == t.header.first_step)
    return {"plan": name, "fused": bool(plan.program.exec.fusions), "steps": steps,
            "predicted_step_s": round(s.predicted_s, 4), "measured_step_s": round(s.measured_s, 4),
            "predicted_makespan_s": round(schedule.makespan, 3),
            "measured_makespan_s": round(max(r.finish for r in t.nodes.values()) - first, 3)}


def runs(repeats: int, steps: int, quick: bool, gantt: Path) -> list[dict]:
    arch = 'arch = "tiny"' if quick else ARCH
    fused = ppo_text(arch, arch, "Lp = 4, Lr = 6" if quick else "Lp = 32, Lr = 16")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for name, text in (("fused", fused), ("apart", fused.replace(FUSE, ""))):
                last = i == repeats - 1 and name == "fused"
                row = one_run(text, name, steps, Path(tmp), gantt if last else None)
                rows.append({"run": i + 1, **row})
                print(rows[-1], flush=True)
    for i in range(repeats):  # the change per repetition, fused against the apart run beside it
        f, a = (next(r for r in rows if r["run"] == i + 1 and r["plan"] == n) for n in ("fused", "apart"))
        for r in (f, a):
            r["predicted_change"] = f"{f['predicted_step_s'] / a['predicted_step_s'] - 1:+.1%}"
            r["measured_change"] = f"{f['measured_step_s'] / a['measured_step_s'] - 1:+.1%}"
    return rows


def search_rows(evals: int, max_gpus: int, quick: bool) -> list[dict]:
    rows = []
    cases = [] if quick else [(c.name, c.program, c.hw, c.sharing_searched) for c in table_x(max_gpus)]
    cases.append(("fusing-2cpu", *fusing_workload(), False))
    for name, program, hw, ac in cases:
        for allowed in (True, False):
            options = OptimizeOptions(budget_s=0, evals=evals, seed=0, ac=ac, jobs=1,
                                      ablate=frozenset() if allowed else frozenset({"A10"}), **SEARCH_DEFAULTS)
            r = optimize(program, options, hw)
            f = r.fusion
            rows.append({"workload": name, "fusion_allowed": allowed, "tok_s": round(r.evaluation.score, 1),
                         "structure": r.variant.label(), "fuses": " + ".join(v for g in f.groups for v in g) or "-",
                         "chosen": f.chosen, "fused_makespan_s": round(f.fused.makespan, 3) if f.fused else "",
                         "fused_fits": f.fused.feasible if f.fused else "",
                         "apart_makespan_s": round(f.apart.makespan, 3), "evals": evals})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = common_args(__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="fused and apart runs each (default 2)")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (default 4)")
    ap.add_argument("--evals", type=int, default=3000, help="evaluations per search (default 3000)")
    ap.add_argument("--max-gpus", type=int, default=256, help="largest Table X workload searched (default 256)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.steps, args.evals = 1, 3, 1000
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    found = search_rows(args.evals, args.max_gpus, args.quick)
    write_csv(f"stage_fusion_search{suffix}.csv", found, args.out)
    measured = runs(args.runs, args.steps, args.quick, args.out / f"stage_fusion_gantt{suffix}.png")
    write_csv(f"stage_fusion_runs{suffix}.csv", measured, args.out)
    print_table(found, ["workload", "fusion_allowed", "tok_s", "structure", "fuses", "chosen", "fused_makespan_s",
                        "fused_fits", "apart_makespan_s"])
    print_table(measured, ["run", "plan", "predicted_step_s", "measured_step_s", "predicted_change", "measured_change",
                           "predicted_makespan_s", "measured_makespan_s"])


if __name__ == "__main__":
    main()
