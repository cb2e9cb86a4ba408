"""How a training operator trains: precision, ZeRO stage, activation recomputation and pipeline schedule.

One declaration read by both sides of the plan's contract (issue 32, item 1): the cost model prices these fields
(spec 3.3, 3.4.3, 3.6, 6.1-6.5 with the alternatives below), the optimizer searches the ZeRO stage and the
recomputation as plan choices, and the torch backend executes them. The paper's system (App. B: "All runs use BF16,
FlashAttention-2, activation checkpointing for training, and ZeRO-2 gradient sharding for P_d > 1") is the default.

A program states them at two levels, each field optional: the workload (`rpeg.workload {..., zero = 1}`: every
training operator) and a training vertex's placement (`@train_actor at ... mb = 8 zero = 2 recompute = full`: that
vertex, over the workload). `TrainSpec` is what was written (None: not stated, inherited); `Training` is what a
training operator runs with, every field resolved (`resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.options import option, option_help

PRECISIONS = ("mixed", "fp32")
ZERO_STAGES = (0, 1, 2)
RECOMPUTES = ("none", "interval", "full")
SCHEDULES = ("1f1b", "gpipe")
# The allowed values of each field (the text, JSON and MLIR readers and the error messages use them).
CHOICES: dict[str, tuple] = {"precision": PRECISIONS, "zero": ZERO_STAGES, "recompute": RECOMPUTES,
                             "schedule": SCHEDULES}
# Element bytes of the working copy, its gradients and its activations under each precision (mixed: the workload's).
FP32_BYTES = 4


@dataclass(frozen=True)
class TrainSpec:
    """The training fields a workload or a placement states; None inherits (placement <- workload <- default)."""

    precision: Optional[str] = option(
        None, "mixed: the working weights, gradients and activations in the workload's 16-bit dtype, FP32 master "
              "weights and Adam moments (12 B per parameter); fp32: everything in float32, the weights their own "
              "master (8 B of moments per parameter). Default: mixed for a bf16 or fp16 workload, fp32 for an fp32 one")
    zero: Optional[int] = option(
        None, "ZeRO stage over the data-parallel group: 0 replicated (gradients all-reduced once per step, every "
              "replica steps every parameter); 1 master weights and moments sharded (gradients reduced onto their "
              "owners once per step, the updated weights all-gathered); 2 also the gradients (reduced after every "
              "microbatch's backward pass). Default 2")
    recompute: Optional[str] = option(
        None, "activation recomputation: none (every layer's saved activations kept, 3 forward-equivalents); "
              "interval (the input of every segment of c = floor(sqrt(L/P_p)) layers kept, a segment recomputed "
              "in the backward pass, spec [A11]); full (every layer's input kept, each layer recomputed alone). "
              "Default interval")
    schedule: Optional[str] = option(
        None, "pipeline schedule: 1f1b (at most min(mb, P_p) microbatches' activations live on a stage) or gpipe "
              "(all forwards, then all backwards: mb live). Default 1f1b")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value not in CHOICES[f.name]:
                raise RpegError(None, f"training field {f.name} = {value!r} is not one of "
                                      f"{', '.join(str(c) for c in CHOICES[f.name])}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def items(self) -> list[tuple[str, object]]:
        """The stated fields, in declaration order (what the printers write)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def over(self, base: "TrainSpec") -> "TrainSpec":
        """These fields where stated, else `base`'s."""
        return TrainSpec(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                            else getattr(base, f.name) for f in fields(self)})


NO_TRAIN_SPEC = TrainSpec()
FIELDS = tuple(f.name for f in fields(TrainSpec))


def field_help(name: str) -> str:
    return option_help(next(f for f in fields(TrainSpec) if f.name == name))


@dataclass(frozen=True)
class Training:
    """The resolved training of one operator: every field set (`resolve`)."""

    precision: str
    zero: int
    recompute: str
    schedule: str

    def working_bytes(self, s_b: int) -> int:
        """Bytes of one element of the working weights, their gradients and the training activations."""
        return s_b if self.precision == "mixed" else FP32_BYTES

    @property
    def state_bytes(self) -> int:
        """Persistent bytes per parameter of the optimizer: FP32 masters and two moments (mixed), two moments (fp32:
        the float32 working weights are the masters, held whole by every replica, `persistent_weights`)."""
        return 12 if self.precision == "mixed" else 8

    @property
    def persistent_weights(self) -> bool:
        """Whether the working weights stay between steps as the masters (fp32). In mixed precision the 16-bit working
        copy is the published version the next step trains (the torch backend takes it over): a transient."""
        return self.precision == "fp32"

    @property
    def forward_equivalents(self) -> int:
        """Forward-pass equivalents of one training step: forward + backward (2) [+ recomputation] (spec [A1])."""
        return 3 if self.recompute == "none" else 4

    def shards_state(self, dp) -> object:
        """The data-parallel divisor of the optimizer state (ZeRO 1 and 2)."""
        return dp if self.zero >= 1 else 1

    def shards_grads(self, dp) -> object:
        """The data-parallel divisor of the gradients held (ZeRO 2)."""
        return dp if self.zero >= 2 else 1


def default_precision(dtype: str) -> str:
    return "fp32" if dtype == "fp32" else "mixed"


def resolve(dtype: str, workload_spec: TrainSpec, spec: TrainSpec = NO_TRAIN_SPEC,
            loc: Optional[Loc] = None) -> Training:
    """The training of an operator: its placement's fields over the workload's over the defaults. `dtype` is the
    workload's: mixed precision needs a 16-bit one (a located error otherwise)."""
    s = spec.over(workload_spec)
    precision = s.precision if s.precision is not None else default_precision(dtype)
    if precision == "mixed" and dtype == "fp32":
        raise RpegError(loc, "precision = mixed trains a 16-bit working copy in the workload's dtype, but the "
                             "workload is dtype = fp32; write precision = fp32 or dtype = bf16")
    return Training(precision=precision, zero=2 if s.zero is None else s.zero,
                    recompute=s.recompute or "interval", schedule=s.schedule or "1f1b")
