"""Checkpoints of a torch-backend run and the plan that resumes from one (DESIGN.md Section 7; issue 8:
"--resume restarts from the last checkpoint (weights, optimizer state, step, RNG)").

A checkpoint is taken at a step boundary s: every training node of steps < s has completed. It holds,
per trained model, the full (unsharded) weights of every version a node of step >= s may still read
(versions s - tau(m) .. s) and the full Adam state after version s, the run's seed, the plan hash, the
torch RNG state of every worker and the metrics of the steps done. Rollouts draw from counter-based
generators seeded by (seed, step, sequence), so the seed and the step fix all sampling from s on.

Resuming executes `resume_plan(plan, s)`: the nodes of steps >= s with their dependencies among
themselves. Every artifact they read that no remaining node produces (a weights version made by a
training node before s) becomes an initial artifact, installed from the checkpoint in the layout its
readers use, so the workers, layouts and reduction orders of the uninterrupted run are reproduced and
the final weights match it.

Files: RUN_DIR/checkpoints/step-000004.pt (written atomically), RUN_DIR/final.pt (final weights).
"""

from __future__ import annotations

import glob
import os
from typing import Optional

import torch

from rpegc.core.errors import Loc, RpegError
from rpegc.outputs import PendingOutput
from rpegc.runtime.plan import RunPlan
from rpegc.runtime.torch_backend.layout import Layout, rank_pieces

FORMAT = "rpeg-torch-checkpoint/1"
CHECKPOINT_DIR = "checkpoints"
FINAL = "final.pt"


def checkpoint_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, f"step-{step:06d}.pt")


def save_checkpoint(run_dir: str, data: dict) -> str:
    """Write `data` (with "step") as the checkpoint of its step boundary; atomic (tmp file + rename)."""
    path = checkpoint_path(run_dir, data["step"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with PendingOutput(path, "the checkpoint") as tmp:
        torch.save({"format": FORMAT, **data}, tmp)
    return path


def clear_run_dir(run_dir: str) -> None:
    """A fresh run owns its directory: drop the checkpoints and final weights of an earlier run there."""
    for path in glob.glob(os.path.join(run_dir, CHECKPOINT_DIR, "step-*.pt")) + [os.path.join(run_dir, FINAL)]:
        if os.path.exists(path):
            os.remove(path)


def latest_checkpoint(run_dir: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(run_dir, CHECKPOINT_DIR, "step-*.pt")))
    return files[-1] if files else None


def load_checkpoint(path: str) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)  # the controller may have no GPU
    except (OSError, RuntimeError, EOFError) as e:
        raise RpegError(Loc(path, 0, 0), f"cannot read the checkpoint: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RpegError(Loc(path, 0, 0), f"not a torch-backend checkpoint (format {FORMAT})")
    return data


def find_resume_checkpoint(run_dir: str, plan: RunPlan, seed: int) -> tuple[str, dict]:
    """The latest checkpoint in `run_dir`, checked against the plan and seed being resumed."""
    final = os.path.join(run_dir, FINAL)
    if os.path.exists(final) and torch.load(final, map_location="cpu", weights_only=False).get("plan_hash") == plan.hash:
        raise RpegError(Loc(final, 0, 0), "this run already finished (its final weights are here); "
                        "nothing to resume")
    path = latest_checkpoint(run_dir)
    if path is None:
        raise RpegError(Loc(run_dir, 0, 0), "no checkpoint to resume from (expected checkpoints/step-*.pt); "
                        "run with --run-dir DIR --checkpoint-every N first")
    data = load_checkpoint(path)
    if data["plan_hash"] != plan.hash:
        raise RpegError(Loc(path, 0, 0), f"the checkpoint was written by plan {data['plan_hash'][:12]}, not by "
                        f"{plan.hash[:12]}; resume with the plan the run started with")
    if data["seed"] != seed:
        raise RpegError(Loc(path, 0, 0), f"the checkpoint was written with --seed {data['seed']}, not {seed}; "
                        "resume with the same seed")
    if data["step"] >= plan.steps:
        raise RpegError(Loc(path, 0, 0), f"the checkpoint is at step {data['step']}, the run has {plan.steps} "
                        "step(s): nothing left to resume")
    return path, data


def resume_plan(plan: RunPlan, step: int) -> RunPlan:
    """The plan restricted to the nodes of steps >= `step` (`RunPlan.from_step`)."""
    return plan.from_step(step)


def assemble(shapes: dict[str, tuple[int, ...]], layers: int, layout: Layout,
             shards: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full tensors from the shards of the ranks of replica 0 of `layout` (every piece once)."""
    full = {n: torch.empty(s) for n, s in shapes.items()}
    for r in layout.replica(0):
        for name, piece in rank_pieces(shapes, layout, r, layers).items():
            dst = full[name] if piece.dim is None else full[name].narrow(piece.dim, piece.lo, piece.hi - piece.lo)
            dst.copy_(shards[r][name])
    return full


def assemble_optimizer(shapes: dict[str, tuple[int, ...]], layers: int, layout: Layout,
                       states: dict[int, dict[str, dict]]) -> dict[str, dict]:
    """Full Adam state per parameter from the sharded states of replica 0 (tensors placed like the
    parameter's pieces; scalars such as the step count taken as they are)."""
    out: dict[str, dict] = {}
    for r in layout.replica(0):
        pieces = rank_pieces(shapes, layout, r, layers)
        for name, state in states[r].items():
            piece, slot = pieces[name], out.setdefault(name, {})
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    t = slot.setdefault(k, torch.empty(shapes[name], dtype=v.dtype))
                    (t if piece.dim is None else t.narrow(piece.dim, piece.lo, piece.hi - piece.lo)).copy_(v)
                else:
                    slot[k] = v.clone() if isinstance(v, torch.Tensor) else v
    return out


def kept_versions(step: int, tau: int) -> range:
    """Versions of a model with staleness `tau` that nodes of steps >= `step` may read."""
    return range(max(0, step - tau), step + 1)


__all__ = ["FORMAT", "FINAL", "clear_run_dir", "checkpoint_path", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "find_resume_checkpoint", "resume_plan", "kept_versions", "assemble", "assemble_optimizer"]
