"""A UTF-8 byte-order mark at the start of a file is accepted wherever text is decoded: the parser entry,
the driver's .rpeg and .json readers and the runtime's plan loader; columns of later errors stay right."""

from __future__ import annotations

import json

from fixtures.programs import ACTOR_GRAPH
from rpegc.cli import main
from rpegc.syntax.parser import parse
from runtime.plan import load_program

BOM = "\ufeff"
SOURCE = "// a comment first\n" + ACTOR_GRAPH


def test_parse_accepts_a_leading_bom():
    assert parse(BOM + SOURCE, "bom.rpeg") == parse(SOURCE, "plain.rpeg")


def test_driver_reads_rpeg_and_json_with_a_bom(tmp_path, capsys):
    rpeg = tmp_path / "bom.rpeg"
    rpeg.write_bytes((BOM + SOURCE).encode("utf-8"))
    assert main([str(rpeg), "-p", "verify-wellformed"]) in (0, None)
    as_json = tmp_path / "plain.json"
    assert main([str(rpeg), "--emit=json", "-o", str(as_json)]) in (0, None)
    bom_json = tmp_path / "bom.json"
    bom_json.write_bytes(BOM.encode("utf-8") + as_json.read_bytes())
    json.loads(as_json.read_text())
    assert main([str(bom_json), "-p", "verify-wellformed"]) in (0, None)
    capsys.readouterr()


def test_error_columns_after_a_bom(tmp_path, capsys):
    bad = tmp_path / "bad.rpeg"
    bad.write_bytes((BOM + "rpeg.workload {B = 64, R = 1, Lp = 128, Lr = 384, Q = 1}\n").encode("utf-8"))
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.rpeg:1:51: error: unknown attribute 'Q'" in err
    assert "\n" + " " * 50 + "^" in err
    assert BOM not in err


def test_runtime_loads_rpeg_and_json_with_a_bom(tmp_path):
    rpeg = tmp_path / "bom.rpeg"
    rpeg.write_bytes((BOM + SOURCE).encode("utf-8"))
    assert load_program(str(rpeg)) == parse(SOURCE)
    from rpegc.syntax.json_form import program_to_json

    js = tmp_path / "bom.json"
    js.write_bytes((BOM + json.dumps(program_to_json(parse(SOURCE)))).encode("utf-8"))
    assert load_program(str(js)) == parse(SOURCE)
