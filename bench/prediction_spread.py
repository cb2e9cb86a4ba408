"""Issue 36: how closely this machine lets a CPU profile predict the demo's measured runs.

`make demo` prints two runs against their predictions: tiny GRPO on 2 workers (100 steps) and the arithmetic GRPO on
a Llama checkpoint with the math verifier on a pool (60 steps). Per round this bench does what a fresh clone's demo
does, `--rounds` times: `rpeg-calibrate --machine` into an empty cache directory (the first use of `hardware =
"cpu"`), both plans compiled as the Makefile compiles them (its TWO_* and ARITH_* pipelines), then `--runs` runs of
each, interleaved, the arithmetic one into a run directory with the demo's checkpoint cadence (`--checkpoint-every`,
read from the Makefile: the demo's run writes them inside its steady state, and the plan does not price them). Per
run it records the steady state's measured and predicted s/step, their ratio, what the speed
probe said of the machine against its calibration (rpeg-run's drift note), how fast the run's cores ran against the
speed they were priced at and the ratio at that speed (rpeg-run's speed witness line: runtime/speed_probe.py) and the
verify node's measured and predicted time per part (its `time per node` lines); per round the profile's keys that
price these runs most.

Two spreads come out of it: run to run under one profile (the same plan, the same prices: the machine alone), and
profile to profile across rounds (the calibration's moment). A run within 25 % of its prediction needs both small.
The ratio at the speed the cores ran takes the first out, where the witnesses follow the operators.

Writes bench/results/prediction_spread.csv (one row per run) and prediction_spread_parts.csv (one row per run and
part: a vertex or a kind of transfer, with the share of an operator's time another core computed beside it) and
prints a table and a summary. No test asserts a time. Run it alone on the machine (no tests or helpers beside it).
Usage:
    .venv/bin/python bench/prediction_spread.py [--rounds 3] [--runs 2] [--out DIR] [--keep DIR]
About 2 minutes a round with 2 runs of each.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
WITHIN = 0.25  # issue 36's bound on |measured / predicted - 1|

STEADY = re.compile(r"steady state: measured ([0-9.e-]+) s/step, predicted ([0-9.e-]+) s/step")
DRIFT = re.compile(r"at least ([0-9.]+)x (slower|faster)")
WITNESS = re.compile(r"the cores ran at ([0-9.e+-]+)x the speed they were priced at; measured/predicted at that speed "
                     r"([0-9.e+-]+)")
PART = re.compile(r"^  (\S.*?)\s+([0-9.e+-]+) ms measured,\s+([0-9.e+-]+) ms predicted(?: \([0-9.]+x\))?"
                  r"(?:,\s+([0-9]+) % beside)?(?:, waited ([0-9.e+-]+) ms)?", re.M)
PROFILE_KEYS = ("F_peak", "t_layer", "training_call", "generation_call", "node", "node_free", "contention", "co_busy",
                "co_run", "transfer", "transfer_weights", "math", "speed_probe_s", "rope_call", "rope_element",
                "witness", "verify_witness")


@dataclass(frozen=True)
class Run:
    round: int
    workload: str
    repeat: int
    clock: str  # when it started, HH:MM:SS
    measured_s: float
    predicted_s: float
    ratio: float
    probe_drift: Optional[float]  # > 1: the probe ran this much slower than at calibration (before and after)
    # (part, measured ms, predicted ms, % of its time beside another core's operator or None, ms its worker waited for
    # a core in it or None): rpeg-run's `time per node`
    parts: tuple[tuple[str, float, float, Optional[int], Optional[float]], ...]
    speed: Optional[float] = None  # how fast the run's cores ran against the speed they were priced at (witnesses)
    at_speed: Optional[float] = None  # measured / predicted at that speed

    def part(self, label: str) -> Optional[tuple[float, float]]:
        return next(((m, p) for name, m, p, _, _ in self.parts if name == label), None)


def makefile_pipelines() -> dict[str, str]:
    """The demo's pipelines as the Makefile writes them (one source of truth)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    pipes = dict(re.findall(r"^([A-Z_]+) := (.*)$", text, flags=re.M))
    return {"tiny-2": f"{pipes['TWO_OPT']},{pipes['TWO_LOWER']}",
            "arith": f"{pipes['ARITH_OPT']},{pipes['ARITH_LOWER']}"}


def makefile_checkpoint_every() -> int:
    """The demo's arithmetic run's `--checkpoint-every` (a run directory without it checkpoints every step)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    found = re.search(r"arith\.exec\.rpeg --backend torch.*?--checkpoint-every (\d+)", text, flags=re.S)
    if found is None:
        sys.exit("prediction_spread: the Makefile's arithmetic rpeg-run has no --checkpoint-every")
    return int(found.group(1))


def run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"prediction_spread: {' '.join(cmd[:3])} failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return done.stdout


def profile_keys(cache: Path) -> dict[str, float]:
    """The keys of the round's profile that price these runs most."""
    (path,) = (cache / "hardware").glob("cpu-*.toml")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    flat: dict[str, float] = {}
    host = data.get("host", {})
    for table in (data.get("compute", {}), data.get("overhead", {}), host.get("verify", {}), data.get("meta", {}),
                  {k: v for k, v in host.items() if k == "verify_witness"}):
        flat.update({k: v for k, v in table.items() if k in PROFILE_KEYS})
    return flat


def parse_run(out: str, round_: int, workload: str, repeat: int, clock: str) -> Run:
    steady = STEADY.search(out)
    if steady is None:
        sys.exit(f"prediction_spread: no steady state in the {workload} run:\n{out[-1500:]}")
    measured, predicted = float(steady[1]), float(steady[2])
    drift = DRIFT.search(out)
    parts = tuple((m[1], float(m[2]), float(m[3]), None if m[4] is None else int(m[4]),
                   None if m[5] is None else float(m[5])) for m in PART.finditer(out))
    witness = WITNESS.search(out)
    return Run(round_, workload, repeat, clock, measured, predicted, measured / predicted,
               None if drift is None else float(drift[1]) ** (1 if drift[2] == "slower" else -1), parts,
               None if witness is None else float(witness[1]), None if witness is None else float(witness[2]))


def one_round(round_: int, runs: int, arith: Path, tmp: Path, env: dict[str, str]) -> tuple[list[Run], dict]:
    cache = tmp / f"cache-{round_}"
    env = dict(env, RPEGC_CACHE_DIR=str(cache))
    start = time.perf_counter()
    run([str(BIN / "rpeg-calibrate"), "--machine", "--quiet"], env)
    keys = dict(profile_keys(cache), calibration_s=round(time.perf_counter() - start, 1))
    pipes = makefile_pipelines()
    plans = {"tiny-2": (ROOT / "examples" / "grpo-tiny-2.rpeg", []),
             "arith": (arith / "grpo.rpeg", ["--data", str(arith / "train.jsonl"),
                                             "--rl-config", str(ROOT / "examples" / "arith-rl.toml")])}
    for name, (source, _) in plans.items():
        run([str(BIN / "rpegc"), str(source), "-p", pipes[name], "-o", str(tmp / f"{name}-{round_}.exec.rpeg")], env)
    every = ["--checkpoint-every", str(makefile_checkpoint_every())]
    out = []
    for repeat in range(runs):
        for name, (_, extra) in plans.items():
            clock = time.strftime("%H:%M:%S")
            run_dir = ["--run-dir", str(tmp / f"{name}-{round_}-{repeat}.run"), *every] if name == "arith" else []
            text = run([str(BIN / "rpeg-run"), str(tmp / f"{name}-{round_}.exec.rpeg"), "--backend", "torch", "--quiet",
                        *extra, *run_dir], env)
            out.append(parse_run(text, round_, name, repeat, clock))
    return out, keys


def summary(rows: list[Run]) -> list[str]:
    lines = []
    for name in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == name]
        ratios = [r.ratio for r in mine]
        within = sum(abs(x - 1.0) <= WITHIN for x in ratios)
        by_round: dict[int, list[float]] = {}
        for r in mine:
            by_round.setdefault(r.round, []).append(r.measured_s)
        run_spread = max(max(v) / min(v) for v in by_round.values())
        predicted = sorted({r.predicted_s for r in mine})
        lines.append(f"{name}: measured/predicted {min(ratios):.2f}-{max(ratios):.2f} (median "
                     f"{statistics.median(ratios):.2f}), {within} of {len(ratios)} within {WITHIN:.0%}; the same "
                     f"plan and profile measured up to {run_spread:.2f}x apart; predictions {predicted[0]:.3g}-"
                     f"{predicted[-1]:.3g} s/step across the rounds' profiles ({predicted[-1] / predicted[0]:.2f}x)")
        seen = [r for r in mine if r.at_speed is not None and r.speed is not None]
        if seen:
            at = [r.at_speed for r in seen]
            speeds = [r.speed for r in seen]
            lines.append(f"{name} at the speed its cores ran: measured/predicted {min(at):.2f}-{max(at):.2f} (median "
                         f"{statistics.median(at):.2f}), {sum(abs(x - 1.0) <= WITHIN for x in at)} of {len(at)} "
                         f"within {WITHIN:.0%}; the cores ran at {min(speeds):.2f}-{max(speeds):.2f}x the speed they "
                         "were priced at")
    return lines


def write_csvs(rows: list[Run], keys: list[dict], out: Path) -> None:
    """One row per run (with the round's profile keys), and one per run and part."""
    head = [f.name for f in fields(Run) if f.name != "parts"]
    with open(out / "prediction_spread.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(head + ["verify_measured_ms", "verify_predicted_ms"] + list(PROFILE_KEYS) + ["calibration_s"])
        for r in rows:
            verify = r.part("verify") or (None, None)
            profile = keys[r.round]
            w.writerow([getattr(r, name) for name in head] + list(verify)
                       + [profile.get(k) for k in PROFILE_KEYS] + [profile.get("calibration_s")])
    with open(out / "prediction_spread_parts.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["round", "workload", "repeat", "part", "measured_ms", "predicted_ms", "ratio", "beside_pct",
                    "waited_ms"])
        for r in rows:
            for name, m, p, beside, waited in r.parts:
                w.writerow([r.round, r.workload, r.repeat, name, m, p, round(m / p, 4) if p > 0 else None, beside,
                            waited])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh calibrations (each a fresh clone's first use)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each workload per round, interleaved")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the CSV goes")
    ap.add_argument("--keep", type=Path, default=None,
                    help="work in this new directory and keep it (each round's profile, plans and run directories) "
                         "instead of a temporary one")
    args = ap.parse_args()
    if args.rounds < 1 or args.runs < 1:
        sys.exit("prediction_spread: --rounds and --runs must be >= 1")
    env = dict(os.environ)
    rows: list[Run] = []
    keys: list[dict] = []
    if args.keep is not None:
        try:
            args.keep.mkdir(parents=True)
        except OSError as e:
            sys.exit(f"prediction_spread: --keep {args.keep}: {e.strerror} (give a directory that does not exist)")
    with (contextlib.nullcontext(str(args.keep)) if args.keep is not None
          else tempfile.TemporaryDirectory(prefix="rpeg-spread-")) as name:
        tmp = Path(name).resolve()
        arith = tmp / "arith"
        run([sys.executable, "-m", "rpegc.tools.arith", "make", str(arith), "--warm-up", "100"], env)
        for round_ in range(args.rounds):
            got, profile = one_round(round_, args.runs, arith, tmp, env)
            rows += got
            keys.append(profile)
            print(f"round {round_}: " + ", ".join(f"{k} {v:.4g}" for k, v in profile.items()))
            for r in got:
                drift = f", probe {r.probe_drift:.2f}x" if r.probe_drift is not None else ""
                if r.part("verify") is not None:
                    drift += "; verify {:.3g} / {:.3g} ms".format(*r.part("verify"))
                if r.at_speed is not None:
                    drift += f"; cores at {r.speed:.2f}x, {r.at_speed:.2f} at that speed"
                print(f"  {r.clock} {r.workload:6s} {1000 * r.measured_s:6.1f} / {1000 * r.predicted_s:6.1f} ms/step "
                      f"= {r.ratio:.2f}{drift}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csvs(rows, keys, args.out)
    for line in summary(rows):
        print(line)
    print(f"wrote {args.out / 'prediction_spread.csv'} and {args.out / 'prediction_spread_parts.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
