"""What may fuse (stage fusion, docs/stage-fusion.md): the rules of a plan's `rpeg.fuse` and of an exec graph's
`exec.fusion`.

A plan fuses training vertices that
  F1  are training vertices of trainable models, each model trained by one member (their parameters stay apart);
  F2  are placed on the same allocation with the same dp, pp and tp (their stages are the same devices; the
      microbatch counts may differ);
  F3  train on the 1F1B schedule (the fused order keeps each member within 1F1B's live bound);
  F4  appear in one fusion each;
  F5  are not joined by a path of data edges (a fusion runs its members together: neither may wait for the other).
An exec fusion's members are training Op nodes of one step, placed as F2 says, that no path of the exec graph joins,
and its stages hold every microtask of every member exactly once (pp lists; mb_m forwards and backwards of member m
on each) in an order that can run.
"""

from __future__ import annotations

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import BACKWARD, FORWARD, ExecFusion, ExecGraph, Microtask
from rpegc.core.ir.geometry import Alloc, Strategy
from rpegc.core.ir.program import Program
from rpegc.core.sched.microtasks import MemberPipeline, microtask_times


def check_plan_fusions(p: Program) -> list[RpegError]:
    """F1-F4 for every `rpeg.fuse` of `p.plan` (its vertices are known names: the readers resolve them)."""
    if p.plan is None or p.graph is None:
        return []
    errors: list[RpegError] = []
    fused: dict[str, object] = {}
    for f in p.plan.fusions:
        why = _fuse_problem(p, f.vertices, fused)
        if why:
            errors.append(RpegError(f.loc, f"rpeg.fuse ({', '.join('@' + v for v in f.vertices)}): {why}"))
        for v in f.vertices:
            fused.setdefault(v, f.loc)
    return errors


def _fuse_problem(p: Program, names: tuple[str, ...], fused: dict[str, object]) -> str:
    """Why the vertices `names` may not fuse ('' when they may)."""
    assert p.graph is not None and p.plan is not None
    vertices = {v.name: v for v in p.graph.vertices}
    placed = {pl.vertex: pl for pl in p.plan.placements}
    for name in names:
        if name in fused:
            return f"@{name} is already fused (at {fused[name]}); a vertex joins one fusion"
        v = vertices.get(name)
        if v is None or v.role != "training" or not p.model(v.model).trainable:
            return f"@{name} is not a training vertex of a trainable model; only training operators fuse"
        if name not in placed:
            return f"@{name} has no placement"
    models = [vertices[n].model for n in names]
    if len(set(models)) < len(models):
        return "two members train the same model; fused operators keep their own parameters"
    first = placed[names[0]]
    for name in names[1:]:
        pl = placed[name]
        if not same_stages(pl.alloc, pl.strategy, first.alloc, first.strategy):
            return (f"@{name} is placed at {pl.alloc.origin} extent {pl.alloc.extent} with dp = {pl.strategy.dp} "
                    f"pp = {pl.strategy.pp} tp = {pl.strategy.tp}, @{names[0]} at {first.alloc.origin} extent "
                    f"{first.alloc.extent} with dp = {first.strategy.dp} pp = {first.strategy.pp} tp = "
                    f"{first.strategy.tp}; members share their devices and stages (mb may differ)")
    for name in names:
        schedule = p.workload.training(placed[name].strategy.train).schedule
        if schedule != "1f1b":
            return f"@{name} trains with schedule = {schedule}; fused members train with schedule = 1f1b"
    joined = path_between(((e.src, e.dst) for e in p.graph.data_edges), names)
    if joined:
        return (f"data edges lead from @{joined[0]} to @{joined[1]}; fused members run together, so neither may "
                "wait for the other")
    return ""


def path_between(edges, members) -> tuple[str, str] | None:
    """A pair (a, b) of `members` such that a path of `edges` leads from a to b, None when there is none."""
    succ: dict[str, list[str]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    targets = set(members)
    for a in members:
        stack, seen = [a], {a}
        while stack:
            for y in succ.get(stack.pop(), ()):
                if y in targets:
                    return a, y
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
    return None


def same_stages(a: Alloc, s: Strategy, b: Alloc, t: Strategy) -> bool:
    """Two operators whose pipeline stages are the same devices: one allocation, one layout (dp, pp, tp)."""
    return a == b and s.layout() == t.layout()


def check_exec_fusions(p: Program) -> list[RpegError]:
    """Every `exec.fusion` of `p.exec`: members as the plan rules say, stages holding each microtask once."""
    g = p.exec
    if g is None:
        return []
    errors: list[RpegError] = []
    seen: dict[str, str] = {}
    for f in g.fusions:
        why = _fusion_problem(g, f, seen)
        if why:
            errors.append(RpegError(f.loc, f"exec.fusion @{f.id}: {why}"))
    return errors


def _fusion_problem(g: ExecGraph, f: ExecFusion, seen: dict[str, str]) -> str:
    nodes = []
    for m in f.members:
        if m in seen:
            return f"@{m} is a member of @{seen[m]} too; a node joins one fusion"
        seen[m] = f.id
        try:
            nodes.append(g.node(m))
        except KeyError:
            return f"unknown member @{m}"
    if any(n.kind != "op" or n.role != "training" or n.strategy is None or n.alloc is None for n in nodes):
        return "every member is a placed training Op node"
    if len({n.step for n in nodes}) > 1 or len({n.model for n in nodes}) < len(nodes):
        return "the members are one step's training of different models"
    first = nodes[0]
    if any(not same_stages(n.alloc, n.strategy, first.alloc, first.strategy) for n in nodes):  # type: ignore[arg-type]
        return "the members share their allocation, dp, pp and tp"
    joined = path_between(((e.src, e.dst) for e in g.edges), f.members)
    if joined:
        return f"a path leads from @{joined[0]} to @{joined[1]}; fused members run together"
    pp, mbs = first.strategy.pp, [n.strategy.mb for n in nodes]  # type: ignore[union-attr]
    if len(f.stages) != pp:
        return f"it lists {len(f.stages)} stage(s); the members have pp = {pp}"
    for s, order in enumerate(f.stages):
        expected = sorted(Microtask(i, k, j, s) for i, mb in enumerate(mbs) for j in range(mb)
                          for k in (FORWARD, BACKWARD))
        if sorted(order) != expected:
            return (f"stage {s} must run each member's forward and backward of each of its microbatches once "
                    f"(mb = {', '.join(map(str, mbs))})")
    try:
        microtask_times(f.stages, tuple(MemberPipeline(mb, 1.0, 1.0) for mb in mbs))
    except ValueError as e:
        return str(e)
    return ""
