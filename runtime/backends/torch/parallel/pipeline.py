"""The point-to-point links between pipeline stages during one invocation: message kinds and tags, the
non-blocking sends and the receives posted ahead (`StageLink`), and the events a rank's schedule records
(`StageEvent`). The schedules that use them are in schedules.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from rpegc.core.ir.errors import RpegError


# What a point-to-point message carries; with the microbatch key it makes the message's tag, so every
# receive matches exactly one send whatever order the transfers complete in.
ACTIVATION, GRADIENT, TOKENS = 0, 1, 2
_KINDS = 3
NAMESPACE_TAGS = 1 << 24  # tags of one fused member's pipeline messages (far more than microbatches x kinds)


@dataclass(frozen=True)
class StageEvent:
    """One piece of a rank's pipeline schedule: `what` ("forward", "backward", "sample", "broadcast") of
    microbatch `key` ((j,) or (decode step, j); () for a whole-invocation broadcast), between two
    `time.monotonic()` readings (comparable across the processes of one host)."""

    what: str
    key: tuple[int, ...]
    start: float
    end: float


class Stage(Protocol):
    """What a link needs of its rank's model (a `ParallelModel`): the pipeline's group and the device."""

    pp_group: Any
    device: torch.device


class StageLink:
    """A stage's point-to-point traffic on its pipeline's own process group during one invocation.

    Sends are non-blocking: the stage hands microbatch j on and starts j+1 while the next stage works on
    j (a blocking send would hold it until the receiver is ready). The sent tensors are kept until
    `close`, which waits for all of them; gloo moves the data in its own threads meanwhile. Receives
    can be posted ahead (`expect`): gloo delivers a message whose receive is already posted in one hop,
    while a send that finds no receive waits for the receiver's "ready" notice, a round trip more that
    a pipelined sender, running ahead of its receiver, would otherwise pay on every message.

    Under NCCL receives are posted only when awaited (`expect` does nothing): NCCL ignores tags and
    matches a pair's messages in the order they are issued, on one stream per pair, so a receive posted
    ahead would hold up the sends queued behind it on that stream (stage 0 waiting for tokens before it
    sends the activations that produce them). Every schedule here sends and receives each direction of
    a pair in the same (step, microbatch) order, which is what order matching needs.
    """

    def __init__(self, pm: Stage, microbatches: int, namespace: int = 0):
        """`namespace`: the fused member (docs/stage-fusion.md) whose messages these are: two members' pipelines
        share their process groups, so each member's tags are its own."""
        self.pm, self.microbatches = pm, microbatches
        self.base = namespace * NAMESPACE_TAGS
        self._sent: list[tuple[dist.Work, Tensor]] = []
        self._posted: dict[int, tuple[dist.Work, Tensor]] = {}
        self.post_ahead = pm.pp_group is None or dist.get_backend(pm.pp_group) != "nccl"
        if namespace and not self.post_ahead:  # NCCL matches a pair's messages in issue order, ignoring tags
            raise RpegError(None, "fused members interleave their messages, which needs gloo's tags; NCCL matches "
                               "a pair's messages in the order they are issued")

    def tag(self, kind: int, key: tuple[int, ...]) -> int:
        """(kind, step, microbatch) as one integer; (j,) keys are step 0."""
        step, j = (0, key[0]) if len(key) == 1 else key
        return self.base + (step * self.microbatches + j) * _KINDS + kind

    def send(self, x: Tensor, dst: int, kind: int, key: tuple[int, ...]) -> None:
        x = x.detach().contiguous()
        self._sent.append((dist.isend(x, dst, group=self.pm.pp_group, tag=self.tag(kind, key)), x))

    def expect(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> None:
        """Post the receive of message (kind, key) from `src` now (once; later calls do nothing; under NCCL
        nothing: see the class)."""
        if self.post_ahead:
            self._post(shape, dtype, src, kind, key)

    def _post(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> None:
        tag = self.tag(kind, key)
        if tag not in self._posted:
            x = torch.empty(shape, dtype=dtype, device=self.pm.device)
            self._posted[tag] = (dist.irecv(x, src, group=self.pm.pp_group, tag=tag), x)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, kind: int, key: tuple[int, ...]) -> Tensor:
        """Message (kind, key) from `src`, waiting for it."""
        self._post(shape, dtype, src, kind, key)
        work, x = self._posted.pop(self.tag(kind, key))
        work.wait()
        return x

    def close(self) -> None:
        assert not self._posted, "every posted receive is consumed within its invocation"
        for work, _ in self._sent:
            work.wait()
        self._sent.clear()
