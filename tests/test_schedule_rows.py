"""`row_scheduler`, the compiled list scheduler, on graphs small enough to schedule by hand (Alg. 5, App. A-H).

The batched evaluator's bit-identity with the reference path is `test_search_differential.py`; these pin the
kernel's own rules: ready times, device classes, the priority tie-break, the chain slots, and the ranks."""

import numpy as np

from rpegc.core.sched.row_scheduler import downstream_ranks, schedule_rows


def run(T, cls, prio, succ, npred, chain, nxt, heads, overlap, record=True):
    """One row; N = len(T) - 1 is the dummy."""
    rows = [np.array([x]) for x in (T, cls, prio, succ, npred, chain, nxt, heads, overlap)]
    T_, cls_, prio_, succ_, npred_, chain_, nxt_, heads_, over_ = rows
    start, finish = (np.zeros(T_.shape), np.zeros(T_.shape)) if record else (np.zeros((0, 0)), np.zeros((0, 0)))
    makespan = np.empty(1)
    schedule_rows(T_.astype(float), cls_, prio_, succ_, npred_, chain_, nxt_, heads_, over_, start, finish, makespan)
    return makespan[0], start.reshape(-1), finish.reshape(-1)


# Three nodes, a -> c and b independent, N = 3 is the dummy. Chains: [a, c] and [b].
SUCC = [[2], [3], [3], [3]]
NPRED = [0, 0, 1, 1 << 30]
CHAIN = [0, 1, 0, 0]
NXT = [2, 3, 3, 3]
HEADS = [0, 1]


def test_independent_classes_overlap_in_time():
    over = np.eye(3, dtype=bool)  # classes 0 and 1 share no device; class 2 reserves nothing
    over[2, 2] = False
    ms, start, finish = run([2.0, 3.0, 1.0, 0.0], [0, 1, 0, 2], [0, 1, 2, 99], SUCC, NPRED, CHAIN, NXT, HEADS, over)
    assert (ms, list(start[:3]), list(finish[:3])) == (3.0, [0.0, 0.0, 2.0], [2.0, 3.0, 3.0])


def test_shared_devices_serialise_by_priority():
    over = np.zeros((3, 3), dtype=bool)
    over[:2, :2] = True  # classes 0 and 1 share devices
    # b has the smaller priority: it goes first at t = 0, a waits for its devices
    ms, start, _ = run([2.0, 3.0, 1.0, 0.0], [0, 1, 0, 2], [1, 0, 2, 99], SUCC, NPRED, CHAIN, NXT, HEADS, over)
    assert (ms, list(start[:3])) == (6.0, [3.0, 0.0, 5.0])
    ms, start, _ = run([2.0, 3.0, 1.0, 0.0], [0, 1, 0, 2], [0, 1, 2, 99], SUCC, NPRED, CHAIN, NXT, HEADS, over)
    assert (ms, list(start[:3])) == (6.0, [0.0, 2.0, 5.0])  # a first; then b before c (both EST 2) by priority


def test_makespan_without_recording():
    over = np.zeros((3, 3), dtype=bool)
    ms, start, _ = run([2.0, 3.0, 1.0, 0.0], [0, 1, 0, 2], [0, 1, 2, 99], SUCC, NPRED, CHAIN, NXT, HEADS, over,
                       record=False)
    assert ms == 3.0 and start.size == 0


def test_downstream_ranks_and_generation_chains():
    # a -> c, b -> c; a and b form one generation chain (they take the larger of their ranks)
    T = np.array([[1.0, 4.0, 2.0]])
    succ = np.array([[2], [2], [3], [3]])
    rank = np.empty((1, 3))
    downstream_ranks(T, succ, np.array([2, 0, 1]), np.array([-1, -1, -1]), 0, rank)
    assert list(rank[0]) == [3.0, 6.0, 2.0]
    downstream_ranks(T, succ, np.array([2, 0, 1]), np.array([0, 0, -1]), 1, rank)
    assert list(rank[0]) == [6.0, 6.0, 2.0]
