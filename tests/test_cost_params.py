"""Exact shapes (issue 32, item 4): N_m is `transformers`' `num_parameters()` for every supported config (Llama,
Mistral, Qwen2, Qwen3; grouped-query attention, tied or untied LM head, Qwen2's q/k/v biases, Qwen3's q/k norms and a
head_dim other than hidden / heads), W_shard at one stage is what
the torch backend holds, and work counts grouped-query projections as 2 d^2 + 2 d d_kv."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpegc.core.cost.memory import weight_shard
from rpegc.core.cost.params import attention_params, layer_gemm_params, param_count
from rpegc.core.cost.work import backbone_flops_per_token
from rpegc.core.ir.hf_config import arch_of_config
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import MODEL_KINDS, Arch

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


@st.composite
def hf_configs(draw) -> dict:
    """A small random config of a supported model type (sizes that build in milliseconds)."""
    head_dim = draw(st.sampled_from((4, 8, 16)))
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 4))
    model_type = draw(st.sampled_from(MODEL_TYPES))
    extra = {}
    if model_type in ("qwen3", "gemma3_text"):  # a head dimension of its own, often not hidden / heads
        extra["head_dim"] = draw(st.sampled_from((4, 8, 16)))
    return dict(model_type=model_type, hidden_size=heads * head_dim, **extra,
                num_attention_heads=heads, num_key_value_heads=kv_heads,
                intermediate_size=draw(st.integers(1, 96)), num_hidden_layers=draw(st.integers(1, 3)),
                vocab_size=draw(st.integers(2, 300)), tie_word_embeddings=draw(st.booleans()))


def transformers_model(config: dict):
    transformers = pytest.importorskip("transformers")
    kinds = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
             "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
             "gemma3_text": transformers.Gemma3TextConfig}
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf = kinds[config["model_type"]](**fields, hidden_act="silu")
    classes = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
               "qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
               "gemma3_text": transformers.Gemma3ForCausalLM}
    return classes[config["model_type"]](hf), hf


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hf_configs())
def test_n_m_is_transformers_parameter_count(config):
    model, hf = transformers_model(config)
    arch = arch_of_config(hf.to_dict(), "config.json")
    assert arch.qkv_bias == (config["model_type"] == "qwen2")
    assert arch.qk_norm == (config["model_type"] in ("qwen3", "gemma3_text"))
    assert arch.post_norms == (config["model_type"] == "gemma3_text")
    assert arch.head_dim == config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    assert arch.tied == config["tie_word_embeddings"]
    assert param_count(arch, "policy") == model.num_parameters()
    assert param_count(arch, "reference") == model.num_parameters()


def test_a_sequence_classification_checkpoint_counts_its_score_head():
    """A reward model from LlamaForSequenceClassification (one label): the backbone and a d-wide score head."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, num_labels=1)
    model = transformers.LlamaForSequenceClassification(hf)
    assert param_count(arch_of_config(hf.to_dict(), "config.json"), "reward") == model.num_parameters()


@st.composite
def archs(draw) -> Arch:
    head_dim = draw(st.sampled_from((2, 4, 8)))
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 3))
    return Arch(layers=draw(st.integers(1, 3)), hidden=heads * head_dim, ffn=draw(st.integers(1, 40)),
                vocab=draw(st.integers(2, 80)), heads=heads, kv_heads=kv_heads, gated=draw(st.booleans()),
                qkv_bias=draw(st.booleans()), tied=draw(st.booleans()), norms=True, qk_norm=draw(st.booleans()),
                post_norms=draw(st.booleans()),
                head_size=draw(st.sampled_from((0, 2, 6))))


@settings(max_examples=40, deadline=None)
@given(archs(), st.sampled_from(MODEL_KINDS))
def test_one_stage_holds_what_the_backend_builds(arch, kind):
    """W_shard at pp = tp = 1 is every parameter of the backend's model: it keeps a separate LM head even for a
    tied checkpoint (both train), and its value head has a bias (one parameter beyond the count)."""
    pytest.importorskip("torch")
    from rpegc.runtime.backends.torch.model.transformer import NetOptions, TransformerModel, arch_net

    net = dataclasses.replace(arch_net(arch, NetOptions(max_seq=4)), qkv_bias=arch.qkv_bias)
    model = TransformerModel(arch, kind, net)
    held = sum(p.numel() for p in model.parameters())
    value_bias = 1 if model.value_head is not None else 0
    assert held == weight_shard(arch, kind, 1, 1) + value_bias
    if not arch.tied:
        assert held == param_count(arch, kind) + value_bias


def test_grouped_query_projections_are_priced_at_their_width():
    """Llama 3.1 8B (8 KV heads of 32): attention is 2 d^2 + 2 d d_kv, not 4 d^2, and it has 8.03B parameters."""
    arch = lookup("llama3.1-8b")
    d = arch.hidden
    assert attention_params(arch) == 2 * d * d + 2 * d * 1024
    assert param_count(arch, "policy") == 8_030_261_248
    mha = dataclasses.replace(arch, kv_heads=arch.heads)
    saved = attention_params(mha) - attention_params(arch)
    assert backbone_flops_per_token(mha, 100) - backbone_flops_per_token(arch, 100) == 2 * arch.layers * saved
    assert layer_gemm_params(mha) - layer_gemm_params(arch) == saved


def test_tensor_parallelism_shards_projections_and_biases_but_not_norms():
    arch = Arch(layers=4, hidden=64, ffn=96, vocab=100, heads=8, kv_heads=4, gated=True, qkv_bias=True, tied=False,
                norms=True)
    sharded = layer_gemm_params(arch) + 64 + 2 * 32  # projections and the q, k, v biases
    for pp, tp in ((1, 1), (2, 2), (4, 4)):
        stage = 4 // pp * (sharded / tp + 2 * 64)
        ends = 100 * 64 + 100 * 64 + 64 if pp == 1 else 100 * 64 + 64  # embedding; LM head and final norm
        assert weight_shard(arch, "policy", pp, tp) == stage + ends
