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


def test_sender_commands_run_beside_the_main_loop_which_keeps_its_order():
    busy = threading.Event()  # the main loop's operator runs until the send has happened
    sent = []

    def send(cmd):
        sent.append(cmd["node"])
        busy.set()

    cmds = [{"type": "op", "node": "gen#0"}, {"type": "comm_data", "node": "c0", SENDER: True},
            {"type": "op", "node": "train#0"}, {"type": "stop"}]
    router = CommandRouter(feed(cmds), send).start()
    assert router.next()["node"] == "gen#0"
    assert busy.wait(5)  # the send ran while the main loop still "runs" gen#0
    assert [router.next()["node"], router.next()["type"]] == ["train#0", "stop"]
    assert sent == ["c0"]


def test_stop_comes_after_every_send_before_it():
    done = []
    release = threading.Event()

    def send(cmd):
        release.wait(5)
        done.append(cmd["node"])

    router = CommandRouter(feed([{"type": "move_weights", "node": "c1", SENDER: True}, {"type": "stop"}]), send)
    router.start()
    got = []
    t = threading.Thread(target=lambda: got.append(router.next()))
    t.start()
    t.join(0.2)
    assert not got  # the stop waits for the send in flight
    release.set()
    t.join(5)
    assert got == [{"type": "stop"}] and done == ["c1"]


def test_a_lost_controller_ends_the_main_loop():
    router = CommandRouter(feed([{"type": "op", "node": "gen#0"}, SystemExit(3)]), lambda cmd: None).start()
    assert router.next()["node"] == "gen#0"
    with pytest.raises(SystemExit):
        router.next()


def test_a_send_waits_for_the_weights_installed_before_it():
    """An install reports no completion (a resumed run installs from its checkpoint, then sends them): a send that
    came after it waits until the main loop has run it."""
    sent = threading.Event()
    router = CommandRouter(feed([{"type": "install", "label": "W"}, {"type": "move_weights", "node": "c1", SENDER: True},
                                 {"type": "stop"}]), lambda cmd: sent.set()).start()
    install = router.next()
    assert install["type"] == "install"
    assert not sent.wait(0.2)  # the install is still running in the main loop
    router.finished(install)
    assert sent.wait(5) and router.next()["type"] == "stop"
