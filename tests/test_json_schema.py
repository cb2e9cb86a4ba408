"""The published JSON Schema of the JSON form (rpegc/syntax/rpegc-program.schema.json) and the reader agree:
what the writer emits validates, every schema violation is rejected by the reader at the same key path,
located at the value's line and column; the semantic checks no schema expresses are the reader's."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir import program
from rpegc.syntax import json_form, json_text
from rpegc.syntax.json_form import program_from_text, program_to_json
from fixtures.json_schema import schema, schema_paths, validator
from fixtures.runtime_plans import PROGRAMS, with_memory
from fixtures.runtime_plans import disaggregated_plan, scheduled




def test_the_schema_is_valid_and_shipped():
    jsonschema.Draft202012Validator.check_schema(schema())
    text = open("pyproject.toml", encoding="utf-8").read()
    assert '"rpegc.syntax" = ["*.lark", "*.schema.json"]' in text
    assert json_form.SCHEMA_FILE.endswith("rpegc-program.schema.json")


@pytest.mark.parametrize("name,make", PROGRAMS, ids=[n for n, _ in PROGRAMS])
def test_what_the_writer_emits_validates(name, make):
    validator().validate(program_to_json(make()))


def test_schema_keys_are_the_readers_keys():
    s = schema()
    node = s["$defs"]["node"]
    assert set(node["required"]) == set(json_form._NODE_REQUIRED)
    assert set(node["properties"]) == set(json_form._NODE_REQUIRED + json_form._NODE_OPTIONAL)
    assert set(s["properties"]) == {"workload", "models", "format", "format_version", "verifiers", "rpeg_graph",
                                    "cluster", "plan", "edge_attrs", "memory", "schedule", "graph", "steps", "lowered",
                                    "nodes", "edges", "fusions"}
    plan = s["properties"]["plan"]["anyOf"][0]
    assert set(plan["properties"]) == {"name", "graph", "cluster", "placements", "pools", "fusions"}
    assert set(s["$defs"]["verifier"]["properties"]) == {"name", "fn", "per_response"}
    assert set(s["$defs"]["pool"]["properties"]) == set(s["$defs"]["pool"]["required"]) == {"vertex", "size"}
    roles = list(program.ROLES)
    assert s["$defs"]["graph"]["properties"]["vertices"]["items"]["properties"]["role"]["enum"] == roles
    assert node["properties"]["role"]["anyOf"][0]["enum"] == roles


def scheduled_doc():
    return program_to_json(with_memory(scheduled(disaggregated_plan(1), 2)))


def edit(change):
    d = copy.deepcopy(scheduled_doc())
    change(d)
    return d


# (change, JSON path of the bad value, reader message); every one is a schema violation too.
SCHEMA_BAD = [
    (lambda d: d["nodes"][3].update(time=-1.0), "nodes[3].time", r"expected a number >= 0, got -1\.0"),
    (lambda d: d["nodes"][3].update(start=-0.5), "nodes[3].start", r"expected a number >= 0"),
    (lambda d: d["nodes"][2].update(bytes=-1), "nodes[2].bytes", r"expected an integer >= 0, got -1"),
    (lambda d: d["nodes"][2].update(bytes=2**60), "nodes[2].bytes", r"too large"),
    (lambda d: d["nodes"][2].update(step=-1), "nodes[2].step", r"expected an integer >= 0"),
    (lambda d: d["nodes"][2].update(time="1"), "nodes[2].time", r"expected a number, got the string"),
    (lambda d: d["memory"]["peak"].update({"1": -5.0}), "memory.peak.1", r"expected a number >= 0"),
    (lambda d: d["memory"].update(m_eff=-1.0), "memory.m_eff", r"expected a number >= 0"),
    (lambda d: d["schedule"].update(makespan=-1.0), "schedule.makespan", r"expected a number >= 0"),
    (lambda d: d["schedule"].update(util=-0.1), "schedule.util", r"expected a number >= 0"),
    (lambda d: d.update(steps=0), "steps", r"expected an integer >= 1"),
    (lambda d: d.update(format_version=True), "format_version", r"unsupported version a boolean"),
    (lambda d: d["rpeg_graph"]["quantiles"][0].update(f=1.5), "rpeg_graph.quantiles[0].f",
     r"expected a number <= 1"),
    (lambda d: d["nodes"][0].update(fraction=0), "nodes[0].fraction", r"expected a number > 0"),
    (lambda d: d["nodes"][0].update(colour=1), "nodes[0].colour", r"unknown key 'colour'"),
    (lambda d: d["workload"].update(B=0), "workload.B", r"expected an integer >= 1"),
    (lambda d: d.update(fusions=[_fusion(d, [["X0.1"]])]), "fusions[0].stages[0][0]", r"expected a microtask"),
    (lambda d: d.update(fusions=[_fusion(d, [], members=1)]), "fusions[0].members", r"at least two members"),
    (lambda d: d["plan"].update(fusions=[["train"]]), "plan.fusions[0]", r"at least two training vertices"),
]


def _fusion(d, stages, members=2):
    return {"id": "fuse0#0", "members": [n["id"] for n in d["nodes"][:members]], "stages": stages}




@pytest.mark.parametrize("change,path,message", SCHEMA_BAD, ids=[p for _, p, _ in SCHEMA_BAD])
def test_schema_and_reader_reject_at_the_same_path(change, path, message):
    d = edit(change)
    assert path in schema_paths(d)
    text = json.dumps(d, indent=1)
    with pytest.raises(RpegError, match=message) as e:
        program_from_text(text, "bad.json")
    assert e.value.message.startswith(f"at {path}: ")
    # Located at the value: the line holds the key, the column points at what follows the colon.
    line = text.splitlines()[e.value.loc.line - 1]
    assert (e.value.loc.line, e.value.loc.col) == json_text.locate(text, path) and e.value.loc.line > 1
    last = json_text.parse_path(path)[-1]
    if isinstance(last, str):
        assert line.lstrip().startswith(f'"{last}"') and line[e.value.loc.col - 1] not in " :"


# Semantic checks the schema cannot express: the schema accepts these documents, the reader does not.
SEMANTIC_BAD = [
    (lambda d: d["nodes"][3].update(finish=d["nodes"][3]["start"] - 1e-3 if d["nodes"][3]["start"] >= 1e-3 else 0,
                                    start=max(d["nodes"][3]["start"], 1e-3)),
     "nodes[3].finish", r"is before start"),
    (lambda d: d["nodes"][4].update(id=d["nodes"][0]["id"]), "nodes[4].id", r"is used twice"),
    (lambda d: d["edges"].append([d["edges"][0][1], d["edges"][0][0]]), None, r"dependency cycle .* -> .*"),
    (lambda d: d["edges"].append([d["nodes"][0]["id"]] * 2), None, r"dependency cycle (\S+) -> \1;"),
    (lambda d: d["edges"].append([d["nodes"][0]["id"], "nowhere"]), None, r"unknown node id 'nowhere'"),
    (lambda d: d.update(steps=1000000), "steps", r"'steps' is 1000000, but the nodes end at step 1"),
    (lambda d: d.update(steps=1), None, r"node .* is in step 1, but 'steps' is 1"),
]


@pytest.mark.parametrize("change,path,message", SEMANTIC_BAD, ids=[m[:30] for _, _, m in SEMANTIC_BAD])
def test_semantic_checks_beyond_the_schema(change, path, message):
    d = edit(change)
    assert not schema_paths(d)
    text = json.dumps(d, indent=1)
    with pytest.raises(RpegError, match=message) as e:
        program_from_text(text, "bad.json")
    assert e.value.loc.line > 1
    if path is not None:
        assert e.value.message.startswith(f"at {path}: ")
        assert (e.value.loc.line, e.value.loc.col) == json_text.locate(text, path)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_non_finite_numbers_are_rejected_on_read_and_located(token):
    text = json.dumps(scheduled_doc(), indent=1)
    key = '"makespan": '
    at = text.index(key) + len(key)
    end = text.index(",", at)
    bad = text[:at] + token + text[end:]
    with pytest.raises(RpegError, match="finite") as e:
        program_from_text(bad, "bad.json")
    assert json_text.line_col(bad, at) == (e.value.loc.line, e.value.loc.col)


def test_nan_is_never_written():
    d = scheduled_doc()
    d["nodes"][0]["time"] = math.nan
    with pytest.raises(json_text.NonFiniteError, match=r"the value at nodes\[0\]\.time is not a finite number"):
        json_text.dumps(d)
    from rpegc.cli import UsageError, emit_program
    from rpegc.syntax.json_form import program_from_json

    p = program_from_json(scheduled_doc(), "p.json")
    bad = p.exec.nodes[0].with_(time=math.inf)
    from dataclasses import replace

    broken = replace(p, exec=replace(p.exec, nodes=(bad,) + p.exec.nodes[1:]))
    with pytest.raises(UsageError, match=r"cannot emit JSON: the value at nodes\[0\]\.time is not a finite"):
        emit_program(broken, "json")
    import rpegc  # the Python API raises the same located error

    with pytest.raises(rpegc.RpegError, match=r"cannot emit JSON: the value at nodes\[0\]\.time is not a finite"):
        rpegc.to_json(broken)


@pytest.mark.parametrize("text", ["[" * 100000, '{"a":' * 100000, "[" * 65 + "]" * 65, '{"k": ' + "[" * 900 + "]" * 900 + "}"])
def test_deep_nesting_is_a_located_error(text):
    with pytest.raises(RpegError, match="more than 64 levels deep") as e:
        program_from_text(text, "deep.json")
    assert e.value.loc.line == 1 and e.value.loc.col > 1


def test_locate_walks_to_the_value():
    text = '{"a": [1, {"b c": 2, "d": [3, 4]}],\n "e": {"f": 5}, "e": {"f": 6}}'
    assert json_text.locate(text, 'a[1]["b c"]') == (1, 19)
    assert json_text.locate(text, "a[1].d[1]") == (1, 31)
    assert json_text.locate(text, "e.f") == (2, 28)  # the last of duplicate keys, as json reads it
    assert json_text.locate(text, "a[7]") == (1, 7)  # not there: the deepest enclosing value
    assert json_text.parse_path('nodes[17].version_in["a.b"]') == ["nodes", 17, "version_in", "a.b"]


def test_nodes_and_edges_read_from_text_carry_their_location(tmp_path):
    """Errors found after reading (passes, the runtime) point at the node in the JSON file, not at file:0:0."""
    from rpegc.runtime.plan import load_plan

    d = scheduled_doc()
    comm = next(i for i, n in enumerate(d["nodes"]) if n["kind"] == "comm")
    d["nodes"][comm]["devices"] = None
    d["nodes"][comm].pop("alloc")
    text = json.dumps(d, indent=1)
    p = program_from_text(text, "p.json")
    for i in (0, comm, len(d["nodes"]) - 1):
        loc = p.exec.nodes[i].loc
        assert (loc.line, loc.col) == json_text.locate(text, f"nodes[{i}]")
    e0 = p.exec.edges[3].loc
    assert (e0.line, e0.col) == json_text.locate(text, "edges[3]")
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(RpegError, match="has no allocation") as e:
        load_plan(str(path))
    assert (e.value.loc.line, e.value.loc.col) == json_text.locate(text, f"nodes[{comm}]")
