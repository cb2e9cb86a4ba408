"""Where every shard of a torch run lives and the commands that move it (paper Sec. VII: a node binds its
inputs where its workers are; docs/architecture.md, Runtime).

`Routes` holds the plan's worker layouts (dp x pp x tp over ranks, per Op node and per Reshard end), the
sequence rows of every node and artifact (a quantile phase is a range of whole prompt groups), and where
each artifact's shards are held now (`holdings`: a weights layout, or data rows per rank). From these it
builds each node's commands per rank, with every route precomputed (`layout.route_rows`,
`layout.route_weights`): an Op first gathers the rows and re-lays out the weights it needs (its prep steps), a
data Comm moves rows from the ranks that hold them to those its reader will use, a weight Comm or a Reshard moves
parameter shards into the layout of their reader. The commands are channel/commands.py's dataclasses (Op,
CommData, MoveWeights), one object for every rank of a node. Nothing here talks to a worker: the backend sends
what it builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.geometry import Strategy
from rpegc.core.ir.program import VERIFY
from rpegc.runtime.backends.base import BackendError, Dispatch
from rpegc.runtime.backends.torch.channel.commands import CommData, MoveWeights, NodeCommand, Op, PrepRows, PrepWeights
from rpegc.runtime.backends.torch.parallel.layout import (Layout, check_tp, intersect, replica_rows, route_rows,
                                                 route_weights)
from rpegc.runtime.backends.torch.run_config import RunConfig
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec
from rpegc.core.cost.host import alloc_devices
from rpegc.runtime.plan import Artifact, RunNode, RunPlan


@dataclass
class Holding:
    """Where an artifact's shards are: a weights layout, or data rows per rank. A data artifact's `rows` are where its
    producer or a transfer put them; `moved` are the copies an operator's prep made on its replicas' ranks, which
    later operators there read (their commands run after it in those ranks' order) but a transfer never sends: its
    source side runs on the sender thread, which may run before the prep has (worker/sender.py)."""

    layout: Optional[Layout] = None
    rows: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    moved: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def all_rows(self) -> dict[int, list[tuple[int, int]]]:
        out = {r: list(x) for r, x in self.rows.items()}
        for r, x in self.moved.items():
            out.setdefault(r, []).extend(x)
        return out


@dataclass
class Command:
    """A node's command per rank, built before any is sent; `ends`: the ranks whose finish is the node's
    finish (an op's every rank, a transfer's receivers: the data is where it goes once they finished);
    `holdings`: where its inputs and outputs are after it (applied when it is sent)."""

    commands: dict[int, NodeCommand] = field(default_factory=dict)
    ends: frozenset[int] = frozenset()
    holdings: dict[Artifact, Holding] = field(default_factory=dict)



class Routes:
    """The layouts, rows and holdings of one run of `plan`, and the commands of its nodes."""

    def __init__(self, plan: RunPlan, cfg: RunConfig, models: dict[str, ModelSpec],
                 shapes: dict[str, dict[str, tuple[int, ...]]], fields: dict[str, tuple[str, ...]]):
        self.plan, self.program, self.cfg = plan, plan.program, cfg
        self.models, self.shapes, self.fields = models, shapes, fields
        self.rank_of = {d: i for i, d in enumerate(plan.devices)}
        w = cfg.workload
        self.rows_total = w.drawn * w.R  # the containers hold the drawn rows (dynamic sampling)
        self.holdings: dict[Artifact, Holding] = {}
        self._tag = 0
        self.layouts: dict[int, Layout] = {}  # Op node index -> its workers' layout
        self.reshard_layouts: dict[int, tuple[Layout, Layout]] = {}  # Reshard node index -> (source, target)
        for n in plan.nodes:
            if n.kind == "op" and n.node.role == VERIFY:  # the verifier pool's worker holds every row it scores
                self.layouts[n.index] = Layout(self.ranks(n.devices), 1, 1, 1)
            elif n.kind == "op":
                self.layouts[n.index] = self._layout(n.devices, n.node.strategy, n)
                self._check_layout(n, self.layouts[n.index])
            elif n.kind == "reshard":
                self.reshard_layouts[n.index] = (self._layout(n.src_devices, n.node.src_strategy, n),
                                                 self._layout(n.devices, n.node.strategy, n))

    def _layout(self, devices: tuple[int, ...], s: Optional[Strategy], n: RunNode) -> Layout:
        if s is None:
            raise RpegError(n.node.loc, f"{n.kind} node {n.id} has no layout (dp, pp, tp)")
        try:
            return Layout(tuple(self.rank_of[d] for d in devices), s.dp, s.pp, s.tp)
        except RpegError as e:
            raise RpegError(n.node.loc, f"node {n.id}: {e.message}") from None

    def _check_layout(self, n: RunNode, layout: Layout) -> None:
        arch = self.models[n.node.model].arch
        if layout.pp > arch.layers:
            raise RpegError(n.node.loc, f"node {n.id} uses pp = {layout.pp}, but @{n.node.model} has only "
                            f"{arch.layers} blocks; use pp <= {arch.layers}")
        if layout.tp > 1:
            why = check_tp(arch.heads, arch.kv_heads, arch.ffn, layout.tp)
            if why:
                raise RpegError(n.node.loc, f"node {n.id}: {why} of @{n.node.model}; choose another tp")
        lo, hi = self.node_rows(n)
        group = self.group_of(n)
        if (hi - lo) // group < layout.dp:
            raise RpegError(n.node.loc, f"node {n.id} has dp = {layout.dp} replicas but only {(hi - lo) // group} "
                            f"{'prompt group' if group > 1 else 'sequence'}(s) to share among them; lower dp or "
                            "raise B in the workload")

    # -- rows ----------------------------------------------------------------------------------------

    def phase_rows(self, phase: Optional[int], nphases: Optional[int]) -> tuple[int, int]:
        """Global sequence rows of a quantile phase: whole prompt groups, by the cumulative fractions."""
        if phase is None:
            return (0, self.rows_total)
        w = self.cfg.workload
        fs = [q.f for q in self.program.graph.quantiles] if self.program.graph else []
        q = nphases or len(fs)
        cum = [0.0] + [min(1.0, f) for f in fs[:q]]
        while len(cum) <= q:
            cum.append(1.0)
        cum[q] = 1.0
        return (round(cum[phase - 1] * w.drawn) * w.R, round(cum[phase] * w.drawn) * w.R)

    def node_rows(self, n: RunNode) -> tuple[int, int]:
        return self.phase_rows(n.node.phase, n.node.nphases)

    def artifact_rows(self, a: Artifact) -> tuple[int, int]:
        if a.phase is None:
            return (0, self.rows_total)
        nphases = len(self.program.graph.quantiles) if self.program.graph else None
        return self.phase_rows(a.phase, nphases)

    def group_of(self, n: RunNode) -> int:
        """Rows a replica must keep together (GRPO's training needs every rollout of a prompt)."""
        if n.kind == "op" and n.node.role == "training":
            return self.cfg.alg.training_group(self.cfg.workload)
        return 1

    def op_rows(self, i: int) -> dict[int, tuple[int, int]]:
        n = self.plan.nodes[i]
        return replica_rows(self.layouts[i], *self.node_rows(n), self.group_of(n))

    def next_tag(self) -> int:
        self._tag = (self._tag + 1) % 2000
        return self._tag * 1_000_000


    def ranks(self, devices) -> tuple[int, ...]:
        return tuple(self.rank_of[d] for d in devices)

    def alloc_ranks(self, a: Artifact) -> tuple[int, ...]:
        assert self.program.cluster is not None
        return self.ranks(alloc_devices(a.alloc, self.program.cluster))

    def reader_layout(self, a: Artifact) -> Layout:
        """The layout a weights copy is laid out in where it lands: that of its first reader on its allocation."""
        for i in self.plan.consumers.get(a, ()):
            n = self.plan.nodes[i]
            if n.kind == "op":
                return self.layouts[i]
            if n.kind == "reshard":
                return self.reshard_layouts[i][0]
        ranks = self.alloc_ranks(a)
        return Layout(ranks, len(ranks), 1, 1)

    def reader_rows(self, a: Artifact) -> dict[int, tuple[int, int]]:
        """Rows each rank of a delivered data artifact's allocation should hold: as its first reader splits them."""
        rows = self.artifact_rows(a)
        for i in self.plan.consumers.get(a, ()):
            if self.plan.nodes[i].kind == "op":
                need = {r: intersect(rr, rows) for r, rr in self.op_rows(i).items()}
                return {r: x for r, x in need.items() if x is not None}
        return {r: rows for r in self.alloc_ranks(a)}

    # -- commands ------------------------------------------------------------------------------------

    def command(self, d: Dispatch) -> Command:
        """The commands of `d` per rank, by node kind."""
        kind = d.node.kind
        if kind == "op":
            return self.op_command(d)
        return self.transfer_command(d) if kind == "comm" else self.reshard_command(d)

    def op_command(self, d: Dispatch) -> Command:
        n = d.node
        i = n.index
        layout = self.layouts[i]
        rows = self.op_rows(i)
        tag = self.next_tag()
        prep: list[PrepRows | PrepWeights] = []
        data_in: list[str] = []
        weights = None
        holdings: dict[Artifact, Holding] = {}
        for a in d.inputs:
            h = self.holdings.get(a)
            if h is None:
                raise BackendError(n.node.loc, f"node {n.id} needs {a.label}, which no worker holds")
            if a.kind == "weights":
                weights = a
                if h.layout != layout:  # the plan left no Reshard: re-lay out locally first
                    prep.append(PrepWeights(label=a.label, model=a.name, layout=layout,
                                            moves=route_weights(self.shapes[a.name], self.models[a.name].arch.layers,
                                                                h.layout, layout)))
                    holdings[a] = Holding(layout=layout)
                continue
            data_in.append(a.label)
            need = {r: x for r, rr in rows.items() if (x := intersect(rr, self.artifact_rows(a))) is not None}
            moves = route_rows(h.all_rows(), need)
            if moves:
                prep.append(PrepRows(label=a.label, fields=list(self.fields[a.name]), moves=moves))
                moved = {r: list(x) for r, x in h.moved.items()}
                for m in moves:
                    moved.setdefault(m.dst, []).append((m.lo, m.hi))
                holdings[a] = Holding(rows=h.rows, moved=moved)
        verify = n.node.role == VERIFY
        if weights is None and not verify:
            raise BackendError(n.node.loc, f"node {n.id} binds no parameter copy of @{n.node.model}")
        outputs: dict[str, list[str]] = {}
        fields: list[str] = []
        out_weights = None
        for a in d.outputs:
            if a.kind == "weights":
                out_weights = a
                holdings[a] = Holding(layout=layout)
                continue
            outputs[a.label] = list(self.fields[a.name])
            fields += [f for f in self.fields[a.name] if f not in fields]
            holdings[a] = Holding(rows={r: [x] for r, x in rows.items() if x[1] > x[0]})
        training = n.node.role == "training"
        cmd = Op(node=n.id, tag=tag, ranks=sorted(layout.ranks), step=n.step, role=n.node.role, model=n.node.model,
                 layout=layout, mb=1 if verify else n.node.strategy.mb, rows=rows,
                 weights=weights.label if weights else None,
                 # the plan's training (precision, ZeRO stage, recomputation, schedule); the copy is free to take
                 # over as the working copy when no later node reads it
                 train=self.cfg.workload.training(n.node.strategy.train, n.node.loc) if training else None,
                 take=training and weights in d.last_reads,
                 inputs=data_in, outputs=outputs, fields=fields, prep=prep,
                 output=out_weights.label if out_weights else None,
                 version_out=out_weights.index if out_weights else None, pool=n.node.pool if verify else None)
        return Command({r: cmd for r in layout.ranks}, frozenset(layout.ranks), holdings)

    def transfer_command(self, d: Dispatch) -> Command:
        n = d.node
        if d.inputs[0].kind == "weights":
            return self.weights_command(d, d.inputs[0], d.outputs[0], None)
        out = d.outputs[0]
        held: dict[int, list[tuple[int, int]]] = {}
        for a in d.inputs:
            h = self.holdings.get(a)
            if h is None:
                raise BackendError(n.node.loc, f"node {n.id} needs {a.label}, which no worker holds")
            for r, rs in h.rows.items():  # not the rows an operator's prep moved (`Holding.moved`)
                held.setdefault(r, []).extend(rs)
        need = self.reader_rows(out)
        moves = route_rows(held, need, have={})
        ranks = {m.src for m in moves} | {m.dst for m in moves}
        cmd = CommData(node=n.id, tag=self.next_tag(), ranks=sorted(ranks), moves=moves,
                       sources=[a.label for a in d.inputs], target=out.label, fields=list(self.fields[out.name]))
        before = self.holdings.get(out)
        delivered = Holding(rows={**(before.rows if before else {}), **{r: [x] for r, x in need.items()}})
        return Command({r: cmd for r in ranks}, frozenset(m.dst for m in moves), {out: delivered})

    def reshard_command(self, d: Dispatch) -> Command:
        _, target = self.reshard_layouts[d.node.index]
        return self.weights_command(d, d.inputs[0], d.outputs[0], target)

    def weights_command(self, d: Dispatch, src: Artifact, dst: Artifact,
                         target: Optional[Layout]) -> Command:
        n = d.node
        h = self.holdings.get(src)
        if h is None or h.layout is None:
            raise BackendError(n.node.loc, f"node {n.id} moves {src.label}, which no worker holds")
        layout = target or self.reader_layout(dst)
        moves = route_weights(self.shapes[src.name], self.models[src.name].arch.layers, h.layout, layout)
        ranks = {m.src for m in moves} | set(layout.ranks)
        if src == dst:
            ranks |= set(h.layout.ranks)
        cmd = MoveWeights(node=n.id, tag=self.next_tag(), ranks=sorted(ranks), model=src.name, version=src.index,
                          source=src.label, target=dst.label, layout=layout, moves=moves, src_ranks=h.layout.ranks)
        return Command({r: cmd for r in ranks}, frozenset(layout.ranks), {dst: Holding(layout=layout)})

