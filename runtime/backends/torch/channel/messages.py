"""The control channel between the torch backend's controller and its workers: a plain, bounded,
authenticated message schema over the TCPStore (issue 14, item 2).

Messages. Every command, report and the run setup is a dict with a `type` from a closed registry
(`COMMANDS`, `REPORTS`, `SETUP`: per channel, the known types and the fields each must and may have).
A command is a frozen dataclass (channel/commands.py, which COMMANDS is derived from): `seal` sends it as
that dict (`commands.to_message`) and `unseal` returns the dataclass again once the dict passed the schema;
reports and the setup stay dicts.
Values are plain JSON (None, bool, int, float, str, list, dict with str keys) plus three tagged forms that
JSON lacks: tuples {"$tuple": [...]}, dicts with other keys {"$dict": [[k, v], ...]} and the dataclasses
of `classes()` {"$class": NAME, "args": [...]} (their init fields in order: layouts, routes, a fusion's
member commands and an operator's prep steps, the run config); decoding rebuilds them through their
constructors, so a Layout is checked again where it lands. Nothing else is encodable: a tensor, a
pickle or an unknown class makes `seal` fail with a one-line error, and decoding never unpickles.
Checkpoints and final weights never travel here: each worker writes its shards to the run directory and
reports the file's name, size, SHA-256 and per-tensor boxes (checkpoints/shard_files.py).

Bounds. A message has at most `limit(channel, msg)` bytes (setup 1 MiB, command 2 MiB, report 64 KiB,
an export report 1 MiB: its per-tensor boxes grow with the model's parameter count, ~100 bytes each),
lists at most MAX_ITEMS items, nesting at most MAX_DEPTH levels.

Authentication. Each run draws a 32-byte secret (`new_secret`). A sealed message is the hex
HMAC-SHA256 tag of its body followed by the body, a JSON object {"ch": channel, "from": sender, "seq":
n, "msg": ...}: the tag covers the channel (a message replayed onto another key fails) and the sender's
sequence number (a message replayed on its own channel is out of sequence). The receiver checks the
size, then the tag (hmac.compare_digest), then the channel, the sequence and the schema; a message that
fails any check is dropped and logged (`Endpoint.drop`), never executed.

Channels: `setup` (a key, written once by the controller), `cmd/R` (commands to worker rank R, in order)
and `res` (reports from every worker to the controller). Externally launched workers (torchrun, Slurm)
reach `cmd/R` and `res` as store queues, in which a receiver blocks (`Endpoint.receive`) instead of polling
with short timeouts. Workers rpeg-run forks itself carry `cmd/R` and `res` over a private pipe each (an
`Endpoint` link): the same sealed messages, one hop instead of the store's three (push, wake, pop), which
is most of the control overhead per node; nobody else can reach a pipe, and its messages are checked all
the same. The setup and the process groups stay on the store either way.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Callable, Optional, Union

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.backends.torch.channel import commands
from rpegc.runtime.backends.torch.channel.commands import Command

SECRET_BYTES = 32
SECRET_ENV = "RPEG_RUN_SECRET_FILE"  # where an externally launched worker finds the run's secret
TAG_CHARS = 64  # hex digits of an HMAC-SHA256 tag
MAX_ITEMS = 100_000
MAX_DEPTH = 16
MAX_LOGGED = 20  # drops logged one line each; later ones are only counted

SETUP_BYTES = 1 << 20
COMMAND_BYTES = 2 << 20
REPORT_BYTES = 64 << 10
EXPORT_REPORT_BYTES = 1 << 20


class MessageError(RpegError):
    """A message that cannot be sent (not plain, too large) or read (not authentic, malformed)."""

    def __init__(self, message: str):
        super().__init__(None, message)


@dataclass(frozen=True)
class MessageType:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


def _message_type(cls: type) -> MessageType:
    return MessageType(*commands.required_optional(cls))


COMMANDS = {c.type: _message_type(c) for c in commands.COMMAND_CLASSES}  # declared once, in channel/commands.py
REPORTS = {
    "ready": MessageType(("rank", "groups")),
    # peak: bytes held above the start-up size; resident: the resident high-water mark above it (peak_memory.py);
    # cpu: its threads' cores from ready to stop (thread_cpu.usage)
    "bye": MessageType(("rank",), ("peak", "resident", "cpu")),
    "error": MessageType(("node", "what", "rank", "message")),
    "done": MessageType(("node", "rank", "start", "finish", "mem"),
                        ("bytes", "versions_in", "versions_out", "metrics", "reward_stats",
                         "export", "file", "sha256", "write_s", "tensors", "microtasks", "waited", "witness")),
    "eof": MessageType(()),  # the controller's own, to end its receiving thread
}
SETUP = {"setup": MessageType(("setup",))}


def channel_kind(channel: str) -> str:
    """setup, cmd or res: what `channel` carries."""
    kind = channel.split("/", 1)[0]
    if kind not in ("setup", "cmd", "res"):
        raise MessageError(f"unknown control channel '{channel}'")
    return kind


def schema(channel: str) -> dict[str, MessageType]:
    return {"setup": SETUP, "cmd": COMMANDS, "res": REPORTS}[channel_kind(channel)]


def limit(channel: str, msg: Optional[dict] = None) -> int:
    """Most bytes a sealed `msg` on `channel` may have (None: any message there)."""
    kind = channel_kind(channel)
    if kind == "setup":
        return SETUP_BYTES
    if kind == "cmd":
        return COMMAND_BYTES
    return EXPORT_REPORT_BYTES if msg is None or _is_export_report(msg) else REPORT_BYTES


@functools.cache
def classes() -> dict[str, type]:
    """The dataclasses a message may carry, by name (imported here: the worker imports this module)."""
    from rpegc.core.ir.errors import Loc
    from rpegc.core.ir.program import Arch, Workload
    from rpegc.core.ir.training import TrainSpec, Training
    from rpegc.runtime.backends.torch.rl.datasets import DataConfig
    from rpegc.runtime.backends.torch.parallel.layout import Layout, RowMove, WeightMove
    from rpegc.runtime.backends.torch.run_config import RunConfig
    from rpegc.runtime.backends.torch.rl.step import RLConfig
    from rpegc.runtime.backends.torch.channel.worker_setup import ModelSpec, WorkerSetup

    return {c.__name__: c for c in (Loc, Arch, Workload, TrainSpec, Training, Layout, RowMove, WeightMove, RunConfig, RLConfig,
                                    DataConfig, ModelSpec, WorkerSetup, *commands.NESTED)}


@functools.cache
def _init_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.init)


# -- plain values ------------------------------------------------------------------------------------

_PRIMITIVES = (type(None), bool, int, float, str)


def to_plain(v: Any, *, depth: int = 0) -> Any:
    """`v` as plain JSON values (see the module doc); anything else is a MessageError."""
    if type(v) in _PRIMITIVES:
        return v
    if depth >= MAX_DEPTH:
        raise MessageError(f"a message nests deeper than {MAX_DEPTH} levels")
    d = depth + 1
    t = type(v)
    if t is list or t is tuple:
        if len(v) > MAX_ITEMS:
            raise MessageError(f"a message holds a list of {len(v)} items, more than {MAX_ITEMS}")
        items = [x if type(x) in _PRIMITIVES else to_plain(x, depth=d) for x in v]
        return items if t is list else {"$tuple": items}
    if t is dict:
        if len(v) > MAX_ITEMS:
            raise MessageError(f"a message holds a dict of {len(v)} items, more than {MAX_ITEMS}")
        if all(type(k) is str and not k.startswith("$") for k in v):
            return {k: to_plain(x, depth=d) for k, x in v.items()}
        return {"$dict": [[to_plain(k, depth=d), to_plain(x, depth=d)]
                          for k, x in v.items()]}
    if classes().get(t.__name__) is t:
        return {"$class": t.__name__,
                "args": [to_plain(getattr(v, n), depth=d) for n in _init_fields(t)]}
    raise MessageError(f"a {t.__name__} cannot travel over the control channel (plain values and "
                       f"{', '.join(sorted(classes()))} only; tensors go over torch.distributed or to files)")


def from_plain(v: Any, *, depth: int = 0) -> Any:
    """The value `to_plain` encoded; a MessageError for anything outside the schema."""
    t = type(v)
    if t in _PRIMITIVES:
        return v
    if depth >= MAX_DEPTH:
        raise MessageError(f"nests deeper than {MAX_DEPTH} levels")
    d = depth + 1
    if t is list:
        if len(v) > MAX_ITEMS:
            raise MessageError(f"holds a list of {len(v)} items, more than {MAX_ITEMS}")
        return [x if type(x) in _PRIMITIVES else from_plain(x, depth=d) for x in v]
    if t is not dict:
        raise MessageError(f"holds a {t.__name__}")
    if len(v) > MAX_ITEMS:
        raise MessageError(f"holds a dict of {len(v)} items, more than {MAX_ITEMS}")
    if not any(k.startswith("$") for k in v):
        return {k: from_plain(x, depth=d) for k, x in v.items()}
    (key, body), = v.items() if len(v) == 1 else ((None, None),)
    if key == "$tuple" and type(body) is list:
        return tuple(from_plain(body, depth=d))
    if key == "$dict" and type(body) is list:
        return _dict_from_pairs(from_plain(body, depth=d))
    if set(v) == {"$class", "args"} and type(v["args"]) is list:
        return _instance(v["$class"], from_plain(v["args"], depth=d))
    raise MessageError(f"holds an unknown tagged value {sorted(k for k in v if k.startswith('$'))}")


def _dict_from_pairs(pairs: list) -> dict:
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        raise MessageError("holds a malformed $dict")
    try:
        return {k: x for k, x in pairs}
    except TypeError:
        raise MessageError("holds a dict key that is not hashable") from None


def _instance(name: Any, args: list) -> Any:
    cls = classes().get(name) if type(name) is str else None
    if cls is None:
        raise MessageError(f"holds an object of unknown class {name!r}")
    names = _init_fields(cls)
    if len(args) != len(names):
        raise MessageError(f"gives {name} {len(args)} fields, it has {len(names)} ({', '.join(names)})")
    try:
        return cls(**dict(zip(names, args)))  # by name: a command's fields are keyword-only
    except (TypeError, ValueError, RpegError) as e:
        raise MessageError(f"holds an invalid {name}: {getattr(e, 'message', e)}") from None


def check_schema(channel: str, msg: Any) -> None:
    """That `msg` is a dict of a known type on `channel`, with the fields that type has."""
    if not isinstance(msg, dict):
        raise MessageError(f"is a {type(msg).__name__}, not a message")
    t = msg.get("type")
    known = schema(channel)
    if t not in known:
        raise MessageError(f"has unknown type {t!r} (known on {channel_kind(channel)}: {', '.join(sorted(known))})")
    spec = known[t]
    missing = [f for f in spec.required if f not in msg]
    extra = sorted(set(msg) - {"type", *spec.required, *spec.optional})
    if missing or extra:
        raise MessageError(f"{t} message " + "; ".join(
            ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown fields {', '.join(extra)}"] if extra else [])))


# -- sealing -----------------------------------------------------------------------------------------

def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _tag(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).hexdigest().encode("ascii")


def _is_export_report(msg: dict) -> bool:
    return msg.get("type") == "done" and "export" in msg


@dataclass(frozen=True)
class Envelope:
    sender: str
    seq: int
    msg: Any  # a dict, or on a cmd channel the Command


Message = Union[dict, Command]  # a report or the setup (a dict), or a command


def seal(secret: bytes, channel: str, sender: str, seq: int, message: Message) -> bytes:
    """`message` as the tagged bytes the store holds (TAG BODY); a MessageError if it is not a valid, small message."""
    msg = commands.to_message(message) if isinstance(message, Command) else message
    check_schema(channel, msg)
    if channel_kind(channel) == "cmd" and msg is message:  # a dict would bypass the commands' declared fields
        raise MessageError(f"a {msg['type']} command is sent as its dataclass "
                           f"(commands.{commands.BY_TYPE[msg['type']].__name__}), not as a dict")
    plain = to_plain(msg)
    body = json.dumps({"ch": channel, "from": sender, "seq": seq, "msg": plain}, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")
    most = limit(channel, msg)
    if TAG_CHARS + len(body) > most:
        raise MessageError(f"a {msg['type']} message of {TAG_CHARS + len(body)} bytes exceeds the control "
                           f"channel's limit of {most} bytes on {channel}")
    return _tag(secret, body) + body


def unseal(secret: bytes, channel: str, raw: bytes) -> Envelope:
    """The authentic message in `raw`, read from `channel`; a MessageError saying why not."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    most = limit(channel)
    if len(raw) > most:
        raise MessageError(f"oversized ({len(raw)} bytes, the limit is {most})")
    tag, body = raw[:TAG_CHARS], raw[TAG_CHARS:]
    if len(tag) < TAG_CHARS or not hmac.compare_digest(tag, _tag(secret, body)):
        raise MessageError("not authenticated (no valid tag for this run's secret)")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise MessageError("authenticated but not JSON") from None
    if not isinstance(data, dict) or set(data) != {"ch", "from", "seq", "msg"}:
        raise MessageError("authenticated but not an envelope")
    if data["ch"] != channel:
        raise MessageError(f"sealed for channel {data['ch']!r}, read from {channel!r} (a replay)")
    if not isinstance(data["from"], str) or type(data["seq"]) is not int or not isinstance(data["msg"], dict):
        raise MessageError("authenticated but its sender, sequence number or message is malformed")
    msg = from_plain(data["msg"])
    check_schema(channel, msg)
    if len(raw) > limit(channel, msg):
        raise MessageError(f"a {msg['type']} message of {len(raw)} bytes, over its limit of {limit(channel, msg)}")
    return Envelope(data["from"], data["seq"], _command(msg) if channel_kind(channel) == "cmd" else msg)


def _command(msg: dict) -> Command:
    try:
        return commands.from_message(msg)
    except (TypeError, ValueError, RpegError) as e:
        raise MessageError(f"holds an invalid {msg['type']} command: {getattr(e, 'message', e)}") from None


# -- endpoints ---------------------------------------------------------------------------------------

@dataclass
class Endpoint:
    """One side's view of the channel: seals what it sends (its own sequence number per channel) and
    accepts only authentic, in-sequence messages (per channel and sender), dropping and logging the rest.

    `store` is a torch.distributed Store (or anything with set/get/queue_push/queue_pop/wait)."""

    store: Any
    secret: bytes
    name: str
    log: Callable[[str], None]
    # channel -> multiprocessing Connection that carries it instead of the store (forked workers)
    links: dict[str, Any] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    dropped: int = 0
    # After an interrupt (SIGINT/SIGTERM raises in the main thread, possibly between reading a message and
    # accepting it) a message may have been read and lost: then a later number than expected is accepted
    # (a replay, an earlier number, is still dropped).
    allow_gaps: bool = False

    def _seal(self, channel: str, msg: Message) -> bytes:
        seq = self.sent.get(channel, 0)
        text = seal(self.secret, channel, self.name, seq, msg)
        self.sent[channel] = seq + 1
        return text

    def push(self, channel: str, msg: Message) -> None:
        """Append `msg` to the queue `channel` (its link, if it has one)."""
        link = self.links.get(channel)
        if link is not None:
            link.send_bytes(self._seal(channel, msg))
        else:
            self.store.queue_push(channel, self._seal(channel, msg))

    def put(self, key: str, msg: dict) -> None:
        """Set key `key` to `msg` (the setup: written once, read by every worker)."""
        self.store.set(key, self._seal(key, msg))

    def get(self, key: str) -> dict:
        """The message at key `key` (waiting for it as the store's get does); a MessageError if it is not authentic."""
        env = unseal(self.secret, key, self.store.get(key))
        return env.msg

    def receive(self, channel: str, wait: timedelta) -> Envelope:
        """The next authentic message of queue `channel`, blocking in the store until one comes (a wait of
        `wait` that ends with none raises the store's timeout error). Others are dropped and logged.
        Over a link the wait ends with TimeoutError, and EOFError when the other side is gone."""
        link = self.links.get(channel)
        while True:
            if link is not None:
                if not link.poll(wait.total_seconds()):
                    raise TimeoutError(f"no message on {channel} within {wait}")
                env = self.accept(channel, read_link(link, channel))
            else:
                self.store.wait([channel], wait)
                env = self.accept(channel, self.store.queue_pop(channel, False))
            if env is not None:
                return env

    def accept(self, channel: str, raw: bytes) -> Optional[Envelope]:
        try:
            env = unseal(self.secret, channel, raw)
        except MessageError as e:
            self.drop(channel, e.message)
            return None
        want = self.seen.get((channel, env.sender), 0)
        if env.seq < want or (env.seq > want and not self.allow_gaps):
            what = "a replay" if env.seq < want else "an earlier one is missing"
            self.drop(channel, f"out of sequence from {env.sender} (number {env.seq}, expected {want}: {what})")
            return None
        self.seen[(channel, env.sender)] = env.seq + 1
        return env

    def drop(self, channel: str, why: str) -> None:
        self.dropped += 1
        if self.dropped <= MAX_LOGGED:
            self.log(f"dropped a message on control channel {channel}: {why}")
        if self.dropped == MAX_LOGGED:
            self.log("further dropped messages are counted, not logged")


def read_link(link: Any, channel: str) -> bytes:
    """The next raw message on a link; EOFError once the other side closed it or died (a process killed with
    unread data in its pipe resets it: the health check then names the process and how it ended)."""
    try:
        return link.recv_bytes(limit(channel))
    except (ConnectionResetError, BrokenPipeError):
        raise EOFError(f"the other end of {channel} is gone") from None
    except OSError as e:  # longer than the limit (seal never sends one): the rest of the pipe is unreadable
        raise MessageError(f"the link of {channel} broke: {e}") from None


# -- the secret on disk ------------------------------------------------------------------------------

def write_secret(path: str, secret: bytes) -> None:
    """Write `secret` (hex) to `path`, readable by its owner only (mode 0600), replacing a stale one."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex() + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise MessageError(f"cannot write the control secret {path}: {e.strerror}") from None


def read_secret(path: Optional[str]) -> bytes:
    """The secret in `path` (from --secret-file or RPEG_RUN_SECRET_FILE); a one-line MessageError if
    none is given, it cannot be read, others may read it, or it is not a secret."""
    if not path:
        raise MessageError(f"no control secret: give --secret-file PATH or set {SECRET_ENV}=PATH "
                           "(rpeg-run --store writes the file and prints its path)")
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="ascii") as f:
            text = f.read(4 * SECRET_BYTES).strip()
    except (OSError, UnicodeDecodeError) as e:
        raise MessageError(f"cannot read the control secret {path}: {getattr(e, 'strerror', None) or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise MessageError(f"the control secret {path} is open to other users (mode {stat.S_IMODE(mode):o}); "
                           f"it must be mode 600 (chmod 600 {path})")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise MessageError(f"{path} is not a control secret ({2 * SECRET_BYTES} hex digits)")
    return secret
