"""The shared fixtures themselves: the PPO builder is the graph of App. A-D as examples/ppo.rpeg writes it, the
torch tests' PPO text is the builder's direct variant, and the cycle check finds cycles."""

from __future__ import annotations

from rpegc.core.ir.program import Graph
from rpegc.syntax.parser import parse

from fixtures.lowering import MODELS, is_acyclic
from fixtures.ppo import ppo_graph
from fixtures.programs import EXAMPLES


def structure(g: Graph) -> tuple:
    """What a graph says, without source locations or declaration order."""
    return (
        sorted((c.name, c.elem, c.model, tuple(map(str, c.dims))) for c in g.containers),
        sorted(g.inputs),
        sorted((v.name, v.role, v.model, tuple(sorted(v.reads)), v.writes) for v in g.vertices),
        sorted((e.src, e.dst, e.container) for e in g.data_edges),
        sorted((e.src, e.dst, e.container) for e in g.pub_edges),
    )


def test_ppo_builder_is_the_example():
    g = ppo_graph()
    assert len(g.vertices) == 6 and len(g.data_edges) == 9 and len(g.pub_edges) == 2
    assert {m.name for m in MODELS if m.trainable} == {"actor", "critic"}
    assert not any(e.src == "gen" and e.dst.startswith("train") for e in g.data_edges)
    example = parse((EXAMPLES / "ppo.rpeg").read_text(), "ppo.rpeg").graph
    assert structure(g) == structure(example)


def test_torch_ppo_text_is_the_direct_variant():
    from fixtures.torch_runs import PPO4  # only text, but the module needs torch

    assert structure(parse(PPO4, "ppo4.rpeg").graph) == structure(ppo_graph(direct_training_inputs=True))
    assert structure(ppo_graph(direct_training_inputs=True)) != structure(ppo_graph())


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
