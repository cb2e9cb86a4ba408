"""Parameter counts: N_m = |m| (spec 2.5, from [PF]) and the per-layer counts that work and memory use.

[PF] counts four d x d attention projections, two FFN projections and one V x d matrix. The counts here are
exact for the networks the presets and checkpoints describe (`Arch`'s flags): grouped-query attention (q and o
d x d_q, k and v d x d_kv), a gated FFN's third matrix, Qwen2's q/k/v biases, the RMSNorm weights (Qwen3's per-head
q/k norms too) and an untied LM head. With the flags' defaults they are [PF]'s, so the spec's worked example holds. For a checkpoint N_m equals
`transformers`' `num_parameters()` (tests/test_cost_params.py).
"""

from __future__ import annotations

from rpegc.core.ir.program import Arch

SCALAR_HEAD_KINDS = ("critic", "reward", "actor_critic")
LM_HEAD_KINDS = ("policy", "reference", "actor_critic")  # chi_LM = 1 (spec 6.1)


def ffn_matrices(arch: Arch) -> int:
    """d x d_ff matrices of one FFN: 3 for a gated FFN (gate, up, down), the spec's 2 otherwise."""
    return 3 if arch.gated else 2


def attention_params(arch: Arch) -> int:
    """Weights of one layer's attention projections: 2 d d_q + 2 d d_kv (q and o, k and v); 4 d^2 for MHA with
    d_q = d."""
    d = arch.hidden
    return 2 * d * arch.q_width + 2 * d * arch.kv_width


def layer_gemm_params(arch: Arch) -> int:
    """W_layer: the GEMM weights of one transformer layer (attention + FFN; spec 2.5: 4 d^2 + 2 d d_ff for MHA and
    a two-projection FFN). Work (2 FLOPs per weight per token) and HBM weight traffic count the layers by this."""
    return attention_params(arch) + ffn_matrices(arch) * arch.hidden * arch.ffn


def layer_sharded_params(arch: Arch) -> int:
    """Parameters of one layer that tensor parallelism divides: the GEMM weights and the q/k/v biases."""
    bias = (arch.q_width + 2 * arch.kv_width) if arch.qkv_bias else 0
    return layer_gemm_params(arch) + bias


def layer_replicated_params(arch: Arch) -> int:
    """Parameters of one layer every TP rank holds whole: the two RMSNorm weights (four with post-norms) and the
    q/k norms' (when counted)."""
    if not arch.norms:
        return 0
    return (4 if arch.post_norms else 2) * arch.hidden + (2 * arch.head_dim if arch.qk_norm else 0)


def layer_params(arch: Arch) -> int:
    """Every parameter of one transformer layer."""
    return layer_sharded_params(arch) + layer_replicated_params(arch)


def final_norm_params(arch: Arch) -> int:
    return arch.hidden if arch.norms else 0


def lm_head_params(arch: Arch, kind: str) -> int:
    """The LM head's own parameters in N_m: V d when untied (0 when it is the embedding, or the kind has none)."""
    return arch.vocab * arch.hidden if kind in LM_HEAD_KINDS and not arch.tied else 0


def param_count(arch: Arch, kind: str) -> int:
    """N_m: layers, the embedding, an untied LM head, the final norm, and d for a scalar head."""
    n = arch.layers * layer_params(arch) + arch.vocab * arch.hidden + lm_head_params(arch, kind)
    n += final_norm_params(arch)
    if kind in SCALAR_HEAD_KINDS:
        n += arch.hidden
    return n
