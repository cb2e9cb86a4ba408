"""The algorithms of the torch backend, registered by name as verl registers its estimators and losses.

Paper Sec. II: an RL post-training algorithm is a graph of generation, inference and training vertices; what
each vertex computes depends on the algorithm. Each is one `Algorithm` (base.py): the fields its vertices write
into each data container, the fields its training vertices must read, its RL settings and checks, what its
inference and training vertices compute in a worker, and its single-process reference oracle. The families are
rollout.py's (PPO, ppo.py; GRPO and its variants, grpo.py) and dpo.py's; the math is rl/step.py's and dpo.py's. Workers,
the reference and the backend call the registered object, never a branch on a name.

A plugin (a module of the entry-point group `rpegc.rl`, core/ir/algorithms.py) registers an algorithm of its own
with `register_algorithm`, e.g. `register_algorithm(GRPO("my_grpo", dict(adv_estimator="my_estimator")))`; a
graph then names it (`rpeg.algorithm my_grpo`).
"""

from __future__ import annotations

from rpegc.core.ir.algorithms import declare_algorithm, registered
from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.rl.algorithms.base import Algorithm
from rpegc.runtime.backends.torch.rl.algorithms.dpo import DPO
from rpegc.runtime.backends.torch.rl.algorithms.grpo import GRPO, VARIANTS
from rpegc.runtime.backends.torch.rl.algorithms.ppo import PPO
from rpegc.runtime.backends.torch.rl.step import RLConfig

# The registry (process-wide, as the estimators' and losses' are): name -> algorithm
ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(alg: Algorithm) -> Algorithm:
    """Register `alg` under its name (a graph may then name it); returns it."""
    if not alg.family:
        raise RpegError(None, f"algorithm '{alg.name}' has no family: subclass PPO, GRPO or DPO")
    declare_algorithm(alg.name, alg.family)
    ALGORITHMS[alg.name] = alg
    return alg


for _alg in (PPO(), GRPO(), DPO(), *VARIANTS):
    register_algorithm(_alg)


def algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name` (the plugins imported first if it is not)."""
    if not registered(ALGORITHMS, name):
        raise RpegError(None, f"unknown RL algorithm '{name}'; use one of {', '.join(ALGORITHMS)} (or one a plugin "
                              "of the entry-point group rpegc.rl registers)")
    return ALGORITHMS[name]


def default_rl_config(name: str, **overrides) -> RLConfig:
    """Algorithm `name`'s settings (its family's defaults, then its paper's), then `overrides`; checked."""
    return algorithm(name).rl_config(**overrides)


__all__ = ["ALGORITHMS", "Algorithm", "GRPO", "PPO", "DPO", "algorithm", "default_rl_config", "register_algorithm"]
