"""`residency.device_peaks` (memory once per covering of devices) equals `device_memory_arrays` per device,
exactly, on random configurations: the batched evaluator relies on it (spec 6.5-6.6)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rpegc.core.cost.residency import OpTerms, device_coverings, device_memory_arrays, device_peaks
from rpegc.core.ir.program import Arch, Model

ARCH = Arch(layers=2, hidden=8, heads=2, kv_heads=2, ffn=16, vocab=32)
MODELS = {"actor": Model("actor", "policy", True, ARCH), "critic": Model("critic", "critic", True, ARCH),
          "ref": Model("ref", "reference", False, ARCH)}
ROLES = ("generation", "inference", "training")


@st.composite
def batches(draw):
    ops = draw(st.integers(1, 7))
    B, n = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    roles = tuple(draw(st.sampled_from(ROLES)) for _ in range(ops))
    op_models = tuple(draw(st.sampled_from(sorted(MODELS))) for _ in range(ops))
    masks = tuple(rng.random((B, n)) < draw(st.floats(0.0, 1.0)) for _ in range(ops))
    # small integer byte counts make equal values (ties between operators) likely
    terms = tuple(OpTerms(*(rng.integers(0, 4, B).astype(float) for _ in range(4))) for _ in range(ops))
    tau = {m: draw(st.integers(0, 1)) for m in MODELS}
    return roles, op_models, masks, terms, MODELS, tau


@settings(max_examples=200, deadline=None)
@given(batches())
def test_peaks_by_covering_equal_peaks_by_device(args):
    assert np.array_equal(device_peaks(*args), device_memory_arrays(*args).peak)


def test_coverings_name_the_operators_of_each_device():
    masks = (np.array([[True, True, False, False]]), np.array([[False, True, True, False]]))
    index, bits = device_coverings(masks)
    assert bits.tolist() == [[False, False], [True, False], [False, True], [True, True]]
    assert index.tolist() == [[1, 3, 2, 0]]


def test_coverings_of_many_operators_take_the_sorting_path():
    # 18 operators: past the 2**16-entry table, the coverings come from a sort; each device's row of flags
    # must still name exactly the operators that cover it
    rng = np.random.default_rng(0)
    masks = tuple(rng.random((3, 50)) < 0.3 for _ in range(18))
    index, bits = device_coverings(masks)
    assert np.array_equal(bits[index], np.stack(masks, axis=2))
    assert len(bits) == len({tuple(r) for r in bits})  # distinct coverings
