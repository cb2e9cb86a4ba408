"""The shared fixtures themselves: the PPO builder is the graph of App. A-D, and the cycle check finds cycles."""

from __future__ import annotations

from fixtures.lowering import MODELS, is_acyclic, ppo_graph


def test_ppo_builder_matches_appendix_d():
    g = ppo_graph()
    assert len(g.vertices) == 6 and len(g.data_edges) == 9 and len(g.pub_edges) == 2
    assert {m.name for m in MODELS if m.trainable} == {"actor", "critic"}
    assert not any(e.src == "gen" and e.dst.startswith("train") for e in g.data_edges)


def test_is_acyclic_detects_cycles():
    assert is_acyclic("abc", [("a", "b"), ("b", "c")])
    assert not is_acyclic("abc", [("a", "b"), ("b", "c"), ("c", "a")])


def test_no_test_module_imports_another():
    import ast
    from pathlib import Path

    here = Path(__file__).parent
    tests = {p.stem for p in here.glob("test_*.py")}
    offenders = []
    for path in sorted(here.glob("test_*.py")) + sorted((here / "fixtures").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in tests]
    assert offenders == []
