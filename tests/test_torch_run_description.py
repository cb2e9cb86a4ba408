"""The run described once (runtime/backends/torch/controller/run_description.py): its configuration is derived once
per program and read by the trace header, a resume's identity check and the run's description alike."""

import pytest

pytest.importorskip("torch")

from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import describe_run, run_identity  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402

PIPELINE = "verify-wellformed,unroll{k=2},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("desc") / "grpo.exec.rpeg")
    assert rpegc_main(["examples/grpo-tiny.rpeg", "-p", PIPELINE, "-o", out]) == 0
    return load_plan(out)


def test_the_runs_configuration_is_derived_once_and_shared(plan):
    backend = TorchBackend(seed=3, rl={"clip_eps": 0.1})
    cfg = backend.config(plan.program)
    assert backend.config(plan.program) is cfg and cfg.rl.clip_eps == 0.1
    assert backend.header_options(plan)["rl"]["clip_eps"] == 0.1
    run = describe_run(plan, backend.settings, cfg)
    assert run.cfg is cfg and run.program is plan.program
    assert set(run.models) == {m.name for m in plan.program.models}
    assert {run.device_of[r] for r in run.rank_of.values()} == set(plan.devices)
    assert set(run.predicted_peaks) == set(plan.model_devices) and all(p > 0 for p in run.predicted_peaks.values())
    assert backend.identity(plan) == run_identity(plan, 3, cfg) != run_identity(plan, 4, cfg)


def test_another_program_gets_its_own_configuration(plan, tmp_path):
    backend = TorchBackend(seed=0)
    first = backend.config(plan.program)
    out = str(tmp_path / "again.exec.rpeg")
    assert rpegc_main(["examples/grpo-tiny.rpeg", "-p", PIPELINE, "-o", out]) == 0
    other = load_plan(out).program
    assert backend.config(other) is not first and backend.config(other) == first
