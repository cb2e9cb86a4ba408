"""How a torch worker moves data rows and weights to and from other workers (Comm and Reshard nodes, and the prep
moves of an operator's inputs into its layout): point-to-point sends and receives of torch.distributed, each move
tagged so that concurrent transfers between the same ranks never match the wrong message. A transfer's source side
may run on the sender thread (sender.py) beside the operators."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rpegc.runtime.backends.torch.channel.commands import CommData, MoveWeights, PrepWeights
from rpegc.runtime.backends.torch.parallel.layout import Layout, RowMove, WeightMove
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.backends.torch.worker.holdings import CommandError, Entry, Holdings, Piece


def field_spec(name: str, run: RunConfig) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-sequence shape and dtype of a data field."""
    w = run.workload
    specs = {
        "sequences": ((w.Lp + w.Lr,), torch.int64),
        "mask": ((w.Lr,), torch.float32),
        "old_logprobs": ((w.Lr,), torch.float32),
        "ref_logprobs": ((w.Lr,), torch.float32),
        "values": ((w.Lr,), torch.float32),
        "scores": ((), torch.float32),
        "task_scores": ((), torch.float32),
        "chosen_ref_logprobs": ((w.Lr,), torch.float32),  # DPO: the reference's log-probs of each side
        "rejected_ref_logprobs": ((w.Lr,), torch.float32),
    }
    return specs[name]


class Transfers:
    """The rows and weights this worker sends and receives, into and out of its holdings."""

    def __init__(self, held: Holdings):
        self.held = held
        self.rank, self.device, self.run = held.rank, held.device, held.run

    # -- data rows ----------------------------------------------------------------------------------

    def rows_of(self, labels: list[str], lo: int, hi: int, fields: list[str]) -> dict[str, Tensor]:
        """Rows [lo, hi) of each field, assembled from the pieces this worker holds of `labels`."""
        entries = self.held.entries
        pieces = [p for lab in labels if lab in entries for p in entries[lab].pieces]
        return {f: self._field_rows([p for p in pieces if f in p.fields], f, lo, hi, labels) for f in fields}

    def _field_rows(self, pieces: list[Piece], f: str, lo: int, hi: int, labels: list[str]) -> Tensor:
        parts, cur = [], lo
        while cur < hi:
            best = None
            for p in pieces:
                if p.lo <= cur < p.hi and (best is None or p.hi > best.hi):
                    best = p
            if best is None:
                raise CommandError(f"rows [{cur}, {hi}) of '{f}' are not held on worker {self.rank} "
                                   f"(artifacts {labels})")
            end = min(best.hi, hi)
            parts.append(best.fields[f][cur - best.lo:end - best.lo])
            cur = end
        return torch.cat(parts) if parts else self.empty(f, 0)

    def empty(self, name: str, rows: int) -> Tensor:
        shape, dtype = field_spec(name, self.run)
        return torch.zeros((rows, *shape), dtype=dtype, device=self.device)

    def move_rows(self, moves: list[RowMove], sources: list[str], target: str, fields: list[str], tag0: int) -> int:
        """Execute row moves; received rows become pieces of `target`. Returns bytes this rank sent."""
        ops, received, sent = [], [], 0
        for i, m in enumerate(moves):
            if m.src == self.rank and m.dst == self.rank:
                received.append(Piece(m.lo, m.hi, {k: v.clone() for k, v in
                                                   self.rows_of(sources, m.lo, m.hi, fields).items()}))
                continue
            if m.src == self.rank:
                data = self.rows_of(sources, m.lo, m.hi, fields)
                for j, f in enumerate(fields):
                    t = data[f].contiguous()
                    sent += t.numel() * t.element_size()
                    ops.append(dist.isend(t, m.dst, tag=tag0 + 16 * i + j))
            elif m.dst == self.rank:
                bufs = {f: self.empty(f, m.hi - m.lo) for f in fields}
                for j, f in enumerate(fields):
                    ops.append(dist.irecv(bufs[f], m.src, tag=tag0 + 16 * i + j))
                received.append(Piece(m.lo, m.hi, bufs))
        for op in ops:
            op.wait()
        if received:
            entry = self.held.entries.setdefault(target, Entry("data"))
            entry.pieces.extend(received)
        return sent

    # -- weights ------------------------------------------------------------------------------------

    def move_weights(self, moves: list[WeightMove], src_label: str, model: str, layout: Layout,
                     tag0: int) -> tuple[Optional[dict[str, Tensor]], int, Optional[int]]:
        """Execute weight moves into this rank's pieces under `layout`; (shards or None, bytes sent, version)."""
        shapes, dtype = self.held.shapes[model], self.held.serving_dtype
        src = self.held.entries.get(src_label)
        version = src.version if src is not None else None
        mine = self.held.pieces(model, layout) if self.rank in layout.ranks else {}
        new: dict[str, Tensor] = {}
        for name, piece in mine.items():
            shape = list(shapes[name])
            if piece.dim is not None:
                shape[piece.dim] = piece.hi - piece.lo
            new[name] = torch.empty(shape, dtype=dtype, device=self.device)
        ops, sent = [], 0
        for i, m in enumerate(moves):
            if m.src == self.rank:
                if src is None:
                    raise CommandError(f"{src_label} is not held on worker {self.rank}")
                t = self._src_slice(src, m)
                if m.dst == self.rank:
                    self._dst_slice(new, mine, m).copy_(t)
                    continue
                t = t.contiguous()
                sent += t.numel() * t.element_size()
                ops.append(dist.isend(t, m.dst, tag=tag0 + i))
            elif m.dst == self.rank:
                view = self._dst_slice(new, mine, m)
                buf = torch.empty(view.shape, dtype=dtype, device=self.device)  # as sent
                ops.append((dist.irecv(buf, m.src, tag=tag0 + i), view, buf))
        for op in ops:
            if isinstance(op, tuple):
                op[0].wait()
                op[1].copy_(op[2])
            else:
                op.wait()
        return (new if mine else None), sent, version

    def _src_slice(self, entry: Entry, m: WeightMove) -> Tensor:
        """The part [m.lo, m.hi) along m.dim of the piece of `m.name` this rank holds in `entry`."""
        t = entry.shards[m.name]
        if m.dim is None:
            return t
        assert entry.layout is not None and entry.model is not None
        held = self.held.pieces(entry.model, entry.layout)[m.name]
        lo = held.lo if held.dim is not None else 0
        return t.narrow(m.dim, m.lo - lo, m.hi - m.lo)

    @staticmethod
    def _dst_slice(new: dict[str, Tensor], mine: dict, m: WeightMove) -> Tensor:
        t = new[m.name]
        if m.dim is None:
            return t
        piece = mine[m.name]
        lo = piece.lo if piece.dim is not None else 0
        return t.narrow(m.dim, m.lo - lo, m.hi - m.lo)

    def reshard(self, step: PrepWeights, tag: int) -> None:
        """An operator's prep move of a weights entry into its layout (the entry keeps its label)."""
        shards, _, _ = self.move_weights(step.moves, step.label, step.model, step.layout, tag)
        if shards is not None:
            e = self.held.entries[step.label]
            self.held.put_weights(step.label, Entry("weights", e.model, e.version, step.layout, shards=shards))

    # -- commands -----------------------------------------------------------------------------------

    def comm_data(self, cmd: CommData) -> dict:
        sent = self.move_rows(cmd.moves, cmd.sources, cmd.target, cmd.fields, cmd.tag)
        return {"bytes": sent, "versions_in": {}}

    def comm_weights(self, cmd: MoveWeights) -> dict:
        """A weights Comm (to another allocation) or a Reshard (same allocation, another layout)."""
        m, layout = cmd.model, cmd.layout
        shards, sent, version = self.move_weights(cmd.moves, cmd.source, m, layout, cmd.tag)
        if cmd.source == cmd.target and self.rank in cmd.src_ranks:
            self.held.free([cmd.source])  # a Reshard replaces the old layout
        if shards is not None:
            self.held.put_weights(cmd.target, Entry("weights", m, cmd.version, layout, shards=shards))
        return {"bytes": sent, "versions_in": {m: version} if version is not None else {}}
