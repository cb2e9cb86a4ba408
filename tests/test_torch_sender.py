"""A worker's commands on two threads (runtime/backends/torch/worker/sender.py): a transfer's source side on the sender
thread beside the main loop's operators, every other command in the main loop's order."""

import threading

import pytest

from rpegc.runtime.backends.torch.channel import commands as c
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.worker.sender import CommandRouter

L = Layout((0,), 1, 1, 1)


def op(node: str, prep=(), role="inference", **kw) -> c.Op:
    return c.Op(node=node, tag=0, ranks=[0], step=0, role=role, model="m", layout=L, mb=1, rows={0: (0, 1)},
                weights="W", inputs=[], outputs={}, fields=[], prep=list(prep), output=None, version_out=None, **kw)


def send_data(node: str, source: str) -> c.CommData:
    return c.CommData(node=node, tag=0, ranks=[0], moves=[], sources=[source], target=f"{source}'", fields=[],
                      sender=True)


def send_weights(node: str, source: str) -> c.MoveWeights:
    return c.MoveWeights(node=node, tag=0, ranks=[0], model="m", version=0, source=source, target=f"{source}'",
                         layout=L, moves=[], src_ranks=(0,), sender=True)


def feed(commands):
    it = iter(commands)

    def receive():
        item = next(it)
        if isinstance(item, BaseException):
            raise item
        return item
    return receive


def held_send(cmds):
    """A router whose sends block until `release` is set; `order`: the sends, in the order they ended."""
    release, order = threading.Event(), []

    def send(cmd):
        release.wait(5)
        order.append(cmd.node)

    return CommandRouter(feed(cmds), send).start(), release, order


def next_waits_for(router, release) -> c.Command:
    """The main loop's next command, which must wait until `release` lets the send before it end."""
    got = []
    t = threading.Thread(target=lambda: got.append(router.next()))
    t.start()
    t.join(0.2)
    assert not got  # it waits for the send in flight
    release.set()
    t.join(5)
    return got[0]


def test_sender_commands_run_beside_the_main_loop_which_keeps_its_order():
    busy = threading.Event()  # the main loop's operator runs until the send has happened
    sent = []

    def send(cmd):
        sent.append(cmd.node)
        busy.set()

    cmds = [op("gen#0"), send_data("c0", "Y"), op("train#0"), c.Stop()]
    router = CommandRouter(feed(cmds), send).start()
    assert router.next().node == "gen#0"
    assert busy.wait(5)  # the send ran while the main loop still "runs" gen#0
    assert [router.next().node, router.next().type] == ["train#0", "stop"]
    assert sent == ["c0"]


def test_stop_comes_after_every_send_before_it():
    router, release, done = held_send([send_weights("c1", "W"), c.Stop()])
    assert next_waits_for(router, release) == c.Stop() and done == ["c1"]


def test_a_lost_controller_ends_the_main_loop():
    router = CommandRouter(feed([op("gen#0"), SystemExit(3)]), lambda cmd: None).start()
    assert router.next().node == "gen#0"
    with pytest.raises(SystemExit):
        router.next()


def test_a_send_waits_for_the_weights_installed_before_it():
    """An install reports no completion (a resumed run installs from its checkpoint, then sends them): a send that
    came after it waits until the main loop has run it."""
    sent = threading.Event()
    router = CommandRouter(feed([c.Install(label="W", model="m", version=0, layout=L), send_weights("c1", "W"),
                                 c.Stop()]), lambda cmd: sent.set()).start()
    install = router.next()
    assert install.type == "install"
    assert not sent.wait(0.2)  # the install is still running in the main loop
    router.finished(install)
    assert sent.wait(5) and router.next().type == "stop"


def prep(label: str, kind: str = "weights") -> c.Prep:
    if kind == "rows":
        return c.PrepRows(label=label, fields=[], moves=[])
    return c.PrepWeights(label=label, model="m", layout=L, moves=[])


def test_a_send_waits_for_an_operator_before_it_that_re_lays_out_weights_it_sends():
    """An operator's prep re-lays out weights W under W's own label, and the controller routes a later transfer of W
    from the new layout: the send waits until the main loop has run that operator. A prep of other weights, or one
    that moves data rows (added beside the copy's own, never a transfer's source: routing.Holding.moved), does not
    hold it up."""
    sent = threading.Event()
    cmds = [op("ref#0", [prep("W")]), op("reward#0", [prep("V"), prep("W", "rows")]), send_weights("c0", "W"), c.Stop()]
    router = CommandRouter(feed(cmds), lambda cmd: sent.set()).start()
    ref = router.next()
    assert not sent.wait(0.2)  # ref#0 still runs: its prep may not have re-laid out W yet
    router.finished(ref)
    assert sent.wait(5)  # reward#0 is not waited for
    router.finished(router.next())
    assert router.next().type == "stop"


def test_an_operator_that_lays_out_a_copy_waits_for_an_earlier_send_of_it():
    """A fusion's member re-lays out weights W under W's own label: a send of W read before it ends first."""
    fused = c.Fused(node="t#0", tag=0, ranks=[0], members=[op("t.a", [prep("W")])], stages=[[]])
    cmds = [send_weights("c1", "W"), fused, c.Stop()]
    router, release, order = held_send(cmds)
    fused = next_waits_for(router, release)
    assert fused.node == "t#0" and order == ["c1"]
    router.finished(fused)
    assert router.next().type == "stop"


@pytest.mark.parametrize("lets_go", ["take", "release", "Release"])
def test_a_command_that_lets_go_of_a_copy_waits_for_an_earlier_send_of_it(lets_go):
    """A fresh `make demo` stopped with "weights @actor v91 ... is not held on worker 1": the send of v91 to the
    generation was issued before the next training, which the controller then let take v91 over as its working copy
    (no node left to issue reads it) and which the main loop ran before the sender thread had sent it. A command that
    takes over or frees a copy waits for the sends of it read before it; one that lets go of another copy does not."""
    letting_go = {"take": op("train#1", role="training", take=True),
                  "release": op("gen#2", release=["W"]),
                  "Release": c.Release(labels=["W"])}[lets_go]
    router, release, order = held_send([send_weights("c1", "W"), letting_go, c.Stop()])
    cmd = next_waits_for(router, release)
    assert cmd == letting_go and order == ["c1"]
    router.finished(cmd)
    assert router.next().type == "stop"
    other = CommandRouter(feed([send_weights("c1", "V"), letting_go, c.Stop()]), lambda cmd: threading.Event().wait(5))
    assert other.start().next() == letting_go  # a send of another copy does not hold it up
