"""The optimizer sizes verifier pools (issue 36): a verify vertex's candidates are pool sizes (search/directory.py
`pool_directory`), priced by the core (cost/host.py) in both evaluation paths (tests/test_search_differential.py
holds them to the pass pipeline), and a plan whose pools and first-node devices need more host cores than the host
has is infeasible: on a 2-core CPU host with 2 worker devices the optimizer gives up a device for the pool."""

from dataclasses import replace

from rpegc.core.cost.hardware import load_hardware
from rpegc.core.ir.geometry import Cluster
from rpegc.core.ir.program import Pool
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse

SOURCE = open("examples/grpo-verify.rpeg").read().replace('{fn = "rule"}', '{fn = "rule", per_response = 5e-4}')
SMALL = dict(budget_s=0, evals=400, steps=4, jobs=1)


def test_on_a_two_core_host_the_pool_takes_the_core_of_a_device():
    p = parse(SOURCE.replace("gpus = 1,", "gpus = 2,"), "v.rpeg")
    hw = load_hardware("cpu-reference")  # [host] cores = 2
    r = optimize(p, OptimizeOptions(seed=0, **SMALL), hw)
    plan = r.program.plan
    assert plan.pools == (Pool("score", 1),) and "score" not in {pl.vertex for pl in plan.placements}
    used = {d for pl in plan.placements for d in pl.alloc.devices(p.cluster)}
    assert len(used) == 1 and r.evaluation.feasible and r.evaluation.r_host == 1.0


def test_with_cores_to_spare_the_pool_is_as_large_as_pays():
    p = replace(parse(SOURCE, "v.rpeg"), cluster=Cluster("c8", 1, 2, 4, "gh200"))  # 288 host cores per node
    r = optimize(p, OptimizeOptions(seed=0, **SMALL), load_hardware("gh200"))
    assert r.program.plan.pools == (Pool("score", 64),)  # B R = 64 responses: one each
    assert r.evaluation.feasible and r.evaluation.r_host < 1.0


def test_a_host_without_a_core_for_the_pool_is_a_located_error_before_any_search():
    import pytest

    from rpegc.core.ir.errors import RpegError

    hw = load_hardware("cpu-reference")
    one_core = hw.__class__(**{**hw.__dict__, "host_cores": 1})
    with pytest.raises(RpegError, match=r"v.rpeg:25:3: error: verify vertex @score runs on a pool of host processes, "
                                        r"which needs a core of its own beside the device .* gives the host 1 core"):
        optimize(parse(SOURCE, "v.rpeg"), OptimizeOptions(seed=0, **SMALL), one_core)


def test_the_summary_names_the_pool_and_the_cores_it_shares():
    from rpegc.search.report import summary_rows

    p = parse(SOURCE.replace("gpus = 1,", "gpus = 2,"), "v.rpeg")
    rows = dict(summary_rows(optimize(p, OptimizeOptions(seed=0, **SMALL), load_hardware("cpu-reference"))))
    assert rows["verifier @score"] == "a pool of 1 host process of the host's 2 cores (host cores needed: 100%)"
