"""annotate-cost: local evaluation Phi(G-hat) (Sec. V, App. C-D; spec/cost-model.md).

Sets `time` on every exec node and the per-device memory report (peak, persistent, transient, M_eff, r_peak,
feasibility). The hardware profile is the cluster's (`hardware = "gh200"` or a path), unless `hardware=...`
overrides it. Every reconstructed formula of spec Section 9 can be switched to its alternative with the option
of the same name as in `rpegc.core.cost_options.CostOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.annotate import annotate
from rpegc.core.cost_options import CostOptions
from rpegc.core.errors import RpegError
from rpegc.core.hardware import Hardware, cluster_hardware
from rpegc.core.program import Program
from rpegc.passes.program_pass import check_hardware, transform

_D = CostOptions()


def program_hardware(p: Program, override: str = "") -> Hardware:
    if p.cluster is None:
        loc = p.graph.loc if p.graph is not None else p.workload.loc
        raise RpegError(loc, "annotate-cost needs an rpeg.cluster with a hardware profile")
    return cluster_hardware(p.cluster, override)


@dataclass(frozen=True)
class AnnotateCostPass(ModulePass):
    name = "annotate-cost"

    hardware: str = ""
    train_forward_equivalents: int = _D.train_forward_equivalents
    decode_attention_factor: int = _D.decode_attention_factor
    actor_critic_inference_heads: str = _D.actor_critic_inference_heads
    decode_rows: str = _D.decode_rows
    bubble_on_generation: bool = _D.bubble_on_generation
    generation_pp: str = _D.generation_pp
    pp_inter_tier: str = _D.pp_inter_tier
    checkpoint_interval: str = _D.checkpoint_interval
    recompute_buffer_third_term: bool = _D.recompute_buffer_third_term
    serving_weights_in_transient: bool = _D.serving_weights_in_transient
    alltoall_family: str = _D.alltoall_family
    tp_decode: str = _D.tp_decode
    scalar_head_act_width: str = _D.scalar_head_act_width
    dp_scalar_allreduces: int = _D.dp_scalar_allreduces

    def cost_options(self) -> CostOptions:
        return CostOptions(**{f.name: getattr(self, f.name) for f in fields(CostOptions)})

    def check_options(self, where=None) -> None:
        self.cost_options()
        check_hardware(self.hardware, where)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        def run(p: Program) -> Program:
            return annotate(p, program_hardware(p, self.hardware), self.cost_options())

        transform(self.name, op, run)
