"""Hugging Face checkpoints in the torch backend (issue 15, items 1 and 2): a model of the `.rpeg` named by
`hf = "DIR"` is built with the network options of DIR's config (read by `transformers`: RMSNorm epsilon, the
RoPE tables of its rope type and scaling, tied embeddings) and its version 0 is DIR's weights, of which each
rank reads only the slices its layout gives it (safetensors `get_slice`).

The backend's blocks are the Llama family's (rpegc/core/ir/hf_config.py says what is supported; Qwen2's query,
key and value biases and Qwen3's per-head query and key norms included); this module maps the names: `model.layers.i.self_attn.q_proj.weight` is
`layers.i.attn.wq.weight`, and so on. Tied
embeddings are read into both the embedding and the LM head, which then train as two parameters (a tied
pair across pipeline stages would need a gradient all-reduce between the first and the last stage).
A critic or reward model takes its value head from a sequence-classification checkpoint's `score.weight`
(one label; bias 0), else it is initialised from the run's seed like the backend's own models.
Everything is read from local files: `transformers` is told never to reach the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from typing import Callable, Optional

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError, error_line
from rpegc.core.ir.hf_config import GEMMA_TYPES, arch_of_config, hf_config_path, read_hf_config
from rpegc.core.ir.program import Arch
from rpegc.inputs import read_input_text
from rpegc.runtime.backends.torch.rl.finite import finite_tensor
from rpegc.runtime.backends.torch.parallel.layout import Layout, Piece, rank_pieces
from rpegc.runtime.backends.torch.model.transformer import (NetOptions, TransformerModel, arch_net, build_model,
                                                            check_arch,
                                                install_weights, seeded_parameter)

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_BLOCK = {"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
          "attn.wq.weight": "self_attn.q_proj.weight", "attn.wk.weight": "self_attn.k_proj.weight",
          "attn.wv.weight": "self_attn.v_proj.weight", "attn.wo.weight": "self_attn.o_proj.weight",
          "mlp.w_gate.weight": "mlp.gate_proj.weight", "mlp.w_up.weight": "mlp.up_proj.weight",
          "mlp.w_down.weight": "mlp.down_proj.weight", "attn.wq.bias": "self_attn.q_proj.bias",
          "attn.wk.bias": "self_attn.k_proj.bias", "attn.wv.bias": "self_attn.v_proj.bias",
          "attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"}
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight", "value_head.weight": "score.weight"}


# Gemma's block (Arch.post_norms) names its four norms otherwise: post_attention_layernorm is the attention's output
# norm there, and the FFN's input norm is pre_feedforward_layernorm
_POST_NORM_BLOCK = {**_BLOCK, "attn_post_norm.weight": "post_attention_layernorm.weight",
                    "mlp_norm.weight": "pre_feedforward_layernorm.weight",
                    "mlp_post_norm.weight": "post_feedforward_layernorm.weight"}


def hf_name(name: str, tied: bool = False, post_norms: bool = False) -> Optional[str]:
    """The checkpoint's name of backend parameter `name` (None: not in a checkpoint, the value head's bias);
    `post_norms`: Gemma's block."""
    if name.startswith("layers."):
        _, i, rest = name.split(".", 2)
        return f"model.layers.{i}.{(_POST_NORM_BLOCK if post_norms else _BLOCK)[rest]}"
    if name == "lm_head.weight" and tied:
        return _TOP["embed.weight"]
    return _TOP.get(name)


def hf_net(directory: str, base: NetOptions) -> NetOptions:
    """The network options of checkpoint `directory` (the run's `base` gives max_seq and init_std)."""
    config = read_hf_config(directory)
    window = config.get("sliding_window") if config.get("model_type") == "mistral" or config.get("use_sliding_window") \
        else None
    if window is not None and window < base.max_seq:
        raise RpegError(None, f"{directory}: sliding_window = {window} is shorter than Lp + Lr = {base.max_seq}; "
                              "rpegc builds full attention (raise Lp + Lr within the window, or use another model)")
    from rpegc.runtime.backends.torch.model.hf_rope import rope_tables

    rope_tables(directory, base.max_seq)  # an unknown rope_type or scaling: refused before any worker starts
    net = dataclasses.replace(base, mlp="swiglu", positions="rope", norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                              hf=os.path.abspath(directory), qkv_bias=config.get("model_type") == "qwen2")
    if config.get("model_type") not in GEMMA_TYPES:
        return net
    layers = arch_of_config(config, hf_config_path(directory)).layers
    types = config.get("layer_types") or ["full_attention"] * layers
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if sliding:
        rope_tables(directory, base.max_seq, "sliding_attention")
    return dataclasses.replace(net, mlp="geglu", norm_offset=True, embed_scale=True,
                               attn_scale=float(config["query_pre_attn_scalar"]) ** -0.5,
                               sliding_window=config.get("sliding_window") if sliding else None,
                               sliding_layers=sliding)


MAX_INDEX_BYTES = 64 << 20  # a weight map of a few thousand tensor names


class HFWeights:
    """Reads the tensors of checkpoint `directory` for a model of `kind`: whole, or a rank's pieces."""

    def __init__(self, directory: str, kind: str, seed: int, net: NetOptions):
        self.directory, self.kind, self.seed, self.net = directory, kind, seed, net
        config = read_hf_config(directory)  # once: its shape and whether the LM head is the embedding
        arch = arch_of_config(config, hf_config_path(directory))
        self.layers, self.post_norms = arch.layers, arch.post_norms
        self.tied = bool(config.get("tie_word_embeddings", False))
        self._open: dict[str, object] = {}
        self.files = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        index = os.path.join(self.directory, INDEX)
        if os.path.exists(index):
            text = read_input_text(index, "the checkpoint's weight index", MAX_INDEX_BYTES)
            try:
                return {str(k): str(v) for k, v in json.loads(text)["weight_map"].items()}
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
                raise RpegError(None, f"cannot read {index}: {error_line(e)}") from None
        if not os.path.exists(os.path.join(self.directory, SINGLE)):
            raise RpegError(None, f"{self.directory} has neither {SINGLE} nor {INDEX}: no weights to load")
        return {k: SINGLE for k in self._file(SINGLE).keys()}

    def _file(self, name: str):
        """The open safetensors file `name` of the checkpoint; a located error for a missing or broken one."""
        f = self._open.get(name)
        if f is None:
            path = os.path.join(self.directory, name)
            try:
                if not stat.S_ISREG(os.stat(path).st_mode):
                    raise RpegError(None, f"{path} is not a regular file")
                from safetensors import safe_open

                f = self._open[name] = safe_open(path, framework="pt")
            except RpegError:
                raise
            except Exception as e:  # missing, truncated, a header that is not safetensors' (SafetensorError)
                raise RpegError(None, f"cannot read {path}: {error_line(e)}") from None
        return f

    def _slice(self, key: str):
        name = self.files.get(key)
        if name is None:
            raise RpegError(None, f"{self.directory}: the checkpoint has no tensor {key}")
        try:
            return self._file(name).get_slice(key)
        except RpegError:
            raise
        except Exception as e:
            raise RpegError(None, f"cannot read {key} from {os.path.join(self.directory, name)}: "
                                  f"{error_line(e)}") from None

    def read(self, name: str, shape: tuple[int, ...], piece: Optional[Piece] = None) -> Tensor:
        """Backend parameter `name` (full shape `shape`), or its piece, in float32."""
        key = hf_name(name, self.tied, self.post_norms)
        if name.startswith("value_head.") and (key is None or key not in self.files):
            full = seeded_parameter(name, shape, self.seed, self.net.init_std, self.layers)
            return full if piece is None or piece.dim is None else full.narrow(piece.dim, piece.lo, piece.hi - piece.lo)
        assert key is not None
        sl = self._slice(key)
        if tuple(sl.get_shape()) != tuple(shape):
            raise RpegError(None, f"{self.directory}: {key} has shape {tuple(sl.get_shape())}, the model built from "
                                  f"its config expects {tuple(shape)}")
        index = [slice(None)] * len(shape)
        if piece is not None and piece.dim is not None:
            index[piece.dim] = slice(piece.lo, piece.hi)
        try:
            part = sl[tuple(index)]
        except Exception as e:  # the data past a truncated file's header
            raise RpegError(None, f"cannot read {key} from {self.directory}: {error_line(e)}") from None
        if not finite_tensor(part):
            raise RpegError(None, f"{self.directory}: {key} holds NaN or infinity; nothing non-finite is trained on")
        return part.to(torch.float32)

    def full(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
        return {n: self.read(n, s) for n, s in shapes.items()}

    def pieces(self, shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int,
               convert: Callable[[Tensor], Tensor] = lambda t: t) -> dict[str, Tensor]:
        """This rank's pieces under `layout`: only the slices it holds are read, each `convert`ed as it is."""
        return {n: convert(self.read(n, shapes[n], p)) for n, p in rank_pieces(shapes, layout, rank, self.layers).items()}


def model_net(arch: Arch, hf: Optional[str], base: NetOptions) -> NetOptions:
    """A model's network options: its checkpoint's (`hf_net`), or the run's `base` with its arch's MLP."""
    return arch_net(arch, base) if hf is None else hf_net(hf, base)


def initial_model(arch: Arch, kind: str, seed: int, hf: Optional[str], base: NetOptions) -> TransformerModel:
    """Version 0 of a model, whole and in float32: built from `seed`, or read from checkpoint `hf` (what the
    single-process reference starts from; a worker reads only its pieces)."""
    net = model_net(arch, hf, base)
    if hf is None:
        return build_model(arch, kind, seed, net)
    check_arch(arch, kind, net)
    model = TransformerModel(arch, kind, net)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    install_weights(model, HFWeights(hf, kind, seed, net).full(shapes))
    return model
