"""How long a verifier takes on this machine's host (the `[host]` table of a CPU profile; core/cost/host.py).

- `per_response(spec, texts, examples)`: t_resp, the seconds one call of the reward function takes on one core:
  the median over repeats of a whole batch's time divided by its size, after a warm-up call (the first call of
  `math` imports sympy). `busy_per_response` takes it with every core of the host scoring at once, as a run keeps
  them busy (a pool's processes beside each other and beside the workers; the devices are calibrated the same way):
  on the 2-core VM a call took 0.67-0.89 ms alone and 1.1-1.3 ms inside runs whose other core was busy.
- `call_overhead(spec)`: t_call, what one verify operator costs beyond its calls: handing one response to a pool
  process and collecting its score (runtime/backends/torch/controller/verifier_pool.py), the median over repeats, less
  one call's t_resp.
- `measure_host(where, scorers)`: the `[host]` table `rpeg-calibrate --machine` writes (`HostTable.text`): the host's
  cores, t_call, t_resp of the built-in functions over `samples()`, responses shaped as the arithmetic demo's (GSM8K's
  `#### n` answers), and the checkpoint writes' terms (tools/checkpoint_timing.py, timed under `where`). The built-ins
  are timed in windows at several moments of the calibration by one set of processes (`BusyScorers`), each batch
  followed by the speed witness a run's pool process ends its share with (runtime/speed_probe.py), and the windows'
  median is kept, which one slow window does not move (one window a slow minute covers whole priced the arithmetic
  demo's verifier 1.6x its runs). `host_text(where)` is the table with one window.
- `rpeg-calibrate --verifier SPEC --data FILE` measures a user's function over a dataset's ground truths taken as
  responses (`measure_dataset`): what a verifier costs on answers of the right form, before any training.
"""

from __future__ import annotations

import json
import queue
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.report import host_cores
from rpegc.tools.checkpoint_timing import checkpoint_lines
from rpegc.runtime.backends.torch.controller.verifier_pool import TextExample

REPEATS = 5
# A machine profile's built-ins take windows of 12 batches (~0.5 s of math on each core) at three moments of the
# calibration and keep the median of the windows' medians: this VM's speed moves within tenths of a second, and 5
# batches of math (0.2 s) measured 0.58-1.11 ms a response where 25 measured 0.63-0.75 (docs/calibration.md, "Siblings
# priced"); and it runs slow for minutes at a time, which one window of 25 batches caught whole in 3 of 5 calibrations
# of one hour (0.90-1.09 ms against 0.56-0.63: docs/calibration.md, "The built-ins' windows"). The fastest window
# instead priced every run of a slow half hour below it (docs/calibration.md, the same section).
WINDOW_REPEATS = 12
POOL_REPEATS = 20


def samples(n: int = 64) -> tuple[list[str], list[TextExample]]:
    """`n` responses and their examples shaped as the arithmetic demo's: half right, half wrong."""
    texts, examples = [], []
    for i in range(n):
        a, b = 3 + i % 17, 5 + (7 * i) % 23
        answer = a + b
        texts.append(f"{a} + {b} = {answer if i % 2 == 0 else answer + 1}\n#### {answer if i % 2 == 0 else answer + 1}")
        examples.append(TextExample("arith", str(answer), {}))
    return texts, examples


def per_response(spec: str, texts: Sequence[str], examples: Sequence[Any], repeats: int = REPEATS) -> float:
    """t_resp of the reward function `spec` over `texts` (seconds per call, median of `repeats` batches)."""
    return _batches(spec, texts, examples, repeats, witnessed=False)[0]


def witnessed_per_response(spec: str, texts: Sequence[str], examples: Sequence[Any],
                           repeats: int = REPEATS) -> tuple[float, float]:
    """`per_response`, and the median of the speed witness (runtime/speed_probe.py) after each batch, as a run's pool
    process ends its share of a verify operator with it: how fast this core ran meanwhile."""
    t_resp, seen = _batches(spec, texts, examples, repeats, witnessed=True)
    assert seen is not None
    return t_resp, seen


def _batches(spec: str, texts: Sequence[str], examples: Sequence[Any], repeats: int,
             witnessed: bool) -> tuple[float, Optional[float]]:
    from rpegc.runtime.backends.torch.rl.rewards import load_reward, score_texts
    from rpegc.runtime.speed_probe import witness_seconds

    fn = load_reward(spec)
    rows = list(range(len(texts)))
    score_texts(fn, texts[:1], examples[:1], rows[:1])  # warm-up: imports, caches
    times, seen = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        score_texts(fn, texts, examples, rows)
        times.append((time.perf_counter() - t0) / len(texts))
        if witnessed:
            seen.append(witness_seconds())
    return statistics.median(times), statistics.median(seen) if seen else None


def _scorer(specs: Sequence[str], texts: Sequence[str], examples: Sequence[Any], start: Any, requests: Any,
            results: Any) -> None:
    """One core's process of `BusyScorers`: load and warm each function, then per request (a window's batch count;
    None ends it) time each function's batches and the witness after each, the others' processes starting at the same
    moment."""
    from rpegc.runtime.speed_probe import prepare_witness

    for spec in specs:
        per_response(spec, texts[:1], examples[:1], repeats=1)
    prepare_witness()  # as a run's pool process is (verifier_pool._load)
    while (repeats := requests.get()) is not None:
        for spec in specs:
            start.wait()
            results.put((spec, *witnessed_per_response(spec, texts, examples, repeats)))


class BusyScorers:
    """`busy_per_response` of several functions, taken in windows at several moments by one set of processes, a
    process per core of the host that loads the functions once (their start-up, ~1.5 s on the 2-core VM, paid once)
    and waits, idle, between windows (`window`, `repeats` batches each, each followed by the speed witness); `typical`
    is per function the median of the windows' medians. One core: this process measures."""

    def __init__(self, specs: Sequence[str], texts: Sequence[str], examples: Sequence[Any],
                 cores: Optional[int] = None, repeats: int = REPEATS):
        from rpegc.runtime.backends.torch.rl.rewards import load_reward

        for spec in specs:
            load_reward(spec)  # a bad spec is this process's one-line error, not a child's
        self.specs, self.texts, self.examples = list(specs), list(texts), list(examples)
        self.cores = host_cores() if cores is None else cores
        self.repeats = repeats
        self.windows: list[dict[str, float]] = []
        # per window and function, the median speed witness after its batches (every core's)
        self.witnesses: list[dict[str, float]] = []
        self._procs: list = []
        self._requests: list = []

    def __enter__(self) -> "BusyScorers":
        if self.cores <= 1:
            return self
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # the caller may hold torch's threads: no fork
        self._start, self._results = ctx.Barrier(self.cores), ctx.Queue()
        self._requests = [ctx.Queue() for _ in range(self.cores)]
        self._procs = [ctx.Process(target=_scorer, args=(self.specs, self.texts, self.examples, self._start, q,
                                                         self._results), daemon=True)
                       for q in self._requests]
        for proc in self._procs:
            proc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for q, proc in zip(self._requests, self._procs):
            if proc.is_alive():
                q.put(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()

    def window(self) -> dict[str, float]:
        """Per function, t_resp with every core scoring the same `repeats` batches at once: the median of the cores'
        medians. Recorded in `windows`."""
        if self.cores <= 1:
            timed = {spec: [witnessed_per_response(spec, self.texts, self.examples, self.repeats)]
                     for spec in self.specs}
        else:
            timed = self._collect()
        out = {spec: statistics.median(t for t, _ in ts) for spec, ts in timed.items()}
        self.windows.append(out)
        self.witnesses.append({spec: statistics.median(w for _, w in ts) for spec, ts in timed.items()})
        return out

    @property
    def live_pids(self) -> tuple[int, ...]:
        """The scoring processes that live now (none where this process measures)."""
        return tuple(proc.pid for proc in self._procs if proc.is_alive())

    def typical_witness(self, spec: str) -> float:
        """The median over windows of the speed witness after `spec`'s batches: the speed `typical` describes (a
        pass right after a heavy function's batch reads slower than after a light one's: runtime/speed_probe.py)."""
        return statistics.median(w[spec] for w in self.witnesses)

    def typical(self) -> dict[str, float]:
        """Per function the median of the windows' medians. Not moved by the windows' witnesses: in two calibrations
        the windows' math and their witnesses moved apart (0.85-1.12 ms with witnesses within 3 %; 0.548-0.559 ms
        with witnesses 0.267-0.339 ms; docs/calibration.md, "The speed witness")."""
        return {spec: statistics.median(w[spec] for w in self.windows) for spec in self.specs}

    def _collect(self) -> dict[str, list[tuple[float, float]]]:
        for q in self._requests:
            q.put(self.repeats)
        times: dict[str, list[tuple[float, float]]] = {spec: [] for spec in self.specs}
        while sum(map(len, times.values())) < self.cores * len(self.specs):
            try:
                spec, t, seen = self._results.get(timeout=1.0)
                times[spec].append((t, seen))
            except queue.Empty:
                # a process that ended without its times leaves the others waiting at the barrier: stop them all
                if any(proc.exitcode not in (None, 0) for proc in self._procs) or \
                        not any(proc.is_alive() for proc in self._procs):
                    failed = next(spec for spec in self.specs if len(times[spec]) < self.cores)
                    for proc in self._procs:
                        proc.kill()
                    raise RpegError(None, f"measuring the verifier '{failed}' on {self.cores} cores at once failed: "
                                          "a process ended without a time") from None
        return times


def busy_per_response(spec: str, texts: Sequence[str], examples: Sequence[Any], cores: Optional[int] = None,
                      repeats: int = REPEATS) -> float:
    """t_resp of `spec` with `cores` processes (default: every core of the host) scoring the same batches at once
    (`repeats` each), the median of theirs: what a call costs while the host is busy, as in a run."""
    with BusyScorers((spec,), texts, examples, cores, repeats) as scorers:
        return scorers.window()[spec]


def call_overhead(spec: str, t_resp: float, repeats: int = POOL_REPEATS) -> float:
    """t_call of a one-process pool of `spec`: one response's round trip through the pool, less its call."""
    from rpegc.runtime.backends.torch.controller.verifier_pool import VerifierPool

    texts, examples = samples(1)
    pool = VerifierPool(spec, 1)
    try:
        pool.score_texts(texts, examples, [0])  # starts the process (start-up, not a step's cost)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            pool.score_texts(texts, examples, [0])
            times.append(time.perf_counter() - t0)
    finally:
        pool.close()
    return max(0.0, statistics.median(times) - t_resp)


def rule_per_response(rows: int = 256, repeats: int = REPEATS) -> float:
    """t_resp of the toy tasks' token rule (tasks.py), which scores tensors: per row of a batch."""
    import torch

    from rpegc.runtime.backends.torch.rl.tasks import make_task

    task = make_task("pattern", 64, 4, 6)
    prompts = torch.randint(0, 64, (rows, 4))
    responses = torch.randint(0, 64, (rows, 6))
    mask = torch.ones(rows, 6)
    task.score(prompts, responses, mask)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        task.score(prompts, responses, mask)
        times.append((time.perf_counter() - t0) / rows)
    return statistics.median(times)


BUILT_INS = ("math", "exact_match")  # the reward functions a machine profile times ([host.verify])


def built_in_scorers(quick: bool = False) -> BusyScorers:
    """The processes that time the built-in functions over `samples()` in windows of `WINDOW_REPEATS` batches: one per
    core, or (quick) this process, in windows of `REPEATS`."""
    texts, examples = samples()
    return BusyScorers(BUILT_INS, texts, examples, 1 if quick else None, REPEATS if quick else WINDOW_REPEATS)


@dataclass(frozen=True)
class HostTable:
    """The `[host]` table's measurements beside the built-ins' windows (`BusyScorers`): rendered by `text`."""

    cores: int
    call: float  # t_call of a one-process pool
    pool_repeats: int
    checkpoint: tuple[str, ...]  # the checkpoint writes' lines (tools/checkpoint_timing.py)
    rule: float  # t_resp of the toy tasks' token rule
    quick: bool

    def text(self, scorers: BusyScorers) -> str:
        """The table, the built-ins at the median of `scorers`' windows so far, and their witnesses'."""
        typical, n = scorers.typical(), len(scorers.windows)
        batches = scorers.repeats
        how = "alone" if self.quick else "while every core scores"
        if n == 1:
            taken = f"median of {batches} batches of 64 arithmetic answers (half right)"
        else:
            medians = ", ".join(f"{w['math'] * 1e3:.3g}" for w in scorers.windows)
            taken = (f"the median of {n} windows' medians ({medians} ms) across the calibration, each of {batches} "
                     "batches of 64 arithmetic answers (half right)")
            speeds = ", ".join(f"{1e3 * s['math']:.3g}" for s in scorers.witnesses)
            taken += f"; the speed witness after the windows' batches {speeds} ms"
        return "\n".join([
            "",
            "# The host, where verifier pools run (rpegc/core/cost/host.py); measured by tools/verifier_timing.py",
            "[host]",
            f"cores = {self.cores}             # CPU cores this process may use (a worker or a pool process each)",
            f"verify_call = {self.call:.6g}    # s; one response's round trip through a one-process pool, less its "
            f"call (median of {self.pool_repeats})",
            f"verify_witness = {scorers.typical_witness('math'):.6g}    # s; the speed witness "
            "(runtime/speed_probe.py) after a batch of math, the median of the windows' medians: a run's pool "
            "processes end their shares with it, and a math pool's are held against it",
            *self.checkpoint,
            "",
            "[host.verify]",
            f"math = {typical['math']:.6g}    # s per response on one core {how}, {taken}",
            f"exact_match = {typical['exact_match']:.6g}    # s per response; the same batches and windows",
            f"rule = {self.rule:.6g}    # s per row of a 256-row batch of the toy tasks' token rule",
            "",
        ])


def measure_host(where: Path, scorers: BusyScorers, quick: bool = False) -> HostTable:
    """The host's measurements, and a window of the built-ins (`scorers`); the checkpoint writes (tools/
    checkpoint_timing.py) are timed in a scratch directory under `where`. `quick` (rpeg-calibrate --quick, the smoke
    tests' calibration): fewer repeats, a small disk probe."""
    scorers.window()
    pool_repeats = 3 if quick else POOL_REPEATS
    call = call_overhead("exact_match", scorers.typical()["exact_match"], pool_repeats)
    return HostTable(host_cores(), call, pool_repeats, tuple(checkpoint_lines(where, quick)), rule_per_response(),
                     quick)


def host_text(where: Path, quick: bool = False) -> str:
    """The `[host]` table of this machine's profile, every value with how it was measured, the built-ins in one
    window (`rpeg-calibrate --machine` takes them in several: tools/calibrate.py)."""
    with built_in_scorers(quick) as scorers:
        return measure_host(where, scorers, quick).text(scorers)


def measure_dataset(spec: str, path: str, answer_key: str = "answer", limit: int = 64) -> float:
    """t_resp of `spec` over the first `limit` ground truths of a JSON-lines dataset, taken as responses."""
    texts, examples = [], []
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if len(texts) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise RpegError(None, f"{path}:{n}: not a JSON object ({e})") from None
                if not isinstance(row, dict) or answer_key not in row:
                    raise RpegError(None, f"{path}:{n}: no '{answer_key}' field (use --answer-key)")
                answer = str(row[answer_key])
                texts.append(answer)
                examples.append(TextExample(str(row.get("data_source", "")), answer, {}))
    except OSError as e:
        raise RpegError(None, f"cannot read {path}: {e.strerror}") from None
    if not texts:
        raise RpegError(None, f"{path} holds no rows to score")
    return busy_per_response(spec, texts, examples)
