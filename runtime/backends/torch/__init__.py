"""The torch backend: worker processes that train for real (docs/architecture.md, Runtime; paper Sec. VII and App. B).

Rooms (each module imports torch itself, so importing this package does not; `SPEC` below is what rpeg-run reads):
- `controller/`: `backend` (`TorchBackend`: the Backend interface, start and shutdown), `run_description` (the run
  described once when it starts: its configuration, models, ranks, cores, fields and routes), `dispatch` (nodes and
  parameter copies as the workers' commands), `inflight` (the nodes sent and their reports, the workers' health),
  `run_record` (per-step metrics, reward statistics, the summary's notes), `pool` (the worker processes, the
  control channel), `routing` (layouts, rows, where each shard is held, the commands that move them), `inbox`
  (worker reports), `processes` (the fork server and what it leaves), `memory_check`, `device` (gloo/CPU or
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
  `zero` (its gradients' reduction over DP), `tensor_parallel`, `pipeline` (links between stages), `schedules` (pipelined inference, generation, 1F1B
  training), `megatron_compat`
- `rl/`: `step` (the RL math of one step), `algorithms/` (PPO, GRPO, DPO), `hyperparameters` (the user's RL and
  data settings), `bounds` (every bounded setting's range), `prompts` (a dataset file or a toy task), `datasets`,
  `tasks`, `rewards`, `finite`, and `reference` (the single-process oracle at tau = 0)
- `checkpoints/`: `run_dir` (the run directory's names), `run_claim` (a run's lock on it and the checkpoint it
  resumes from), `shard_files` (checkpoint files and final weights), `exports` (the controller's requests for them
  at step boundaries), `hf_export` (`rpeg-run export`), `safetensors_stream`
- `run_config` (`RunConfig`: what one run trains, read by the controller, the workers and the oracle)
"""

from __future__ import annotations

import math
import os

from rpegc.core.ir.errors import RpegError
from rpegc.outputs import Output
from rpegc.runtime.backends.base import BackendSpec
from rpegc.runtime.backends.torch.controller.options import TorchOptions
from rpegc.runtime.backends.torch.rl.bounds import LR_MAX
from rpegc.runtime.backends.torch.checkpoints.run_dir import CHECKPOINT_DIR, FINAL, WORKER_LOGS
from rpegc.runtime.trackers import check_installed, parse_log


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
                   options=TorchOptions, check=_check, create=_create,
                   inputs=_inputs, outputs=_outputs)
