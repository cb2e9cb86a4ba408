"""rpeg-run's options of the torch backend, declared once: each field carries its help and its spelling on the
command line (`runtime/backends/options.py` makes the argparse options from them); the backend registry hands an
instance to `TorchBackend.from_options`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rpegc.runtime.backends.options import cli_option
from rpegc.runtime.trackers import KINDS, NONE

_LOG_HELP = ("with --run-dir: also send metrics.jsonl's per-step values and the run's config to these experiment "
             f"trackers, comma-separated ({'; '.join(f'{k.name}: {k.help}' for k in KINDS.values())}); {NONE}: "
             "metrics.jsonl only (default: tensorboard when its package is installed)")


KEEP_CHECKPOINTS = 2  # complete checkpoints a run directory keeps by default


@dataclass(frozen=True)
class TorchOptions:
    """rpeg-run's options of the torch backend."""

    seed: int = cli_option(0, "rpeg-run's --seed: version 0 of every model and the sampling draws", cli=False)
    run_dir: Optional[str] = cli_option(None, "checkpoints, worker logs and final weights go here", metavar="DIR")
    checkpoint_every: Optional[int] = cli_option(
        None, "checkpoint every N RL steps (default 1 with --run-dir, else none)", metavar="N")
    keep_checkpoints: Optional[int] = cli_option(
        None, f"keep the newest N complete checkpoints in the run directory (default {KEEP_CHECKPOINTS}, N >= 1)",
        metavar="N")
    resume: Optional[str] = cli_option(None, "continue the run in DIR from its last checkpoint", metavar="DIR")
    overwrite: bool = cli_option(
        False, "a fresh run in a --run-dir where an earlier run left checkpoints, final weights or metrics replaces "
               "them (without it such a run is refused)")
    tp_impl: str = cli_option(
        "auto", "tensor parallelism: megatron-core layers (auto: when importable) or plain torch.distributed",
        choices=("auto", "megatron", "torch"))
    dist_backend: str = cli_option(
        "auto", "torch.distributed backend of the workers: gloo (CPU tensors) or nccl (one GPU per worker); auto: "
                "nccl when this host has a CUDA device for every worker, else gloo", choices=("auto", "gloo", "nccl"))
    store: Optional[str] = cli_option(
        None, "launch no workers: serve the control store at HOST:PORT and wait for one worker per device, started "
              "by torchrun or Slurm on any node as `python -m rpegc.runtime.backends.torch.worker.process --store "
              "HOST:PORT` (RANK and WORLD_SIZE from the environment) and --secret-file PATH", metavar="HOST:PORT")
    secret_file: Optional[str] = cli_option(
        None, "with --store: where to write the run's control secret (mode 0600; default RUN_DIR/control-secret, "
              "else a private temporary file); every worker must read it, through --secret-file PATH or "
              "RPEG_RUN_SECRET_FILE=PATH; it is removed when the run ends", metavar="PATH")
    no_memory_check: bool = cli_option(
        False, "launch even if the cost model's memory estimate of a worker exceeds its device (its share of host "
               "RAM on CPU, its GPU under NCCL)")
    lr: Optional[float] = cli_option(None, "learning rate of actor and critic (default: the toy 5e-3)")
    rl_config: Optional[str] = cli_option(
        None, "RL hyper-parameters: a flat TOML table of RLConfig fields (clip_eps, kl_coef, ppo_epochs, "
              "temperature, adam_eps, ...; runtime/backends/torch/rl/hyperparameters.py)", metavar="TOML")
    rl: Optional[list] = cli_option(
        None, "set one RL hyper-parameter (repeatable; overrides --rl-config; --lr overrides both)",
        metavar="NAME=VALUE", repeat=True)
    reward: Optional[str] = cli_option(
        None, "what the reward vertex scores with: rule (the toy task's rule; the default without --data), model "
              "(the frozen reward model), or a function of the response text: exact_match, math, module:function, "
              "file.py:function or an entry point of group rpegc.rewards (runtime/backends/torch/rl/rewards.py)",
        metavar="SPEC")
    data: Optional[str] = cli_option(
        None, "train on the prompts of a JSONL or Parquet file (its rules: the [data] table of --rl-config or --rl "
              "data.NAME=VALUE; runtime/backends/torch/rl/datasets.py); default: the toy --task", metavar="FILE")
    task: str = cli_option("pattern", "the built-in toy task without --data (default pattern)",
                           choices=("pattern", "reverse"))
    log: Optional[str] = cli_option(None, _LOG_HELP, metavar="TRACKERS")
