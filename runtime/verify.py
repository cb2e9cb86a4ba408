"""Execution verification: does a runtime trace execute the plan it claims to? (paper Sec. VII,
"Execution verification"; docs/architecture.md, Runtime.)

`verify(plan, trace)` returns every violation found, each naming its rule and the node(s):

- plan-hash   the trace ran a plan with another hash (nothing else is checked then)
- node-set    nodes of the first `steps` steps missing from the trace, or nodes the plan lacks
- binding     a node held other devices or workers than R(x) under the trace's reservation rule,
              or ran with another (dp, pp, tp, mb), or bound other artifacts than the plan's
- timing      start before dispatch, or finish before start
- dependency  a node started before a predecessor finished
- device      two nodes held one device at the same time (also `worker` for worker ranks); the members of a
              fusion hold theirs together, as one operator
- fusion      the members of a fusion (exec.fusion) did not start together and finish together, or (where the
              trace records the members' microtasks, as the torch backend's does) a worker ran its stage's
              microtasks in another order than the fusion's, overlapping, or not all of them
- version     a node consumed or produced another parameter version than the plan's version_in /
              version_out
- version-rule a consumer at step k did not read max(0, k - tau(m)) (a training node of m: k;
              a frozen model: 0), or training at step k did not produce k + 1
- update-order two updates of one model overlap or run out of step order
- release     an artifact was released while a consumer had not finished or a producer had not
              run, released twice, never made, or is one the plan keeps
- order       ("plan" policy only) a node started before the node the plan runs before it on a
              shared device finished

`compare(plan, trace)` sets predicted (node.time/start/finish) beside measured times per node; its
node-time error is also taken over the steady-state steps (all but the first; see
rpegc.runtime.report for start-up and steady state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rpegc.runtime.controller import device_order_edges, reserved_devices
from rpegc.runtime.plan import RunNode, RunPlan
from rpegc.runtime.trace import NodeRecord, Trace

RULES = (
    "plan-hash", "node-set", "binding", "timing", "dependency", "device", "worker", "fusion", "version",
    "version-rule", "update-order", "release", "order",
)


@dataclass(frozen=True)
class Violation:
    rule: str
    nodes: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


def verify(plan: RunPlan, trace: Trace) -> list[Violation]:
    h = trace.header
    if h.plan_hash != plan.hash:
        return [Violation("plan-hash", (), f"the trace ran plan {h.plan_hash[:16]}…, but this plan is "
                                           f"{plan.hash[:16]}…; verify the trace against the plan it ran")]
    out: list[Violation] = []
    if h.plan_steps != plan.plan_steps or not 1 <= h.steps <= plan.plan_steps:
        return [Violation("node-set", (), f"the trace ran {h.steps} of {h.plan_steps} steps, but the plan has "
                                          f"{plan.plan_steps} steps")]
    plan = _as_run(plan, h)
    if h.first_step >= h.steps and h.first_step:
        return [Violation("node-set", (), f"the trace resumed at step {h.first_step} but ran only {h.steps} steps")]
    recs = trace.nodes
    out += _node_set(plan, recs)
    for n in plan.nodes:
        r = recs.get(n.id)
        if r is None:
            continue
        out += _binding(n, r, h.reserve, h.workers)
        out += _timing(n, r)
        out += _dependencies(plan, n, r, recs)
        out += _versions(plan, n, r)
    out += _exclusive(plan, recs, "device", lambda r: r.devices)
    out += _exclusive(plan, recs, "worker", lambda r: r.workers)
    out += _fusions(plan, recs)
    out += _update_order(plan, recs)
    out += _releases(plan, trace)
    if h.policy == "plan" and plan.scheduled:
        out += _plan_order(plan, recs, h.reserve)
    order = {rule: i for i, rule in enumerate(RULES)}
    return sorted(out, key=lambda v: (order.get(v.rule, len(RULES)), v.nodes, v.message))


def _node_set(plan: RunPlan, recs: dict[str, NodeRecord]) -> list[Violation]:
    out = []
    missing = [n.id for n in plan.nodes if n.id not in recs]
    extra = [i for i in recs if i not in plan.index]
    if missing:
        out.append(Violation("node-set", tuple(missing), f"{len(missing)} node(s) of the plan never ran: "
                                                         f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"))
    for i in extra:
        out.append(Violation("node-set", (i,), f"node {i} ran but is not in the plan's first {plan.steps} step(s)"))
    return out


def _binding(n: RunNode, r: NodeRecord, reserve: str, workers: dict[int, int]) -> list[Violation]:
    out = []
    if r.kind != n.kind or r.step != n.step:
        out.append(Violation("binding", (n.id,), f"{n.id} is a {n.kind} node of step {n.step}, the trace says "
                                                 f"{r.kind} of step {r.step}"))
    want = reserved_devices(n, reserve)
    if r.devices != want:
        out.append(Violation("binding", (n.id,), f"{n.id} held devices {_short(r.devices)}, its resource set is "
                                                 f"{_short(want)} ({reserve} rule)"))
    else:
        ranks = tuple(workers.get(d, -1) for d in want)
        if r.workers != ranks:
            out.append(Violation("binding", (n.id,), f"{n.id} ran on workers {_short(r.workers)}, the devices' "
                                                     f"workers are {_short(ranks)}"))
    s = n.node.strategy
    want_s = (s.dp, s.pp, s.tp, s.mb) if s is not None else None
    if r.strategy != want_s:
        out.append(Violation("binding", (n.id,), f"{n.id} ran with (dp, pp, tp, mb) = {r.strategy}, "
                                                 f"the plan says {want_s}"))
    for what, got, plan_side in (("bound", r.inputs, n.inputs), ("left", r.outputs, n.outputs)):
        labels = tuple(a.label for a in plan_side)
        if tuple(got) != labels:
            out.append(Violation("binding", (n.id,), f"{n.id} {what} {list(got)}, the plan says {list(labels)}"))
    return out


def _timing(n: RunNode, r: NodeRecord) -> list[Violation]:
    if r.start < r.dispatch or r.finish < r.start:
        return [Violation("timing", (n.id,), f"{n.id}: dispatch {r.dispatch}, start {r.start}, finish {r.finish} "
                                             "are not in order")]
    return []


def _dependencies(plan: RunPlan, n: RunNode, r: NodeRecord, recs: dict[str, NodeRecord]) -> list[Violation]:
    out = []
    for u in n.preds:
        pu = plan.nodes[u]
        ru = recs.get(pu.id)
        if ru is not None and r.start < ru.finish:
            out.append(Violation("dependency", (pu.id, n.id), f"{n.id} started at {r.start} before its predecessor "
                                                              f"{pu.id} finished at {ru.finish}"))
    return out


def expected_version(plan: RunPlan, n: RunNode, model: str) -> int:
    """The version a node of step k must read of `model` (paper Sec. IV-B, App. A-F)."""
    p = plan.program
    trainable = any(m.name == model and m.trainable for m in p.models)
    k = n.step
    if not trainable:
        return 0
    if n.node.role == "training" and n.node.model == model:
        return k
    return max(0, k - plan.tau.get(model, 0))


def _versions(plan: RunPlan, n: RunNode, r: NodeRecord) -> list[Violation]:
    out = []
    planned_in = dict(n.node.version_in)
    got_in = dict(r.consumed)
    if got_in != planned_in:
        out.append(Violation("version", (n.id,), f"{n.id} consumed {_versions_text(got_in)}, the plan says "
                                                 f"{_versions_text(planned_in)}"))
    if dict(r.produced) != dict(n.node.version_out):
        out.append(Violation("version", (n.id,), f"{n.id} produced {_versions_text(dict(r.produced))}, the plan says "
                                                 f"{_versions_text(dict(n.node.version_out))}"))
    if n.kind != "op":
        return out
    for m, v in list(planned_in.items()) + [(m, v) for m, v in got_in.items() if planned_in.get(m) != v]:
        want = expected_version(plan, n, m)
        if v != want:
            why = "training reads the latest update" if n.node.role == "training" and n.node.model == m else (
                f"max(0, k - tau) with tau(@{m}) = {plan.tau.get(m, 0)}")
            out.append(Violation("version-rule", (n.id,), f"{n.id} (step {n.step}) reads v{v} of @{m}; it must read "
                                                          f"v{want} ({why})"))
    if n.node.role == "training":
        for m, v in r.produced:
            if v != n.step + 1:
                out.append(Violation("version-rule", (n.id,), f"{n.id} (step {n.step}) produced v{v} of @{m}; "
                                                              f"training at step k produces k + 1 = {n.step + 1}"))
    return out


def _fusions(plan: RunPlan, recs: dict[str, NodeRecord]) -> list[Violation]:
    out = []
    fusions = {f.members: f for f in plan.program.exec.fusions} if plan.program.exec is not None else {}
    for group in plan.fusion_groups():
        rs = [recs[plan.nodes[i].id] for i in group if plan.nodes[i].id in recs]
        ids = tuple(r.id for r in rs)
        if len({(r.start, r.finish) for r in rs}) > 1:
            out.append(Violation("fusion", ids, "the members of a fusion ran apart: " + ", ".join(
                f"{r.id} {r.start}-{r.finish}" for r in rs) + "; they run as one operator"))
        if len(rs) == len(group) and any(r.microtasks for r in rs):
            why = _microtask_order(fusions[ids], rs)
            if why:
                out.append(Violation("fusion", ids, why))
    return out


def _microtask_order(fusion, rs: list[NodeRecord]) -> str:
    """Why the members' recorded microtasks are not the fusion's order on every worker ('' when they are)."""
    by_rank: dict[int, list[tuple[float, float, int, str, int, int]]] = {}
    for member, r in enumerate(rs):
        missing = set(r.workers) - {t[0] for t in r.microtasks}
        if missing:
            return f"{r.id} has no microtask records from worker(s) {sorted(missing)}"
        for rank, stage, kind, micro, start, finish in r.microtasks:
            by_rank.setdefault(rank, []).append((start, finish, member, kind, micro, stage))
    for rank, ran in sorted(by_rank.items()):
        ran.sort()
        stages = {t[5] for t in ran}
        stage = min(stages)
        if len(stages) > 1 or stage >= len(fusion.stages):
            return f"worker {rank} reports microtasks of stage(s) {sorted(stages)}, one stage of {len(fusion.stages)}"
        plan_order = [(t.member, t.kind, t.micro) for t in fusion.stages[stage]]
        rounds = len(ran) // max(1, len(plan_order))  # one round of the stage's order per optimizer step
        if [(m, k, j) for _, _, m, k, j, _ in ran] != plan_order * rounds:
            return f"worker {rank} ran stage {stage}'s microtasks in another order than the fusion's"
        for a, b in zip(ran, ran[1:]):
            if b[0] < a[1]:
                return f"worker {rank} ran two microtasks at once ({a[3]}{a[2]}.{a[4]} and {b[3]}{b[2]}.{b[4]})"
    return ""


def _exclusive(plan: RunPlan, recs: dict[str, NodeRecord], rule: str, held) -> list[Violation]:
    fused = {plan.nodes[i].id: g for g in plan.fusion_groups() for i in g}
    by_unit: dict[int, list[NodeRecord]] = {}
    for n in plan.nodes:
        r = recs.get(n.id)
        if r is not None:
            for u in held(r):
                by_unit.setdefault(u, []).append(r)
    clashes: dict[tuple[str, str], list[int]] = {}
    for unit, rs in by_unit.items():
        rs.sort(key=lambda r: (r.start, r.finish))
        last: Optional[NodeRecord] = None
        for r in rs:
            together = last is not None and last.id in fused and fused.get(r.id) == fused[last.id]
            if last is not None and r.start < last.finish and last.start < r.finish and not together:
                clashes.setdefault((last.id, r.id), []).append(unit)
            if last is None or r.finish > last.finish:
                last = r
    return [
        Violation(rule, pair, f"{pair[0]} and {pair[1]} held {rule} {_short(tuple(units))} at the same time "
                              f"({recs[pair[0]].start}-{recs[pair[0]].finish} and {recs[pair[1]].start}-"
                              f"{recs[pair[1]].finish})")
        for pair, units in clashes.items()
    ]


def _update_order(plan: RunPlan, recs: dict[str, NodeRecord]) -> list[Violation]:
    out = []
    updates: dict[str, list[NodeRecord]] = {}
    for n in plan.nodes:
        r = recs.get(n.id)
        if r is not None and n.kind == "op":
            for m, _ in r.produced:
                updates.setdefault(m, []).append(r)
    for m, rs in updates.items():
        rs.sort(key=lambda r: r.step)
        for a, b in zip(rs, rs[1:]):
            va, vb = dict(a.produced)[m], dict(b.produced)[m]
            if not (vb > va and b.start >= a.finish):
                out.append(Violation("update-order", (a.id, b.id),
                                     f"updates of @{m} are not ordered: {a.id} (v{va}, {a.start}-{a.finish}) and "
                                     f"{b.id} (v{vb}, {b.start}-{b.finish})"))
    return out


def _releases(plan: RunPlan, trace: Trace) -> list[Violation]:
    out = []
    known = {a.label: a for a in list(plan.producers) + list(plan.initial)}
    initial = {a.label for a in plan.initial}
    retained = {a.label for a in plan.retained}
    recs = trace.nodes
    released: dict[str, float] = {}
    for e in trace.events:
        if e.kind == "install":
            if e.artifact not in initial:
                out.append(Violation("release", (), f"{e.artifact} was installed at launch, but the plan installs "
                                                    "only the initial checkpoint copies it reads"))
            continue
        a = known.get(e.artifact)
        after = (e.after,) if e.after else ()
        if a is None:
            out.append(Violation("release", after, f"{e.artifact} was released but the plan never makes it"))
            continue
        if e.artifact in released:
            out.append(Violation("release", after, f"{e.artifact} was released twice"))
        released[e.artifact] = e.time
        if e.artifact in retained:
            out.append(Violation("release", after, f"{e.artifact} was released, but it is a result the plan keeps"))
        for i in plan.consumers.get(a, ()):
            c = plan.nodes[i]
            r = recs.get(c.id)
            if r is None or r.finish > e.time:
                when = "never ran" if r is None else f"finished at {r.finish}"
                out.append(Violation("release", (c.id,), f"{e.artifact} was released at {e.time} while its consumer "
                                                         f"{c.id} still needed it ({when})"))
        for i in plan.producers.get(a, ()):
            p = plan.nodes[i]
            r = recs.get(p.id)
            if r is None or r.finish > e.time:
                out.append(Violation("release", (p.id,), f"{e.artifact} was released at {e.time} before its producer "
                                                         f"{p.id} ran"))
    return out


def _plan_order(plan: RunPlan, recs: dict[str, NodeRecord], reserve: str) -> list[Violation]:
    reserved = [reserved_devices(n, reserve) for n in plan.nodes]
    out = []
    for u, v in sorted(device_order_edges(plan, reserved)):
        ru, rv = recs.get(plan.nodes[u].id), recs.get(plan.nodes[v].id)
        if ru is not None and rv is not None and rv.start < ru.finish:
            out.append(Violation("order", (ru.id, rv.id),
                                 f"{rv.id} started at {rv.start} before {ru.id}, which the plan runs before it "
                                 f"on a shared device, finished at {ru.finish}"))
    return out


def _versions_text(v: dict) -> str:
    return "{" + ", ".join(f"@{m} v{x}" for m, x in v.items()) + "}" if v else "no versions"


def _short(ids: tuple[int, ...]) -> str:
    if len(ids) <= 6:
        return str(list(ids))
    return f"[{ids[0]}, {ids[1]}, ..., {ids[-1]}] ({len(ids)})"


# ----------------------------------------------------------------------------------------------
# Predicted vs measured
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeTiming:
    id: str
    kind: str
    step: int
    predicted_time: Optional[float]
    predicted_start: Optional[float]
    predicted_finish: Optional[float]
    measured_start: float
    measured_finish: float

    @property
    def measured_time(self) -> float:
        return self.measured_finish - self.measured_start

    @property
    def rel_error(self) -> Optional[float]:
        """(measured - predicted) / predicted duration; None without a positive prediction."""
        if not self.predicted_time:
            return None
        return (self.measured_time - self.predicted_time) / self.predicted_time


@dataclass(frozen=True)
class Comparison:
    nodes: tuple[NodeTiming, ...]
    predicted_makespan: Optional[float]
    measured_makespan: float

    @property
    def mean_abs_rel_error(self) -> Optional[float]:
        """Over every node of the run."""
        return _mean_abs([t.rel_error for t in self.nodes])

    @property
    def steady_steps(self) -> tuple[int, ...]:
        """The steps after the run's first (rpegc.runtime.report); all steps when it ran one."""
        steps = sorted({t.step for t in self.nodes})
        return tuple(steps[1:]) or tuple(steps)

    @property
    def steady_abs_rel_error(self) -> Optional[float]:
        """Mean |node time error| over the steady-state steps' nodes (the first step's warm-up left out)."""
        keep = set(self.steady_steps)
        return _mean_abs([t.rel_error for t in self.nodes if t.step in keep])

    @property
    def makespan_ratio(self) -> Optional[float]:
        if not self.predicted_makespan:
            return None
        return self.measured_makespan / self.predicted_makespan


def _mean_abs(errors) -> Optional[float]:
    errs = [abs(e) for e in errors if e is not None]
    return sum(errs) / len(errs) if errs else None


def _as_run(plan: RunPlan, h) -> RunPlan:
    """The part of `plan` the trace's run executed: its first `steps` steps, from `first_step` on."""
    if h.steps != plan.steps and 1 <= h.steps <= plan.plan_steps:
        plan = plan.restrict(h.steps)
    if h.first_step and h.first_step != plan.first_step and h.first_step < h.steps:
        plan = plan.from_step(h.first_step)
    return plan


def compare(plan: RunPlan, trace: Trace) -> Comparison:
    plan = _as_run(plan, trace.header)
    rows = []
    for n in plan.nodes:
        r = trace.nodes.get(n.id)
        if r is None:
            continue
        rows.append(NodeTiming(n.id, n.kind, n.step, n.node.time, n.node.start, n.node.finish, r.start, r.finish))
    return Comparison(tuple(rows), plan.predicted_makespan, trace.makespan)
