"""The streaming safetensors writer (runtime/backends/torch/checkpoints/safetensors_stream.py): what it writes is what
the safetensors library writes and reads, for every dtype a checkpoint holds, and its size and digest are the file's."""

import hashlib
import os

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rpegc.runtime.backends.torch.checkpoints.safetensors_stream import write_safetensors  # noqa: E402


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"w/f32": torch.randn(3, 5, generator=g), "w/bf16": torch.randn(7, generator=g).to(torch.bfloat16),
            "adam/step": torch.tensor(3.0), "rng": torch.randint(0, 255, (9,), generator=g).to(torch.uint8),
            "ids": torch.arange(4), "empty": torch.zeros(0, 2), "flag": torch.tensor([True, False]),
            "strided": torch.randn(4, 6, generator=g)[:, ::2]}


def test_the_safetensors_library_reads_every_tensor_and_the_metadata(tmp_path):
    path = str(tmp_path / "f.safetensors")
    want = _tensors()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    size, digest = write_safetensors(fd, want, {"format": "x", "rpeg": "{}"})
    os.close(fd)
    data = open(path, "rb").read()
    assert size == len(data) and digest == hashlib.sha256(data).hexdigest()
    got = load_file(path)
    assert set(got) == set(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "x", "rpeg": "{}"}


def test_an_unsupported_dtype_is_refused_before_anything_is_written(tmp_path):
    path = str(tmp_path / "f.safetensors")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    with pytest.raises(ValueError, match="complex64"):
        write_safetensors(fd, {"z": torch.zeros(2, dtype=torch.complex64)}, {})
    os.close(fd)
    assert os.path.getsize(path) == 0
