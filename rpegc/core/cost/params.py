"""Logical parameter counts N_m = |m| (spec 2.5, from [PF])."""

from __future__ import annotations

from rpegc.core.ir.program import Arch

SCALAR_HEAD_KINDS = ("critic", "reward", "actor_critic")


def ffn_matrices(arch: Arch) -> int:
    """d x d_ff matrices of one FFN: 3 for a gated FFN (gate, up, down), the spec's 2 otherwise."""
    return 3 if arch.gated else 2


def layer_params(arch: Arch) -> int:
    """W_layer = 4 d^2 + 2 d d_ff (four attention projections, two FFN projections; spec 2.5), or 4 d^2 + 3 d d_ff
    for a gated FFN. Work and memory count the layers through this, so FLOPs follow the same form."""
    d = arch.hidden
    return 4 * d * d + ffn_matrices(arch) * d * arch.ffn


def param_count(arch: Arch, kind: str) -> int:
    """N_m: layers + one (tied-as-counted) V*d matrix, + d for a scalar head."""
    n = arch.layers * layer_params(arch) + arch.vocab * arch.hidden
    if kind in SCALAR_HEAD_KINDS:
        n += arch.hidden
    return n
