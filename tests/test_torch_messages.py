"""The control channel's messages (runtime/backends/torch/channel/messages.py): every command, report and the
setup round-trip as plain JSON; a message that is tampered with, unauthenticated, replayed, oversized, of
an unknown type or not plain is refused, and an Endpoint drops and logs it instead of returning it."""

import dataclasses
import json
import os
import stat
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.program import Arch, Workload  # noqa: E402
from rpegc.runtime.backends.torch.channel import commands as c  # noqa: E402
from rpegc.runtime.backends.torch.channel import messages as m  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout, RowMove, WeightMove  # noqa: E402
from rpegc.runtime.backends.torch.run_config import RunConfig  # noqa: E402
from rpegc.runtime.backends.torch.rl.algorithms import default_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec, WorkerSetup  # noqa: E402

SECRET = bytes(range(32))
L = Layout((0, 1, 2, 3), 2, 1, 2)
ARCH = Arch(layers=2, hidden=32, ffn=64, vocab=16, heads=4, kv_heads=2)


def setup_message() -> dict:
    run = RunConfig(algorithm="grpo", actor=ARCH, workload=Workload(B=4, R=2, Lp=4, Lr=4, dtype="fp32"),
                    rl=default_rl_config("grpo"))
    setup = WorkerSetup(world=4, seed=3, run=run, models={"actor": ModelSpec("actor", "policy", ARCH, 7)},
                        layouts=(L, Layout((0, 1), 1, 2, 1)), tp_impl="torch", t0=1234.5, timeout_s=60.0)
    return {"type": "setup", "setup": setup}


NODE = {"node": "gen.0", "tag": 2_000_000, "ranks": [0, 1, 2, 3]}
COMMANDS = [
    c.Stop(),
    c.Install(label="actor@0", model="actor", version=0, layout=L),
    c.Release(labels=["actor@0"]),
    c.Op(**NODE, step=1, role="generation", model="actor", layout=L, mb=2,
         rows={0: (0, 4), 1: (0, 4), 2: (4, 8), 3: (4, 8)}, weights="actor@0", inputs=[],
         outputs={"roll.0": ["sequences", "mask"]}, fields=["sequences", "mask"],
         prep=[c.PrepRows(label="x", fields=["mask"], moves=[RowMove(0, 2, 0, 4)]),
               c.PrepWeights(label="actor@0", model="actor", layout=L,
                             moves=[WeightMove(0, 1, "layers.0.attn.wq.weight", 0, 0, 16)])],
         output=None, version_out=None),
    c.CommData(**NODE, moves=[RowMove(0, 1, 0, 8)], sources=["roll.0"], target="roll.0'", fields=["sequences"]),
    c.MoveWeights(**NODE, model="actor", version=1, source="actor@1", target="actor@1'", layout=L,
                  moves=[WeightMove(1, 2, "embed.weight", None, 0, 0)], src_ranks=(0, 1)),
    c.Export(export=3, dir="/run/checkpoints/step-000003.partial", weights=[["actor@1", "weights/actor/v3/"]],
             window=[["actor", 2, "weights/actor/v2/"]], optimizer=[["actor", L]], rng=True),
    c.Keep(label="actor@3", tau=1),
    c.Install(label="actor@2", model="actor", version=2, layout=L, keep=True, tau=1),
    c.CommData(**NODE, moves=[], sources=["roll.0"], target="roll.0'", fields=["sequences"], release=["x"],
               sender=True),
]
REPORTS = [
    {"type": "ready", "rank": 2, "groups": 5},
    {"type": "bye", "rank": 2},
    {"type": "error", "node": "train.0", "what": "op", "rank": 1, "message": "Traceback ...\nValueError: x"},
    {"type": "done", "node": "train.0", "rank": 0, "start": 0.5, "finish": 0.75, "mem": 1 << 20, "bytes": 0,
     "versions_in": {"actor": 0}, "versions_out": {"actor": 1},
     "metrics": {"reward": 0.25, "kl": float("inf"), "policy_loss": -0.0}},
    {"type": "done", "node": None, "rank": 0, "start": 0.5, "finish": 0.75, "mem": 0, "export": 3,
     "file": "rank-00000.safetensors", "bytes": 1 << 27, "sha256": "ab" * 32, "write_s": 0.5,
     "tensors": {"weights/actor/v3/embed.weight": {"offsets": [0, 0], "shape": [64, 32], "global": [128, 32],
                                                   "dtype": "F32"}}},
    {"type": "eof"},
]


def roundtrip(channel: str, msg):
    sealed = m.seal(SECRET, channel, "sender", 0, msg)
    env = m.unseal(SECRET, channel, sealed)
    assert (env.sender, env.seq) == ("sender", 0)
    return env.msg


@pytest.mark.parametrize("msg", COMMANDS, ids=[cmd.type for cmd in COMMANDS])
def test_every_command_roundtrips_with_its_types(msg):
    got = roundtrip("cmd/3", msg)
    assert got == msg and type(got) is type(msg)
    if msg.type == "op":
        assert got.rows[2] == (4, 8) and isinstance(got.layout, Layout)
        assert hash(got.layout) == hash(L)  # a dict key on the worker: a tuple of ranks again
        assert isinstance(got.prep[1], c.PrepWeights) and isinstance(got.prep[1].moves[0], WeightMove)
    if msg.type == "move_weights":
        assert got.src_ranks == (0, 1)


def test_a_fusion_carries_its_members_as_op_commands():
    fused = c.Fused(**NODE, members=[COMMANDS[3], dataclasses.replace(COMMANDS[3], node="ref.0", prep=[])],
                    stages=[["F1.0", "F2.0"], ["F1.0", "F2.0"]], release=["old"])
    got = roundtrip("cmd/0", fused)
    assert got == fused and all(type(op) is c.Op for op in got.members)
    assert got.members[0].prep[0] == c.PrepRows(label="x", fields=["mask"], moves=[RowMove(0, 2, 0, 4)])


def test_the_schema_is_derived_from_the_command_dataclasses():
    """COMMANDS is the dataclasses' fields, no more and no less: required without a default, optional with one."""
    assert set(m.COMMANDS) == {cls.type for cls in c.COMMAND_CLASSES} == {cmd.type for cmd in COMMANDS} | {"fused"}
    for cls in c.COMMAND_CLASSES:
        spec = m.COMMANDS[cls.type]
        declared = {f.name: f.default is dataclasses.MISSING for f in dataclasses.fields(cls)}
        assert set(spec.required) | set(spec.optional) == set(declared), cls.type
        assert set(spec.required) == {n for n, req in declared.items() if req}, cls.type
    assert m.COMMANDS["release"] == m.MessageType(("labels",))
    assert {"node", "tag", "ranks"} <= set(m.COMMANDS["op"].required) and "pool" in m.COMMANDS["op"].optional
    assert m.COMMANDS["comm_data"].optional == ("release", "sender")


@pytest.mark.parametrize("cmd", [cmd for cmd in COMMANDS if m.COMMANDS[cmd.type].required],
                         ids=[cmd.type for cmd in COMMANDS if m.COMMANDS[cmd.type].required])
def test_a_command_missing_a_required_field_is_refused_on_receipt(cmd):
    for name in m.COMMANDS[cmd.type].required:
        msg = {k: v for k, v in c.to_message(cmd).items() if k != name}
        forged = forge("cmd/0", {"ch": "cmd/0", "from": "controller", "seq": 0, "msg": m.to_plain(msg)})
        with pytest.raises(m.MessageError, match=f"{cmd.type} message lacks {name}$"):
            m.unseal(SECRET, "cmd/0", forged)
    extra = {**c.to_message(cmd), "shell": "rm -rf /"}
    forged = forge("cmd/0", {"ch": "cmd/0", "from": "controller", "seq": 0, "msg": m.to_plain(extra)})
    with pytest.raises(m.MessageError, match="has unknown fields shell"):
        m.unseal(SECRET, "cmd/0", forged)


def test_a_command_is_sent_as_its_dataclass_and_a_malformed_member_is_refused():
    with pytest.raises(m.MessageError, match=r"a release command is sent as its dataclass \(commands.Release\)"):
        m.seal(SECRET, "cmd/0", "controller", 0, {"type": "release", "labels": ["x"]})
    op = m.to_plain(COMMANDS[3])
    op["args"].pop()  # one field short
    msg = {**m.to_plain(c.to_message(COMMANDS[3])), "type": "fused", "members": [op], "stages": [[]]}
    msg = {k: v for k, v in msg.items() if k in m.COMMANDS["fused"].required + ("type",)}
    forged = forge("cmd/0", {"ch": "cmd/0", "from": "controller", "seq": 0, "msg": msg})
    with pytest.raises(m.MessageError, match="gives Op 19 fields, it has 20"):
        m.unseal(SECRET, "cmd/0", forged)


@pytest.mark.parametrize("msg", REPORTS, ids=[f"{r['type']}-{i}" for i, r in enumerate(REPORTS)])
def test_every_report_roundtrips(msg):
    assert roundtrip("res", msg) == msg


def test_the_setup_roundtrips_with_its_run_config():
    msg = setup_message()
    got = roundtrip("setup", msg)
    assert got == msg and isinstance(got["setup"].run.rl.adam_betas, tuple)
    assert got["setup"].run.serving_dtype == torch.float32


def test_the_wire_form_is_plain_json_without_pickles():
    sealed = m.seal(SECRET, "cmd/0", "controller", 0, COMMANDS[3])
    body = json.loads(sealed[m.TAG_CHARS:])
    assert body["ch"] == "cmd/0" and body["msg"]["type"] == "op" and body["msg"]["layout"]["$class"] == "Layout"
    assert body["msg"]["prep"][0]["$class"] == "PrepRows"
    assert b"\x80" not in sealed  # no pickle protocol header


@pytest.mark.parametrize("value", [torch.zeros(2), object(), {1, 2}, b"raw bytes", bytearray(b"x")],
                         ids=["tensor", "object", "set", "bytes", "bytearray"])
def test_what_is_not_plain_cannot_be_sent(value):
    with pytest.raises(m.MessageError, match="cannot travel over the control channel"):
        m.seal(SECRET, "cmd/0", "controller", 0, c.Release(labels=[value]))


def test_a_tensor_cannot_ride_in_a_node_report():
    with pytest.raises(m.MessageError, match="Tensor cannot travel"):
        m.seal(SECRET, "res", "worker-0", 0, {**REPORTS[3], "metrics": {"reward": torch.tensor(0.5)}})


def test_messages_too_large_or_too_long_cannot_be_sent():
    with pytest.raises(m.MessageError, match="exceeds the control channel's limit"):
        m.seal(SECRET, "res", "worker-0", 0, {**REPORTS[2], "message": "x" * m.REPORT_BYTES})
    with pytest.raises(m.MessageError, match="more than"):
        m.seal(SECRET, "cmd/0", "controller", 0, dataclasses.replace(COMMANDS[4], moves=[0] * (m.MAX_ITEMS + 1)))
    deep: list = []
    for _ in range(m.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(m.MessageError, match="nests deeper"):
        m.seal(SECRET, "cmd/0", "controller", 0, dataclasses.replace(COMMANDS[4], moves=deep))


@pytest.mark.parametrize("msg,match", [
    ({"type": "exec", "code": "import os"}, "unknown type 'exec'"),
    ({"label": "x"}, "unknown type None"),
    ({"type": "release"}, "lacks labels"),
    ({"type": "release", "labels": ["x"], "shell": "rm -rf /"}, "unknown fields shell"),
    ({"type": "ready", "rank": 0, "groups": 1}, "unknown type 'ready'"),  # a report is no command
])
def test_unknown_types_and_fields_are_refused_both_ways(msg, match):
    with pytest.raises(m.MessageError, match=match):
        m.seal(SECRET, "cmd/0", "controller", 0, msg)
    forged = forge("cmd/0", {"ch": "cmd/0", "from": "controller", "seq": 0, "msg": msg})
    with pytest.raises(m.MessageError, match=match):
        m.unseal(SECRET, "cmd/0", forged)


def forge(channel: str, envelope: dict, secret: bytes = SECRET) -> bytes:
    """A message sealed by hand, bypassing seal's checks (what a peer with the secret could send)."""
    body = json.dumps(envelope).encode()
    return m._tag(secret, body) + body


@pytest.mark.parametrize("plain,match", [
    ({"$class": "Popen", "args": ["sh"]}, "unknown class 'Popen'"),
    ({"$class": "Layout", "args": [[0, 1], 1, 1]}, "gives Layout 3 fields"),
    ({"$class": "Layout", "args": [{"$tuple": [0, 1]}, 1, 1, 1]}, "invalid Layout: layout dp = 1"),
    ({"$pickle": "gASV"}, "unknown tagged value"),
    ({"$dict": [[[1], 2]]}, "not hashable"),
])
def test_authenticated_but_malformed_values_are_refused(plain, match):
    raw = forge("cmd/0", {"ch": "cmd/0", "from": "controller", "seq": 0,
                          "msg": {"type": "release", "labels": [plain]}})
    with pytest.raises(m.MessageError, match=match):
        m.unseal(SECRET, "cmd/0", raw)


def test_tampered_unauthenticated_wrong_secret_and_replayed_messages_are_refused():
    sealed = m.seal(SECRET, "cmd/1", "controller", 0, COMMANDS[2])
    tampered = sealed.replace(b"actor@0", b"actor@9")
    with pytest.raises(m.MessageError, match="not authenticated"):
        m.unseal(SECRET, "cmd/1", tampered)
    with pytest.raises(m.MessageError, match="not authenticated"):
        m.unseal(SECRET, "cmd/1", sealed[m.TAG_CHARS:])  # the body alone, no tag
    with pytest.raises(m.MessageError, match="not authenticated"):
        m.unseal(bytes(32), "cmd/1", sealed)  # another run's secret
    with pytest.raises(m.MessageError, match="not authenticated"):
        m.unseal(SECRET, "cmd/1", b"\x80\x04\x95" + b"pickle" * 20)
    with pytest.raises(m.MessageError, match="a replay"):
        m.unseal(SECRET, "cmd/2", sealed)  # sealed for worker 1, replayed to worker 2


def test_oversized_raw_values_are_refused_before_the_tag_is_computed():
    with pytest.raises(m.MessageError, match="oversized"):
        m.unseal(SECRET, "cmd/0", b"0" * (m.COMMAND_BYTES + 1))


def test_an_export_report_may_be_larger_than_a_report_but_is_bounded():
    boxes = {f"weights/actor/v3/layers.{i}.w": {"offsets": [0, 0], "shape": [64, 32], "global": [128, 32],
                                                 "dtype": "F32"} for i in range(2000)}
    report = {**REPORTS[4], "tensors": boxes}
    sealed = m.seal(SECRET, "res", "worker-0", 0, report)
    assert m.REPORT_BYTES < len(sealed) < m.EXPORT_REPORT_BYTES
    assert m.unseal(SECRET, "res", sealed).msg == report
    # the same size is refused for any other report
    with pytest.raises(m.MessageError, match="exceeds the control channel's limit"):
        m.seal(SECRET, "res", "worker-0", 0, {**REPORTS[3], "metrics": {k: 0.0 for k in boxes}})
    # text after the JSON body is not a message
    text = json.dumps({"ch": "res", "from": "w", "seq": 0, "msg": REPORTS[1]}).encode() + b"\nextra"
    with pytest.raises(m.MessageError, match="not JSON"):
        m.unseal(SECRET, "res", m._tag(SECRET, text) + text)


class FakeStore:
    """The part of a TCPStore an Endpoint uses, in memory."""

    def __init__(self):
        self.queues: dict[str, list[bytes]] = {}
        self.keys: dict[str, bytes] = {}

    def queue_push(self, key, value):
        self.queues.setdefault(key, []).append(value if isinstance(value, bytes) else value.encode())

    def queue_pop(self, key, block=True):
        return self.queues[key].pop(0)

    def wait(self, keys, timeout=None):
        if not self.queues.get(keys[0]):
            raise RuntimeError("wait timeout")

    def set(self, key, value):
        self.keys[key] = value

    def get(self, key):
        return self.keys[key]


def endpoints(store):
    logs: list[str] = []
    return m.Endpoint(store, SECRET, "controller", logs.append), m.Endpoint(store, SECRET, "worker-0", logs.append), logs


def test_an_endpoint_drops_and_logs_what_is_not_authentic_and_returns_the_next_good_message():
    store = FakeStore()
    ctl, worker, logs = endpoints(store)
    store.queue_push("cmd/0", b"\x80\x04\x95 an unauthenticated pickle")
    store.queue_push("cmd/0", m.seal(bytes(32), "cmd/0", "controller", 0, COMMANDS[0]))  # wrong secret
    store.queue_push("cmd/0", b"x" * (m.COMMAND_BYTES + 10))
    ctl.push("cmd/0", COMMANDS[2])
    env = worker.receive("cmd/0", timedelta(seconds=1))
    assert env.msg == COMMANDS[2] and worker.dropped == 3
    assert len(logs) == 3 and all(line.startswith("dropped a message on control channel cmd/0: ") for line in logs)
    assert "not authenticated" in logs[0] and "oversized" in logs[2]


def test_an_endpoint_drops_a_replayed_message_of_its_own_channel():
    store = FakeStore()
    ctl, worker, logs = endpoints(store)
    ctl.push("cmd/0", COMMANDS[2])
    first = store.queues["cmd/0"][0]
    assert worker.receive("cmd/0", timedelta(seconds=1)).msg == COMMANDS[2]
    store.queue_push("cmd/0", first)  # captured and pushed again
    ctl.push("cmd/0", COMMANDS[0])
    assert worker.receive("cmd/0", timedelta(seconds=1)).msg == COMMANDS[0]
    assert worker.dropped == 1 and "out of sequence" in logs[0]


def test_a_lost_message_is_a_gap_accepted_only_after_an_interrupt_and_replays_stay_dropped():
    store = FakeStore()
    ctl, worker, logs = endpoints(store)
    for cmd in COMMANDS[:3]:
        ctl.push("cmd/0", cmd)
    first = store.queue_pop("cmd/0", False)  # read, then lost: the signal unwound its reader before accept
    store.queue_pop("cmd/0", False)
    ctl.push("cmd/0", COMMANDS[0])
    with pytest.raises(RuntimeError):
        worker.receive("cmd/0", timedelta(seconds=0.1))  # numbers 2 and 3 while 0 is expected: both dropped
    assert worker.dropped == 2 and "an earlier one is missing" in logs[0]
    worker.allow_gaps = True  # what TorchBackend.interrupt() sets on the controller's endpoint
    ctl.push("cmd/0", COMMANDS[1])
    store.queue_push("cmd/0", first)  # a replay (number 0 < 5) is still refused
    assert worker.receive("cmd/0", timedelta(seconds=1)).msg == COMMANDS[1]
    with pytest.raises(RuntimeError):
        worker.receive("cmd/0", timedelta(seconds=0.1))
    assert worker.dropped == 3 and "a replay" in logs[-1]


def test_an_endpoint_logs_a_bounded_number_of_drops():
    store = FakeStore()
    ctl, worker, logs = endpoints(store)
    for _ in range(m.MAX_LOGGED + 30):
        store.queue_push("res", b"junk")
    ctl.push("res", REPORTS[0])
    worker.receive("res", timedelta(seconds=1))
    assert worker.dropped == m.MAX_LOGGED + 30 and len(logs) == m.MAX_LOGGED + 1
    assert "counted, not logged" in logs[-1]


def test_a_link_carries_sealed_messages_and_checks_them_like_the_store():
    """A forked worker's pipe (Endpoint.links): the same sealing, dropping and sequence checks; a wait
    with nothing sent is a TimeoutError, a closed other end an EOFError; the store is not touched."""
    import multiprocessing

    store = FakeStore()
    a, b = multiprocessing.Pipe(duplex=True)
    logs: list[str] = []
    ctl = m.Endpoint(store, SECRET, "controller", logs.append, links={"cmd/0": a, "res": a})
    worker = m.Endpoint(store, SECRET, "worker-0", logs.append, links={"cmd/0": b, "res": b})
    with pytest.raises(TimeoutError):
        worker.receive("cmd/0", timedelta(seconds=0.01))
    a.send_bytes(b"\x80\x04\x95 an unauthenticated pickle")
    a.send_bytes(m.seal(bytes(32), "cmd/0", "controller", 0, COMMANDS[0]))  # wrong secret
    ctl.push("cmd/0", COMMANDS[2])
    assert worker.receive("cmd/0", timedelta(seconds=1)).msg == COMMANDS[2]
    assert worker.dropped == 2 and "not authenticated" in logs[0]
    worker.push("res", REPORTS[0])
    assert ctl.receive("res", timedelta(seconds=1)).msg == REPORTS[0]
    assert store.queues == {}
    a.close()
    with pytest.raises(EOFError):
        worker.receive("cmd/0", timedelta(seconds=1))


def test_the_setup_key_is_authenticated_too():
    store = FakeStore()
    ctl, worker, _ = endpoints(store)
    ctl.put("setup", setup_message())
    assert worker.get("setup") == setup_message()
    store.set("setup", b"\x80\x04 a pickle")
    with pytest.raises(m.MessageError, match="not authenticated"):
        worker.get("setup")


def test_the_secret_file_is_private_and_checked(tmp_path):
    path = str(tmp_path / "secret")
    secret = m.new_secret()
    assert len(secret) == m.SECRET_BYTES and secret != m.new_secret()
    m.write_secret(path, secret)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert m.read_secret(path) == secret
    m.write_secret(path, bytes(32))  # a new run replaces a stale file
    assert m.read_secret(path) == bytes(32)
    with pytest.raises(m.MessageError, match="no control secret: give --secret-file PATH or set RPEG_RUN_SECRET_FILE"):
        m.read_secret(None)
    with pytest.raises(m.MessageError, match="cannot read the control secret"):
        m.read_secret(str(tmp_path / "missing"))
    os.chmod(path, 0o644)
    with pytest.raises(m.MessageError, match="mode 644.*must be mode 600"):
        m.read_secret(path)
    os.chmod(path, 0o600)
    with open(path, "w") as f:
        f.write("not hex\n")
    with pytest.raises(m.MessageError, match="is not a control secret"):
        m.read_secret(path)


def _sleep():
    import time

    time.sleep(60)


def test_a_link_whose_process_was_killed_with_unread_data_reads_as_closed():
    """A worker killed with commands unread in its pipe resets it: that is the end of the link (EOFError), so the
    health check names the worker and its signal, not "the link of res broke: Connection reset by peer" (issue 33)."""
    import multiprocessing
    import signal

    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_sleep)
    child.start()
    ours.send_bytes(b"x" * 1000)  # the child holds its end of the pipe and never reads this
    theirs.close()
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    with pytest.raises(EOFError):
        m.read_link(ours, "res")
