"""ZeRO over the data-parallel group of one pipeline stage (docs/cost-model-spec.md Sec. 3.4.3): each replica owns a
share of the stage's parameters (`layout.replica_owner`), the gradients of a share are SUM-reduced onto its owner
(the losses are sums over local tokens divided by the GLOBAL token count, so the sum is the whole-batch gradient)
after every microbatch's backward pass (ZeRO-2: `reducing_as_ready`) or once per step (ZeRO-1: `finish`), only the
owner keeps Adam state for it and steps it, and broadcasts the updated values (`broadcast`); ZeRO-0 all-reduces
every gradient and every replica steps everything. Plain torch.distributed, synchronous but for a bucket's reduce
in flight during the backward pass. torch's FSDP2 and ZeroRedundancyOptimizer are not used: a stage module's
parameters are the published copy's own tensors between steps (one copy, the memory model's), which FSDP2's sharded
parameters would replace, and ZeroRedundancyOptimizer keeps full gradients.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rpegc.core.cost.memory import gradient_bucket_bytes
from rpegc.runtime.backends.torch.model.master_weights import sum_of_squares
from rpegc.runtime.backends.torch.parallel.layout import Layout, shard_dim


@dataclass
class _Reduction:
    """A gradient bucket's reduce in flight: its work handle, the owner it sums onto, its parameters, its flat copy."""

    work: Any
    owner: int
    names: list[str]
    flat: Tensor


class ZeroGradients:
    """The gradients of one stage module (rank at coordinates (d, p, t) of `layout`) under the ZeRO stage `zero`:
    which parameters this replica owns and steps, their reduction onto owners and the updated weights' broadcast."""

    def __init__(self, params: Callable[[], dict[str, nn.Parameter]], owner: dict[str, int], layout: Layout,
                 coord: tuple[int, int, int], dp_group, mp_group, device: torch.device, dtype: torch.dtype):
        self.params = params  # the module's parameters now (`ParallelModel.params`: a bind replaces them)
        self.owner = owner  # parameter -> the DP replica that owns it
        self.layout, self.dp_group, self.mp_group = layout, dp_group, mp_group
        self.d, self.p, self.t = coord
        self.device, self.dtype = device, dtype
        self.zero = 2  # the ZeRO stage a training module runs under (training.Training.zero; the trainer sets it)
        self._acc: dict[str, Tensor] = {}  # an owner's reduced gradients of its share, summed over the step's passes
        grad_bytes = sum(p.numel() * p.element_size() for p in params().values())
        self.bucket_bytes = int(gradient_bucket_bytes(grad_bytes, layout.dp))  # the memory model's bucket
        self._buckets: Optional[list[tuple[int, list[str]]]] = None

    def buckets(self) -> list[tuple[int, list[str]]]:
        """The gradient buckets of this stage, the same on every replica of the DP group: in the reverse of the
        module's parameter order (about the order a backward pass completes them) each parameter joins its
        owner's open bucket (`layout.replica_owner`), which closes at `bucket_bytes`; buckets are listed as they
        close. Every replica reduces them in this order, whatever order its backward completes them in."""
        if self._buckets is None:
            params = self.params()
            buckets: list[tuple[int, list[str]]] = []
            open_: dict[int, tuple[list[str], list[int]]] = {}
            for n in reversed(list(params)):
                o = self.owner[n]
                names, size = open_.setdefault(o, ([], [0]))
                names.append(n)
                size[0] += params[n].numel() * params[n].element_size()
                if size[0] >= self.bucket_bytes:
                    buckets.append((o, names))
                    del open_[o]
            buckets += [(o, names) for o, (names, _) in open_.items()]
            self._buckets = buckets
        return self._buckets

    @contextmanager
    def reducing_as_ready(self) -> Iterator[None]:
        """ZeRO-2 inside one backward pass (every microbatch's): as autograd completes the gradients, each bucket of
        `buckets` whose gradients are all complete (and every bucket before it) is summed onto its owner, which
        adds it to its share's gradients (`_acc`); every replica then drops the bucket's gradients. So a replica holds
        its share of the step's gradients and at most the buckets not yet complete (the memory model's M_grad =
        s_b W_shard / P_d), at the price of a reduction per microbatch (its T_dp). Parameters the pass did not reach
        are reduced (as zeros) when it ends. Every replica of the group runs the same number of these passes per step
        (`finish` pads the ones a replica without rows for them did not run).

        A bucket's reduction runs in the background (gloo's thread) while the backward goes on, and is waited for
        when the next bucket is complete, before that one is copied: one flat copy at a time, as the memory model
        counts. On a CPU the transfer takes the same core's time either way (the cost model's additive T_dp holds);
        what it saves is the lockstep: a blocking reduction per bucket made each replica wait for the slower one at
        every bucket (0.3 s of a 2 s training step of a 24M-parameter model on 2 workers, measured), where now the
        replicas meet once, at the end of the pass."""
        if self.dp_group is None:
            yield
            return
        params = self.params()
        buckets = self.buckets()
        left = [len(names) for _, names in buckets]
        bucket_of = {n: k for k, (_, names) in enumerate(buckets) for n in names}
        done = [0]  # buckets launched so far, in order
        in_flight: list[_Reduction] = []

        def launch(k: int) -> None:
            while in_flight:
                self._finish_reduce(in_flight.pop(), params)
            if buckets[k][1]:
                in_flight.append(self._launch_reduce(*buckets[k], params))

        def advance() -> None:
            while done[0] < len(buckets) and left[done[0]] == 0:
                launch(done[0])
                done[0] += 1

        def ready(name: str):
            def hook(_: Tensor) -> None:
                left[bucket_of[name]] -= 1
                advance()
            return hook

        handles = [p.register_post_accumulate_grad_hook(ready(n)) for n, p in params.items()]
        try:
            yield
            for k in range(done[0], len(buckets)):
                launch(k)
            while in_flight:
                self._finish_reduce(in_flight.pop(), params)
        finally:
            for h in handles:
                h.remove()

    def finish(self, missed: int) -> None:
        """After a step's backward passes, the gradients the optimizer steps, by the ZeRO stage:
        - 2: the `missed` passes this replica did not run (it had fewer rows than microbatches) reduce zeros, so its
          peers' reductions pair up; each owner's accumulated share becomes its gradients;
        - 1: each bucket is summed onto its owner, once; the other replicas drop it (all gradients were held until
          now: M_grad = s_b W_shard);
        - 0: every gradient is all-reduced, every replica keeps and steps all of them.
        A reduce-scatter (0: an all-reduce) of the gradients' bytes, and for 1 and 2 the all-gather of the updated
        weights (`broadcast`): T_dp of spec 3.4.3 with ZeRO-2's reduction per microbatch."""
        if self.dp_group is None:
            return
        params = self.params()
        if self.zero == 0:
            for _, names in self.buckets():
                flat = self._flat_grads(names, params)
                dist.all_reduce(flat, group=self.dp_group)
                self._unflatten(flat, names, params)
            return
        for _ in range(missed if self.zero == 2 else 1):
            for owner, names in self.buckets():
                self._reduce_bucket(owner, names, params)
        for n, g in self._acc.items():
            params[n].grad = g
        self._acc = {}

    def _flat_grads(self, names: list[str], params: dict[str, nn.Parameter]) -> Tensor:
        """The gradients `names` in one flat tensor (zeros for a parameter without one)."""
        return torch.cat([(params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).reshape(-1)
                          for n in names])

    def _unflatten(self, flat: Tensor, names: list[str], params: dict[str, nn.Parameter]) -> None:
        offset = 0
        for n in names:
            p = params[n]
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _reduce_bucket(self, owner: int, names: list[str], params: dict[str, nn.Parameter]) -> None:
        """The gradients `names` of `owner`'s share summed onto it in one flat reduce and added to its accumulated
        share (`_acc`); every replica drops them."""
        if names:
            self._finish_reduce(self._launch_reduce(owner, names, params), params)

    def _launch_reduce(self, owner: int, names: list[str], params: dict[str, nn.Parameter]) -> _Reduction:
        """Start summing the gradients `names` onto `owner` in one flat reduce; every replica drops them now (the
        flat copy holds them)."""
        flat = self._flat_grads(names, params)
        for n in names:
            params[n].grad = None
        work = dist.reduce(flat, dst=self.layout.rank_at(owner, self.p, self.t), group=self.dp_group, async_op=True)
        return _Reduction(work, owner, names, flat)

    def _finish_reduce(self, r: _Reduction, params: dict[str, nn.Parameter]) -> None:
        """Wait for reduction `r`; its owner adds the sum to its accumulated share (`_acc`)."""
        r.work.wait()
        if r.owner != self.d:
            return
        offset = 0
        for n in r.names:
            p = params[n]
            part = r.flat[offset:offset + p.numel()].view_as(p)
            if n in self._acc:
                self._acc[n].add_(part)
            else:
                self._acc[n] = part.clone()
            offset += p.numel()

    def broadcast(self) -> None:
        """Every replica's updated share to the others (ZeRO 1 and 2, after the owners' optimizer step), a bucket of
        `buckets` at a time, so no more than a bucket is in flight."""
        if self.dp_group is None or self.zero == 0:
            return
        params = self.params()
        for o, names in self.buckets():
            if o == self.d:
                flat = torch.cat([params[n].detach().reshape(-1) for n in names])
            else:
                flat = torch.empty(sum(params[n].numel() for n in names), dtype=self.dtype, device=self.device)
            dist.broadcast(flat, src=self.layout.rank_at(o, self.p, self.t), group=self.dp_group)
            if o != self.d:
                offset = 0
                with torch.no_grad():
                    for n in names:
                        p = params[n]
                        p.copy_(flat[offset:offset + p.numel()].view_as(p))
                        offset += p.numel()

    def stepped(self) -> list[str]:
        """The parameters this rank's optimizer steps: its replica's share (ZeRO 1 and 2), or all (ZeRO 0)."""
        return [n for n in self.params() if self.zero == 0 or self.owner[n] == self.d]

    def sq_total(self, grads: dict[str, Tensor]) -> Tensor:
        """The squared global gradient norm from the gradients this rank steps (its replica's share after
        `finish`; every parameter under ZeRO-0): DP shares, TP shards and stages summed, tensors replicated
        over TP once."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, g in grads.items():
            replicated = self.layout.tp == 1 or shard_dim(name) is None
            if replicated and self.t != 0:
                continue
            total = total + sum_of_squares(g)
        if self.dp_group is not None and self.zero > 0:  # each replica holds its share's gradients (finish)
            dist.all_reduce(total, group=self.dp_group)
        if self.mp_group is not None:
            dist.all_reduce(total, group=self.mp_group)
        return total
