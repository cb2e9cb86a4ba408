"""Prompt datasets: JSONL or Parquet files tokenized with the checkpoint's tokenizer (issue 15, item 4).

Paper Sec. II: every RL step draws B prompts and generates R responses to each. A dataset file holds one
example per row (JSONL line or Parquet row): the prompt under `prompt` (text, or chat messages
[{"role", "content"}, ...]), the ground truth under verl's `reward_model.ground_truth` or a plain `answer`
(`answer_key = "auto"`, the default, takes whichever the file's first row has, and every row must have it; a dotted
key reaches into nested columns), `data_source` and `extra_info` passed on to the reward function. A Parquet file as
verl's data preprocessing writes it therefore trains with no `[data]` table. `DataConfig` names the columns and the rules; `--rl-config`'s `[data]` table and
`--rl data.NAME=VALUE` set it (runtime/backends/torch/rl/hyperparameters.py).

Rules, all explicit: a prompt is the tokenizer's encoding of its text, or of the chat template applied to
its messages with the generation prompt (`chat_template = "auto"` applies the tokenizer's template when it
has one; a text prompt is then one user message). A prompt longer than the workload's Lp is an error
naming the row (`truncation = "error"`), or keeps its last / first Lp tokens ("left" / "right"), or is left
out ("drop", counted). Prompts are left-padded to Lp with the tokenizer's pad token (its EOS if it has
none); the pad count travels with the batch (`PromptBatch.pads`), so the models mask those keys and number
positions from the first real token, as `transformers` does with an attention mask. A response is at most
Lr tokens and ends at the tokenizer's EOS (the mask covers the EOS, as verl's). Step k takes examples
k*B .. k*B+B-1 of an endless sequence of epochs, each a permutation of the rows seeded by (seed, epoch)
(`shuffle = false`: file order), so every process draws the same prompts without talking to the others.

Every process (controller, workers, the reference oracle) loads and tokenizes the file itself: tensors
never travel over the control channel, and the encoding is deterministic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from rpegc.core.ir.errors import Loc, RpegError, error_line
from rpegc.core.ir.options import option
from rpegc.runtime.backends.torch.model.transformer import derive_seed

TRUNCATIONS = ("error", "left", "right", "drop")
AUTO = "auto"
AUTO_ANSWER_KEYS = ("reward_model.ground_truth", "answer")  # verl's layout, then the plain one
MAX_ROW_BYTES = 64 << 20  # a JSONL row: a prompt of Lp tokens, its answer and extra info are far smaller
TOKEN_MARGIN = 16  # tokens kept beyond Lp where an over-long prompt is cut before tokenising (see _fit)
CHAT_TEMPLATES = ("auto", "always", "never")
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class DataConfig:
    """Where the prompts come from and how they become token ids. `path` None: the built-in toy task."""

    path: Optional[str] = option(None, "a JSONL or Parquet file of prompts (--data); none: the built-in toy task")
    prompt_key: str = option("prompt", "the column of the prompt: text, or chat messages")
    answer_key: str = option(AUTO, "the column of the ground truth: auto (the first of " + ", ".join(AUTO_ANSWER_KEYS)
                                   + " the first row has; a preference dataset: or none), or \"\" (no ground truth)")
    chosen_key: str = option("chosen", "DPO: the column of the preferred response's text")
    rejected_key: str = option("rejected", "DPO: the column of the other response's text")
    source_key: str = option("data_source", "the column naming a row's source (given to the reward function)")
    extra_key: str = option("extra_info", "the column of a row's extra information (given to the reward function)")
    tokenizer: Optional[str] = option(None, "a tokenizer directory; none: the actor's `hf` checkpoint's")
    chat_template: str = option("auto", "the chat template: " + ", ".join(CHAT_TEMPLATES))
    chat_template_kwargs: tuple[tuple[str, Any], ...] = option(
        (), "keyword arguments of the chat template, e.g. Qwen3's [data] chat_template_kwargs = "
            "{enable_thinking = false}")
    truncation: str = option("error", "a prompt longer than Lp: " + ", ".join(TRUNCATIONS))
    shuffle: bool = option(True, "draw each step's prompts in a seeded shuffled order (false: in file order)")


def check_data_config(cfg: DataConfig) -> None:
    if cfg.truncation not in TRUNCATIONS:
        raise RpegError(None, f"data.truncation = '{cfg.truncation}' is not one of {', '.join(TRUNCATIONS)}")
    if cfg.chat_template not in CHAT_TEMPLATES:
        raise RpegError(None, f"data.chat_template = '{cfg.chat_template}' is not one of {', '.join(CHAT_TEMPLATES)}")
    if not cfg.prompt_key:
        raise RpegError(None, "data.prompt_key must name the prompt column")


@dataclass(frozen=True)
class Example:
    """One prompt: its token ids (template applied, truncated) and what the reward function is given."""

    ids: tuple[int, ...]
    answer: Optional[str]
    source: str = ""
    extra: dict = field(default_factory=dict)
    row: int = 0  # 1-based line or row of the file
    chosen: tuple[int, ...] = ()  # DPO: the preferred response's token ids (EOS last), at most Lr
    rejected: tuple[int, ...] = ()


@dataclass
class PromptBatch:
    """The B prompts of one step: tokens [B, Lp] left-padded, pads [B] (None: no padding), and the
    examples they came from (None for the toy tasks)."""

    tokens: Tensor
    pads: Optional[Tensor] = None
    examples: Optional[list[Example]] = None


@dataclass
class PairBatch:
    """The B preference pairs of one DPO step: prompt + chosen and prompt + rejected sequences [B, Lp+Lr]
    (prompts left-padded, responses right-padded), their response masks [B, Lr], the prompts' pads [B]."""

    chosen: Tensor
    rejected: Tensor
    chosen_mask: Tensor
    rejected_mask: Tensor
    pads: Optional[Tensor] = None

    def side(self, name: str) -> tuple[Tensor, Tensor]:
        """(sequences, mask) of "chosen" or "rejected"."""
        return (self.chosen, self.chosen_mask) if name == "chosen" else (self.rejected, self.rejected_mask)


def _regular_file(path: str, what: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise RpegError(None, f"{what} {path}: cannot read it: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RpegError(None, f"{what} {path} is not a regular file")


def read_rows(path: str) -> list[tuple[int, dict]]:
    """(1-based row, object) of every row of a JSONL or Parquet file; located errors for malformed rows."""
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise RpegError(None, f"dataset {path}: unknown format; use a .jsonl or .parquet file")
    _regular_file(path, "dataset")
    if fmt == "parquet":
        return _parquet_rows(path)
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_ROW_BYTES + 1), b""), 1):
            if len(raw) > MAX_ROW_BYTES:
                raise RpegError(Loc(path, n, 1), f"row {n} holds more than {MAX_ROW_BYTES >> 20} MiB; no prompt of "
                                "Lp tokens needs that")
            try:
                line = raw.decode("utf-8").removeprefix("\ufeff" if n == 1 else "")
            except UnicodeDecodeError:
                raise RpegError(Loc(path, n, 1), "the dataset is not UTF-8 text") from None
            if not line.strip():
                continue
            rows.append((n, _json_row(line, path, n)))
    return rows


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value (write a number, or null)")


def _json_row(line: str, path: str, n: int) -> dict:
    """One JSONL row, read strictly (no NaN or Infinity, which JSON does not have)."""
    try:
        obj = json.loads(line, parse_constant=_not_json)
    except json.JSONDecodeError as e:
        raise RpegError(Loc(path, n, e.colno), f"not a JSON object: {e.msg}", source=line) from None
    except ValueError as e:
        raise RpegError(Loc(path, n, 1), f"not a JSON object: {e}") from None
    except RecursionError:
        raise RpegError(Loc(path, n, 1), "the row nests arrays or objects too deeply to read") from None
    if not isinstance(obj, dict):
        raise RpegError(Loc(path, n, 1), f"each line must be a JSON object, got {type(obj).__name__}")
    return obj


def _parquet_rows(path: str) -> list[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RpegError(None, f"dataset {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    import pyarrow

    try:
        table = pq.read_table(path)
    except (pyarrow.ArrowException, OSError) as e:
        raise RpegError(None, f"dataset {path}: not a readable Parquet file: {e}") from None
    return list(enumerate(table.to_pylist(), 1))


def _answer_key(obj: dict, loc: Loc, row: int, required: bool) -> str:
    """The ground truth's key of a file whose first row is `obj` (answer_key = "auto"); a preference dataset's rows
    need none (`required` False: "" when the row has neither)."""
    for key in AUTO_ANSWER_KEYS:
        if _lookup(obj, key)[0]:
            return key
    if not required:
        return ""
    raise RpegError(loc, f"row {row} has neither '{AUTO_ANSWER_KEYS[0]}' (verl's layout) nor '{AUTO_ANSWER_KEYS[1]}'; "
                         "name the ground truth's column with data.answer_key, or set it to \"\" if the rows carry "
                         "none")


def _lookup(obj: dict, key: str) -> tuple[bool, Any]:
    """obj[key] with dots reaching into nested objects: (found, value)."""
    cur: Any = obj
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _messages(prompt: Any, loc: Loc, key: str) -> Optional[list[dict]]:
    """A chat prompt as a list of messages, None for a text prompt; anything else is a located error."""
    if isinstance(prompt, str):
        return None
    ok = isinstance(prompt, (list, tuple)) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if not ok:
        raise RpegError(loc, f"'{key}' must be text or a list of chat messages "
                        "[{\"role\": ..., \"content\": ...}], got " + type(prompt).__name__)
    return [dict(role=m["role"], content=m["content"]) for m in prompt]


def load_tokenizer(directory: str):
    """The tokenizer saved in a local directory (no network)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(directory):
        raise RpegError(None, f"tokenizer directory {directory} does not exist")
    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - the Rust tokenizers library raises a bare Exception for a bad file
        raise RpegError(None, f"no tokenizer could be loaded from {directory}: {error_line(e)}") from None


def special_ids(tokenizer, where: str) -> tuple[int, int]:
    """(eos, pad) ids: EOS ends a response; prompts are padded with the pad token, or EOS without one."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise RpegError(None, f"the tokenizer of {where} has no EOS token, so no response could end; "
                        "give it an eos_token")
    pad = tokenizer.pad_token_id
    return int(eos), int(eos if pad is None else pad)


class PromptDataset:
    """The tokenized examples of a dataset file and the batch of every step."""

    def __init__(self, cfg: DataConfig, tokenizer, prompt_len: int, vocab: int, pair_len: Optional[int] = None):
        """`pair_len`: a preference dataset (DPO) whose chosen and rejected responses hold at most this many
        tokens (Lr), EOS included."""
        check_data_config(cfg)
        assert cfg.path is not None
        self.cfg, self.tokenizer, self.prompt_len, self.pair_len = cfg, tokenizer, prompt_len, pair_len
        where = cfg.tokenizer or cfg.path
        if len(tokenizer) > vocab:
            raise RpegError(None, f"the tokenizer of {where} has {len(tokenizer)} tokens but the model's vocabulary "
                            f"is {vocab}; use the model's own tokenizer")
        self.eos_id, self.pad_id = special_ids(tokenizer, where)
        template = getattr(tokenizer, "chat_template", None)
        if cfg.chat_template == "always" and not template:
            raise RpegError(None, f"data.chat_template = always but the tokenizer of {where} has no chat template")
        self.use_template = bool(template) and cfg.chat_template != "never"
        # no token spells more characters than the longest in the vocabulary: a longer text is more tokens
        self.token_chars = max((len(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
                                if isinstance(t, str)), default=1)
        self.examples: list[Example] = []
        self.dropped = 0
        for row, obj in read_rows(cfg.path):
            if self.cfg.answer_key == AUTO:
                key = _answer_key(obj, Loc(cfg.path, row, 1), row, required=pair_len is None)
                self.cfg = dataclasses.replace(self.cfg, answer_key=key)
            ex = self._example(row, obj)
            if ex is not None:
                self.examples.append(ex)
        if not self.examples:
            raise RpegError(None, f"dataset {cfg.path} has no usable prompts"
                            + (f" ({self.dropped} longer than Lp = {prompt_len} dropped)" if self.dropped else ""))

    def _example(self, row: int, obj: dict) -> Optional[Example]:
        cfg, loc = self.cfg, Loc(self.cfg.path, row, 1)
        found, prompt = _lookup(obj, cfg.prompt_key)
        if not found:
            raise RpegError(loc, f"row {row} has no '{cfg.prompt_key}' (data.prompt_key)")
        messages = _messages(prompt, loc, cfg.prompt_key)
        prompt = self._fit(prompt if messages is None else messages, row, loc)
        if prompt is None:
            self.dropped += 1
            return None
        ids = self.encode(prompt, loc)
        if len(ids) > self.prompt_len:
            if cfg.truncation == "error":
                raise RpegError(loc, f"the prompt of row {row} has {len(ids)} tokens, more than Lp = "
                                f"{self.prompt_len}; raise Lp, shorten it, or set data.truncation = left, right "
                                "or drop")
            if cfg.truncation == "drop":
                self.dropped += 1
                return None
            ids = ids[-self.prompt_len:] if cfg.truncation == "left" else ids[:self.prompt_len]
        if not ids:
            raise RpegError(loc, f"the prompt of row {row} encodes to no tokens")
        answer = None
        if cfg.answer_key:
            found, value = _lookup(obj, cfg.answer_key)
            if not found or value is None:
                raise RpegError(loc, f"row {row} has no '{cfg.answer_key}' (data.answer_key; set it to \"\" if "
                                "the rows carry no ground truth)")
            answer = value if isinstance(value, str) else json.dumps(value)
        _, source = _lookup(obj, cfg.source_key)
        _, extra = _lookup(obj, cfg.extra_key)
        pair: dict[str, tuple[int, ...]] = {}
        if self.pair_len is not None:
            for side, key in (("chosen", cfg.chosen_key), ("rejected", cfg.rejected_key)):
                response = self._response(obj, key, row, loc)
                if response is None:
                    self.dropped += 1
                    return None
                pair[side] = response
        return Example(ids=tuple(ids), answer=answer, source=str(source or ""),
                       extra=extra if isinstance(extra, dict) else {}, row=row, **pair)

    def _fit(self, prompt: str | list[dict], row: int, loc: Loc) -> str | list[dict] | None:
        """The prompt, or, when its text is longer than Lp tokens of the vocabulary's longest could spell, what
        tokenising need not read: truncation error refuses it and drop drops it (None) without tokenising it; left
        and right keep the last or first (Lp + TOKEN_MARGIN) x that many characters of each text, which hold every
        token the truncation keeps (a 10 MB prompt took 26 s and 4.2 GB to tokenise before it was refused)."""
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        chars = sum(len(t) for t in texts)
        if chars <= self.prompt_len * self.token_chars:
            return prompt
        if self.cfg.truncation == "error":
            raise RpegError(loc, f"the prompt of row {row} has {chars:,} characters, more than Lp = {self.prompt_len} "
                            f"tokens of at most {self.token_chars} characters can spell; raise Lp, shorten it, or set "
                            "data.truncation = left, right or drop")
        if self.cfg.truncation == "drop":
            return None
        keep = (self.prompt_len + TOKEN_MARGIN) * self.token_chars
        cut = (lambda t: t[-keep:]) if self.cfg.truncation == "left" else (lambda t: t[:keep])
        return cut(prompt) if isinstance(prompt, str) else [dict(m, content=cut(m["content"])) for m in prompt]

    def _response(self, obj: dict, key: str, row: int, loc: Loc) -> Optional[tuple[int, ...]]:
        """A preference response's ids with EOS; longer than Lr: an error, or cut to Lr (left/right), or None (drop)."""
        found, text = _lookup(obj, key)
        if not found or not isinstance(text, str):
            raise RpegError(loc, f"row {row} has no text under '{key}' (data.{key.split('.')[-1]}_key names the "
                            "preference pair's responses)")
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]
        assert self.pair_len is not None
        if len(ids) > self.pair_len:
            if self.cfg.truncation == "error":
                raise RpegError(loc, f"the '{key}' response of row {row} has {len(ids)} tokens with its EOS, more "
                                f"than Lr = {self.pair_len}; raise Lr or set data.truncation = right (cut it) or drop")
            if self.cfg.truncation == "drop":
                return None
            ids = ids[:self.pair_len]  # a response is cut at its end whichever side prompts are cut at
        return tuple(ids)

    def encode(self, prompt: str | list[dict], loc: Loc) -> list[int]:
        tok = self.tokenizer
        if isinstance(prompt, list) or self.use_template:
            if not self.use_template:
                raise RpegError(loc, "a chat prompt needs a tokenizer with a chat template "
                                "(data.chat_template = never turns it off)")
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           **dict(self.cfg.chat_template_kwargs))
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt)["input_ids"])

    def __len__(self) -> int:
        return len(self.examples)

    def step_examples(self, batch: int, seed: int, step: int) -> list[Example]:
        """The `batch` examples of RL step `step`: positions step*batch.. of the seeded epoch sequence."""
        n = len(self.examples)
        if batch > n:
            raise RpegError(None, f"the workload's B = {batch} prompts per step but dataset {self.cfg.path} has "
                            f"only {n}; lower B or add prompts")
        out, orders = [], {}
        for i in range(step * batch, step * batch + batch):
            epoch = i // n
            if epoch not in orders:
                orders[epoch] = self.epoch_order(seed, epoch)
            out.append(self.examples[orders[epoch][i % n]])
        return out

    def epoch_order(self, seed: int, epoch: int) -> list[int]:
        n = len(self.examples)
        if not self.cfg.shuffle:
            return list(range(n))
        gen = torch.Generator().manual_seed(derive_seed("data", seed, epoch))
        return torch.randperm(n, generator=gen).tolist()

    def batch(self, batch: int, seed: int, step: int) -> PromptBatch:
        examples = self.step_examples(batch, seed, step)
        tokens = torch.full((batch, self.prompt_len), self.pad_id, dtype=torch.int64)
        pads = torch.empty(batch, dtype=torch.int64)
        for i, ex in enumerate(examples):
            pads[i] = self.prompt_len - len(ex.ids)
            tokens[i, int(pads[i]):] = torch.tensor(ex.ids, dtype=torch.int64)
        return PromptBatch(tokens=tokens, pads=pads, examples=examples)

    def pairs(self, batch: int, seed: int, step: int) -> PairBatch:
        """Step `step`'s preference pairs (the examples `batch` would give, with their two responses)."""
        assert self.pair_len is not None, "a preference dataset is opened with pair_len"
        prompts = self.batch(batch, seed, step)
        assert prompts.examples is not None
        out = {}
        for side in ("chosen", "rejected"):
            responses = torch.full((batch, self.pair_len), self.pad_id, dtype=torch.int64)
            mask = torch.zeros(batch, self.pair_len)
            for i, ex in enumerate(prompts.examples):
                ids = getattr(ex, side)
                responses[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
                mask[i, :len(ids)] = 1.0
            out[side] = torch.cat([prompts.tokens, responses], dim=1)
            out[side + "_mask"] = mask
        return PairBatch(pads=prompts.pads, **out)

    def response_text(self, response: Sequence[int]) -> str:
        """A response's text: its tokens up to the mask's end, special tokens (the EOS) left out."""
        return self.tokenizer.decode(list(response), skip_special_tokens=True)


def data_dict(cfg: DataConfig) -> dict:
    """The config as the trace header and the checkpoint identity record it."""
    return dataclasses.asdict(cfg)
