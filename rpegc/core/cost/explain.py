"""A plain-text account of the cost model for one program: every operator's time terms, every
device's memory by model and kind, and a feasibility verdict naming what overflows (spec 3, 5, 6).

Works on a module with a plan (per vertex) or with a lowered exec graph (adds its transfers).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import fields
from typing import Optional

import numpy as np

from rpegc.core.cost.annotate import (busy_factors, device_op, fusion_time, host_conditions, node_placement,
                                      node_runs, placement_time, program_memory, program_placements, transfer_time)
from rpegc.core.cost.options import DEFAULT_OPTIONS, CostOptions
from rpegc.core.ir.geometry import alloc_ids, id_ranges
from rpegc.core.cost.contention import devices_per_host
from rpegc.core.cost.host import placed_devices
from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.memory import FROZEN, SHADOW, TRAINING
from rpegc.core.cost.params import param_count
from rpegc.core.ir.program import Program, Workload
from rpegc.core.ir.training import Training
from rpegc.core.cost.residency import DeviceMemory

GIB = float(2**30)
_PERSISTENT_LABEL = {TRAINING: "optimizer state", SHADOW: "shadow copy", FROZEN: "frozen weights"}
# (the optimizer state of a model trained in fp32 includes its float32 weights, the masters)
_TIME_COLUMNS = ("T_gemm", "T_bubble", "T_tp", "T_pp", "T_dp", "T_non_gemm", "T_opt", "T_op")


def explain(p: Program, hw: Hardware, opts: CostOptions = DEFAULT_OPTIONS) -> str:
    placements = program_placements(p)
    mem = program_memory(p, hw, opts)
    out = [_header(p, hw, opts), "", "Operator time per vertex (seconds; unrolled steps share these)"]
    out += _time_table(p, placements, hw, opts)
    if p.exec is not None:
        out += ["", "Transfers in the executable graph"] + _transfer_lines(p, hw, opts)
    if p.exec is not None and p.exec.fusions:
        out += ["", "Fused operators (docs/stage-fusion.md; every step alike)"] + _fusion_lines(p, hw, opts)
    oh = hw.overhead
    if p.exec is not None and (oh.node or oh.node_free or oh.contention or oh.co_busy):
        out += ["", "The runtime's own costs per host ([overhead]; docs/cost-model.md, \"Hosts without a free core\")"]
        out += _host_lines(p, hw, opts)
    out += ["", f"Memory per device (GiB; usable M_eff = {_gib(mem.m_eff)} of M_GPU = {_gib(hw.M_GPU)})"]
    out += _memory_lines(mem, p.cluster.num_devices, p.workload)
    out += ["", _verdict(mem, p.workload)]
    return "\n".join(out) + "\n"


def _header(p: Program, hw: Hardware, opts: CostOptions) -> str:
    c, w = p.cluster, p.workload
    changed = [f"{f.name}={getattr(opts, f.name)}" for f in fields(opts) if getattr(opts, f.name) != f.default]
    lines = [
        f"Cost model for graph @{p.graph.name} on cluster @{c.name} "
        f"({c.racks} x {c.nodes} x {c.gpus} racks x nodes x GPUs = {c.num_devices} GPUs), "
        f"hardware '{hw.name}' ({hw.source})",
        f"workload B={w.B} R={w.R} Lp={w.Lp} Lr={w.Lr} dtype={w.dtype}; "
        + ("options: " + ", ".join(changed) if changed
           else "baseline options (docs/cost-model-spec.md Sec. 9 choices)"),
    ]
    return "\n".join(lines)


def _time_table(p, placements, hw, opts) -> list[str]:
    head = (["vertex", "role", "model", "dp,pp,tp,mb", "training", "GPUs"]
            + [c.replace("T_non_gemm", "T_non-gemm") for c in _TIME_COLUMNS])
    rows = []
    for pl in dict.fromkeys(placements):
        t = placement_time(p, pl, hw, opts)
        s = pl.strategy
        values = [t.T_gemm, t.T_bubble, t.T_tp, t.T_pp, t.T_dp, t.T_non_gemm, t.T_opt, t.T_op]
        rows.append([pl.vertex, pl.role, pl.model, f"{s.dp},{s.pp},{s.tp},{s.mb}", training_text(pl.training(p.workload)),
                     id_ranges(alloc_ids(pl.alloc, p.cluster))] + [f"{float(v):.4e}" for v in values])
        if pl.role == "generation":
            pf, dec = t.phase("prefill"), t.phase("decode")
            rows.append([f"  prefill {float(pf.T_gemm):.4e} s (F_eff {float(pf.F_eff):.3e}), decode {float(dec.T_gemm):.4e} s "
                         f"(F_eff {float(dec.F_eff):.3e}, eta {float(dec.eta):.3g})"])
    return _table(head, rows)


def _fusion_lines(p: Program, hw: Hardware, opts: CostOptions) -> list[str]:
    """Each fusion of step 0: its members, its time against theirs apart, and its schedule's makespan."""
    rows = []
    for f in p.exec.fusions:
        nodes = [p.exec.node(m) for m in f.members]
        if nodes[0].step != 0:
            continue
        fused = fusion_time(p, f, lambda n: placement_time(p, node_placement(n, p), hw, opts))
        apart = sum(fused.unfused)
        rows.append([f.id.split("#")[0], ", ".join(n.vertex for n in nodes), f"{fused.total:.4e}", f"{apart:.4e}",
                     f"{-100 * fused.saved / apart:+.1f}%", f"{fused.makespan:.4e}"])
    return _table(["fusion", "members", "T_fused", "T apart", "change", "microtask makespan"], rows)


def _transfer_lines(p: Program, hw: Hardware, opts: CostOptions) -> list[str]:
    groups: dict[tuple, list] = defaultdict(list)
    for n in p.exec.nodes:
        if n.kind == "op":
            continue
        t = transfer_time(n, p, hw, opts)
        dst = _where(n.alloc, p)
        if n.kind == "comm":
            key = (f"comm {n.container or n.model or ''}", n.bytes, _where(n.src_alloc, p), dst)
        else:
            model = p.model(n.model)
            key = (f"reshard {n.model}", param_count(model.arch, model.kind) * p.workload.s_b, dst, "same")
        groups[key].append(t)
    if not groups:
        return ["  none"]
    rows = [[what, f"{len(ts)}x", f"{nbytes:,.0f} B", f"{src} -> {dst}", f"{float(ts[0]):.4e} s each"]
            for (what, nbytes, src, dst), ts in groups.items()]
    return _table(["node", "count", "payload", "GPUs", "time"], rows)


def _host_lines(p: Program, hw: Hardware, opts: CostOptions) -> list[str]:
    """Per host of the plan's nodes: whether its cores are all taken, its nodes' control round trip, the factor of
    its operators' times, its device operators' and its verify nodes' (annotate.host_conditions), and the range of
    the device operators' factors of the cores computing beside them (annotate.busy_factors: their siblings, and the
    operators and pools the schedule overlaps)."""
    runs = node_runs(p, hw, opts)
    hosts, full, k = conditions = host_conditions(p, hw, p.exec, runs)
    factors = busy_factors(p, hw, p.exec, runs, conditions)
    siblings = {h: [b for n, at, b in zip(p.exec.nodes, hosts, factors) if at == h and device_op(n)]
                for h in set(hosts)}
    c = p.cluster
    devices = devices_per_host(placed_devices(p), c.gpus, c.racks * c.nodes)
    rows = [[f"node {h}", _cores_text(int(devices[h]), hw.host_cores, bool(full[h])), f"{hosts.count(h)}",
             f"{1e3 * hw.overhead.round_trip(bool(full[h])):.3g} ms", f"x {k[h]:.4f}", _span(siblings[h])]
            for h in sorted(set(hosts))]
    return _table(["host", "cores", "exec nodes", "round trip", "operators", "cores beside"], rows)


def _cores_text(devices: int, cores: Optional[int], full: bool) -> str:
    """A host's condition: its cores all taken or one left free, or more devices than cores (their workers would
    time-slice, which the model does not price: host.cores_needed)."""
    if cores is not None and devices > cores:
        return f"{devices} devices on {cores} cores: time-sliced, not priced"
    return "every core taken" if full else "a core left free"


def _span(factors: list[float]) -> str:
    """`x 1.0000-1.3500`: the least and greatest of a host's factors; `-` for none."""
    if not factors:
        return "-"
    lo, hi = min(factors), max(factors)
    return f"x {lo:.4f}" if lo == hi else f"x {lo:.4f}-{hi:.4f}"


def _where(alloc, p: Program) -> str:
    """The GPUs of an allocation, or the verifier pool's host (None)."""
    return "pool" if alloc is None else id_ranges(alloc_ids(alloc, p.cluster))


def training_text(train: Optional[Training]) -> str:
    """`mixed zero=2 recompute=interval 1f1b`, or "-" for a serving operator."""
    if train is None:
        return "-"
    return f"{train.precision} zero={train.zero} recompute={train.recompute} {train.schedule}"


def _device_items(mem: DeviceMemory, d: int, wl: Workload) -> list[tuple[str, float]]:
    """(label, bytes) of everything resident on device d at its peak."""
    items = []
    for model, res in mem.residency.items():
        code = int(res[d])
        if code in _PERSISTENT_LABEL and mem.persistent_by_model[model][d] > 0:
            items.append((f"{model} {_PERSISTENT_LABEL[code]}", float(mem.persistent_by_model[model][d])))
    i = int(mem.transient_owner[d])
    if i >= 0:  # the operator of the largest A(v, d), with the other members of its fusion (their transients add up)
        owners = next((g for g in mem.fused if i in g), (i,))
        for j in owners:
            op, m = mem.ops[j], mem.op_memory[j]
            parts = [("activations", m.M_act)]
            if op.role == "training":
                parts += [("working weights", m.M_w * (not op.training(wl).persistent_weights)),
                          ("gradients", m.M_grad)]
            if op.role == "generation":
                parts.append(("KV cache", m.M_kv))
            items += [(f"{op.vertex} {label}", float(v)) for label, v in parts if float(v) > 0]
        materialized = float(mem.transient[d]) - sum(float(mem.op_memory[j].A_core) for j in owners)
        if materialized > 0:
            items.append((f"{mem.ops[i].vertex} materialized weights", materialized))
    return items


def _memory_lines(mem: DeviceMemory, n: int, wl: Workload) -> list[str]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for d in range(n):
        groups[tuple((label, round(v)) for label, v in _device_items(mem, d, wl))].append(d)
    order = sorted(groups.items(), key=lambda kv: (-float(mem.peak[kv[1][0]]), kv[1][0]))
    lines = []
    for items, devices in order:
        name = f"device {devices[0]}" if len(devices) == 1 else f"devices {id_ranges(devices)}"
        peak = float(mem.peak[devices[0]])
        flag = "" if peak <= mem.m_eff else "  OVER"
        detail = " + ".join(f"{label} {_gib(v)}" for label, v in items) if items else "idle"
        lines.append(f"  {name}: peak {_gib(peak)}{flag} = {detail}")
    return lines


def _verdict(mem: DeviceMemory, wl: Workload) -> str:
    if mem.feasible:
        worst = int(np.argmax(mem.peak)) if mem.peak.size else 0
        return (f"feasible: every device fits; the fullest, device {worst}, peaks at {_gib(mem.peak[worst])} GiB "
                f"<= {_gib(mem.m_eff)} GiB usable (r_peak = {mem.r_peak:.4f})")
    groups: dict[tuple, list[int]] = defaultdict(list)
    for d in np.flatnonzero(mem.peak > mem.m_eff):
        groups[tuple((label, round(v)) for label, v in _device_items(mem, int(d), wl))].append(int(d))
    lines = [f"infeasible (r_peak = {mem.r_peak:.4f}):"]
    for items, devices in sorted(groups.items(), key=lambda kv: -float(mem.peak[kv[1][0]])):
        name = f"device {devices[0]}" if len(devices) == 1 else f"devices {id_ranges(devices)}"
        terms = " + ".join(f"{label} {_gib(v)} GiB" for label, v in items)
        lines.append(f"  {name}: {terms} = {_gib(mem.peak[devices[0]])} GiB > {_gib(mem.m_eff)} GiB usable")
    return "\n".join(lines)


def _gib(nbytes) -> str:
    return f"{float(nbytes) / GIB:.2f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    full = [r for r in rows if len(r) == len(head)]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *full)]
    def fmt(row):
        if len(row) != len(head):
            return "  " + row[0]
        return "  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()
    return [fmt(head)] + [fmt(r) for r in rows]
