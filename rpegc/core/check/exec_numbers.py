"""What an exec graph's numbers must be, for every tool that reads one (rpegc's readers and rpeg-run): its nodes'
steps end where the plan says, times are finite, non-negative and at most MAX_TIME_S, a scheduled node has both a
start and a finish, payloads are integers, phase shares lie in (0, 1], memory and schedule reports are finite, and
a transfer (Comm, Reshard) publishes no weights version; fusions follow rpegc/core/check/fusion_rules.py."""

from __future__ import annotations

import math

from rpegc.core.check.fusion_rules import check_exec_fusions
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Program


def check_exec(p: Program) -> None:
    """The checks below, on a module with an exec graph of at least one node (else nothing to check)."""
    if p.exec is None or not p.exec.nodes:
        return
    check_exec_steps(p)
    check_exec_numbers(p)
    check_transfer_versions(p)
    errors = check_exec_fusions(p)
    if errors:
        raise errors[0]


def check_transfer_versions(p: Program) -> None:
    """Only an Op publishes a weights version; a transfer's copy is the version it moves (its `version_in`), so a
    `version_out` on one would be silently ignored by the runtime."""
    g = p.exec
    assert g is not None
    for n in g.nodes:
        if n.kind != "op" and n.version_out:
            model, version = n.version_out[0]
            raise RpegError(n.loc, f"{n.kind} node {n.id} publishes @{model} version {version}; a transfer publishes "
                                   "no version, its copy is the one it moves (`version_in`)")


def check_exec_steps(p: Program) -> None:
    """The plan's `steps` is the number of steps its nodes were unrolled for: their steps end at steps-1."""
    g = p.exec
    assert g is not None
    for n in g.nodes:
        if not 0 <= n.step < g.steps:
            raise RpegError(n.loc, f"node {n.id} is in step {n.step}, but the plan has {g.steps} step(s) "
                                   f"(0..{g.steps - 1}); fix the node's step or the plan's steps")
    last = max(n.step for n in g.nodes)
    if last != g.steps - 1:
        raise RpegError(g.loc, f"the plan says {g.steps} step(s), but its nodes end at step {last} (they cover "
                               f"{last + 1} step(s)); set steps to what the plan was unrolled for")


MAX_TIME_S = 1e9  # 32 years: a node time or a schedule's instant beyond it is not a measurement of anything


def bad_number(x) -> bool:
    return isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0


def check_exec_numbers(p: Program) -> None:
    """Times, payloads and reports are finite and non-negative: the run and its checks compute with them."""
    g = p.exec
    assert g is not None
    for n in g.nodes:
        for what in ("time", "start", "finish"):
            x = getattr(n, what)
            if x is not None and (bad_number(x) or x > MAX_TIME_S):
                raise RpegError(n.loc, f"node {n.id} has {what} {x!r}; times must be finite, >= 0 and at most "
                                       f"{MAX_TIME_S:g} s")
        if (n.start is None) != (n.finish is None):
            raise RpegError(n.loc, f"node {n.id} has a {'finish' if n.start is None else 'start'} but no "
                                   f"{'start' if n.start is None else 'finish'}; a scheduled node has both")
        if n.start is not None and n.finish is not None and n.finish < n.start:
            raise RpegError(n.loc, f"node {n.id} finishes at {n.finish!r}, before it starts at {n.start!r}")
        if isinstance(n.bytes, bool) or not isinstance(n.bytes, int) or n.bytes < 0:
            raise RpegError(n.loc, f"node {n.id} moves {n.bytes!r} bytes; a payload is an integer >= 0")
        if n.fraction is not None and (bad_number(n.fraction) or not 0 < n.fraction <= 1):
            raise RpegError(n.loc, f"node {n.id} has fraction {n.fraction!r}; a phase share is in (0, 1]")
    if g.memory is not None:
        m = g.memory
        for what, values in (("peak", m.peak), ("persistent", m.persistent), ("transient", m.transient)):
            for d, b in values:
                if bad_number(b):
                    raise RpegError(g.loc, f"exec.memory {what} of device {d} is {b!r}; bytes must be finite and >= 0")
        for what in ("m_eff", "r_peak"):
            if bad_number(getattr(m, what)):
                raise RpegError(g.loc, f"exec.memory {what} is {getattr(m, what)!r}; it must be finite and >= 0")
    if g.schedule is not None:
        s = g.schedule
        for what in ("makespan", "score", "score_pen", "util", "p_eff"):
            x = getattr(s, what)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (
                    what not in ("score", "score_pen") and x < 0):
                raise RpegError(g.loc, f"exec.schedule {what} is {x!r}; it must be a finite number"
                                       + ("" if what in ("score", "score_pen") else " >= 0"))
