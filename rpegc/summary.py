"""A one-screen summary of a module at whatever stage it is: graph, plan, exec graph, memory, schedule."""

from __future__ import annotations

from collections import Counter

from rpegc.core.cost.params import param_count
from rpegc.core.ir.program import Program

GB = 1e9


def _fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:g}"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def graph_lines(p: Program) -> list[str]:
    g = p.graph
    w = p.workload
    lines = [f"workload: B = {w.B} prompts x R = {w.R} rollouts, Lp = {w.Lp}, Lr = {w.Lr}, {w.dtype}"]
    rows = [["model", "kind", "state", "architecture", "params N_m", "tau"]]
    for m in p.models:
        arch = m.preset or f"{m.arch.layers}L d={m.arch.hidden}"
        tau = str(g.tau(m.name)) if (g and m.trainable) else "-"
        rows.append([f"@{m.name}", m.kind, "trainable" if m.trainable else "frozen", arch,
                     _fmt_count(param_count(m.arch, m.kind)), tau])
    lines += _table(rows)
    if g is None:
        return lines
    lines.append(f"graph @{g.name}: {len(g.vertices)} vertices, {len(g.data_edges)} data edges, "
                 f"{len(g.pub_edges)} publication edges, {len(g.containers)} containers")
    placements = {pl.vertex: pl for pl in p.plan.placements} if p.plan else {}
    rows = [["vertex", "role", "model", "reads -> writes", "placement"]]
    for v in g.vertices:
        pl = placements.get(v.name)
        where = ""
        if pl is not None:
            s = pl.strategy
            where = f"{pl.alloc.origin}+{pl.alloc.extent} dp={s.dp} pp={s.pp} tp={s.tp} mb={s.mb}"
            if v.role == "training":
                t = p.workload.training(s.train, pl.loc)
                where += f" {t.precision} zero={t.zero} recompute={t.recompute} {t.schedule}"
        io = ", ".join(v.reads) + " -> " + ", ".join(v.writes)
        rows.append([f"@{v.name}", v.role, f"@{v.model}", io, where])
    lines += _table(rows)
    for e in g.pub_edges:
        model = g.vertex(e.src).model
        lines.append(f"  publish @{e.src} -> @{e.dst} (%{e.container}), staleness tau(@{model}) = {g.tau(model)}")
    if g.quantiles:
        q = ", ".join(f"{x.f:g} by {x.tokens}" for x in g.quantiles)
        lines.append(f"  response-length quantiles: {q}")
    return lines


def exec_lines(p: Program) -> list[str]:
    x = p.exec
    kinds = Counter(n.kind for n in x.nodes)
    lines = [f"exec graph: K = {x.steps} steps, {len(x.nodes)} nodes ({kinds['op']} op, {kinds['comm']} comm, "
             f"{kinds['reshard']} reshard), {len(x.edges)} edges{', lowered' if x.lowered else ''}"]
    if x.memory is not None:
        mem = x.memory
        worst_dev, worst = max(mem.peak, key=lambda kv: kv[1])
        verdict = "fits" if mem.feasible else "DOES NOT FIT"
        lines.append(f"memory: peak {worst / GB:.1f} GB on device {worst_dev} of {mem.m_eff / GB:.1f} GB usable "
                     f"(r_peak = {mem.r_peak:.3f}) -> {verdict}")
    if x.schedule is not None:
        s = x.schedule
        lines.append(f"schedule: makespan {s.makespan:.4g} s for {x.steps} steps, throughput {s.score:.4g} tokens/s "
                     f"(penalised {s.score_pen:.4g}), utilization {s.util:.3f}, P_eff {s.p_eff:.2f}")
    return lines


def summary(p: Program) -> str:
    lines = [f"== rpegc summary: {p.file} =="]
    lines += graph_lines(p)
    if p.cluster is not None:
        c = p.cluster
        lines.append(f"cluster @{c.name}: {c.racks} racks x {c.nodes} nodes x {c.gpus} GPUs = {c.num_devices} "
                     f"devices, hardware {c.hardware}")
    if p.exec is not None:
        lines += exec_lines(p)
    return "\n".join(lines) + "\n"
