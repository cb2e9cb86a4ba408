"""A hostile-input campaign over every reader of rpegc and rpeg-run.

Seeded mutants of the shipped `.rpeg` examples go through the whole lowering pipeline; mutated JSON plans
through `rpegc` and the simulated `rpeg-run`; mutated traces through `rpeg-run verify`; mutated hardware
profiles through `annotate-cost`; hostile pass options and run options through both drivers. Every case
runs in a directory of its own and must end in one of two ways:
- success (exit 0): every output is free of NaN, infinities and negative numbers;
- a user error (exit 1, or a failed verification): stderr starts with a located `...: error: ...` line, and
  nothing was written: the directory holds exactly the inputs, byte for byte.
Never: exit 2 ("internal error"), a traceback, a run longer than HANG_SECONDS, a changed input file.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from fixtures.hostile import HOSTILE_VALUES, call_guarded, mutants
from rpegc.cli import main as rpegc_main
from rpegc.runtime.cli import main as run_main

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261201
HANG_SECONDS = 10
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
SMALL_EXAMPLES = ("grpo-tiny", "ppo-tiny", "ppo-8gpu", "ppo-async", "dpo", "grpo")
PLAN_EXAMPLES = ("grpo-tiny", "ppo-tiny")
LOCATED = re.compile(r"^\S.*?: error: \S")
NEGATIVE_NUMBER = re.compile(r"(?<![\w.])-\d")
NON_FINITE = re.compile(r"\b(nan|inf|infinity)\b", re.I)


@dataclass(frozen=True)
class Case:
    what: str
    files: dict[str, bytes]            # written into the case's directory before the run
    argv: Callable[[Path], list[str]]  # the command line, given the case's directory
    main: Callable[[list[str]], int]
    failed_verification_ok: bool = False


def output_problems(path: Path) -> list[str]:
    """NaN, infinities and negative numbers in an output file (JSON, JSON lines or .rpeg text)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".json", ".jsonl"):
        docs = [text] if path.suffix == ".json" else [line for line in text.splitlines() if line.strip()]
        problems: list[str] = []
        for doc in docs:
            try:
                value = json.loads(doc, parse_constant=lambda c: float("nan"))
            except json.JSONDecodeError as err:
                return [f"{path.name}: not strict JSON ({err.msg})"]
            problems += [f"{path.name}: {p}" for p in _bad_numbers(value, "$")]
        return problems
    out = [f"{path.name}: {m.group()!r}" for m in NON_FINITE.finditer(text)]
    return out + [f"{path.name}: negative number at offset {m.start()}" for m in NEGATIVE_NUMBER.finditer(text)]


def _bad_numbers(value: object, where: str) -> list[str]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return [f"{where} = {value}"]
        return [f"{where} = {value}"] if value < 0 else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _bad_numbers(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _bad_numbers(v, f"{where}[{i}]")]
    return []


def run_case(case: Case, directory: Path, capsys) -> tuple[object, list[str]]:
    """The case's exit code and its violations of the module docstring's rules (none: it behaved)."""
    directory.mkdir()
    for name, data in case.files.items():
        (directory / name).write_bytes(data)
    code = call_guarded(_usage_errors_exit_1(case.main), case.argv(directory), HANG_SECONDS)
    err = capsys.readouterr().err
    problems = []
    if code == "hang":
        problems.append(f"ran longer than {HANG_SECONDS} s")
    elif code not in (0, 1):
        problems.append(f"exit {code}")
    if "Traceback" in err or "internal error" in err:
        problems.append("traceback or internal error")
    for name, data in case.files.items():
        if (directory / name).read_bytes() != data:
            problems.append(f"input {name} was changed")
    produced = sorted(p.name for p in directory.iterdir() if p.name not in case.files)
    if code == 0:
        for name in produced:
            problems += output_problems(directory / name)
    elif code == 1:
        lines = err.splitlines()
        if lines and lines[0].startswith("usage:"):  # argparse: the usage, then `prog: error: ...`
            lines = [line for line in lines if ": error: " in line]
        first = lines[0] if lines else ""
        if not LOCATED.match(first) and not (case.failed_verification_ok and not err.strip()):
            problems.append(f"unlocated error {first[:200]!r}")
        if produced:
            problems.append(f"a failing run left {produced}")
    return code, [f"{case.what}: {p} (stderr: {err[:300]!r})" for p in problems]


def run_campaign(cases: list[Case], tmp_path: Path, capsys) -> dict[object, int]:
    """Runs every case; fails listing the first problems; returns how many cases ended with each exit code."""
    failures: list[str] = []
    outcomes: dict[object, int] = {}
    for i, case in enumerate(cases):
        code, problems = run_case(case, tmp_path / f"c{i}", capsys)
        outcomes[code] = outcomes.get(code, 0) + 1
        failures += problems
    assert not failures, f"{len(failures)} problem(s) in {len(cases)} cases:\n" + "\n".join(failures[:12])
    return outcomes


def _usage_errors_exit_1(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """argparse exits with 2 on a malformed option: a usage error like any other (its message names it)."""
    def call(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as e:
            return 1 if e.code == 2 else int(e.code or 0)
    return call


# -- inputs --------------------------------------------------------------------------------------------------

def _example(name: str) -> bytes:
    return (ROOT / "examples" / f"{name}.rpeg").read_bytes()


@pytest.fixture(scope="module")
def lowered(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Per plan example: its lowered JSON plan and the simulated run's trace."""
    out = {}
    for name in PLAN_EXAMPLES:
        d = tmp_path_factory.mktemp(name)
        (d / "in.rpeg").write_bytes(_example(name))
        assert rpegc_main([str(d / "in.rpeg"), "-p", LOWER, "--emit=json", "-o", str(d / "plan.json")]) == 0
        assert run_main([str(d / "plan.json"), "--trace", str(d / "t.jsonl"), "--quiet"]) == 0
        out[name] = {"plan.json": (d / "plan.json").read_bytes(), "t.jsonl": (d / "t.jsonl").read_bytes()}
    return out


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [prefix] + [p for k, v in value.items() for p in _paths(v, prefix + (k,))]
    if isinstance(value, list):
        return [prefix] + [p for i, v in enumerate(value) for p in _paths(v, prefix + (i,))]
    return [prefix]


def mutate_json(rng: random.Random, doc: object) -> tuple[str, object]:
    """One structural mutation: a value replaced by a hostile one, a key deleted, or a list item duplicated."""
    path = rng.choice([p for p in _paths(doc) if p])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    last = path[-1]
    how = rng.random()
    if how < 0.7:
        value = rng.choice(HOSTILE_VALUES)
        parent[last] = value  # type: ignore[index]
        return f"{'.'.join(map(str, path))} = {value!r}", doc
    if how < 0.85 or not isinstance(parent, list):
        del parent[last]  # type: ignore[arg-type]
        return f"del {'.'.join(map(str, path))}", doc
    parent.insert(last, parent[last])  # type: ignore[union-attr]
    return f"dup {'.'.join(map(str, path))}", doc


def json_mutants(rng: random.Random, data: bytes, count: int) -> list[tuple[str, bytes]]:
    """Structural mutants, byte-level mutants, and deep nesting."""
    out = []
    for i in range(count):
        if i % 4 == 3:
            out += [(f"bytes {what}", m) for what, m in mutants(1, rng.randrange(2**31), [("json", data)])]
            continue
        what, doc = mutate_json(rng, json.loads(data))
        out.append((what, json.dumps(doc).encode()))
    out.append(("nested lists", b"[" * 100_000))
    out.append(("nested objects", b'{"a":' * 100_000))
    return out


def trace_mutants(rng: random.Random, data: bytes, count: int) -> list[tuple[str, bytes]]:
    lines = data.decode().splitlines()
    out = []
    for _ in range(count):
        i = rng.randrange(len(lines))
        what, record = mutate_json(rng, json.loads(lines[i]))
        out.append((f"line {i + 1}: {what}", "\n".join(lines[:i] + [json.dumps(record)] + lines[i + 1:]).encode()))
    out.append(("nested", b"[" * 100_000 + b"\n"))
    return out


# -- campaigns -------------------------------------------------------------------------------------------------

def test_output_check_finds_what_it_must(tmp_path):
    cases = {"a.json": '{"x": [1, {"y": -2}]}', "b.json": '{"t": NaN}', "c.rpeg": "exec.comm bytes = -1024",
             "d.jsonl": '{"a": 1}\n{"finish": Infinity}', "e.rpeg": "time = nan"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert output_problems(tmp_path / name), name
    (tmp_path / "ok.rpeg").write_text("rpeg.vertex @ref_inf inference @ref reads(%W) writes(%Y) // x - 1\n")
    assert output_problems(tmp_path / "ok.rpeg") == []


def test_clean_inputs_behave(lowered, tmp_path, capsys):
    cases = [Case(f"{name} lowered", {"in.rpeg": _example(name)},
                  lambda d: [str(d / "in.rpeg"), "-p", LOWER, "-o", str(d / "out.rpeg")], rpegc_main)
             for name in SMALL_EXAMPLES]
    cases += [Case(f"{name} plan run", {"plan.json": files["plan.json"]},
                   lambda d: [str(d / "plan.json"), "--trace", str(d / "t.jsonl"), "--quiet"], run_main)
              for name, files in lowered.items()]
    run_campaign(cases, tmp_path, capsys)


# Edits aimed at known weak spots: sizes that divide by zero or go negative, huge numbers, a byte-order mark.
TARGETED = ((b"rewards[B*R]", b"rewards[B/(R-R)]"), (b"rewards[B*R]", b"rewards[B/0]"),
            (b"rewards[B*R]", b"rewards[Lp-Lr]"), (b"rewards[B*R]", b"rewards[0]"),
            (b"rewards[B*R]", b"rewards[B*R*99999999999999999999]"), (b"tokens[B, Lp]", b"tokens[B, Lp/3]"),
            (b"B = 16", b"B = 0"), (b"B = 16", b"B = 99999999999999999999"), (b"Lr = 6", b"Lr = -6"),
            (b"rpeg.workload", b"\xef\xbb\xbfrpeg.workload"), (b"gpus = 4", b"gpus = 4000000000"))


def targeted_mutants() -> list[tuple[str, bytes]]:
    source = _example("grpo-tiny")
    out = []
    for old, new in TARGETED:
        assert old in source, old
        out.append((f"{old.decode()} -> {new.decode(errors='replace')}", source.replace(old, new, 1)))
    return out


def test_mutated_programs_through_the_whole_pipeline(tmp_path, capsys):
    sources = [(name, _example(name)) for name in SMALL_EXAMPLES]
    cases = [Case(what, {"in.rpeg": data}, lambda d: [str(d / "in.rpeg"), "-p", LOWER, "-o", str(d / "out.rpeg")],
                  rpegc_main)
             for what, data in mutants(120, SEED, sources) + targeted_mutants()]
    outcomes = run_campaign(cases, tmp_path, capsys)
    assert outcomes.get(0, 0) >= 5 and outcomes.get(1, 0) >= 40, outcomes  # both ways exercised


def test_mutated_json_plans_in_rpegc_and_rpeg_run(lowered, tmp_path, capsys):
    rng = random.Random(SEED + 1)
    cases = []
    for name, files in lowered.items():
        for what, data in json_mutants(rng, files["plan.json"], 50):
            cases.append(Case(f"rpegc {name} {what}", {"plan.json": data},
                              lambda d: [str(d / "plan.json"), "--emit=json", "-o", str(d / "out.json")], rpegc_main))
            cases.append(Case(f"rpeg-run {name} {what}", {"plan.json": data},
                              lambda d: [str(d / "plan.json"), "--trace", str(d / "t.jsonl"), "--quiet"], run_main,
                              failed_verification_ok=True))
    outcomes = run_campaign(cases, tmp_path, capsys)
    assert outcomes.get(0, 0) >= 5 and outcomes.get(1, 0) >= 50, outcomes


def test_mutated_traces_in_rpeg_run_verify(lowered, tmp_path, capsys):
    rng = random.Random(SEED + 2)
    cases = []
    for name, files in lowered.items():
        for what, data in trace_mutants(rng, files["t.jsonl"], 30):
            cases.append(Case(f"verify {name} {what}", {"plan.json": files["plan.json"], "t.jsonl": data},
                              lambda d: ["verify", str(d / "plan.json"), str(d / "t.jsonl")], run_main,
                              failed_verification_ok=True))
    outcomes = run_campaign(cases, tmp_path, capsys)
    assert outcomes.get(1, 0) >= 30, outcomes


def test_mutated_hardware_profiles_in_annotate_cost(tmp_path, capsys):
    profile = (ROOT / "rpegc" / "hardware" / "cpu-reference.toml").read_bytes()
    program = _example("grpo-tiny").replace(b'hardware = "cpu"', b'hardware = "hw.toml"')  # beside the program
    rng = random.Random(SEED + 3)
    numbers = list(re.finditer(rb"(?<== )[0-9][0-9.e+-]*", profile))
    variants = [(what, data) for what, data in mutants(30, SEED + 3, [("cpu-reference.toml", profile)])]
    for _ in range(30):
        m = rng.choice(numbers)
        value = rng.choice((b"0", b"-1", b"1e300", b"nan", b"inf", b'"x"', b"1e-300", b"true"))
        variants.append((f"{m.group().decode()} -> {value.decode()}", profile[:m.start()] + value + profile[m.end():]))
    cases = [Case(f"profile {what}", {"hw.toml": data, "in.rpeg": program},
                  lambda d: [str(d / "in.rpeg"), "-p", LOWER, "-o", str(d / "out.rpeg")], rpegc_main)
             for what, data in variants]
    outcomes = run_campaign(cases, tmp_path, capsys)
    assert outcomes.get(1, 0) >= 20, outcomes


PIPELINES = ("unroll{k=10000}", "unroll{k=-1}", "unroll{k=0}", "unroll{k=1.5}", "unroll{k=abc}", "unroll{k=1000000000}",
             "unroll{k=2 k=3}", "unroll{k=2},", "", ",", "unroll{", "unroll{k=2}}", "nosuch-pass",
             "schedule", "annotate-cost", "unroll{k=2},share-actor-critic", "annotate-cost{hardware=nosuch}",
             "annotate-cost{hardware=/some/dir}", "optimize{evals=-5}", "optimize{budget=-1}",
             "optimize{taus=9 budget=2}", "optimize{jobs=-1}", "split-quantiles{enable=maybe}", "unroll{k=2},unroll{k=2}")
RUN_OPTIONS = (["--jitter", "800", "--jitter-dist", "lognormal"], ["--jitter", "nan"], ["--jitter", "-1"],
               ["--steps", "-1"], ["--steps", "0"], ["--steps", "100000"], ["--seed", "x"],
               ["--policy", "nosuch"], ["--backend", "nosuch"], ["--checkpoint-every", "0"])


def test_hostile_pass_and_run_options(lowered, tmp_path, capsys):
    cases = [Case(f"-p {spec!r}", {"in.rpeg": _example("grpo-tiny")},
                  lambda d, spec=spec: [str(d / "in.rpeg"), "-p", spec, "-o", str(d / "out.rpeg")], rpegc_main)
             for spec in PIPELINES]
    cases += [Case(f"rpeg-run {' '.join(opts)}", {"plan.json": lowered["grpo-tiny"]["plan.json"]},
                   lambda d, opts=opts: [str(d / "plan.json"), "--trace", str(d / "t.jsonl"), "--quiet", *opts],
                   run_main)
              for opts in RUN_OPTIONS]
    huge = _example("grpo-tiny").replace(b"nodes = 1,", b"nodes = 20000,")
    cases.append(Case("optimize on 20,000 nodes", {"in.rpeg": huge},
                      lambda d: [str(d / "in.rpeg"), "-p", "verify-wellformed,optimize{evals=50}", "-o",
                                 str(d / "out.rpeg")], rpegc_main))
    outcomes = run_campaign(cases, tmp_path, capsys)
    assert outcomes.get(1, 0) >= len(cases) - 4, outcomes  # nearly every one of them is an error

