"""What a run's checkpoint costs: the shard files each worker writes at a checkpoint boundary (issue 36).

A checkpoint is not an operator of the plan: its cadence is the run's (`rpeg-run --checkpoint-every N`), so the
schedule leaves it out and the run's prediction adds it (runtime/report.py). The torch backend's workers write it
themselves (runtime/backends/torch/checkpoints/exports.py), in their queues right behind the training that makes it
due: at boundary k + 1 every rank of a trained model's training layout writes one file of the pieces its
data-parallel replica owns, as float32 masters with their Adam moments (m, v and the step count: a tensor each), plus
the older versions later nodes may still read under staleness tau; then every worker writes one file of its RNG
state. The older versions are copies the ranks keep as each is trained (`version_kept`): min(tau, every) of them per
checkpoint of a run that checkpoints every `every` steps. Per rank:

  bytes   = W_shard / P_d * (12 + 4 tau)       (master, m, v: 4 B each; tau kept float32 versions)
  tensors = n_stage / P_d * (4 + tau)          (master, m, v, step; tau versions)
  T_rank  = files * t_file + tensors * t_tensor + bytes / rate
            + min(tau, every) * (n_stage / P_d * t_keep_tensor + 4 W_shard / P_d / keep_rate)

with W_shard the worst pipeline stage's parameters at the training placement's (P_p, P_t) (memory.weight_shard, and
the (Lp + Lr) x d learned position embedding the backend gives a model without a checkpoint; the replicas split a
stage's pieces whole, so a rank's share is 1/P_d of it up to one piece), n_stage the parameter
tensors of that stage as the backend's model has them (`stage_tensors`), `t_file` the fixed time of one file (open,
fsync, close), `t_tensor` of one tensor in it (its header entry, hashing and write call) and `rate` the bytes per
second of the serialise + write + fsync and the part's report ([host] checkpoint_file, checkpoint_tensor and
checkpoint_rate, which rpeg-calibrate measures with the backend's own writer, as a run writes a checkpoint's parts; a
small model's checkpoint is mostly per-tensor work), and t_keep_tensor and keep_rate those of a kept copy ([host]
checkpoint_keep_tensor and checkpoint_keep_rate; left out, keeps cost nothing). The
ranks write in parallel and each blocks its worker while it writes, but the ranks of one node share its disk: the part
of a write that is the disk's (its bytes at [host] checkpoint_disk_rate) waits for the other ranks' parts of the same
node. So a rank finishes at worst after its own write and the disk parts of the node's other writes,

  T_node = max over its ranks r of  T_rank(r) + (bytes of the node's other ranks) / disk_rate

(the serialisation and hashing run on each worker's core, the write-back does not: docs/calibration.md, "The disk a
node's writers share"), and a checkpoint costs its slowest node's T_node. A profile without the disk rate
prices the ranks of a node as independent. Once every part is in, the run's controller commits the checkpoint (its
index, an entry per tensor of every rank's files; the directory renamed into place; the oldest pruned) and dispatches
nothing meanwhile, which the step pays too:

  T_commit = t_commit + (tensors of every rank) * t_commit_tensor    ([host] checkpoint_commit, _commit_tensor)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from rpegc.core.cost.hardware import Hardware
from rpegc.core.cost.memory import weight_shard
from rpegc.core.cost.params import LM_HEAD_KINDS, SCALAR_HEAD_KINDS
from rpegc.core.ir.program import Arch, Program

STATE_BYTES = 12  # per parameter: the float32 master and Adam's two moments
VERSION_BYTES = 4  # per parameter of each older version kept under staleness (float32)
STATE_TENSORS = 4  # per parameter tensor: the master, Adam's two moments and its step count


@dataclass(frozen=True)
class RankWrite:
    """What one device's worker writes at a checkpoint: shard files, their tensors and bytes, and the tensors and
    bytes of the versions it keeps copies of for it (none where no model it trains is stale)."""

    device: int
    files: int
    tensors: float
    bytes: float
    keep_tensors: float = 0.0
    keep_bytes: float = 0.0


def layer_tensors(arch: Arch) -> int:
    """Parameter tensors of one layer of the backend's model (runtime/backends/torch/model/transformer.py): the four
    attention projections, their q/k/v biases, the q/k norms, the FFN's projections and the layer's norms."""
    return (4 + 3 * arch.qkv_bias + 2 * arch.qk_norm + (3 if arch.gated else 2) + (4 if arch.post_norms else 2))


def stage_tensors(arch: Arch, kind: str, pp: int, positions: bool = False) -> float:
    """Parameter tensors of the worst pipeline stage of `pp`: its layers', and the embedding (and the learned position
    embedding, `positions`) on the first, the final norm and the head (an untied LM head, a value head's weight and
    bias) on the last."""
    first = 1 + positions
    last = 1 + (kind in LM_HEAD_KINDS) + 2 * (kind in SCALAR_HEAD_KINDS)
    ends = first + last if pp == 1 else max(first, last)
    return math.ceil(arch.layers / pp) * layer_tensors(arch) + ends


def rank_writes(p: Program, every: int = 1) -> tuple[RankWrite, ...]:
    """Each plan device's files and bytes at a checkpoint boundary of a run that checkpoints every `every` steps (the
    module docstring), ascending by device; the devices of the cluster the plan places nothing on write nothing
    (their workers are not started)."""
    if p.plan is None or p.graph is None or p.cluster is None:
        return ()
    state: dict[int, float] = {}
    tensors: dict[int, float] = {}  # beside the RNG state's one
    files: dict[int, int] = {}
    keep_tensors: dict[int, float] = {}
    keep_bytes: dict[int, float] = {}
    for pl in p.plan.placements:
        devices = pl.alloc.devices(p.cluster)
        for d in devices:
            files.setdefault(d, 1)  # its RNG state
        vertex = p.graph.vertex(pl.vertex)
        if vertex.role != "training":
            continue
        model = p.model(vertex.model)
        s = pl.strategy
        tau = p.graph.tau(model.name)
        learned = not model.rope  # a learned position embedding is trained state
        positions = learned * (p.workload.Lp + p.workload.Lr) * model.arch.hidden
        share = (float(weight_shard(model.arch, model.kind, s.pp, s.tp)) + positions) / s.dp
        pieces = stage_tensors(model.arch, model.kind, s.pp, learned) / s.dp
        for d in devices:
            state[d] = state.get(d, 0.0) + share * (STATE_BYTES + VERSION_BYTES * tau)
            tensors[d] = tensors.get(d, 0.0) + pieces * (STATE_TENSORS + tau)
            files[d] += 1
            keeps = min(tau, every)
            keep_tensors[d] = keep_tensors.get(d, 0.0) + keeps * pieces
            keep_bytes[d] = keep_bytes.get(d, 0.0) + keeps * share * VERSION_BYTES
    return tuple(RankWrite(d, files[d], tensors.get(d, 0.0) + 1, state.get(d, 0.0), keep_tensors.get(d, 0.0),
                           keep_bytes.get(d, 0.0)) for d in sorted(files))


def rank_write_time(w: RankWrite, hw: Hardware) -> float:
    """T_rank = files * t_file + tensors * t_tensor + bytes / rate, and the copies of its kept versions."""
    assert hw.checkpoint_rate is not None
    write = w.files * hw.checkpoint_file + w.tensors * hw.checkpoint_tensor + w.bytes / hw.checkpoint_rate
    if hw.checkpoint_keep_rate is None:
        return write
    return write + w.keep_tensors * hw.checkpoint_keep_tensor + w.keep_bytes / hw.checkpoint_keep_rate


def node_write_time(writes: Sequence[RankWrite], hw: Hardware) -> float:
    """T_node of the ranks of one node: each rank's T_rank after the disk parts of the others' bytes."""
    total = sum(w.bytes for w in writes)
    per_byte = 0.0 if hw.checkpoint_disk_rate is None else 1.0 / hw.checkpoint_disk_rate
    return max((rank_write_time(w, hw) + (total - w.bytes) * per_byte for w in writes), default=0.0)


def checkpoint_time(p: Program, hw: Hardware, every: int = 1) -> Optional[float]:
    """Seconds one checkpoint of `p`'s run, which checkpoints every `every` steps, blocks its slowest worker; None
    where the profile does not price writes ([host] checkpoint_rate left out)."""
    if hw.checkpoint_rate is None:
        return None
    nodes: dict[int, list[RankWrite]] = {}
    for w in rank_writes(p, every):
        nodes.setdefault(w.device // p.cluster.gpus, []).append(w)  # flat device ids: a node's gpus in a row
    return max((node_write_time(ws, hw) for ws in nodes.values()), default=0.0)


def commit_time(p: Program, hw: Hardware, every: int = 1) -> float:
    """Seconds the run's controller takes to commit one checkpoint of `p`'s run once its parts are in: its index (an
    entry per tensor of every rank's files), the directory's rename into place and the pruning ([host]
    checkpoint_commit, checkpoint_commit_tensor; 0 where the profile leaves them out). The control loop dispatches
    nothing meanwhile, so the step it falls in takes that much longer."""
    return hw.checkpoint_commit + hw.checkpoint_commit_tensor * sum(w.tensors for w in rank_writes(p, every))


def checkpoint_due(boundary: int, steps: int, every: int) -> bool:
    """Whether a run of `steps` steps that checkpoints every `every` steps (0: never) writes one at `boundary` (k + 1,
    after step k's training): never after the last step, where the final weights are written instead."""
    return every > 0 and boundary % every == 0 and boundary < steps


def version_kept(version: int, tau: int, steps: int, every: int) -> bool:
    """Whether the workers keep a copy of a trained model's `version` (staleness `tau`) for a later checkpoint: one
    at a boundary in (version, version + tau] saves it beside its newer master, for nodes after it still read it."""
    return any(checkpoint_due(b, steps, every) for b in range(version + 1, version + tau + 1))


def checkpoint_steps(first: int, steps: int, every: int) -> tuple[int, ...]:
    """The step boundaries a run of steps [first, steps) checkpoints at (`checkpoint_due`)."""
    return tuple(b for b in range(first + 1, steps) if checkpoint_due(b, steps, every))
