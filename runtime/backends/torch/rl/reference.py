"""The single-process reference trainer: whole-batch PPO / GRPO steps, the oracle for the torch backend.

Paper Sec. II (the RL step: generation, reference/old log-probs, reward, values, advantages, actor and
critic updates), Sec. IV (bounded staleness: a consumer at step k uses version max(0, k - tau(m)))
and App. B (hyper-parameters). Every stage is one of the functions in `generation` and `rl`, called
on the whole batch; a distributed worker calls the same functions on its shard with the global token
count, so at tau = 0 any legal plan must reproduce `run_reference` within float tolerance.

Seeds: model weights from `derive_seed(seed, role)` (the reference model shares the actor's seed, so
it is the initial actor), or version 0 read from a model's Hugging Face checkpoint (`hf.initial_model`);
prompts from the prompt source's `batch(B, seed, k)` (a toy task's random prompts or a dataset's seeded
epochs, runtime/backends/torch/rl/datasets.py); sampling from `sequence_seed(seed, k, g)` for global sequence g.

Precision (`workload.dtype`, through `models.serving_dtype` and `master_weights.training_dtype`): trained
models compute in the training dtype over float32 master weights and float32 Adam state (bf16 mixed precision
for a bf16 workload, float32 for fp32). Every published version is a copy of the working weights in the
serving dtype, and the models that serve generation and inference (the stale actor/critic, the reference and
reward models) run their forward in that dtype; their heads return float32, so sampling, log-probs and the
losses are float32. The workers cast in the same places, so tau = 0 equivalence holds in bf16 too, step by
step: from the same serving copy, DP/PP serving splits rows only (on the CPU kernel paths tested, a
sequence's bf16 forward does not depend on its call's row count), TP sums partial products in another order;
bf16 training sums its bf16 gradients over microbatches and replicas in another order (tests/test_torch_bf16.py
derives the bounds). Across steps it does not compound: a published copy is bf16(master), a discontinuous
function of a master known to rounding noise only, so an independently trained reference may serve copies one
bf16 ulp apart in a few entries from step 1 on (tests/test_torch_bf16.py compares each step from the run's own
checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from rpegc.runtime.backends.torch.run_config import RunConfig, check_run_config


@dataclass
class ReferenceResult:
    """Per-step metrics and the final weights of every trained model ("actor", "critic")."""

    metrics: list[dict[str, float]]
    weights: dict[str, dict[str, Tensor]] = field(default_factory=dict)


def run_reference(cfg: RunConfig, steps: int, seed: int) -> ReferenceResult:
    """Run `steps` RL steps from scratch; per-step metrics and the final weights."""
    check_run_config(cfg)
    trainer = cfg.alg.reference_trainer(cfg, seed)
    metrics = [trainer.step(k) for k in range(steps)]
    return ReferenceResult(metrics=metrics, weights=trainer.weights())
