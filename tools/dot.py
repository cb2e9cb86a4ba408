"""Graphviz pictures of a module (`rpegc --emit=dot`): the cyclic graph G° (Fig. 13), the unrolled graph
G-bar (Fig. 15/16) and the executable graph G-hat (Fig. 17-19).

Publication edges are drawn in red with their staleness, ordered-update edges dashed, Comm nodes as
ellipses and Reshard nodes as diamonds; Op nodes are boxes coloured by role; every picture has a legend.
An exec graph of more than DETAIL_LIMIT nodes is drawn in summary (`--dot-detail=auto`, the default): one box
per vertex and step (its quantile phases merged), one ellipse or diamond per step and route of transfers
(same kind, container or model, source and destination devices), edges between those groups once per kind.
`--dot-detail=full` draws every node.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpegc.core.ir.exec_graph import ExecGraph, ExecNode
from rpegc.core.ir.program import Program

ROLE_COLOURS = {"generation": "#9ecae1", "inference": "#a1d99b", "training": "#fdae6b", "verify": "#e5d8a6"}
PUB_COLOUR = "#cb181d"
TRANSFER_COLOUR = "#eeeeee"
DETAIL_LIMIT = 60  # nodes; a lowered 8-step PPO graph has 246, which renders ~19,000 px wide in full
DETAILS = ("auto", "summary", "full")


def _q(text: str) -> str:
    """A DOT string; a line break becomes DOT's centred `\\n`, so every statement stays on one line."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


EDGE_STYLES = {
    "data": "",
    "dep": "",
    "pub": f"color={_q(PUB_COLOUR)}, fontcolor={_q(PUB_COLOUR)}",
    "order": "style=dashed",
}
EDGE_MEANINGS = {
    "data": "data (a container)",
    "dep": "dependency",
    "pub": "publication (new weights)",
    "order": "ordered update (same model)",
}


def _legend(roles: bool, transfers: bool, edge_kinds: tuple[str, ...], note: str = "",
            verify: bool = False) -> list[str]:
    """A boxed key at the side: node colours and shapes (a verify op's only where the graph has one), then one
    sample arrow per edge style in use."""
    out = ["  subgraph cluster_legend {", '    label="legend"; fontsize=10; style=rounded; color="#999999";',
           "    node [fontsize=9];"]
    if roles:
        for role, colour in ROLE_COLOURS.items():
            if role == "verify" and not verify:
                continue
            out.append(f"    {_q('legend_' + role)} [shape=box, style=filled, fillcolor={_q(colour)}, "
                       f"label={_q(role + ' op')}];")
    if transfers:
        out.append(f'    "legend_comm" [shape=ellipse, style=filled, fillcolor={_q(TRANSFER_COLOUR)}, '
                   'label="Comm (data between devices)"];')
        out.append(f'    "legend_reshard" [shape=diamond, style=filled, fillcolor={_q(TRANSFER_COLOUR)}, '
                   'label="Reshard (weights to a new layout)"];')
    for kind in edge_kinds:
        a, b = _q(f"legend_{kind}_from"), _q(f"legend_{kind}_to")
        out.append(f"    {a} [shape=point, width=0.05]; {b} [shape=point, width=0.05];")
        style = [EDGE_STYLES[kind]] if EDGE_STYLES[kind] else []
        out.append(f"    {a} -> {b} [{', '.join(style + [f'label={_q(EDGE_MEANINGS[kind])}', 'fontsize=9'])}];")
    if note:
        out.append(f"    \"legend_note\" [shape=plaintext, style=solid, fontsize=9, label={_q(note)}];")
    out.append("  }")
    return out


def cyclic_dot(p: Program) -> str:
    g = p.graph
    out = [f"digraph {_q(g.name)} {{", "  rankdir=LR;", "  node [shape=box, style=filled];"]
    for v in g.vertices:
        label = f"{v.name}\n{v.role} @{v.model}"
        out.append(f"  {_q(v.name)} [label={_q(label)}, fillcolor={_q(ROLE_COLOURS[v.role])}];")
    for e in g.data_edges:
        out.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(e.container)}];")
    for e in g.pub_edges:
        label = f"{e.container} (tau={g.tau(g.vertex(e.src).model)})"
        out.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(label)}, "
                   f"color={_q(PUB_COLOUR)}, fontcolor={_q(PUB_COLOUR)}, constraint=false];")
    kinds = ("data",) + (("pub",) if g.pub_edges else ())
    out.extend(_legend(roles=True, transfers=False, edge_kinds=kinds, note="tau: staleness bound of the model",
                       verify=any(v.role == "verify" for v in g.vertices)))
    out.append("}")
    return "\n".join(out) + "\n"


def _size(nbytes: int) -> str:
    """A byte count with three significant digits: `524,288` -> `512 KiB`."""
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}" if unit != "B" else f"{nbytes} B"


def _op_box(head: str, n: ExecNode) -> str:
    """An op node (or a vertex's merged phases): a box in its role's colour, `head` over role, model, devices."""
    label = f"{head}\n{n.role} @{n.model}"
    if n.alloc is not None:
        label += f"\n{n.alloc.origin}+{n.alloc.extent}"
    if n.pool is not None:  # a verify op: host processes, and the devices whose cores they share (cost/host.py)
        label += f"\npool of {n.pool}" + (f", sharing {list(n.shares)}" if n.shares else "")
    return f"shape=box, style=filled, fillcolor={_q(ROLE_COLOURS[n.role])}, label={_q(label)}"


def _transfer_shape(kind: str, label: str) -> str:
    """A Comm (ellipse) or Reshard (diamond) node."""
    shape = "ellipse" if kind == "comm" else "diamond"
    return f"shape={shape}, style=filled, fillcolor={_q(TRANSFER_COLOUR)}, label={_q(label)}"


def _moved(n: ExecNode) -> str:
    """What a transfer moves: a container, or a model's weights."""
    return f"%{n.container}" if n.container else f"@{n.model}"


def _node_attrs(n: ExecNode) -> str:
    if n.kind == "op":
        return _op_box(n.id, n)
    return _transfer_shape(n.kind, f"{n.id} {n.kind}\n{_moved(n)}\n{n.bytes:,} B")


def _edge_attrs(kind: str, container: str | None) -> str:
    attrs = [EDGE_STYLES[kind]] if EDGE_STYLES[kind] else []
    if container:
        attrs.append(f"label={_q(container)}")
    return f" [{', '.join(attrs)}]" if attrs else ""


def exec_dot(p: Program) -> str:
    """Every node of the exec graph, one cluster per step."""
    x = p.exec
    out = [f"digraph {_q(x.graph + '_exec')} {{", "  rankdir=LR;"]
    for step in range(x.steps):
        name, label = f"cluster_step{step}", f"step {step}"
        out.append(f"  subgraph {_q(name)} {{ label={_q(label)};")
        for n in x.nodes:
            if n.step == step:
                out.append(f"    {_q(n.id)} [{_node_attrs(n)}];")
        out.append("  }")
    for e in x.edges:
        out.append(f"  {_q(e.src)} -> {_q(e.dst)}{_edge_attrs(e.kind, e.container)};")
    out.extend(_exec_legend(x))
    out.append("}")
    return "\n".join(out) + "\n"


def _exec_legend(x: ExecGraph, note: str = "") -> list[str]:
    transfers = any(n.kind != "op" for n in x.nodes)
    kinds = tuple(k for k in EDGE_MEANINGS if any(e.kind == k for e in x.edges))
    return _legend(roles=True, transfers=transfers, edge_kinds=kinds, note=note,
                   verify=any(n.kind == "op" and n.role == "verify" for n in x.nodes))


@dataclass
class _Group:
    """The nodes drawn as one in a summary: a vertex's phases in a step, or a step's transfers on one route."""

    name: str
    step: int
    kind: str
    nodes: list[ExecNode]

    def attrs(self) -> str:
        first, count = self.nodes[0], len(self.nodes)
        if self.kind == "op":
            return _op_box(f"{first.vertex}#{first.step}" + (f" ({count} phases)" if count > 1 else ""), first)
        total = sum(n.bytes for n in self.nodes)
        return _transfer_shape(self.kind, f"{self.kind}{f' x{count}' if count > 1 else ''} {_moved(first)}\n{_size(total)}")


def _group_key(n: ExecNode) -> tuple:
    if n.kind == "op":
        return ("op", n.step, n.vertex)
    return (n.kind, n.step, n.container, n.model, n.src_alloc, n.alloc)


def summary_dot(p: Program) -> str:
    """The exec graph with a vertex's phases merged and a step's transfers merged per route."""
    x = p.exec
    groups: dict[tuple, _Group] = {}
    group_of: dict[str, _Group] = {}
    for n in x.nodes:
        key = _group_key(n)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(f"g{len(groups)}", n.step, n.kind, [])
        group.nodes.append(n)
        group_of[n.id] = group
    # Top to bottom: steps stack, so the picture grows in height (scrolled) rather than to ~2,000 px per step.
    out = [f"digraph {_q(x.graph + '_exec')} {{", "  rankdir=TB; nodesep=0.2; ranksep=0.3;"]
    for step in range(x.steps):
        out.append(f"  subgraph {_q(f'cluster_step{step}')} {{ label={_q(f'step {step}')};")
        out.extend(f"    {_q(g.name)} [{g.attrs()}];" for g in groups.values() if g.step == step)
        out.append("  }")
    drawn: set[tuple[str, str, str]] = set()
    for e in x.edges:
        src, dst = group_of[e.src].name, group_of[e.dst].name
        if src == dst or (src, dst, e.kind) in drawn:
            continue
        drawn.add((src, dst, e.kind))
        out.append(f"  {_q(src)} -> {_q(dst)}{_edge_attrs(e.kind, e.container)};")
    note = f"summary of {len(x.nodes)} nodes in {len(groups)} groups; --dot-detail=full draws every node"
    out.extend(_exec_legend(x, note))
    out.append("}")
    return "\n".join(out) + "\n"


def program_to_dot(p: Program, detail: str = "auto") -> str:
    """The most lowered graph the module holds: exec (unrolled or lowered) if present, else G°. `detail`:
    "full" draws every exec node, "summary" merges them (see the module docstring), "auto" summarises above
    DETAIL_LIMIT nodes."""
    if detail not in DETAILS:
        raise ValueError(f"detail must be one of {', '.join(DETAILS)}, not {detail!r}")
    if p.exec is not None:
        full = detail == "full" or (detail == "auto" and len(p.exec.nodes) <= DETAIL_LIMIT)
        return exec_dot(p) if full else summary_dot(p)
    if p.graph is None:
        return "digraph empty {}\n"
    return cyclic_dot(p)
