"""Seeds of the annealing from role-based partitions of the device set (beyond the paper).

The concurrent baseline (Sec. VIII-B, baselines.py) is the paper's seed. On the larger Table X workloads the
chains that start from it end in one of two basins whose plans differ in four to six placements at once
(bench/README.md, "Stability"), too far apart for one- and two-vertex moves. A template is another starting
point, one way of laying out the pipeline's roles on blocks of devices:

- generation on a block of half or a quarter of the devices that holds device 0 (a block elsewhere is the same
  layout up to a permutation of racks and nodes, which the cost model does not see);
- the trainers on the rest: all on the whole rest, or (two trainers) on two blocks that split it, the split
  closest to their share of the training work and the even one, or (one trainer, actor and critic shared) on
  a block of at least half the rest, one per size, the remainder left to inference;
- each inference vertex on any of those blocks;
- or every vertex on one block that holds device 0, of one device or of each size above (`colocated`): the
  colocated layout (verl's hybrid engine) that the partitions leave out, and on a small cluster often the best (a
  2-worker cluster on a 2-core host whose verifier pool shares the workers' cores: the chains from the concurrent
  seed end in a data-parallel plan 8% slower than everything on one worker, the verifier on the other core).

`block_descent` then improves every template at once by coordinate descent in which a vertex may only change
its strategy on its block (an inference vertex: also its block among the template's), all templates' moves of
one vertex in one batch. What it returns seeds chains next to the concurrent plan. A worker makes a variant's
templates in the first of its shares that pays for one whole pass of the descent (workers.py): with an
evaluation budget a variant's first share is often too small, and the shares grow for the variants that
survive successive halving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from rpegc.search.anneal import Budget, SearchState, affordable
from rpegc.search.compact import Choice, CompactVariant, Evaluation

BLOCK_FRACTIONS = (2, 4)  # generation on 1/2 or 1/4 of the devices
MAX_PASSES = 4


@dataclass(frozen=True)
class Template:
    """Per vertex, the device masks it may be placed on (generation and trainers: one)."""

    blocks: tuple[tuple[int, ...], ...]


def templates(cv: CompactVariant) -> list[Template]:
    """The variant's templates (none without a generation or a training vertex), in a fixed order."""
    roles = [d.role for d in cv.dirs]
    gen = [v for v, r in enumerate(roles) if r == "generation"]
    train = [v for v, r in enumerate(roles) if r == "training"]
    if not gen or not train:
        return []
    n = cv.num_devices
    full = (1 << n) - 1
    sizes = {n // f for f in BLOCK_FRACTIONS if n % f == 0}
    masks = [set(d.masks) for d in cv.dirs]
    gen_blocks = sorted({m for m, s in zip(cv.dirs[gen[0]].masks, cv.dirs[gen[0]].sizes)
                         if int(s) in sizes and m & 1 and all(m in masks[v] for v in gen)})
    out = []
    for g in gen_blocks:
        rest = full & ~g
        for trainer_blocks in _trainer_layouts(cv, masks, train, rest):
            spare = rest
            for b in trainer_blocks:
                spare &= ~b
            shared = sorted({g, rest, *trainer_blocks} | ({spare} if spare else set()))
            per_vertex = []
            for v, role in enumerate(roles):
                if role == "generation":
                    per_vertex.append((g,))
                elif role == "training":
                    per_vertex.append((trainer_blocks[train.index(v)],))
                elif not cv.device_vertex[v]:  # a verifier pool: beside every block, on the host
                    per_vertex.append(tuple(dict.fromkeys(cv.dirs[v].masks)))
                else:
                    per_vertex.append(tuple(m for m in shared if m in masks[v]))
            if all(per_vertex):
                out.append(Template(tuple(per_vertex)))
    return out


def colocated(cv: CompactVariant) -> list[Template]:
    """Every device vertex on one block holding device 0, one template per block size (one device, a quarter, a half,
    all), where every vertex's directory has that block; a verifier pool beside it on any of its sizes."""
    n = cv.num_devices
    gen = next((d for d in cv.dirs if d.role == "generation"), None)
    if gen is None:
        return []
    sizes = sorted({1, n, *(n // f for f in BLOCK_FRACTIONS if n % f == 0)})
    masks = [set(d.masks) for d in cv.dirs]
    out = []
    for size in sizes:
        block = min((m for m, s in zip(gen.masks, gen.sizes) if int(s) == size and m & 1), default=None)
        if block is None:
            continue
        per_vertex = [tuple(dict.fromkeys(d.masks)) if not on else ((block,) if block in masks[v] else ())
                      for v, (d, on) in enumerate(zip(cv.dirs, cv.device_vertex))]
        if all(per_vertex):
            out.append(Template(tuple(per_vertex)))
    return out


def _trainer_layouts(cv: CompactVariant, masks: list[set[int]], train: list[int], rest: int) -> list[tuple[int, ...]]:
    """The trainers' blocks: all on `rest`; with two trainers also the splits of `rest` closest to their share of
    the training work and the even split."""
    layouts = []
    if all(rest in masks[v] for v in train):
        layouts.append(tuple(rest for _ in train))
    if len(train) == 1:
        others = set().union(*(m for v, m in enumerate(masks) if v not in train))
        by_size: dict[int, int] = {}  # blocks of one size are mirror images: the first of each size
        for m in sorted(masks[train[0]]):
            n = m.bit_count()
            if m & rest == m and m != rest and 2 * n >= rest.bit_count() and (rest & ~m) in others:
                by_size.setdefault(n, m)
        return layouts + [(m,) for _, m in sorted(by_size.items(), reverse=True)]
    if len(train) != 2:
        return layouts
    a, b = (cv.dirs[v] for v in train)
    total = rest.bit_count()
    share = _work(a) / (_work(a) + _work(b))
    splits = sorted({(m, rest & ~m) for m in masks[train[0]]
                     if m & rest == m and m != rest and (rest & ~m) in masks[train[1]]},
                    key=lambda s: (s[0].bit_count(), s))
    by_target = sorted(splits, key=lambda s: abs(s[0].bit_count() / total - share))
    even = [s for s in splits if 2 * s[0].bit_count() == total]
    for s in by_target[:2] + even:
        if s not in layouts:
            layouts.append(s)
    return layouts


def _work(d) -> float:
    """A trainer's work in device-seconds: its best T_op times the devices it ran on."""
    return float(min(t * s for t, s in zip(d.t_op, d.sizes)))


def template_seeds(state: SearchState, cv: CompactVariant, budget: Budget, share: float) -> Optional[list[Choice]]:
    """The memory-feasible plans `block_descent` makes of the variant's templates, best first, with `share` of
    `budget` but at least one whole pass; None, evaluating nothing, when the budget cannot pay for the templates
    and one whole pass (below that the chains from the concurrent seed gain more: weak scaling at 3,000
    evaluations lost a median 3% with templates cut short)."""
    options = _options(cv, templates(cv) + colocated(cv))
    one_pass = len(options) + sum(len(o) for opts in options for o in opts)
    left = budget.left(state.evaluator)
    if left is not None and left < one_pass:
        return None
    part = budget.part(share, state.evaluator)
    if left is not None and part.max_evals < one_pass:
        part = replace(part, max_evals=one_pass)
    plans = _descend(state, cv, options, part)
    evals = state.evaluate(cv.variant, affordable(state, cv.variant, plans, part))
    ranked = sorted(zip(plans, evals), key=lambda x: -state.value(x[1]))
    return [p for p, e in ranked if e.feasible]


def block_descent(state: SearchState, cv: CompactVariant, ts: list[Template], budget: Budget) -> list[Choice]:
    """Every template's plan after coordinate descent on its blocks, the templates in lockstep."""
    return _descend(state, cv, _options(cv, ts), budget)


def _descend(state: SearchState, cv: CompactVariant, options: list[list[list[int]]], budget: Budget) -> list[Choice]:
    plans = [tuple(opts[v][0] for v in range(len(cv.dirs))) for opts in options]
    variant = cv.variant
    state.evaluate(variant, affordable(state, variant, plans, budget))
    for _ in range(MAX_PASSES):
        improved = False
        for v in range(len(cv.dirs)):
            if budget.exhausted(state.evaluator):
                return plans
            moves = [[p[:v] + (c,) + p[v + 1:] for c in opts[v]] for p, opts in zip(plans, options)]
            batch = affordable(state, variant, [m for ms in moves for m in ms], budget)
            evals = state.evaluate(variant, batch)
            at = 0
            for k, ms in enumerate(moves):
                ms, es = batch[at:at + len(ms)], evals[at:at + len(ms)]
                at += len(ms)
                best = _better(state, state.evaluator.evaluate_one(variant, plans[k]), ms, es)
                if best is not None:
                    plans[k], improved = best, True
        if not improved:
            break
    return plans


def _options(cv: CompactVariant, ts: list[Template]) -> list[list[list[int]]]:
    """Per template and vertex, the candidates on its blocks."""
    return [[[i for i, m in enumerate(d.masks) if m in t.blocks[v]] for v, d in enumerate(cv.dirs)] for t in ts]


def _better(state: SearchState, current: Evaluation, moves: list[Choice], evals: list[Evaluation]) -> Optional[Choice]:
    """The move with the highest search objective, on equal objectives the lowest memory peak, if it beats
    `current` so: a template whose fastest strategies overflow memory descends towards plans that fit."""
    def key(e: Evaluation) -> tuple[float, float]:
        return state.value(e), -e.r_peak

    best_key, best = key(current), None
    for m, e in zip(moves, evals):
        if key(e) > best_key:
            best_key, best = key(e), m
    return best
