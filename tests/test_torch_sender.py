"""A worker's commands on two threads (runtime/backends/torch/worker/sender.py): a transfer's source side on the sender
thread beside the main loop's operators, every other command in the main loop's order."""

import threading

import pytest

from rpegc.runtime.backends.torch.worker.sender import SENDER, CommandRouter


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
        order.append(cmd["node"])

    return CommandRouter(feed(cmds), send).start(), release, order


def next_waits_for(router, release) -> dict:
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
        sent.append(cmd["node"])
        busy.set()

    cmds = [{"type": "op", "node": "gen#0"}, {"type": "comm_data", "node": "c0", "sources": ["Y"], SENDER: True},
            {"type": "op", "node": "train#0"}, {"type": "stop"}]
    router = CommandRouter(feed(cmds), send).start()
    assert router.next()["node"] == "gen#0"
    assert busy.wait(5)  # the send ran while the main loop still "runs" gen#0
    assert [router.next()["node"], router.next()["type"]] == ["train#0", "stop"]
    assert sent == ["c0"]


def test_stop_comes_after_every_send_before_it():
    router, release, done = held_send([{"type": "move_weights", "node": "c1", "source": "W", SENDER: True},
                                       {"type": "stop"}])
    assert next_waits_for(router, release) == {"type": "stop"} and done == ["c1"]


def test_a_lost_controller_ends_the_main_loop():
    router = CommandRouter(feed([{"type": "op", "node": "gen#0"}, SystemExit(3)]), lambda cmd: None).start()
    assert router.next()["node"] == "gen#0"
    with pytest.raises(SystemExit):
        router.next()


def test_a_send_waits_for_the_weights_installed_before_it():
    """An install reports no completion (a resumed run installs from its checkpoint, then sends them): a send that
    came after it waits until the main loop has run it."""
    sent = threading.Event()
    router = CommandRouter(feed([{"type": "install", "label": "W"},
                                 {"type": "move_weights", "node": "c1", "source": "W", SENDER: True},
                                 {"type": "stop"}]), lambda cmd: sent.set()).start()
    install = router.next()
    assert install["type"] == "install"
    assert not sent.wait(0.2)  # the install is still running in the main loop
    router.finished(install)
    assert sent.wait(5) and router.next()["type"] == "stop"


def prep(label: str, kind: str = "weights") -> dict:
    return {"kind": kind, "label": label, "moves": []}


def test_a_send_waits_for_an_operator_before_it_that_re_lays_out_weights_it_sends():
    """An operator's prep re-lays out weights W under W's own label, and the controller routes a later transfer of W
    from the new layout: the send waits until the main loop has run that operator. A prep of other weights, or one
    that moves data rows (added beside the copy's own, never a transfer's source: routing.Holding.moved), does not
    hold it up."""
    sent = threading.Event()
    cmds = [{"type": "op", "node": "ref#0", "prep": [prep("W")]},
            {"type": "op", "node": "reward#0", "prep": [prep("V"), prep("W", "rows")]},
            {"type": "move_weights", "node": "c0", "source": "W", SENDER: True}, {"type": "stop"}]
    router = CommandRouter(feed(cmds), lambda cmd: sent.set()).start()
    ref = router.next()
    assert not sent.wait(0.2)  # ref#0 still runs: its prep may not have re-laid out W yet
    router.finished(ref)
    assert sent.wait(5)  # reward#0 is not waited for
    router.finished(router.next())
    assert router.next()["type"] == "stop"


def test_an_operator_that_lays_out_a_copy_waits_for_an_earlier_send_of_it():
    """A fusion's member re-lays out weights W under W's own label: a send of W read before it ends first."""
    cmds = [{"type": "move_weights", "node": "c1", "source": "W", SENDER: True},
            {"type": "fused", "node": "t#0", "members": [{"prep": [prep("W")]}]}, {"type": "stop"}]
    router, release, order = held_send(cmds)
    fused = next_waits_for(router, release)
    assert fused["node"] == "t#0" and order == ["c1"]
    router.finished(fused)
    assert router.next()["type"] == "stop"
