"""The turns of a fusion's members on one worker (runtime/backends/torch/worker/interleave.py): one thread at a time, in
the stage's order, round after round, a finished member's turns skipped, a member off the plan's order or a failed
member stopping every member with an error (no hang)."""

from __future__ import annotations

import threading

import pytest

from rpegc.runtime.backends.torch.worker.interleave import (FINISH, Interleave, InterleaveError, await_turn,
                                                      current_member, microtask, run_members)

ROUND = [(0, "F", 0), (0, "F", 1), (1, "F", 0), (0, "B", 0), (1, "B", 0), (0, "B", 1)]


def member(i: int, rounds: int, log: list, running: list):
    def body():
        inter, me = current_member()
        assert me == i
        for r in range(rounds):
            for kind, j in inter.order(i):
                await_turn(kind, j)
                running.append(threading.get_ident())
                assert len(set(running[-1:])) == 1
                log.append((i, kind, j))
            await_turn(FINISH)
            log.append((i, FINISH, -1))
        return f"member {i}"
    return body


def test_members_take_turns_in_the_stage_order_round_after_round():
    log: list = []
    out = run_members(Interleave(2, ROUND), [member(0, 2, log, []), member(1, 2, log, [])])
    assert out == ["member 0", "member 1"]
    one = ROUND + [(0, FINISH, -1), (1, FINISH, -1)]
    assert log == one + one


def test_a_finished_members_turns_are_skipped():
    log: list = []
    run_members(Interleave(2, ROUND), [member(0, 3, log, []), member(1, 1, log, [])])
    assert [t for t in log if t[0] == 0] == [t for t in ROUND + [(0, FINISH, -1)] if t[0] == 0] * 3
    assert log.count((1, FINISH, -1)) == 1


def test_without_a_fusion_await_turn_does_nothing():
    assert current_member() is None
    await_turn("F", 0)


def test_a_member_off_the_plans_order_fails_every_member():
    def wrong():
        await_turn("F", 1)  # the plan has F0.0 first

    with pytest.raises(InterleaveError, match="reached F0.1 where the plan's order has F0.0"):
        run_members(Interleave(2, ROUND), [wrong, member(1, 1, [], [])])


def test_a_failing_member_stops_the_others_with_its_error():
    def boom():
        await_turn("F", 0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_members(Interleave(2, ROUND), [boom, member(1, 1, [], [])])


def test_a_microtask_waits_for_its_turn_and_is_recorded_on_the_interleaves_clock():
    ticks = iter(range(100))
    inter = Interleave(1, [(0, "F", 0), (0, "B", 0)], clock=lambda: float(next(ticks)))

    def body():
        for kind, j in inter.order(0):
            with microtask(kind, j):
                pass
        await_turn(FINISH)

    run_members(inter, [body])
    assert inter.records == [[("F", 0, 0.0, 1.0), ("B", 0, 2.0, 3.0)]]
    with microtask("F", 0):  # outside a fusion: only the body
        pass
