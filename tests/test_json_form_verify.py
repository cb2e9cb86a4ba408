"""The JSON form of verify vertices: module-level verifiers, plan pools, verify Op nodes (`pool`, no devices) and Comm
nodes to and from the host's pool round-trip exactly, validate against the published schema, and their malformed
values are rejected by the schema and the reader at the same key path, located at the value.

The programs are built directly (not parsed): the JSON form is tested on its own."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecGraph, ExecNode
from rpegc.core.ir.expr import Sym
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.ir.program import (Arch, Container, Edge, Graph, Model, Placement, Plan, Pool, Program, Verifier,
                                   Vertex, Workload)
from rpegc.syntax import json_text
from rpegc.syntax.json_form import program_from_json, program_from_text, program_to_json, program_to_text
from fixtures.json_schema import schema_paths, validator
from fixtures.runtime_plans import PROGRAMS

GEN = Alloc((0, 0, 0), (1, 1, 4))
TRAIN = Alloc((0, 1, 0), (1, 1, 4))


def verify_program(with_exec: bool = False) -> Program:
    """Generation, a math verifier on a host pool of 2 processes, training; optionally its one-step exec graph."""
    arch = Arch(layers=2, hidden=64, ffn=256, vocab=1000, heads=4, kv_heads=4)
    models = (Model("actor", "policy", True, arch),)
    verifiers = (Verifier("math", "math"), Verifier("mine", "pkg.mod:score", per_response=0.004))
    B, R, Lp, Lr = Sym("B"), Sym("R"), Sym("Lp"), Sym("Lr")
    graph = Graph(
        name="grpo",
        containers=(Container("P", "tokens", (B, Lp)), Container("Y", "tokens", (B, R, Lr)),
                    Container("r", "rewards", (B, R)), Container("W", "weights", model="actor")),
        inputs=("P",),
        outputs=(),
        vertices=(Vertex("gen", "generation", "actor", ("P", "W"), ("Y",)),
                  Vertex("score", "verify", "math", ("Y",), ("r",)),
                  Vertex("train", "training", "actor", ("Y", "r"), ("W",))),
        data_edges=(Edge("gen", "score", "Y"), Edge("gen", "train", "Y"), Edge("score", "train", "r")),
        pub_edges=(Edge("train", "gen", "W"),),
        algorithm="grpo",
    )
    cluster = Cluster("c8", 1, 2, 4, "gh200")
    plan = Plan("p", "grpo", "c8",
                (Placement("gen", GEN, Strategy(4, 1, 1, 1)), Placement("train", TRAIN, Strategy(2, 1, 2, 1))),
                pools=(Pool("score", 2),))
    p = Program(Workload(B=8, R=4, Lp=16, Lr=32), models, graph, cluster, plan, verifiers=verifiers)
    if not with_exec:
        return p
    nodes = (
        ExecNode("gen#0", "op", 0, 0, vertex="gen", role="generation", model="actor", alloc=GEN,
                 strategy=Strategy(4, 1, 1, 1), version_in=(("actor", 0),), data_in=(DataRef("P"),),
                 data_out=(DataRef("Y"),), time=2.0, start=0.0, finish=2.0),
        # Y to the host's pool: no destination allocation.
        ExecNode("comm.Y.gen#0.score#0", "comm", 0, 1, container="Y", src_alloc=GEN, bytes=2048,
                 data_in=(DataRef("Y"),), data_out=(DataRef("Y"),), time=0.1, start=2.0, finish=2.1),
        ExecNode("score#0", "op", 0, 1, vertex="score", role="verify", model="math", pool=2,
                 data_in=(DataRef("Y"),), data_out=(DataRef("r"),), time=0.5, start=2.1, finish=2.6),
        # r from the host's pool: no source allocation.
        ExecNode("comm.r.score#0.train#0", "comm", 0, 2, container="r", alloc=TRAIN, bytes=64,
                 data_in=(DataRef("r"),), data_out=(DataRef("r"),), time=0.05, start=2.6, finish=2.65),
        ExecNode("comm.Y.gen#0.train#0", "comm", 0, 2, container="Y", alloc=TRAIN, src_alloc=GEN, bytes=2048,
                 data_in=(DataRef("Y"),), data_out=(DataRef("Y"),), time=0.1, start=2.0, finish=2.1),
        ExecNode("train#0", "op", 0, 2, vertex="train", role="training", model="actor", alloc=TRAIN,
                 strategy=Strategy(2, 1, 2, 1), version_in=(("actor", 0),), version_out=(("actor", 1),),
                 data_in=(DataRef("Y"), DataRef("r")), time=3.0, start=2.65, finish=5.65),
    )
    edges = tuple(ExecEdge(a, b) for a, b in (
        ("gen#0", "comm.Y.gen#0.score#0"), ("comm.Y.gen#0.score#0", "score#0"),
        ("score#0", "comm.r.score#0.train#0"), ("comm.r.score#0.train#0", "train#0"),
        ("gen#0", "comm.Y.gen#0.train#0"), ("comm.Y.gen#0.train#0", "train#0"),
    ))
    return replace(p, exec=ExecGraph("grpo", 1, nodes, edges, lowered=True))


def through_json(p: Program) -> Program:
    return program_from_json(json.loads(json.dumps(program_to_json(p))), "p.json")



@pytest.mark.parametrize("with_exec", [False, True], ids=["module", "exec"])
def test_verifiers_pools_and_verify_vertices_round_trip(with_exec):
    p = verify_program(with_exec)
    q = through_json(p)
    assert q == p
    assert q.verifiers == p.verifiers and q.plan.pools == (Pool("score", 2),)
    assert q.verifier("mine").per_response == 0.004 and q.verifier("math").per_response is None
    assert q.graph.vertex("score").role == "verify"
    assert program_from_text(program_to_text(p), "p.json") == p  # through the strict text too


def test_the_written_form_of_verify():
    d = program_to_json(verify_program(with_exec=True))
    assert d["verifiers"] == [{"name": "math", "fn": "math"},  # per_response absent: calibrated
                              {"name": "mine", "fn": "pkg.mod:score", "per_response": 0.004}]
    assert list(d).index("verifiers") == list(d).index("models") + 1
    assert d["plan"]["pools"] == [{"vertex": "score", "size": 2}]
    assert [pl["vertex"] for pl in d["plan"]["placements"]] == ["gen", "train"]  # a pool is not a placement
    nodes = {n["id"]: n for n in d["nodes"]}
    score = nodes["score#0"]
    assert score["role"] == "verify" and score["model"] == "math" and score["pool"] == 2
    assert score["devices"] is None and "alloc" not in score
    assert {k: score[k] for k in ("dp", "pp", "tp", "mb")} == dict.fromkeys(("dp", "pp", "tp", "mb"))
    to_host, from_host = nodes["comm.Y.gen#0.score#0"], nodes["comm.r.score#0.train#0"]
    assert to_host["devices"] is None and "alloc" not in to_host and to_host["src_alloc"]["extent"] == [1, 1, 4]
    assert from_host["devices"] == [4, 5, 6, 7] and "src_alloc" not in from_host
    assert all("pool" not in n for i, n in nodes.items() if i != "score#0")


def test_the_schema_validates_verify_programs():
    for with_exec in (False, True):
        validator().validate(program_to_json(verify_program(with_exec)))


@pytest.mark.parametrize("name,make", PROGRAMS, ids=[n for n, _ in PROGRAMS])
def test_programs_without_verifiers_are_written_as_before(name, make):
    """The new keys are written only when set: every existing JSON output is unchanged."""
    d = program_to_json(make())
    assert "verifiers" not in d
    assert d["plan"] is None or "pools" not in d["plan"]
    assert all("pool" not in n for n in d.get("nodes", []))


def test_a_verify_node_alone_round_trips():
    """A verify Op node with its pool and no allocation, in a module without a cluster (no device ids to read)."""
    node = ExecNode("score#0", "op", 0, 0, vertex="score", role="verify", model="math", pool=3,
                    data_in=(DataRef("Y"),), data_out=(DataRef("r"),))
    p = Program(Workload(B=1, R=1, Lp=1, Lr=1), (), verifiers=(Verifier("math", "math"),),
                exec=ExecGraph("g", 1, (node,), ()))
    q = through_json(p)
    assert q == p and q.exec.nodes[0].pool == 3 and q.exec.nodes[0].alloc is None
    validator().validate(program_to_json(p))


def doc() -> dict:
    return program_to_json(verify_program(with_exec=True))


def _score_node(d) -> int:
    return next(i for i, n in enumerate(d["nodes"]) if n["id"] == "score#0")


def _set_score_pool(d, value):
    d["nodes"][_score_node(d)]["pool"] = value


# (change, JSON path of the bad value, reader message); every one is a schema violation too.
BAD = [
    (lambda d: d["plan"]["pools"][0].update(size=0), "plan.pools[0].size", r"expected an integer >= 1, got 0"),
    (lambda d: d["plan"]["pools"][0].update(size="x"), "plan.pools[0].size",
     r"expected an integer, got the string 'x'"),
    (lambda d: d["plan"]["pools"][0].update(size=2.5), "plan.pools[0].size", r"expected an integer, got the number"),
    (lambda d: d["plan"]["pools"][0].pop("size"), "plan.pools[0]", r"missing key 'size'"),
    (lambda d: d["plan"]["pools"][0].update(procs=2), "plan.pools[0].procs", r"unknown key 'procs'"),
    (lambda d: d["plan"].update(pools={"score": 2}), "plan.pools", r"expected a list, got an object"),
    (lambda d: d["verifiers"][1].update(per_response=-1), "verifiers[1].per_response",
     r"expected a number > 0, got -1"),
    (lambda d: d["verifiers"][1].update(per_response=0), "verifiers[1].per_response",
     r"expected a number > 0, got 0"),
    (lambda d: d["verifiers"][1].update(per_response="x"), "verifiers[1].per_response",
     r"expected a number, got the string 'x'"),
    (lambda d: d["verifiers"][1].update(per_response=None), "verifiers[1].per_response",
     r"expected a number, got null"),
    (lambda d: d["verifiers"][0].update(fn=7), "verifiers[0].fn", r"expected a string, got the number 7"),
    (lambda d: d["verifiers"][0].pop("fn"), "verifiers[0]", r"missing key 'fn'"),
    (lambda d: d["verifiers"][0].update(timeout=3), "verifiers[0].timeout", r"unknown key 'timeout'"),
    (lambda d: d.update(verifiers={"math": "math"}), "verifiers", r"expected a list, got an object"),
    (lambda d: d["rpeg_graph"]["vertices"][1].update(role="verifier"), "rpeg_graph.vertices[1].role",
     r"'verifier' is not one of generation, inference, training, verify"),
    (lambda d: _set_score_pool(d, 0), "nodes[2].pool", r"expected an integer >= 1, got 0"),
    (lambda d: _set_score_pool(d, "2"), "nodes[2].pool", r"expected an integer, got the string '2'"),
]




@pytest.mark.parametrize("change,path,message", BAD, ids=[f"{p}:{m[:24]}" for _, p, m in BAD])
def test_schema_and_reader_reject_at_the_same_path(change, path, message):
    d = copy.deepcopy(doc())
    assert _score_node(d) == 2
    change(d)
    assert path in schema_paths(d)
    text = json.dumps(d, indent=1)
    with pytest.raises(RpegError, match=message) as e:
        program_from_text(text, "bad.json")
    assert e.value.message.startswith(f"at {path}: ")
    assert (e.value.loc.file, e.value.loc.line, e.value.loc.col) == ("bad.json", *json_text.locate(text, path))
    assert e.value.loc.line > 1
    with pytest.raises(RpegError, match=message):  # the dict reader (no text) names the same path
        program_from_json(json.loads(text), "bad.json")


def test_a_non_finite_per_response_is_never_written():
    p = verify_program()
    bad = replace(p, verifiers=(p.verifiers[0], replace(p.verifiers[1], per_response=math.inf)))
    with pytest.raises(RpegError, match=r"cannot emit JSON: the value at verifiers\[1\]\.per_response is not a finite"):
        program_to_text(bad)


def test_verifiers_and_pools_read_from_text_carry_their_location():
    """verify-wellformed's errors about a verifier or a pool point at it in the JSON file."""
    text = program_to_text(verify_program())
    p = program_from_text(text, "p.json")
    for loc, path in ((p.verifiers[1].loc, "verifiers[1]"), (p.plan.pools[0].loc, "plan.pools[0]")):
        assert (loc.file, loc.line, loc.col) == ("p.json", *json_text.locate(text, path)) and loc.line > 1
