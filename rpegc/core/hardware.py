"""Calibrated hardware parameters (paper Sec. V-A3 and App. C-A2; spec 1.3) and TOML profiles.

A profile is a TOML file, shipped ones live in `rpegc/hardware/<name>.toml`:

    name = "gh200"
    gpus_per_node = 4            # optional, informational
    [compute]   F_peak, BW_mem, gamma_M, gamma_K, c_ng, B_cal, optional t_layer (default 0)
    [memory]    M_GPU, eps_rt
    [collective.<tier>]  alpha, beta      for each tier in intra_node, inter_node, inter_rack
    [p2p.<tier>]         alpha, beta
    [meta]      free-form (calibration date, notes)

`beta` is an inverse bandwidth in s/B. Every error names the file, the key and (where it can be
found) the TOML line, and is located at the cluster that asked for the profile.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rpegc.core.devices import TIERS
from rpegc.core.errors import Loc, RpegError

PROFILE_DIR = Path(__file__).resolve().parent.parent / "hardware"

# (key, meaning, lower bound, bound is strict). Bounds follow the quantity: a latency or a
# saturation constant may be 0, a throughput, bandwidth or capacity may not.
_COMPUTE_KEYS = (
    ("F_peak", "calibrated compute ceiling per GPU, FLOP/s", 0.0, True),
    ("BW_mem", "calibrated HBM bandwidth per GPU, B/s", 0.0, True),
    ("gamma_M", "GEMM row-saturation constant, rows", 0.0, False),
    ("gamma_K", "GEMM width-saturation constant, columns", 0.0, False),
    ("c_ng", "per-layer non-GEMM residual at B_cal, s", 0.0, False),
    ("B_cal", "per-device batch used to fit c_ng, sequences", 0.0, True),
)
# Optional compute keys (key, meaning, lower bound, strict, default). Not in the source: t_layer is
# the shape-independent time of one layer's forward call (kernel dispatch and launch), which the
# eta roofline cannot express (it scales with the GEMM width). Negligible next to the GEMMs of large
# models on GPUs (shipped GPU profiles leave it 0, the spec's model); it dominates small models on
# CPU workers, where rpeg-calibrate fits it (bench/validation/README.md).
_OPTIONAL_COMPUTE_KEYS = (
    ("t_layer", "fixed time of one layer's forward call, s", 0.0, False, 0.0),
)
_MEMORY_KEYS = (
    ("M_GPU", "HBM capacity per GPU, B", 0.0, True),
    ("eps_rt", "reserved runtime fraction of HBM, in [0, 1)", 0.0, False),
)
_LINK_KEYS = (
    ("alpha", "latency, s", 0.0, False),
    ("beta", "inverse bandwidth, s/B", 0.0, True),
)
_TOP_KEYS = ("name", "description", "gpus_per_node", "compute", "memory", "collective", "p2p", "meta")


@dataclass(frozen=True)
class Hardware:
    """Per-GPU calibrated constants; link parameters are tuples indexed like `devices.TIERS`."""

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
    """Names of the profiles shipped in rpegc/hardware/."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_hardware(name_or_path: str, loc: Loc | None = None) -> Hardware:
    """A shipped profile by name, or a TOML file by path.

    A relative path is tried against the directory of the file `loc` points into (the `.rpeg`
    module naming it) first, then against the working directory.
    """
    path = _resolve(name_or_path, loc)
    try:
        text = path.read_text()
    except OSError as err:
        raise RpegError(loc, f"cannot read hardware profile '{path}': {err.strerror}; check the path") from None
    where = _Where(str(path), loc, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line = _decode_error_line(err)
        at = f" at line {line}" if line else ""
        raise RpegError(loc, f"hardware profile '{path}' is not valid TOML{at}: {err}; fix the syntax there") from None
    return _from_mapping(data, where)


def _resolve(name_or_path: str, loc: Loc | None) -> Path:
    looks_like_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    if not looks_like_path:
        shipped = PROFILE_DIR / f"{name_or_path}.toml"
        if shipped.is_file():
            return shipped
        raise RpegError(
            loc,
            f"unknown hardware profile '{name_or_path}'; use one of {', '.join(profile_names())} "
            "or a path to a .toml profile",
        )
    path = Path(name_or_path)
    if not path.is_absolute() and loc is not None and loc.line > 0:
        beside = Path(loc.file).parent / path
        if beside.is_file():
            return beside
    return path


def _decode_error_line(err: tomllib.TOMLDecodeError) -> int | None:
    line = getattr(err, "lineno", None)  # Python >= 3.14
    if line:
        return int(line)
    match = re.search(r"\(at line (\d+)", str(err))
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class _Where:
    source: str
    loc: Loc | None
    text: str | None

    def error(self, key: str, what: str) -> RpegError:
        line = _key_line(self.text, key) if self.text else None
        at = f", line {line}" if line else ""
        return RpegError(self.loc, f"hardware profile '{self.source}'{at}: {what}")


def _key_line(text: str, dotted: str) -> int | None:
    """1-based line defining `dotted` (e.g. 'collective.intra_node.beta'), else of its table header."""
    table, _, leaf = dotted.rpartition(".")
    current = ""
    header_line = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            current = re.sub(r"\s*\.\s*", ".", header.group(1))
            if current == dotted or current == table:
                header_line = header_line or number
            continue
        if current == table and re.match(rf"{re.escape(leaf)}\s*=", line):
            return number
        if current == "" and table and re.match(rf"{re.escape(dotted)}\s*=", line):
            return number
    return header_line


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
        for key, meaning, bound, strict in keys:
            values[key] = _number(table, f"{table_name}.{key}", key, meaning, bound, strict, where)
    for key, meaning, bound, strict, default in _OPTIONAL_COMPUTE_KEYS:
        values[key] = (_number(compute, f"compute.{key}", key, meaning, bound, strict, where)
                       if key in compute else default)
    if values["eps_rt"] >= 1.0:
        raise where.error("memory.eps_rt", f"key 'memory.eps_rt' must be below 1 ({_MEMORY_KEYS[1][1]}), got {values['eps_rt']}")
    links: dict[str, tuple[float, float, float]] = {}
    for family in ("collective", "p2p"):
        fam = _table(d, family, where)
        _reject_unknown(fam, family, list(TIERS), where)
        per_tier = []
        for tier in TIERS:
            link = _table(fam, tier, where, prefix=f"{family}.")
            _reject_unknown(link, f"{family}.{tier}", [k for k, *_ in _LINK_KEYS], where)
            per_tier.append(
                tuple(_number(link, f"{family}.{tier}.{k}", k, m, b, s, where) for k, m, b, s in _LINK_KEYS)
            )
        links[f"alpha_{family}"] = tuple(a for a, _ in per_tier)
        links[f"beta_{family}"] = tuple(b for _, b in per_tier)
    gpus_per_node = d.get("gpus_per_node")
    if gpus_per_node is not None and (not _is_int(gpus_per_node) or gpus_per_node < 1):
        raise where.error("gpus_per_node", f"key 'gpus_per_node' must be a positive integer, got {gpus_per_node!r}")
    for key in ("name", "description"):
        if key in d and not isinstance(d[key], str):
            raise where.error(key, f"key '{key}' must be a string, got {d[key]!r}")
    return Hardware(
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


def _number(table: Mapping[str, Any], full: str, key: str, meaning: str, bound: float, strict: bool, where: _Where) -> float:
    if key not in table:
        raise where.error(full, f"missing key '{full}' ({meaning}); add it")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(full, f"key '{full}' must be a number ({meaning}), got {value!r}")
    value = float(value)
    too_small = value <= bound if strict else value < bound
    if too_small or value != value or value == float("inf"):
        need = "positive" if strict else "non-negative"
        raise where.error(full, f"key '{full}' must be a finite {need} number ({meaning}), got {value}")
    return value
