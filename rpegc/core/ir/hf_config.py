"""The architecture of a Hugging Face checkpoint directory, as the compiler sees it (issue 15, item 1).

A `.rpeg` model may name a local directory (`rpeg.model @actor {hf = "ckpt/model", kind = policy}`) holding
a `config.json` and `*.safetensors`; its shape (layers, hidden, ffn, vocab, heads, kv_heads) is read from
`config.json` here, so the cost model (paper Sec. V) prices the real model. The torch backend reads the
rest (RoPE theta and scaling, norm epsilon, tied embeddings) through `transformers`
(runtime/backends/torch/model/hf.py); the compiler reads plain JSON and needs no `transformers`.

Supported: the Llama family of decoder-only transformers as the backend builds them (RMSNorm, RoPE with
rotate-half, grouped-query attention, a gated SiLU FFN, no biases but Qwen2's on the query, key and value
projections): `model_type` llama, mistral (no sliding window shorter than the sequence: checked by the
backend), qwen2, qwen3 (an RMSNorm over each head's query and key; a `head_dim` other than hidden / heads; every
layer full attention) or gemma3_text (Gemma 3's text model: q/k norms, norms after the attention and the FFN as well
as before, weights applied as 1 + w, the embedding scaled by sqrt(d), a gated tanh-GELU FFN, the query scaled by
query_pre_attn_scalar, sliding-window and full-attention layers with their own RoPE; no logit soft-capping).
Anything else is an error naming the field. A relative path is taken from the current directory, like any file argument.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Optional

from rpegc.core.ir.errors import Loc, RpegError, error_line
from rpegc.core.ir.program import Arch

CONFIG = "config.json"
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
QK_NORM_TYPES = ("qwen3", "gemma3_text")  # an RMSNorm over each head's query and key
GEMMA_TYPES = ("gemma3_text",)  # Gemma's block (module docstring)
LAYER_TYPES = {"gemma3_text": ("full_attention", "sliding_attention")}  # default: full attention only
# field -> (what the backend builds, the values it accepts); a config with another value is refused
FIXED_FIELDS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "hidden_act": ("a gated SiLU FFN", ("silu",)),
    "attention_bias": ("attention without biases", (False, None)),
    "mlp_bias": ("an FFN without biases", (False, None)),
    "use_sliding_window": ("full attention", (False, None)),
    "pretraining_tp": ("unsliced projections", (1, None)),
}
# Gemma's own fields: the FFN's activation is `hidden_activation`, and the soft-capping rpegc does not build
GEMMA_FIXED_FIELDS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "hidden_activation": ("a gated tanh-GELU FFN", ("gelu_pytorch_tanh",)),
    "attention_bias": ("attention without biases", (False, None)),
    "attn_logit_softcapping": ("attention without logit soft-capping", (None,)),
    "final_logit_softcapping": ("an LM head without logit soft-capping", (None,)),
    "use_bidirectional_attention": ("causal attention", (False, None)),
}
MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; refuse to read a device or a huge file
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "num_attention_heads")


def hf_config_path(directory: str) -> str:
    return os.path.join(directory, CONFIG)


def read_hf_config(directory: str, loc: Optional[Loc] = None) -> dict:
    """The parsed config.json of `directory`; a located error when it is missing or not a JSON object."""
    path = hf_config_path(directory)
    if not os.path.isdir(directory):
        raise RpegError(loc, f"hf = \"{directory}\" is not a directory (a Hugging Face checkpoint directory "
                             f"with {CONFIG} and *.safetensors)")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            raise RpegError(loc, f"{path} is not a regular file of at most {MAX_CONFIG_BYTES >> 20} MiB")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise RpegError(loc, f"{path} does not exist: hf = \"...\" names a checkpoint directory with {CONFIG}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RpegError(loc, f"cannot read {path}: {error_line(e)}") from None
    if not isinstance(config, dict):
        raise RpegError(loc, f"{path} is not a JSON object")
    return config


def check_supported(config: dict, path: str, loc: Optional[Loc] = None) -> None:
    """Refuse what the backend cannot build, naming the field and its value."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise RpegError(loc, f"{path}: model_type {model_type!r} is not supported; rpegc builds the Llama family "
                             f"({', '.join(SUPPORTED_TYPES)})")
    fixed = GEMMA_FIXED_FIELDS if model_type in GEMMA_TYPES else FIXED_FIELDS
    for key, (what, accepted) in fixed.items():
        value = config.get(key)
        if value not in accepted:
            said = f"{key} = {value!r} is not supported" if key in config else f"{key} is missing"
            raise RpegError(loc, f"{path}: {said}; rpegc builds {what} ({key} = {accepted[0]!r})")
    eps = config.get("rms_norm_eps", 1e-6)
    # a number in (0, 1): RMSNorm divides by sqrt(mean square + eps), so eps <= 0 divides by zero (NaN) on a zero row
    if type(eps) not in (int, float) or not 0 < eps < 1:
        raise RpegError(loc, f"{path}: rms_norm_eps = {eps!r} must be a number in (0, 1)")
    window = config.get("sliding_window")
    if window is not None and (type(window) is not int or window < 1):
        raise RpegError(loc, f"{path}: sliding_window = {window!r} must be a positive integer or null")
    head_dim = config.get("head_dim")
    if head_dim is not None and (type(head_dim) is not int or head_dim < 1):
        raise RpegError(loc, f"{path}: head_dim = {head_dim!r} must be a positive integer or null")
    layer_types = config.get("layer_types")
    allowed = LAYER_TYPES.get(model_type, ("full_attention",))
    if layer_types is not None and (not isinstance(layer_types, list) or any(t not in allowed for t in layer_types)):
        raise RpegError(loc, f"{path}: layer_types = {layer_types!r} is not supported; rpegc builds "
                             + " and ".join(f'"{t}"' for t in allowed) + " layers")
    scalar = config.get("query_pre_attn_scalar")
    if model_type in GEMMA_TYPES and (type(scalar) not in (int, float) or not 0 < scalar < 1e12):
        raise RpegError(loc, f"{path}: query_pre_attn_scalar = {scalar!r} must be a positive number")


def arch_of_config(config: dict, path: str, loc: Optional[Loc] = None) -> Arch:
    """The Arch of a supported config (kv_heads defaults to the heads, as in transformers), with what its network
    has beyond [PF]'s count: RMSNorm weights, Qwen2's q/k/v biases, an untied LM head unless tie_word_embeddings."""
    check_supported(config, path, loc)
    missing = [k for k in SHAPE_KEYS if k not in config]
    if missing:
        raise RpegError(loc, f"{path} lacks {', '.join(missing)}")
    values = {k: config[k] for k in SHAPE_KEYS}
    values["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    bad = [f"{k} = {v!r}" for k, v in values.items() if type(v) is not int or v < 1]
    if bad:
        raise RpegError(loc, f"{path}: {', '.join(bad)} must be positive integers")
    # transformers' default: untied for the Llama family, tied for Gemma
    tied = config.get("tie_word_embeddings", config.get("model_type") in GEMMA_TYPES)
    if not isinstance(tied, bool):
        raise RpegError(loc, f"{path}: tie_word_embeddings = {tied!r} must be true or false")
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    if heads % values["num_key_value_heads"]:
        raise RpegError(loc, f"{path}: num_attention_heads = {heads} is not a multiple of num_key_value_heads = "
                             f"{values['num_key_value_heads']}")
    return Arch(layers=values["num_hidden_layers"], hidden=hidden, ffn=values["intermediate_size"],
                vocab=values["vocab_size"], heads=heads, kv_heads=values["num_key_value_heads"], gated=True,
                qkv_bias=config["model_type"] == "qwen2", tied=tied, norms=True,
                qk_norm=config["model_type"] in QK_NORM_TYPES, post_norms=config["model_type"] in GEMMA_TYPES,
                head_size=0 if head_dim * heads == hidden else head_dim)


def hf_arch(directory: str, loc: Optional[Loc] = None) -> Arch:
    """The Arch of the checkpoint directory `directory`."""
    return arch_of_config(read_hf_config(directory, loc), hf_config_path(directory), loc)
