"""fuse-stages: the plan's `rpeg.fuse` groups become `exec.fusion` operators (stage fusion, paper Sec. II and IV-B;
docs/stage-fusion.md). After lowering (the Comm and Reshard nodes exist), for every fusion of the plan and every
step, the members' training Op nodes of that step form one fusion whose stages run the fused microtask order
(`rpegc.core.sched.microtasks.fused_schedule`) with each microtask priced from its member's T_gemm
(`rpegc.core.cost.fused.member_pipeline`). The members keep their nodes, edges and bindings.
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.check.fusion_rules import check_plan_fusions
from rpegc.core.cost.annotate import node_placement, placement_time
from rpegc.core.cost.fused import fuse_operators
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import ExecFusion, ExecNode
from rpegc.core.ir.program import Program


def fuse_stages(p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> Program:
    """`p` with one exec fusion per step for every `rpeg.fuse` of its plan (none: `p` unchanged)."""
    if p.plan is None or not p.plan.fusions:
        return p
    if p.exec is None or not p.exec.lowered:
        where = p.exec.loc if p.exec is not None else p.plan.fusions[0].loc
        raise RpegError(where, "fuse-stages needs a lowered executable graph; run unroll, split-quantiles, "
                               "insert-comm and insert-reshard first")
    if p.exec.fusions:
        raise RpegError(p.exec.fusions[0].loc, "the exec graph is fused already; run fuse-stages once")
    errors = check_plan_fusions(p)
    if errors:
        raise errors[0]
    training = {(n.vertex, n.step): n for n in p.exec.nodes if n.kind == "op" and n.role == "training"}
    fusions = []
    for i, fuse in enumerate(p.plan.fusions):
        stages = None
        for step in range(p.exec.steps):
            members = [training.get((v, step)) for v in fuse.vertices]
            if any(m is None for m in members):
                raise RpegError(fuse.loc, f"step {step} has no training node of every member; fuse-stages fuses "
                                          "the training of each step")
            if stages is None:  # every step places its members alike
                stages = _stages(p, members, hw, opts)  # type: ignore[arg-type]
            ids = tuple(m.id for m in members)  # type: ignore[union-attr]
            fusions.append(ExecFusion(f"fuse{i}#{step}", ids, stages, loc=fuse.loc))
    return replace(p, exec=replace(p.exec, fusions=tuple(fusions)))


def _stages(p: Program, members: list[ExecNode], hw: Hardware, opts: CostOptions):
    times = tuple(placement_time(p, node_placement(n, p), hw, opts) for n in members)
    stages, _ = fuse_operators(times, [n.strategy for n in members], p.workload)  # type: ignore[misc]
    return stages
