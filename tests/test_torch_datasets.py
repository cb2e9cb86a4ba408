"""Prompt datasets (runtime/backends/torch/rl/datasets.py): JSONL and Parquet rows tokenized with
the checkpoint's tokenizer, chat templates, explicit truncation, left padding, seeded epochs, and located
errors for every malformed input."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.tools import arith  # noqa: E402
from rpegc.runtime.backends.torch.rl.datasets import DataConfig, PromptDataset, load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    arith.write_tokenizer(str(d))
    return load_tokenizer(str(d))


def rows_file(tmp_path, rows, name="d.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def dataset(tok, path, Lp=12, vocab=64, **cfg) -> PromptDataset:
    return PromptDataset(DataConfig(path=path, **cfg), tok, Lp, vocab)


def test_prompts_are_left_padded_to_lp_with_their_pad_counts(tok, tmp_path):
    path = rows_file(tmp_path, [{"prompt": "1+2=", "answer": "3"}, {"prompt": "12+34=", "answer": "46"}])
    ds = dataset(tok, path, chat_template="never", shuffle=False)
    b = ds.batch(2, seed=0, step=0)
    lengths = [len(tok("1+2=")["input_ids"]), len(tok("12+34=")["input_ids"])]
    assert lengths[0] < lengths[1]
    assert b.pads.tolist() == [12 - n for n in lengths]
    for row, n in zip(b.tokens.tolist(), lengths):
        assert row[:12 - n] == [tok.pad_token_id] * (12 - n)
    assert tok.decode(b.tokens[1, int(b.pads[1]):]).replace(" ", "") == "12+34="
    assert [e.answer for e in b.examples] == ["3", "46"] and b.examples[1].row == 2


def test_the_chat_template_wraps_text_and_messages_alike(tok, tmp_path):
    text = dataset(tok, rows_file(tmp_path, [{"prompt": "2+2=", "answer": "4"}]))
    chat = dataset(tok, rows_file(tmp_path, [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}],
                                  "c.jsonl"))
    assert text.examples[0].ids == chat.examples[0].ids
    assert tok.decode(list(chat.examples[0].ids)).strip().startswith("Q: 2+2=")
    with pytest.raises(RpegError, match="needs a tokenizer with a chat template"):
        dataset(tok, rows_file(tmp_path, [{"prompt": [{"role": "user", "content": "1"}], "answer": "1"}], "n.jsonl"),
                chat_template="never")


def test_nested_keys_reach_verl_columns_and_extra_info_is_kept(tok, tmp_path):
    row = {"question": "3+4=", "reward_model": {"ground_truth": 7}, "data_source": "gsm8k", "extra_info": {"i": 3}}
    ds = dataset(tok, rows_file(tmp_path, [row]), prompt_key="question", answer_key="reward_model.ground_truth")
    ex = ds.examples[0]
    assert (ex.answer, ex.source, ex.extra) == ("7", "gsm8k", {"i": 3})


@pytest.mark.parametrize("truncation,kept", [("left", "last"), ("right", "first"), ("drop", None)])
def test_truncation_is_explicit(tok, tmp_path, truncation, kept):
    long = "11+22+33+44="
    path = rows_file(tmp_path, [{"prompt": long, "answer": "x"}, {"prompt": "1+1=", "answer": "2"}])
    ids = tok(long)["input_ids"]
    ds = dataset(tok, path, Lp=6, chat_template="never", truncation=truncation)
    if kept is None:
        assert len(ds) == 1 and ds.dropped == 1
    else:
        assert list(ds.examples[0].ids) == (ids[-6:] if kept == "last" else ids[:6])


def test_an_overlong_prompt_is_an_error_at_its_row_by_default(tok, tmp_path):
    path = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "11+22+33+44=", "answer": "x"}])
    with pytest.raises(RpegError) as e:
        dataset(tok, path, Lp=6, chat_template="never")
    assert e.value.loc.line == 2 and "more than Lp = 6" in e.value.message and "data.truncation" in e.value.message


@pytest.mark.parametrize("truncation", ["left", "right", "drop", "error"])
def test_a_prompt_too_long_for_any_tokenisation_is_cut_or_refused_before_it_is_tokenised(tok, tmp_path, truncation):
    """A 10 MB prompt took 26 s and 4.2 GB to tokenise before it was refused (issue 33, item 4): a text longer than
    Lp tokens of the vocabulary's longest can spell is refused or dropped untokenised, and cut for left/right to what
    holds the kept tokens, which are those of the whole text."""
    long = "11+22+33+44=" * 400_000  # 4.8 MB
    path = rows_file(tmp_path, [{"prompt": long, "answer": "x"}, {"prompt": "1+1=", "answer": "2"}])
    if truncation == "error":
        with pytest.raises(RpegError) as e:
            dataset(tok, path, Lp=6, chat_template="never", truncation=truncation)
        assert e.value.loc.line == 1 and "4,800,000 characters, more than Lp = 6 tokens" in e.value.message
        return
    ds = dataset(tok, path, Lp=6, chat_template="never", truncation=truncation)
    if truncation == "drop":
        assert len(ds) == 1 and ds.dropped == 1
        return
    ids = tok(long[:2400] if truncation == "right" else long[-2400:])["input_ids"]  # a window well past Lp tokens
    whole = ids[-6:] if truncation == "left" else ids[:6]
    assert list(ds.examples[0].ids) == whole


def test_a_row_above_the_byte_bound_is_refused_before_it_is_parsed(tok, tmp_path, monkeypatch):
    from rpegc.runtime.backends.torch.rl import datasets

    monkeypatch.setattr(datasets, "MAX_ROW_BYTES", 100)
    path = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1" * 200, "answer": "x"}])
    with pytest.raises(RpegError, match="row 2 holds more than") as e:
        dataset(tok, path)
    assert e.value.loc.line == 2


def test_epochs_are_seeded_permutations_and_steps_continue_across_them(tok, tmp_path):
    path = arith.write_dataset(str(tmp_path / "a.jsonl"), 10, seed=3)
    ds = dataset(tok, path)
    seen = [ex.row for k in range(5) for ex in ds.step_examples(4, seed=1, step=k)]  # 20 = two epochs
    assert sorted(seen[:10]) == list(range(1, 11)) and sorted(seen[10:]) == list(range(1, 11))
    assert seen[:10] != seen[10:] and seen[:10] != list(range(1, 11))
    again = dataset(tok, path)
    assert [ex.row for ex in again.step_examples(4, seed=1, step=3)] == seen[12:16]
    assert [ex.row for ex in again.step_examples(4, seed=2, step=0)] != seen[:4]
    plain = dataset(tok, path, shuffle=False)
    assert [ex.row for ex in plain.step_examples(4, seed=1, step=2)] == [9, 10, 1, 2]
    with pytest.raises(RpegError, match="B = 11 prompts per step but dataset .* has only 10"):
        ds.step_examples(11, seed=0, step=0)


def test_parquet_rows_read_as_jsonl_rows_do(tok, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "5+5=", "answer": "10"}]
    pq.write_table(pyarrow.Table.from_pylist(rows), str(tmp_path / "d.parquet"))
    a = dataset(tok, str(tmp_path / "d.parquet"))
    b = dataset(tok, rows_file(tmp_path, rows))
    assert a.examples == b.examples


def test_a_verl_parquet_needs_no_data_options(tok, tmp_path):
    """verl's layout (chat-message prompt, reward_model.ground_truth, data_source, extra_info) with the defaults."""
    pytest.importorskip("pyarrow.parquet")
    path = arith.write_dataset(str(tmp_path / "verl.parquet"), 6, seed=3)
    plain = arith.write_dataset(str(tmp_path / "plain.jsonl"), 6, seed=3, chat=True)
    verl, jsonl = dataset(tok, path, shuffle=False), dataset(tok, plain, shuffle=False)
    assert [e.answer for e in verl.examples] == [e.answer for e in jsonl.examples] == [
        p.answer for p in arith.problems(6, 3, 9, "+")]
    assert [e.ids for e in verl.examples] == [e.ids for e in jsonl.examples]  # the same chat-templated prompts
    assert [e.extra["index"] for e in verl.examples] == list(range(6)) and verl.examples[0].source == "arith"


def test_auto_answer_key_takes_the_first_rows_layout_for_every_row(tok, tmp_path):
    mixed = [{"prompt": "1+2=", "reward_model": {"ground_truth": "3"}}, {"prompt": "2+2=", "answer": "4"}]
    with pytest.raises(RpegError, match="row 2 has no 'reward_model.ground_truth'") as e:
        dataset(tok, rows_file(tmp_path, mixed))
    assert e.value.loc.line == 2
    with pytest.raises(RpegError, match="row 1 has neither 'reward_model.ground_truth' .verl's layout. nor 'answer'"):
        dataset(tok, rows_file(tmp_path, [{"prompt": "1+2=", "solution": "3"}]))
    # a preference dataset needs no ground truth
    pairs = PromptDataset(DataConfig(path=rows_file(tmp_path, [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}])),
                          tok, 12, 64, pair_len=4)
    assert pairs.examples[0].answer is None


@pytest.mark.parametrize("content,match,line", [
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n', "not a JSON object", 2),
    ('["a list"]\n', "must be a JSON object", 1),
    ('{"answer": "2"}\n', "has no 'prompt'", 1),
    ('{"prompt": "1+1="}\n', "has neither 'reward_model.ground_truth' (verl's layout) nor 'answer'", 1),
    ('{"prompt": 5, "answer": "5"}\n', "must be text or a list of chat messages", 1),
    ('{"prompt": [{"role": "user"}], "answer": "5"}\n', "must be text or a list of chat messages", 1),
    # issue 33: what Python's json reads but JSON is not, and what it cannot read
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "1=", "answer": NaN}\n', "NaN is not a JSON value", 2),
    ('{"prompt": "1=", "answer": -Infinity}\n', "-Infinity is not a JSON value", 1),
    ('{"prompt": "1=", "answer": "1", "x": ' + "[" * 100000 + "]" * 100000 + '}\n', "nests arrays or objects too", 1),
])
def test_malformed_rows_are_located_errors(tok, tmp_path, content, match, line):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(RpegError) as e:
        dataset(tok, str(tmp_path / "bad.jsonl"))
    assert match in e.value.message and e.value.loc.line == line


def test_files_that_cannot_be_datasets_are_refused(tok, tmp_path):
    with pytest.raises(RpegError, match="unknown format"):
        dataset(tok, str(tmp_path / "d.csv"))
    with pytest.raises(RpegError, match="cannot read it"):
        dataset(tok, str(tmp_path / "missing.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(RpegError, match="not a regular file"):
        dataset(tok, str(tmp_path / "dir.jsonl"))
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    pytest.importorskip("pyarrow")
    with pytest.raises(RpegError, match="not a readable Parquet file"):
        dataset(tok, str(tmp_path / "x.parquet"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(RpegError, match="has no usable prompts"):
        dataset(tok, str(tmp_path / "empty.jsonl"))


def test_the_tokenizer_must_fit_the_model(tok, tmp_path):
    path = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2"}])
    with pytest.raises(RpegError, match=f"has {len(tok)} tokens but the model's vocabulary is 16"):
        dataset(tok, path, vocab=16)
    with pytest.raises(RpegError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RpegError, match="no tokenizer could be loaded"):
        load_tokenizer(str(tmp_path / "empty"))


def test_a_response_decodes_to_its_text_without_the_eos(tok, tmp_path):
    ds = dataset(tok, rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2"}]))
    assert ds.response_text(tok("12")["input_ids"] + [tok.eos_token_id]).strip() == "12"
    assert (ds.eos_id, ds.pad_id) == (tok.eos_token_id, tok.pad_token_id)


def test_a_preference_dataset_gives_both_sides_right_padded_and_masked(tok, tmp_path):
    path = rows_file(tmp_path, [{"prompt": "1+2=", "chosen": "3", "rejected": "12"},
                                {"prompt": "11+22=", "chosen": "33", "rejected": "4"}])
    ds = PromptDataset(DataConfig(path=path, answer_key="", shuffle=False), tok, 12, 64, pair_len=4)
    pairs = ds.pairs(2, seed=0, step=0)
    assert pairs.chosen.shape == pairs.rejected.shape == (2, 16)
    for side in ("chosen", "rejected"):
        seqs, mask = pairs.side(side)
        for i, row in enumerate(({"chosen": "3", "rejected": "12"}, {"chosen": "33", "rejected": "4"})):
            ids = tok(row[side], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert seqs[i, 12:12 + len(ids)].tolist() == ids and mask[i].tolist() == [1.0] * len(ids) + [0.0] * (4 - len(ids))
    assert torch.equal(pairs.chosen[:, :12], pairs.rejected[:, :12]) and pairs.pads.tolist()[0] > pairs.pads.tolist()[1]


def test_preference_rows_need_both_responses_within_lr(tok, tmp_path):
    with pytest.raises(RpegError, match="row 1 has no text under 'rejected'"):
        PromptDataset(DataConfig(path=rows_file(tmp_path, [{"prompt": "1+2=", "chosen": "3"}]), answer_key=""),
                      tok, 12, 64, pair_len=4)
    long = rows_file(tmp_path, [{"prompt": "1+2=", "chosen": "3", "rejected": "123456"}], "l.jsonl")
    with pytest.raises(RpegError, match="the 'rejected' response of row 1 has 8 tokens with its EOS, more than Lr = 4"):
        PromptDataset(DataConfig(path=long, answer_key=""), tok, 12, 64, pair_len=4)
    cut = PromptDataset(DataConfig(path=long, answer_key="", truncation="right"), tok, 12, 64, pair_len=4)
    assert len(cut.examples[0].rejected) == 4


def test_chat_template_keyword_arguments_reach_the_template(tmp_path):
    """data.chat_template_kwargs, e.g. Qwen3's enable_thinking: the template sees them (here a template that opens an
    empty think block when thinking is off, as Qwen3's does)."""
    d = tmp_path / "tok"
    arith.write_tokenizer(str(d))
    tok = load_tokenizer(str(d))
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if enable_thinking is defined and not enable_thinking %}=={% endif %}")
    path = rows_file(tmp_path, [{"prompt": "1+2", "answer": "3"}])
    plain = PromptDataset(DataConfig(path=path), tok, 12, 64).examples[0].ids
    off = PromptDataset(DataConfig(path=path, chat_template_kwargs=(("enable_thinking", False),)), tok, 12, 64)
    def ids(text):
        return tuple(tok(text, add_special_tokens=False)["input_ids"])
    assert plain == ids("1+2") and off.examples[0].ids == ids("1+2==")
