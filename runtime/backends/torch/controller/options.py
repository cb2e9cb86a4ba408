"""rpeg-run's options of the torch backend, as the backend registry hands them to `TorchBackend`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


LR_MAX = 1.0  # the largest learning rate (--lr, lr_actor, lr_critic; rl/hyperparameters.py says why)


@dataclass(frozen=True)
class TorchOptions:
    """rpeg-run's options of the torch backend (see `_add_options` for what each means)."""

    seed: int = 0
    run_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None
    keep_checkpoints: Optional[int] = None
    resume: Optional[str] = None
    overwrite: bool = False
    tp_impl: str = "auto"
    dist_backend: str = "auto"
    store: Optional[str] = None
    secret_file: Optional[str] = None
    no_memory_check: bool = False
    lr: Optional[float] = None
    rl_config: Optional[str] = None
    rl: Optional[list] = None
    reward: Optional[str] = None
    data: Optional[str] = None
    task: str = "pattern"
    log: Optional[str] = None  # --log: comma-separated experiment trackers (runtime/trackers.py); None: the default
