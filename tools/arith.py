"""A self-made real-model setting: arithmetic prompts, a tokenizer trained on them, a Llama checkpoint.

No weights or data can be downloaded here, so tests and the demo make their own (issue 15, items 4 and 9):
`write_dataset` writes JSONL rows `{"prompt": "12+7=", "answer": "19", "data_source": "arith"}` (or chat
messages), `write_tokenizer` trains a small BPE tokenizer with `tokenizers` on a generated arithmetic corpus
(digits kept apart, so numbers are digit sequences; `<pad>`, `<s>`, `</s>` special; a chat template), and
`write_checkpoint` saves a randomly initialised Llama (or Qwen3, or Gemma 3 text) model with `transformers` next to
the tokenizer: a directory `hf = "DIR"` names, as a user's own checkpoint would be. `python -m
rpegc.tools.arith make DIR` writes all of it and a GRPO program (or one of GRPO's variants:
`--algorithm`) for 2 CPU workers (`main`).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Optional

from rpegc.core.ir.algorithms import BUILT_IN

CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% else %}"
                 "A: {{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}")
SPECIALS = ("<pad>", "<s>", "</s>")

# The plan `grpo_program` writes after the program.
HAND_PLAN = """\
// A hand plan (the optimizer replaces it): the model's vertices on one worker, the verifier on one host process.
rpeg.plan @p for @grpo on @cpu2 {
  @gen         at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @ref_inf     at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @verify      pool = 1
}
"""


def grpo_program(B: int, R: int, Lp: int, Lr: int, ckpt: str, algorithm: str = "grpo", oversample: int = 1) -> str:
    """GRPO (or one of its family, `algorithm`) on a 2-core host with the checkpoint `ckpt` as actor and reference, one
    CPU worker for the model and the math verifier (`math-verify`) on a pool of host processes: a verify vertex,
    which the cost model prices per response (rpegc/core/cost/host.py) and the optimizer places beside the devices,
    their processes sharing the host's cores."""
    from rpegc import programs

    header = (f"{algorithm} on the arithmetic prompts of `python -m rpegc.tools.arith`: CPU workers "
              "and a", "verifier pool sharing the host's cores.")
    return programs.grpo(programs.Workload(B, R, Lp, Lr, "fp32", oversample), programs.Model(hf=ckpt),
                         reward=programs.Verifier("math"), direct_edges=True, algorithm=algorithm, header=header,
                         cluster=programs.Cluster(1, 1, 2, "cpu", name="cpu2"), plan=HAND_PLAN)


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: str

    @property
    def text(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b if self.op == "+" else self.a - self.b)


def problems(n: int, seed: int, max_operand: int = 9, ops: str = "+") -> list[Problem]:
    rng = random.Random(seed)
    return [Problem(rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)) for _ in range(n)]


def write_dataset(path: str, n: int, seed: int = 0, *, chat: bool = False, max_operand: int = 9, ops: str = "+") -> str:
    """`n` arithmetic prompts with their answers as JSONL; chat=True writes the prompt as one user message; a path
    ending in .parquet gets verl's layout (`verl_row`)."""
    found = problems(n, seed, max_operand, ops)
    if path.endswith(".parquet"):
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.Table.from_pylist([verl_row(p, i) for i, p in enumerate(found)]), path)
        return path
    with open(path, "w", encoding="utf-8") as f:
        for p in found:
            prompt = [{"role": "user", "content": p.text}] if chat else p.text
            f.write(json.dumps({"prompt": prompt, "answer": p.answer, "data_source": "arith"}) + "\n")
    return path


def verl_row(p, index: int) -> dict:
    """A problem as verl's data preprocessing writes a row (e.g. `examples/data_preprocess/gsm8k.py`): the prompt as
    chat messages, the ground truth under `reward_model`, and `extra_info`."""
    return {"data_source": "arith", "prompt": [{"role": "user", "content": p.text}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"split": "train", "index": index}}


def corpus(n: int = 2000, seed: int = 1, max_operand: int = 99) -> list[str]:
    return [f"Q: {p.text}\nA: {p.answer}" for p in problems(n, seed, max_operand, "+-")]


def write_tokenizer(directory: str, vocab_size: int = 64):
    """Train a BPE tokenizer on the arithmetic corpus and save it (with a chat template) in `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=list("0123456789+-=QA:\n"))
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    os.makedirs(directory, exist_ok=True)
    fast.save_pretrained(directory)
    return fast


MODELS = ("llama", "qwen3", "gemma3_text")
# The RL algorithms `make --algorithm` may name: GRPO and its variants (GRPO's graph, the variant paper's settings)
GRPO_ALGORITHMS = tuple(a for a, family in BUILT_IN.items() if family == "grpo")


def gemma3_layer_types(layers: int) -> list[str]:
    """Gemma 3's attention per layer, at a small model's depth: sliding-window and full-attention layers in turn, the
    last one full (Gemma 3 has five sliding-window layers per full one: at 2 layers that would leave no full one)."""
    return ["sliding_attention" if (layers - 1 - i) % 2 else "full_attention" for i in range(layers)]


def write_checkpoint(directory: str, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                     ffn: Optional[int] = None, max_positions: int = 64, seed: int = 0, tie: bool = False,
                     model: str = "llama", head_dim: Optional[int] = None, sliding_window: int = 8,
                     query_pre_attn_scalar: Optional[float] = None) -> str:
    """A randomly initialised Llama (or Qwen3: per-head q/k norms, `head_dim` of its own; or Gemma 3's text model,
    `gemma3_text`: its four norms of 1 + w, q/k norms, the embedding scaled by sqrt(d), a tanh-GELU FFN, the query
    scaled by `query_pre_attn_scalar` (default: head_dim, as Gemma 3 1B-12B), and `gemma3_layer_types`: layers that
    see the last `sliding_window` keys beside full-attention ones) model and the arithmetic tokenizer, saved in
    `directory`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = write_tokenizer(directory)
    head_dim = head_dim or hidden // heads
    gemma = dict(sliding_window=sliding_window, layer_types=gemma3_layer_types(layers),
                 query_pre_attn_scalar=query_pre_attn_scalar or head_dim) if model == "gemma3_text" else {}
    config = AutoConfig.for_model(model, vocab_size=len(tokenizer), hidden_size=hidden,
                                  intermediate_size=ffn or 2 * hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                                  head_dim=head_dim, max_position_embeddings=max_positions,
                                  tie_word_embeddings=tie, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **gemma)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def warm_up(directory: str, steps: int = 100, batch: int = 64, lr: float = 3e-3, seed: int = 0) -> float:
    """A short supervised warm-up of the checkpoint in `directory` on arithmetic problems in the dataset's
    format (the chat template's prompt, then the answer and EOS; the loss on the answer only), saved back in
    place; returns the last batch's loss. It makes a reward the RL run can move: a random model never answers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    examples = []
    for p in problems(4096, seed + 1000):
        prompt = tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                         add_generation_prompt=True)
        examples.append((tok(prompt, add_special_tokens=False)["input_ids"],
                         tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    width = max(len(a) + len(b) for a, b in examples)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        ids = torch.full((batch, width), tok.pad_token_id)
        labels = torch.full((batch, width), -100)
        attention = torch.zeros(batch, width, dtype=torch.long)
        for i, (a, b) in enumerate(rng.sample(examples, batch)):
            n = len(a) + len(b)
            ids[i, :n] = torch.tensor(a + b)
            labels[i, len(a):n] = torch.tensor(b)
            attention[i, :n] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(directory)
    return float(loss.detach())


def greedy_accuracy(directory: str, test_path: str) -> tuple[float, list[tuple[str, str, str]]]:
    """The fraction of the test file's prompts a `transformers` model from `directory` answers right with greedy
    decoding (the math verifier's judgement), and (prompt, answer, truth) of each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rpegc.runtime.backends.torch.rl.rewards import math_answer

    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    rows = [json.loads(line) for line in open(test_path, encoding="utf-8") if line.strip()]
    out, right = [], 0
    for row in rows:
        messages = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        answer = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).strip()
        right += math_answer("arith", answer, row["answer"])["score"] == 1.0
        out.append((messages[-1]["content"], answer, row["answer"]))
    return right / max(1, len(rows)), out


def _check(args) -> int:
    """Held-out greedy accuracy before and after RL, the RL run's accuracy by tens of steps, one answer."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if args.metrics:
        accuracy = [json.loads(line)["accuracy"] for line in open(args.metrics, encoding="utf-8") if line.strip()]
        tens = [sum(accuracy[i:i + 10]) / len(accuracy[i:i + 10]) for i in range(0, len(accuracy), 10)]
        print("RL accuracy of sampled responses, mean per 10 steps: " + " ".join(f"{a:.2f}" for a in tens))
    before, _ = greedy_accuracy(args.before, args.test) if args.before else (None, [])
    after, answers = greedy_accuracy(args.model, args.test)
    print(f"held-out greedy accuracy ({len(answers)} prompts): {after:.2f}"
          + (f" (before RL: {before:.2f})" if before is not None else ""))
    prompt, answer, truth = answers[0]
    print(f"{args.model} (transformers) answers {prompt!r} with {answer!r} (right: {truth!r})")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`arith make DIR`: DIR/ckpt (checkpoint and tokenizer), DIR/train.jsonl, DIR/test.jsonl and DIR/grpo.rpeg; DIR
    must be new or empty (nothing of the user's is overwritten). `arith check MODEL --test FILE`: how well a
    Hugging Face directory (an export) answers, against --before and with the run's --metrics."""
    import argparse
    import sys

    from transformers.utils import logging as hf_logging

    p = argparse.ArgumentParser(prog="python -m rpegc.tools.arith", description=main.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="write a checkpoint, its tokenizer, datasets and a GRPO program")
    make.add_argument("dir")
    make.add_argument("--rows", type=int, default=256, help="training prompts (default 256)")
    make.add_argument("--chat", action="store_true", help="prompts as chat messages (the template applies either way)")
    make.add_argument("--hidden", type=int, default=64)
    make.add_argument("--layers", type=int, default=2)
    make.add_argument("--model", choices=MODELS, default="llama",
                      help="the checkpoint's family: llama (default), qwen3 (per-head q/k norms, head_dim 32) or "
                           "gemma3_text (Gemma 3: head_dim 32, tied embeddings, layers alternating a sliding window "
                           "of 8 keys and full attention)")
    make.add_argument("--algorithm", choices=GRPO_ALGORITHMS, default="grpo",
                      help="the program's rpeg.algorithm: grpo (default) or one of its variants")
    make.add_argument("--oversample", type=int, default=1, metavar="K",
                      help="dynamic sampling: draw K x B prompts per step and train B of them, preferring groups whose "
                           "rewards differ (the workload's oversample; DAPO's; default 1: off)")
    make.add_argument("--warm-up", type=int, default=0, metavar="STEPS",
                      help="supervised warm-up steps (batch 64) so that an RL run's reward can move (default 0)")
    check = sub.add_parser("check", help="greedy accuracy of a Hugging Face directory on a test file")
    check.add_argument("model")
    check.add_argument("--test", required=True)
    check.add_argument("--before", help="the checkpoint before RL, for comparison")
    check.add_argument("--metrics", help="the run's metrics.jsonl: its accuracy by tens of steps")
    args = p.parse_args(argv)
    if args.command == "check":
        try:
            return _check(args)
        except (OSError, ValueError, KeyError) as e:
            print(f"arith: error: {e}", file=sys.stderr)
            return 1
    if os.path.exists(args.dir) and (not os.path.isdir(args.dir) or os.listdir(args.dir)):
        print(f"arith: error: {args.dir} exists and is not an empty directory", file=sys.stderr)
        return 1
    if (args.rows < 1 or args.warm_up < 0 or args.hidden < 4 or args.hidden % 4 or args.layers < 1
            or args.oversample < 1):
        print("arith: error: --rows >= 1, --warm-up >= 0, --layers >= 1, --oversample >= 1 and --hidden a multiple "
              "of 4 (>= 4) are needed", file=sys.stderr)
        return 1
    hf_logging.disable_progress_bar()
    os.makedirs(args.dir, exist_ok=True)
    write_checkpoint(os.path.join(args.dir, "ckpt"), hidden=args.hidden, layers=args.layers, model=args.model,
                     head_dim=32 if args.model in ("qwen3", "gemma3_text") else None,
                     tie=args.model == "gemma3_text")  # Gemma ties its LM head to the embedding
    if args.warm_up > 0:
        loss = warm_up(os.path.join(args.dir, "ckpt"), steps=args.warm_up)
        print(f"warm-up: {args.warm_up} supervised steps, last loss {loss:.3f}")
    write_dataset(os.path.join(args.dir, "train.jsonl"), args.rows, seed=0, chat=args.chat)
    write_dataset(os.path.join(args.dir, "test.jsonl"), 64, seed=1, chat=args.chat)
    with open(os.path.join(args.dir, "grpo.rpeg"), "w", encoding="utf-8") as f:
        f.write(grpo_program(B=8, R=8, Lp=12, Lr=4, ckpt=os.path.join(args.dir, "ckpt"), algorithm=args.algorithm,
                             oversample=args.oversample))
    family = {"llama": "Llama", "qwen3": "Qwen3", "gemma3_text": "Gemma 3"}[args.model]
    print(f"wrote {args.dir}/ckpt ({family}, hidden {args.hidden}, {args.layers} layers, tokenizer), "
          f"{args.dir}/train.jsonl ({args.rows} prompts), {args.dir}/test.jsonl (64) and {args.dir}/grpo.rpeg "
          f"({args.algorithm} with the math verifier on a pool of host processes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
