"""Master weights, Adam and the clip (runtime/backends/torch/model/master_weights.py): a float32 module is its own
master and steps exactly as torch's clip_grad_norm_ + fused Adam; a bf16 module keeps float32 masters of the chosen
share only, steps them on its bf16 gradients cast to float32, and writes them back rounded to bf16."""

import math

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import Loc, RpegError  # noqa: E402
from rpegc.core.ir.program import Workload  # noqa: E402
from rpegc.runtime.backends.torch.model import master_weights  # noqa: E402
from rpegc.runtime.backends.torch.model.master_weights import (MasterWeights, clip_scale, sum_of_squares,  # noqa: E402
                                                        train_whole, training_dtype)
from rpegc.runtime.backends.torch.rl.step import RLConfig  # noqa: E402

CFG = RLConfig(lr_actor=1e-2, grad_clip=1.0)


def _params(dtype):
    gen = torch.Generator().manual_seed(0)
    ps = {"a": torch.nn.Parameter(torch.randn(3, generator=gen)), "b": torch.nn.Parameter(torch.randn(2, 2, generator=gen))}
    grads = {"a": torch.tensor([3.0, 0.0, 4.0]), "b": torch.tensor([[1.0, 2.0], [2.0, 4.0]])}
    for n, p in ps.items():
        p.data = p.data.to(dtype)
        p.grad = grads[n].to(dtype)
    return ps


def _torch_step(params, lr):
    opt = torch.optim.Adam(params, lr=lr, betas=CFG.adam_betas, eps=CFG.adam_eps, weight_decay=0.0, fused=True)
    norm = torch.nn.utils.clip_grad_norm_(params, CFG.grad_clip)
    opt.step()
    return float(norm)


def test_sum_of_squares_is_float64_over_pieces(monkeypatch):
    g = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    monkeypatch.setattr(master_weights, "SQUARE_PIECE", 64)  # 16 pieces, the last one short
    assert sum_of_squares(g).dtype == torch.float64
    assert float(sum_of_squares(g)) == pytest.approx(float(g.double().square().sum()), rel=1e-14)


def test_training_dtype_is_the_workloads_and_refuses_fp16_with_its_location():
    assert training_dtype(Workload(1, 1, 1, 1, "bf16")) == torch.bfloat16
    assert training_dtype(Workload(1, 1, 1, 1, "fp32")) == torch.float32
    with pytest.raises(RpegError, match="loss scaling") as err:
        training_dtype(Workload(1, 1, 1, 1, "fp16", loc=Loc("p.rpeg", 3, 1)))
    assert err.value.loc == Loc("p.rpeg", 3, 1)


def test_a_float32_module_is_its_own_master_and_steps_as_torch_does():
    ours, theirs = _params(torch.float32), _params(torch.float32)
    master = MasterWeights(ours, ours, CFG.lr_actor, CFG)
    assert not master.mixed and all(master.values[n] is ours[n] for n in ours) and master.nbytes() == 0
    norm = master.step(CFG)
    assert norm == pytest.approx(_torch_step(list(theirs.values()), CFG.lr_actor)) == pytest.approx(math.sqrt(50))
    for n in ours:
        assert torch.equal(ours[n], theirs[n]), n  # one parameter at a time is Adam's step over all of them
        assert ours[n].grad is None
    assert master.nbytes() == 2 * 4 * 7 + 2 * 4  # two float32 moments per element, a step count per tensor


def test_a_bf16_module_steps_float32_masters_of_its_share_and_writes_them_back():
    ours = _params(torch.bfloat16)
    initial = {"a": ours["a"].detach().float() + 1e-4, "b": ours["b"].detach().float()}  # not bf16 values
    master = MasterWeights(ours, ["b"], CFG.lr_actor, CFG)  # a ZeRO share: "b" only
    master.load(initial)
    assert master.mixed and list(master.values) == ["b"] and master.values["b"].dtype == torch.float32
    # the reference computation: float32 Adam on the bf16 gradient cast to float32, clipped on the global norm
    want = torch.nn.Parameter(initial["b"].clone())
    want.grad = ours["b"].grad.float()
    opt = torch.optim.Adam([want], lr=CFG.lr_actor, betas=CFG.adam_betas, eps=CFG.adam_eps, fused=True)
    scale = clip_scale(torch.tensor(math.sqrt(25.0)).double(), CFG.grad_clip)  # the share's grads: 1, 2, 2, 4
    want.grad.mul_(scale.float())
    opt.step()
    before_a = ours["a"].detach().clone()
    norm = master.step(CFG)
    assert norm == pytest.approx(5.0)  # the norm counts the share this rank steps (other ranks add theirs)
    assert torch.equal(master.values["b"], want.detach())
    assert ours["b"].dtype == torch.bfloat16 and torch.equal(ours["b"].detach(), want.detach().to(torch.bfloat16))
    assert torch.equal(ours["a"].detach(), before_a)  # another replica's share: not stepped here
    assert all(p.grad is None for p in ours.values())
    assert master.nbytes() == 4 * 4 + 2 * 4 * 4 + 4  # master, two moments (float32) and the step count


def test_train_whole_keeps_the_float32_values_a_cast_would_round():
    model = torch.nn.Linear(4, 3)
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    master = train_whole(model, torch.bfloat16, 1e-3, CFG)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(torch.equal(master.values[n], values[n]) for n in values)
    assert any(not torch.equal(p.detach().float(), values[n]) for n, p in model.named_parameters())
