"""Issue 32, item 5: what one recomputed transformer layer of the torch backend saves for its backward pass, per
token, against the recompute-buffer width the cost model prices for it (spec 6.2 [A12], `core.cost.memory.buffer_width`:
the wider of the attention and the FFN buffers).

A training segment of c layers is recomputed in the backward pass with autograd on, so all c layers' saved tensors
are live at once (on top of the retained segment inputs). This counts them exactly: the storages autograd packs
(`torch.autograd.graph.saved_tensors_hooks`) during one block's forward, less the block's parameters and its input,
divided by the tokens; what is not per token (the RoPE tables at the positions) is listed apart. No timing: runs
in seconds on any machine. Usage:
    .venv/bin/python bench/layer_activations.py
"""

from __future__ import annotations

import torch

from rpegc.core.cost.memory import buffer_width
from rpegc.core.ir.program import Arch
from rpegc.runtime.backends.torch.model.transformer import (Block, NetOptions, attention_mask, positioned_rope,
                                                            rope_tables)

SHAPES = ((192, 512, 6, 6), (256, 1024, 4, 2), (512, 1536, 8, 2), (2048, 8192, 32, 8))  # d, d_ff, heads, kv heads
B, T = 2, 64


def saved_bytes(arch: Arch, dtype: torch.dtype) -> tuple[float, int]:
    """(bytes per token, other bytes) one block saves for its backward pass."""
    gemma = arch.post_norms  # Gemma's block: its norms apply 1 + w in float32, its gate is tanh-GELU
    mlp = ("geglu" if gemma else "swiglu") if arch.gated else "gelu"
    net = NetOptions(max_seq=T, positions="rope", mlp=mlp, norm_offset=gemma, attn_scale=0.1 if gemma else None)
    block = Block(arch, net).to(dtype)
    x = torch.randn(B, T, arch.hidden, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(T, arch.head_dim, 10000.0)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, tuple[tuple[int, ...], int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = (tuple(t.shape), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, positioned_rope(cos.to(dtype), sin.to(dtype), torch.arange(T)), attention_mask(None, 0, T, x.device),
              None, 0)
    # Per token: [B, ...] tensors and the [B*T, k] views linear layers save; the rest is per position (RoPE tables).
    per_token = sum(n for shape, n in saved.values() if shape[:1] in ((B,), (B * T,)))
    other = sum(n for shape, n in saved.values() if shape[:1] not in ((B,), (B * T,)))
    return per_token / (B * T), other


def main() -> None:
    print(f"{'d':>5} {'d_ff':>5} {'heads':>5} {'kv':>3} {'dtype':>5} {'saved elems/token':>18} {'[A12] width':>11} "
          f"{'ratio':>6} {'other KiB':>9}")
    for d, f, h, kv in SHAPES:
        arch = Arch(layers=1, hidden=d, ffn=f, vocab=8, heads=h, kv_heads=kv, gated=True, tied=False, norms=True)
        for dtype, s_b in ((torch.float32, 4), (torch.bfloat16, 2)):
            per_token, other = saved_bytes(arch, dtype)
            width = float(buffer_width(arch, 1))
            print(f"{d:5d} {f:5d} {h:5d} {kv:3d} {str(dtype)[6:]:>5} {per_token / s_b:18.0f} {width:11.0f} "
                  f"{per_token / s_b / width:6.2f} {other / 2**10:9.1f}")


if __name__ == "__main__":
    main()
