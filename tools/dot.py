"""Graphviz pictures of a module (`rpegc --emit=dot`): the cyclic graph G° (Fig. 13), the unrolled graph
G-bar (Fig. 15/16) and the executable graph G-hat (Fig. 17-19).

Publication edges are drawn in red with their staleness, ordered-update edges dashed, Comm nodes as
ellipses and Reshard nodes as diamonds; Op nodes are boxes coloured by role.
"""

from __future__ import annotations

from rpegc.core.program import Program

ROLE_COLOURS = {"generation": "#9ecae1", "inference": "#a1d99b", "training": "#fdae6b"}
PUB_COLOUR = "#cb181d"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    out.append("}")
    return "\n".join(out) + "\n"


def _node_attrs(n) -> str:
    if n.kind == "op":
        label = n.id + f"\n{n.role} @{n.model}"
        if n.alloc is not None:
            label += f"\n{n.alloc.origin}+{n.alloc.extent}"
        return f"shape=box, style=filled, fillcolor={_q(ROLE_COLOURS[n.role])}, label={_q(label)}"
    what = f"%{n.container}" if n.container else f"@{n.model}"
    label = f"{n.id} {n.kind}\n{what}\n{n.bytes:,} B"
    shape = "ellipse" if n.kind == "comm" else "diamond"
    return f"shape={shape}, style=filled, fillcolor=\"#eeeeee\", label={_q(label)}"


EDGE_STYLES = {
    "data": "",
    "dep": "",
    "pub": f"color={_q(PUB_COLOUR)}, fontcolor={_q(PUB_COLOUR)}",
    "order": "style=dashed",
}


def exec_dot(p: Program) -> str:
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
        attrs = [EDGE_STYLES[e.kind]] if EDGE_STYLES[e.kind] else []
        if e.container:
            attrs.append(f"label={_q(e.container)}")
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        out.append(f"  {_q(e.src)} -> {_q(e.dst)}{suffix};")
    out.append("}")
    return "\n".join(out) + "\n"


def program_to_dot(p: Program) -> str:
    """The most lowered graph the module holds: exec (unrolled or lowered) if present, else G°."""
    if p.exec is not None:
        return exec_dot(p)
    if p.graph is None:
        return "digraph empty {}\n"
    return cyclic_dot(p)
