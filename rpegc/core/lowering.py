"""Lowering the unrolled graph G-bar with the plan P into the executable graph G-hat (Alg. 4).

Paper: App. A-G, Def. A.8. The stages are separate passes so each can be printed and tested alone:
split-quantiles (quantiles.py), insert-comm (comm.py), insert-reshard (reshard.py); the decisions
they share live in lowering_rules.py. `lower` runs them in their fixed order.
"""

from __future__ import annotations

from rpegc.core.comm import insert_comm
from rpegc.core.program import Program
from rpegc.core.quantiles import split_quantiles
from rpegc.core.reshard import insert_reshard


def lower(p: Program, split: bool = True) -> Program:
    """split-quantiles (if `split`), insert-comm, insert-reshard on an unrolled program with a plan."""
    return insert_reshard(insert_comm(split_quantiles(p, enabled=split)))
