"""Switches for the reconstructed parts of the analytical cost model (spec/cost-model.md, Sec. 9).

The defaults are the spec's choices; each field names the ambiguity [Ax] it selects an alternative
for, so a researcher can measure how much a reconstruction matters (spec 8.8, "Sensitivity").
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rpegc.core.errors import Loc, RpegError

# Allowed values of the string-valued options; the first entry is the spec's baseline.
_CHOICES: dict[str, tuple[str, ...]] = {
    "actor_critic_inference_heads": ("both", "value"),
    "decode_rows": ("local_mb", "local_batch"),
    "generation_pp": ("none", "prefill", "wavefront"),
    "pp_inter_tier": ("allocation", "replica"),
    "checkpoint_interval": ("floor", "ceil"),
    "alltoall_family": ("collective", "p2p"),
    "tp_decode": ("batched", "per_microbatch"),
    "scalar_head_act_width": ("vocab", "one"),
}


@dataclass(frozen=True)
class CostOptions:
    # A1: forward-equivalents in a training operator (4 = fwd + recompute + bwd; 3 = no recompute).
    train_forward_equivalents: int = 4
    # A3: factor of the decode attention term 2*L*(f*(L_p+t)*d); [PF]'s unexpanded sum has 1.
    decode_attention_factor: int = 2
    # A4: heads of a shared actor-critic in inference ("both": 2Vd + 2d, "value": 2d).
    actor_critic_inference_heads: str = "both"
    # A5: rows of one decode GEMM ("local_mb": b_loc = BR/(P_d mb); "local_batch": BR/P_d).
    decode_rows: str = "local_mb"
    # A6: apply the 1F1B bubble to generation's T_gemm.
    bubble_on_generation: bool = True
    # A7: pipeline P2P of generation ("none"; "prefill": the prefill priced like inference at L_p;
    # "wavefront": the prefill as in "prefill", plus, for every decode step of every microbatch, one
    # activation transfer per stage boundary and the sampled token back from the last stage to the
    # first -- what a pipelined decode loop that feeds each token back does, as the torch backend's).
    generation_pp: str = "none"
    # A8: tier of node-crossing PP boundaries ("allocation": tier(sigma(v)); "replica": the slowest
    # tier spanned by one pipeline replica).
    pp_inter_tier: str = "allocation"
    # A11: rounding of the checkpoint interval c = max(1, round(sqrt(L/P_p))).
    checkpoint_interval: str = "floor"
    # A12: add the unsharded third buffer term 2d + 2d_ff to M_buf and M_act^I.
    recompute_buffer_third_term: bool = False
    # A13: serving operators without a persistent BF16 copy load their weights transiently.
    serving_weights_in_transient: bool = True
    # A16: alpha-beta family used by AlltoAll (Reshard nodes).
    alltoall_family: str = "collective"
    # A20: TP AllReduces of decode ("batched": one step over BR/P_d; "per_microbatch": mb steps).
    tp_decode: str = "batched"
    # A23: LM-head width in M_act^I for scalar-head kinds ("vocab": d + V; "one": d + 1).
    scalar_head_act_width: str = "vocab"
    # Not in the source: latency-bound AllReduces of a few scalars a training operator makes over its
    # DP group (token counts for loss normalisation, advantage whitening moments, statistics), each
    # priced AR(8 B, P_d). The spec prices none; the torch backend makes 4.
    dp_scalar_allreduces: int = 0

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise RpegError(None, f"cost option {name} = {value!r} is not one of {', '.join(allowed)}")
        if self.train_forward_equivalents not in (3, 4):
            raise RpegError(None, "cost option train_forward_equivalents must be 4 (with recompute) or 3 (without)")
        if self.dp_scalar_allreduces < 0:
            raise RpegError(None, "cost option dp_scalar_allreduces must be >= 0")
        if self.decode_attention_factor not in (1, 2):
            raise RpegError(None, "cost option decode_attention_factor must be 2 (spec A3) or 1 ([PF] sum)")


def cost_options(values: dict[str, object], loc: Loc | None = None) -> CostOptions:
    """CostOptions from user-written `name = value` pairs (pass options), with located errors."""
    known = {f.name: f for f in fields(CostOptions)}
    kwargs: dict[str, object] = {}
    for name, value in values.items():
        if name not in known:
            raise RpegError(loc, f"unknown cost option '{name}'; known options: {', '.join(sorted(known))}")
        default = known[name].default
        if isinstance(default, bool):
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise RpegError(loc, f"cost option '{name}' must be true or false, got {value!r}")
        elif isinstance(default, int):
            try:
                value = int(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise RpegError(loc, f"cost option '{name}' must be an integer, got {value!r}") from None
        kwargs[name] = value
    try:
        return CostOptions(**kwargs)  # type: ignore[arg-type]
    except RpegError as err:
        raise RpegError(loc, err.message) from None
