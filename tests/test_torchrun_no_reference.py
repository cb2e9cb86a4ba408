"""A GRPO graph without a reference model (TRL's beta = 0: no reference is loaded, no KL is computed): with
kl_coef = 0 it trains on worker processes as the single-process reference does without one; a KL term it cannot
compute is a located error before any worker starts."""

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.runtime.backends.torch.controller.backend import TorchBackend  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.controller import RunOptions, run  # noqa: E402
from fixtures.programs import GRPO_TWO_WORKERS  # noqa: E402
from fixtures.torch_runs import assert_same_run, compile_plan, run_torch  # noqa: E402

# What examples/grpo-tiny-2.rpeg (GRPO on 2 CPU workers, every vertex data parallel on both) says of its reference:
# the model, its weights and log-probs containers, its inference vertex with its edges and placement.
REFERENCE_LINES = ("kind = reference", "%W_ref ", "%logp_ref ", "@ref_inf")


def without_reference() -> str:
    """examples/grpo-tiny-2.rpeg without its reference: nothing writes or reads reference log-probs."""
    text = "".join(line for line in GRPO_TWO_WORKERS.read_text().splitlines(keepends=True)
                   if not any(part in line for part in REFERENCE_LINES))
    for old, new in (("rpeg.input %X, %W_ref, %W_reward", "rpeg.input %X, %W_reward"), (", %logp_ref,", ",")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    assert "ref" not in text.replace("reference", "")  # nothing of it is left
    return text


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("noref") / "grpo-noref.rpeg"
    path.write_text(without_reference())
    return path


def plan_of(tmp_path, source, steps: int):
    return compile_plan(tmp_path, str(source), steps=steps)


def test_grpo_without_a_reference_and_kl_coef_zero_trains_as_the_reference_trainer_does(tmp_path, source):
    plan = plan_of(tmp_path, source, steps=2)
    assert not any(m.kind == "reference" for m in plan.program.models)
    rl = {"kl_coef": 0.0}
    assert not run_config(plan.program, rl=rl).has_reference
    backend, _ = run_torch(plan, rl=rl)
    assert_same_run(plan, backend, rl=rl, weights_atol=5e-5)
    for k in range(plan.steps):  # no KL: neither the metric nor the loss term (a missing metric is left out)
        assert "policy_loss" in backend.metrics[k] and not {"kl", "kl_loss"} & set(backend.metrics[k]), k


@pytest.mark.parametrize("rl, asked, fix", [
    ({}, "kl_coef = 0.01 asks", "--rl kl_coef=0"),  # GRPO's default KL coefficient
    ({"kl_coef": 0.0, "adv_estimator": "reinforce_plus_plus", "kl_in_reward": True}, "kl_in_reward = true asks",
     "--rl kl_in_reward=false")])
def test_a_kl_term_without_a_reference_is_a_located_error_before_any_worker_starts(tmp_path, source, rl, asked, fix):
    plan = plan_of(tmp_path, source, steps=1)
    with pytest.raises(RpegError) as err:
        run_config(plan.program, rl=rl)
    message = err.value.message
    assert asked in message and "no inference vertex of a reference model" in message and fix in message
    assert "\n" not in message
    loc = err.value.loc  # the graph that has none, in the plan's module
    assert loc.file == plan.file and open(loc.file).read().splitlines()[loc.line - 1].startswith("rpeg.graph @grpo")
    backend = TorchBackend(seed=0, tp_impl="torch", rl=rl)
    with pytest.raises(RpegError, match=asked):
        run(plan, backend, RunOptions())
    assert backend.pool.world == 0  # refused before the pool opened: no worker started
