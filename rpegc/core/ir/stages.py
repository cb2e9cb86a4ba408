"""The stages a module goes through in a pipeline, and what each pass needs of them and leaves.

A module starts as its cyclic graph G° (cyclic); `unroll` makes its exec graph (unrolled); the lowering passes
insert Comm and Reshard nodes (lowered); `annotate-cost` then writes node times. Every rpegc pass declares a
`PassStages` as its class attribute `stages`, and so may a plugin's pass. The driver walks a pipeline with these
declarations before any pass runs and refuses the first pass whose needs are not met, at its column, with a message
built from the declarations (`refusal`). A pass that declares nothing may change anything, so the walk stops there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from rpegc.core.ir.options import option, required
from rpegc.core.ir.program import Program

LOWERING_ORDER = "split-quantiles, insert-comm, insert-reshard"


@dataclass(frozen=True)
class Stage:
    """A stage of a module, with what to tell a pass that needs it when the module is short of it or past it."""

    name: str = required("the stage as the messages say a module is: 'unrolled', 'lowered'")
    rank: int = required("its place in a pipeline: passes move a module to a higher rank, never back")
    reach: tuple[str, ...] = required("the passes that bring a cyclic module to this stage, as messages suggest them")
    short: str = option("", "the refusal of a pass that needs this stage on a module not there yet; "
                            "format fields: name (the pass), first (the passes to run first), times")
    past: str = option("", "the refusal of a pass that needs this stage on a module beyond it; format fields: "
                           "name, does (PassStages.does), why (who took the module there), made (to which stage)")


CYCLIC = Stage("cyclic", 0, (), past="{name} {does}, but {why} {made} it; {name} runs before unroll, once")
UNROLLED = Stage("unrolled", 1, ("unroll{k=..}",),
                 short="{name} needs an unrolled module; run {first} before {name}",
                 past="{name} cannot run on a lowered module ({why} ran insert-reshard); the lowering passes run "
                      f"once, in the order {LOWERING_ORDER}")
LOWERED = Stage("lowered", 2, ("unroll{k=..}", *LOWERING_ORDER.split(", ")),
                short="{name} needs a lowered module{times}; run {first} first")
STAGES = (CYCLIC, UNROLLED, LOWERED)  # by rank

TRANSFORMS_G = "transforms the cyclic graph G°"  # what the structural passes do (PassStages.does)
NO_TIMES = "{name} needs node times; run annotate-cost before {name}"
WITH_TIMES = " with node times"


@dataclass(frozen=True)
class Order:
    """An ordering fact that is not a stage: a pass runs before, or after, another pass of the same pipeline."""

    other: str = required("the other pass (the pass itself: it runs once)")
    before: bool = required("true: refused once `other` ran; false: refused unless `other` ran, checked only on a "
                            "stage this pipeline made (what ran on an input module is unknown)")
    message: str = required("the refusal; format fields: name (the pass), other, lowering (LOWERING_ORDER)")


def before(other: str, message: str) -> Order:
    return Order(other, True, message)


def after(other: str, message: str) -> Order:
    return Order(other, False, message)


@dataclass(frozen=True)
class PassStages:
    """What a pass needs of the module it runs on and what it leaves; a pass class declares it as `stages`.
    The default declares a pass that runs on any stage and leaves it as it is (a check)."""

    needs: Optional[Stage] = option(None, "the stage the module must be at; None: any stage")
    produces: Optional[Stage] = option(None, "the stage the pass leaves the module at, without node times; "
                                             "None: the stage it found")
    needs_times: bool = option(False, "the pass reads node times")
    gives_times: bool = option(False, "the pass writes a time on every node")
    order: tuple[Order, ...] = option((), "ordering facts that are not stages")
    does: str = option("", "what the pass does to the stage it needs, said when the module is past it")
    then: tuple[str, ...] = option((), "the passes suggested after the needed stage's `reach` when the module is "
                                       "short of it")
    trim: bool = option(False, "suggest only the passes after those that reached the module's stage (else all)")


@dataclass(frozen=True)
class Walk:
    """Where the passes of a pipeline checked so far have brought the module."""

    stage: Stage = required("the module's stage")
    timed: bool = required("every node of the module has a time")
    by: Optional[tuple[str, int]] = required("the pass of this pipeline that made `stage` and its column; None: "
                                             "the input module was at it")
    ran: frozenset[str] = option(frozenset(), "the passes of this pipeline so far")


def start(p: Program) -> Walk:
    """The walk's start: the input module's stage and node times."""
    g = p.exec
    stage = CYCLIC if g is None else (LOWERED if g.lowered else UNROLLED)
    return Walk(stage, g is not None and bool(g.nodes) and all(n.time is not None for n in g.nodes), None)


def refusal(decl: PassStages, name: str, walk: Walk) -> Optional[str]:
    """Why the pass `name` declaring `decl` cannot run where `walk` is; None: it can."""
    return _stage_refusal(decl, name, walk) or _times_refusal(decl, name, walk) or _order_refusal(decl, name, walk)


def advance(decl: PassStages, name: str, col: int, walk: Walk) -> Walk:
    """The walk after the pass `name` at column `col` ran."""
    ran = walk.ran | {name}
    if decl.produces is not None:
        return Walk(decl.produces, False, (name, col), ran)
    return replace(walk, timed=walk.timed or decl.gives_times, ran=ran)


def _stage_refusal(decl: PassStages, name: str, walk: Walk) -> Optional[str]:
    need = decl.needs
    if need is None or need == walk.stage:
        return None
    if walk.stage.rank < need.rank:
        suggested = (need.reach + decl.then)[len(walk.stage.reach) if decl.trim else 0:]
        return need.short.format(name=name, first=", ".join(suggested), times=WITH_TIMES if decl.needs_times else "")
    why = f"{walk.by[0]} at column {walk.by[1]} already" if walk.by else "the input module is already"
    # An input module beyond the stage is said to be at the next one: that much is certain.
    made = walk.stage.name if walk.by else STAGES[need.rank + 1].name
    return need.past.format(name=name, does=decl.does, why=why, made=made)


def _times_refusal(decl: PassStages, name: str, walk: Walk) -> Optional[str]:
    return NO_TIMES.format(name=name) if decl.needs_times and not walk.timed else None


def _order_refusal(decl: PassStages, name: str, walk: Walk) -> Optional[str]:
    for o in decl.order:
        broken = o.other in walk.ran if o.before else walk.by is not None and o.other not in walk.ran
        if broken:
            return o.message.format(name=name, other=o.other, lowering=LOWERING_ORDER)
    return None
