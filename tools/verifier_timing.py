"""How long a verifier takes on this machine's host (the `[host]` table of a CPU profile; core/cost/host.py).

- `per_response(spec, texts, examples)`: t_resp, the seconds one call of the reward function takes on one core:
  the median over repeats of a whole batch's time divided by its size, after a warm-up call (the first call of
  `math` imports sympy). `busy_per_response` takes it with every core of the host scoring at once, as a run keeps
  them busy (a pool's processes beside each other and beside the workers; the devices are calibrated the same way):
  on the 2-core VM a call took 0.67-0.89 ms alone and 1.1-1.3 ms inside runs whose other core was busy.
- `call_overhead(spec)`: t_call, what one verify operator costs beyond its calls: handing one response to a pool
  process and collecting its score (runtime/backends/torch/controller/verifier_pool.py), the median over repeats, less
  one call's t_resp.
- `host_text(where)`: the `[host]` table `rpeg-calibrate --machine` writes: the host's cores, t_call, t_resp of the
  built-in functions over `SAMPLES`, responses shaped as the arithmetic demo's (GSM8K's `#### n` answers), and the
  checkpoint writes' terms (tools/checkpoint_timing.py, timed under `where`).
- `rpeg-calibrate --verifier SPEC --data FILE` measures a user's function over a dataset's ground truths taken as
  responses (`measure_dataset`): what a verifier costs on answers of the right form, before any training.
"""

from __future__ import annotations

import json
import queue
import statistics
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.report import host_cores
from rpegc.tools.checkpoint_timing import checkpoint_lines
from rpegc.runtime.backends.torch.controller.verifier_pool import TextExample

REPEATS = 5
# The built-ins of a machine profile take 25 batches (~1.7 s of math on each core): this VM's speed moves within
# tenths of a second, and 5 batches of math (0.2 s) measured 0.58-1.11 ms a response where 25 measured 0.63-0.75 and
# the demo's runs, over 59 steps, 0.68-0.74 (docs/calibration.md, "Siblings priced").
BUILT_IN_REPEATS = 25
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
    from rpegc.runtime.backends.torch.rl.rewards import load_reward, score_texts

    fn = load_reward(spec)
    rows = list(range(len(texts)))
    score_texts(fn, texts[:1], examples[:1], rows[:1])  # warm-up: imports, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        score_texts(fn, texts, examples, rows)
        times.append((time.perf_counter() - t0) / len(texts))
    return statistics.median(times)


def _busy_measure(specs: Sequence[str], texts: Sequence[str], examples: Sequence[Any], start: Any, results: Any,
                  repeats: int) -> None:
    """One core's share of `busy_per_response`: per function, warm up, wait for the others, measure."""
    for spec in specs:
        per_response(spec, texts[:1], examples[:1], repeats=1)
        start.wait()
        results.put((spec, per_response(spec, texts, examples, repeats)))


def busy_per_response(spec: str, texts: Sequence[str], examples: Sequence[Any], cores: Optional[int] = None,
                      repeats: int = REPEATS) -> float:
    """t_resp of `spec` with `cores` processes (default: every core of the host) scoring the same batches at once
    (`repeats` each), the median of theirs: what a call costs while the host is busy, as in a run."""
    return busy_per_responses((spec,), texts, examples, cores, repeats)[spec]


def busy_per_responses(specs: Sequence[str], texts: Sequence[str], examples: Sequence[Any],
                       cores: Optional[int] = None, repeats: int = REPEATS) -> dict[str, float]:
    """`busy_per_response` of each of `specs`, one after another in the same processes (their start-up, ~1.5 s on
    the 2-core VM, paid once)."""
    import multiprocessing as mp

    from rpegc.runtime.backends.torch.rl.rewards import load_reward

    for spec in specs:
        load_reward(spec)  # a bad spec is this process's one-line error, not a child's
    cores = host_cores() if cores is None else cores
    if cores <= 1:
        return {spec: per_response(spec, texts, examples, repeats) for spec in specs}
    ctx = mp.get_context("spawn")  # the caller may hold torch's threads: no fork
    start, results = ctx.Barrier(cores), ctx.Queue()
    procs = [ctx.Process(target=_busy_measure, args=(list(specs), list(texts), list(examples), start, results,
                                                     repeats), daemon=True)
             for _ in range(cores)]
    for proc in procs:
        proc.start()
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    try:
        while sum(map(len, times.values())) < cores * len(specs):
            try:
                spec, t = results.get(timeout=1.0)
                times[spec].append(t)
            except queue.Empty:
                # a process that ended without its times leaves the others waiting at the barrier: stop them all
                if any(proc.exitcode not in (None, 0) for proc in procs) or not any(proc.is_alive() for proc in procs):
                    failed = next(spec for spec in specs if len(times[spec]) < cores)
                    for proc in procs:
                        proc.kill()
                    raise RpegError(None, f"measuring the verifier '{failed}' on {cores} cores at once failed: a "
                                          "process ended without a time") from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return {spec: statistics.median(ts) for spec, ts in times.items()}


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


def host_text(where: Path, quick: bool = False) -> str:
    """The `[host]` table of this machine's profile, every value with how it was measured; the checkpoint writes
    (tools/checkpoint_timing.py) are timed in a scratch directory under `where`. `quick` (rpeg-calibrate --quick, the
    smoke tests' calibration): the reward functions on this process's core alone, fewer repeats, a small disk probe."""
    texts, examples = samples()
    cores, repeats = (1, REPEATS) if quick else (None, BUILT_IN_REPEATS)
    busy = busy_per_responses(("math", "exact_match"), texts, examples, cores, repeats)
    math_s, exact_s = busy["math"], busy["exact_match"]
    rule_s = rule_per_response()
    pool_repeats = 3 if quick else POOL_REPEATS
    call = call_overhead("exact_match", exact_s, pool_repeats)
    return "\n".join([
        "",
        "# The host, where verifier pools run (rpegc/core/cost/host.py); measured by tools/verifier_timing.py",
        "[host]",
        f"cores = {host_cores()}                   # CPU cores this process may use (a worker or a pool process each)",
        f"verify_call = {call:.6g}    # s; one response's round trip through a one-process pool, less its call "
        f"(median of {pool_repeats})",
        *checkpoint_lines(where, quick),
        "",
        "[host.verify]",
        f"math = {math_s:.6g}    # s per response on one core {'alone' if quick else 'while every core scores'}, "
        f"median of {repeats} batches of 64 arithmetic answers (half right)",
        f"exact_match = {exact_s:.6g}    # s per response; the same batches",
        f"rule = {rule_s:.6g}    # s per row of a 256-row batch of the toy tasks' token rule",
        "",
    ])


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
