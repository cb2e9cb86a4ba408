"""megatron-core on CPU (runtime/backends/torch/parallel/megatron_compat.py): its tensor-parallel layers on an
explicit, non-global TP group reproduce the single-process layer, with megatron's global parallel state
never initialised, and a whole run with `tp_impl="megatron"` reproduces the reference trainer."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
mc = pytest.importorskip("rpegc.runtime.backends.torch.parallel.megatron_compat")
if mc.load()[0] is None:
    pytest.skip(mc.load()[1], allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.runtime.controller import run  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.backends.torch.rl.reference import run_reference  # noqa: E402
from fixtures.torch_runs import STAT_REL  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_verified_version_needs_no_patch():
    _, version = mc.load()
    assert version in mc.VERIFIED_VERSIONS
    assert mc.PATCHES == ()  # see the module docstring: what would need patches is not used


def test_tensor_parallel_layers_on_an_explicit_group_match_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(mc.self_check, args=(os.path.join(tmp, "init"), out), nprocs=2)
        result = torch.load(out)
    assert max(result["errors"]) < 1e-6
    assert result["global_state"] is False


def test_a_run_with_megatron_tensor_parallelism_matches_the_reference(tmp_path):
    out = str(tmp_path / "grpo.exec.rpeg")
    pipeline = "verify-wellformed,unroll{k=1},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
    assert rpegc_main([os.path.join(ROOT, "examples/grpo-tiny.rpeg"), "-p", pipeline, "-o", out]) == 0
    plan = load_plan(out)
    assert any(n.node.strategy and n.node.strategy.tp == 2 for n in plan.nodes)
    backend = TorchBackend(seed=0, tp_impl="megatron")
    run(plan, backend)
    ref = run_reference(run_config(plan.program), 1, seed=0)
    assert backend.metrics[0]["actor_grad_norm"] == pytest.approx(ref.metrics[0]["actor_grad_norm"], rel=STAT_REL)
    for n, w in ref.weights["actor"].items():
        torch.testing.assert_close(backend.final_weights["actor"][n], w, rtol=0, atol=2e-5)
