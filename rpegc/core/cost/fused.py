"""T_op of fused training operators (stage fusion; docs/stage-fusion.md): the members'
microtasks run as one schedule (rpegc/core/sched/microtasks.py), so the GEMM time and bubbles of the members, priced
apart as T_gemm (mb + P_p - 1) / mb each (spec 3.3), become the makespan of that schedule; every other term of a
member (T_tp, T_pp, T_dp, T_non-gemm, T_opt) is paid as it is unfused.

A microtask's time comes from the member's own terms: its T_gemm holds mb microbatches of n_fe forward-equivalent
passes on each stage (spec 2.2: forward 1, backward 2, recomputation 1), so one microbatch's forward on a stage takes
T_gemm / (mb n_fe) and its backward (recomputation included) T_gemm (n_fe - 1) / (mb n_fe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rpegc.core.cost.optime import OpTime
from rpegc.core.ir.geometry import Strategy
from rpegc.core.ir.program import Workload
from rpegc.core.sched.microtasks import MemberPipeline, Schedule, fused_schedule, makespan


def member_pipeline(t: OpTime, mb: int, forward_equivalents: int) -> MemberPipeline:
    """The microtasks of a training operator priced `t` with `mb` microbatches of `forward_equivalents` passes."""
    per_pass = float(t.T_gemm) / (mb * forward_equivalents)
    return MemberPipeline(mb=mb, forward=per_pass, backward=per_pass * (forward_equivalents - 1))


def unshared_time(t: OpTime) -> float:
    """What a member pays outside its microtasks: T_op less T_gemm and T_bubble (T_comm + T_non-gemm + T_opt)."""
    return float(t.T_comm + t.T_non_gemm + t.T_opt)


@dataclass(frozen=True)
class FusedTime:
    """T_op of a fusion: its schedule's makespan plus what each member pays outside its microtasks."""

    makespan: float  # seconds of the microtask schedule (the members' GEMMs and what is left of their bubbles)
    unshared: tuple[float, ...]  # per member: T_tp + T_pp + T_dp + T_non-gemm + T_opt
    unfused: tuple[float, ...]  # per member: its T_op priced alone

    @property
    def total(self) -> float:
        return self.makespan + sum(self.unshared)

    @property
    def saved(self) -> float:
        """Seconds the fusion saves against running its members one after another."""
        return sum(self.unfused) - self.total


def fused_time(times: tuple[OpTime, ...], members: tuple[MemberPipeline, ...], schedule: Schedule) -> FusedTime:
    """The fusion of the operators priced `times`, whose microtasks are `members`, running `schedule`."""
    return FusedTime(makespan=makespan(schedule, members), unshared=tuple(unshared_time(t) for t in times),
                     unfused=tuple(float(t.T_op) for t in times))


def fuse_operators(times: tuple[OpTime, ...], strategies: Sequence[Strategy],
                   wl: Workload) -> tuple[Schedule, FusedTime]:
    """The microtask order a fusion of the operators priced `times` and placed with `strategies` (one allocation and
    layout) runs on its stages (`fused_schedule`), each member with its microbatch count and its training's
    forward-equivalent passes, and the fusion's time under that order."""
    members = tuple(member_pipeline(t, s.mb, wl.training(s.train).forward_equivalents)
                    for t, s in zip(times, strategies))
    stages = fused_schedule(members, strategies[0].pp)
    return stages, fused_time(times, members, stages)
