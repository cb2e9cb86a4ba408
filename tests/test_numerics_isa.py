"""The bf16 equivalence checks under other CPU kernel paths (numerical tests must hold on any
x86-64 CPU). torch picks its vectorised ATen kernels by ATEN_CPU_CAPABILITY and oneDNN its GEMM/attention
kernels by ONEDNN_MAX_CPU_ISA; a CI machine with AMX or avx512 would otherwise exercise only its own best
path, and the bf16 results of other paths differ (a cached decode and a teacher-forced forward agree
bitwise under AMX and avx512, and by ~1 bf16 ulp of the logits under ATEN avx2). So the cheapest checks
that are sensitive to the kernel path, the layout invariance of the bf16 forward and generation against
inference on one worker, run again in a subprocess per path. They take a few seconds each; the
distributed equivalence tests (tests/test_torch_bf16.py) were checked by hand under the same paths."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = "a_bf16_forward_returns_float32 or serving_copies_are_bf16"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = _cpu_flags()
# what each path needs of the CPU (ATen's avx512 kernels: AVX512F/BW/VL/DQ; its avx2 kernels: AVX2 + FMA)
PATHS = [
    ("ATEN_CPU_CAPABILITY", "avx2", {"avx2", "fma"}),
    ("ATEN_CPU_CAPABILITY", "avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("ONEDNN_MAX_CPU_ISA", "AVX2", {"avx2", "fma"}),
]


@pytest.mark.parametrize("var,value,needs", PATHS, ids=[f"{v}={x}" for v, x, _ in PATHS])
def test_bf16_checks_hold_under_another_kernel_path(var, value, needs):
    if not FLAGS:
        pytest.skip("no /proc/cpuinfo flags to tell which kernel paths this CPU supports")
    if not needs <= FLAGS:
        pytest.skip(f"this CPU lacks {', '.join(sorted(needs - FLAGS))}, which {var}={value} needs")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    env[var] = value
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_torch_bf16.py", "-k", CHECKS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{var}={value}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
