"""A hostile-input campaign over what a real run reads and writes (issue 33): Hugging Face directories, datasets,
reward functions, RL settings, run directories, exports and the secret file, as tests/test_hostile_inputs.py is
for the compiler. Every case runs `rpegc` or `rpeg-run` in this process in a directory of its own and must end as
a user error: exit 1, one located `...: error: ...` line on stderr, no traceback, within HANG_SECONDS, and every
file that was there before is there after, byte for byte. Most cases are refused before any worker starts; damaged
weights by the workers that read them, which the run then stops.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fixtures.hostile import call_guarded  # noqa: E402
from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.tools import arith  # noqa: E402
from rpegc.runtime.cli import main as run_main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HANG_SECONDS = 60
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
WORKLOAD = "rpeg.workload {B = 8, R = 2, Lp = 16, Lr = 4, dtype = fp32}"
LOCATED = re.compile(r"^\S.*?: error: \S")
GOOD_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n"


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Path], list[str]]  # makes its files in the case directory; returns the command's argv
    tool: str = "run"  # run: rpeg-run; rpegc: the compiler
    message: str = ""  # what the error line must hold
    absent: str = ""  # what it must not hold (e.g. "worker": refused before any worker starts)


def _plan(d: Path, hf: str = "ckpt") -> str:
    """The GRPO example on 2 CPU workers with the test checkpoint as actor and reference, compiled."""
    text = (ROOT / "examples" / "grpo-tiny-2.rpeg").read_text()
    text = re.sub(r"^rpeg\.workload .*$", WORKLOAD, text, count=1, flags=re.M)
    text = re.sub(r'arch = "tiny", kind = (policy|reference)', rf'hf = "{d / hf}", kind = \1', text)
    (d / "g.rpeg").write_text(text)
    assert rpegc_main([str(d / "g.rpeg"), "-p", LOWER, "-o", str(d / "g.exec.rpeg")]) == 0
    return str(d / "g.exec.rpeg")


def _run(d: Path, *extra: str, data: str = "train.jsonl", reward: str = "exact_match") -> list[str]:
    return [_plan(d), "--backend", "torch", "--data", str(d / data), "--reward", reward, *extra]


def _config(d: Path, **changes) -> list[str]:
    """rpegc on the GRPO program whose checkpoint's config.json has `changes` (rpegc reads the config)."""
    _plan(d)
    config = json.loads((d / "ckpt" / "config.json").read_text())
    config.update(changes)
    (d / "ckpt" / "config.json").write_text(json.dumps(config))
    return [str(d / "g.rpeg"), "-p", LOWER, "-o", str(d / "out.rpeg")]


def _run_with_config(d: Path, **changes) -> list[str]:
    """rpeg-run on the compiled GRPO plan whose checkpoint's config.json then gets `changes` (what only the
    run reads, such as the RoPE scaling that transformers interprets)."""
    argv = _run(d)
    _config(d, **changes)
    return argv


def _weights(d: Path, damage: Callable[[bytes], bytes]) -> list[str]:
    path = d / "ckpt" / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    return _run(d)


def _rows(d: Path, content: str | bytes) -> list[str]:
    path = d / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return _run(d, data="bad.jsonl")


def _file(d: Path, name: str) -> str:
    (d / name).write_text("mine\n")
    return str(d / name)


def _reward(d: Path, body: str, name: str = "compute_score") -> list[str]:
    (d / "reward.py").write_text(body)
    return _run(d, reward=f"{d / 'reward.py'}:{name}")


def _earlier_run(d: Path) -> Path:
    run = d / "run"
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "checkpoints" / "step-000001" / "index.json").write_text('{"step": 1}')
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    return run


CASES = [
    # Hugging Face directories (compiled by rpegc, which reads config.json)
    Case("eps-negative", lambda d: _config(d, rms_norm_eps=-1), "rpegc", "rms_norm_eps = -1"),
    Case("eps-string", lambda d: _config(d, rms_norm_eps="1e-6"), "rpegc", "rms_norm_eps = '1e-6'"),
    Case("window-string", lambda d: _config(d, sliding_window="4096"), "rpegc", "sliding_window = '4096'"),
    Case("tie-string", lambda d: _config(d, tie_word_embeddings="false"), "rpegc", "tie_word_embeddings"),
    Case("rope-unknown", lambda d: _run_with_config(d, rope_scaling={"rope_type": "weird", "factor": 2.0}),
         message="cannot build the rotary embedding", absent="worker"),
    Case("weights-truncated", lambda d: _weights(d, lambda b: b[: len(b) // 2]), message="model.safetensors"),
    Case("weights-empty", lambda d: _weights(d, lambda b: b""), message="model.safetensors"),
    Case("weights-huge-header", lambda d: _weights(d, lambda b: (1 << 62).to_bytes(8, "little") + b[8:]),
         message="model.safetensors"),
    # datasets
    Case("row-nan", lambda d: _rows(d, '{"prompt": "1+1=", "answer": NaN}\n'), message="NaN is not a JSON value"),
    Case("row-deep", lambda d: _rows(d, '{"prompt": "1=", "answer": "1", "x": ' + "[" * 100000 + "]" * 100000 + "}\n"),
         message="nests arrays or objects too deeply"),
    Case("row-not-utf8", lambda d: _rows(d, b'{"prompt": "\xff"}\n'), message="not UTF-8"),
    Case("row-long-prompt", lambda d: _rows(d, json.dumps({"prompt": "1+2=" * 2_000_000, "answer": "3"}) + "\n"),
         message="characters, more than Lp = 16 tokens"),
    # reward functions
    Case("reward-exits", lambda d: _reward(d, "import sys\nsys.exit(3)\n" + GOOD_REWARD), message="sys.exit(3)"),
    Case("reward-os-exit", lambda d: _reward(d, "import os\nos._exit(5)\n" + GOOD_REWARD), message="exit status 5"),
    Case("reward-missing", lambda d: _reward(d, GOOD_REWARD, name="nope"), message="has no function 'nope'"),
    Case("reward-signature", lambda d: _reward(d, "def compute_score(x):\n    return 1.0\n"), message="lacks"),
    # RL settings the float32 arithmetic cannot hold
    Case("kl-coef", lambda d: _run(d, "--rl", "kl_coef=1e300"), message="kl_coef must be <= 10000.0"),
    Case("adam-eps", lambda d: _run(d, "--rl", "adam_eps=1e-320"), message="adam_eps must be >="),
    Case("temperature", lambda d: _run(d, "--rl", "temperature=1e-300"), message="temperature must be >= 0.0001"),
    Case("lr", lambda d: _run(d, "--lr", "1e300"), message="give a learning rate in (0, 1]"),
    Case("rl-config-device", lambda d: _run(d, "--rl-config", "/dev/zero"), message="not a regular file"),
    # run directories, exports, the secret file
    Case("fresh-run-on-earlier", lambda d: _run(d, "--run-dir", str(_earlier_run(d))), message="holds an earlier run"),
    Case("overwrite-alone", lambda d: _run(d, "--overwrite"), message="--overwrite"),
    Case("export-into-checkpoints", lambda d: ["export", str(_earlier_run(d)),
                                               str(d / "run" / "checkpoints" / "step-999999"), "--step", "1"],
         message="cannot write the export"),
    Case("export-into-final", lambda d: ["export", str(_earlier_run(d)), str(d / "run" / "final")],
         message="cannot write the export"),
    Case("secret-file-exists", lambda d: _run(d, "--store", "127.0.0.1:0", "--secret-file", _file(d, "notes.txt")),
         message="the file exists"),
    Case("plan-fifo", lambda d: os.mkfifo(d / "p.fifo") or [str(d / "p.fifo"), "--backend", "sim"],
         message="not a regular file"),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("base")
    arith.write_checkpoint(str(d / "ckpt"), hidden=32, layers=2, max_positions=32)
    arith.write_dataset(str(d / "train.jsonl"), 16, seed=2, chat=True)
    return d


def _snapshot(d: Path) -> dict[str, bytes]:
    """Every file under `d` but a run directory's lock file (taken before a run is refused, and left, as flock
    files are: removing one races with the next run opening it)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_run_input_is_one_located_line_and_changes_nothing(base, tmp_path, capsys, case):
    import shutil

    d = tmp_path / "case"
    shutil.copytree(base, d)
    argv = case.setup(d)
    capsys.readouterr()
    before = _snapshot(d)
    result = call_guarded(rpegc_main if case.tool == "rpegc" else run_main, argv, HANG_SECONDS)
    err = capsys.readouterr().err
    assert result == 1, f"{case.name}: {result}\n{err}"
    first = err.strip().splitlines()[0] if err.strip() else ""
    assert LOCATED.match(first) and "Traceback" not in err, f"{case.name}: {err}"
    assert case.message in err and not (case.absent and case.absent in err), f"{case.name}: {err}"
    assert _snapshot(d) == before, f"{case.name}: a file changed"


SEED = 20261205
CONFIG_MUTANTS = 150


def _read_checkpoint_config(directory: str) -> None:
    """What reads a checkpoint's config.json before any worker starts: rpegc's shape, the backend's network
    options and the RoPE tables transformers computes."""
    from rpegc.core.ir.hf_config import hf_arch
    from rpegc.runtime.backends.torch.model.hf import hf_net
    from rpegc.runtime.backends.torch.model.hf_rope import rope_tables
    from rpegc.runtime.backends.torch.model.transformer import NetOptions

    hf_arch(directory)
    hf_net(directory, NetOptions(max_seq=32))
    rope_tables.cache_clear()
    rope_tables(directory, 32)


def test_mutated_checkpoint_configs_are_read_or_refused_with_a_located_error(base, tmp_path):
    """Seeded mutants of config.json, a hostile value at a field or bytes mutated as tests/test_hostile_inputs.py
    mutates programs: each is read, or refused with an RpegError naming the directory; no other exception."""
    from fixtures.hostile import HOSTILE_VALUES, mutants
    from rpegc.core.ir.errors import RpegError

    text = (base / "ckpt" / "config.json").read_text()
    config = json.loads(text)
    rng = random.Random(SEED)
    docs = []
    for _ in range(CONFIG_MUTANTS // 2):
        key = rng.choice(sorted(config))
        docs.append(json.dumps({**config, key: rng.choice(HOSTILE_VALUES)}).encode())
    docs += [data for _, data in mutants(CONFIG_MUTANTS - len(docs), SEED, [("config.json", text.encode())])]
    escaped = []
    for i, data in enumerate(docs):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "config.json").write_bytes(data)
        try:
            _read_checkpoint_config(str(d))
        except RpegError:
            continue
        except Exception as e:  # noqa: BLE001 - what escapes is the finding
            escaped.append(f"{data[:200]!r}: {type(e).__name__}: {e}"[:400])
    assert not escaped, "\n".join(escaped)


DATASET_MUTANTS = 120


def test_mutated_datasets_are_read_or_refused_with_a_located_error(base, tmp_path):
    """Seeded mutants of a JSONL dataset (a hostile value at a row's field, or mutated bytes) through the reader
    every process runs before training (datasets.PromptDataset): read, or an RpegError; no other exception."""
    from fixtures.hostile import HOSTILE_VALUES, mutants
    from rpegc.core.ir.errors import RpegError
    from rpegc.runtime.backends.torch.rl.datasets import DataConfig, PromptDataset, load_tokenizer

    tok = load_tokenizer(str(base / "ckpt"))
    data = (base / "train.jsonl").read_bytes()
    rows = [json.loads(line) for line in data.decode().splitlines()]
    rng = random.Random(SEED)
    docs = []
    for _ in range(DATASET_MUTANTS // 2):
        i, key = rng.randrange(len(rows)), rng.choice(["prompt", "answer", "data_source", "extra_info", "new"])
        changed = rows[:i] + [{**rows[i], key: rng.choice(HOSTILE_VALUES)}] + rows[i + 1:]
        docs.append("".join(json.dumps(r) + "\n" for r in changed).encode())
    docs += [d for _, d in mutants(DATASET_MUTANTS - len(docs), SEED, [("train.jsonl", data)])]
    escaped = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"d{i}.jsonl"
        path.write_bytes(doc)
        try:
            PromptDataset(DataConfig(path=str(path)), tok, 16, len(tok)).batch(4, seed=0, step=0)
        except RpegError:
            continue
        except Exception as e:  # noqa: BLE001 - what escapes is the finding
            escaped.append(f"{doc[:160]!r}: {type(e).__name__}: {e}"[:400])
    assert not escaped, "\n".join(escaped)


WEIGHT_MUTANTS = 120


def _framed(header: bytes, data: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header + data


def _weight_mutants(blob: bytes, rng: random.Random) -> list[bytes]:
    """Damaged copies of a safetensors file: its JSON header mutated (a field given a hostile value, or its bytes
    mutated and re-framed), its length field wrong, its data flipped or cut, the file cut anywhere."""
    from fixtures.hostile import HOSTILE_VALUES, mutants

    size = int.from_bytes(blob[:8], "little")
    header, data = blob[8:8 + size], blob[8 + size:]
    entries = json.loads(header)
    names = sorted(k for k in entries if k != "__metadata__")
    out = []
    for _ in range(WEIGHT_MUTANTS // 4):
        name, field = rng.choice(names), rng.choice(["dtype", "shape", "data_offsets"])
        value = rng.choice([*HOSTILE_VALUES, "F16", "BF16", "I64", "BOOL", "F8_E4M3", [1], [0, 0], [-1, 8],
                            entries[name][field][::-1]])
        changed = {**entries, name: {**entries[name], field: value}}
        out.append(_framed(json.dumps(changed).encode(), data))
    out += [_framed(h, data) for _, h in mutants(WEIGHT_MUTANTS // 4, SEED, [("header", header)])]
    for _ in range(WEIGHT_MUTANTS // 4):
        length = rng.choice([0, 1, size - 1, size + 1, size + len(data), 2**63 - 1, rng.randrange(2**40)])
        out.append(length.to_bytes(8, "little") + blob[8:])
    while len(out) < WEIGHT_MUTANTS:
        cut = bytearray(blob[: rng.randrange(len(blob) + 1)] if rng.random() < 0.3 else blob)
        for _ in range(rng.randrange(1, 6)):  # flipped data bytes; 0xff in a float's exponent makes NaN or inf
            if len(cut) > 8 + size:
                cut[rng.randrange(8 + size, len(cut))] = rng.choice([0xFF, 0x7F, 0x80, 0x00, rng.randrange(256)])
        out.append(bytes(cut))
    return out


def _read_weights(directory: str) -> None:
    """What a worker does with a checkpoint's weights: the model from its config, every tensor read."""
    from rpegc.core.ir.hf_config import hf_arch
    from rpegc.runtime.backends.torch.model.hf import initial_model
    from rpegc.runtime.backends.torch.model.transformer import NetOptions

    initial_model(hf_arch(directory), "policy", 0, directory, NetOptions(max_seq=32))


def test_mutated_weights_are_read_or_refused_with_a_located_error(base, tmp_path):
    """Seeded mutants of model.safetensors and of a weight index through the reader every worker runs
    (hf.HFWeights via initial_model): read, or an RpegError naming the file; never a non-finite weight."""
    import shutil

    from fixtures.hostile import HOSTILE_VALUES, mutants
    from rpegc.core.ir.errors import RpegError

    blob = (base / "ckpt" / "model.safetensors").read_bytes()
    rng = random.Random(SEED)
    escaped, refused = [], 0
    index = json.dumps({"weight_map": {k: "model.safetensors" for k in json.loads(blob[8:8 + int.from_bytes(
        blob[:8], "little")]) if k != "__metadata__"}}).encode()
    cases = [("model.safetensors", b) for b in _weight_mutants(blob, rng)]
    cases += [("model.safetensors.index.json", json.dumps({"weight_map": rng.choice(HOSTILE_VALUES)}).encode())
              for _ in range(10)]
    cases += [("model.safetensors.index.json", m) for _, m in mutants(30, SEED, [("index", index)])]
    for i, (name, data) in enumerate(cases):
        d = tmp_path / f"w{i}"
        shutil.copytree(base / "ckpt", d)
        (d / name).write_bytes(data)
        try:
            _read_weights(str(d))
        except RpegError as e:
            refused += 1
            assert str(d) in str(e), str(e)
            continue
        except Exception as e:  # noqa: BLE001 - what escapes is the finding
            escaped.append(f"{name} #{i}: {type(e).__name__}: {e}"[:400])
        shutil.rmtree(d)
    assert not escaped, "\n".join(escaped)
    assert refused > len(cases) // 2  # most damage is found, not read as weights


TOKENIZER_MUTANTS = 80


def test_mutated_tokenizers_are_loaded_or_refused_with_a_located_error(base, tmp_path):
    """Seeded mutants of tokenizer.json and tokenizer_config.json (a hostile value at a field, or mutated bytes)
    through what every process does with a tokenizer: load it, then tokenize a batch of the dataset."""
    import shutil

    from fixtures.hostile import HOSTILE_VALUES, mutants
    from rpegc.core.ir.errors import RpegError
    from rpegc.runtime.backends.torch.rl.datasets import DataConfig, PromptDataset, load_tokenizer

    rng = random.Random(SEED)
    cases = []
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (base / "ckpt" / name).read_bytes()
        doc = json.loads(text)
        for _ in range(TOKENIZER_MUTANTS // 4):
            key = rng.choice(sorted(doc))
            cases.append((name, json.dumps({**doc, key: rng.choice(HOSTILE_VALUES)}).encode()))
        cases += [(name, m) for _, m in mutants(TOKENIZER_MUTANTS // 4, SEED, [(name, text)])]
    escaped = []
    for i, (name, data) in enumerate(cases):
        d = tmp_path / f"t{i}"
        shutil.copytree(base / "ckpt", d)
        (d / name).write_bytes(data)
        try:
            tok = load_tokenizer(str(d))
            cfg = DataConfig(path=str(base / "train.jsonl"), tokenizer=str(d))
            PromptDataset(cfg, tok, 16, 27).batch(4, seed=0, step=0)
        except RpegError:
            continue
        except Exception as e:  # noqa: BLE001 - what escapes is the finding
            escaped.append(f"{name} #{i} {data[:120]!r}: {type(e).__name__}: {e}"[:400])
        finally:
            shutil.rmtree(d)
    assert not escaped, "\n".join(escaped)


WORKER_MUTANTS = 6


def test_weight_mutants_stop_a_real_run_as_the_reader_says(base, tmp_path, capsys):
    """A few of those mutants in real runs, where 2 worker processes read the weights: a mutant the reader refuses
    stops the run with one located line (exit 1), one it reads trains (exit 0); never a traceback or a hang."""
    import shutil

    from rpegc.core.ir.errors import RpegError

    blob = (base / "ckpt" / "model.safetensors").read_bytes()
    verdicts: dict[bool, list[bytes]] = {True: [], False: []}
    for data in _weight_mutants(blob, random.Random(SEED + 1)):
        probe = tmp_path / "probe"
        shutil.copytree(base / "ckpt", probe)
        (probe / "model.safetensors").write_bytes(data)
        try:
            _read_weights(str(probe))
            verdicts[True].append(data)
        except RpegError:
            verdicts[False].append(data)
        shutil.rmtree(probe)
    picked = [(True, verdicts[True][0])] + [(False, m) for m in random.Random(SEED).sample(verdicts[False],
                                                                                             WORKER_MUTANTS - 1)]
    for i, (reads, data) in enumerate(picked):
        d = tmp_path / f"r{i}"
        shutil.copytree(base, d)
        (d / "ckpt" / "model.safetensors").write_bytes(data)
        argv = _run(d, "--steps", "1")
        capsys.readouterr()
        result = call_guarded(run_main, argv, HANG_SECONDS)
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        if reads:
            assert result == 0, err
        else:
            assert result == 1 and LOCATED.match(err.strip().splitlines()[0]) and "model.safetensors" in err, err
