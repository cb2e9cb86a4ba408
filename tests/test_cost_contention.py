"""The runtime's threads on a host whose cores the plan takes (core/cost/contention.py): such a host's operators (a
device's, a verifier pool's) stretch by 1 + c N_h / B_h and its nodes pay the full round trip (`node`), a host with a
core left the free one (`node_free`); a verifier pool's cores count as taken. An allocation's ranks computing together on a host's cores
stretch by 1 + co_busy (k - 1) / (cores - 1), and by the cores that other operators and pools compute beside them in
the schedule. The optimizer's two evaluators price all of it alike (tests/test_search_differential.py, the contended
profile)."""

from dataclasses import replace

import numpy as np
import pytest

from rpegc.api import parse, run_pipeline
from rpegc.core.cost.annotate import annotate, computing_cores, priced_round_trip
from rpegc.core.cost.contention import (co_busy_stretch, full_hosts, host_stretches, overlap_stretches, prices_overlaps,
                                        stretch)
from rpegc.core.cost.hardware import Overhead, load_hardware
from rpegc.core.cost.host import pool_taken_cores
from rpegc.core.ir.geometry import Cluster
from rpegc.core.ir.program import VERIFY
from rpegc.core.sched.schedule import schedule_program

TWO = open("examples/grpo-tiny-2.rpeg").read()  # every vertex on both devices of a 2-core host
ONE = TWO.replace("extent (1, 1, 2) dp = 2", "extent (1, 1, 1) dp = 1")  # every vertex on the first device
VERIFIED = open("examples/grpo-verify.rpeg").read().replace('{fn = "rule"}', '{fn = "rule", per_response = 2e-4}')
LOWER = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,fuse-stages"
CONTENDED = Overhead(node=1e-3, node_free=2e-4, contention=5e-4)


def lowered(text: str):
    return run_pipeline(parse(text, "t.rpeg"), LOWER)


def times(p, overhead: Overhead, cores=2) -> dict:
    hw = replace(load_hardware("cpu-reference"), overhead=overhead, host_cores=cores)
    return {n.id: n.time for n in annotate(p, hw).exec.nodes}


def device_op(n) -> bool:
    return n.kind == "op" and n.role != VERIFY


def test_the_stretch_is_the_floating_work_over_the_operators_time():
    assert stretch(0.04, 9, 1e-3) == pytest.approx(1 + 9e-3 / 0.04, rel=1e-12)
    assert stretch(0.0, 9, 1e-3) == 1.0  # a host that runs no operator
    assert np.allclose(stretch(np.array([0.02, 0.04]), np.array([4, 8]), 1e-3), [1.2, 1.2])


def test_a_host_is_full_where_its_devices_and_the_pool_take_its_cores():
    assert full_hosts([2, 1], 0, 2).tolist() == [True, False]
    assert full_hosts([1, 0], 1, 2).tolist() == [True, False]  # the pool's core: the first node's
    assert full_hosts([[1], [2]], [0, 0], 2).tolist() == [[False], [True]]  # the optimizer's rows
    assert not full_hosts([8], 0, None).any()  # a profile without [host] cores: nowhere
    c1, c2 = Cluster("c", 1, 1, 1, "cpu"), Cluster("c", 1, 1, 2, "cpu")
    assert pool_taken_cores(1, 2, c1, {0}) == 1  # its own core beside the device's
    assert pool_taken_cores(1, 2, c2, {0}) == 1  # the core of device 1, which the plan leaves unused
    assert pool_taken_cores(1, 2, c2, {0, 1}) == 0  # it shares device 1's core: not one more


def test_host_stretches_count_each_node_once_in_any_order():
    hosts = np.array([0, 0, 1, 0, 1])
    device_s = np.array([0.01, 0.0, 0.02, 0.03, 0.0])
    counted = np.array([True, True, True, False, True])  # the fourth: a relay
    k = host_stretches(hosts, device_s, counted, [True, True], 1e-3)
    assert k == pytest.approx([1 + 2e-3 / 0.01, 1 + 2e-3 / 0.02], rel=1e-12)
    order = np.array([4, 2, 0, 3, 1])
    assert np.array_equal(host_stretches(hosts[order], device_s[order], counted[order], [True, True], 1e-3), k)
    assert host_stretches(hosts, device_s, counted, [True, False], 1e-3)[1] == 1.0  # a host with a core left
    assert np.array_equal(host_stretches(hosts, device_s, counted, [True, True], 0.0), [1.0, 1.0])


def test_a_plan_on_every_core_stretches_its_operators_and_pays_the_full_round_trip():
    p = lowered(TWO)
    runs = times(p, Overhead())
    priced = times(p, CONTENDED)
    nodes = p.exec.nodes
    assert not p.exec.fusions
    busy = sum(runs[n.id] * n.alloc.size for n in nodes if device_op(n))
    k = 1 + 5e-4 * len(nodes) / busy
    assert k > 1.01  # the stretch is not lost in the tolerance
    for n in nodes:
        want = (runs[n.id] * k if device_op(n) else runs[n.id]) + 1e-3
        assert priced[n.id] == pytest.approx(want, rel=1e-9), n.id


def test_a_transfer_of_weights_pays_transfer_weights_and_a_fields_transfer():
    """The publication of the trained weights to the generating device is one large message; the fields are small."""
    split = ONE.replace("@train_actor at (0, 0, 0) extent (1, 1, 1)", "@train_actor at (0, 0, 1) extent (1, 1, 1)")
    p = lowered(split)
    runs = times(p, Overhead())
    priced = times(p, Overhead(transfer=3e-4, transfer_weights=2e-3))
    moved = [n for n in p.exec.nodes if n.kind != "op"]
    assert {n.model is not None for n in moved} == {True, False}  # both kinds in the plan
    for n in moved:
        assert priced[n.id] - runs[n.id] == pytest.approx(2e-3 if n.model is not None else 3e-4, rel=1e-9), n.id
    assert all(priced[n.id] == runs[n.id] for n in p.exec.nodes if n.kind == "op")
    plain = times(p, Overhead(transfer=3e-4))  # a profile without the key prices every transfer alike
    assert all(plain[n.id] - runs[n.id] == pytest.approx(3e-4, rel=1e-9) for n in moved)


def test_a_plan_that_leaves_a_core_free_pays_the_free_round_trip_only():
    p = lowered(ONE)
    runs, priced = times(p, Overhead()), times(p, CONTENDED)
    assert all(priced[i] == pytest.approx(t + 2e-4, rel=1e-12) for i, t in runs.items())
    # a profile without node_free prices both conditions with `node`; one with more cores leaves the 2 devices a core
    plain = times(lowered(TWO), replace(CONTENDED, node_free=None, contention=0.0))
    assert all(t == pytest.approx(r + 1e-3, rel=1e-12) for t, r in zip(plain.values(), times(lowered(TWO),
                                                                                             Overhead()).values()))
    roomy = times(lowered(TWO), CONTENDED, cores=3)
    assert all(t == pytest.approx(r + 2e-4, rel=1e-12) for t, r in zip(roomy.values(), times(lowered(TWO),
                                                                                             Overhead()).values()))


def test_a_verifier_pool_on_the_second_core_fills_the_host_and_shares_its_floating_work():
    """The runtime's floating threads preempt a pool's processes as they do the workers' main threads (measured: the
    arithmetic demo's pool process waited ~10 % of its verify for a core): the verify node stretches with the device
    operators, and its process-seconds are among those the floating work is spread over."""
    p = lowered(VERIFIED)  # one device and a pool of one process on a 2-core host
    runs, priced = times(p, Overhead()), times(p, CONTENDED)
    nodes = p.exec.nodes
    verify = [n for n in nodes if n.kind == "op" and not device_op(n)]
    assert verify and all(computing_cores(n) == n.pool == 1 for n in verify)
    busy = sum(runs[n.id] * computing_cores(n) for n in nodes)
    assert busy > sum(runs[n.id] * n.alloc.size for n in nodes if device_op(n))
    k = 1 + 5e-4 * len(nodes) / busy
    assert k > 1.01  # the stretch is not lost in the tolerance
    for n in nodes:  # every operator stretched, the transfers not
        want = (runs[n.id] * k if n.kind == "op" else runs[n.id]) + 1e-3
        assert priced[n.id] == pytest.approx(want, rel=1e-9), n.id
    assert all(t == pytest.approx(runs[i] + 2e-4, rel=1e-12) for i, t in times(p, CONTENDED, cores=3).items())


def test_the_summary_compares_with_the_round_trip_the_plan_is_priced_with():
    hw = replace(load_hardware("cpu-reference"), overhead=CONTENDED, host_cores=2)
    assert priced_round_trip(annotate(lowered(TWO), hw), hw) == pytest.approx(1e-3, rel=1e-12)
    assert priced_round_trip(annotate(lowered(ONE), hw), hw) == pytest.approx(2e-4, rel=1e-12)


def test_explain_says_each_hosts_condition_and_factor():
    from rpegc.core.cost.explain import explain

    hw = replace(load_hardware("cpu-reference"), overhead=CONTENDED, host_cores=2)
    p = annotate(lowered(TWO), hw)
    runs = times(lowered(TWO), Overhead())
    busy = sum(runs[n.id] * n.alloc.size for n in p.exec.nodes if device_op(n))
    text = explain(p, hw)
    assert "The runtime's own costs per host" in text
    row = next(line for line in text.splitlines() if line.startswith("  node 0"))
    assert row.split()[2:] == ["every", "core", "taken", str(len(p.exec.nodes)), "1", "ms", "x",
                               f"{1 + 5e-4 * len(p.exec.nodes) / busy:.4f}", "x", "1.0000"]
    assert "a core left free" in explain(annotate(lowered(ONE), hw), hw)
    one_core = replace(hw, host_cores=1)  # two devices' workers on one core: the model prices no time-slicing
    assert "  node 0  2 devices on 1 cores: time-sliced, not priced" in explain(annotate(lowered(TWO), one_core),
                                                                              one_core)
    assert "The runtime's own costs" not in explain(p, load_hardware("cpu-reference"))  # no [overhead]: none
    sib = replace(hw, overhead=replace(CONTENDED, co_busy=0.35))
    assert next(line for line in explain(annotate(lowered(TWO), sib), sib).splitlines()
                if line.startswith("  node 0")).endswith("x 1.3500")  # every operator on both cores


def test_co_busy_grows_with_the_allocations_devices_on_a_host():
    assert co_busy_stretch(2, 2, 0.3) == pytest.approx(1.3, rel=1e-12)  # the other core computes a sibling
    assert co_busy_stretch(1, 2, 0.3) == 1.0  # alone on its host
    assert co_busy_stretch(3, 5, 0.4) == pytest.approx(1.2, rel=1e-12)  # 2 of 4 other cores
    assert co_busy_stretch(8, 2, 0.3) == pytest.approx(1.3, rel=1e-12)  # at most the host's cores
    assert np.allclose(co_busy_stretch(np.array([[1, 2]]), 2, 0.5), [[1.0, 1.5]])  # the optimizer's rows
    assert co_busy_stretch(2, None, 0.3) == 1.0 and co_busy_stretch(2, 1, 0.3) == 1.0 and co_busy_stretch(2, 2, 0) == 1


def test_the_operators_of_an_allocation_on_both_cores_stretch_by_co_busy():
    busy = Overhead(co_busy=0.4)
    for text, factor in ((TWO, 1.4), (ONE, 1.0)):
        p = lowered(text)
        runs, priced = times(p, Overhead()), times(p, busy)
        for n in p.exec.nodes:  # transfers and verifier pools do not compute on the devices' cores
            assert priced[n.id] == pytest.approx(runs[n.id] * (factor if device_op(n) else 1.0), rel=1e-12), n.id
    both = times(lowered(TWO), replace(CONTENDED, co_busy=0.4))  # beside the contention stretch, which it multiplies
    alone = times(lowered(TWO), CONTENDED)
    for n in lowered(TWO).exec.nodes:
        if device_op(n):
            assert both[n.id] - 1e-3 == pytest.approx((alone[n.id] - 1e-3) * 1.4, rel=1e-9), n.id


def test_the_optimizer_leaves_a_plan_of_siblings_once_they_are_priced(tmp_path):
    """A GRPO large enough that two busy cores beat one (its generation and training data-parallel on both; the
    reference's and the reward model's inferences beside each other, a core each) is split instead, a device per group
    of vertices, once siblings computing together cost 30 % more (`co_busy`; the profile prices no overlaps of
    different vertices: no `co_run`)."""
    base = open(load_hardware("cpu-reference").source).read()
    text = TWO.replace("B = 16, R = 4, Lp = 4, Lr = 6", "B = 64, R = 8, Lp = 16, Lr = 32")
    widths = {}
    for b in (0.0, 0.3):
        profile = tmp_path / f"cpu-{b}.toml"
        profile.write_text(base + f"\n[overhead]\nco_busy = {b}\n")
        p = run_pipeline(parse(text.replace('hardware = "cpu"', f'hardware = "{profile}"'), "t.rpeg"),
                         "verify-wellformed,optimize{evals=500 seed=0 steps=4 summary=false}")
        widths[b] = {pl.vertex: pl.alloc.extent[2] for pl in p.plan.placements}
    assert widths[0.0]["gen"] == widths[0.0]["train_actor"] == 2 and set(widths[0.3].values()) == {1}, widths


def test_overlaps_count_the_cores_computing_beside_an_operator_over_its_interval():
    """3-core hosts (2 others at most), co_busy 0.4 for siblings, co_run 0.1 for the rest. Host 0: x [0, 10) and y
    [5, 15) on a device each, a pool of 2 scoring over [0, 4), a transfer across all: x sees 2 others for 4 ns, none for
    1, one for 5 (13 core-ns of 20), y one for 5 of 10 ns. Host 1: w [0, 10) on 2 devices, its sibling throughout
    (co_busy_stretch). Host 2: v [0, 10) on 2 devices and u [0, 5) on one: v its sibling for 10 ns and u for 5 more,
    u both of v's cores for 5. The pool and the transfer: 1."""
    start = np.array([[0, 5, 0, 0, 0, 0, 0]], dtype=np.int64)
    finish = np.array([[10, 15, 4, 10, 20, 10, 5]], dtype=np.int64)
    host = np.array([[0, 0, 0, 1, 0, 2, 2]], dtype=np.int64)
    cores = np.array([[1, 1, 2, 2, 0, 2, 1]], dtype=np.int64)
    computing = np.array([[True, True, True, True, False, True, True]])
    stretched = np.array([[True, True, False, True, False, True, True]])
    out = np.zeros((1, 7))
    overlap_stretches(start, finish, host, cores, computing, stretched, 3, 0.4, 0.1, out)
    want = [1 + 0.1 * 13 / 20, 1 + 0.1 * 5 / 20, 1, co_busy_stretch(2, 3, 0.4), 1, 1 + (0.4 * 10 + 0.1 * 5) / 20,
            1 + 0.1 * 10 / 10]
    assert out[0].tolist() == pytest.approx(want, rel=1e-15)
    crowded = np.zeros((1, 4))  # four operators of one core at once on 3 cores: 3 others, at most 2 count
    ones = np.ones((1, 4), dtype=np.int64)
    overlap_stretches(0 * ones, 10 * ones, 0 * ones, ones, ones == 1, ones == 1, 3, 0.4, 0.1, crowded)
    assert crowded[0].tolist() == pytest.approx([1.1] * 4, rel=1e-15)
    assert not prices_overlaps(0.0, 2) and not prices_overlaps(0.3, 1) and not prices_overlaps(0.3, None)
    assert prices_overlaps(0.3, 2)


def test_an_operator_beside_the_verifier_pool_stretches_by_the_share_of_its_time_the_pool_scores():
    """One device and a pool of one process on a 2-core host: each device operator is priced with co_run times the
    share of its interval (in the schedule of the times without overlaps) that a verify node overlaps."""
    p = lowered(VERIFIED)
    hw = replace(load_hardware("cpu-reference"), overhead=Overhead(), host_cores=2)
    first = schedule_program(annotate(p, hw)).exec.nodes
    pools = [(n.start, n.finish) for n in first if n.kind == "op" and n.role == VERIFY]
    priced = times(p, Overhead(co_busy=0.2, co_run=0.4))  # one device: no siblings
    shares = {}
    for n in first:
        if device_op(n):
            shares[n.id] = sum(max(0.0, min(n.finish, f) - max(n.start, s)) for s, f in pools) / (n.finish - n.start)
            ns = 2e-9 / (n.finish - n.start)  # the overlaps are integrated in whole ns: the share within 2 ns
            assert priced[n.id] == pytest.approx(n.time * (1 + 0.4 * shares[n.id]), rel=ns + 1e-12), n.id
        else:
            assert priced[n.id] == n.time, n.id
    assert max(shares.values()) > 0.5 and min(shares.values()) == 0.0  # the inference beside it, the others not
