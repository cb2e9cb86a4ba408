"""A verify vertex (issue 36): a reward function on a pool of host processes, priced T_verify = t_call +
ceil(rows / P) t_resp (core/cost/host.py), scheduled on the pool's own resource so that it overlaps the devices'
work; a pool's processes beyond the host cores the devices leave share a device's core and hold that device while
they run; read and written by the text form; checked by verify-wellformed and the plan rules with located errors."""

import dataclasses
import math
import re

import pytest

from rpegc.core.check.wellformed import check_program
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.cost.contention import devices_per_host
from rpegc.core.cost.host import (check_pools, cores_needed, per_response, pool_cores, verify_node_time, verify_time,
                                  verify_witness)
from rpegc.core.ir.geometry import Cluster
from rpegc.core.ir.errors import RpegError
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program
from fixtures.torch_runs import compile_plan

SOURCE = open("examples/grpo-verify.rpeg").read()
HW = load_hardware("cpu-reference")


def stated(per: float, pool: int = 1, gpus: int = 1) -> str:
    text = SOURCE.replace('@rule  {fn = "rule"}', f'@rule  {{fn = "rule", per_response = {per}}}')
    text = text.replace("@score       pool = 1", f"@score       pool = {pool}")
    return text.replace("gpus = 1,", f"gpus = {gpus},")


def test_the_text_form_reads_and_writes_verifiers_pools_and_pooled_nodes(tmp_path):
    p = parse(stated(0.002), "v.rpeg")
    assert p.verifier("rule").per_response == 0.002 and p.plan.pool("score").size == 1
    assert p.graph.vertex("score").role == "verify" and "score" not in {pl.vertex for pl in p.plan.placements}
    assert parse(print_program(p), "v.rpeg") == p
    plan = compile_plan(tmp_path, "v.rpeg", steps=2, text=stated(0.002))
    text = print_program(plan.program)
    assert re.search(r"exec\.op @score#0 verify @rule step 0 order \d pool = 1 reads \{%Y\} writes \{%r\}", text)
    assert parse(text, "x.rpeg") == plan.program


@pytest.mark.parametrize("hardware, pool", [("cpu", 1), ("a100-40g", 3)])
def test_a_verify_node_costs_t_call_plus_its_share_of_the_rows(tmp_path, hardware, pool):
    text = stated(0.002, pool=pool).replace('hardware = "cpu"', f'hardware = "{hardware}"')
    plan = compile_plan(tmp_path, "v.rpeg", steps=1, text=text)
    node = plan.node("score#0").node
    call = load_hardware("cpu-reference" if hardware == "cpu" else hardware).verify_call
    assert node.time == pytest.approx(call + math.ceil(16 * 4 / pool) * 0.002, rel=1e-12)  # B R = 64 responses
    assert node.alloc is None and node.pool == pool
    assert verify_time(64, 3, 0.5, 0.1) == 0.1 + 22 * 0.5



def test_a_verify_node_pays_the_speed_witness_that_ends_it_where_the_runs_have_witnesses(tmp_path):
    """[host] verify_witness: each pool process ends its share with the speed witness, all at once, so a verify node
    pays one; a verifier the worker scores itself (the toy rule) pays the worker's ([overhead] witness); none where
    the profile's runs have no witnesses (runtime/speed_probe.py)."""
    plan = compile_plan(tmp_path, "v.rpeg", steps=1, text=stated(0.002, pool=2))
    node = plan.node("score#0").node
    hw = load_hardware("cpu-reference")
    witnessed = dataclasses.replace(hw, verify_witness=4e-4, overhead=dataclasses.replace(hw.overhead, witness=2e-4))
    unwitnessed = dataclasses.replace(witnessed, overhead=hw.overhead)
    base = verify_node_time(plan.program, node.model, 2, hw)
    verifier = plan.program.verifier(node.model)
    assert verify_node_time(plan.program, node.model, 2, witnessed) - base == pytest.approx(
        verify_witness(verifier, witnessed), rel=1e-9)
    assert verify_node_time(plan.program, node.model, 2, unwitnessed) == base
    assert verify_witness(dataclasses.replace(verifier, fn="math"), witnessed) == 4e-4
    assert verify_witness(dataclasses.replace(verifier, fn="rule"), witnessed) == 2e-4
    assert verify_witness(dataclasses.replace(verifier, fn="math"), unwitnessed) == 0.0

def test_the_pool_runs_beside_the_devices_and_counts_no_device_time(tmp_path):
    plan = compile_plan(tmp_path, "v.rpeg", steps=2, text=stated(0.002))
    nodes = {n.id: n.node for n in plan.nodes}
    score, ref = nodes["score#0"], nodes["ref_inf#0"]
    into = next(n for n in nodes.values() if n.kind == "comm" and n.alloc is None and n.step == 0)
    assert into.src_alloc is not None and into.container == "Y"
    assert score.start < ref.finish and ref.start < score.finish  # overlap: the pool is not the device
    assert plan.devices == (0, 1) and plan.model_devices == (0,)  # device 1: the pool, one past the cluster's
    report = plan.program.exec.schedule
    device_busy = sum(n.time for n in nodes.values() if n.alloc is not None)
    assert report.util == pytest.approx(device_busy / report.makespan, rel=1e-9)


def test_a_built_in_takes_its_time_from_the_profile_and_another_must_state_it():
    p = parse(SOURCE, "v.rpeg")
    assert per_response(p.verifier("rule"), HW) == HW.per_response("rule") > 0
    custom = parse(SOURCE.replace('fn = "rule"', 'fn = "my_rewards:score"'), "c.rpeg")
    with pytest.raises(RpegError, match=r"c.rpeg:11:1: error: verifier @rule runs 'my_rewards:score', whose time per "
                                        r"response the hardware profile .* does not give .* per_response = 0.002"):
        per_response(custom.verifier("rule"), HW)


@pytest.mark.parametrize("size, cores, gpus, want", [
    (1, 2, 1, (1, ())), (2, 2, 1, (1, (0,))), (1, 2, 2, (0, (1,))), (2, 2, 2, (0, (1, 0))),
    (3, 8, 4, (3, ())), (6, 8, 4, (4, (3, 2))), (2, 1, 4, (0, (3, 2))),
])
def test_a_pools_processes_take_the_cores_the_devices_leave_then_share_the_last_devices(size, cores, gpus, want):
    assert pool_cores(size, cores, Cluster("c", 1, 2, gpus, "cpu")) == want  # devices of the first node only


def test_a_plan_needs_a_core_per_device_on_its_busiest_host_and_its_pools_on_the_first():
    assert cores_needed([2, 1], 0) == 2 and cores_needed([1, 3], 1) == 3 and cores_needed([2, 1], 1) == 3
    assert cores_needed([[1, 3], [2, 0], [0, 0]], [0, 1, 2]).tolist() == [3, 3, 2]  # the optimizer's arrays
    assert devices_per_host([0, 1, 5], 4, 2).tolist() == [2, 1]


def test_a_pool_has_at_most_the_hosts_cores():
    check_pools(parse(stated(0.002), "v.rpeg"), HW)  # 1 device + 1 pool process on 2 cores
    check_pools(parse(stated(0.002, pool=2), "v.rpeg"), HW)  # the second process shares the device's core
    with pytest.raises(RpegError, match=r"big.rpeg:45:3: error: the plan runs @score on 3 host processes, but the "
                                        r"first node's host has 2 cores; use a pool of at most 2 processes"):
        check_pools(parse(stated(0.002, pool=3), "big.rpeg"), HW)
    gpu = load_hardware("a100-40g")
    bare = gpu.__class__(**{**gpu.__dict__, "host_cores": None})
    with pytest.raises(RpegError, match=r"does not give the host's cores; add \[host\] cores = N"):
        check_pools(parse(stated(0.002), "v.rpeg"), bare)


def test_devices_beyond_the_hosts_cores_leave_a_pool_none():
    one_core = HW.__class__(**{**HW.__dict__, "host_cores": 1})
    two = stated(0.002, gpus=2).replace("@ref_inf     at (0, 0, 0)", "@ref_inf     at (0, 0, 1)")
    with pytest.raises(RpegError, match=r"t.rpeg:45:3: error: the plan's devices on the first node take 2 of its "
                                        r"host's 1 cores, and its verifier pool needs 0 of its own beside them"):
        check_pools(parse(two, "t.rpeg"), one_core)


def test_a_pool_short_of_cores_holds_the_device_it_shares(tmp_path):
    plan = compile_plan(tmp_path, "v.rpeg", steps=2, text=stated(0.002, pool=2))
    nodes = [n.node for n in plan.nodes]
    score = next(n for n in nodes if n.id == "score#0")
    assert score.shares == (0,) and score.time == pytest.approx(HW.verify_call + 32 * 0.002, rel=1e-12)
    into = [n for n in nodes if n.kind == "comm" and n.alloc is None]
    assert into and all(n.shares == (0,) for n in into)  # the pool's process receives on the shared core
    on_device = [n for n in nodes if n.alloc is not None]
    for v in (n for n in nodes if n.alloc is None):
        assert all(n.finish <= v.start or v.finish <= n.start for n in on_device)
    assert "pool = 2 shares = [0]" in print_program(plan.program)
    assert parse(print_program(plan.program), "x.rpeg") == plan.program


def test_a_shared_device_the_plan_leaves_empty_is_not_held(tmp_path):
    plan = compile_plan(tmp_path, "v.rpeg", steps=1, text=stated(0.002, gpus=2))  # everything on device 0
    assert plan.node("score#0").node.shares == ()  # the rule would share device 1: its core is free
    moved = stated(0.002, gpus=2).replace("@ref_inf     at (0, 0, 0)", "@ref_inf     at (0, 0, 1)")
    plan = compile_plan(tmp_path, "w.rpeg", steps=1, text=moved)
    assert plan.node("score#0").node.shares == (1,)


@pytest.mark.parametrize("change, message", [
    (('@score       verify     @rule  reads', '@score       verify     @nope  reads'),
     r"unknown verifier @nope: the module defines no such verifier; define it with rpeg.verifier"),
    (('per_response = 0.002', 'per_response = -1'),
     r"per_response of verifier @rule is the seconds one call takes, a positive number; found -1"),
    (('@score       pool = 1', '@score       pool = 0'), r"pool of @score must be"),
    (('@score       pool = 1', '@score       at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1'),
     r"@score is a verify vertex: it runs on host processes, not on devices; place it with '@score pool = N'"),
    (('@ref_inf     at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1', '@ref_inf     pool = 1'),
     r"@ref_inf is a inference vertex: it runs on devices"),
    (('@score       verify     @rule  reads(%Y)', '@score       verify     @rule  reads(%Y, %W_ref)'),
     r"verify vertex @score reads or writes the weights %W_ref; a verifier runs no model"),
    (('writes(%r)', 'writes(%r, %logp_ref)'), r"verify vertex @score must write exactly one rewards container"),
])
def test_bad_verifiers_and_pools_are_located_errors(change, message):
    text = stated(0.002).replace(*change)
    assert text != stated(0.002)
    with pytest.raises(RpegError, match=message):
        p = parse(text, "bad.rpeg")
        errors = check_program(p)
        if errors:
            raise errors[0]


@pytest.mark.parametrize("node, change, message", [
    ("@score#0", "pool = 2 shares = [0]", "pool = 2 shares = [3]"),
    ("@gen#0", "dp = 1 pp = 1 tp = 1 mb = 1 reads", "dp = 1 pp = 1 tp = 1 mb = 1 shares = [0] reads"),
])
def test_a_shares_clause_off_the_pool_or_off_the_node_is_a_located_error(tmp_path, node, change, message):
    text = print_program(compile_plan(tmp_path, "v.rpeg", steps=1, text=stated(0.002, pool=2)).program)
    line = next(x for x in text.splitlines() if x.lstrip().startswith(f"exec.op {node} "))
    bad = text.replace(line, line.replace(change, message, 1))
    assert bad != text
    from rpegc.core.sched.schedule import schedule_program

    want = r"shares device 3, which is not one of the first node's 1 devices" if "3" in message else \
        r"node gen#0 shares the cores of devices \[0\], but it runs on its allocation"
    with pytest.raises(RpegError, match=want):
        schedule_program(parse(bad, "bad.rpeg"))


@pytest.mark.parametrize("bad, message", [([-1], r"shares\[0\]: expected an integer >= 0, got -1"),
                                          ("x", r"shares: expected a list, got the string 'x'")])
def test_the_json_form_reads_shares_and_locates_bad_ones(tmp_path, bad, message):
    import json

    from rpegc.syntax.json_form import program_from_text, program_to_json

    program = compile_plan(tmp_path, "v.rpeg", steps=1, text=stated(0.002, pool=2)).program
    doc = program_to_json(program)
    assert program_from_text(json.dumps(doc), "ok.json").exec == program.exec  # shares = [0] read back
    node = next(n for n in doc["nodes"] if n.get("shares"))
    node["shares"] = bad
    with pytest.raises(RpegError, match=r"b.json:\d+:\d+: error: at nodes\[\d+\]\." + message):
        program_from_text(json.dumps(doc, indent=1), "b.json")
