"""Checkpoints and final weights of a torch run (docs/architecture.md, Runtime; paper App. B: fault tolerance),
written by the workers themselves: each rank writes its own shards (checkpoints/shard_files.py: safetensors files) into
a pending directory, reports only file names, sizes, hashes and boxes through the control channel, and the controller
writes the index last and renames the directory into place.

`Exports` decides what each rank writes: at a step boundary of every trained model (every `every` steps) the
float32 master and Adam state of each trained model where its training ran, plus every older version later
nodes may still read under staleness (the workers keep those once trained, or once installed on resume);
at the end the final version of every trained model. Checkpoints are pruned to the newest `keep`.

A checkpoint at boundary k+1 is written in parts: each trained model's part (its master and Adam state of version
k+1, its kept versions) is queued on its training ranks right behind its training of step k, the moment that
training's commands are sent, so it runs as the training ends and before anything sent later (the training of step
k+1 above all), with no control round trip between them; and the workers' RNG states once every model's part is
queued. The index is written when all parts are in. Under mixed staleness one model's training of step k+1 may run
before another's of step k ends (PPO with the actor one step stale and the critic on-policy, trained on devices of
their own), so waiting for the whole boundary would find its master already a version further.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from rpegc.core.cost.checkpoint import checkpoint_due, version_kept
from rpegc.outputs import PendingDirectory
from rpegc.runtime.backends.base import Dispatch
from rpegc.runtime.backends.torch.channel.commands import Export, Keep
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.controller.pool import WorkerPool
from rpegc.runtime.backends.torch.controller.routing import Routes
from rpegc.runtime.plan import Artifact, RunPlan


@dataclass
class _Checkpoint:
    """A checkpoint being written: its pending directory, the versions and models it saves, the reports of the
    parts written so far, how many parts are still out, and whether the last part has been asked for."""

    step: int
    pending: PendingDirectory
    versions: dict[str, list[int]] = field(default_factory=dict)
    parts: list[tuple[int, dict]] = field(default_factory=list)  # (rank, its report of one part)
    out: int = 0
    sealed: bool = False


@dataclass
class ExportJob:
    """Shard files the ranks in `ranks` still have to write; `parts`: the reports of those that did."""

    ranks: set[int]
    parts: dict[int, dict] = field(default_factory=dict)
    on_done: Optional[Callable[["ExportJob"], None]] = None


class Exports:
    """What the workers of one run write: checkpoints every `every` steps into `run_dir`, and the final weights."""

    def __init__(self, plan: RunPlan, pool: WorkerPool, routes: Routes, *, run_dir: Optional[str], every: int,
                 keep: int, identity: dict, metrics: dict[int, dict[str, float]], resumed_at: Optional[int]):
        self.plan, self.pool, self.routes = plan, pool, routes
        self.run_dir, self.every, self.keep = run_dir, every, keep
        self.identity = identity  # what the index records and a resume must match (checkpoint.run_identity)
        self.metrics = metrics  # the backend's per-step metrics, saved with each checkpoint
        self.resumed_at = resumed_at  # the step a resumed run started at; None: not resumed
        self.trained = {n.node.model for n in plan.nodes if n.kind == "op" and n.node.role == "training"}
        self.train_sent: dict[int, set[str]] = {}  # step -> the models whose training of it was sent
        self.train_layout: dict[str, Layout] = {}  # where each model's training state (master, Adam) lives
        # versions the workers keep for later checkpoints (tau > 0): model -> version -> layout kept in
        self.kept: dict[str, dict[int, Layout]] = {m: {} for m in self.trained}
        self.jobs: dict[int, ExportJob] = {}
        self.open: dict[int, _Checkpoint] = {}  # checkpoints whose parts are being written, by boundary
        self._last_id = 0
        self.checkpoints: list[str] = []
        # one entry per checkpoint / final-weights write: {"what", "step", "bytes", "files", "write_s", "commit_s"}
        # (write_s: the slowest worker's time in its parts: gathering, serialise, write and fsync of each file;
        # commit_s: the controller's, writing the index, renaming the directory into place and pruning)
        self.io_stats: list[dict] = []
        self.final_weights: dict[str, dict[str, torch.Tensor]] = {}

    def keeps_installed(self, a: Artifact, layout: Layout) -> bool:
        """Whether the workers keep an installed version: a resumed run's next checkpoint saves the older
        versions it reads again."""
        m, v, tau = a.name, a.index, self.plan.tau.get(a.name, 0)
        keep = (self.resumed_at is not None and self.every and tau > 0 and m in self.trained
                and v in ckpt.kept_versions(self.resumed_at, tau) and v not in self.kept[m])
        if keep:
            self.kept[m][v] = layout
        return bool(keep)

    def report(self, rank: int, msg: dict) -> None:
        """A rank wrote its file of export `msg["export"]`: name, size, SHA-256, boxes (no tensors)."""
        job = self.jobs[msg["export"]]
        job.parts[rank] = msg
        job.ranks.discard(rank)
        if not job.ranks:
            del self.jobs[msg["export"]]
            if job.on_done is not None:
                job.on_done(job)

    def _export(self, requests: dict[int, dict], directory: str, on_done: Callable[[ExportJob], None],
                part: str = "") -> None:
        """Ask each rank of `requests` (its Export fields: what to save) to write its shard file (named for its rank
        and `part`) into `directory`; `on_done` gets the reports."""
        self._last_id += 1
        job = ExportJob(set(requests), on_done=on_done)
        self.jobs[self._last_id] = job
        for r, req in sorted(requests.items()):
            self.pool.send(r, Export(export=self._last_id, dir=os.path.abspath(directory), part=part, **req))

    def training_sent(self, d: Dispatch) -> None:
        """A training node's commands were sent: its model's training state will be where it runs; under staleness
        its ranks keep the version it makes for later checkpoints, and a step boundary checkpoints, each asked for
        now, so that the workers run it behind the training in their queues."""
        k, m = d.node.step, d.node.node.model
        out = next(a for a in d.outputs if a.kind == "weights")
        layout = self.routes.holdings[out].layout
        assert layout is not None
        tau = self.plan.tau.get(m, 0)
        self.train_layout[m] = layout
        self.train_sent.setdefault(k, set()).add(m)
        due = checkpoint_due(k + 1, self.plan.steps, self.every)
        if version_kept(out.index, tau, self.plan.steps, self.every):
            # nodes after a later checkpoint may still read this version: each rank keeps what it writes
            for r in layout.ranks:
                self.pool.send(r, Keep(label=out.label, tau=tau))
            kept = self.kept.setdefault(m, {})
            kept[out.index] = layout
            for v in [v for v in kept if v < out.index - tau]:
                del kept[v]
        if due:
            self._checkpoint_model(k + 1, m, layout)
            if self.train_sent[k] >= self.trained:
                self._seal(k + 1)

    def _io_stat(self, what: str, step: int, reports: list[tuple[int, dict]], commit_s: float) -> None:
        """One write's files and bytes, its slowest worker's time in all its parts (each from its command's start to
        its finish on the worker) and the controller's time committing it."""
        per_rank: dict[int, float] = {}
        for r, rep in reports:
            per_rank[r] = per_rank.get(r, 0.0) + float(rep["finish"]) - float(rep["start"])
        self.io_stats.append({"what": what, "step": step, "files": len(reports),
                              "bytes": sum(int(rep["bytes"]) for _, rep in reports),
                              "write_s": max(per_rank.values(), default=0.0), "commit_s": commit_s})

    def _open(self, step: int) -> _Checkpoint:
        """The checkpoint of boundary `step`, its pending directory made at its first part."""
        cp = self.open.get(step)
        if cp is None:
            assert self.run_dir is not None
            target = ckpt.checkpoint_path(self.run_dir, step)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            cp = self.open[step] = _Checkpoint(step, PendingDirectory(target, "the checkpoint"))
        return cp

    def _send_part(self, cp: _Checkpoint, requests: dict[int, dict], part: str) -> None:
        def done(job: ExportJob) -> None:
            cp.parts += job.parts.items()
            cp.out -= 1
            self._commit_if_complete(cp)

        cp.out += 1
        self._export(requests, cp.pending.path, done, part)

    def _checkpoint_model(self, step: int, m: str, layout: Layout) -> None:
        """Model `m`'s part of the checkpoint at boundary `step`, queued behind its training of step - 1: there
        the training state holds version `step` as its float32 master with its Adam state, whatever Comm/Reshard
        nodes do with the published copy (a Reshard may move it), and the workers keep the older versions later
        nodes may still read."""
        cp = self._open(step)
        requests: dict[int, dict] = defaultdict(lambda: {"masters": [], "window": [], "optimizer": []})
        for r in layout.ranks:  # each writes its share (`Holdings.writes` in worker/holdings.py)
            requests[r]["masters"].append([m, layout, step, ckpt.weights_key(m, step, "")])
            requests[r]["optimizer"].append([m, layout])
        cp.versions[m] = [step]
        for v in ckpt.kept_versions(step, self.plan.tau.get(m, 0)):
            kept = self.kept.get(m, {}).get(v)
            if v == step or kept is None:
                continue
            cp.versions[m].append(v)
            for r in kept.ranks:
                requests[r]["window"].append([m, v, ckpt.weights_key(m, v, "")])
        self._send_part(cp, dict(requests), m)

    def _seal(self, step: int) -> None:
        """The last part of the checkpoint at boundary `step`, once every trained model's part is asked for: every
        worker's RNG state. The index follows when all parts are written."""
        cp = self._open(step)
        cp.sealed = True
        self._send_part(cp, {r: {"rng": True} for r in range(self.pool.world)}, "")

    def _commit_if_complete(self, cp: _Checkpoint) -> None:
        """Write the index of a checkpoint whose parts are all in, rename it into place, prune to --keep."""
        if not cp.sealed or cp.out:
            return
        del self.open[cp.step]
        fields = {"step": cp.step, "identity": self.identity, "plan_hash": self.plan.hash,
                  "versions": {m: sorted(vs) for m, vs in sorted(cp.versions.items())},
                  "optimizer": sorted(cp.versions),
                  "metrics": {str(k): v for k, v in self.metrics.items() if k < cp.step}}
        start = time.perf_counter()
        ckpt.commit_checkpoint(cp.pending, [rep for _, rep in cp.parts], self.run_dir or "", self.keep, **fields)
        self.checkpoints.append(cp.pending.target)
        self._io_stat("checkpoint", cp.step, cp.parts, time.perf_counter() - start)

    def discard_open(self) -> None:
        """Remove the checkpoints still being written once the workers are stopped: a run that failed or was
        interrupted leaves its newest complete checkpoint, not the directory of one it had asked for (a part is
        asked for as its training is sent, so a training that fails has one)."""
        for cp in self.open.values():
            cp.pending.discard()
        self.open.clear()

    def collect_final(self, drain: Callable[[], None]) -> None:
        """The workers write the final version of every trained model (the retained weights) to
        RUN_DIR/final/ (or a temporary directory without a run directory); the controller reads it into
        `final_weights`."""
        finals: dict[str, tuple[Artifact, Layout]] = {}
        for a in self.plan.retained:
            h = self.routes.holdings.get(a)
            if a.kind != "weights" or h is None or h.layout is None:
                continue
            if a.name not in finals or a.index > finals[a.name][0].index:
                finals[a.name] = (a, h.layout)
        if not finals:
            return
        requests: dict[int, dict] = {}
        for m, (a, layout) in finals.items():
            key = ckpt.weights_key(m, None, "")
            if m in self.train_layout:  # the float32 master, not a serving copy a Reshard may have moved
                t_layout = self.train_layout[m]
                for r in t_layout.ranks:
                    requests.setdefault(r, {"masters": []}).setdefault("masters", []).append([m, t_layout, a.index, key])
                continue
            for r in layout.ranks:
                requests.setdefault(r, {"weights": []}).setdefault("weights", []).append([a.label, key])
        scratch = None if self.run_dir else tempfile.mkdtemp(prefix="rpeg-final-")
        target = ckpt.final_path(self.run_dir or scratch or "")
        try:
            pending = PendingDirectory(target, "the final weights")
            fields = {"identity": self.identity, "plan_hash": self.plan.hash,
                      "versions": {m: a.index for m, (a, _) in finals.items()},
                      "metrics": {str(k): v for k, v in self.metrics.items()}}

            def write(job: ExportJob) -> None:
                start = time.perf_counter()
                ckpt.write_index(pending.path, ckpt.build_index(ckpt.FINAL_FORMAT, job.parts.values(), **fields))
                pending.commit()
                self._io_stat("final", self.plan.steps, list(job.parts.items()), time.perf_counter() - start)

            self._export(requests, pending.path, write)
            drain()
            self.final_weights = ckpt.load_final(target)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
