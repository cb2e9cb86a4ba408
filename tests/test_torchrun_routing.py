"""Transfers routed from rows that are there (runtime/backends/torch/controller/routing.py, worker/sender.py): an
operator's prep moves rows of its input to its replicas' ranks, and a transfer of the same input, which the schedule
runs at the same time, sends from its sources' sender threads. A plan that `make demo`'s optimizer chose (generation
dp 4 on devices 4-7, the reference's inference dp 2 x pp 2 there, the rollouts sent to the critic on device 2) failed
at step 0 with "rows [24, 32) of 'sequences' are not held on worker 4": the transfer was routed from rows the
inference's prep had not moved yet."""

import pytest

pytest.importorskip("torch")

from fixtures.torch_runs import compile_plan, run_torch  # noqa: E402
from rpegc.programs import Cluster, Model, Workload, ppo  # noqa: E402

PLAN = """rpeg.plan @p for @ppo on @c8 {
  @gen        at (0, 1, 0) extent (1, 1, 4) dp = 4 pp = 1 tp = 1 mb = 1
  @ref_inf    at (0, 1, 0) extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 2
  @reward_inf at (0, 1, 0) extent (1, 1, 4) dp = 2 pp = 2 tp = 1 mb = 2
  @critic_inf at (0, 0, 2) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @train_actor  at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @train_critic at (0, 0, 1) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
}
"""


def test_a_transfer_beside_an_operator_that_moves_its_rows_sends_from_where_they_are(tmp_path):
    text = ppo(Workload(32, 1, 4, 6, "fp32"), Model("tiny"), direct_edges=True, algorithm="ppo",
               cluster=Cluster(1, 2, 4, "cpu", name="c8"), plan=PLAN)
    plan = compile_plan(tmp_path, "routing.rpeg", 2, text)
    sent = [n for n in plan.nodes if n.kind == "comm" and n.src_devices == (4, 5, 6, 7) and n.devices == (2,)
            and any(a.name == "Y" for a in n.inputs)]
    assert sent, "the plan sends the rollouts from the generation's devices to the critic's"
    run_torch(plan)  # fails (a worker's error) if a transfer is routed from rows not there yet; verifies the trace
