"""What a worker is told when it starts (the store's setup message, messages.py): the run, the models as the
workers build them, the plan's layouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rpegc.core.ir.program import Arch
from rpegc.runtime.backends.torch.model.hf import model_net
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.model.transformer import NetOptions
from rpegc.runtime.backends.torch.run_config import RunConfig


@dataclass(frozen=True)
class ModelSpec:
    """A model of the program as the workers build it."""

    name: str
    kind: str  # policy | reference | critic | reward | actor_critic
    arch: Arch
    seed: int  # weight-init seed of version 0
    hf: Optional[str] = None  # absolute path of the Hugging Face checkpoint version 0 is read from

    def net(self, base: NetOptions) -> NetOptions:
        """This model's network options: the run's with the MLP of its arch, or its checkpoint's (hf.py)."""
        return model_net(self.arch, self.hf, base)


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs besides its commands; the controller puts it in the store."""

    world: int
    seed: int
    run: RunConfig
    models: dict[str, ModelSpec]
    layouts: tuple[Layout, ...]
    tp_impl: str
    t0: float  # controller wall clock (time.time()) at start; reported times are relative to it
    timeout_s: float
    dist_backend: str = "gloo"
    resume_file: Optional[str] = None  # a checkpoint directory (checkpoints/shard_files.py) to resume from
    # per rank of a locally launched run, the host cores (slots) it is bound to (pinning.core_slots); None: one per
    # worker by its local rank (a launcher's run)
    core_slots: Optional[tuple[tuple[int, ...], ...]] = None
    fault: Optional[str] = None
    # every operator ends with the speed witness (runtime/speed_probe.py), and every share of a verifier pool's: CPU
    # workers of a plan whose profile prices it ([overhead] witness)
    witness: bool = False
