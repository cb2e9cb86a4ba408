"""The RoPE tables of a Hugging Face checkpoint's config, as `transformers` computes them (read offline)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError


def offline_config(directory: str):
    """`transformers`' config of a local directory (no network, whatever HF_HUB_OFFLINE says)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as e:
        raise RpegError(None, f"transformers cannot read the config of {directory}: {str(e).splitlines()[0]}") from None


@functools.lru_cache(maxsize=16)
def rope_tables(directory: str, max_seq: int) -> tuple[Tensor, Tensor]:
    """cos, sin [max_seq, head_dim] in float32 as `transformers`' own rotary embedding computes them for the
    config's rope type and scaling (attention scaling included), positions 0..max_seq-1."""
    config = offline_config(directory)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(max_seq).unsqueeze(0)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    return cos[0].contiguous(), sin[0].contiguous()
