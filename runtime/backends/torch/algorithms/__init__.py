"""PPO, GRPO and DPO as named algorithms of the torch backend (issue 15, item 6).

Paper Sec. II: an RL post-training algorithm is a graph of generation, inference and training vertices; what
each vertex computes depends on the algorithm. Each module here holds one `Algorithm` (base.py): the fields its
vertices write into each data container (by role, model kind and element type; for DPO also by which side of
the preference pairs a vertex reads), the fields its training vertices must read, its checks of a run, its
training losses and metrics, and its step of the single-process reference oracle. The math lives in rl.py
(PPO and GRPO: advantages and clipped losses) and dpo.py (the DPO loss); the worker and the reference call it
through these objects.
"""

from __future__ import annotations

from rpegc.runtime.backends.torch.algorithms.base import Algorithm
from rpegc.runtime.backends.torch.algorithms.dpo import DPO
from rpegc.runtime.backends.torch.algorithms.grpo import GRPO
from rpegc.runtime.backends.torch.algorithms.ppo import PPO

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (PPO(), GRPO(), DPO())}


def algorithm(name: str) -> Algorithm:
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "algorithm"]
