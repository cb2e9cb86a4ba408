"""How a torch run's nodes reach its workers: each dispatched node becomes its ranks' commands (`routing.Routes`),
sent at once or chained behind running predecessors, a fusion's members as one command per rank, and parameter
copies installed and released where the plan says.
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.ir.exec_graph import microtask_text
from rpegc.runtime.backends.base import BackendError, Dispatch
from rpegc.runtime.backends.torch.channel.commands import Fused, Install, NodeCommand
from rpegc.runtime.backends.torch.checkpoints.exports import Exports
from rpegc.runtime.backends.torch.controller.inflight import InFlight, is_training
from rpegc.runtime.backends.torch.controller.pool import WorkerPool
from rpegc.runtime.backends.torch.controller.routing import Command, Holding
from rpegc.runtime.backends.torch.controller.run_description import RunDescription
from rpegc.runtime.plan import Artifact


class Dispatcher:
    """The commands of a run's nodes and parameter copies, sent to its workers."""

    def __init__(self, run: RunDescription, pool: WorkerPool, flight: InFlight, exports: Exports,
                 sender_threads: bool):
        self.run, self.pool, self.flight, self.exports = run, pool, flight, exports
        self.routes = run.routes
        self.device_of = run.device_of
        self.sender_threads = sender_threads  # sources of transfers send on their sender thread (gloo)

    def install(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        if artifact.kind != "weights":
            raise BackendError(None, f"cannot install {artifact.label}: only parameter copies are installed")
        layout = self.routes.reader_layout(artifact)
        cmd = Install(label=artifact.label, model=artifact.name, version=artifact.index, layout=layout,
                      keep=self.exports.keeps_installed(artifact, layout), tau=self.run.plan.tau.get(artifact.name, 0))
        for r in layout.ranks:
            self.pool.send(r, cmd)
        self.routes.holdings[artifact] = Holding(layout=layout)

    def release(self, artifact: Artifact, devices: tuple[int, ...]) -> None:
        h = self.routes.holdings.pop(artifact, None)
        ranks = set(self.routes.ranks(devices))
        if h is not None:
            ranks |= set(h.layout.ranks) if h.layout else set(h.all_rows())
        for r in sorted(ranks):  # sent with the rank's next command, or before the controller waits
            self.pool.free(r, artifact.label)

    def run_op(self, d: Dispatch) -> None:
        self._issue(d, self.routes.op_command(d))

    def submit_fused(self, ds: tuple[Dispatch, ...]) -> None:
        """The members of a fusion as one command per rank (`Operators.fused` in worker/operators.py): their op
        commands, built in turn (a member's rows moved for one are where the next finds them), and the fusion's
        microtask order per stage."""
        commands = []
        for d in ds:
            c = self.routes.op_command(d)
            self.routes.holdings.update(c.holdings)
            commands.append(c)
        ranks = sorted(commands[0].commands)
        if any(sorted(c.commands) != ranks for c in commands):
            raise BackendError(ds[0].node.node.loc, f"the members of the fusion of {ds[0].id} run on different ranks")
        for d, c in zip(ds, commands):
            self.flight.sent(d, c.commands, c.ends)
        fusion = self.run.fusion_of[ds[0].id]
        stages = [[microtask_text(t) for t in order] for order in fusion.stages]
        for r in ranks:
            members = [c.commands[r] for c in commands]
            self.pool.send(r, Fused(node=ds[0].id, tag=members[0].tag, ranks=ranks, members=members, stages=stages))
        for d in ds:
            self._sent(d)

    def transfer(self, d: Dispatch) -> None:
        self._issue(d, self.routes.transfer_command(d))

    def reshard(self, d: Dispatch) -> None:
        self._issue(d, self.routes.reshard_command(d))

    def chain(self, d: Dispatch, after: tuple[str, ...]) -> bool:
        """Send `d` behind its running predecessors `after` when its start cannot come before their finish:
        every rank that ends a predecessor (`routing.Command.ends`) runs `d` too, after it in its queue, and `d`
        starts when its last rank begins it (a training's checkpoint part, queued behind it, in between)."""
        running = [p for x in after if (p := self.flight.running(x)) is not None]
        c = self.routes.command(d)
        if not c.commands:
            return False  # nothing to send: it completes at once when dispatched
        # A transfer's senders run it on their sender thread (sender.py), behind earlier sends only: the ranks that
        # queue it in order must end every predecessor, and no predecessor may still run in a sender's main loop
        # (it could be producing the data to send).
        senders = self._senders(d, c.commands)
        ranks = set(c.commands) - senders
        for pend in running:
            if not pend.ends <= ranks or (pend.ranks & senders) - pend.senders:
                return False
        self._issue(d, c, after)
        return True

    def _senders(self, d: Dispatch, commands: dict[int, NodeCommand]) -> set[int]:
        """The ranks of a transfer's commands outside what it reserves: they only send, on their sender thread."""
        if not d.node.is_transfer or not self.sender_threads:
            return set()
        held = set(d.reserved)
        return {r for r in commands if self.device_of[r] not in held}

    def _issue(self, d: Dispatch, c: Command, after: tuple[str, ...] = ()) -> None:
        self.routes.holdings.update(c.holdings)
        commands = c.commands
        if not commands:
            self.flight.done_at_once(d)
            return
        senders = self._senders(d, commands)
        self.flight.sent(d, commands, c.ends, after, frozenset(senders))
        for r, cmd in sorted(commands.items()):  # a transfer's ranks share one command: a sender's is marked
            self.pool.send(r, replace(cmd, sender=True) if r in senders else cmd)
        self._sent(d)

    def _sent(self, d: Dispatch) -> None:
        """A training's commands are sent: what it makes due for checkpoints goes right behind them (exports.py)."""
        if is_training(d):
            self.exports.training_sent(d)
