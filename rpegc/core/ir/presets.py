"""Model architecture presets (layers, hidden, ffn, vocab, heads, kv_heads and the flags of `Arch`).

Values are the published configurations of each model family, counted as their networks are: the Llama family
and the `tiny` presets (which the torch backend builds the same way) have a gated FFN (SwiGLU: three d x d_ff
matrices), RMSNorm weights and an untied LM head, so llama2-7b has 6,738,415,616 parameters, as `transformers`
counts it. GPT-3 keeps the spec's [PF] count (two FFN projections, one V x d matrix, no norms), as the paper's
Table X prices it. An explicit architecture in a `.rpeg` without flags is the spec's form, as in its worked example.
"""

from __future__ import annotations

from rpegc.core.ir.program import Arch

# What the Llama family has beyond [PF]'s count (GQA comes from kv_heads).
_LLAMA = dict(tied=False, norms=True)

PRESETS: dict[str, Arch] = {
    # LLaMA-2 (Touvron et al. 2023); 34B is the Code Llama 34B configuration (GQA, 8 KV heads).
    "llama2-7b": Arch(layers=32, hidden=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32, gated=True, **_LLAMA),
    "llama2-13b": Arch(layers=40, hidden=5120, ffn=13824, vocab=32000, heads=40, kv_heads=40, gated=True, **_LLAMA),
    "llama2-34b": Arch(layers=48, hidden=8192, ffn=22016, vocab=32000, heads=64, kv_heads=8, gated=True, **_LLAMA),
    "llama2-70b": Arch(layers=80, hidden=8192, ffn=28672, vocab=32000, heads=64, kv_heads=8, gated=True, **_LLAMA),
    # LLaMA-3.x (Meta 2024).
    "llama3.1-8b": Arch(layers=32, hidden=4096, ffn=14336, vocab=128256, heads=32, kv_heads=8, gated=True, **_LLAMA),
    "llama3.3-70b": Arch(layers=80, hidden=8192, ffn=28672, vocab=128256, heads=64, kv_heads=8, gated=True, **_LLAMA),
    # Llama 3.2 1B ties its embedding and LM head; Qwen2.5 0.5B too, with q/k/v biases (GPU validation's models).
    "llama3.2-1b": Arch(layers=16, hidden=2048, ffn=8192, vocab=128256, heads=32, kv_heads=8, gated=True, tied=True,
                        norms=True),
    "qwen2.5-0.5b": Arch(layers=24, hidden=896, ffn=4864, vocab=151936, heads=14, kv_heads=2, gated=True,
                         qkv_bias=True, tied=True, norms=True),
    # GPT-3 175B (Brown et al. 2020), the largest actor of the paper's Table X.
    "gpt3-175b": Arch(layers=96, hidden=12288, ffn=49152, vocab=50257, heads=96, kv_heads=96),
    # Tiny models that train in seconds on a CPU (runtime tests and demos).
    "tiny": Arch(layers=2, hidden=64, ffn=256, vocab=64, heads=4, kv_heads=4, gated=True, **_LLAMA),
    "tiny-4l": Arch(layers=4, hidden=128, ffn=512, vocab=64, heads=4, kv_heads=4, gated=True, **_LLAMA),
}

# The paper and docs/architecture.md write "llama-7b" etc. for the LLaMA-2 family.
ALIASES = {"llama-7b": "llama2-7b", "llama-13b": "llama2-13b", "llama-34b": "llama2-34b", "llama-70b": "llama2-70b"}


def lookup(name: str) -> Arch | None:
    return PRESETS.get(ALIASES.get(name, name))


def names() -> list[str]:
    return sorted(PRESETS) + sorted(ALIASES)
