"""Hugging Face checkpoints (rpegc/core/ir/hf_config.py, runtime/backends/torch/model/hf.py):
`hf = "DIR"` reads the architecture from config.json, the backend's model built from DIR gives the logits
of `transformers`' own model, greedy decoding with the backend's KV cache gives `generate`'s tokens, each
rank of every layout reads exactly its slices, and tp/pp ranks reproduce `transformers`' logits.

Tolerances: both sides compute in float32 with different kernels and summation orders (GQA by
repeat_interleave here, repeat_kv there; the RoPE tables are `transformers`' own). A logit is a dot
product over `hidden` terms after L blocks of the same; with u = 2^-24 and |terms| = O(1), the rounding
difference stays near L * sqrt(hidden) * u * max|logit| ~ 4 * 8 * 6e-8 * 3 < 1e-5, so 1e-4 (the issue's
bound) leaves an order of magnitude; under TP the partial sums are added in another order, same bound.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.hf_config import hf_arch  # noqa: E402
from rpegc.runtime.backends.torch.model.hf import HFWeights, hf_net, initial_model  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import NetOptions, TransformerModel, export_weights  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import param_shapes  # noqa: E402
from rpegc.runtime.backends.torch.parallel.parallel_model import shard_of  # noqa: E402
from rpegc.syntax.parser import parse  # noqa: E402
from fixtures.torch_runs import LOGIT_ATOL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SEQ = 24

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             max_position_embeddings=64)
CONFIGS = {
    "llama-gqa": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-tied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3-rope-scaling": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": ("mistral", dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),  # q/k/v biases
    # per-head q/k norms and a head dimension (24) that is not hidden / heads (16)
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
    # Gemma 3: norms after the sub-layers too (1 + w), the embedding scaled, tanh-GELU gates, q/k norms, a query
    # scale of its own, and sliding-window layers (a window of 6 keys, shorter than the sequences) with their own RoPE
    "gemma3": ("gemma3_text", dict(num_key_value_heads=2, head_dim=24, sliding_window=6, query_pre_attn_scalar=32,
                                   layer_types=["sliding_attention", "full_attention"] * 2, tie_word_embeddings=True,
                                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 1e4}})),
}


def make_checkpoint(directory: str, name: str, seed: int = 0) -> str:
    model_type, extra = CONFIGS[name]
    config = transformers.AutoConfig.for_model(model_type, **SHAPE, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms away from 1, biases away from 0 and sharp attention, so that a missing
        for n, p in model.named_parameters():  # weight, a wrong position or a wrong mask shows in the logits
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            elif n.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    path = os.path.join(directory, name)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf"))
    return {name: make_checkpoint(d, name, seed=i) for i, name in enumerate(CONFIGS)}


def backend_model(path: str, kind: str = "policy") -> TransformerModel:
    """Version 0 as the single-process reference builds it (a worker's pieces are compared with it below)."""
    return initial_model(hf_arch(path), kind, 0, path, NetOptions(max_seq=MAX_SEQ)).eval()


def hf_model(path: str):
    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def tokens(vocab: int, b: int = 3, t: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# -- the compiler's view ----------------------------------------------------------------------------

def test_an_hf_model_takes_its_architecture_from_config_json(checkpoints):
    path = checkpoints["llama-gqa"]
    text = (f'rpeg.workload {{B = 4, R = 1, Lp = 4, Lr = 4, dtype = fp32}}\n'
            f'rpeg.model @actor {{hf = "{path}", kind = policy, trainable}}\n')
    m = parse(text, "hf.rpeg").models[0]
    assert m.hf == path
    assert (m.arch.layers, m.arch.hidden, m.arch.ffn, m.arch.vocab, m.arch.heads, m.arch.kv_heads) == (4, 64, 128, 96, 4, 2)


def _config_error(tmp_path, **changes) -> str:
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
              "vocab_size": 50, "num_attention_heads": 4, "hidden_act": "silu", **changes}
    (d / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))
    with pytest.raises(RpegError) as e:
        hf_arch(str(d))
    return e.value.message


@pytest.mark.parametrize("changes,match", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias = True is not supported"),
    ({"mlp_bias": True}, "mlp_bias = True"),
    ({"head_dim": 0}, "head_dim = 0 must be a positive integer or null"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]},
     "layer_types = ['full_attention', 'sliding_attention'] is not supported; rpegc builds \"full_attention\" layers"),
    ({"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16,
      "final_logit_softcapping": 30.0}, "final_logit_softcapping = 30.0 is not supported"),
    ({"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": "16"},
     "query_pre_attn_scalar = '16' must be a positive number"),
    ({"hidden_size": ...}, "lacks hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers = 0 must be"),
    # values that trained NaN or raised inside transformers (issue 33, items 2 and 3)
    ({"rms_norm_eps": -1}, "rms_norm_eps = -1 must be a number in (0, 1)"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps = nan must be a number in (0, 1)"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps = '1e-6' must be a number in (0, 1)"),
    ({"rms_norm_eps": True}, "rms_norm_eps = True must be"),
    ({"sliding_window": "4096"}, "sliding_window = '4096' must be a positive integer or null"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings = 'false' must be true or false"),
])
def test_unsupported_or_malformed_configs_name_the_field(tmp_path, changes, match):
    assert match in _config_error(tmp_path, **changes)


def test_a_missing_directory_and_a_broken_config_are_located_errors(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    for directory, match in (("nowhere", "is not a directory"), (str(tmp_path / "bad"), "cannot read")):
        src = tmp_path / "m.rpeg"
        src.write_text(f'rpeg.workload {{B = 4, R = 1, Lp = 4, Lr = 4, dtype = fp32}}\n'
                       f'rpeg.model @actor {{hf = "{directory}", kind = policy}}\n')
        proc = subprocess.run([sys.executable, "-m", "rpegc.cli", str(src), "-p", "verify-wellformed"],
                              capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 1 and "m.rpeg:2:" in proc.stderr and match in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    d = tmp_path / "fifo"
    d.mkdir()
    os.mkfifo(d / "config.json")  # reading it would block forever
    with pytest.raises(RpegError, match="is not a regular file"):
        hf_arch(str(d))


def test_hf_and_an_explicit_architecture_do_not_mix(checkpoints):
    text = (f'rpeg.workload {{B = 4, R = 1, Lp = 4, Lr = 4, dtype = fp32}}\n'
            f'rpeg.model @actor {{hf = "{checkpoints["llama-gqa"]}", layers = 2, kind = policy}}\n')
    with pytest.raises(RpegError, match="drop layers"):
        parse(text, "hf.rpeg")


def test_printing_and_the_json_form_keep_the_checkpoint(checkpoints, tmp_path):
    from rpegc.syntax.json_form import program_from_json, program_to_json
    from rpegc.syntax.printer import print_program

    path = checkpoints["llama-tied"]
    text = (f'rpeg.workload {{B = 4, R = 1, Lp = 4, Lr = 4, dtype = fp32}}\n'
            f'rpeg.model @actor {{hf = "{path}", kind = policy, trainable}}\n')
    p = parse(text, "hf.rpeg")
    printed = print_program(p)
    assert f'hf = "{path}"' in printed and "layers" not in printed
    assert parse(printed, "again.rpeg").models == p.models
    assert program_from_json(program_to_json(p), "p.json").models[0].hf == path


# -- numerics against transformers ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name):
    path = checkpoints[name]
    ours, theirs = backend_model(path), hf_model(path)
    x = tokens(SHAPE["vocab_size"])
    with torch.no_grad():
        mine = ours(x).logits
        ref = theirs(x).logits
    assert mine.shape == ref.shape
    torch.testing.assert_close(mine, ref, rtol=0, atol=LOGIT_ATOL)


@pytest.mark.parametrize("name", ["llama-gqa", "llama3-rope-scaling", "qwen3", "gemma3"])
def test_greedy_decoding_with_the_kv_cache_gives_generates_tokens(checkpoints, name):
    """Decoding `generate`'s own tokens through the backend's KV cache: each step's logits equal
    `transformers`' logits at that position (so cache and positions are right), and each step's argmax is
    the token `generate` chose unless the two best logits lie within the logit tolerance (a near-tie may
    break the other way on another CPU's kernels)."""
    path = checkpoints[name]
    ours, theirs = backend_model(path), hf_model(path)
    prompt = tokens(SHAPE["vocab_size"], b=2, t=5, seed=3)
    new = 12
    with torch.no_grad():
        ref = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                              min_new_tokens=new, pad_token_id=0, eos_token_id=None)[:, prompt.shape[1]:]
        expected = theirs(torch.cat([prompt, ref], dim=1)).logits[:, prompt.shape[1] - 1:-1]
        cache = ours.new_cache(prompt.shape[0], prompt.shape[1] + new)
        logits = ours(prompt, cache).logits[:, -1]
        for t in range(new):
            torch.testing.assert_close(logits, expected[:, t], rtol=0, atol=LOGIT_ATOL)
            chosen = ref[:, t]
            gap = logits.max(-1).values - logits.gather(-1, chosen[:, None]).squeeze(-1)
            assert torch.all((logits.argmax(-1) == chosen) | (gap < 2 * LOGIT_ATOL)), (t, gap)
            logits = ours(chosen.unsqueeze(-1), cache).logits[:, -1]


def test_log_probs_of_given_sequences_equal_transformers(checkpoints):
    path = checkpoints["mistral"]
    ours, theirs = backend_model(path), hf_model(path)
    x = tokens(SHAPE["vocab_size"], b=4, t=16, seed=5)
    with torch.no_grad():
        mine = torch.log_softmax(ours(x).logits[:, :-1], -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        ref = torch.log_softmax(theirs(x).logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(mine, ref, rtol=0, atol=2 * LOGIT_ATOL)  # log_softmax adds one more rounding


def _left_padded(vocab: int, lengths: list[int], width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of `lengths` real tokens left-padded to `width` with a token the model may well attend to
    (not 0), and their pad counts."""
    x = tokens(vocab, b=len(lengths), t=width, seed=seed)
    pads = torch.tensor([width - n for n in lengths])
    for i, p in enumerate(pads.tolist()):
        x[i, :p] = 7
    return x, pads


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2", "qwen3", "gemma3"])
def test_left_padded_prompts_give_the_logits_transformers_gives_with_its_attention_mask(checkpoints, name):
    """A batch of prompts of different lengths, left-padded (as verl and `generate` batch them): at every
    real position the logits equal `transformers`' with the attention mask and the positions it derives
    from it (cumsum - 1); and each row's logits equal the same prompt run alone without padding."""
    path = checkpoints[name]
    ours, theirs = backend_model(path), hf_model(path)
    x, pads = _left_padded(SHAPE["vocab_size"], [11, 4, 8, 1], 11, seed=7)
    attn = (torch.arange(11).unsqueeze(0) >= pads.unsqueeze(1)).long()
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        mine = ours(x, pads=pads).logits
        ref = theirs(x, attention_mask=attn, position_ids=positions).logits
        for i, p in enumerate(pads.tolist()):
            torch.testing.assert_close(mine[i, p:], ref[i, p:], rtol=0, atol=LOGIT_ATOL)
            alone = ours(x[i:i + 1, p:]).logits[0]
            torch.testing.assert_close(mine[i, p:], alone, rtol=0, atol=LOGIT_ATOL)
    assert torch.isfinite(mine).all()  # pad queries see themselves: no NaN from an empty softmax


def test_greedy_decoding_of_left_padded_prompts_follows_generate(checkpoints):
    """`generate` with a left-padded batch and its attention mask; the backend's KV cache with `pads`
    decodes the same tokens (each step's logits within the tolerance, argmax equal unless a near-tie)."""
    path = checkpoints["llama-gqa"]
    ours, theirs = backend_model(path), hf_model(path)
    x, pads = _left_padded(SHAPE["vocab_size"], [6, 2, 4], 6, seed=9)
    attn = (torch.arange(6).unsqueeze(0) >= pads.unsqueeze(1)).long()
    new = 8
    with torch.no_grad():
        ref = theirs.generate(x, attention_mask=attn, max_new_tokens=new, do_sample=False, min_new_tokens=new,
                              pad_token_id=7, eos_token_id=None)[:, x.shape[1]:]
        cache = ours.new_cache(x.shape[0], x.shape[1] + new)
        logits = ours(x, cache, pads).logits[:, -1]
        for t in range(new):
            chosen = ref[:, t]
            gap = logits.max(-1).values - logits.gather(-1, chosen[:, None]).squeeze(-1)
            assert torch.all((logits.argmax(-1) == chosen) | (gap < 2 * LOGIT_ATOL)), (t, gap)
            logits = ours(chosen.unsqueeze(-1), cache, pads).logits[:, -1]


# -- each rank reads only its slices, on every layout ----------------------------------------------

LAYOUTS = [Layout((0, 1), 2, 1, 1), Layout((0, 1), 1, 1, 2), Layout((0, 1), 1, 2, 1), Layout((0, 1, 2, 3), 1, 2, 2),
           Layout((0, 1, 2, 3), 2, 1, 2)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda L: L.short())
@pytest.mark.parametrize("kind,name", [("policy", "llama-gqa"), ("critic", "llama-gqa"), ("policy", "qwen2"),
                                       ("policy", "qwen3"), ("policy", "gemma3")])
def test_every_rank_reads_exactly_its_pieces(checkpoints, layout, kind, name):
    path = checkpoints[name]
    arch = hf_arch(path)
    net = hf_net(path, NetOptions(max_seq=MAX_SEQ))
    shapes = param_shapes(arch, kind, net)
    weights = HFWeights(path, kind, 0, net)
    full = export_weights(backend_model(path, kind))  # the reference's version 0, value head included
    for r in layout.ranks:
        mine = weights.pieces(shapes, layout, r)
        expected = shard_of(full, shapes, layout, r, arch.layers)
        assert mine.keys() == expected.keys()
        for n in mine:
            assert torch.equal(mine[n], expected[n]), (layout.short(), r, n)


def test_a_critic_takes_its_value_head_from_a_sequence_classification_checkpoint(tmp_path):
    config = transformers.AutoConfig.for_model("llama", **SHAPE, num_key_value_heads=2, num_labels=1)
    torch.manual_seed(4)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    path = str(tmp_path / "rm")
    model.save_pretrained(path)
    net = hf_net(path, NetOptions(max_seq=MAX_SEQ))
    w = HFWeights(path, "reward", 0, net).full(param_shapes(hf_arch(path), "reward", net))
    assert torch.equal(w["value_head.weight"], model.score.weight.detach())
    assert torch.equal(w["value_head.bias"], torch.zeros(1))
    assert torch.equal(w["layers.0.attn.wq.weight"], model.model.layers[0].self_attn.q_proj.weight.detach())


# -- tp and pp ranks reproduce transformers ---------------------------------------------------------

def _ranks_forward(rank: int, world: int, init: str, path: str, pp: int, tp: int, out: str, impl: str) -> None:
    import torch.distributed as dist

    from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, ProcessGroups
    from rpegc.runtime.backends.torch.parallel.schedules import infer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    layout = Layout(tuple(range(world)), 1, pp, tp)
    arch = hf_arch(path)
    net = hf_net(path, NetOptions(max_seq=MAX_SEQ))
    pm = ParallelModel(arch, "policy", net, layout, rank, ProcessGroups([layout]), impl)
    pm.load(HFWeights(path, "policy", 0, net).pieces(param_shapes(arch, "policy", net), layout, rank))
    x = tokens(arch.vocab)
    logits = infer(pm, [lambda view: view(x).logits], [x.shape[0]])
    if rank == 0:
        torch.save(logits, out)
    # Ends as a torch worker does (worker/process.py): a hard exit, without tearing gloo and megatron down. With the
    # polite ending a rank aborted twice in about twenty runs ("terminate called without an active exception").
    os._exit(0)


@pytest.mark.parametrize("name,pp,tp,impl", [("llama-gqa", 1, 2, "torch"), ("llama-gqa", 2, 1, "torch"),
                                             ("qwen2", 1, 2, "torch"), ("qwen2", 1, 2, "megatron"),
                                             ("qwen3", 1, 2, "torch"), ("gemma3", 2, 1, "torch"),
                                             ("gemma3", 1, 2, "megatron")],
                         ids=["tp2", "pp2", "qwen2-tp2", "qwen2-tp2-megatron", "qwen3-tp2", "gemma3-pp2",
                              "gemma3-tp2-megatron"])
def test_tensor_and_pipeline_parallel_ranks_give_transformers_logits(checkpoints, tmp_path, name, pp, tp, impl):
    import torch.multiprocessing as mp

    if impl == "megatron":
        mc = pytest.importorskip("rpegc.runtime.backends.torch.parallel.megatron_compat")
        if mc.load()[0] is None:
            pytest.skip(mc.load()[1])
    path = checkpoints[name]
    out = str(tmp_path / "logits.pt")
    mp.spawn(_ranks_forward, args=(2, f"file://{tmp_path / 'init'}", path, pp, tp, out, impl), nprocs=2)
    with torch.no_grad():
        ref = hf_model(path)(tokens(SHAPE["vocab_size"])).logits
    torch.testing.assert_close(torch.load(out), ref, rtol=0, atol=LOGIT_ATOL)


def test_a_checkpoint_weight_holding_nan_or_infinity_is_refused_when_read(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    for bad in (float("nan"), float("-inf")):
        path = str(tmp_path / f"bad-{bad}")
        shutil.copytree(checkpoints["llama-gqa"], path)
        tensors = load_file(os.path.join(path, "model.safetensors"))
        key = "model.layers.1.mlp.up_proj.weight"
        tensors[key][2, 3] = bad
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(RpegError, match=rf"{key} holds NaN or infinity"):
            backend_model(path)


@pytest.mark.parametrize("damage", ["truncated", "header", "empty", "huge-header", "directory"])
def test_a_broken_weights_file_is_a_located_error(checkpoints, tmp_path, damage):
    """A damaged model.safetensors raised SafetensorError or OSError from inside the loader (issue 33, item 3)."""
    path = str(tmp_path / damage)
    shutil.copytree(checkpoints["llama-gqa"], path)
    weights = os.path.join(path, "model.safetensors")
    data = open(weights, "rb").read()
    os.remove(weights)
    if damage == "directory":
        os.mkdir(weights)
    else:
        open(weights, "wb").write({"truncated": data[: len(data) // 2], "header": data[:8] + b"\xff" * 16 + data[24:],
                                   "empty": b"", "huge-header": (1 << 62).to_bytes(8, "little") + data[8:]}[damage])
    with pytest.raises(RpegError) as e:
        backend_model(path)
    assert "model.safetensors" in e.value.message or path in e.value.message, e.value.message


@pytest.mark.parametrize("rope", [{"rope_type": "bogus", "factor": 2.0}, {"rope_type": "llama3", "factor": "8"}])
def test_a_rope_scaling_transformers_cannot_build_is_a_located_error(checkpoints, tmp_path, rope):
    """An unknown rope_type raised inside transformers (issue 33, item 3)."""
    path = str(tmp_path / "rope")
    shutil.copytree(checkpoints["llama-gqa"], path)
    config = json.load(open(os.path.join(path, "config.json")))
    config.pop("rope_parameters", None)
    config["rope_scaling"] = rope
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(RpegError, match=f"{path}"):
        backend_model(path)


def test_a_weight_index_that_is_a_pipe_or_not_a_map_is_refused_at_once(checkpoints, tmp_path):
    index = "model.safetensors.index.json"
    for case in ("fifo", "list"):
        path = tmp_path / case
        shutil.copytree(checkpoints["llama-gqa"], path)
        if case == "fifo":
            os.mkfifo(path / index)  # nothing writes to it: reading it used to wait until the node timed out
        else:
            (path / index).write_text('{"weight_map": ["a list"]}')
        with pytest.raises(RpegError, match="it is not a regular file" if case == "fifo" else f"cannot read .*{index}"):
            backend_model(str(path))
