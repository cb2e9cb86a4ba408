"""Switches for the reconstructed parts of the analytical cost model (docs/cost-model-spec.md, Sec. 9).

The defaults are the spec's choices, except `accounting`, which prices what the runtime holds and does; each field
names the ambiguity [Ax] it selects an alternative for, so a researcher can measure how much a reconstruction matters
(spec 8.8, "Sensitivity"). How a training operator trains (precision, ZeRO stage, recomputation, pipeline schedule)
is not an option but the program's declaration (core/ir/training.py), which the runtime executes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.options import option

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
    "accounting": ("backend", "spec"),
}


@dataclass(frozen=True)
class CostOptions:
    decode_attention_factor: int = option(
        2, "A3: factor of the decode attention term 2*L*(f*(L_p+t)*d); [PF]'s unexpanded sum has 1")
    actor_critic_inference_heads: str = option(
        "both", "A4: heads of a shared actor-critic in inference (both: 2Vd + 2d; value: 2d)")
    decode_rows: str = option(
        "local_mb", "A5: rows of one decode GEMM (local_mb: b_loc = BR/(P_d mb); local_batch: BR/P_d)")
    bubble_on_generation: bool = option(True, "A6: apply the 1F1B bubble to generation's T_gemm")
    generation_pp: str = option(
        "none", "A7: pipeline P2P of generation (none; prefill: the prefill priced like inference at L_p; "
                "wavefront: the prefill, plus, for every decode step of every microbatch, one activation transfer "
                "per stage boundary and the sampled token back from the last stage to the first, as the torch "
                "backend's pipelined decode loop does)")
    pp_inter_tier: str = option(
        "allocation", "A8: tier of node-crossing PP boundaries (allocation: tier(sigma(v)); replica: the slowest "
                      "tier one pipeline replica spans)")
    checkpoint_interval: str = option(
        "floor", "A11: rounding of the checkpoint interval c = max(1, round(sqrt(L/P_p))) (floor or ceil)")
    recompute_buffer_third_term: bool = option(
        False, "A12: add the unsharded third buffer term 2d + 2d_ff to M_buf and M_act^I")
    serving_weights_in_transient: bool = option(
        True, "A13: serving operators without a persistent BF16 copy load their weights transiently")
    alltoall_family: str = option(
        "collective", "A16: alpha-beta family of the AlltoAll of Reshard nodes (collective or p2p)")
    tp_decode: str = option(
        "batched", "A20: TP AllReduces of decode (batched: one step over BR/P_d; per_microbatch: mb steps)")
    scalar_head_act_width: str = option(
        "vocab", "A23: LM-head width in M_act^I for scalar-head kinds (vocab: d + V; one: d + 1)")
    accounting: str = option(
        "backend", "A12, [B], 3.4.3: backend prices what the torch backend holds and does (a teacher-forced forward "
                   "runs a row less its last token, a reward model's the whole row: work.forward_length; training "
                   "keeps every live "
                   "microbatch's segment inputs and recomputes one segment of the layers' measured saved tensors at "
                   "a time; serving holds two float32 log-softmax pieces; ZeRO-2 reduces the gradients after every "
                   "microbatch); spec is the spec's literal form (every live microbatch reserves its checkpoints "
                   "and a recompute buffer of [A12]'s width; ZeRO-2 reduces once per step), which its worked "
                   "example uses")
    dp_scalar_allreduces: int = option(
        0, "not in the source: more latency-bound AllReduces of a few scalars a training operator makes over its DP "
           "group (token counts, whitening moments, statistics), each priced AR(8 B, P_d), beside those "
           "accounting = backend counts (the torch backend's: 5 a step under ZeRO >= 1, 4 under ZeRO 0); the spec "
           "prices none")

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise RpegError(None, f"cost option {name} = {value!r} is not one of {', '.join(allowed)}")
        if self.dp_scalar_allreduces < 0:
            raise RpegError(None, "cost option dp_scalar_allreduces must be >= 0")
        if self.decode_attention_factor not in (1, 2):
            raise RpegError(None, "cost option decode_attention_factor must be 2 (spec A3) or 1 ([PF] sum)")


# The options of the spec's model: the default of every cost function that takes options.
DEFAULT_OPTIONS = CostOptions()


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
