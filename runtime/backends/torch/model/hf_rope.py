"""The RoPE tables of a Hugging Face checkpoint's config, as `transformers` computes them (read offline).

The frequencies come from `transformers`' own RoPE functions (`modeling_rope_utils`) and the tables from the formula
of its rotary embedding modules' forward, without importing a modeling module: `modeling_llama` alone costs about
1.3 s of import in the controller and in every worker. The rope types whose forward re-derives the frequencies from
the sequence length (`dynamic_rope_update`) are built by the module itself."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError, error_line

# rope types whose frequencies depend on the positions asked for (transformers' `dynamic_rope_update`)
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


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
    per_type = getattr(config, "model_type", None) == "gemma3_text"
    try:  # an unknown rope_type or a malformed scaling raises inside transformers
        params = config.rope_parameters[layer_type] if per_type else config.rope_parameters
        if params["rope_type"] in DYNAMIC_ROPE_TYPES:
            return _module_tables(config, max_seq, layer_type if per_type else None)
        inv_freq, scaling = _frequencies(config, params, layer_type if per_type else None)
    except Exception as e:
        raise RpegError(None, f"{directory}: transformers cannot build the rotary embedding of its config (its "
                              f"rope_type and scaling): {error_line(e)}") from None
    # the forward of LlamaRotaryEmbedding and Gemma3RotaryEmbedding
    freqs = torch.arange(max_seq, dtype=torch.float32)[:, None] * inv_freq.to(torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).contiguous(), (emb.sin() * scaling).contiguous()


def _frequencies(config, params: dict, layer_type) -> tuple[Tensor, float]:
    """inv_freq and the attention scaling: the rotary modules' `compute_default_rope_parameters` for the default
    type, `ROPE_INIT_FUNCTIONS` for the others."""
    if params["rope_type"] == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[params["rope_type"]]
    return init(config, layer_type=layer_type) if layer_type is not None else init(config)


def _module_tables(config, max_seq: int, layer_type) -> tuple[Tensor, Tensor]:
    """The tables from the rotary embedding module itself (the dynamic rope types)."""
    x, positions = torch.zeros(1, dtype=torch.float32), torch.arange(max_seq).unsqueeze(0)
    if layer_type is not None:
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

        cos, sin = Gemma3RotaryEmbedding(config)(x, positions, layer_type)
    else:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        cos, sin = LlamaRotaryEmbedding(config)(x, positions)
    return cos[0].contiguous(), sin[0].contiguous()
