"""Leading-order GEMM work (FLOPs) per role and model kind (spec 2.1-2.4, from [PF] Table I).

Functions take the model's `Arch`, its kind and workload numbers (Python ints keep the integer
terms exact; numpy arrays work elementwise). Work is independent of the execution plan.
"""

from __future__ import annotations

from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.cost.params import LM_HEAD_KINDS, layer_gemm_params
from rpegc.core.ir.program import Arch, Workload


def backbone_flops_per_token(arch: Arch, ell):
    """C_bb(ell) = 2 L (W_layer + ell d_q) (spec: W_layer = 4 d^2 + 2 d d_ff; 2 d d_q + 2 d d_kv with GQA; 3 d d_ff
    gated; d_q = d unless the head dimension is given): projections plus causal attention averaged per token."""
    return 2 * arch.layers * (layer_gemm_params(arch) + ell * arch.q_width)


def head_flops_per_sequence(arch: Arch, kind: str, ell, ac_heads: str = "both"):
    """Head FLOPs of one teacher-forced sequence of length ell (spec 2.1, [A2], [A4]).

    Kept per sequence so the reward model's once-per-sequence head (2d) stays an exact integer.
    `ac_heads` selects the heads a shared actor-critic runs: "both" (2Vd + 2d) or "value" (2d).
    """
    d, V = arch.hidden, arch.vocab
    if kind in ("policy", "reference"):
        return ell * 2 * V * d
    if kind == "critic":
        return ell * 2 * d
    if kind == "reward":
        return 2 * d
    if kind == "actor_critic":
        lm = 2 * V * d if ac_heads == "both" else 0
        return ell * (lm + 2 * d)
    raise ValueError(f"unknown model kind {kind!r}")


def forward_flops_per_sequence(arch: Arch, kind: str, ell, ac_heads: str = "both"):
    """ell * C_f^tok(m, ell): one teacher-forced forward pass over a sequence."""
    return ell * backbone_flops_per_token(arch, ell) + head_flops_per_sequence(arch, kind, ell, ac_heads)


def forward_flops_per_token(arch: Arch, kind: str, ell, ac_heads: str = "both"):
    """C_f^tok(m, ell) = C_bb(ell) + head(kind, ell)."""
    return forward_flops_per_sequence(arch, kind, ell, ac_heads) / ell


def prefill_flops_per_rollout(arch: Arch, L_p):
    """C_pf^roll = 2 L L_p (4d^2 + 2 d d_ff + L_p d_q) + 2 V d (the LM head emits the first token)."""
    d = arch.hidden
    return 2 * arch.layers * L_p * (layer_gemm_params(arch) + L_p * arch.q_width) + 2 * arch.vocab * d


def decode_flops_per_rollout(arch: Arch, L_p, L_r, opts: CostOptions = DEFAULT_OPTIONS):
    """C_dec^roll: L_r - 1 single-token steps at context L_p + t, closed form of spec 2.3 ([A3])."""
    L, d = arch.layers, arch.hidden
    steps = L_r - 1
    context_sum = steps * L_p + steps * L_r // 2  # sum_{t=1..L_r-1} (L_p + t)
    attention = 2 * opts.decode_attention_factor * L * arch.q_width * context_sum
    return 2 * steps * L * layer_gemm_params(arch) + attention + 2 * steps * arch.vocab * d


def generation_work(arch: Arch, wl: Workload, opts: CostOptions = DEFAULT_OPTIONS):
    """(W_prefill, W_decode) of a generation operator over all B*R rollouts."""
    BR = wl.B * wl.R
    return BR * prefill_flops_per_rollout(arch, wl.Lp), BR * decode_flops_per_rollout(arch, wl.Lp, wl.Lr, opts)


def forward_length(kind: str, Lp, Lr, opts: CostOptions = DEFAULT_OPTIONS):
    """The tokens per row of a teacher-forced forward (inference, and each pass of training): the spec's ell_full =
    Lp + Lr; under accounting = backend what the torch backend runs: a model read at the positions that predict the
    response (log-probs, values; rl/step.response_forward) runs every row less its last token, which predicts
    nothing, and a reward model, read at the last token (rl/step.last_token_scores), the whole row."""
    full = Lp + Lr
    return full if opts.accounting == "spec" or kind == "reward" else full - 1


def inference_work(arch: Arch, kind: str, wl: Workload, opts: CostOptions = DEFAULT_OPTIONS):
    """W_I = BR * ell * C_f^tok(m, ell), ell = `forward_length` (ell_full in the spec)."""
    ell = forward_length(kind, wl.Lp, wl.Lr, opts)
    return wl.B * wl.R * forward_flops_per_sequence(arch, kind, ell, opts.actor_critic_inference_heads)


def training_work(arch: Arch, kind: str, wl: Workload, forward_equivalents: int = 4,
                  opts: CostOptions = DEFAULT_OPTIONS):
    """W_T = n_fe * BR * ell * C_f^tok, n_fe = 4 forward-equivalents with recomputation, 3 without ([A1];
    `Training.forward_equivalents`), ell = `forward_length` (ell_full in the spec)."""
    # Training always runs both heads of a shared actor-critic (policy and value losses).
    ell = forward_length(kind, wl.Lp, wl.Lr, opts)
    return forward_equivalents * wl.B * wl.R * forward_flops_per_sequence(arch, kind, ell)


def check_role_kind(role: str, kind: str, loc: Loc | None = None) -> None:
    """Generation samples from logits, so it needs a vocabulary head (spec 2.3)."""
    if role == "generation" and kind not in LM_HEAD_KINDS:
        raise RpegError(
            loc,
            f"a generation vertex needs a model with a vocabulary head (kind {', '.join(LM_HEAD_KINDS)}), "
            f"but its model has kind '{kind}'; make it an inference vertex or change the model kind",
        )
