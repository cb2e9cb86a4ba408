"""`hardware = "cpu"`: the profile of the machine the tool runs on, calibrated on first use and cached per machine.

A CPU plan's prediction holds only with the CPU it runs on: the shipped `cpu-reference` profile was calibrated on
another VM (2026-12-01) and prices this one's kernels 2-7x off. So the name `cpu` stands for this machine:
`machine_profile` returns the profile cached for its key (CPU model, instruction-set flags, core count, architecture,
the torch and Python versions: what the kernels' speed depends on), in the user's cache directory
(`$RPEGC_CACHE_DIR`, else `$XDG_CACHE_HOME/rpegc`, else `~/.cache/rpegc`). On first use it runs the machine
calibration (`rpeg-calibrate --machine`, in a child process: the compiler does not import torch) and caches what it
writes; `rpeg-calibrate --machine` refreshes it. `$RPEGC_CPU_PROFILE` (a profile name or path) makes `cpu` stand for
that profile instead: the test suite pins `cpu-reference` so that its numbers do not depend on the machine.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

from rpegc.core.ir.errors import Loc, RpegError

CPU = "cpu"  # the profile name that stands for this machine
PIN_ENV = "RPEGC_CPU_PROFILE"  # a profile name or path `cpu` stands for instead
CACHE_ENV = "RPEGC_CACHE_DIR"
# What the machine campaign measures; raised when it measures more or the operators it measures run differently (2: the
# host's verifier times, [host]; 3: the operators' overheads, [overhead]; 4: grouped-query attention inside SDPA and
# freed heap memory kept for reuse, which made the backend's operators faster; 5: the speed probe rpeg-run compares
# with, runtime/speed_probe.py; 6: the checkpoint writes, [host] checkpoint_file and checkpoint_rate; 7: the disk a
# node's checkpoint writers share, [host] checkpoint_disk_rate; 8: the runtime's threads on a host without a free core,
# [overhead] node_free and contention; 9: siblings computing on a host's other cores, [overhead] co_busy, and the
# built-in verifiers timed over 25 batches; 10: the narrow forwards alone beside every core busy, [overhead] co_run;
# 11: a RoPE model's rotations, [compute] rope_*; 12: a worker's reader, sender and heap-meter threads left free of
# its operators' core, contention from the operators' measured waits for a core and [overhead] transfer_weights; 13:
# checkpoint parts written as a run writes them, with their reports, and the kept versions' copies, [host]
# checkpoint_keep_*; 14: the operators' per-token overheads fitted on the tokens a forward runs, `work.forward_length`;
# 15: the built-in verifiers' median over windows across the calibration; 16: the attention kernel per row and head,
# [attention], and the controller's commit of a checkpoint, [host] checkpoint_commit*; 17: the speed witness every
# operator of a run ends with, [overhead] witness and [host] verify_witness, and the overheads' grid timed in a run's
# worker's condition), so that a profile cached by an earlier campaign is calibrated again instead of lacking keys or
# pricing the old operators.
CAMPAIGN = "17"
# The child process that calibrates this machine (tools/calibrate.py); `--quick` is the tests' smoke version.
CALIBRATE = ("-m", "rpegc.tools.calibrate", "--machine", "--quiet")


def pinned() -> Optional[str]:
    """The profile `cpu` stands for by `$RPEGC_CPU_PROFILE`, or None (this machine's)."""
    value = os.environ.get(PIN_ENV, "").strip()
    return value or None


def _cpu_fields() -> tuple[str, str]:
    """(model name, instruction-set flags) of the first CPU in /proc/cpuinfo (the platform's name elsewhere)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = "flags" if key.strip() == "Features" else key.strip()  # Arm names its flags Features
                if key in ("model name", "flags"):
                    found.setdefault(key, value.strip())
                if len(found) == 2:
                    break
    except OSError:
        pass
    return found.get("model name") or platform.processor(), " ".join(sorted(found.get("flags", "").split()))


def package_version(package: str) -> str:
    """The installed version of `package` ("unknown" if it is not installed), without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache  # constant for the process; the cache path is asked for on every `cpu` profile load
def machine_identity() -> dict[str, str]:
    """What a CPU profile's values depend on, as the profile's [meta] records it."""
    model, flags = _cpu_fields()
    return {"cpu": model, "cores": str(os.cpu_count() or 0), "machine": platform.machine(),
            "flags": hashlib.sha256(flags.encode()).hexdigest()[:12], "torch": package_version("torch"),
            "python": platform.python_version(), "campaign": CAMPAIGN}


def machine_key(identity: Optional[dict[str, str]] = None) -> str:
    """A short digest of `machine_identity`: the cache's file name."""
    ident = identity if identity is not None else machine_identity()
    return hashlib.sha256(repr(sorted(ident.items())).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rpegc"


def cached_profile_path() -> Path:
    """Where this machine's CPU profile is cached."""
    return cache_dir() / "hardware" / f"cpu-{machine_key()}.toml"


def machine_profile(loc: Loc | None = None) -> Path:
    """This machine's CPU profile: the cached one, else calibrated now (a child process) and cached."""
    path = cached_profile_path()
    if path.is_file():
        return path
    print(f"rpegc: calibrating this machine's CPU profile (first use of hardware \"cpu\" here, 45-90 s); it "
          f"is cached in {path} (refresh: rpeg-calibrate --machine)", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, *CALIBRATE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not path.is_file():
        tail = proc.stdout.strip().splitlines()[-1:] or ["no output"]
        raise RpegError(loc, f"could not calibrate this machine's CPU profile ({tail[0]}); run `rpeg-calibrate "
                             f"--machine` to see why, or set {PIN_ENV}=cpu-reference to price with the shipped one")
    return path
