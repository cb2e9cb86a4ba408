"""The members of a fusion on one worker (docs/stage-fusion.md): each member's training runs in a thread of its own,
exactly one thread runs at a time, and they take turns in the order the plan gives this worker's pipeline stage.

A member's code between two of its turn points belongs to the turn it is in, so every collective and every
point-to-point message of a member is issued at a fixed place in the sequence, the same on every worker of the stage
(dp replicas run the same list), whatever the threads' timing. The sequence is: each member's "start" turn (what it
does before its first microtask: reading its rows, its advantages), then rounds of the stage's microtasks followed
by each member's "finish" turn (its optimizer step; put after every microtask of the round so that no stage waits in
a member's collective for a microtask another stage runs later), repeated for every optimizer step of the
members; the turns of a member that has finished are skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Callable, Optional, Sequence

START, FINISH = "start", "finish"
Turn = tuple[int, str, int]  # (member, "F" | "B" | START | FINISH, microbatch or -1)

_CURRENT: contextvars.ContextVar[Optional[tuple["Interleave", int]]] = contextvars.ContextVar(
    "rpegc_fused_member", default=None)


class InterleaveError(RuntimeError):
    """A member reached a turn point the plan's order does not give it next, or another member failed."""


class Interleave:
    """Turns among `members` threads: their start turns, then `round` (this stage's microtasks as (member, kind,
    microbatch), and each member's finish turn) again and again."""

    def __init__(self, members: int, round_turns: Sequence[Turn], clock: Callable[[], float] = lambda: 0.0):
        self.members = members
        self.clock = clock  # the worker's clock, for the microtasks' records
        self.records: list[list[tuple[str, int, float, float]]] = [[] for _ in range(members)]
        self.start = [(i, START, -1) for i in range(members)]
        self.round = list(round_turns) + [(i, FINISH, -1) for i in range(members)]
        self.pos = 0
        self.done: set[int] = set()
        self.failed: Optional[BaseException] = None
        self.cv = threading.Condition()

    def current(self) -> Optional[Turn]:
        if len(self.done) == self.members:
            return None
        i = self.pos
        return self.start[i] if i < len(self.start) else self.round[(i - len(self.start)) % len(self.round)]

    def order(self, member: int) -> list[tuple[str, int]]:
        """The microtasks of `member` in one round, in order."""
        return [(kind, j) for m, kind, j in self.round if m == member and kind not in (START, FINISH)]

    def _advance(self) -> None:
        self.pos += 1
        for _ in range(len(self.start) + len(self.round)):  # skip the turns of finished members
            turn = self.current()
            if turn is None or turn[0] not in self.done:
                break
            self.pos += 1
        self.cv.notify_all()

    def _await(self, turn: Turn) -> None:
        while True:
            if self.failed is not None:
                raise InterleaveError(f"another member of the fusion failed: {self.failed}")
            now = self.current()
            if now == turn:
                return
            if now is not None and now[0] == turn[0]:
                raise InterleaveError(f"member {turn[0]} reached {_text(turn)} where the plan's order has "
                                      f"{_text(now)}: its microbatches are not the plan's")
            self.cv.wait()

    def begin(self, member: int) -> None:
        """Block until `member`'s start turn."""
        with self.cv:
            self._await((member, START, -1))

    def point(self, member: int, kind: str, micro: int = -1) -> None:
        """`member` ends its current turn and blocks until its turn (kind, micro) comes."""
        with self.cv:
            self._advance()
            self._await((member, kind, micro))

    def end(self, member: int, error: Optional[BaseException] = None) -> None:
        """`member` is done (or failed: every waiting member then fails too)."""
        with self.cv:
            if error is not None and self.failed is None:
                self.failed = error
            self.done.add(member)
            self._advance()


def _text(turn: Turn) -> str:
    member, kind, j = turn
    return f"its {kind} turn" if j < 0 else f"{kind}{member}.{j}"


def current_member() -> Optional[tuple[Interleave, int]]:
    """(the interleave, this thread's member) inside a fused member's thread, else None."""
    return _CURRENT.get()


def await_turn(kind: str, micro: int = -1) -> None:
    """Wait for this member's turn (kind, micro) when the calling thread runs a fused member; else nothing."""
    here = _CURRENT.get()
    if here is not None:
        here[0].point(here[1], kind, micro)


@contextlib.contextmanager
def microtask(kind: str, micro: int):
    """Run the body as the calling fused member's microtask (kind, micro): after waiting for its turn, and recorded
    with its start and finish on the interleave's clock. Outside a fusion, just the body."""
    here = _CURRENT.get()
    if here is None:
        yield
        return
    inter, member = here
    inter.point(member, kind, micro)
    start = inter.clock()
    yield
    inter.records[member].append((kind, micro, start, inter.clock()))


def run_members(inter: Interleave, members: Sequence[Callable[[], object]]) -> list[object]:
    """Run each of `members` in its own thread under `inter`'s turns; their results, or the first failure raised."""
    results: list[object] = [None] * len(members)
    errors: list[Optional[BaseException]] = [None] * len(members)

    def body(i: int, fn: Callable[[], object]) -> None:
        _CURRENT.set((inter, i))
        error = None
        try:
            inter.begin(i)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, and to the other members
            errors[i] = error = e
        finally:
            inter.end(i, error)

    threads = [threading.Thread(target=body, args=(i, fn), name=f"fused-member-{i}", daemon=True)
               for i, fn in enumerate(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, InterleaveError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results
