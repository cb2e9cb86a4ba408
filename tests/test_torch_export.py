"""`rpeg-run export RUN_DIR OUT` (runtime/backends/torch/checkpoints/hf_export.py): a model trained by a
torch run, from a Hugging Face checkpoint or from the `.rpeg` shape, is written as a directory that
`transformers` loads and whose logits are the backend's (float32; the same 1e-4 bound as
tests/test_torch_hf.py); a checkpoint step exports its master; bad requests are one-line errors that write
nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rpegc.core.ir.hf_config import hf_arch  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt  # noqa: E402
from rpegc.runtime.backends.torch.model.hf import HFWeights, hf_net  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import NetOptions  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import param_shapes  # noqa: E402
from fixtures.torch_runs import LOGIT_ATOL  # noqa: E402
from fixtures.torch_runs import logits_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
GRPO = open(os.path.join(ROOT, "examples", "grpo-tiny-2.rpeg")).read()


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def trained_run(tmp_path, text: str) -> str:
    (tmp_path / "p.rpeg").write_text(text)
    proc = cli("rpegc.cli", "p.rpeg", "-p", PIPELINE, "-o", "p.exec.rpeg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = cli("rpegc.runtime.cli", "p.exec.rpeg", "--backend", "torch", "--run-dir", "run", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(tmp_path / "run")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("hfrun")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(d / "ckpt"))
    (d / "ckpt" / "tokenizer_config.json").write_text("{}")  # stands for the tokenizer files an export copies
    text = GRPO.replace('arch = "tiny", kind = policy', 'hf = "ckpt", kind = policy') \
               .replace('arch = "tiny", kind = reference', 'hf = "ckpt", kind = reference')
    return d, trained_run(d, text)


def test_an_exported_checkpoint_model_loads_in_transformers_with_the_backends_logits(hf_run, tmp_path):
    d, run_dir = hf_run
    proc = cli("rpegc.runtime.cli", "export", run_dir, str(tmp_path / "out"), cwd=d)
    assert proc.returncode == 0 and "exported @actor" in proc.stdout, proc.stderr
    assert (tmp_path / "out" / "tokenizer_config.json").exists()
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), local_files_only=True).eval()
    final = ckpt.load_final(run_dir)["actor"]
    net = hf_net(str(d / "ckpt"), NetOptions(max_seq=10))
    x = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = exported(x).logits
    torch.testing.assert_close(theirs, logits_of(final, hf_arch(str(d / "ckpt")), net, x), rtol=0, atol=LOGIT_ATOL)
    initial = HFWeights(str(d / "ckpt"), "policy", 0, net).full(param_shapes(hf_arch(str(d / "ckpt")), "policy", net))
    assert any(not torch.equal(final[n], initial[n]) for n in final)  # it trained
    assert not exported.config.tie_word_embeddings


def test_a_checkpoint_step_exports_its_master(hf_run, tmp_path):
    d, run_dir = hf_run
    proc = cli("rpegc.runtime.cli", "export", run_dir, str(tmp_path / "s1"), "--step", "1", cwd=d)
    assert proc.returncode == 0, proc.stderr
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "s1"), local_files_only=True)
    _, tensors = ckpt.load_full(ckpt.checkpoint_path(run_dir, 1))
    master = tensors[ckpt.weights_key("actor", 1, "layers.0.attn.wq.weight")]
    assert torch.equal(exported.model.layers[0].self_attn.q_proj.weight.detach(), master)


@pytest.mark.parametrize("extra", [{}, {"qk_norm": True, "head_size": 24}], ids=["llama", "qwen3"])
def test_a_rope_model_built_from_the_rpeg_shape_exports_as_llama(extra):
    """The config of a model without a checkpoint: a LlamaConfig of its shape (a Qwen3Config with per-head q/k norms)
    with the backend's RoPE theta and norm epsilon, under which the backend's weights give the backend's logits."""
    import dataclasses

    from rpegc.runtime.backends.torch.checkpoints.shard_files import _plain
    from rpegc.runtime.backends.torch.checkpoints.hf_export import hf_config
    from rpegc.runtime.backends.torch.model.hf import hf_name
    from rpegc.runtime.backends.torch.model.transformer import build_model, export_weights

    arch = dataclasses.replace(lookup("tiny"), **extra)
    net = NetOptions(max_seq=12)
    weights = export_weights(build_model(arch, "policy", 5, net))
    spec = {"kind": "policy", "arch": _plain(arch)}  # as a run's identity records it
    config = hf_config(spec, {"positions": "rope", "workload": {"Lp": 4, "Lr": 8}})
    assert config.model_type == ("qwen3" if extra else "llama") and config.head_dim == arch.head_dim
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    hf.load_state_dict({hf_name(n): t for n, t in weights.items()}, strict=False)
    x = torch.randint(0, arch.vocab, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(x).logits
    torch.testing.assert_close(theirs, logits_of(weights, arch, net, x), rtol=0, atol=LOGIT_ATOL)


def test_a_model_with_learned_positions_is_refused(tmp_path):
    run_dir = trained_run(tmp_path, GRPO)  # the toy runs' models learn their positions
    proc = cli("rpegc.runtime.cli", "export", run_dir, "out", cwd=tmp_path)
    assert proc.returncode == 1 and "positions = 'learned' has no Llama equivalent" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_export_requests_are_one_line_errors_that_write_nothing(hf_run, tmp_path, monkeypatch, capsys):
    """The first request runs as a process (exit status, no traceback); the rest through the same `main` in this
    process, which saves a torch import each."""
    from rpegc.runtime.cli import main

    d, run_dir = hf_run
    monkeypatch.chdir(d)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    cases = [
        ((run_dir, str(tmp_path / "taken")), "exists and is not an empty directory"),
        ((run_dir, str(tmp_path / "o1"), "--model", "reward"), "reward model"),
        ((run_dir, str(tmp_path / "o2"), "--model", "nobody"), "has no model @nobody"),
        ((run_dir, str(tmp_path / "o3"), "--step", "7"), "no complete checkpoint of step 7"),
        ((str(tmp_path / "none"), str(tmp_path / "o4")), "is not a run directory"),
        ((run_dir, str(tmp_path / "missing" / "o5")), "parent directory does not exist"),
        ((run_dir, str(tmp_path / "link")), "exists and is not an empty directory"),
    ]
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "empty", tmp_path / "link")
    (args, match), *rest = cases
    proc = cli("rpegc.runtime.cli", "export", *args, cwd=d)
    assert proc.returncode == 1 and match in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for args, match in rest:
        assert main(["export", *args]) == 1
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) <= 2, err
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["empty", "link", "taken"] and not os.listdir(tmp_path / "empty")
