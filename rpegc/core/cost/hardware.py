"""Calibrated hardware parameters (paper Sec. V-A3 and App. C-A2; spec 1.3) and TOML profiles.

A profile is a TOML file, shipped ones live in `rpegc/hardware/<name>.toml`:

    name = "gh200"
    gpus_per_node = 4            # optional, informational
    [compute]   F_peak, BW_mem, gamma_M, gamma_K, c_ng, B_cal, optional t_layer, F_peak_fp32 and rope_* (default 0)
    [memory]    M_GPU, eps_rt
    [collective.<tier>]  alpha, beta      for each tier in intra_node, inter_node, inter_rack
    [p2p.<tier>]         alpha, beta
    [host]      optional: cores, verify_call, [host.verify] (the verifier pool's host, core/cost/host.py),
                checkpoint_file, checkpoint_tensor, checkpoint_rate, checkpoint_disk_rate, checkpoint_keep_tensor,
                checkpoint_keep_rate, checkpoint_commit* (checkpoint writes, core/cost/checkpoint.py)
    [overhead]  optional: per-call and per-token fixed costs of each role's operators, the control round trip per
                node (generation_call, generation_token, inference_*, training_*, node; default 0)
    [attention] optional: head_dim and the attention kernel's seconds per row and query head of one call at 1, 2, ...
                positions: forward, backward, decode (core/cost/attention.py; absent: attention priced by its FLOPs)
    [meta]      free-form (calibration date, notes)

`beta` is an inverse bandwidth in s/B. Every error names the file, the key and (where it can be
found) the TOML line, and is located at the cluster that asked for the profile.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rpegc.core.ir.geometry import TIERS
from rpegc.core.ir.errors import Loc, RpegError, utf8_text
from rpegc.core.ir.toml_text import decode_error_position, key_position
from rpegc.core.cost import machine
from rpegc.core.cost.attention import MAX_ENTRY_S, AttentionTable

PROFILE_DIR = Path(__file__).resolve().parents[2] / "hardware"

# (key, meaning, lower bound, lower bound is strict, upper bound). Lower bounds follow the quantity: a
# latency or a saturation constant may be 0, a throughput, bandwidth or capacity may not. Upper bounds are
# physical plausibility, with wide headroom over today's hardware, so that a typo (1e300, a value in the
# wrong unit) is refused instead of silently giving absurd costs or float overflow:
#   F_peak <= 1e17 FLOP/s: ~50x the ~2e15 dense low-precision peak of the fastest 2025 GPU;
#   BW_mem <= 1e14 B/s: ~12x the 8 TB/s of HBM3e;
#   gamma_M, gamma_K <= 1e7 rows/columns: beyond any model width or token batch;
#   c_ng, t_layer <= 10 s per layer call: a layer call is micro- to milliseconds;
#   B_cal <= 1e7 sequences;
#   M_GPU <= 1e14 B (100 TB): ~500x the largest GPU memory today (192 GB);
#   alpha <= 10 s: a message latency is microseconds; beta >= 1e-16 s/B (at most 10 PB/s per link, ~5000x
#   NVLink 5) and <= 1e-3 s/B (at least 1 kB/s).
_COMPUTE_KEYS = (
    ("F_peak", "calibrated compute ceiling per GPU, FLOP/s", 0.0, True, 1e17),
    ("BW_mem", "calibrated HBM bandwidth per GPU, B/s", 0.0, True, 1e14),
    ("gamma_M", "GEMM row-saturation constant, rows", 0.0, False, 1e7),
    ("gamma_K", "GEMM width-saturation constant, columns", 0.0, False, 1e7),
    ("c_ng", "per-layer non-GEMM residual at B_cal, s", 0.0, False, 10.0),
    ("B_cal", "per-device batch used to fit c_ng, sequences", 0.0, True, 1e7),
)
# Optional compute keys (key, meaning, lower bound, strict, upper bound, default). Not in the source:
# t_layer is the shape-independent time of one layer's forward call (kernel dispatch and launch), which the
# eta roofline cannot express (it scales with the GEMM width). Negligible next to the GEMMs of large
# models on GPUs (shipped GPU profiles leave it 0, the spec's model); it dominates small models on
# CPU workers, where rpeg-calibrate fits it (bench/validation/README.md).
# F_peak_fp32 is the ceiling of float32 GEMMs, which price the training operators of a 16-bit workload that train in
# precision = fp32 (core/ir/training.py); F_peak is the ceiling of the workload's own dtype. Default (None): F_peak.
# rope_*: what a model with rotary position embeddings (the torch backend builds them for a Hugging Face checkpoint)
# computes per layer beyond the forwards t_layer and F_peak were fitted to (learned positions): its queries' and keys'
# rotations, a fixed part per layer call and a part per rotated element, in the forward and in the backward
# (core/cost/optime.py `rope_time`). Default 0: not priced (the spec's model; shipped GPU profiles).
_OPTIONAL_COMPUTE_KEYS = (
    ("t_layer", "fixed time of one layer's forward call, s", 0.0, False, 10.0, 0.0),
    ("F_peak_fp32", "calibrated float32 GEMM ceiling per GPU (precision = fp32 training of a 16-bit workload), "
                    "FLOP/s; default F_peak", 0.0, True, 1e17, None),
    ("rope_call", "fixed time of one layer's RoPE rotation of its queries and keys in one forward call, s", 0.0, False,
     10.0, 0.0),
    ("rope_element", "time per query or key element one layer's forward rotates, s", 0.0, False, 10.0, 0.0),
    ("rope_backward_call", "fixed time of the backward of one layer's RoPE rotation, s", 0.0, False, 10.0, 0.0),
    ("rope_backward_element", "time per query or key element of the backward of one layer's RoPE rotation, s", 0.0,
     False, 10.0, 0.0),
)
_MEMORY_KEYS = (
    ("M_GPU", "HBM capacity per GPU, B", 0.0, True, 1e14),
    ("eps_rt", "reserved runtime fraction of HBM, in [0, 1)", 0.0, False, 1.0),
)
_LINK_KEYS = (
    ("alpha", "latency, s", 0.0, False, 10.0),
    ("beta", "inverse bandwidth, s/B", 1e-16, False, 1e-3),
)
# gpus_per_node: 1..1024 (the largest single-node systems today hold 72 GPUs in one NVLink domain).
MAX_GPUS_PER_NODE = 1024
_TOP_KEYS = ("name", "description", "gpus_per_node", "compute", "memory", "collective", "p2p", "host", "overhead",
             "attention", "meta")
# [attention] (core/cost/attention.py): the head size its entries were timed at, and per call kind the seconds per row
# and query head at 1, 2, ... positions
_ATTENTION_LISTS = (("forward", "a forward over as many queries and keys"),
                    ("backward", "the backward of that forward"), ("decode", "one query over as many keys"))
MAX_ATTENTION_POSITIONS = 4096
MAX_HEAD_DIM = 1024
# [host]: the CPU side of a node, where verify vertices run their reward function in a pool of processes. `cores` is
# a node's host cores (each device's worker process takes one, a pool process another or shares a device's: see
# cost/host.py); `verify_call` the fixed time
# of one verify operator (handing the responses to the pool and collecting the scores); [host.verify] the seconds one
# call of a built-in reward function takes on one core, per response (rpeg-calibrate measures them). Upper bounds:
# 1e6 cores, 60 s per call or response (a sandbox that runs longer is not a reward function for a training step).
# `checkpoint_file`, `checkpoint_tensor` and `checkpoint_rate` price a run's checkpoint writes (cost/checkpoint.py): the
# fixed time of one shard file, of one tensor in it, and the bytes per second a worker serialises, writes and fsyncs;
# a profile without the rate leaves checkpoints unpriced (rpeg-run says so). `checkpoint_disk_rate`: the bytes per
# second of the part of the writes a node's workers do not do in parallel (its disk takes them one after the other);
# left out, a node's writers do not slow each other. `checkpoint_keep_tensor` and `checkpoint_keep_rate`: the fixed
# time per tensor and the bytes per second of the copy a worker keeps of a version a later checkpoint saves (staleness
# > 0); left out, keeps are not priced. `checkpoint_commit` and `checkpoint_commit_tensor`: the time the run's
# controller takes per checkpoint once its parts are in (its index, the directory's rename into place, the pruning),
# dispatching nothing meanwhile, a fixed part and a part per tensor the index lists; left out, 0. Upper bounds: 60 s
# per file, tensor or commit, 1e12 B/s.
MAX_HOST_CORES = 10**6
_HOST_KEYS = (("cores", "host CPU cores per node"), ("verify_call", "fixed time of one verify operator, s"),
              ("verify", "seconds per response of each built-in reward function"),
              ("verify_witness", "s of the speed witness a verifier pool's process ends its share of a verify "
                                 "operator with, at the speed its built-ins were priced at"),
              ("checkpoint_file", "fixed time of one checkpoint shard file (open, fsync, close), s"),
              ("checkpoint_tensor", "fixed time of one tensor of a checkpoint shard file (header, hash, write), s"),
              ("checkpoint_rate", "bytes per second a worker writes a checkpoint's shard files at (serialise, write, "
                                  "fsync)"),
              ("checkpoint_disk_rate", "bytes per second of the part of a node's checkpoint writes its workers do not "
                                       "do in parallel"),
              ("checkpoint_keep_tensor", "fixed time per tensor of a version a worker keeps for a later checkpoint, s"),
              ("checkpoint_keep_rate", "bytes per second a worker copies a version it keeps for a later checkpoint "
                                       "at"),
              ("checkpoint_commit", "time the run's controller takes per checkpoint once its parts are in (index, "
                                    "rename, pruning), s"),
              ("checkpoint_commit_tensor", "the same per tensor the checkpoint's index lists, s"))
MAX_VERIFY_S = 60.0
MAX_CHECKPOINT_S = 60.0
MAX_CHECKPOINT_RATE = 1e12
# The [host] keys that are one number: (key, 0 excluded, upper bound).
_HOST_NUMBERS = (("verify_call", False, MAX_VERIFY_S), ("verify_witness", False, MAX_VERIFY_S),
                 ("checkpoint_file", False, MAX_CHECKPOINT_S), ("checkpoint_tensor", False, MAX_CHECKPOINT_S),
                 ("checkpoint_rate", True, MAX_CHECKPOINT_RATE), ("checkpoint_disk_rate", True, MAX_CHECKPOINT_RATE),
                 ("checkpoint_keep_tensor", False, MAX_CHECKPOINT_S),
                 ("checkpoint_keep_rate", True, MAX_CHECKPOINT_RATE), ("checkpoint_commit", False, MAX_CHECKPOINT_S),
                 ("checkpoint_commit_tensor", False, MAX_CHECKPOINT_S))
# [overhead]: what running an operator costs beyond its kernels (not in the source; core/cost/optime.py). A run of a
# small model spends most of each operator in per-call framework work (Python, tensor set-up, sampling, the loss and
# the optimizer's fixed part) and most of the gaps between operators in the runtime's control round trip, which the
# roofline cannot express. CPU profiles calibrate them (tools/overhead_timing.py); GPU profiles leave them 0 (the
# spec's model), where they are small next to the kernels of the models they train.
_OVERHEAD_KEYS = (
    ("generation_call", "s per microbatch of a generation operator (its decode loop's fixed part)"),
    ("generation_token", "s per token of one row of a generation operator (prompt and response)"),
    ("inference_call", "s per microbatch of an inference operator"),
    ("inference_token", "s per token of one row of an inference operator (prompt and response)"),
    ("training_call", "s per microbatch of a training operator (the loss, the backward's set-up, the optimizer's "
                      "fixed part)"),
    ("training_token", "s per token of one row of a training operator"),
    ("recompute_call", "s per microbatch of each forward a training operator recomputes, beyond its kernels (the "
                       "recomputation's own calls; recompute = interval or full)"),
    ("recompute_token", "s per token of one row of each forward a training operator recomputes"),
    ("transfer", "s per Comm or Reshard node beside its link's alpha and beta (both workers' handling, one message "
                 "per field)"),
    ("transfer_weights", "s per Comm or Reshard node that moves a model's weights (a publication, a reshard) beside its "
                         "link's alpha and beta: one large message, which costs more to hand over than a field's "
                         "(left out: transfer)"),
    ("node", "s per exec node: the runtime's control round trip (a completion's report, the controller's "
             "reaction, the next command) on a host whose cores the plan's processes all take"),
    ("node_free", "s per exec node: the same round trip on a host where the plan leaves a core free (left out: "
                  "node)"),
    ("contention", "s of operator time per exec node that the runtime's own threads take from the operators on a "
                   "host whose cores the plan's processes all take (core/cost/contention.py)"),
    ("co_busy", "what an operator's time grows by (a fraction) where every other core of its host computes an "
                "operator of its allocation beside it (its dp, tp or pp siblings: core/cost/contention.py)"),
    ("co_run", "what an operator's time grows by (a fraction) where every other core of its host computes something "
               "else beside it: another vertex's operator or a verifier pool's process that the schedule overlaps "
               "with it (core/cost/contention.py; left out: overlaps are not priced)"),
    ("witness", "s per operator: the speed witness (runtime/speed_probe.py) a CPU worker runs as it ends each "
                "operator, at the speed the operators were priced at, which rpeg-run holds the run's workers' "
                "witnesses against (left out: no witness runs)"),
)
MAX_OVERHEAD_S = 10.0


@dataclass(frozen=True)
class Overhead:
    """The [overhead] table (all 0 where a profile leaves it out): per-call and per-token fixed costs of each role's
    operators beside its kernels (and of a training operator's recomputed forwards), the control round trip of every
    exec node (where the plan's processes take every core of its host, and where they leave one free), the operator
    time the runtime's threads take from the operators on a host without a free core, what an operator's time
    grows by with its siblings computing on the host's other cores, or with other operators and processes computing
    there, and the speed witness every operator ends with."""

    generation_call: float = 0.0
    generation_token: float = 0.0
    inference_call: float = 0.0
    inference_token: float = 0.0
    training_call: float = 0.0
    training_token: float = 0.0
    recompute_call: float = 0.0
    recompute_token: float = 0.0
    transfer: float = 0.0
    transfer_weights: float | None = None  # None: transfer
    node: float = 0.0
    node_free: float | None = None  # None: node
    contention: float = 0.0
    co_busy: float = 0.0
    co_run: float = 0.0
    witness: float = 0.0

    def call(self, role: str) -> float:
        return getattr(self, f"{role}_call")

    def token(self, role: str) -> float:
        return getattr(self, f"{role}_token")

    def transfer_cost(self, weights):
        """A transfer's fixed cost beside its link's terms: a weights move's (`weights`: a bool or a bool array) or a
        field's."""
        heavy = self.transfer if self.transfer_weights is None else self.transfer_weights
        return self.transfer + weights * (heavy - self.transfer)

    def round_trip(self, full):
        """The control round trip of a node on a host whose cores the plan takes (`full`: a bool or a bool array)
        or leaves one free."""
        free = self.node if self.node_free is None else self.node_free
        return free + full * (self.node - free)


@dataclass(frozen=True)
class Hardware:
    """Per-GPU calibrated constants; link parameters are tuples indexed like `geometry.TIERS`."""

    name: str
    F_peak: float
    BW_mem: float
    gamma_M: float
    gamma_K: float
    c_ng: float
    B_cal: float
    M_GPU: float
    eps_rt: float
    alpha_coll: tuple[float, float, float]
    beta_coll: tuple[float, float, float]
    alpha_p2p: tuple[float, float, float]
    beta_p2p: tuple[float, float, float]
    gpus_per_node: int | None = None
    description: str = ""
    source: str = "<dict>"
    t_layer: float = 0.0  # s per layer per forward call (optional key, see _OPTIONAL_COMPUTE_KEYS)
    F_peak_fp32: float | None = None  # float32 GEMM ceiling (optional key); None: F_peak
    rope_call: float = 0.0  # s per layer call of a RoPE model's rotations, forward (optional key)
    rope_element: float = 0.0  # s per rotated element, forward (optional key)
    rope_backward_call: float = 0.0  # the same of the backward (optional key)
    rope_backward_element: float = 0.0
    # Where it was calibrated ([meta]; free-form there, read when they are strings): rpeg-calibrate writes them
    calibrated: str = ""  # meta.date
    host: str = ""  # meta.host
    machine_key: str = ""  # meta.machine_key: machine.machine_key() of the calibrating machine (CPU profiles)
    speed_probe_s: float | None = None  # meta.speed_probe_s: runtime/speed_probe.py's probe when it was calibrated
    host_cores: int | None = None  # [host] cores: a node's host CPU cores; None: the profile does not say
    verify_call: float = 0.0  # [host] verify_call: s per verify operator
    verify_s: tuple[tuple[str, float], ...] = ()  # [host.verify]: (built-in reward function, s per response)
    verify_witness: float = 0.0  # [host] verify_witness: s of a pool process's speed witness
    checkpoint_file: float = 0.0  # [host] checkpoint_file: s per checkpoint shard file
    checkpoint_tensor: float = 0.0  # [host] checkpoint_tensor: s per tensor of a checkpoint shard file
    checkpoint_rate: float | None = None  # [host] checkpoint_rate: B/s of a checkpoint write; None: not priced
    checkpoint_disk_rate: float | None = None  # [host] checkpoint_disk_rate: B/s a node's writers share; None: none
    checkpoint_keep_tensor: float = 0.0  # [host] checkpoint_keep_tensor: s per tensor of a kept version's copy
    checkpoint_keep_rate: float | None = None  # [host] checkpoint_keep_rate: B/s of a kept version's copy; None: free
    checkpoint_commit: float = 0.0  # [host] checkpoint_commit: s the controller takes per checkpoint once it is written
    checkpoint_commit_tensor: float = 0.0  # [host] checkpoint_commit_tensor: the same per tensor its index lists
    overhead: Overhead = Overhead()  # [overhead]: operators' fixed costs beyond their kernels, the control round trip
    attention: AttentionTable | None = None  # [attention]: the attention kernel's time per row and head; None: FLOPs

    def provenance(self) -> str:
        """Whose machine the profile describes, for the summaries: this one's, or which other one's."""
        when = f", calibrated {self.calibrated[:10]}" if self.calibrated else ""
        if self.machine_key and self.machine_key == machine.machine_key():
            return f"this machine's profile ({self.source}{when})"
        if self.machine_key or self.host:
            return f"another machine's profile ({self.host or 'unknown host'}{when}; {self.source})"
        return f"shipped profile ({self.source})"

    def per_response(self, fn: str) -> float | None:
        """The calibrated seconds per response of the built-in reward function `fn`, or None."""
        return dict(self.verify_s).get(fn)

    def peak(self, fp32: bool) -> float:
        """The GEMM ceiling of a computation in float32 (`fp32`) or in the workload's dtype."""
        return self.F_peak_fp32 if fp32 and self.F_peak_fp32 is not None else self.F_peak

    @property
    def M_eff(self) -> float:
        """Usable HBM per GPU, (1 - eps_rt) * M_GPU (spec 6.6)."""
        return (1.0 - self.eps_rt) * self.M_GPU

    def coll(self, tier):
        """(alpha, beta) of the collective family at `tier`: a tier name or an array of TIERS indices."""
        return _pick(self.alpha_coll, tier), _pick(self.beta_coll, tier)

    def p2p(self, tier):
        """(alpha, beta) of the point-to-point family at `tier` (name or array of TIERS indices)."""
        return _pick(self.alpha_p2p, tier), _pick(self.beta_p2p, tier)

    @staticmethod
    def from_dict(d: Mapping[str, Any], *, source: str = "<dict>", loc: Loc | None = None, text: str | None = None) -> "Hardware":
        """Validate a profile given as the nested mapping a TOML profile parses to."""
        return _from_mapping(d, _Where(source, loc, text))


def _pick(values: tuple[float, float, float], tier):
    if isinstance(tier, str):
        return values[TIERS.index(tier)]
    return np.asarray(values)[np.asarray(tier)]


def profile_names() -> list[str]:
    """The profile names: `cpu` (this machine's) and those shipped in rpegc/hardware/."""
    return sorted([machine.CPU, *(p.stem for p in PROFILE_DIR.glob("*.toml"))])


def load_hardware(name_or_path: str, loc: Loc | None = None) -> Hardware:
    """A shipped profile by name, or a TOML file by path.

    A relative path is tried against the directory of the file `loc` points into (the `.rpeg`
    module naming it) first, then against the working directory. Errors inside the profile are located
    in the profile (line and column of the key, with its source line) and name the cluster at `loc`.
    """
    path = _resolve(name_or_path, loc)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise RpegError(loc, f"cannot read hardware profile '{path}': {err.strerror}; check the path") from None
    text = utf8_text(raw, str(path), f"the hardware profile is not valid UTF-8 text{_for(loc)}; save it as UTF-8")
    where = _Where(str(path), loc, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line, col = decode_error_position(err)
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(err))
        if line:
            raise RpegError(Loc(str(path), line, col or 1), f"the hardware profile is not valid TOML: {message}"
                                                            f"{_for(loc)}; fix the syntax there", source=text) from None
        raise RpegError(loc, f"hardware profile '{path}' is not valid TOML: {message}; fix the syntax there") from None
    return _from_mapping(data, where)


def cluster_hardware(cluster, override: str = "") -> Hardware:
    """The profile of `cluster` (or `override`, a name or path), checked against the cluster's shape.

    The one place a pass or the optimizer gets its Hardware: a profile that states gpus_per_node cannot
    describe a cluster with more GPUs per node (fewer is a partial node and fine)."""
    hw = load_hardware(override or cluster.hardware, cluster.loc)
    if hw.gpus_per_node is not None and cluster.gpus > hw.gpus_per_node:
        raise RpegError(cluster.loc, f"cluster @{cluster.name} has gpus = {cluster.gpus} per node, but its hardware "
                                     f"profile '{hw.source}' has gpus_per_node = {hw.gpus_per_node}; use at most "
                                     f"{hw.gpus_per_node} GPUs per node (gpus in [1, {hw.gpus_per_node}]) or a "
                                     "profile of the node you run on")
    return hw


def program_hardware(p, override: str = "", what: str = "the cost model") -> Hardware:
    """The profile a program is priced with: its cluster's, or `override` (a name or path). Every pass, the
    optimizer and the runtime's memory check resolve it here."""
    if p.cluster is None:
        loc = p.graph.loc if p.graph is not None else p.workload.loc
        raise RpegError(loc, f"{what} needs an rpeg.cluster with a hardware profile; add one to the module")
    return cluster_hardware(p.cluster, override)


def _for(loc: Loc | None) -> str:
    return f" (the profile of the cluster at {loc})" if loc is not None and loc.line > 0 else ""


def _resolve(name_or_path: str, loc: Loc | None) -> Path:
    if name_or_path == machine.CPU:  # this machine's profile, or the one $RPEGC_CPU_PROFILE pins
        pin = machine.pinned()
        return _resolve(pin, loc) if pin not in (None, machine.CPU) else machine.machine_profile(loc)
    looks_like_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    if not looks_like_path:
        shipped = PROFILE_DIR / f"{name_or_path}.toml"
        if shipped.is_file():
            return shipped
        raise RpegError(
            loc,
            f"unknown hardware profile '{name_or_path}'; use one of {', '.join(profile_names())} "
            f"or a path to a .toml profile" + (f" (in ${machine.PIN_ENV})" if name_or_path == machine.pinned() else ""),
        )
    path = Path(name_or_path)
    if not path.is_absolute() and loc is not None and loc.line > 0:
        beside = Path(loc.file).parent / path
        if beside.is_file():
            return beside
    return path


@dataclass(frozen=True)
class _Where:
    source: str
    loc: Loc | None
    text: str | None

    def error(self, key: str, what: str) -> RpegError:
        """At the key's line and column in the profile when it can be found, else at the cluster."""
        line, col = key_position(self.text, key) if self.text else (None, None)
        if line:
            return RpegError(Loc(self.source, line, col or 1), f"{what}{_for(self.loc)}", source=self.text)
        return RpegError(self.loc, f"hardware profile '{self.source}': {what}")


def _from_mapping(d: Mapping[str, Any], where: _Where) -> Hardware:
    for key in d:
        if key not in _TOP_KEYS:
            raise where.error(key, f"unknown key '{key}'; known top-level keys: {', '.join(_TOP_KEYS)}")
    compute = _table(d, "compute", where)
    memory = _table(d, "memory", where)
    values: dict[str, float] = {}
    optional = [k for k, *_ in _OPTIONAL_COMPUTE_KEYS]
    for table_name, table, keys in (("compute", compute, _COMPUTE_KEYS), ("memory", memory, _MEMORY_KEYS)):
        _reject_unknown(table, table_name, [k for k, *_ in keys] + (optional if table_name == "compute" else []), where)
        for key, meaning, bound, strict, upper in keys:
            values[key] = _number(table, f"{table_name}.{key}", key, meaning, bound, strict, upper, where)
    for key, meaning, bound, strict, upper, default in _OPTIONAL_COMPUTE_KEYS:
        values[key] = (_number(compute, f"compute.{key}", key, meaning, bound, strict, upper, where)
                       if key in compute else default)
    links: dict[str, tuple[float, float, float]] = {}
    for family in ("collective", "p2p"):
        fam = _table(d, family, where)
        _reject_unknown(fam, family, list(TIERS), where)
        per_tier = []
        for tier in TIERS:
            link = _table(fam, tier, where, prefix=f"{family}.")
            _reject_unknown(link, f"{family}.{tier}", [k for k, *_ in _LINK_KEYS], where)
            per_tier.append(
                tuple(_number(link, f"{family}.{tier}.{k}", k, m, b, s, u, where) for k, m, b, s, u in _LINK_KEYS)
            )
        links[f"alpha_{family}"] = tuple(a for a, _ in per_tier)
        links[f"beta_{family}"] = tuple(b for _, b in per_tier)
    gpus_per_node = d.get("gpus_per_node")
    if gpus_per_node is not None and (not _is_int(gpus_per_node) or not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE):
        raise where.error("gpus_per_node", f"key 'gpus_per_node' = {gpus_per_node!r} must be an integer in "
                                           f"[1, {MAX_GPUS_PER_NODE}] (GPUs in one node)")
    for key in ("name", "description"):
        if key in d and not isinstance(d[key], str):
            raise where.error(key, f"key '{key}' must be a string, got {d[key]!r}")
    meta = d.get("meta") if isinstance(d.get("meta"), Mapping) else {}
    values.update(_host(d, where))
    if "overhead" in d:
        values["overhead"] = _overhead(_table(d, "overhead", where), where)
    if "attention" in d:
        values["attention"] = _attention(_table(d, "attention", where), where)
    return Hardware(
        calibrated=_text(meta, "date"), host=_text(meta, "host"), machine_key=_text(meta, "machine_key"),
        speed_probe_s=_positive(meta, "speed_probe_s"),
        name=d.get("name", Path(where.source).stem),
        alpha_coll=links["alpha_collective"],
        beta_coll=links["beta_collective"],
        alpha_p2p=links["alpha_p2p"],
        beta_p2p=links["beta_p2p"],
        gpus_per_node=gpus_per_node,
        description=d.get("description", ""),
        source=where.source,
        **values,
    )


def _host(d: Mapping[str, Any], where: _Where) -> dict[str, Any]:
    """The optional [host] table as Hardware fields."""
    if "host" not in d:
        return {}
    host = _table(d, "host", where)
    _reject_unknown(host, "host", [k for k, _ in _HOST_KEYS], where)
    out: dict[str, Any] = {}
    if "cores" in host:
        cores = host["cores"]
        if not _is_int(cores) or not 1 <= cores <= MAX_HOST_CORES:
            raise where.error("host.cores", f"key 'host.cores' = {cores!r} must be an integer in [1, {MAX_HOST_CORES}] "
                                            "(host CPU cores per node)")
        out["host_cores"] = cores
    meaning = dict(_HOST_KEYS)
    for key, strict, upper in _HOST_NUMBERS:  # each a Hardware field of the same name
        if key in host:
            out[key] = _number(host, f"host.{key}", key, meaning[key], 0.0, strict, upper, where)
    if "verify" in host:
        table = _table(host, "verify", where, prefix="host.")
        out["verify_s"] = tuple((fn, _number(table, f"host.verify.{fn}", fn, f"s per response of {fn}", 0.0, True,
                                             MAX_VERIFY_S, where)) for fn in table)
    return out


def _overhead(table: Mapping[str, Any], where: _Where) -> Overhead:
    """The optional [overhead] table; a key left out is 0."""
    _reject_unknown(table, "overhead", [k for k, _ in _OVERHEAD_KEYS], where)
    return Overhead(**{k: _number(table, f"overhead.{k}", k, meaning, 0.0, False, MAX_OVERHEAD_S, where)
                       for k, meaning in _OVERHEAD_KEYS if k in table})


def _attention(table: Mapping[str, Any], where: _Where) -> AttentionTable:
    """The optional [attention] table: a head size and three lists of equal length of seconds >= 0."""
    _reject_unknown(table, "attention", ["head_dim"] + [k for k, _ in _ATTENTION_LISTS], where)
    head_dim = table.get("head_dim")
    if not _is_int(head_dim) or not 1 <= head_dim <= MAX_HEAD_DIM:
        raise where.error("attention.head_dim", f"key 'attention.head_dim' = {head_dim!r} must be an integer in "
                                                f"[1, {MAX_HEAD_DIM}] (the head size the table was timed at)")
    lists = {}
    for key, meaning in _ATTENTION_LISTS:
        full = f"attention.{key}"
        values = table.get(key)
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_ATTENTION_POSITIONS:
            raise where.error(full, f"key '{full}' must be a list of 1 to {MAX_ATTENTION_POSITIONS} numbers (s per row "
                                    f"and query head of {meaning}, at 1, 2, ... positions), got {values!r}")
        lists[key] = tuple(_number({key: v}, f"{full}[{i}]", key, f"s per row and query head of {meaning}", 0.0,
                                   False, MAX_ENTRY_S, where) for i, v in enumerate(values))
    if len({len(v) for v in lists.values()}) != 1:
        lengths = ", ".join(f"{k} {len(v)}" for k, v in lists.items())
        raise where.error("attention.forward", f"the [attention] lists must cover the same positions; got {lengths}")
    return AttentionTable(head_dim, lists["forward"], lists["backward"], lists["decode"])


def _text(meta: Mapping[str, Any], key: str) -> str:
    return meta[key] if isinstance(meta.get(key), str) else ""


def _positive(meta: Mapping[str, Any], key: str) -> float | None:
    """A positive finite number of [meta] (free-form: anything else reads as absent)."""
    v = meta.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else None


def _table(d: Mapping[str, Any], key: str, where: _Where, prefix: str = "") -> Mapping[str, Any]:
    full = prefix + key
    if key not in d:
        raise where.error(full, f"missing table [{full}]; add it (see rpegc/hardware/gh200.toml for the layout)")
    value = d[key]
    if not isinstance(value, Mapping):
        raise where.error(full, f"key '{full}' must be a table [{full}], got {value!r}")
    return value


def _reject_unknown(table: Mapping[str, Any], name: str, known: list[str], where: _Where) -> None:
    for key in table:
        if key not in known:
            raise where.error(f"{name}.{key}", f"unknown key '{name}.{key}'; [{name}] takes {', '.join(known)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(table: Mapping[str, Any], full: str, key: str, meaning: str, bound: float, strict: bool, upper: float,
            where: _Where) -> float:
    if key not in table:
        raise where.error(full, f"missing key '{full}' ({meaning}); add it")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(full, f"key '{full}' must be a number ({meaning}), got {value!r}")
    value = float(value)
    too_small = value <= bound if strict else value < bound
    too_large = value >= upper if key == "eps_rt" else value > upper
    if too_small or too_large or value != value:
        low = f"({bound:g}" if strict else f"[{bound:g}"
        high = f"{upper:g})" if key == "eps_rt" else f"{upper:g}]"
        raise where.error(full, f"key '{full}' = {value} is outside the allowed range {low}, {high} ({meaning}); "
                                "check the value and its unit")
    return value
