"""Dynamic sampling's over-sampling (`rpeg.workload {..., oversample = K}`, program.Workload): generation and
inference run on K x B prompts, every data container holds the drawn rows, training runs on B; the score counts
the B trained prompts. Priced against the same program with K x B prompts and no over-sampling (operators other
than training, container moves) and with B (training)."""

import json
import re

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.syntax.json_form import program_from_json, program_to_json
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program
from fixtures.torch_runs import compile_plan

SOURCE = open("examples/grpo-tiny.rpeg").read()


def workload(B: int, oversample: int) -> str:
    return re.sub(r"rpeg\.workload \{B = 16,", f"rpeg.workload {{B = {B}, oversample = {oversample},", SOURCE, count=1)


def test_oversample_is_read_written_and_kept_by_every_form():
    p = parse(workload(16, 3), "o.rpeg")
    assert (p.workload.B, p.workload.oversample, p.workload.drawn, p.workload.env["B"]) == (16, 3, 48, 48)
    assert "oversample = 3" in print_program(p) and parse(print_program(p), "o.rpeg") == p
    assert program_from_json(json.loads(json.dumps(program_to_json(p))), "o.json") == p
    assert "oversample" not in print_program(parse(SOURCE, "g.rpeg"))  # 1 is not written
    with pytest.raises(RpegError, match="bad.rpeg:6:37: error: 'oversample' of rpeg.workload must be a positive "
                                        "integer, found 0"):
        parse(workload(16, 0), "bad.rpeg")


def test_generation_and_inference_are_priced_at_the_drawn_prompts_training_at_b(tmp_path):
    drawn = compile_plan(tmp_path, "drawn.rpeg", steps=1, text=workload(16, 2))
    double = compile_plan(tmp_path, "double.rpeg", steps=1, text=workload(32, 1))
    single = compile_plan(tmp_path, "single.rpeg", steps=1, text=workload(16, 1))

    def nodes(plan):
        return {n.node.id: n.node for n in plan.nodes}

    got, twice, once = nodes(drawn), nodes(double), nodes(single)
    assert set(got) == set(twice) == set(once)
    for i, node in got.items():
        if node.role == "training":
            assert node.time == once[i].time and node.time < twice[i].time, i
        else:  # generation, inference and every move of a container: the drawn rows
            assert (node.time, node.bytes) == (twice[i].time, twice[i].bytes), i
            if node.kind == "op" or node.container is not None:
                assert node.time > once[i].time, i


@pytest.mark.parametrize("source, change, why", [
    ("examples/ppo-tiny.rpeg", None, "is not GRPO-shaped (ppo)"),
    ("examples/grpo-tiny.rpeg", ("R = 4", "R = 1"), "has R = 1"),
])
def test_oversample_needs_a_grpo_shaped_graph_with_groups(source, change, why):
    from rpegc.core.check.wellformed import check_program

    text = re.sub(r"(rpeg\.workload \{[^}]*)\}", r"\1, oversample = 2}", open(source).read(), count=1)
    if change is not None:
        text = text.replace(*change, 1)
    errors = [e.message for e in check_program(parse(text, "o.rpeg"))]
    assert any("oversample = 2 (dynamic sampling)" in m and why in m for m in errors), errors
    assert check_program(parse(workload(16, 2), "g.rpeg")) == []
