"""The package's imports form no cycle, and `rpegc.core` is layered: `ir` imports nothing else of rpegc, and no
core subpackage imports the passes, dialects, search or runtime.

Every import counts: module level, `if TYPE_CHECKING:` blocks (a type-only circle is still a circle for the
reader) and imports inside functions (a deferred import that closes a circle still ties the two modules
together; a plugin's package defers its heavy modules without being imported back by them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Import name of each source directory (pyproject.toml's package-dir).
PACKAGES = {"rpegc": "rpegc", "rpegc.passes": "passes", "rpegc.dialects": "dialects", "rpegc.runtime": "runtime",
            "rpegc.tools": "tools"}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join([pkg, *parts]), path)
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The rpegc modules that `path` imports anywhere in it (`from package import module` counts as the module,
    not as the package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            out.update(submodules)
            if len(submodules) < len(node.names):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 100  # the walk found the package
    assert cycles(graph) == []


def test_core_layers():
    graph = import_graph()
    outside = ("rpegc.passes", "rpegc.dialects", "rpegc.search", "rpegc.runtime", "rpegc.tools", "rpegc.syntax")
    for m, deps in graph.items():
        if m.startswith("rpegc.core.ir."):
            assert all(d.startswith("rpegc.core.ir.") for d in deps), (m, deps)
        if m.startswith("rpegc.core."):
            assert not [d for d in deps if d.startswith(outside)], (m, deps)
