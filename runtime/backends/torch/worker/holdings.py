"""What a torch worker holds (the states of the memory model, docs/cost-model-spec.md Sec. 6; worker/process.py
describes them): its entries by label (data pieces, weights versions), its serving modules, its training states and
the versions a later checkpoint still saves; and where a version it installs comes from (the resume checkpoint, the
model's checkpoint or its seed). The other parts of the worker (transfers, operators, training states, shard writer)
read and change these through the one `Holdings` they are given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from rpegc.core.ir.training import Training
from rpegc.runtime.backends.torch.channel.commands import Install, Keep, Release
from rpegc.runtime.backends.torch.channel.worker_setup import WorkerSetup
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.model.hf import HFWeights
from rpegc.runtime.backends.torch.model.master_weights import MasterWeights
from rpegc.runtime.backends.torch.model.transformer import check_arch, param_shapes
from rpegc.runtime.backends.torch.parallel.layout import Layout, rank_pieces, replica_owner
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, seeded_shard


class CommandError(Exception):
    """A command that cannot run; the message names what is wrong."""


@dataclass
class Piece:
    lo: int
    hi: int
    fields: dict[str, Tensor]


@dataclass
class Entry:
    """An artifact held by this worker: data pieces, or this rank's shards of a weights version."""

    kind: str
    model: Optional[str] = None
    version: int = 0
    layout: Optional[Layout] = None
    shards: dict[str, Tensor] = field(default_factory=dict)
    pieces: list[Piece] = field(default_factory=list)
    # (shard and piece counts it was counted at, bytes): an entry only ever gains pieces, so its bytes change
    # only when the counts do; summing on every report delayed each node's report by ~0.1 ms
    _counted: tuple[tuple[int, int], int] = field(default=((-1, -1), 0), repr=False, compare=False)

    def nbytes(self) -> int:
        key = (len(self.shards), len(self.pieces))
        if self._counted[0] != key:
            tensors = list(self.shards.values()) + [t for p in self.pieces for t in p.fields.values()]
            self._counted = (key, _bytes_of(tensors))
        return self._counted[1]

    def full_precision(self) -> bool:
        """Whether the shards are float32 (exact master values), not a reduced-precision serving copy."""
        return all(t.dtype == torch.float32 for t in self.shards.values())


@dataclass
class TrainState:
    """A trained model's module in the training dtype (`pm`, at version `pm.loaded`), the float32 master
    weights and Adam state of the parameters this rank steps, and how it trains (`train`: the plan's).

    In mixed precision the module's parameters and the version it publishes are one copy (`TrainStates.publish`:
    the entry `shares`), which the next step takes over when no later node reads that version (`take`), else
    copies; under fp32 the module's float32 parameters are the masters and stay between steps."""

    pm: ParallelModel
    master: MasterWeights
    train: Training
    shares: Optional[str] = None  # the weights entry whose tensors are the module's parameters


def _bytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def kept_copy(shards: dict[str, Tensor]) -> dict[str, Tensor]:
    """A copy in host memory of the pieces of a version kept for later checkpoints (the training goes on updating its
    own; [host] checkpoint_keep_* price it, tools/checkpoint_timing.py times this)."""
    return {n: t.detach().to("cpu", copy=True) for n, t in shards.items()}


class Holdings:
    """Everything one worker holds, and the bookkeeping commands (install, keep, release) that change it."""

    def __init__(self, setup: WorkerSetup, rank: int, device: torch.device):
        self.setup, self.rank, self.device = setup, rank, device
        self.run = setup.run
        self.serving_dtype = setup.run.serving_dtype  # of every `weights` entry and serving module
        self.entries: dict[str, Entry] = {}
        self.serving: dict[tuple[str, Layout], ParallelModel] = {}
        self.training: dict[tuple[str, Layout], TrainState] = {}
        self._model_bytes: tuple[tuple, int] = ((), 0)  # (counts it was computed at, bytes): see nbytes()
        self.nets = {m: s.net(self.run.net) for m, s in setup.models.items()}
        self.shapes = {m: param_shapes(s.arch, s.kind, self.nets[m]) for m, s in setup.models.items()}
        # On resume: the checkpoint's shard files, of which this worker reads only the boxes it needs
        self.resume = ckpt.Reader(setup.resume_file) if setup.resume_file else None
        # Versions a checkpoint must still save once the live copies moved on (staleness tau > 0):
        # (model, version) -> (layout, this rank's float32 pieces), on the CPU
        self.window: dict[tuple[str, int], tuple[Layout, dict[str, Tensor]]] = {}
        # (model, layout) -> this rank's pieces, and the names of those it writes (`pieces`, `writes`)
        self._pieces: dict[tuple[str, Layout], dict] = {}
        self._writes: dict[tuple[str, Layout], frozenset[str]] = {}

    def nbytes(self) -> int:
        """Bytes this worker holds: its entries, its models' parameters and their optimizer state."""
        # Snapshots of the dicts: the sender thread reports too, while the main loop may add to them.
        entries, serving = list(self.entries.values()), list(self.serving.values())
        training = list(self.training.values())
        held = sum(e.nbytes() for e in entries)
        # Models are only ever added and an optimizer's state only fills once (at its first step), so the
        # models' bytes change only when these counts do (summing every parameter took ~0.7 ms per report).
        # A serving module bound to an entry holds the entry's tensors: they are counted with the entry.
        # A training module sharing its published entry's tensors is counted with the entry too.
        key = (len(serving), len(training), sum(len(st.master.optimizer.state) for st in training),
               tuple(pm.bound is None for pm in serving), tuple(st.shares is None for st in training))
        if self._model_bytes[0] != key:
            mods = sum(_bytes_of(pm.module.parameters()) for pm in serving if pm.bound is None)
            for st in training:
                mods += (_bytes_of(st.pm.module.parameters()) if st.shares is None else 0) + st.master.nbytes()
            self._model_bytes = (key, mods)
        return held + self._model_bytes[1]

    def held(self, label: str) -> Entry:
        """The entry `label`, which a command needs this worker to hold."""
        e = self.entries.get(label)
        if e is None:
            raise CommandError(f"{label} is not held on worker {self.rank}")
        return e

    def put_rows(self, label: str, lo: int, hi: int, fields: dict[str, Tensor]) -> None:
        """Rows [lo, hi) of `fields` as the data entry `label` (replacing what it held)."""
        self.entries[label] = Entry("data", pieces=[Piece(lo, hi, fields)])

    def put_weights(self, label: str, entry: Entry) -> None:
        self._unbind(label)  # a module bound to the entry this one replaces keeps no stale copy alive
        self.entries[label] = entry

    def free(self, labels) -> None:
        for label in labels:
            self.entries.pop(label, None)
            self._unbind(label)

    def _unbind(self, label: str) -> None:
        """Serving modules bound to the tensors of entry `label` let go of them (it is freed or replaced), so
        nothing keeps a copy the plan no longer holds."""
        for pm in self.serving.values():
            if pm.bound == label:
                pm.unbind()

    # -- where versions come from -------------------------------------------------------------------

    def hf_weights(self, model: str) -> HFWeights:
        spec = self.setup.models[model]
        assert spec.hf is not None
        return HFWeights(spec.hf, spec.kind, spec.seed, self.nets[model])

    def version_shards(self, model: str, version: int, layout: Layout,
                       convert: Callable[[Tensor], Tensor] = lambda t: t) -> dict[str, Tensor]:
        """This rank's float32 pieces under `layout` of a version it installs, each `convert`ed as it is read (so a
        serving copy never has all its float32 values at once): read from the resume checkpoint's shard files
        (only the boxes it needs, from whichever files hold them), or version 0: only this rank's slices of the
        model's checkpoint, or only its parameters drawn from the model's seed (the values `hf.initial_model`
        builds whole for the single-process reference). Nothing else is kept."""
        spec = self.setup.models[model]
        if self.resume is not None and version in self.resume.index.get("versions", {}).get(model, ()):
            return self.resume.pieces(ckpt.weights_key(model, version, ""), self.shapes[model], layout, self.rank,
                                      spec.arch.layers, convert)
        if version != 0:
            raise CommandError(f"version {version} of @{model} is neither in the checkpoint nor version 0")
        if spec.hf is not None:
            return self.hf_weights(model).pieces(self.shapes[model], layout, self.rank, convert)
        check_arch(spec.arch, spec.kind, self.nets[model])
        return seeded_shard(self.shapes[model], layout, self.rank, spec.arch.layers, spec.seed,
                            self.nets[model].init_std, convert)

    def pieces(self, model: str, layout: Layout) -> dict:
        """This rank's pieces of `model`'s parameters under `layout` (computed once: a checkpoint part, a keep and a
        weights transfer each ask; callers only read it)."""
        key = (model, layout)
        if key not in self._pieces:
            self._pieces[key] = rank_pieces(self.shapes[model], layout, self.rank, self.setup.models[model].arch.layers)
        return self._pieces[key]

    def writes(self, model: str, layout: Layout) -> frozenset[str]:
        """The parameters of `model` whose pieces this rank writes under `layout`: those its data-parallel
        replica owns (`layout.replica_owner`: the pieces whose optimizer state it keeps), and of a piece
        replicated over TP only t = 0's (computed once, as `pieces`)."""
        key = (model, layout)
        if key not in self._writes:
            d, _, t = layout.coord(self.rank)
            owner = replica_owner(self.shapes[model], layout, self.rank, self.setup.models[model].arch.layers)
            self._writes[key] = frozenset(n for n, piece in self.pieces(model, layout).items()
                                          if owner[n] == d and (piece.dim is not None or t == 0))
        return self._writes[key]

    def saved_shards(self, e: Entry) -> dict[str, Tensor]:
        """What an export saves of a weights entry: the entry, unless it is a reduced-precision serving copy
        of the version a training state here holds in the same layout; then that state's float32 masters (of the
        share this rank writes), so checkpoints resume exactly and final weights are the trained ones, not their
        bf16 rounding."""
        st = self.training.get((e.model, e.layout)) if e.model is not None and e.layout is not None else None
        if st is not None and not e.full_precision() and st.pm.loaded == (e.model, e.version):
            return st.master.export(copy=False)
        return e.shards

    # -- bookkeeping commands -----------------------------------------------------------------------

    def install(self, cmd: Install) -> None:
        m, layout = cmd.model, cmd.layout
        if cmd.keep:  # a resumed version the next checkpoint saves again (tau > 0): its float32 values too
            master = self.version_shards(m, cmd.version, layout)
            self._keep(m, cmd.version, layout, master, cmd.tau)
            shards = {n: t.to(self.device, self.serving_dtype) for n, t in master.items()}
        else:
            shards = self.version_shards(m, cmd.version, layout, lambda t: t.to(self.device, self.serving_dtype))
        self.put_weights(cmd.label, Entry("weights", m, cmd.version, layout, shards=shards))

    def _keep(self, model: str, version: int, layout: Layout, shards: dict[str, Tensor], tau: int) -> None:
        mine = self.writes(model, layout)
        self.window[(model, version)] = (layout, kept_copy({n: t for n, t in shards.items() if n in mine}))
        for key in [k for k in self.window if k[0] == model and k[1] < version - tau]:
            del self.window[key]

    def keep(self, cmd: Keep) -> None:
        """Keep a copy of this rank's float32 pieces of a new version for later checkpoints (tau > 0: nodes
        after the next checkpoint still read it), dropping the versions older than version - tau."""
        e = self.entries.get(cmd.label)
        if e is None or e.layout is None or e.model is None:
            raise CommandError(f"keep of {cmd.label}, which this worker does not hold")
        self._keep(e.model, e.version, e.layout, self.saved_shards(e), cmd.tau)

    def release(self, cmd: Release) -> None:
        self.free(cmd.labels)
