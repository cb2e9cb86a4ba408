"""Model architecture presets (layers, hidden, ffn, vocab, heads, kv_heads).

Values are the published configurations of each model family. The Llama family's FFN is gated (SwiGLU: three
d x d_ff matrices), and so is the `tiny` presets' (the torch backend builds them with SwiGLU); GPT-3's has the
spec's two. Counted so, llama2-7b has 6.61B parameters (the spec's two-projection form gave 5.16B; LLaMA's 6.74B
also counts the untied LM head, which the cost model counts as one V x d matrix with the embedding, and the norms).
An explicit architecture in a `.rpeg` without `gated = true` is the spec's form, as in its worked example.
"""

from __future__ import annotations

from rpegc.core.ir.program import Arch

PRESETS: dict[str, Arch] = {
    # LLaMA-2 (Touvron et al. 2023); 34B is the Code Llama 34B configuration (GQA, 8 KV heads).
    "llama2-7b": Arch(layers=32, hidden=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32, gated=True),
    "llama2-13b": Arch(layers=40, hidden=5120, ffn=13824, vocab=32000, heads=40, kv_heads=40, gated=True),
    "llama2-34b": Arch(layers=48, hidden=8192, ffn=22016, vocab=32000, heads=64, kv_heads=8, gated=True),
    "llama2-70b": Arch(layers=80, hidden=8192, ffn=28672, vocab=32000, heads=64, kv_heads=8, gated=True),
    # LLaMA-3.x (Meta 2024).
    "llama3.1-8b": Arch(layers=32, hidden=4096, ffn=14336, vocab=128256, heads=32, kv_heads=8, gated=True),
    "llama3.3-70b": Arch(layers=80, hidden=8192, ffn=28672, vocab=128256, heads=64, kv_heads=8, gated=True),
    # GPT-3 175B (Brown et al. 2020), the largest actor of the paper's Table X.
    "gpt3-175b": Arch(layers=96, hidden=12288, ffn=49152, vocab=50257, heads=96, kv_heads=96),
    # Tiny models that train in seconds on a CPU (runtime tests and demos).
    "tiny": Arch(layers=2, hidden=64, ffn=256, vocab=64, heads=4, kv_heads=4, gated=True),
    "tiny-4l": Arch(layers=4, hidden=128, ffn=512, vocab=64, heads=4, kv_heads=4, gated=True),
}

# The paper and DESIGN.md write "llama-7b" etc. for the LLaMA-2 family.
ALIASES = {"llama-7b": "llama2-7b", "llama-13b": "llama2-13b", "llama-34b": "llama2-34b", "llama-70b": "llama2-70b"}


def lookup(name: str) -> Arch | None:
    return PRESETS.get(ALIASES.get(name, name))


def names() -> list[str]:
    return sorted(PRESETS) + sorted(ALIASES)
