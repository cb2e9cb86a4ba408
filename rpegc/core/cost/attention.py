"""The attention kernel's time on a CPU worker, per row and query head: the `[attention]` table of a CPU profile.

The roofline prices attention by its FLOPs (core/cost/work.py), which on a CPU worker is 10-100x short at the lengths
RL's small models run: torch's CPU attention (`scaled_dot_product_attention`, flash or math alike) costs ~0.3-5 us per
row and head of one call at 1-32 positions of head size 16, where its FLOPs take 0.01-0.3 us, and that time moves
irregularly with the length (on the 2-core VM of 2026-12-07, 4.0 us at 15 positions and 1.0 at 16: the kernels'
vector tails; docs/calibration.md, "The attention kernel's time"). So a CPU profile measures it per length
(tools/calibrate.py, `_attention_campaign`) and the cost model adds it beside the roofline, as it adds RoPE's
rotations: per layer, row and query head of a forward call (`layer_attention`), a decode step's one query over its
keys (`decode_attention`), and a training step's backward.

A table holds one head size; a model of another head size, or a call longer than the table, is priced by its FLOPs
alone, as before (GPU profiles have no table: the spec's model). The table's times include the attention's FLOPs,
which the roofline also prices: at most ~14 % of an entry at 32 positions of head size 16, a few % below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rpegc.core.ir.program import Arch

MAX_ENTRY_S = 1e-3  # an entry's bound (s per row and head of one call): 100x the longest measured


@dataclass(frozen=True)
class AttentionTable:
    """[attention]: seconds per row and query head of one layer's attention call, as the backend calls it (a boolean
    causal mask, no left padding), at head size `head_dim`; entry i is i + 1 positions.

    `forward[i]`: a forward over i + 1 queries and keys (a prefill, an inference or a training forward);
    `backward[i]`: the backward of the same call alone; `decode[i]`: one query over i + 1 keys (a decode step)."""

    head_dim: int
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    decode: tuple[float, ...]

    def applies(self, arch: Arch) -> bool:
        return arch.head_dim == self.head_dim

    @staticmethod
    def entry(values: tuple[float, ...], positions: int) -> float:
        """`values` at `positions` (1-based), 0 beyond the table."""
        return values[positions - 1] if 1 <= positions <= len(values) else 0.0

    def decode_sum(self, first: int, last: int) -> float:
        """The decode entries of `first`..`last` keys (inclusive; 0 beyond the table)."""
        return float(sum(self.entry(self.decode, kv) for kv in range(first, last + 1)))


def heads_local(arch: Arch, tp):
    """Query heads of one tensor-parallel shard."""
    return arch.heads / tp


def layer_attention(table: AttentionTable | None, arch: Arch, layers, tp, rows, positions: int,
                    backward: bool = False):
    """Seconds of the attention calls of `layers` layers over `rows` rows of `positions` positions each on one
    device (its tensor-parallel share of the heads): the forward's, or the backward's; 0 without a table that
    applies."""
    if table is None or not table.applies(arch):
        return 0.0 * np.asarray(rows)
    per = table.entry(table.backward if backward else table.forward, int(positions))
    return layers * rows * heads_local(arch, tp) * per


def decode_attention(table: AttentionTable | None, arch: Arch, layers, tp, rows, Lp: int, Lr: int):
    """Seconds of a generation's decode steps' attention on one device: each of `rows` rows feeds its response's
    first Lr - 1 tokens back, one query over Lp + 1 .. Lp + Lr - 1 keys; 0 without a table that applies."""
    if table is None or not table.applies(arch):
        return 0.0 * np.asarray(rows)
    return layers * rows * heads_local(arch, tp) * table.decode_sum(int(Lp) + 1, int(Lp) + int(Lr) - 1)
