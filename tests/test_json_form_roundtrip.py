"""The JSON form of a Program: exact round trip, the documented exec schema, located errors."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.expr import BinOp, Num, Sym
from rpegc.core.ir.geometry import Alloc
from rpegc.core.lower.unroll import unroll
from rpegc.syntax.json_form import program_from_json, program_to_json
from rpegc.syntax.parser import parse_expr
from fixtures.runtime_plans import disaggregated_plan, scheduled
from fixtures.runtime_plans import PROGRAMS, with_memory

DOCUMENTED_NODE_KEYS = {"id", "kind", "vertex", "step", "phase", "role", "model", "devices", "dp", "pp", "tp", "mb",
                        "bytes", "version_in", "version_out"}


def through_json(p):
    return program_from_json(json.loads(json.dumps(program_to_json(p))), "p.json")


@pytest.mark.parametrize("name,make", PROGRAMS, ids=[n for n, _ in PROGRAMS])
def test_round_trip_is_exact(name, make):
    p = make()
    assert through_json(p) == p


def test_documented_exec_schema():
    p = with_memory(scheduled(disaggregated_plan(1), 2))
    d = program_to_json(p)
    assert d["graph"] == "ppo" and d["steps"] == 2
    assert d["edges"] == [[e.src, e.dst] for e in p.exec.edges]
    assert "edge_attrs" not in d  # lowered: every edge is a plain dep edge
    cl = p.cluster
    for n, j in zip(p.exec.nodes, d["nodes"]):
        assert DOCUMENTED_NODE_KEYS <= set(j)
        assert j["kind"] in ("op", "comm", "reshard")
        o, e = n.alloc.origin, n.alloc.extent
        flat = [(r * cl.nodes + nn) * cl.gpus + g for r in range(o[0], o[0] + e[0])
                for nn in range(o[1], o[1] + e[1]) for g in range(o[2], o[2] + e[2])]
        assert j["devices"] == flat
        assert (j["time"], j["start"], j["finish"]) == (n.time, n.start, n.finish)
        assert j["version_in"] == dict(n.version_in)
    op = next(j for j in d["nodes"] if j["kind"] == "op")
    assert {k: op[k] for k in ("dp", "pp", "tp", "mb")} == {"dp": 4, "pp": 1, "tp": 1, "mb": 1}
    assert set(d["memory"]) == {"peak", "persistent", "transient", "m_eff", "r_peak", "feasible"}
    assert d["memory"]["peak"]["3"] == 1.5e9 + 3
    assert set(d["schedule"]) == {"makespan", "score", "score_pen", "util", "p_eff"}


def test_documented_keys_alone_are_enough():
    """A hand-written node with flat device ids and dp/pp/tp/mb, but no 'alloc', reads back."""
    p = scheduled(disaggregated_plan(1), 1)
    d = program_to_json(p)
    for j in d["nodes"]:
        j.pop("alloc", None)
    assert program_from_json(d, "p.json") == p


def test_devices_must_form_a_box():
    d = program_to_json(scheduled(disaggregated_plan(1), 1))
    node = d["nodes"][0]
    node.pop("alloc")
    node["devices"] = [0, 1, 3]
    with pytest.raises(RpegError, match=r"at nodes\[0\]\.devices: the devices do not form a contiguous box"):
        program_from_json(d, "p.json")


def test_devices_and_alloc_must_agree():
    d = program_to_json(scheduled(disaggregated_plan(1), 1))
    d["nodes"][2]["devices"] = [12, 13]
    with pytest.raises(RpegError, match=r"at nodes\[2\]\.devices: the device list disagrees with 'alloc'"):
        program_from_json(d, "p.json")


def mutate(d, change):
    d = copy.deepcopy(d)
    change(d)
    return d


BASE = None


def base():
    global BASE
    if BASE is None:
        BASE = program_to_json(unroll(disaggregated_plan(1), 2))
    return BASE


BAD = [
    (lambda d: d.pop("workload"), r"missing key 'workload'"),
    (lambda d: d["workload"].update(B="64"), r"at workload\.B: expected an integer, got the string '64'"),
    (lambda d: d["workload"].update(dtype="int8"), r"at workload\.dtype: 'int8' is not one of bf16, fp16, fp32"),
    (lambda d: d["models"][1].pop("kind"), r"at models\[1\]: missing key 'kind'"),
    (lambda d: d["models"][0].update(arch=None, preset="nope"), r"at models\[0\]: missing key 'arch'"),
    (lambda d: d["rpeg_graph"]["containers"][1].update(dims=["B*Q"]),
     r"at rpeg_graph\.containers\[1\]\.dims\[0\]: bad size expression 'B\*Q': unknown symbol 'Q'"),
    (lambda d: d["rpeg_graph"]["vertices"][0].update(role="sampling"),
     r"at rpeg_graph\.vertices\[0\]\.role: 'sampling' is not one of generation, inference, training"),
    (lambda d: d["plan"]["placements"][2].update(extent=[1, 1]),
     r"at plan\.placements\[2\]\.extent: expected a list of 3 integers"),
    (lambda d: d["nodes"][3].update(extnt=1), r"at nodes\[3\]\.extnt: unknown key 'extnt'"),
    (lambda d: d["nodes"][1].update(kind="send"), r"at nodes\[1\]\.kind: 'send' is not one of op, comm, reshard"),
    (lambda d: d["nodes"][1].update(pp=None), r"at nodes\[1\]: pp missing: give all of dp, pp, tp, mb"),
    (lambda d: d["nodes"][4].update(id=d["nodes"][0]["id"]), r"at nodes\[4\]\.id: node id 'gen#0' is used twice"),
    (lambda d: d["nodes"][0].update(version_in={"actor": -1}),
     r"at nodes\[0\]\.version_in\.actor: expected an integer >= 0, got -1"),
    (lambda d: d["edges"].append(["gen#0", "nowhere"]) or d["edge_attrs"].append({"kind": "dep"}), r"at edges\[\d+\]\[1\]: unknown node id 'nowhere'"),
    (lambda d: d["edges"].append("gen#0") or d["edge_attrs"].append({"kind": "dep"}), r"at edges\[\d+\]: expected \[src_id, dst_id\]"),
    (lambda d: d["edge_attrs"].pop(), r"at edge_attrs: has \d+ entries but 'edges' has \d+"),
    (lambda d: d["edge_attrs"][0].update(kind="control"), r"at edge_attrs\[0\]\.kind: 'control' is not one of"),
    (lambda d: d.pop("steps"), r"missing key 'steps'"),
    (lambda d: d.update(format="other"), r"at format: expected 'rpegc-program'"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m[:40] for _, m in BAD])
def test_malformed_json_names_the_key_path(change, message):
    with pytest.raises(RpegError, match=message) as e:
        program_from_json(mutate(base(), change), "bad.json")
    assert e.value.loc.file == "bad.json"


def test_memory_device_keys_must_be_integers():
    d = program_to_json(with_memory(scheduled(disaggregated_plan(1), 1)))
    d["memory"]["peak"]["gpu3"] = 1.0
    with pytest.raises(RpegError, match=r"at memory\.peak\.gpu3: 'gpu3' is not a flat device id"):
        program_from_json(d, "p.json")


def test_non_object_top_level():
    with pytest.raises(RpegError, match="expected an object, got a list of 0"):
        program_from_json([], "p.json")  # type: ignore[arg-type]


exprs = st.recursive(
    st.one_of(st.integers(-50, 500).map(Num), st.sampled_from(["B", "R", "Lp", "Lr"]).map(Sym)),
    lambda inner: st.builds(BinOp, st.sampled_from(["+", "-", "*", "/"]), inner, inner),
    max_leaves=12,
)


@given(exprs)
@settings(max_examples=150, deadline=None)
def test_size_expressions_round_trip(e):
    assert parse_expr(str(e)) == e


def test_alloc_reconstruction_covers_multi_rack_boxes():
    p = scheduled(disaggregated_plan(1), 1)
    d = program_to_json(p)
    n = d["nodes"][0]
    n.pop("alloc")
    # (rack 0..1, node 1, gpus 2..3) on a 2 x 2 x 4 cluster
    n["devices"] = [6, 7, 14, 15]
    q = program_from_json(d, "p.json")
    assert q.exec.nodes[0].alloc == Alloc((0, 1, 2), (2, 1, 2))


def test_a_cluster_too_large_to_model_is_a_located_error():
    doc = program_to_json(disaggregated_plan())
    doc["cluster"]["gpus"] = 4_000_000_000
    text = json.dumps(doc, indent=1)
    with pytest.raises(RpegError, match=r"at cluster: cluster @\w+ has [\d,]+ devices .* at most 1,048,576") as err:
        program_from_json(json.loads(text), "plan.json", text=text)
    assert err.value.loc.line > 1
