"""The array-level greedy list scheduler (Alg. 5): schedule validity, agreement with a literal
transcription of Alg. 5, every tie-breaker, determinism and input errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.geometry import Alloc, Cluster, alloc_mask, device_mask, mask_devices
from rpegc.core.sched.list_scheduler import downstream_ranks, greedy_schedule, prepare_schedule, run_schedule

FAST = settings(max_examples=60, deadline=None)


def reference_schedule(times, is_transfer, reserved, edges, groups=None, order_keys=None):
    """Alg. 5 written out literally: every iteration recomputes EST of every ready node."""
    n = len(times)
    succs = {v: sorted({w for u, w in edges if u == v}) for v in range(n)}
    preds = {v: sorted({u for u, w in edges if w == v}) for v in range(n)}
    rank: dict[int, float] = {}

    def r(v):
        if v not in rank:
            rank[v] = times[v] + max((r(w) for w in succs[v]), default=0.0)
        return rank[v]

    eff = [r(v) for v in range(n)]
    if groups is not None:
        for v in range(n):
            eff[v] = max(r(w) for w in range(n) if groups[w] == groups[v])
    keys = order_keys if order_keys is not None else list(range(n))
    avail: dict[int, float] = {}
    start, finish = [None] * n, [None] * n
    done: set[int] = set()
    while len(done) < n:
        ready = [v for v in range(n) if v not in done and all(u in done for u in preds[v])]

        def est(v):
            return max([finish[u] for u in preds[v]] + [avail.get(d, 0.0) for d in reserved[v]] + [0.0])

        v = min(ready, key=lambda v: (est(v), 0 if is_transfer[v] else 1, -eff[v], keys[v], v))
        start[v] = est(v)
        finish[v] = start[v] + times[v]
        for d in reserved[v]:
            avail[d] = finish[v]
        done.add(v)
    return start, finish


@st.composite
def dags(draw, max_nodes=18, max_devices=6):
    n = draw(st.integers(1, max_nodes))
    ndev = draw(st.integers(1, max_devices))
    # A few distinct values make exact EST ties (and so the tie-breakers) common.
    time = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 10.0, allow_nan=False))
    times = draw(st.lists(time, min_size=n, max_size=n))
    is_transfer = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    reserved = [
        tuple(sorted(draw(st.sets(st.integers(0, ndev - 1), min_size=0 if is_transfer[v] else 1, max_size=ndev))))
        for v in range(n)
    ]
    topo = draw(st.permutations(range(n)))
    p = draw(st.floats(0.0, 0.6))
    flips = draw(st.lists(st.floats(0.0, 1.0), min_size=n * n, max_size=n * n))
    edges = [(topo[i], topo[j]) for i in range(n) for j in range(i + 1, n) if flips[i * n + j] < p]
    groups = draw(st.lists(st.integers(0, max(0, n // 3)), min_size=n, max_size=n))
    order_keys = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=n, max_size=n))
    return times, is_transfer, reserved, edges, groups, order_keys


def longest_path(times, edges):
    n = len(times)
    preds = {v: [u for u, w in edges if w == v] for v in range(n)}
    memo: dict[int, float] = {}

    def lp(v):
        if v not in memo:
            memo[v] = times[v] + max((lp(u) for u in preds[v]), default=0.0)
        return memo[v]

    return max(lp(v) for v in range(n))


@FAST
@given(dags())
def test_schedule_is_valid(dag):
    times, is_transfer, reserved, edges, groups, keys = dag
    s = greedy_schedule(times, is_transfer, reserved, edges, groups, keys)
    n = len(times)
    assert sorted(s.order) == list(range(n))  # every node scheduled exactly once
    for v in range(n):
        assert s.start[v] >= 0.0 and s.finish[v] == s.start[v] + times[v]
    for u, v in edges:
        assert s.finish[u] <= s.start[v]  # precedence
    for u in range(n):
        for v in range(u + 1, n):
            if set(reserved[u]) & set(reserved[v]):  # device exclusivity on [s, f)
                assert not (max(s.start[u], s.start[v]) < min(s.finish[u], s.finish[v]))
    load = max((sum(t for t, r in zip(times, reserved) if d in r) for d in set().union(*reserved)), default=0.0)
    assert s.makespan == max(s.finish)
    assert s.makespan >= longest_path(times, edges) - 1e-9
    assert s.makespan >= load - 1e-9
    assert s.makespan <= sum(times) + 1e-9
    assert s.busy == pytest.approx(sum(t * len(r) for t, r in zip(times, reserved)))
    assert s.op_time == pytest.approx(sum(t for t, tr in zip(times, is_transfer) if not tr))


@FAST
@given(dags())
def test_heap_scheduler_matches_literal_algorithm_5(dag):
    times, is_transfer, reserved, edges, groups, keys = dag
    s = greedy_schedule(times, is_transfer, reserved, edges, groups, keys)
    start, finish = reference_schedule(times, is_transfer, reserved, edges, groups, keys)
    assert list(s.start) == start and list(s.finish) == finish


@FAST
@given(dags(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_edge_listing(dag, rnd):
    times, is_transfer, reserved, edges, groups, keys = dag
    a = greedy_schedule(times, is_transfer, reserved, edges, groups, keys)
    shuffled = edges + edges[: len(edges) // 2]
    rnd.shuffle(shuffled)
    masks = [device_mask(r) for r in reserved]
    b = greedy_schedule(times, is_transfer, masks, shuffled, groups, keys)
    assert a == b


@FAST
@given(dags(), st.lists(st.floats(0.0, 5.0), min_size=18, max_size=18))
def test_prepared_structure_is_reusable_across_time_maps(dag, other):
    times, is_transfer, reserved, edges, groups, keys = dag
    structure = prepare_schedule(is_transfer, reserved, edges, groups, keys)
    times2 = other[: len(times)]
    assert run_schedule(structure, times) == greedy_schedule(times, is_transfer, reserved, edges, groups, keys)
    assert run_schedule(structure, times2) == greedy_schedule(times2, is_transfer, reserved, edges, groups, keys)


# ---- tie-breakers: each case is decided by exactly one rule ----------------------------------


def test_smaller_est_wins_over_every_tie_breaker():
    # comm (1) is ready only at t=1; op 2 can start at 0 on the same device despite lower rank.
    times = [1.0, 1.0, 1.0, 9.0]
    s = greedy_schedule(times, [False, True, False, False], [(1,), (0,), (0,), (2,)], [(0, 1), (1, 3)])
    assert s.start[2] == 0.0 and s.start[1] == 1.0


def test_comm_and_reshard_before_op():
    # Both ready at 0 on device 0; the op has the larger rank and the lower index and key.
    times = [1.0, 1.0, 5.0]
    s = greedy_schedule(times, [False, True, False], [(0,), (0,), (1,)], [(0, 2)], order_keys=[0, 1, 2])
    assert s.order[0] == 1 and s.start[1] == 0.0 and s.start[0] == 1.0


def test_larger_rank_first():
    # Ops 0 and 1 share device 0; 1 leads to a long successor, so it goes first despite index/key.
    times = [1.0, 1.0, 5.0]
    s = greedy_schedule(times, [False, False, False], [(0,), (0,), (1,)], [(1, 2)], order_keys=[0, 1, 2])
    assert s.start[1] == 0.0 and s.start[0] == 1.0
    assert downstream_ranks(prepare_schedule([False] * 3, [(0,), (0,), (1,)], [(1, 2)]), times) == [1.0, 6.0, 5.0]


def chain_vs_intruder(groups):
    # g1 -> g2 on device 0 (a generation chain); p on device 1 then y on device 0. At t=1 both g2
    # and y can start on device 0: rank(g2) = 1 < rank(y) = 1.5 < rank(g1) = 2.
    times = [1.0, 1.0, 1.0, 1.5]
    reserved = [(0,), (0,), (1,), (0,)]
    edges = [(0, 1), (2, 3)]
    return greedy_schedule(times, [False] * 4, reserved, edges, groups=groups)


def test_generation_phases_inherit_the_chain_head_rank():
    s = chain_vs_intruder(groups=["gen", "gen", "p", "y"])
    assert s.start[1] == 1.0 and s.start[3] == 2.0  # the chain is not interrupted
    s = chain_vs_intruder(groups=None)
    assert s.start[3] == 1.0 and s.start[1] == 2.5  # without inheritance the intruder goes first


def test_lower_rpeg_order_key_breaks_equal_rank():
    times = [1.0, 1.0]
    s = greedy_schedule(times, [False, False], [(0,), (0,)], [], order_keys=[(1, 0), (0, 5)])
    assert s.order == (1, 0)
    s = greedy_schedule(times, [False, False], [(0,), (0,)], [], order_keys=[(0, 1), (0, 1)])
    assert s.order == (0, 1)  # equal keys: the lower node index


def test_unrolled_steps_keep_the_same_relative_order():
    # Two steps of vertices a (order 0) and b (order 1) on one device, all independent, equal ranks:
    # step-major keys give a0 b0 a1 b1 whatever the node numbering.
    ids = ["b1", "a1", "b0", "a0"]
    keys = [(1, 1), (1, 0), (0, 1), (0, 0)]
    s = greedy_schedule([1.0] * 4, [False] * 4, [(0,)] * 4, [], order_keys=keys)
    assert [ids[v] for v in s.order] == ["a0", "b0", "a1", "b1"]


def test_waiting_node_est_grows_when_its_device_is_taken():
    # Node 2 is ready at 0 but device 0 is taken first by node 0 (comm), then by node 1 (ready at
    # t=0.5 via node 3 on device 1, larger rank). Node 2 must be re-evaluated, not started at 0.
    times = [1.0, 2.0, 1.0, 0.5, 4.0]
    is_t = [True, False, False, False, False]
    reserved = [(0,), (0,), (0,), (1,), (2,)]
    edges = [(3, 1), (1, 4)]
    s = greedy_schedule(times, is_t, reserved, edges)
    assert s.start[0] == 0.0 and s.start[1] == 1.0 and s.start[2] == 3.0
    assert (list(s.start), list(s.finish)) == reference_schedule(times, is_t, reserved, edges)


def test_transfer_without_devices_only_waits_for_predecessors():
    s = greedy_schedule([2.0, 1.0, 1.0], [False, True, False], [(0,), (), (0,)], [(0, 1)])
    assert s.start[1] == 2.0 and s.start[2] == 2.0


# ---- inputs ------------------------------------------------------------------------------------


def test_cycle_is_a_user_error():
    with pytest.raises(RpegError, match="cycle.*a, b"):
        greedy_schedule([1.0, 1.0], [False, False], [(0,), (0,)], [(0, 1), (1, 0)], names=["a", "b"])


def test_self_edge_and_bad_index_are_user_errors():
    with pytest.raises(RpegError, match="depends on itself"):
        greedy_schedule([1.0], [False], [(0,)], [(0, 0)])
    with pytest.raises(RpegError, match="outside"):
        greedy_schedule([1.0], [False], [(0,)], [(0, 3)])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_times_are_user_errors(bad):
    with pytest.raises(RpegError, match="finite and non-negative"):
        greedy_schedule([1.0, bad], [False, False], [(0,), (0,)], [])


def test_empty_graph():
    s = greedy_schedule([], [], [], [])
    assert s.makespan == 0.0 and s.order == ()


@FAST
@given(st.data())
def test_alloc_mask_matches_alloc_devices(data):
    c = Cluster("c", data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8)), "h100")
    origin, extent = [], []
    for size in (c.racks, c.nodes, c.gpus):
        o = data.draw(st.integers(0, size - 1))
        origin.append(o)
        extent.append(data.draw(st.integers(1, size - o)))
    a = Alloc(tuple(origin), tuple(extent))
    assert alloc_mask(a, c) == device_mask(a.devices(c))
    assert mask_devices(alloc_mask(a, c)) == tuple(sorted(a.devices(c)))
