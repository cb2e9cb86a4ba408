"""The microtask schedule of fused training operators (stage fusion, paper Sec. II and IV-B; RLHFuse's intra-stage
fusion; docs/stage-fusion.md): two or more training operators on the same devices and pipeline depth, each with its
own parameters and microbatches, run as one operator whose stages interleave the members' forward and backward
microtasks, so that one member's pipeline bubble is filled by another's work.

A microtask is one member's forward (F) or backward (B, recomputation included) of one microbatch on one stage. A
schedule is, for every stage, the order in which it runs its microtasks; a stage runs them one at a time, each as
soon as the stage is free and what it needs is done:
  * F(m, j, s) needs F(m, j, s-1) (the activations from the stage before);
  * B(m, j, s) needs F(m, j, s) and, below the last stage, B(m, j, s+1) (the gradient from the stage after).
`makespan` is the time of a schedule, `live_peak` the most microbatches whose activations a stage holds at once.

`fused_schedule` builds the order the plan records: a list schedule (each stage starts the ready microtask that can
start earliest; ties: backward first, then the member listed first, then the lower microbatch) under each member's
1F1B bound on live microbatches (at most pp - s on stage s, what spec 6.2 prices for one member), compared with
running the members one after another; the shorter of the two. One member alone gets 1F1B, whose makespan is
T_gemm (mb + pp - 1) / mb (spec 3.3) when every microtask of a kind takes the same time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from rpegc.core.ir.exec_graph import BACKWARD, FORWARD, Microtask, Schedule


@dataclass(frozen=True)
class MemberPipeline:
    """One fused member as its microtasks see it: `mb` microbatches, each taking `forward` and `backward` seconds
    on every stage (the stages hold equal shares of the layers)."""

    mb: int
    forward: float
    backward: float


def _needs(t: Microtask, pp: int) -> tuple[Microtask, ...]:
    """The microtasks of other stages (or the same stage's forward) that `t` waits for."""
    if t.kind == FORWARD:
        return (Microtask(t.member, FORWARD, t.micro, t.stage - 1),) if t.stage > 0 else ()
    own = Microtask(t.member, FORWARD, t.micro, t.stage)
    return (own, Microtask(t.member, BACKWARD, t.micro, t.stage + 1)) if t.stage < pp - 1 else (own,)


def _duration(t: Microtask, members: tuple[MemberPipeline, ...]) -> float:
    m = members[t.member]
    return m.forward if t.kind == FORWARD else m.backward


def microtask_times(schedule: Schedule, members: tuple[MemberPipeline, ...]) -> dict[Microtask, tuple[float, float]]:
    """(start, finish) of every microtask of `schedule`, each stage running its order; ValueError when the order
    cannot run (a microtask waits for one its stage or another runs only later: a cycle)."""
    pp = len(schedule)
    finish: dict[Microtask, float] = {}
    times: dict[Microtask, tuple[float, float]] = {}
    position = [0] * pp
    free = [0.0] * pp
    progressed = True
    while progressed:
        progressed = False
        for s in range(pp):
            while position[s] < len(schedule[s]):
                t = schedule[s][position[s]]
                needs = _needs(t, pp)
                if any(n not in finish for n in needs):
                    break
                start = max([free[s], *(finish[n] for n in needs)])
                finish[t] = free[s] = start + _duration(t, members)
                times[t] = (start, finish[t])
                position[s] += 1
                progressed = True
    if any(position[s] < len(schedule[s]) for s in range(pp)):
        stuck = [schedule[s][position[s]] for s in range(pp) if position[s] < len(schedule[s])]
        raise ValueError(f"the microtask order cannot run: {stuck[0]} waits for a microtask ordered after it")
    return times


def makespan(schedule: Schedule, members: tuple[MemberPipeline, ...]) -> float:
    """Seconds from the first microtask's start to the last one's finish."""
    times = microtask_times(schedule, members)
    return max((f for _, f in times.values()), default=0.0)


def live_peak(schedule: Schedule, members: tuple[MemberPipeline, ...], weights: tuple[float, ...]) -> float:
    """The largest sum over members of (microbatches whose forward ran and backward did not, on one stage) x the
    member's `weights` entry (e.g. its activation bytes per microbatch), over stages and positions in their order."""
    peak = 0.0
    for order in schedule:
        live = [0] * len(members)
        for t in order:
            live[t.member] += 1 if t.kind == FORWARD else -1
            peak = max(peak, sum(n * w for n, w in zip(live, weights)))
    return peak


def list_schedule(members: tuple[MemberPipeline, ...], pp: int) -> Schedule:
    """Each stage in turn of time starts the ready microtask that can start earliest (module docstring's ties),
    keeping every member within 1F1B's live bound pp - s on stage s and its microbatches in order per kind.

    A candidate is the next microtask of one (member, kind, stage); its start changes only when its stage starts
    something or what it needs finishes, so candidates sit in a heap and a start recomputes just those (an entry whose
    candidate changed since it was pushed is stale and skipped): O(n log n) for n microtasks, not a scan per start."""
    finish: dict[Microtask, float] = {}
    free = [0.0] * pp
    live = [[0] * len(members) for _ in range(pp)]
    next_micro = {(i, k, s): 0 for i in range(len(members)) for k in (FORWARD, BACKWARD) for s in range(pp)}
    version = dict.fromkeys(next_micro, 0)
    orders: list[list[Microtask]] = [[] for _ in range(pp)]
    heap: list = []

    def push(i: int, k: str, s: int) -> None:
        version[(i, k, s)] += 1
        j = next_micro[(i, k, s)]
        if j >= members[i].mb or (k == FORWARD and live[s][i] >= pp - s):
            return
        t = Microtask(i, k, j, s)
        needs = _needs(t, pp)
        if any(n not in finish for n in needs):
            return
        start = max([free[s], *(finish[n] for n in needs)])
        heapq.heappush(heap, ((start, k != BACKWARD, i, j, s), version[(i, k, s)], t))

    for i, k, s in next_micro:
        push(i, k, s)
    while heap:
        (start, *_), seen, t = heapq.heappop(heap)
        if seen != version[(t.member, t.kind, t.stage)]:
            continue
        finish[t] = free[t.stage] = start + _duration(t, members)
        live[t.stage][t.member] += 1 if t.kind == FORWARD else -1
        next_micro[(t.member, t.kind, t.stage)] += 1
        orders[t.stage].append(t)
        for i in range(len(members)):  # the stage is busy until t finishes
            push(i, FORWARD, t.stage)
            push(i, BACKWARD, t.stage)
        if t.stage + 1 < pp:
            push(t.member, FORWARD, t.stage + 1)
        if t.kind == BACKWARD and t.stage > 0:
            push(t.member, BACKWARD, t.stage - 1)
    assert sum(map(len, orders)) == 2 * pp * sum(m.mb for m in members), "a 1F1B member always has a ready microtask"
    return tuple(tuple(o) for o in orders)


def one_after_another(members: tuple[MemberPipeline, ...], pp: int) -> Schedule:
    """Every stage runs each member's 1F1B order in turn: what the members cost unfused, as one order."""
    alone = [list_schedule((m,), pp) for m in members]
    return tuple(tuple(Microtask(i, t.kind, t.micro, t.stage) for i, sched in enumerate(alone) for t in sched[s])
                 for s in range(pp))


def fused_schedule(members: tuple[MemberPipeline, ...], pp: int) -> Schedule:
    """The schedule a fusion of `members` on `pp` stages runs: the list schedule, unless running the members one
    after another is as fast (a fusion never prices above its members unfused)."""
    interleaved = list_schedule(members, pp)
    if len(members) == 1:
        return interleaved
    serial = one_after_another(members, pp)
    return interleaved if makespan(interleaved, members) < makespan(serial, members) else serial
