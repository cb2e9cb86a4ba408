"""The controller's commands to a worker: one frozen dataclass per command type, the only declaration of what each
carries. messages.COMMANDS derives the control channel's schema from them (a field without a default is required,
one with a default optional), the controller constructs them (controller/routing.py, dispatch.py, pool.py,
checkpoints/exports.py) and the worker's parts read their attributes (worker/process.py runs each by `type`).

On the wire a command is the plain dict {"type": TYPE, FIELD: value, ...} (`to_message`), checked against
COMMANDS by name and rebuilt by `from_message`; the values inside it (layouts, moves, a fusion's members, an
operator's prep steps) travel as messages.py's tagged dataclasses. A node's command is one object for all its
ranks (routing builds it with its `ranks`); what differs per rank (a transfer's `sender`, the copies a rank frees
first, `release`) is set with dataclasses.replace, never in place.

No torch here: the controller's light paths import the channel.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Sequence, Union

if TYPE_CHECKING:
    from rpegc.core.ir.training import Training
    from rpegc.runtime.backends.torch.parallel.layout import Layout, RowMove, WeightMove


@dataclass(frozen=True, kw_only=True)
class Command:
    """A command to one rank; `type` names it on the wire and in the worker's table of what runs it."""

    type: ClassVar[str]


@dataclass(frozen=True, kw_only=True)
class Stop(Command):
    """End the worker's loop once the commands before it ran (it says bye)."""

    type: ClassVar[str] = "stop"


@dataclass(frozen=True, kw_only=True)
class Install(Command):
    """Hold version `version` of `model` as the weights copy `label`, this rank's pieces of `layout`."""

    type: ClassVar[str] = "install"
    label: str
    model: str
    version: int
    layout: Layout
    keep: bool = False  # a resumed version the next checkpoint saves again (tau > 0): keep its float32 values too
    tau: int = 0  # the model's staleness bound, how long a kept version is kept


@dataclass(frozen=True, kw_only=True)
class Release(Command):
    """Free copies; sent alone when no node's command of the rank comes to carry them (NodeCommand.release)."""

    type: ClassVar[str] = "release"
    labels: list[str]  # every copy the controller freed on this rank since its last command


@dataclass(frozen=True, kw_only=True)
class Keep(Command):
    """Keep the float32 values of the trained copy `label` for a later checkpoint (staleness: tau > 0)."""

    type: ClassVar[str] = "keep"
    label: str
    tau: int  # the model's staleness bound


@dataclass(frozen=True, kw_only=True)
class Export(Command):
    """Write this rank's shards as one safetensors file into `dir` and report it (worker/shard_writer.py)."""

    type: ClassVar[str] = "export"
    export: int  # the export's number, which the report names
    dir: str  # the checkpoint's or final weights' directory
    part: str = ""  # names the file beside the rank (a checkpoint's model)
    weights: Sequence[list[str]] = ()  # [label, key prefix]: held copies, in the serving dtype
    masters: Sequence[list[Any]] = ()  # [model, layout, version, key prefix]: a training state's float32 masters
    window: Sequence[list[Any]] = ()  # [model, version, key prefix]: kept float32 versions (staleness)
    optimizer: Sequence[list[Any]] = ()  # [model, layout]: a training state's Adam moments and step
    rng: bool = False  # the rank's torch random state too


@dataclass(frozen=True, kw_only=True)
class NodeCommand(Command):
    """A command that runs a node of the plan on this rank (and reports it done)."""

    node: str  # the node's id
    tag: int  # the first collective tag of its point-to-point messages (prep steps count on from it)
    ranks: list[int]  # every rank the node's command goes to, sorted
    release: Sequence[str] = ()  # copies freed on this rank since its last command, freed before this one runs


@dataclass(frozen=True, kw_only=True)
class PrepRows:
    """An operator's prep step: move rows of its input `label` to the replicas that read them (kept under it)."""

    kind: ClassVar[str] = "rows"
    label: str
    fields: list[str]  # the container's fields
    moves: list[RowMove]


@dataclass(frozen=True, kw_only=True)
class PrepWeights:
    """An operator's prep step: re-lay out its weights copy `label` into the operator's `layout` (the plan left no
    Reshard); the copy keeps its label."""

    kind: ClassVar[str] = "weights"
    label: str
    model: str
    layout: Layout
    moves: list[WeightMove]


Prep = Union[PrepRows, PrepWeights]


@dataclass(frozen=True, kw_only=True)
class Op(NodeCommand):
    """Run an Op node (a vertex) on this rank's rows, in the node's layout (worker/operators.py)."""

    type: ClassVar[str] = "op"
    step: int
    role: str  # generation, inference, training or verify
    model: str
    layout: Layout  # the node's workers' layout
    mb: int  # micro-batches
    rows: dict[int, tuple[int, int]]  # rank -> the rows [lo, hi) it runs
    weights: Optional[str]  # the weights copy it reads (None: a verifier)
    inputs: list[str]  # the data copies it reads
    outputs: dict[str, list[str]]  # data copy it writes -> its fields
    fields: list[str]  # every field it writes
    prep: list[Prep]  # moves into its layout first, in order
    output: Optional[str]  # the weights copy a training node publishes
    version_out: Optional[int]  # that copy's version
    train: Optional[Training] = None  # how a training node trains (precision, ZeRO, recomputation, schedule)
    take: bool = False  # a training node may take its weights copy over as its working copy (no later reader)
    pool: Optional[int] = None  # a verifier's pool size


@dataclass(frozen=True, kw_only=True)
class Fused(NodeCommand):
    """Run a fusion's members as one operator (Operators.fused): their op commands, and per pipeline stage the
    fusion's microtasks ("F1.2") in order."""

    type: ClassVar[str] = "fused"
    members: list[Op]
    stages: list[list[str]]


@dataclass(frozen=True, kw_only=True)
class Transfer(NodeCommand):
    """A Comm or Reshard node's command: on a rank outside the transfer's destination it only sends."""

    sender: bool = False  # the rank only sends (its sender thread runs the command: worker/sender.py)


@dataclass(frozen=True, kw_only=True)
class CommData(Transfer):
    """A data Comm: move the rows of `sources` to the ranks that read them, as `target` there."""

    type: ClassVar[str] = "comm_data"
    moves: list[RowMove]
    sources: list[str]
    target: str
    fields: list[str]


@dataclass(frozen=True, kw_only=True)
class MoveWeights(Transfer):
    """A weights Comm (to another allocation) or a Reshard (same copy, another layout): `source`'s pieces into
    `layout`, held as `target`."""

    type: ClassVar[str] = "move_weights"
    model: str
    version: int
    source: str
    target: str
    layout: Layout
    moves: list[WeightMove]
    src_ranks: tuple[int, ...]  # the ranks of the source's layout (a Reshard frees the old pieces there)


COMMAND_CLASSES: tuple[type[Command], ...] = (Stop, Install, Release, Op, Fused, CommData, MoveWeights, Export,
                                              Keep)
BY_TYPE: dict[str, type[Command]] = {c.type: c for c in COMMAND_CLASSES}
NESTED = (Op, PrepRows, PrepWeights)  # travel inside a command (messages.classes)


def required_optional(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fields of command class `cls` without a default and with one, each in declaration order."""
    fs = fields(cls)
    has_default = {f.name: f.default is not MISSING or f.default_factory is not MISSING for f in fs}
    return (tuple(f.name for f in fs if not has_default[f.name]), tuple(f.name for f in fs if has_default[f.name]))


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def to_message(cmd: Command) -> dict:
    """`cmd` as the channel's message: its type and every field."""
    return {"type": cmd.type, **{n: getattr(cmd, n) for n in _names(type(cmd))}}


def from_message(msg: dict) -> Command:
    """The command a message that passed messages.check_schema carries (the constructor raises TypeError if not)."""
    return BY_TYPE[msg["type"]](**{k: v for k, v in msg.items() if k != "type"})
