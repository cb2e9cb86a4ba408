"""The RoPE tables of a Hugging Face checkpoint's config, as `transformers` computes them (read offline)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError, error_line


def offline_config(directory: str):
    """`transformers`' config of a local directory (no network, whatever HF_HUB_OFFLINE says)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # OSError, ValueError, and what a value of the wrong type raises inside transformers
        raise RpegError(None, f"transformers cannot read the config of {directory}: {error_line(e)}") from None


@functools.lru_cache(maxsize=16)
def rope_tables(directory: str, max_seq: int, layer_type: str = "full_attention") -> tuple[Tensor, Tensor]:
    """cos, sin [max_seq, head_dim] in float32 as `transformers`' own rotary embedding computes them for the
    config's rope type and scaling (attention scaling included), positions 0..max_seq-1; for a config with RoPE
    parameters per layer type (Gemma 3), those of `layer_type`."""
    config = offline_config(directory)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    try:  # an unknown rope_type or a malformed scaling raises inside transformers
        if getattr(config, "model_type", None) == "gemma3_text":
            from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

            rotary = Gemma3RotaryEmbedding(config)
            cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(max_seq).unsqueeze(0), layer_type)
            return cos[0].contiguous(), sin[0].contiguous()
        rotary = LlamaRotaryEmbedding(config)
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(max_seq).unsqueeze(0))
    except Exception as e:
        raise RpegError(None, f"{directory}: transformers cannot build the rotary embedding of its config (its "
                              f"rope_type and scaling): {error_line(e)}") from None
    return cos[0].contiguous(), sin[0].contiguous()
