"""Where the torch backend's workers keep their tensors, and which torch.distributed backend joins them
(docs/architecture.md, Runtime: the same code runs on CPUs with gloo and on GPUs with NCCL, launched locally or by
torchrun / Slurm).

gloo: every tensor of a worker is on the CPU. NCCL: every tensor a worker computes with or communicates
(models, parameters, Adam state, KV caches, data pieces, communication buffers) is on `cuda:LOCAL`, the
worker's GPU on its node, which `worker_device` picks once and the worker threads through everything it
builds. What leaves a worker for the controller (results, exports, checkpoints) is copied to the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

import torch

from rpegc.core.ir.errors import RpegError

if TYPE_CHECKING:
    from rpegc.runtime.plan import RunPlan

DIST_BACKENDS = ("gloo", "nccl")
DIST_BACKEND_CHOICES = ("auto",) + DIST_BACKENDS
CPU = torch.device("cpu")

# The launchers' names for a process's index on its node: torchrun's first (torchrun inside a Slurm
# allocation sets both, and SLURM_LOCALID then counts torchrun agents, not workers).
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID")
RANK_VARS = ("RANK", "SLURM_PROCID")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS")


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> Optional[int]:
    for name in names:
        value = env.get(name, "")
        if value.strip():
            try:
                return int(value)
            except ValueError:
                raise RpegError(None, f"environment variable {name}={value!r} is not an integer; the "
                                "launcher sets it to this process's index") from None
    return None


def local_rank(rank: int, env: Mapping[str, str], device_count: int) -> int:
    """The worker's index on its node: the launcher's LOCAL_RANK or SLURM_LOCALID, else (the local
    launcher, which starts every worker on this node and passes an empty `env`) rank modulo the GPUs."""
    found = _first_int(env, LOCAL_RANK_VARS)
    if found is not None:
        return found
    return rank % device_count if device_count > 0 else 0


def worker_device(dist_backend: str, rank: int, env: Mapping[str, str],
                  device_count: Optional[int] = None) -> torch.device:
    """The device of worker `rank`: the CPU for gloo, `cuda:local_rank` for NCCL (one GPU per worker:
    NCCL refuses two ranks on one GPU). `device_count` defaults to what torch sees on this node."""
    if dist_backend != "nccl":
        return CPU
    count = torch.cuda.device_count() if device_count is None else device_count
    if count < 1:
        raise RpegError(None, "the nccl backend needs a CUDA device, but torch sees none on this node; "
                        "run with --dist-backend gloo")
    local = local_rank(rank, env, count)
    if not 0 <= local < count:
        raise RpegError(None, f"local rank {local} has no GPU of its own (torch sees {count} CUDA "
                        "device(s) on this node); start at most one worker per GPU")
    return torch.device("cuda", local)


def rank_and_world(env: Mapping[str, str]) -> tuple[int, int]:
    """(rank, world size) as torchrun (RANK, WORLD_SIZE) or srun (SLURM_PROCID, SLURM_NTASKS) set them;
    -1 and 0 where neither says."""
    rank, world = _first_int(env, RANK_VARS), _first_int(env, WORLD_VARS)
    return (-1 if rank is None else rank), (0 if world is None else world)


def choose_dist_backend(requested: str, workers_here: Optional[int], cuda_count: int) -> str:
    """gloo or nccl for a run asking for `requested` (auto, gloo, nccl), where `workers_here` workers need
    a GPU of their own on this host that sees `cuda_count` CUDA devices. None: the workers start on other
    hosts and check their own GPUs (an explicit nccl is taken as it is; auto then asks for one GPU here).
    auto takes nccl when the GPUs suffice, else gloo; an explicit nccl that cannot work is an error."""
    if requested not in DIST_BACKEND_CHOICES:
        raise RpegError(None, f"unknown distributed backend '{requested}'; use {', '.join(DIST_BACKEND_CHOICES)}")
    need = 1 if workers_here is None else max(1, workers_here)
    if requested == "auto":
        return "nccl" if cuda_count >= need else "gloo"
    if requested == "gloo" or workers_here is None:
        return requested
    if cuda_count < 1:
        raise RpegError(None, "--dist-backend nccl needs CUDA devices, but torch sees none on this host; "
                        "use --dist-backend gloo (or auto)")
    if cuda_count < need:
        raise RpegError(None, f"--dist-backend nccl runs one worker per GPU: the plan starts {workers_here} workers "
                        f"on this host but torch sees {cuda_count} CUDA device(s); use --dist-backend gloo "
                        "or a plan with fewer devices")
    return requested


def plan_dist_backend(plan: RunPlan, requested: str, launcher: str) -> str:
    """gloo or nccl for a run of `plan` (`choose_dist_backend`). Locally launched workers all run on this host, one
    GPU each under NCCL; externally launched ones run elsewhere and check their own GPUs, so here only auto looks at
    this host's GPUs (against a node of the plan's cluster: the controller usually shares a node with workers)."""
    here: Optional[int] = len(plan.devices)
    if launcher == "external":
        cluster = plan.program.cluster
        here = min(here, cluster.gpus) if requested == "auto" and cluster is not None else None
    return choose_dist_backend(requested, here, torch.cuda.device_count())


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a node is done when its kernels are)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_cpu(obj):
    """`obj` with every tensor in it (nested dicts, lists, tuples) on the CPU, for the controller."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


__all__ = ["DIST_BACKENDS", "DIST_BACKEND_CHOICES", "CPU", "local_rank", "worker_device", "rank_and_world",
           "choose_dist_backend", "synchronize", "to_cpu"]
