"""Non-finite numbers are never trained on or saved (runtime/backends/torch/rl/finite.py; issue 33, item 2): the check
itself in every dtype, the master weights' step stopping before any update on a NaN gradient and after an update
that overflows, and the one-line messages a worker reports (a non-finite quantity, a refused allocation)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import Loc, RpegError  # noqa: E402
from rpegc.runtime.backends.torch.rl.finite import NonFiniteError, finite_tensor, require_finite  # noqa: E402
from rpegc.runtime.backends.torch.model.master_weights import MasterWeights  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import RLConfig  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import CommandError, _error_text  # noqa: E402

CFG = RLConfig(lr_actor=1e-2, grad_clip=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_one_non_finite_element_anywhere_is_found_in_every_dtype(dtype, bad):
    t = torch.randn(257, dtype=dtype)
    assert finite_tensor(t)
    for i in (0, 128, 256):
        u = t.clone()
        u[i] = bad
        assert not finite_tensor(u)
        with pytest.raises(NonFiniteError, match=rf"the advantages holds {bad} \(element {i} of 257\)"):
            require_finite("the advantages", u)
    assert finite_tensor(torch.empty(0, dtype=dtype)) and finite_tensor(torch.arange(5))


def test_numbers_at_float32s_limits_are_finite_and_nan_is_not():
    require_finite("the policy loss", 3.0e38)
    require_finite("the policy loss", torch.tensor([torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny]))
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(NonFiniteError, match=f"the policy loss is {bad}"):
            require_finite("the policy loss", bad)


def _params():
    gen = torch.Generator().manual_seed(0)
    ps = {"a": torch.nn.Parameter(torch.randn(3, generator=gen)),
          "b": torch.nn.Parameter(torch.randn(4, generator=gen))}
    for p in ps.values():
        p.grad = torch.ones_like(p)
    return ps


def test_a_nan_gradient_stops_the_step_before_any_weight_moves():
    ps = _params()
    before = {n: p.detach().clone() for n, p in ps.items()}
    ps["b"].grad[2] = math.nan
    master = MasterWeights(ps, ps, CFG.lr_actor, CFG)
    with pytest.raises(NonFiniteError, match="the gradient norm is nan"):
        master.step(CFG)
    for n, p in ps.items():
        assert torch.equal(p.detach(), before[n]), n
    assert not master.optimizer.state  # Adam's moments were never touched


def test_an_update_that_overflows_a_weight_is_named():
    ps = _params()
    with torch.no_grad():
        ps["a"][1] = torch.finfo(torch.float32).max  # the step adds ~lr: the weight overflows to infinity
    for p in ps.values():
        p.grad = -torch.ones_like(p)  # Adam's first step moves each weight up by the learning rate
    master = MasterWeights(ps, ps, 1e35, CFG)  # far above float32's spacing there (2e31)
    with pytest.raises(NonFiniteError, match=r"weight a after the update holds inf \(element 1 of 3\)"):
        master.step(CFG)


def test_a_worker_reports_a_non_finite_quantity_with_its_step_and_a_located_error_without_a_stray_prefix():
    text = _error_text(NonFiniteError("the gradient norm is nan"), 3)
    assert text == ("step 3: the gradient norm is nan, so the run stops before the step is applied or saved "
                    "(the last checkpoint stays)")
    assert _error_text(RpegError(None, "no such model"), None) == "no such model"
    assert _error_text(RpegError(Loc("d/config.json", 3, 5), "bad field"), None) == "d/config.json:3:5: bad field"
    # a file without a line: no `:0:0: error:` inside the run's own `error:` line
    assert _error_text(RpegError(Loc("run/index.json", 0, 0), "bad dtype"), None) == "run/index.json: bad dtype"
    assert _error_text(CommandError("cannot run"), None) == "cannot run"


def test_an_allocation_the_host_refuses_is_one_line_naming_it():
    """vocab 10^12 with --no-memory-check ended in a worker traceback (issue 33, item 3)."""
    try:
        torch.empty(10 ** 13, dtype=torch.float32)
    except RuntimeError as e:
        text = _error_text(e, None)
    assert text.startswith("out of memory: ") and "you tried to allocate 40000000000000 bytes" in text
    assert "\n" not in text and "--no-memory-check" in text
    assert _error_text(MemoryError(), None).startswith("out of memory: MemoryError")
