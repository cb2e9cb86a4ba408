"""unroll and the lowering passes stay linear in K, and K is bounded.

No wall-clock time is asserted (bench/unroll_scaling.py measures it): the exec graph of 4K steps is 4x the
one of K steps after every lowering stage, the per-step lookups are indexed, a pass does not run the cycle
collector over the growing module, and a K beyond the limits is a located error naming the size and limit."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest

from rpegc.core.ir.errors import RpegError
from fixtures.lowering import lower
from rpegc.core.lower.unroll import MAX_OP_NODES, MAX_STEPS, unroll
from rpegc.syntax.parser import parse
from fixtures.spies import CountingTuple

PPO8 = parse((Path(__file__).parent.parent / "examples" / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")


def sizes(k: int) -> tuple[int, int]:
    p = lower(unroll(PPO8, k))
    return len(p.exec.nodes), len(p.exec.edges)


def test_lowered_graph_grows_linearly_in_k():
    n8, e8 = sizes(8)
    n32, e32 = sizes(32)
    n40, e40 = sizes(40)
    # Every step adds the same nodes and edges: the size is affine in K.
    assert n40 - n32 == (n32 - n8) // 3 and e40 - e32 == (e32 - e8) // 3


def test_unroll_looks_placements_up_by_index():
    plan = dataclasses.replace(PPO8.plan, placements=CountingTuple(PPO8.plan.placements))
    p = dataclasses.replace(PPO8, plan=plan)
    CountingTuple.iterations = 0
    unroll(p, 64)
    assert CountingTuple.iterations <= 1  # one pass builds the index; not one scan per op node


def test_a_pass_does_not_run_the_cycle_collector():
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    from rpegc.dialects.convert import program_to_module
    from rpegc.passes.program_pass import transform

    module = program_to_module(unroll(PPO8, 32))
    gc.callbacks.append(count)
    try:
        transform("insert-comm", module, lambda p: lower(p))
    finally:
        gc.callbacks.remove(count)
    assert len(collections) <= 1  # at most the young collection when the collector is switched back on
    assert gc.isenabled()


def test_k_beyond_the_step_limit_is_refused():
    with pytest.raises(RpegError) as info:
        unroll(PPO8, MAX_STEPS + 1)
    assert info.value.loc.line == PPO8.graph.loc.line
    assert f"unroll{{k={MAX_STEPS + 1}}} asks for more than {MAX_STEPS} steps" in info.value.message


def test_k_times_vertices_beyond_the_op_node_limit_is_refused():
    wide = dataclasses.replace(PPO8.graph, vertices=PPO8.graph.vertices * 4)  # 24 vertices (names repeat)
    p = dataclasses.replace(PPO8, graph=wide, plan=None)
    k = MAX_OP_NODES // 24 + 1
    assert k <= MAX_STEPS
    with pytest.raises(RpegError) as info:
        unroll(p, k)
    assert (f"unroll{{k={k}}} of graph @ppo (24 vertices) would build {k * 24} op nodes, more than the limit "
            f"of {MAX_OP_NODES}; use at most k={MAX_OP_NODES // 24}") in info.value.message
