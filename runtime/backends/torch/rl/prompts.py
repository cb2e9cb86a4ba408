"""A run's prompt source: a dataset file (datasets.py) or a built-in toy task (tasks.py)."""

from __future__ import annotations

from rpegc.runtime.backends.torch.rl.datasets import DataConfig, PromptDataset, load_tokenizer
from rpegc.runtime.backends.torch.rl.tasks import make_task


def open_prompts(cfg: DataConfig, task: str, vocab: int, prompt_len: int, response_len: int, pairs: bool = False):
    """The run's prompt source: the dataset file of `cfg`, or the built-in toy `task` (tasks.py). Both give
    `batch(B, seed, step)` and the `eos_id` / `pad_id` generation uses; with `pairs` (DPO) also
    `pairs(B, seed, step)`, the preference pairs of a step."""
    if cfg.path is None:
        return make_task(task, vocab, prompt_len, response_len)
    assert cfg.tokenizer is not None, "config_from_program resolves the tokenizer directory"
    return PromptDataset(cfg, load_tokenizer(cfg.tokenizer), prompt_len, vocab, response_len if pairs else None)
