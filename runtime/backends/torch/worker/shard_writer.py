"""What a torch worker writes of a checkpoint or of the final weights: its own shards, as one safetensors file
(checkpoints/shard_files.py) in the directory the controller names (checkpoints/exports.py asks for them); only the
file's name, size, SHA-256 and tensor boxes go back through the control channel, never a tensor."""

from __future__ import annotations

import os

import torch
from torch import Tensor

from rpegc.runtime.backends.torch.channel.commands import Export
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.worker.holdings import CommandError, Holdings

Tensors = dict[str, tuple[Tensor, ckpt.Box, tuple[int, ...]]]  # key -> (tensor, its box, the whole tensor's shape)


class ShardWriter:
    """The `export` command: this rank's shards of what the controller asks to save."""

    def __init__(self, held: Holdings):
        self.held, self.rank = held, held.rank

    def export(self, cmd: Export) -> dict:
        """Write this rank's shards (weights versions, the optimizer state of trained models, the RNG state)
        as one safetensors file into the checkpoint or final-weights directory `cmd.dir`, and report
        what it holds: file name, size, SHA-256 and the box of every tensor (plain values; no tensor goes
        through the control channel).

        What it saves is in `cmd`'s fields (commands.Export). Every rank of a layout is asked; it writes only the
        pieces `Holdings.writes` gives it, so the files of all ranks tile every tensor exactly once and the
        data-parallel replicas share the writing."""
        tensors: Tensors = {}
        held = self.held
        for label, prefix in cmd.weights:
            e = held.entries.get(label)
            if e is None or e.layout is None or e.model is None:
                raise CommandError(f"export of {label}, which this worker does not hold")
            self._add(tensors, prefix, e.model, e.layout, held.saved_shards(e))
        for m, layout, v, prefix in cmd.masters:
            st = held.training.get((m, layout))
            if st is None or st.pm.loaded != (m, v):
                raise CommandError(f"checkpoint of the float32 master of version {v} of @{m}, which no training "
                                   f"state on this worker holds")
            self._add(tensors, prefix, m, layout, st.master.export(copy=False))  # written before any later step runs
        for m, v, prefix in cmd.window:
            kept = held.window.get((m, v))
            if kept is None:
                raise CommandError(f"checkpoint of version {v} of @{m}, which this worker did not keep")
            self._add(tensors, prefix, m, kept[0], kept[1])
        for m, layout in cmd.optimizer:
            self._add_optimizer(tensors, m, layout)
        if cmd.rng:
            state = torch.get_rng_state()
            tensors[ckpt.rng_key(self.rank)] = (state, ((0,), tuple(state.shape)), tuple(state.shape))
        path = os.path.join(cmd.dir, ckpt.shard_file(self.rank, cmd.part))
        try:
            report = ckpt.write_shard_file(path, tensors)
        except OSError as e:
            raise CommandError(f"cannot write {path}: "
                               f"{e.strerror or e}") from None
        return {"export": cmd.export, **report}

    def _add(self, tensors: Tensors, prefix: str, model: str, layout: Layout, shards: dict[str, Tensor]) -> None:
        """The pieces of `shards` this rank writes, under `prefix` + name."""
        mine = self.held.writes(model, layout)
        pieces = self.held.pieces(model, layout)
        for n, t in shards.items():
            if n in mine:
                shape = self.held.shapes[model][n]
                tensors[prefix + n] = (t, ckpt.piece_box(pieces[n], shape), shape)

    def _add_optimizer(self, tensors: Tensors, model: str, layout: Layout) -> None:
        """The Adam state of the parameters this rank writes of (model, layout)'s training state, if it has one."""
        st = self.held.training.get((model, layout))
        if st is None:
            return
        mine = self.held.writes(model, layout)
        t_coord = layout.coord(self.rank)[2]
        pieces = self.held.pieces(model, layout)
        for n in st.master.names:
            shape = self.held.shapes[model][n]
            for k, v in st.master.adam_state(n).items() if n in mine else ():
                if not isinstance(v, Tensor):
                    raise CommandError(f"Adam state {k} of {n} is not a tensor; cannot checkpoint it")
                if v.dim():
                    tensors[ckpt.adam_key(model, n, k)] = (v, ckpt.piece_box(pieces[n], shape), shape)
                elif t_coord == 0:  # a scalar (the step count) is the same on every TP rank: one copy
                    tensors[ckpt.adam_key(model, n, k)] = (v, ((), ()), ())
