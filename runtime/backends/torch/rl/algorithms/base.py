"""What every algorithm is (algorithms/__init__.py): its declarations, its RL settings and checks, and its vertices'
computations in a worker and in the single-process reference."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Protocol

import torch
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import VERIFY, Container, Program, Vertex, Workload
from rpegc.runtime.backends.torch.channel.commands import Op
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel
from rpegc.runtime.backends.torch.rl.step import RLConfig, check_rl_config

# `cfg` below is the run (run_config.RunConfig), which names its algorithm: that module imports this one.


class Worker(Protocol):
    """What an algorithm's vertices use of the worker process that runs them (worker/operators.py `Operators`)."""

    run: Any  # the RunConfig
    setup: Any  # the WorkerSetup: the models by name
    device: torch.device

    def loaded_state(self, cmd: Op) -> tuple[Any, Any]:
        """The training state holding the version the command trains, and that version's entry."""

    def rows_of(self, labels: list[str], lo: int, hi: int, fields: list[str]) -> dict[str, Tensor]:
        """Fields of rows lo..hi-1 of the step from the data entries `labels`."""

    def row_pads(self, step: int, lo: int, hi: int) -> Optional[Tensor]:
        """The left padding of sequences lo..hi-1 of the step."""

    def step_pairs(self, step: int) -> Any:
        """DPO: the step's preference pairs."""

    def pair_rows(self, step: int, side: str, lo: int, hi: int) -> tuple[dict[str, Tensor], Optional[Tensor]]:
        """DPO: the sequences and mask of pairs lo..hi-1 on `side`, and their pads."""

    def forward_field(self, cmd: Op, pm: ParallelModel, data: dict[str, Tensor], f: str, lo: int, hi: int,
                      pads: Optional[Tensor], temperature: Optional[float] = None) -> Tensor:
        """A teacher-forced field (log-probs, values, scores) of the rows."""

    def verifier_scores(self, cmd: Op, pm: ParallelModel, data: dict[str, Tensor], lo: int, hi: int,
                        report: dict) -> Tensor:
        """The toy rule's or the reward function's scores of the rows."""

    def dp_sum(self, pm: ParallelModel) -> Callable[[Tensor], Tensor]:
        """A sum over the data-parallel replicas of `pm`."""

    def publish(self, cmd: Op, st: Any) -> int:
        """The trained version, published; its number."""


def training_report(model: str, version_in: int, version_out: int, pm: ParallelModel, metrics: dict) -> dict:
    """What a training vertex reports: the versions it read and wrote, and the step's metrics from one rank (the last
    pipeline stage's first tensor- and data-parallel rank; the others report none)."""
    return {"bytes": 0, "versions_in": {model: version_in}, "versions_out": {model: version_out},
            "metrics": metrics if pm.is_last and pm.t == 0 and pm.d == 0 else None}


class Algorithm:
    """One registered algorithm. A subclass is a family's computation (rollout.py: PPO and GRPO; dpo.py); an
    instance is one algorithm of it, with the settings its paper gives over the family's defaults."""

    name = ""
    family = ""  # the graph shape it has (core/ir/algorithms.py): ppo, grpo or dpo
    paper = ""  # where its settings come from
    settings: dict = {}  # RLConfig fields over the family's defaults (`rl_config`)
    generates = True  # samples rollouts (PPO, GRPO); DPO trains on given pairs
    # Statistics the training step reports (a metric each, besides the grad norm), per trained model kind
    stat_keys: dict[str, tuple[str, ...]] = {}

    def __init__(self, name: Optional[str] = None, settings: Optional[dict] = None, paper: str = ""):
        if name is not None:
            self.name, self.settings, self.paper = name, dict(settings or {}), paper

    # -- settings and checks -------------------------------------------------------------------------------

    def base_rl(self) -> RLConfig:
        """The family's defaults (App. B's where it gives them)."""
        return RLConfig(algorithm=self.family)

    def rl_config(self, **overrides) -> RLConfig:
        """The family's defaults, then this algorithm's settings, then `overrides` (--rl, --rl-config); checked."""
        cfg = replace(self.base_rl(), **{**self.settings, **overrides})
        check_rl_config(cfg)
        self.check_rl(cfg)
        return cfg

    def check_rl(self, cfg: RLConfig) -> None:
        """The errors of settings this algorithm defines (RpegError)."""

    def check(self, cfg) -> None:
        """The errors of a run this algorithm defines (RpegError)."""

    def step_rows(self, w: Workload) -> int:
        """The rows a training step trains on: sequences (pairs for DPO)."""
        return w.B * w.R

    def row_noun(self) -> str:
        return "sequences"

    def training_group(self, w: Workload) -> int:
        """Rows a training replica must hold together (1: any split)."""
        return 1

    # -- declarations --------------------------------------------------------------------------------------

    def container_fields(self, program: Program, vertex: Vertex, container: Container) -> Optional[tuple[str, ...]]:
        """The fields `vertex` writes into `container` (None: it cannot write it)."""
        raise NotImplementedError

    def training_fields(self, has_critic: bool, has_reference: bool = True) -> tuple[str, ...]:
        """The fields a training vertex must read, with a critic and with a reference inference vertex or not."""
        raise NotImplementedError

    def what_writes(self) -> str:
        raise NotImplementedError

    def vertex_fields(self, program: Program, cfg) -> dict[str, tuple[str, ...]]:
        """The fields of every data container written by a vertex; checks that every training vertex reads the
        fields its loss needs."""
        assert program.graph is not None
        fields: dict[str, tuple[str, ...]] = {}
        for v in program.graph.vertices:
            kind = f"verifier @{v.model}" if v.role == VERIFY else f"model kind {program.model(v.model).kind}"
            for c in v.writes:
                cont = program.graph.container(c)
                if cont.is_weights:
                    continue
                got = self.container_fields(program, v, cont)
                if got is None:
                    raise RpegError(v.loc, f"the torch backend does not know what the {v.role} vertex @{v.name} "
                                    f"({kind}) writes into %{c} ({cont.elem}) under {self.name.upper()}; "
                                    f"{self.what_writes()}")
                fields[c] = got
        made = {f for fs in fields.values() for f in fs}
        need = set(self.training_fields(cfg.has_critic, cfg.has_reference))
        for v in program.graph.vertices:
            if v.role != "training":
                continue
            missing = sorted(need - {f for c in v.reads if c in fields for f in fields[c]})
            if missing:
                unmade = sorted(need - made)
                hint = (f"no vertex writes {', '.join(unmade)}" if unmade else
                        "let it read the containers that hold them")
                raise RpegError(v.loc, f"training vertex @{v.name} must read {', '.join(missing)}; {hint}")
        return fields

    # -- what its vertices compute ------------------------------------------------------------------------

    def inference(self, worker: Worker, cmd: Op, pm: ParallelModel, lo: int,
                  hi: int) -> tuple[dict[str, Tensor], dict]:
        """An inference vertex's fields of rows lo..hi-1 on `worker`, and what its reward function reported."""
        raise NotImplementedError

    def train(self, worker: Worker, cmd: Op, lo: int, hi: int) -> dict:
        """A training vertex on rows lo..hi-1 of `worker`: its report (versions, metrics from one rank)."""
        raise NotImplementedError

    def reference_trainer(self, cfg, seed: int):
        """The single-process oracle: `step(k)` runs step k on the whole batch, `weights()` the trained masters."""
        raise NotImplementedError
