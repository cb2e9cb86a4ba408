"""`rpeg-run export RUN_DIR OUT`: a trained model of a torch run as a Hugging Face directory (issue 15, item 3).

OUT gets what `save_pretrained` writes (config.json, generation_config.json, safetensors shards with an
index when the model is large) plus the tokenizer files of the checkpoint the model started from, so
`AutoModelForCausalLM.from_pretrained(OUT)` loads it and gives the backend's logits. The weights are the run's
final weights (RUN_DIR/final/) or those of a checkpoint (`--step N`), read whole by `checkpoint.load_full`
(which checks every file's size and SHA-256). A model that came from a checkpoint (`hf = "DIR"`) keeps DIR's
config, with untied embeddings (the backend trains the LM head apart from the embedding); a model built from
the `.rpeg` shape becomes a LlamaConfig (a Qwen3Config with per-head q/k norms) of that shape with the backend's RoPE
theta and norm epsilon.

Models with an LM head are exported (policy, reference, actor_critic's LM part); a critic's or reward model's
per-token value head has no `transformers` class that would give the same values, so those are refused.
OUT must not exist or be an empty directory; it is written beside and renamed when complete.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Optional

import torch

from rpegc.core.ir.errors import RpegError
from rpegc.outputs import OutputError, PendingDirectory
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.model.hf import hf_name
from rpegc.runtime.backends.torch.model.transformer import LM_HEAD_KINDS, NetOptions
from rpegc.runtime.backends.torch.checkpoints.run_dir import managed_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


def source_directory(run_dir: str, step: Optional[int]) -> tuple[str, str]:
    """(directory, index format) of the weights to export: the final weights or checkpoint `step`."""
    if step is None:
        final = ckpt.final_path(run_dir)
        if not os.path.exists(os.path.join(final, ckpt.INDEX)):
            done = [s for s, _ in ckpt.complete_checkpoints(run_dir)]
            hint = f"; export a checkpoint with --step N (steps: {', '.join(map(str, done))})" if done else ""
            raise RpegError(None, f"{run_dir} has no final weights (the run did not finish){hint}")
        return final, ckpt.FINAL_FORMAT
    for s, path in ckpt.complete_checkpoints(run_dir):
        if s == step:
            return path, ckpt.FORMAT
    done = [s for s, _ in ckpt.complete_checkpoints(run_dir)]
    raise RpegError(None, f"{run_dir} has no complete checkpoint of step {step}"
                          + (f" (steps: {', '.join(map(str, done))})" if done else " (it has none)"))


def pick_model(models: dict, model: Optional[str]) -> str:
    """The model to export: `model`, or the run's only trained model with an LM head."""
    if model is not None:
        if model not in models:
            raise RpegError(None, f"the run has no model @{model}; it has {', '.join('@' + m for m in models)}")
        if models[model]["kind"] not in LM_HEAD_KINDS:
            raise RpegError(None, f"@{model} is a {models[model]['kind']} model: only models with an LM head "
                                  f"({', '.join(LM_HEAD_KINDS)}) have a transformers class that gives the same outputs")
        return model
    trained = [m for m, s in models.items() if s["kind"] in ("policy", "actor_critic")]
    if len(trained) != 1:
        raise RpegError(None, f"say which model to export with --model (models: {', '.join('@' + m for m in models)})")
    return trained[0]


def hf_config(spec: dict, run: dict):
    """The transformers config of an exported model."""
    from transformers import AutoConfig, LlamaConfig, Qwen3Config

    if spec.get("hf"):
        config = AutoConfig.from_pretrained(spec["hf"], local_files_only=True)
        config.tie_word_embeddings = False
        return config
    if not spec["arch"].get("gated") or run.get("positions", "rope") != "rope":
        raise RpegError(None, f"a model with {'a gated' if spec['arch'].get('gated') else 'an ungated (GELU)'} FFN and "
                              f"positions = {run.get('positions')!r} has no Llama equivalent; only gated (SwiGLU) "
                              "models with RoPE are exported")
    a, w, net = spec["arch"], run["workload"], NetOptions(max_seq=1)
    kind = Qwen3Config if a.get("qk_norm") else LlamaConfig  # per-head q/k norms: Qwen3's block
    return kind(vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["ffn"],
                num_hidden_layers=a["layers"], num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                head_dim=a.get("head_size") or a["hidden"] // a["heads"],
                max_position_embeddings=int(w["Lp"]) + int(w["Lr"]), rms_norm_eps=net.norm_eps,
                rope_theta=net.rope_theta, tie_word_embeddings=False)


def _weights(tensors: dict[str, torch.Tensor], model: str, version: Optional[int]) -> dict[str, torch.Tensor]:
    prefix = ckpt.weights_key(model, version, "")
    return {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}


def export(run_dir: str, out: str, model: Optional[str] = None, step: Optional[int] = None) -> str:
    """Write model `model` of the run in `run_dir` to `out` as a Hugging Face directory; returns the model."""
    owner = managed_path(out)
    if owner is not None:  # a run would take it for its own (a checkpoint, its final weights) or replace it
        raise OutputError(out, f"cannot write the export: it is the run directory {owner} or lies in its checkpoints, "
                               "final weights or worker logs; choose a path outside them")
    if os.path.islink(out) or (os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out))):
        raise OutputError(out, "cannot write the export: it exists and is not an empty directory (choose a new one)")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise OutputError(out, "cannot write the export: its parent directory does not exist")
    directory, fmt = source_directory(run_dir, step)
    index, tensors = ckpt.load_full(directory, fmt)
    identity = index.get("identity") or {}
    models = identity.get("models") or {}
    name = pick_model(models, model)
    spec = models[name]
    weights = _weights(tensors, name, step)  # a checkpoint of step k holds version k as the master
    if not weights:
        raise RpegError(None, f"{directory} holds no weights of @{name}")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rpeg-run prints one line when the export is done
    config = hf_config(spec, identity.get("run") or {})
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    post_norms = bool(spec["arch"].get("post_norms"))  # Gemma names its norms otherwise
    state = {hf_name(n, post_norms=post_norms): t for n, t in weights.items() if not n.startswith("value_head.")}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise RpegError(None, f"the weights of @{name} do not fit {type(hf).__name__}: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    emptied = os.path.isdir(out)
    if emptied:
        try:
            os.rmdir(out)  # empty: PendingDirectory renames the finished export into its place
        except OSError as e:
            raise OutputError(out, f"cannot write the export: {e.strerror}") from None
    pending = PendingDirectory(out, "the export")
    try:
        hf.save_pretrained(pending.path)
        for f in TOKENIZER_FILES if spec.get("hf") else ():
            for src in glob.glob(os.path.join(spec["hf"], f)):
                shutil.copy2(src, pending.path)
        pending.commit()
    except BaseException:
        pending.discard()
        if emptied:
            os.makedirs(out, exist_ok=True)
        raise
    return name
