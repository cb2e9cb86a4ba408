"""The torch backend: worker processes that train for real (docs/architecture.md, Runtime; paper Sec. VII and App. B).

Rooms (each module imports torch itself, so importing this package does not; `SPEC` below is what rpeg-run reads):
- `controller/`: `backend` (`TorchBackend`: dispatch, completions, parameter copies), `pool` (the worker processes,
  the control channel, health), `routing` (layouts, rows, where each shard is held, the commands that move them),
  `inbox` (worker reports), `processes` (the fork server and what it leaves), `memory_check`, `device` (gloo/CPU or
  NCCL/GPU), `pinning`, `verifier_pool` and `options` (rpeg-run's options of this backend)
- `channel/`: `messages` (sealed, schema-checked commands and reports), `worker_setup` (what a worker is told at
  start)
- `worker/`: `process` (the worker's command loop and entry points) and its parts: `holdings` (the copies, models
  and training states it holds; install, keep, release), `transfers` (rows and weights to and from other workers),
  `operators` (Op nodes and fusions), `step_inputs` (a step's prompts), `train_states`, `shard_writer` (its
  checkpoint files); `env` (set before torch loads), `sender`, `interleave` (fused members' threads), `peak_memory`
  and `host_memory`
- `model/`: `transformer`, `hf` and `hf_rope` (Hugging Face checkpoints), `generation`, `master_weights`
- `parallel/`: `layout` (shards, routes and ZeRO shares), `parallel_model` (one rank's share of a model),
  `tensor_parallel`, `pipeline` (links between stages), `schedules` (pipelined inference, generation, 1F1B
  training), `megatron_compat`
- `rl/`: `step` (the RL math of one step), `algorithms/` (PPO, GRPO, DPO), `hyperparameters`, `prompts` (a dataset
  file or a toy task), `datasets`, `tasks`, `rewards`, `finite`, and `reference` (the single-process oracle at
  tau = 0)
- `checkpoints/`: `run_dir` (the run directory's names), `shard_files` (checkpoint files and final weights),
  `exports` (the controller's requests for them at step boundaries), `hf_export` (`rpeg-run export`),
  `safetensors_stream`
- `run_config` (`RunConfig`: what one run trains, read by the controller, the workers and the oracle)
"""

from __future__ import annotations

import argparse
import math
import os

from rpegc.core.ir.errors import RpegError
from rpegc.outputs import Output
from rpegc.runtime.backends.base import BackendSpec
from rpegc.runtime.backends.torch.controller.options import LR_MAX, TorchOptions
from rpegc.runtime.backends.torch.checkpoints.run_dir import CHECKPOINT_DIR, FINAL, WORKER_LOGS
from rpegc.runtime.trackers import KINDS, NONE, check_installed, parse_log


def _add_options(t: argparse._ArgumentGroup) -> None:
    t.add_argument("--run-dir", metavar="DIR", help="checkpoints, worker logs and final weights go here")
    t.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="checkpoint every N RL steps (default 1 with --run-dir, else none)")
    t.add_argument("--keep-checkpoints", type=int, default=None, metavar="N",
                   help="keep the newest N complete checkpoints in the run directory (default 2, N >= 1)")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="a fresh run in a --run-dir where an earlier run left checkpoints, final weights or metrics "
                        "replaces them (without it such a run is refused)")
    t.add_argument("--tp-impl", choices=("auto", "megatron", "torch"), default="auto",
                   help="tensor parallelism: megatron-core layers (auto: when importable) or plain torch.distributed")
    t.add_argument("--dist-backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="torch.distributed backend of the workers: gloo (CPU tensors) or nccl (one GPU per worker); "
                        "auto: nccl when this host has a CUDA device for every worker, else gloo")
    t.add_argument("--store", metavar="HOST:PORT", default=None,
                   help="launch no workers: serve the control store at HOST:PORT and wait for one worker per "
                        "device, started by torchrun or Slurm on any node as `python -m "
                        "rpegc.runtime.backends.torch.worker.process --store HOST:PORT` (RANK and WORLD_SIZE from the "
                        "environment) and --secret-file PATH")
    t.add_argument("--secret-file", metavar="PATH", default=None,
                   help="with --store: where to write the run's control secret (mode 0600; default "
                        "RUN_DIR/control-secret, else a private temporary file); every worker must read it, "
                        "through --secret-file PATH or RPEG_RUN_SECRET_FILE=PATH; it is removed when the run ends")
    t.add_argument("--no-memory-check", action="store_true",
                   help="launch even if the cost model's memory estimate of a worker exceeds its device "
                        "(its share of host RAM on CPU, its GPU under NCCL)")
    t.add_argument("--lr", type=float, default=None, help="learning rate of actor and critic (default: the toy 5e-3)")
    t.add_argument("--rl-config", metavar="TOML", default=None,
                   help="RL hyper-parameters: a flat TOML table of RLConfig fields (clip_eps, kl_coef, ppo_epochs, "
                        "temperature, adam_eps, ...; runtime/backends/torch/rl/hyperparameters.py)")
    t.add_argument("--rl", metavar="NAME=VALUE", action="append", default=None,
                   help="set one RL hyper-parameter (repeatable; overrides --rl-config; --lr overrides both)")
    t.add_argument("--reward", metavar="SPEC", default=None,
                   help="what the reward vertex scores with: rule (the toy task's rule; the default without --data), "
                        "model (the frozen reward model), or a function of the response text: exact_match, math, "
                        "module:function, file.py:function or an entry point of group rpegc.rewards "
                        "(runtime/backends/torch/rl/rewards.py)")
    t.add_argument("--data", metavar="FILE", default=None,
                   help="train on the prompts of a JSONL or Parquet file (its rules: the [data] table of --rl-config "
                        "or --rl data.NAME=VALUE; runtime/backends/torch/rl/datasets.py); default: the toy --task")
    t.add_argument("--task", choices=("pattern", "reverse"), default="pattern",
                   help="the built-in toy task without --data (default pattern)")
    trackers = "; ".join(f"{k.name}: {k.help}" for k in KINDS.values())
    t.add_argument("--log", metavar="TRACKERS", default=None,
                   help="with --run-dir: also send metrics.jsonl's per-step values and the run's config to these "
                        f"experiment trackers, comma-separated ({trackers}); {NONE}: metrics.jsonl only (default: "
                        "tensorboard when its package is installed)")


def _check(o: TorchOptions) -> None:
    if o.checkpoint_every is not None and o.checkpoint_every < 1:
        raise RpegError(None, f"--checkpoint-every {o.checkpoint_every}: checkpoint every N >= 1 steps "
                              "(leave the option out for no checkpoints without --run-dir)")
    if o.lr is not None and not (math.isfinite(o.lr) and 0 < o.lr <= LR_MAX):
        raise RpegError(None, f"--lr {o.lr}: give a learning rate in (0, {LR_MAX:g}]")
    if o.overwrite and not o.run_dir:
        raise RpegError(None, "--overwrite replaces an earlier run in --run-dir DIR; give --run-dir (--resume "
                              "continues a run instead)")
    _check_log(o)
    if o.secret_file and os.path.lexists(o.secret_file):
        raise RpegError(None, f"--secret-file {o.secret_file}: the file exists; the run writes its control secret "
                              "there and removes it at the end, so name a path that does not exist")


def _check_log(o: TorchOptions) -> None:
    """--log: known tracker names, a run directory to write under, and each tracker's package installed."""
    if o.log is None:
        return
    names = parse_log(o.log)
    if names and not (o.run_dir or o.resume):
        raise RpegError(None, f"--log {o.log}: the trackers write under the run directory; give --run-dir DIR")
    check_installed(names)


def _inputs(o: TorchOptions) -> list[str]:
    return [f for f in (o.data, o.rl_config) if f]


def _outputs(o: TorchOptions) -> list[Output]:
    """The run directory's final weights, checkpoints and worker logs (--run-dir, or --resume's directory), and
    --secret-file."""
    run_dir = o.resume or o.run_dir
    secret = [Output(o.secret_file, "the control secret", make_parents=False)] if o.secret_file else []
    if run_dir is None:
        return secret
    return [Output(os.path.join(run_dir, FINAL), "the run directory's final weights", directory=True,
                   make_parents=True),
            Output(os.path.join(run_dir, CHECKPOINT_DIR), "the run directory's checkpoints", directory=True,
                   make_parents=True),
            Output(os.path.join(run_dir, WORKER_LOGS), "the run directory's worker logs", directory=True,
                   make_parents=True)] + secret


def _create(o: TorchOptions):
    if o.resume and o.run_dir:
        raise RpegError(None, "--resume DIR continues the run in DIR; do not also give --run-dir")
    try:
        from rpegc.runtime.backends.torch.controller.backend import TorchBackend
    except ModuleNotFoundError as e:
        raise RpegError(None, f"cannot load the torch backend: {e}; install the runtime extras "
                              "(pip install 'rpegc[runtime]') or use --backend sim") from None
    except ImportError as e:
        raise RpegError(None, f"cannot load the torch backend: {e}; use --backend sim") from None
    return TorchBackend.from_options(o)


SPEC = BackendSpec(name="torch", help="worker processes that train the models for real (torch.distributed)",
                   options=TorchOptions, add_options=_add_options, check=_check, create=_create,
                   inputs=_inputs, outputs=_outputs)
