"""Where every shard lives under a layout, and how shards move between layouts (paper Sec. VII, App. A-G
stages 2-4: Comm and Reshard nodes; spec Sec. 1.4: nested placement, TP innermost, then PP, then DP).

Pure Python, no torch: the backend computes every route here and ships it to the workers.

Weights. A `Layout` is an allocation's worker ranks (in flat device order) with (dp, pp, tp). The rank at
position i has coordinates d = i // (pp*tp), p = (i // tp) % pp, t = i % tp. Pipeline stage p holds the
blocks `stage_bounds(layers, pp)[p]`, stage 0 also the embeddings, the last stage the final norm and the
heads. Megatron-style tensor parallelism shards the column-parallel projections (wq, wk, wv, w_gate, w_up)
along their output dimension (dim 0 of the weight) and the row-parallel ones (wo, w_down) along their
input dimension (dim 1); everything else is replicated over TP. `route_weights` lists, for every rank of
the target layout and every parameter piece it needs, one source rank that holds it (preferring the rank
itself, so co-located layouts copy locally and move nothing over the network).

Data. A data container is a batch of sequences; an artifact covers global sequence rows [lo, hi) of one RL
step. An invocation with layout (dp, pp, tp) gives data-parallel replica d the d-th contiguous chunk of its
rows (whole groups of `group` rows, so GRPO's prompt groups stay together) and every rank of a replica
holds its replica's rows. `route_rows` lists the row ranges to send so each rank gets the rows it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from rpegc.core.ir.errors import RpegError

COLUMN_PARALLEL = ("attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "mlp.w_gate.weight", "mlp.w_up.weight",
                   "attn.wq.bias", "attn.wk.bias", "attn.wv.bias")
ROW_PARALLEL = ("attn.wo.weight", "mlp.w_down.weight")
FIRST_STAGE = ("embed.", "pos_embed.")

Rows = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """An allocation's worker ranks (flat device order) and its parallel layout Pi = (dp, pp, tp)."""

    ranks: tuple[int, ...]
    dp: int
    pp: int
    tp: int

    def __post_init__(self) -> None:
        if self.dp * self.pp * self.tp != len(self.ranks) or min(self.dp, self.pp, self.tp) < 1:
            raise RpegError(None, f"layout dp = {self.dp}, pp = {self.pp}, tp = {self.tp} does not cover its "
                            f"{len(self.ranks)} device(s); the plan must satisfy |sigma| = dp * pp * tp")

    def coord(self, rank: int) -> tuple[int, int, int]:
        """(d, p, t) of `rank`: TP innermost, then PP, then DP."""
        i = self.ranks.index(rank)
        d, rest = divmod(i, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        return d, p, t

    def rank_at(self, d: int, p: int, t: int) -> int:
        return self.ranks[(d * self.pp + p) * self.tp + t]

    def replica(self, d: int) -> tuple[int, ...]:
        """All pp * tp ranks of data-parallel replica d (its model-parallel group)."""
        n = self.pp * self.tp
        return self.ranks[d * n:(d + 1) * n]

    def tp_group(self, d: int, p: int) -> tuple[int, ...]:
        return tuple(self.rank_at(d, p, t) for t in range(self.tp))

    def pp_group(self, d: int, t: int) -> tuple[int, ...]:
        return tuple(self.rank_at(d, p, t) for p in range(self.pp))

    def dp_group(self, p: int, t: int) -> tuple[int, ...]:
        return tuple(self.rank_at(d, p, t) for d in range(self.dp))

    def groups(self) -> set[tuple[int, ...]]:
        """Every TP, PP, DP and replica group with more than one rank (the process groups to create)."""
        out: set[tuple[int, ...]] = set()
        for d in range(self.dp):
            out.add(self.replica(d))
            for p in range(self.pp):
                out.add(self.tp_group(d, p))
            for t in range(self.tp):
                out.add(self.pp_group(d, t))
        for p in range(self.pp):
            for t in range(self.tp):
                out.add(self.dp_group(p, t))
        return {g for g in out if len(g) > 1}

    def short(self) -> str:
        return f"(dp={self.dp}, pp={self.pp}, tp={self.tp}) on workers {list(self.ranks)}"


# ---------------------------------------------------------------------------------------------------
# Weights


def stage_bounds(layers: int, pp: int) -> list[tuple[int, int]]:
    """[first, last) blocks of each pipeline stage; the first `layers % pp` stages get one block more."""
    if pp > layers:
        raise RpegError(None, f"pp = {pp} pipeline stages need at least {pp} blocks, the model has {layers}; "
                        f"use pp <= {layers}")
    base, extra = divmod(layers, pp)
    out, first = [], 0
    for p in range(pp):
        last = first + base + (1 if p < extra else 0)
        out.append((first, last))
        first = last
    return out


def shard_dim(name: str) -> Optional[int]:
    """The dimension tensor parallelism splits parameter `name` along; None: replicated over TP."""
    if name.endswith(COLUMN_PARALLEL):
        return 0
    if name.endswith(ROW_PARALLEL):
        return 1
    return None


def param_stage(name: str, bounds: list[tuple[int, int]]) -> int:
    """The pipeline stage that holds parameter `name`."""
    if name.startswith("layers."):
        block = int(name.split(".")[1])
        for p, (first, last) in enumerate(bounds):
            if first <= block < last:
                return p
        raise RpegError(None, f"parameter {name} belongs to no pipeline stage of {bounds}")
    if name.startswith(FIRST_STAGE):
        return 0
    return len(bounds) - 1


@dataclass(frozen=True)
class Piece:
    """A slice [lo, hi) of parameter `name` along `dim`; dim None: the whole tensor."""

    name: str
    dim: Optional[int]
    lo: int
    hi: int


def param_piece(name: str, shape: tuple[int, ...], tp: int, t: int) -> Piece:
    dim = shard_dim(name) if tp > 1 else None
    if dim is None:
        return Piece(name, None, 0, shape[0] if shape else 1)
    size = shape[dim]
    if size % tp:
        raise RpegError(None, f"parameter {name} has {size} rows along dim {dim}, not divisible by tp = {tp}; "
                        "choose tp dividing heads, kv_heads and ffn")
    part = size // tp
    return Piece(name, dim, t * part, (t + 1) * part)


def rank_pieces(shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int, layers: int) -> dict[str, Piece]:
    """Every parameter piece `rank` holds under `layout`."""
    _, p, t = layout.coord(rank)
    bounds = stage_bounds(layers, layout.pp)
    return {n: param_piece(n, s, layout.tp, t) for n, s in shapes.items() if param_stage(n, bounds) == p}


def replica_owner(shapes: dict[str, tuple[int, ...]], layout: Layout, rank: int, layers: int) -> dict[str, int]:
    """Which data-parallel replica owns each parameter piece `rank` holds (every replica at the same stage and TP
    rank holds the same pieces, so all compute the same answer): largest first, each to the replica with the
    fewest elements so far. The owner keeps its pieces' optimizer state (ZeRO over the DP group) and writes them
    to checkpoints, so the replicas hold and write about equal shares."""
    pieces = rank_pieces(shapes, layout, rank, layers)
    size = {n: math.prod(shapes[n]) if piece.dim is None else
            math.prod(shapes[n]) // shapes[n][piece.dim] * (piece.hi - piece.lo) for n, piece in pieces.items()}
    load = [0] * layout.dp
    owner: dict[str, int] = {}
    for name in sorted(size, key=lambda n: (-size[n], n)):
        d = min(range(layout.dp), key=lambda i: (load[i], i))
        owner[name] = d
        load[d] += size[name]
    return owner


def check_tp(heads: int, kv_heads: int, ffn: int, tp: int) -> Optional[str]:
    """Why tensor parallelism of degree `tp` cannot shard this architecture, or None."""
    bad = [f"{what} = {n}" for what, n in (("heads", heads), ("kv_heads", kv_heads), ("ffn", ffn)) if n % tp]
    return None if not bad else f"tp = {tp} must divide {', '.join(bad)}"


@dataclass(frozen=True)
class WeightMove:
    """Send piece [lo, hi) along `dim` of parameter `name` from `src` to `dst` (global indices)."""

    src: int
    dst: int
    name: str
    dim: Optional[int]
    lo: int
    hi: int


def _overlap(a: Piece, b: Piece) -> Optional[tuple[int, int]]:
    if a.dim is None and b.dim is None:
        return (a.lo, a.hi)
    if a.dim is None:
        return (b.lo, b.hi)
    if b.dim is None:
        return (a.lo, a.hi)
    lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
    return (lo, hi) if lo < hi else None


def route_weights(shapes: dict[str, tuple[int, ...]], layers: int, src: Layout, dst: Layout) -> list[WeightMove]:
    """Moves that give every rank of `dst` its pieces from ranks of `src` (a Comm or a Reshard).

    Each needed piece comes from exactly one sender: the rank itself when it holds it (a local copy),
    otherwise a holder chosen by the target replica, so replicas read from different sources.
    """
    src_bounds = stage_bounds(layers, src.pp)
    moves: list[WeightMove] = []
    for rank in dst.ranks:
        d, _, _ = dst.coord(rank)
        for name, need in rank_pieces(shapes, dst, rank, layers).items():
            ps = param_stage(name, src_bounds)
            if src.tp == 1 or shard_dim(name) is None:  # every source rank of stage ps holds all of it
                holders = [src.rank_at(ds, ps, ts) for ds in range(src.dp) for ts in range(src.tp)]
                sender = rank if rank in holders else holders[d % len(holders)]
                moves.append(WeightMove(sender, rank, name, need.dim, need.lo, need.hi))
                continue
            for ts in range(src.tp):
                ov = _overlap(need, param_piece(name, shapes[name], src.tp, ts))
                if ov is None:
                    continue
                holders = [src.rank_at(ds, ps, ts) for ds in range(src.dp)]
                sender = rank if rank in holders else holders[d % src.dp]
                moves.append(WeightMove(sender, rank, name, shard_dim(name), ov[0], ov[1]))
    return moves


def piece_elements(shape: tuple[int, ...], dim: Optional[int], lo: int, hi: int) -> int:
    n = 1
    for i, s in enumerate(shape):
        n *= (hi - lo) if i == dim else s
    return n


# ---------------------------------------------------------------------------------------------------
# Data rows


def split_rows(lo: int, hi: int, parts: int, group: int = 1) -> list[Rows]:
    """[lo, hi) in `parts` contiguous chunks of whole groups of `group` rows, as even as possible."""
    n = hi - lo
    if n % group:
        raise RpegError(None, f"{n} rows do not form whole groups of {group}; shard along prompts")
    groups = n // group
    base, extra = divmod(groups, parts)
    out, start = [], lo
    for i in range(parts):
        size = (base + (1 if i < extra else 0)) * group
        out.append((start, start + size))
        start += size
    return out


def replica_rows(layout: Layout, lo: int, hi: int, group: int = 1) -> dict[int, Rows]:
    """Rows [lo, hi) of an invocation: every rank of replica d gets the d-th chunk."""
    chunks = split_rows(lo, hi, layout.dp, group)
    return {r: chunks[layout.coord(r)[0]] for r in layout.ranks}


def intersect(a: Rows, b: Rows) -> Optional[Rows]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def subtract(need: Rows, have: Iterable[Rows]) -> list[Rows]:
    """The parts of `need` no range in `have` covers."""
    out, cur = [], need[0]
    for lo, hi in sorted(have):
        if hi <= cur or lo >= need[1]:
            continue
        if lo > cur:
            out.append((cur, min(lo, need[1])))
        cur = max(cur, hi)
        if cur >= need[1]:
            break
    if cur < need[1]:
        out.append((cur, need[1]))
    return out


@dataclass(frozen=True)
class RowMove:
    """Send rows [lo, hi) of a data artifact from `src` to `dst`."""

    src: int
    dst: int
    lo: int
    hi: int


def route_rows(held: dict[int, list[Rows]], need: dict[int, Rows],
               have: Optional[dict[int, list[Rows]]] = None) -> list[RowMove]:
    """Moves that give every rank in `need` the rows it lacks, each from one rank in `held` that has them.

    `have` is what each destination already holds of the target artifact (default `held`: the target is
    the source artifact itself, as when an invocation spreads its input over its replicas; a Comm's
    target is a new artifact, so it passes {}). A destination that holds rows in `held` copies them
    locally (a move with src == dst); other senders rotate with the destination so several destinations
    do not all read from one rank.
    """
    have = held if have is None else have
    moves: list[RowMove] = []
    holders = sorted(held)
    for k, (dst, rows) in enumerate(sorted(need.items())):
        rot = k % len(holders) if holders else 0
        order = ([dst] if dst in held else []) + [h for h in holders[rot:] + holders[:rot] if h != dst]
        for gap in subtract(rows, have.get(dst, [])):
            start = gap[0]
            while start < gap[1]:
                best: Optional[tuple[int, int]] = None  # (sender, end)
                for src in order:
                    for lo, hi in held[src]:
                        if lo <= start < hi and (best is None or min(hi, gap[1]) > best[1]):
                            best = (src, min(hi, gap[1]))
                if best is None:
                    raise RpegError(None, f"rows [{start}, {gap[1]}) are held by no worker; a data artifact is "
                                    "incomplete (a producer did not write all rows)")
                moves.append(RowMove(best[0], dst, start, best[1]))
                start = best[1]
    return moves
