"""What an exec graph's numbers must be, for every reader (rpegc/core/check/exec_numbers.py; issue 33, item 5):
rpegc's text and JSON readers and its API refuse what rpeg-run refuses (a scheduled node with a finish but no start
was accepted and written back so; a node time of 1e308 gave `makespan 1e+308`)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from fixtures.runtime_plans import disaggregated_plan, scheduled
from rpegc import api
from rpegc.cli import main as rpegc_main
from rpegc.core.check.exec_numbers import MAX_TIME_S, check_exec
from rpegc.core.ir.errors import RpegError
from rpegc.syntax.json_form import program_to_json

def _comm(doc: dict) -> dict:
    return next(n for n in doc["nodes"] if n["kind"] == "comm")


CASES = [
    (lambda d: d["nodes"][0].pop("start"), "has a finish but no start"),
    (lambda d: d["nodes"][0].pop("finish"), "has a start but no finish"),
    (lambda d: d["nodes"][0].update(time=1e308), "times must be finite, >= 0 and at most 1e\\+09 s"),
    (lambda d: _comm(d).update(version_out={"actor": 99}), "publishes @actor version 99; a transfer publishes no"),
]


@pytest.mark.parametrize("tamper, message", CASES)
def test_every_reader_refuses_an_exec_node_no_run_could_have(tmp_path, capsys, tamper, message):
    doc = program_to_json(scheduled(disaggregated_plan(1), 1))
    tamper(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RpegError, match=message):
        api.load(str(path))
    assert rpegc_main([str(path), "-p", "verify-wellformed", "-o", str(tmp_path / "out.json")]) == 1
    assert re.search(message, capsys.readouterr().err) and not (tmp_path / "out.json").exists()


def test_an_intact_plan_and_one_at_the_time_bound_pass():
    p = scheduled(disaggregated_plan(1), 1)
    check_exec(p)
    check_exec(replace(p, exec=replace(p.exec, nodes=tuple(n.with_(time=MAX_TIME_S) for n in p.exec.nodes))))
