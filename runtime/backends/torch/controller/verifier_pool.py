"""A verify vertex's pool of host processes (issue 36; the cost model's side: rpegc/core/cost/host.py).

The worker of the plan's pool device runs a verify operator: it decodes the responses it received (its tokenizer is
the run's) and deals them out evenly, as `ceil(rows / P)`-row chunks, to P processes of a `ProcessPoolExecutor`,
which call the reward function (rewards.py) and send back the scores. The processes are started on the first
operator and load the function once (`initializer`), so a step pays the calls and the hand-over, which is what
`T_verify = t_call + ceil(rows / P) t_resp` prices. The toy tasks' token rule is not a function of text: it scores
tensors in the worker itself.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Optional, Sequence

from rpegc.runtime.backends.torch.rl.rewards import NOT_FUNCTIONS, Scored, load_reward, score_texts
from rpegc.runtime.speed_probe import prepare_witness, witness_seconds

# Examples go to the processes as (source, answer, extra): what a reward function is given, nothing more.
ExampleFields = tuple[str, Optional[str], dict]


class TextExample:
    """What score_texts reads of a dataset example (the pool's processes get these, and so does a calibration's sample)."""

    __slots__ = ("source", "answer", "extra")

    def __init__(self, source: str, answer: Optional[str], extra: dict):
        self.source, self.answer, self.extra = source, answer, extra


# A pool process yields to the runtime: the controller's reaction and the workers' commands are short and on every
# step's critical path, the pool's scoring is not. Measured on the 2-core demo it did not shorten the control round
# trip (2.2-2.4 ms per node with and without it); kept as the order of precedence, not as a speed-up.
POOL_NICENESS = 5


def _load(spec: str, witnessed: bool = False) -> None:
    if hasattr(os, "nice"):
        os.nice(POOL_NICENESS)
    load_reward(spec)  # once per process: its first call pays no import
    if witnessed:
        prepare_witness()  # nor its first witness torch's


def _ready() -> None:
    time.sleep(0.05)  # held a moment, so that each of the first `size` tasks needs a process of its own


def _score_chunk(spec: str, texts: Sequence[str], examples: Sequence[ExampleFields], rows: Sequence[int],
                 witnessed: bool = False) -> Scored:
    out = score_texts(load_reward(spec), texts, [TextExample(*e) for e in examples], rows)
    out.witness = [witness_seconds()] if witnessed else []  # last, as a worker's operator has it (Operators.op)
    return out


def chunks(n: int, pool: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of `n` rows for `pool` processes: ceil(n / pool) rows each, the last one shorter."""
    size = max(1, math.ceil(n / pool))
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def merge(parts: Sequence[Scored]) -> Scored:
    """One Scored of the chunks' in order: their scores and accuracies, their failures counted, the first kept."""
    out = Scored(scores=[])
    for part in parts:
        out.scores += part.scores
        out.accuracies += part.accuracies
        out.failures.count += part.failures.count
        out.witness += part.witness
        if out.failures.first is None:
            out.failures.first = part.failures.first
    return out


class VerifierPool:
    """The processes of one reward function, started on first use, shut down with the worker; with `witness`, each
    process runs the speed witness as it ends its share of a call."""

    def __init__(self, spec: str, size: int, witness: bool = False):
        self.spec, self.size, self.witness = spec, size, witness
        self._executor: Optional[ProcessPoolExecutor] = None

    @property
    def function(self) -> bool:
        return self.spec not in NOT_FUNCTIONS

    def score_texts(self, texts: Sequence[str], examples: Sequence[Any], rows: Sequence[int]) -> Scored:
        """The function's scores of `texts`, computed by the pool's processes, `ceil(len / size)` rows each."""
        if self._executor is None:
            self._executor = self._start()
        fields = [(e.source, e.answer, dict(e.extra)) for e in examples]
        futures = [self._executor.submit(_score_chunk, self.spec, texts[lo:hi], fields[lo:hi], rows[lo:hi],
                                         self.witness)
                   for lo, hi in chunks(len(texts), self.size)]
        return merge([f.result() for f in futures])

    def _start(self) -> ProcessPoolExecutor:
        """All `size` processes, started and their function loaded before the first operator is timed."""
        # spawn: a worker runs torch's threads and a process group, which a fork would copy half-alive
        executor = ProcessPoolExecutor(self.size, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_load, initargs=(self.spec, self.witness))
        me = multiprocessing.current_process()
        daemon = me._config.get("daemon")
        # A worker is a daemonic process (it dies with rpeg-run), which multiprocessing forbids to have children.
        # Its pool's processes end with it: they wait on its pipes, which close when it exits.
        me._config["daemon"] = False
        try:
            ready = [executor.submit(_ready) for _ in range(self.size)]  # one each: every process starts now
            for f in ready:
                f.result()
        finally:
            me._config["daemon"] = daemon
        return executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
