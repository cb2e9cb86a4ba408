"""The pipelined schedules of one invocation on a `ParallelModel` (docs/cost-model-spec.md Sec. 3.3, [A6]):
inference (all microbatches forward, one broadcast of the results), generation (a decode wavefront through the
stages, tokens sent back to stage 0) and the training step (1F1B or GPipe with the gradient reductions of the
training's ZeRO stage, the owners' optimizer step and the weights' broadcast). `StageView` makes a stage look like a
TransformerModel to the single-process losses of `rl`."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.exec_graph import BACKWARD, FORWARD
from rpegc.runtime.backends.torch.model.generation import Rollout, Sampler, Sampling, check_generation
from rpegc.runtime.backends.torch.rl.finite import require_finite
from rpegc.runtime.backends.torch.worker.host_memory import release_freed
from rpegc.runtime.backends.torch.worker.interleave import FINISH, await_turn, current_member, microtask
from rpegc.runtime.backends.torch.parallel.layout import split_rows
from rpegc.runtime.backends.torch.model.transformer import LM_HEAD_KINDS, SCALAR_HEAD_KINDS, ModelOutput
from rpegc.runtime.backends.torch.model.master_weights import MasterWeights
from rpegc.runtime.backends.torch.rl.step import Experience, RLConfig
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel
from rpegc.runtime.backends.torch.parallel.pipeline import GRADIENT, TOKENS, StageLink

class StageView:
    """What `response_forward`, `last_token_scores` and the losses use of a TransformerModel, for
    microbatch j of a pipelined invocation whose microbatches have `rows` rows each.

    The last stage returns its heads' output; the other stages run their blocks and return zeros of the
    right shape (their results are replaced by the last stage's).
    """

    def __init__(self, pm: ParallelModel, link: StageLink, j: int, rows: Sequence[int]):
        self.pm, self.link, self.j, self.rows = pm, link, j, rows
        self.kind = pm.kind
        self.opts = pm.net
        self.records: list[tuple[Optional[Tensor], Tensor]] = []

    @property
    def has_lm_head(self) -> bool:
        return self.kind in LM_HEAD_KINDS

    @property
    def has_value_head(self) -> bool:
        return self.kind in SCALAR_HEAD_KINDS

    @property
    def training(self) -> bool:
        return self.pm.module.training

    def eval(self) -> "StageView":
        self.pm.module.eval()
        return self

    def train(self, mode: bool = True) -> "StageView":
        self.pm.module.train(mode)
        return self

    def __call__(self, tokens: Tensor, pads: Optional[Tensor] = None) -> ModelOutput:
        # one pass per microbatch: its messages are tagged by the microbatch alone
        assert not self.records, "a StageView runs one forward pass"
        pm = self.pm
        b, t = tokens.shape
        for i in range(self.j, len(self.rows)):  # every pass of the invocation has this length
            pm.expect_input(self.link, (i,), (self.rows[i], t))
        inp, out = pm.stage_forward(self.link, (self.j,), (b, t), tokens, grad=torch.is_grad_enabled(), pads=pads)
        self.records.append((inp, out))
        if pm.is_last:
            return pm.module.heads(out)
        # placeholders (an expanded zero: no vocabulary-wide tensor is allocated for them)
        zero = torch.zeros((), device=pm.device)
        return ModelOutput(values=zero.expand(b, t) if self.has_value_head else None,
                           computed=zero.expand(b, t, pm.arch.vocab) if self.has_lm_head else None)


Microbatch = Callable[[StageView], Tensor]


def infer(pm: ParallelModel, microbatches: Sequence[Microbatch], rows: Sequence[int]) -> Tensor:
    """Run each function of `microbatches` (e.g. response_forward(...).logprobs of its `rows[j]` rows) through
    the pipeline, pipelined; their results concatenated, on every stage (one broadcast at the end)."""
    link = StageLink(pm, len(microbatches))
    with torch.no_grad():
        results = [fn(StageView(pm, link, j, rows)) for j, fn in enumerate(microbatches)]
        link.close()
        return pm.from_last_stage(torch.cat(results))


@torch.no_grad()
def generate(pm: ParallelModel, prompts: Tensor, chunks: Sequence[tuple[int, int]], *, seed: int, step: int,
             max_new_tokens: int, sampling: Sampling = Sampling(), eos_id: Optional[int] = None,
             pad_id: int = 0, pads: Optional[Tensor] = None) -> Rollout:
    """`generation.generate` of the prompt rows [lo, hi) in microbatches `chunks` (global sequence
    indices, contiguous from lo; `prompts` holds rows lo..hi, left-padded by `pads`), pipelined over the
    stages; the rollouts on every stage.

    Every stage runs forward f (f = 0: the prompts; f > 0: the tokens sampled at step f-1) of
    microbatch 0, 1, ..., mb-1, then forward f+1, so while stage s works on microbatch j the next stage
    works on j-1 (a wavefront through the stages, step after step). The last stage samples with the
    per-sequence generators (`generation.generate`'s draws, so the tokens are the single-process ones)
    and sends only the token ids to stage 0, which feeds them to forward f+1; each stage posts the
    receives of forward f+1 when it starts forward f.
    """
    n, lp = prompts.shape
    check_generation(pm.kind in LM_HEAD_KINDS, pm.kind, sampling, max_new_tokens, lp, pm.net.max_seq)
    lo = chunks[0][0] if chunks else 0
    pm.module.eval()
    link = StageLink(pm, len(chunks))
    caches = [pm.new_cache(b - a, lp + max_new_tokens) for a, b in chunks]
    samplers = ([Sampler(range(a, b), seed, step, sampling, eos_id, pad_id, pm.device) for a, b in chunks]
                if pm.is_last else [])
    fed: list[Optional[Tensor]] = [None] * len(chunks)  # the last sampled tokens, where stage 0 is also the last

    def expect(f: int) -> None:
        """Post this stage's receives for forward f: its inputs, and on stage 0 the tokens that feed it."""
        for j, (a, b) in enumerate(chunks if f < max_new_tokens else ()):
            pm.expect_input(link, (f, j), (b - a, lp if f == 0 else 1))
            if f > 0 and pm.is_first and not pm.is_last:
                link.expect((b - a, 1), torch.int64, pm.last_rank, TOKENS, (f - 1, j))

    expect(0)
    for f in range(max_new_tokens):
        expect(f + 1)  # a step ahead: stage 0 runs at most one step ahead of the others
        for j, (a, b) in enumerate(chunks):
            tokens = None
            if pm.is_first:
                if f == 0:
                    tokens = prompts[a - lo:b - lo]
                elif pm.is_last:
                    tokens = fed[j]
                else:
                    tokens = link.recv((b - a, 1), torch.int64, pm.last_rank, TOKENS, (f - 1, j))
            rows_pads = None if pads is None else pads[a - lo:b - lo]
            _, out = pm.stage_forward(link, (f, j), (b - a, lp if f == 0 else 1), tokens, caches[j], pads=rows_pads)
            if not pm.is_last:
                continue
            with pm.event("sample", (f, j)):
                fed[j] = samplers[j].sample(pm.module.heads(out).logits[:, -1]).unsqueeze(-1)
            if f + 1 < max_new_tokens and not pm.is_first:
                link.send(fed[j], pm.first_rank, TOKENS, (f, j))
    link.close()
    shape = (n, max_new_tokens)
    responses = torch.zeros(shape, dtype=torch.int64, device=pm.device)
    logps, mask = torch.zeros(shape, device=pm.device), torch.zeros(shape, device=pm.device)
    if samplers:
        responses, logps, mask = (torch.cat(parts) for parts in zip(*(s.result() for s in samplers)))
    responses, logps, mask = (pm.from_last_stage(x) for x in (responses, logps, mask))
    return Rollout(sequences=torch.cat([prompts, responses], dim=1), responses=responses, logprobs=logps, mask=mask)


LossFn = Callable[[StageView, Experience], tuple[Tensor, dict[str, float]]]


def _microtask_order(pm: ParallelModel, schedule: str, n: int, fused) -> list[tuple[str, int]]:
    """This stage's forwards and backwards of n microbatches: 1F1B (pp - p - 1 warm-up forwards, then one forward
    and one backward, then the remaining backwards) or GPipe (every forward, then every backward); a fused member's
    as its fusion orders them on this stage (docs/stage-fusion.md)."""
    if fused is not None:
        order = fused[0].order(fused[1])
        if sorted(j for kind, j in order if kind == FORWARD) != list(range(n)):
            raise RpegError(None, f"this replica trains {n} microbatch(es) of the fused member, the plan's order has "
                               f"{sum(kind == FORWARD for kind, _ in order)}; give each replica at least mb rows")
        return order
    warmup = n if schedule == "gpipe" else min(pm.layout.pp - pm.p - 1, n)
    order = [(FORWARD, j) for j in range(warmup)]
    for j in range(n - warmup):
        order += [(FORWARD, warmup + j), (BACKWARD, j)]
    return order + [(BACKWARD, j) for j in range(n - warmup, n)]


def train_step(pm: ParallelModel, master: MasterWeights, loss_fn: LossFn, exp: Experience,
               microbatches: int, cfg: RLConfig, stat_keys: tuple[str, ...],
               schedule: str = "1f1b") -> tuple[dict[str, float], float]:
    """One optimizer step on this replica's rows `exp` in `microbatches` microbatches, on the pipeline schedule of
    its training (spec 3.3 and 6.2): 1F1B (at most min(mb, pp) microbatches' activations live on a stage): stage p
    runs the forwards of its pp - p - 1 warm-up microbatches, then alternates one forward and one backward, then runs
    the remaining backwards; GPipe: every forward, then every backward (all mb live). Microbatches go backward in
    order, so every stage accumulates its gradients in the order of pp = 1. `exp` is any batch with `len`,
    `rows(slice)` and `forward_rows` (rows of the forward pass per batch row: an Experience 1, DPO's PairRows 2,
    both sides of a pair). The gradients are reduced at the module's ZeRO stage (`ParallelModel.grads`,
    parallel/zero.py): ZeRO-2 inside each backward pass, every replica running `microbatches` of them (those it has
    no rows for reduce zeros), ZeRO-1 and ZeRO-0 after the last.

    Returns (statistics summed over microbatches and replicas, valid on the last stage; pre-clip norm).
    """
    n = len(exp)
    chunks = [c for c in split_rows(0, n, max(1, min(microbatches, n))) if c[1] > c[0]] if n else []
    pm.module.train()
    fused = current_member()
    link = StageLink(pm, len(chunks), namespace=0 if fused is None else fused[1])
    live: dict[int, tuple[Optional[Tensor], Optional[Tensor], Tensor]] = {}  # microbatch -> (loss, input, output)
    sums = torch.zeros(len(stat_keys), dtype=torch.float64, device=pm.device)
    rows = [exp.forward_rows * (hi - lo) for lo, hi in chunks]  # what each microbatch's forward pass carries

    def forward(j: int) -> None:
        lo, hi = chunks[j]
        view = StageView(pm, link, j, rows)
        loss, stats = loss_fn(view, exp.rows(slice(lo, hi)))
        release_freed()  # the forward's freed temporaries (host_memory.py), before the backward needs room
        inp, out = view.records[0]
        live[j] = (loss if pm.is_last else None, inp, out)
        if pm.is_last:
            sums.add_(torch.tensor([float(stats.get(k, 0.0)) for k in stat_keys], dtype=torch.float64,
                                   device=pm.device))
        else:
            link.expect(tuple(out.shape), out.dtype, pm.next, GRADIENT, (j,))

    def backward(j: int) -> None:
        loss, inp, out = live.pop(j)
        grad = None if loss is not None else link.recv(tuple(out.shape), out.dtype, pm.next, GRADIENT, (j,))
        with pm.event("backward", (j,)), (pm.grads.reducing_as_ready() if pm.grads.zero == 2 else nullcontext()):
            if loss is not None:
                loss.backward()
            else:
                out.backward(grad)
        if inp is not None:
            link.send(inp.grad, pm.prev, GRADIENT, (j,))
        release_freed()  # the recomputed segments' activations

    for kind, j in _microtask_order(pm, schedule, len(chunks), fused):
        with microtask(kind, j):  # a fused member's turn, recorded (interleave.py); nothing otherwise
            (forward if kind == FORWARD else backward)(j)
    await_turn(FINISH)
    link.close()
    if pm.is_last and stat_keys:  # the loss terms, before any gradient is reduced or applied
        for key, value in zip(stat_keys, sums.tolist()):
            require_finite(f"the {key.replace('_', ' ')}", value)
    pm.grads.finish(missed=max(0, microbatches - len(chunks)))
    norm = master.step(cfg, sq_total=pm.grads.sq_total)
    release_freed()  # the gradients and their float32 copies
    pm.grads.broadcast()
    if pm.is_last and pm.dp_group is not None:
        dist.all_reduce(sums, group=pm.dp_group)
    return dict(zip(stat_keys, sums.tolist())), norm
