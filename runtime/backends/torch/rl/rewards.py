"""Reward functions: verl-style plugins over response text (issue 15, item 5).

Paper Sec. II: the reward stage scores each response; for reasoning tasks it is a program that checks the
answer. `--reward SPEC` names one:

- a built-in: `exact_match` (the response, stripped, equals the ground truth) or `math` (the final answer,
  GSM8K's `#### 42` or LaTeX's `\\boxed{42}`, is mathematically equal to the ground truth's, checked by
  `math-verify`);
- `module:function` (an importable module) or `path/to/file.py:function`;
- the name of an entry point in the group `rpegc.rewards` (an installed package's plugin).

A function has verl's signature, `compute_score(data_source, solution_str, ground_truth, extra_info)`, and
may take more keyword arguments (it is called with these four by name). It returns a number, or a dict with
`score` (and optionally `acc`, which becomes the accuracy metric). A call that raises or returns anything
but a number inside float32's range (a string is not one) scores 0; the run goes on, and the failures are
counted and reported with the first one (`RewardFailures`). `rule` (the toy tasks' token rule,
runtime/backends/torch/rl/tasks.py) and `model` (a frozen reward model) are not functions of text and are handled
by the backend.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import math
import os
import re
import reprlib
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from rpegc.core.cost.host import IN_WORKER
from rpegc.core.ir.errors import RpegError

ENTRY_POINT_GROUP = "rpegc.rewards"
NOT_FUNCTIONS = (*IN_WORKER, "model")  # reward sources the backend handles itself
ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
MATH_TIMEOUT_S = 5  # per parse and per comparison, as math-verify's own default
LOAD_TIMEOUT_S = 120  # for importing a reward function's module in the probe (probe_reward)

RewardFn = Callable[..., Any]


def exact_match(data_source: str, solution_str: str, ground_truth: Optional[str], extra_info: Optional[dict] = None,
                **_: Any) -> float:
    """1 if the response, stripped of surrounding white space, is the ground truth, else 0."""
    if ground_truth is None:
        raise ValueError("exact_match needs a ground truth (data.answer_key)")
    return float(solution_str.strip() == str(ground_truth).strip())


_GSM8K = re.compile(r"####\s*(.+)")


def _final_answer(text: str) -> str:
    """GSM8K's `#### answer` if present (the rest of that line), else the text as it is."""
    m = _GSM8K.search(text)
    return m.group(1).strip().replace(",", "") if m else text


def math_answer(data_source: str, solution_str: str, ground_truth: Optional[str], extra_info: Optional[dict] = None,
                **_: Any) -> dict:
    """1 if the response's final answer equals the ground truth's mathematically (`math-verify`: numbers,
    fractions, LaTeX expressions, `\\boxed{}`), else 0; GSM8K's `#### 42` marks a final answer on both sides."""
    if ground_truth is None:
        raise ValueError("the math verifier needs a ground truth (data.answer_key)")
    try:
        from math_verify import parse, verify
    except ImportError:
        raise RpegError(None, "--reward math needs math-verify (pip install math-verify)") from None
    # math-verify bounds its sympy work with SIGALRM, which only the main thread may set; elsewhere unbounded
    # (its warning about that is silenced: a bounded response length keeps the inputs small)
    limit = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    quiet = logging.getLogger("math_verify")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        gold = parse(_final_answer(str(ground_truth)), parsing_timeout=limit)
        answer = parse(_final_answer(solution_str), parsing_timeout=limit)
        score = float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=limit))
    finally:
        quiet.setLevel(level)
    return {"score": score, "acc": score}


BUILTINS: dict[str, RewardFn] = {"exact_match": exact_match, "math": math_answer}


def _from_file(path: str, name: str, spec: str) -> RewardFn:
    if not os.path.isfile(path):
        raise RpegError(None, f"--reward {spec}: {path} is not a file")
    module_name = "rpegc_reward_" + re.sub(r"\W", "_", os.path.abspath(path))
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise RpegError(None, f"--reward {spec}: {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module
    try:
        loader.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # the user's module failed to import: say where, not a traceback
        del sys.modules[module_name]
        raise RpegError(None, f"--reward {spec}: importing {path} failed: {_why(e)}") from None
    return _attribute(module, name, spec)


def _from_module(module_name: str, name: str, spec: str) -> RewardFn:
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:
        raise RpegError(None, f"--reward {spec}: importing {module_name} failed: {_why(e)}") from None
    return _attribute(module, name, spec)


def _why(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    return f"{type(e).__name__}: {e}"


def _attribute(module: Any, name: str, spec: str) -> RewardFn:
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RpegError(None, f"--reward {spec}: {module.__name__} has no function '{name}'")
    return fn


def _entry_point(name: str) -> Optional[RewardFn]:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except (Exception, SystemExit) as e:
                raise RpegError(None, f"--reward {name}: loading entry point {ep.value} failed: {_why(e)}") from None
    return None


@functools.cache
def load_reward(spec: str) -> RewardFn:
    """The reward function `spec` names (see the module docstring), its signature checked; loaded once per
    process (every run_config of a run checks it, and a file's module would run again each time)."""
    if spec in NOT_FUNCTIONS:
        raise RpegError(None, f"--reward {spec} is not a function of the response text")
    if spec in BUILTINS:
        return BUILTINS[spec]
    target, sep, name = spec.rpartition(":")
    if sep and target and name:
        fn = _from_file(target, name, spec) if target.endswith(".py") else _from_module(target, name, spec)
    else:
        fn = _entry_point(spec)
        if fn is None:
            raise RpegError(None, f"unknown reward '{spec}'; use rule, model, {', '.join(BUILTINS)}, module:function, "
                            f"file.py:function or an entry point of the group {ENTRY_POINT_GROUP}")
    check_signature(fn, spec)
    return fn


@functools.lru_cache(maxsize=None)
def probe_reward(spec: str) -> None:
    """Load the reward function `spec` once in a child process before this one imports it: a module that never
    finishes importing, or ends its process (os._exit) on import, would otherwise hang the run or end rpeg-run
    without a word. Its other failures are left to `load_reward` here, which says what they are."""
    if spec in NOT_FUNCTIONS or spec in BUILTINS:
        return
    code = ("import sys; from rpegc.core.ir.errors import RpegError; "
            "from rpegc.runtime.backends.torch.rl.rewards import load_reward\n"
            "try:\n    load_reward(sys.argv[1])\nexcept RpegError:\n    pass")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # what this process imports from
    try:
        out = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, env=env,
                             timeout=LOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RpegError(None, f"--reward {spec}: loading it did not finish within {LOAD_TIMEOUT_S} s (does its "
                              "module wait for something when it is imported?)") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [""])[-1]
        raise RpegError(None, f"--reward {spec}: loading it ended the process with exit status {out.returncode}"
                              + (f" ({last})" if last else ""))


def check_signature(fn: RewardFn, spec: str) -> None:
    """A reward function must accept verl's four arguments by name."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: its call will tell
    params = sig.parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [a for a in ARGS if a not in names]
    if missing:
        raise RpegError(None, f"--reward {spec}: the function must take ({', '.join(ARGS)}) as verl's "
                        f"compute_score does; it lacks {', '.join(missing)}")


@dataclass
class RewardFailures:
    """Calls that raised or gave a non-finite score: how many, and the first one (its row and why)."""

    count: int = 0
    first: Optional[str] = None

    def add(self, row: int, why: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = f"sequence {row}: {why}"


@dataclass
class Scored:
    """Scores of a batch of responses, and accuracies where the function gives them (`acc`)."""

    scores: list[float]
    accuracies: list[Optional[float]] = field(default_factory=list)
    failures: RewardFailures = field(default_factory=RewardFailures)
    witness: list[float] = field(default_factory=list)  # s of each speed witness a pool's processes ran for them


FLOAT32_MAX = 3.4028234663852886e38  # scores are float32 tensors from here on


def _score(x: Any) -> tuple[Optional[float], str]:
    """`x` as a score, or None and why not: a number (bool, int, float, numpy or torch scalar; not a string, whatever
    it spells) inside float32's range."""
    if isinstance(x, (str, bytes, bytearray)):
        return None, f"returned {reprlib.repr(x)}, not a number"
    try:
        v = float(x)
    except OverflowError:  # an int beyond any float
        return None, f"returned {reprlib.repr(x)}, beyond float32's range"
    except (TypeError, ValueError):
        return None, f"returned {reprlib.repr(x)}, not a number"
    if not math.isfinite(v):
        return None, f"returned {reprlib.repr(x)}, not a finite number"
    if abs(v) > FLOAT32_MAX:
        return None, f"returned {reprlib.repr(x)}, beyond float32's range"
    return v, ""


def score_texts(fn: RewardFn, texts: Sequence[str], examples: Sequence[Any], rows: Sequence[int]) -> Scored:
    """`fn` on each response text with its example's source, ground truth and extra info."""
    out = Scored(scores=[])
    for text, ex, row in zip(texts, examples, rows):
        try:
            result = fn(data_source=ex.source, solution_str=text, ground_truth=ex.answer, extra_info=dict(ex.extra))
        except Exception as e:  # a user function's bug must not stop a training run: counted, reported
            out.failures.add(row, f"raised {type(e).__name__}: {e}")
            out.scores.append(0.0)
            out.accuracies.append(None)
            continue
        acc = None
        if isinstance(result, dict):
            acc = _score(result.get("acc"))[0] if "acc" in result else None
            result = result.get("score")
        score, why = _score(result)
        if score is None:
            out.failures.add(row, why)
            score = 0.0
        out.scores.append(score)
        out.accuracies.append(acc)
    return out


def score_responses(source: Any, fn: Optional[RewardFn], batch: Any, sequences: Any, mask: Any,
                    rows: Sequence[int], rollouts: int) -> tuple[Any, Optional[Scored]]:
    """The verifier's score [b] of each of `rows` (global sequence indices; sequence g answers prompt
    g // rollouts of the step's `batch`): the toy task's token rule when `fn` is None, else `fn` on each
    response's text (`source` is the dataset that decodes it). The Scored detail only for a function."""
    if fn is None:
        lp = source.prompt_len
        return source.score(sequences[:, :lp], sequences[:, lp:], mask), None
    return score_rows(lambda texts, examples, rows: score_texts(fn, texts, examples, rows), source, batch,
                      sequences, mask, rows, rollouts)


def score_rows(score: Callable[[list[str], list[Any], list[int]], Scored], source: Any, batch: Any, sequences: Any,
               mask: Any, rows: Sequence[int], rollouts: int) -> tuple[Any, Scored]:
    """`score` (a reward function's calls, here or in a pool of processes) of each row's response text."""
    import torch

    lengths = mask.sum(-1).long().tolist()
    texts = [source.response_text(r[:n]) for r, n in zip(sequences[:, source.prompt_len:].tolist(), lengths)]
    scored = score(texts, [batch.examples[g // rollouts] for g in rows], list(rows))
    return torch.tensor(scored.scores, dtype=torch.float32, device=sequences.device), scored


def reward_stats(scored: Scored) -> dict:
    """What a reward vertex reports of its function's calls: accuracy sums, failures and the first one."""
    acc_sum, acc_n = accuracy_sums(scored)
    return {"acc_sum": acc_sum, "acc_n": acc_n, "failures": scored.failures.count,
            "first_failure": scored.failures.first}


def accuracy_sums(scored: Optional[Scored]) -> tuple[float, int]:
    """(sum, count) of the accuracies a function gave (0, 0 if it gives none)."""
    accs = [a for a in (scored.accuracies if scored else ()) if a is not None]
    return float(sum(accs)), len(accs)
