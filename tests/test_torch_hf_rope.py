"""The RoPE tables of a checkpoint's config are those of transformers' own rotary embedding modules, bit for bit, for
every rope type: hf_rope computes them from transformers' RoPE functions without importing a modeling module."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.runtime.backends.torch.model.hf_rope import rope_tables  # noqa: E402

POSITIONS = 40
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},  # built by the module (its frequencies follow the length)
}


def _saved(config, tmp_path) -> str:
    config.save_pretrained(tmp_path)
    rope_tables.cache_clear()
    return str(tmp_path)


@pytest.mark.parametrize("rope", sorted(SCALINGS))
def test_llama_tables_are_the_rotary_modules(rope, tmp_path):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    # max_position_embeddings below POSITIONS: the dynamic type rescales its frequencies for the longer sequence
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rope_scaling=SCALINGS[rope],
                         max_position_embeddings=128 if rope == "yarn" else 32)
    directory = _saved(config, tmp_path)
    cos, sin = rope_tables(directory, POSITIONS)
    want_cos, want_sin = LlamaRotaryEmbedding(transformers.AutoConfig.from_pretrained(directory))(
        torch.zeros(1), torch.arange(POSITIONS).unsqueeze(0))
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


@pytest.mark.parametrize("layer_type", ["full_attention", "sliding_attention"])
def test_gemma3_tables_per_layer_type_are_the_rotary_modules(layer_type, tmp_path):
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    directory = _saved(Gemma3TextConfig(hidden_size=64, num_attention_heads=4, head_dim=16, num_key_value_heads=2),
                       tmp_path)
    cos, sin = rope_tables(directory, POSITIONS, layer_type)
    want_cos, want_sin = Gemma3RotaryEmbedding(transformers.AutoConfig.from_pretrained(directory))(
        torch.zeros(1), torch.arange(POSITIONS).unsqueeze(0), layer_type)
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


def test_qwen3_head_dim_wider_than_hidden_over_heads(tmp_path):
    from transformers import Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    directory = _saved(Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=32, num_key_value_heads=2), tmp_path)
    cos, _ = rope_tables(directory, POSITIONS)
    assert cos.shape == (POSITIONS, 32)
    want, _ = LlamaRotaryEmbedding(transformers.AutoConfig.from_pretrained(directory))(
        torch.zeros(1), torch.arange(POSITIONS).unsqueeze(0))
    assert torch.equal(cos, want[0])


def test_an_unknown_rope_type_is_a_located_error(tmp_path):
    import json

    from transformers import LlamaConfig

    directory = _saved(LlamaConfig(hidden_size=64, num_attention_heads=4), tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["rope_scaling"] = {"rope_type": "no-such-rope", "factor": 2.0}
    path.write_text(json.dumps(config))
    with pytest.raises(RpegError, match=str(tmp_path)):
        rope_tables(directory, POSITIONS)
