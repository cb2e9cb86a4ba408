"""Gantt charts of scheduled executable graphs (paper Fig. 1, 18, 19): devices down, time across.

A chart is drawn from plain `Bar`s (device ids, start, finish, kind, label), so the runtime can draw
a measured trace beside the predicted schedule: `draw_bars([("predicted", bars_from_program(p)),
("measured", bars_from_trace)], "run.png")`. Panels share the time axis and the device rows.

Fused training operators (stage fusion) are one block in a predicted schedule, labelled with their fusion; a
measured trace adds each worker's microtasks on top of the members' blocks (`microtask_bars`), one colour per member
and labelled F/B with the microbatch, so the interleaving shows.

Large clusters stay legible: devices that take part in exactly the same bars collapse into one row
("GPUs 0-31"), and if there are still too many rows, whole nodes with the same bars share a row.
Uses matplotlib's object API (no pyplot), so importing this module changes no global state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from rpegc.core.cost.host import alloc_devices
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.geometry import id_ranges
from rpegc.core.ir.program import Program
from rpegc.outputs import GANTT_FORMATS as FORMATS

KIND_COLOURS = {
    "generation": "#4C72B0",
    "inference": "#55A868",
    "training": "#C44E52",
    "comm": "#8C8C8C",
    "reshard": "#8172B2",
}
OTHER_COLOURS = ("#CCB974", "#DD8452", "#64B5CD", "#937860", "#DA8BC3")  # other kinds (fused members), in order

_FONT = 7.0  # points, text on bars
_ROW_IN = 0.28  # inches per device row
_LEFT_IN, _RIGHT_IN, _TOP_IN, _BOTTOM_IN, _GAP_IN = 1.5, 0.3, 0.75, 0.5, 0.45
_WIDTH_IN = 12.0
_DPI = 120


@dataclass(frozen=True)
class Bar:
    """One node's execution: it occupies `devices` from `start` to `finish` (seconds)."""

    devices: tuple[int, ...]  # flat device ids (Op: its allocation; Comm/Reshard: destination)
    start: float
    finish: float
    kind: str  # generation | inference | training | comm | reshard (anything else: one neutral colour)
    label: str  # drawn on the bar when it fits, e.g. "gen#3.q1"
    short: str = ""  # drawn instead when `label` does not fit: the vertex, e.g. "gen" (or "comm", "reshard")
    node: str = ""  # identity across panels (exec node id); rows group devices by the nodes they run


@dataclass(frozen=True)
class Row:
    devices: tuple[int, ...]
    label: str


def bars_from_program(p: Program) -> list[Bar]:
    """The scheduled nodes of `p.exec` as bars; role colours Op nodes, kind colours transfers."""
    if p.exec is None or p.cluster is None:
        raise RpegError(None, "nothing to draw: the module needs a cluster and a scheduled executable graph")
    fused = {m: f for f in p.exec.fusions for m in f.members}
    bars = []
    for n in p.exec.nodes:
        f = fused.get(n.id)
        if f is not None and n.id != f.members[0]:
            continue  # the first member's bar stands for the fusion
        if n.start is None or n.finish is None:
            raise RpegError(
                n.loc, f"node {n.id} has no start/finish; run the schedule pass before drawing a Gantt chart"
            )
        # the verifier pool (no allocation: a verify node, a transfer into it) has the row past the devices, and
        # holds the devices whose cores it shares (cost/host.py)
        bar = node_bar(n, tuple(sorted(set(alloc_devices(n.alloc, p.cluster)) | set(n.shares))), n.start, n.finish)
        if f is not None:
            members = " + ".join(p.exec.node(m).vertex or m for m in f.members)
            bar = replace(bar, label=f"{f.id}: {members}", short=f.id)
        bars.append(bar)
    return bars


def microtask_bars(member: str, index: int, microtasks, device_of_rank: dict[int, int],
                   shift: float = 0.0) -> list[Bar]:
    """The microtasks a fused member's workers ran ((rank, stage, "F" | "B", microbatch, start, finish), a trace's
    record), as bars on the workers' devices: kind = the member's vertex (one colour each), label e.g. "F3"."""
    return [Bar((device_of_rank[rank],), start - shift, finish - shift, member, f"{kind}{micro}", f"{kind}{micro}",
                f"{member}/{index}")
            for rank, _stage, kind, micro, start, finish in microtasks]


def node_bar(n, devices: tuple[int, ...], start: float, finish: float) -> Bar:
    """The bar of exec node `n` (planned or measured times): coloured by role (Op) or kind (transfers),
    labelled with its id, or its vertex name where the id does not fit."""
    kind = n.role if n.kind == "op" and n.role else n.kind
    name = vertex_name(n)
    label = n.id if n.kind == "op" else f"{name} {n.id}"
    return Bar(tuple(devices), start, finish, kind, label, name, n.id)


def vertex_name(n) -> str:
    """What a block says it is: the Op node's vertex (`gen`, `train_actor`), else its kind (`comm`)."""
    if n.kind == "op" and n.vertex:
        return str(n.vertex)
    return str(n.kind)


def _device_label(devices: Sequence[int], unit: str = "GPU") -> str:
    if len(devices) == 1:
        return f"{unit} {devices[0]}"
    text = id_ranges(devices)
    if len(text) > 16:
        text = text[:14].rsplit(",", 1)[0] + ",…"
    return f"{unit}s {text} ({len(devices)})" if "," in text else f"{unit}s {text}"


def _group(keys: dict[int, frozenset], units: Sequence[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Group units (tuples of devices) whose devices run the same set of bars; ordered by first device."""
    by_sig: dict[frozenset, list[tuple[int, ...]]] = {}
    for unit in units:
        sig = frozenset().union(*(keys[d] for d in unit))
        by_sig.setdefault(sig, []).append(unit)
    return sorted(by_sig.values(), key=lambda g: g[0][0])


def device_rows(
    panels: Sequence[Sequence[Bar]],
    num_devices: int,
    collapse: bool,
    gpus_per_node: Optional[int] = None,
    max_rows: int = 40,
    unit: str = "GPU",
) -> list[Row]:
    """The chart's rows: one per device, or (collapse) one per group of devices that run the same bars.
    unit names a row's device: "GPU" (default) or "worker" (a CPU worker process of the torch backend)."""
    keys: dict[int, set] = {d: set() for d in range(num_devices)}
    for p, bars in enumerate(panels):
        for i, bar in enumerate(bars):
            key = bar.node or (p, i)
            for d in bar.devices:
                keys.setdefault(d, set()).add(key)
    frozen = {d: frozenset(k) for d, k in keys.items()}
    devices = sorted(frozen)
    if not collapse:
        return [Row((d,), f"{unit} {d}" if d < num_devices else "verifier pool") for d in devices]
    groups = _group(frozen, [(d,) for d in devices])
    if len(groups) > max_rows and gpus_per_node:
        nodes = sorted({d // gpus_per_node for d in devices})
        units = [tuple(d for d in devices if d // gpus_per_node == n) for n in nodes]
        groups = _group(frozen, units)
    rows = []
    for group in groups:
        devs = tuple(sorted(d for unit in group for d in unit))
        label = _device_label(devs, unit) if devs[0] < num_devices else "verifier pool"
        if len(group[0]) > 1:  # node-level rows
            node_ids = sorted({d // gpus_per_node for d in devs})
            label = f"node {node_ids[0]}" if len(node_ids) == 1 else f"nodes {id_ranges(node_ids)}"
            label = label if len(label) <= 18 else label[:16].rsplit(",", 1)[0] + ",…"
        rows.append(Row(devs, label))
    return rows


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs (first, last) of ascending row indices."""
    runs = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _text_fits(text: str, width_px: float, height_px: float) -> bool:
    char_px = _FONT * 0.62 * _DPI / 72
    return bool(text) and len(text) * char_px + 4 <= width_px and _FONT * 1.3 * _DPI / 72 <= height_px


def _draw_panel(ax, bars: Sequence[Bar], row_of: dict[int, int], px_per_s: float, px_per_row: float,
                kinds_seen: list[str]) -> None:
    """Rectangles (one per contiguous run of rows) and, where they fit without overlapping, labels."""
    labelled: dict[int, list[tuple[float, float]]] = {}
    for bar in bars:
        if bar.kind not in kinds_seen:
            kinds_seen.append(bar.kind)
        colour = _colour(bar.kind, kinds_seen)
        runs = _runs(sorted({row_of[d] for d in bar.devices}))
        for first, last in runs:
            ax.add_patch(
                Rectangle(
                    (bar.start, first + 0.06),
                    bar.finish - bar.start,
                    last - first + 1 - 0.12,
                    facecolor=colour,
                    edgecolor="white",
                    linewidth=0.4,
                )
            )
        if not runs:
            continue
        first, last = max(runs, key=lambda r: r[1] - r[0])
        w_px, h_px = (bar.finish - bar.start) * px_per_s, (last - first + 1) * px_per_row * 0.88
        text = bar.label if _text_fits(bar.label, w_px, h_px) else bar.short
        if not _text_fits(text, w_px, h_px):
            continue
        # Node-level rows can hold overlapping bars; never print one label over another.
        half = (len(text) * _FONT * 0.62 * _DPI / 72 + 4) / 2 / px_per_s
        mid = (bar.start + bar.finish) / 2
        span = (mid - half, mid + half)
        if any(lo < span[1] and span[0] < hi for r in range(first, last + 1) for lo, hi in labelled.get(r, ())):
            continue
        for r in range(first, last + 1):
            labelled.setdefault(r, []).append(span)
        ax.text(
            mid, (first + last + 1) / 2, text, ha="center", va="center", fontsize=_FONT, color="white", clip_on=True
        )


def _colour(kind: str, kinds_seen: Sequence[str]) -> str:
    """A role's or transfer's colour; other kinds (fused members' microtasks) take the next of OTHER_COLOURS."""
    if kind in KIND_COLOURS:
        return KIND_COLOURS[kind]
    others = [k for k in kinds_seen if k not in KIND_COLOURS]
    return OTHER_COLOURS[others.index(kind) % len(OTHER_COLOURS)] if kind in others else OTHER_COLOURS[0]


def draw_bars(
    panels: Sequence[tuple[str, Sequence[Bar]]],
    path: str,
    title: Optional[str] = None,
    num_devices: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    collapse: Optional[bool] = None,
    max_rows: int = 40,
    unit: str = "GPU",
) -> list[Row]:
    """Draw one Gantt panel per (name, bars) into `path` (.png, .svg or .pdf); returns the rows used.

    num_devices: device count of the cluster (default: highest device id in any bar + 1), so idle
    devices show. collapse: merge devices that run the same bars into one row (default: when there
    are more than 16 devices). gpus_per_node: lets rows fall back to whole nodes past `max_rows`.
    unit: what a row's device is called ("GPU", or "worker" for CPU worker processes).
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise RpegError(None, f"cannot write a Gantt chart to '{path}'; use a file name ending in {', '.join(FORMATS)}")
    if not panels:
        raise RpegError(None, "no schedule to draw; pass at least one (name, bars) panel")
    all_bars = [b for _, bars in panels for b in bars]
    if num_devices is None:
        num_devices = 1 + max((d for b in all_bars for d in b.devices), default=0)
    if collapse is None:
        collapse = num_devices > 16
    rows = device_rows([bars for _, bars in panels], num_devices, collapse, gpus_per_node, max_rows, unit)
    row_of = {d: r for r, row in enumerate(rows) for d in row.devices}
    t_end = max((b.finish for b in all_bars), default=1.0) or 1.0

    panel_h = max(1.2, _ROW_IN * len(rows))
    height = _TOP_IN + _BOTTOM_IN + len(panels) * panel_h + (len(panels) - 1) * _GAP_IN
    fig = Figure(figsize=(_WIDTH_IN, height), dpi=_DPI)
    plot_w = _WIDTH_IN - _LEFT_IN - _RIGHT_IN
    px_per_s = plot_w * _DPI / (t_end * 1.02)
    px_per_row = panel_h * _DPI / len(rows)
    kinds_seen: list[str] = []
    axes = []
    for p, (name, bars) in enumerate(panels):
        top = height - _TOP_IN - p * (panel_h + _GAP_IN)
        ax = fig.add_axes(
            (_LEFT_IN / _WIDTH_IN, (top - panel_h) / height, plot_w / _WIDTH_IN, panel_h / height),
            sharex=axes[0] if axes else None,
        )
        axes.append(ax)
        _draw_panel(ax, bars, row_of, px_per_s, px_per_row, kinds_seen)
        makespan = max((b.finish for b in bars), default=0.0)
        ax.axvline(makespan, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{name}   (makespan {makespan:.4g} s)", fontsize=9, loc="left")
        ax.set_ylim(len(rows), 0)
        ax.set_yticks([r + 0.5 for r in range(len(rows))])
        ax.set_yticklabels([row.label for row in rows], fontsize=7)
        ax.tick_params(axis="y", length=0)
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
        ax.set_axisbelow(True)
    axes[0].set_xlim(0, t_end * 1.02)
    axes[-1].set_xlabel("time (s)")
    for ax in axes[:-1]:
        ax.tick_params(axis="x", labelbottom=False)
    handles = [Patch(facecolor=_colour(k, kinds_seen), label=k) for k in sorted(
        kinds_seen, key=lambda k: list(KIND_COLOURS).index(k) if k in KIND_COLOURS else len(KIND_COLOURS))]
    if handles:
        fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8, frameon=False,
                   bbox_to_anchor=(1 - _RIGHT_IN / _WIDTH_IN, 1 - 0.05 / height))
    if title:
        fig.text(_LEFT_IN / _WIDTH_IN, 1 - 0.12 / height, title, fontsize=11, va="top", weight="bold")
    fig.savefig(path)
    return rows


def draw_gantt(p: Program, path: str, title: Optional[str] = None) -> list[Row]:
    """The predicted schedule of a scheduled module, one panel."""
    bars = bars_from_program(p)
    assert p.cluster is not None  # checked by bars_from_program
    return draw_bars(
        [("predicted", bars)], path, title=title, num_devices=p.cluster.num_devices, gpus_per_node=p.cluster.gpus
    )
