"""The worker pool's control store (runtime/backends/torch/controller/pool.py; issue 33, item 5): a locally forked run's
store listens on the loopback interface only, so no other host can reach it (TCPStore's own socket listens on all)."""

from __future__ import annotations

from datetime import timedelta

import pytest

dist = pytest.importorskip("torch.distributed")

from rpegc.runtime.backends.torch.controller.pool import loopback_listener  # noqa: E402


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on `port`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, state = fields[1], fields[3]
            if state == "0A" and int(addr.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                out.add(addr.rsplit(":", 1)[0])
    return out


@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_a_local_runs_store_listens_on_loopback_only():
    fd, port = loopback_listener()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10),
                          master_listen_fd=fd)
    store.set("setup", "x")
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert client.get("setup") == b"x"
    assert _listening(port) == {"0100007F"}  # 127.0.0.1, and nothing on 0.0.0.0 or ::


@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_a_local_run_serves_its_control_store_on_loopback_only(tmp_path):
    from fixtures.torch_runs import compile_plan

    from rpegc.runtime.backends.torch.controller.backend import TorchBackend
    from rpegc.runtime.controller import RunOptions, run

    plan = compile_plan(tmp_path, "examples/grpo-tiny.rpeg", 1)
    backend = TorchBackend(seed=0, tp_impl="torch")
    seen: list[set[str]] = []
    run(plan, backend, RunOptions(), on_step=lambda _: seen.append(_listening(backend.pool.store_port)))
    assert seen == [{"0100007F"}]


def test_a_command_to_a_dead_workers_closed_pipe_is_left_to_the_death_check():
    """A worker killed while the controller frees copies on it (the checkpoint tests' `kill:train_actor#1`): the
    release to its closed pipe is dropped, not raised as a broken pipe's traceback; `InFlight.check_workers` names the
    death (tests/test_torchrun_failure.py)."""
    import multiprocessing

    from rpegc.runtime.backends.torch.channel.commands import Release
    from rpegc.runtime.backends.torch.channel.messages import Endpoint, new_secret
    from rpegc.runtime.backends.torch.controller.pool import WorkerPool

    ours, theirs = multiprocessing.Pipe()
    theirs.close()  # the worker's end, gone with its process
    pool = WorkerPool()
    pool._chan = Endpoint(None, new_secret(), "controller", lambda line: None, links={"cmd/0": ours})
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        pool._chan.push("cmd/0", Release(labels=["x"]))  # the link itself fails
    pool.free(0, "weights @actor v1 @(0,0,0)+(1,1,1)")
    pool.flush_releases()  # the pool's sends do not
    pool.send(0, Release(labels=["y"]))
