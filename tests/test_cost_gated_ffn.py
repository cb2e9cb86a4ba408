"""Gated FFNs in the cost model: an architecture with a gate projection (SwiGLU, the Llama
family: `gated = true`, the llama and tiny presets, every HF config) counts three d x d_ff matrices in its
parameters, work and memory; an explicit architecture without it keeps the spec's two, so the spec's worked
example (tests/test_cost_spec.py) and the paper's numbers stay reproducible. The torch backend builds what
is priced: SwiGLU for a gated FFN, GELU for the two-projection one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.memory import buffer_width
from rpegc.core.cost.params import layer_params, param_count
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import Arch
from rpegc.core.cost.work import backbone_flops_per_token
from rpegc.syntax.json_form import program_from_json, program_to_json
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program

SPEC_7B = Arch(layers=32, hidden=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32)


def test_llama2_7b_counts_its_three_ffn_matrices():
    # 32 (4 d^2 + 3 d d_ff + 2 d) + 2 V d + d: transformers' LlamaForCausalLM count of Llama-2 7B
    assert param_count(lookup("llama2-7b"), "policy") == 6_738_415_616
    assert param_count(dataclasses.replace(lookup("llama2-7b"), tied=True, norms=False), "policy") == 6_607_077_376
    assert param_count(SPEC_7B, "policy") == 5_164_236_800  # the spec's Section 8 number
    assert lookup("llama2-7b") == dataclasses.replace(SPEC_7B, gated=True, tied=False, norms=True)
    assert not lookup("gpt3-175b").gated and lookup("tiny").gated


def test_work_and_memory_follow_the_same_count():
    gated = dataclasses.replace(SPEC_7B, gated=True)
    d, f, L = SPEC_7B.hidden, SPEC_7B.ffn, SPEC_7B.layers
    assert layer_params(gated) - layer_params(SPEC_7B) == d * f
    assert backbone_flops_per_token(gated, 128) - backbone_flops_per_token(SPEC_7B, 128) == 2 * L * d * f
    for tp in (1, 2, 8):
        assert buffer_width(gated, tp) == max(2 * d + 6 * d / tp, 2 * d + 3 * f / tp)
        assert buffer_width(SPEC_7B, tp) == max(2 * d + 6 * d / tp, 2 * d + 2 * f / tp)
    assert buffer_width(gated, 1) > buffer_width(SPEC_7B, 1)  # the gated FFN's buffer is the widest here


TEXT = "rpeg.workload {B = 4, R = 1, Lp = 4, Lr = 4, dtype = bf16}\n"


def test_gated_is_written_read_and_overridden():
    p = parse(TEXT + 'rpeg.model @a {layers = 2, hidden = 64, ffn = 128, vocab = 64, heads = 4, gated = true, '
                     'kind = policy}\nrpeg.model @b {arch = "llama2-7b", gated = false, tied = true, norms = false, '
                     'kind = reference}\nrpeg.model @c {arch = "tiny", kind = critic}\n', "g.rpeg")
    assert [m.arch.gated for m in p.models] == [True, False, True]
    assert param_count(p.models[1].arch, "reference") == 5_164_236_800  # the spec's form on a preset
    printed = print_program(p)
    assert "gated = true" in printed.splitlines()[1] and "gated = false" in printed.splitlines()[2]
    assert "gated" not in printed.splitlines()[3]
    assert parse(printed, "again.rpeg").models == p.models
    data = program_to_json(p)
    assert [m["arch"]["gated"] for m in data["models"]] == [True, False, True]
    assert program_from_json(json.loads(json.dumps(data)), "p.json").models == p.models


def test_gated_must_be_a_boolean_and_does_not_mix_with_a_checkpoint(tmp_path):
    with pytest.raises(RpegError, match="'gated' of model @a must be true or false"):
        parse(TEXT + 'rpeg.model @a {arch = "tiny", gated = 3, kind = policy}\n', "g.rpeg")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 50,
        "num_attention_heads": 4, "hidden_act": "silu"}))
    with pytest.raises(RpegError, match="drop gated"):
        parse(TEXT + f'rpeg.model @a {{hf = "{tmp_path / "ckpt"}", gated = true, kind = policy}}\n', "g.rpeg")


def test_the_backend_builds_the_priced_ffn():
    pytest.importorskip("torch")
    from rpegc.runtime.backends.torch.model.transformer import NetOptions, TransformerModel, arch_net

    for gated in (True, False):
        arch = Arch(layers=2, hidden=32, ffn=64, vocab=50, heads=4, kv_heads=4, gated=gated, norms=True)
        model = TransformerModel(arch, "policy", arch_net(arch, NetOptions(max_seq=8)))
        per_layer = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.0."))
        assert per_layer == layer_params(arch)


def test_a_json_arch_without_the_newer_flags_takes_its_presets_or_the_specs():
    """JSON written before qkv_bias, tied and norms existed: a preset's model keeps the preset's network, an explicit
    one the spec's form (what it was priced as then)."""
    p = parse(TEXT + 'rpeg.model @a {arch = "llama2-7b", kind = policy}\n'
                     'rpeg.model @b {layers = 2, hidden = 64, ffn = 128, vocab = 64, heads = 4, kind = policy}\n',
              "o.rpeg")
    data = json.loads(json.dumps(program_to_json(p)))
    for m in data["models"]:
        for flag in ("qkv_bias", "tied", "norms"):
            del m["arch"][flag]
    a, b = program_from_json(data, "old.json").models
    assert a.arch == lookup("llama2-7b") and not a.arch.tied and a.arch.norms
    assert b.arch.tied and not b.arch.norms and not b.arch.qkv_bias


def test_a_checkpoints_tie_word_embeddings_must_be_a_boolean(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 50,
        "num_attention_heads": 4, "hidden_act": "silu", "tie_word_embeddings": "yes"}))
    with pytest.raises(RpegError, match="tie_word_embeddings = 'yes' must be true or false"):
        parse(TEXT + f'rpeg.model @a {{hf = "{tmp_path / "ckpt"}", kind = policy}}\n', "g.rpeg")
