"""The optimizer sizes verifier pools (issue 36): a verify vertex's candidates are pool sizes (search/directory.py
`pool_directory`), priced by the core (cost/host.py) in both evaluation paths (tests/test_search_differential.py
holds them to the pass pipeline). A pool's processes that find no host core beside the devices share a device's
core (cost/host.pool_cores): on a 2-core CPU host with 2 worker devices the optimizer keeps both devices, and the
verify nodes hold the devices whose cores their pool shares."""

from dataclasses import replace

from rpegc.core.cost.hardware import load_hardware
from rpegc.core.ir.geometry import Cluster
from rpegc.core.ir.program import Pool
from rpegc.search.optimizer import OptimizeOptions, optimize
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import print_program
from fixtures.torch_runs import compile_plan

SOURCE = open("examples/grpo-verify.rpeg").read().replace('{fn = "rule"}', '{fn = "rule", per_response = 5e-4}')
SMALL = dict(budget_s=0, evals=400, steps=4, jobs=1)


def test_on_a_two_core_host_the_pool_shares_the_cores_of_the_devices(tmp_path):
    p = parse(SOURCE.replace("gpus = 1,", "gpus = 2,"), "v.rpeg")
    hw = load_hardware("cpu-reference")  # [host] cores = 2
    r = optimize(p, OptimizeOptions(seed=0, **SMALL), hw)
    plan = r.program.plan
    used = {d for pl in plan.placements for d in pl.alloc.devices(p.cluster)}
    assert used == {0, 1} and r.evaluation.feasible and r.evaluation.r_host == 1.0
    (pool,) = plan.pools
    assert pool.vertex == "score" and pool.size in (1, 2)
    compiled = compile_plan(tmp_path, "o.rpeg", steps=2, text=print_program(r.program))
    shares = tuple(range(2 - pool.size, 2))  # the node's last devices first
    nodes = [n.node for n in compiled.nodes]
    on_pool = [n for n in nodes if n.alloc is None]
    assert {n.shares for n in on_pool} == {shares} and {n.kind for n in on_pool} == {"op", "comm"}
    for v in (n for n in on_pool if n.kind == "op"):
        held = [n for n in nodes if n.alloc is not None and set(n.alloc.devices(p.cluster)) & set(shares)]
        assert all(n.finish <= v.start or v.finish <= n.start for n in held)  # one after the other


def test_a_pool_on_a_one_core_host_shares_the_devices_core():
    hw = load_hardware("cpu-reference")
    one_core = hw.__class__(**{**hw.__dict__, "host_cores": 1})
    r = optimize(parse(SOURCE, "v.rpeg"), OptimizeOptions(seed=0, **SMALL), one_core)
    assert r.program.plan.pools == (Pool("score", 1),) and r.evaluation.feasible


def test_with_cores_to_spare_the_pool_is_as_large_as_pays():
    p = replace(parse(SOURCE, "v.rpeg"), cluster=Cluster("c8", 1, 2, 4, "gh200"))  # 288 host cores per node
    r = optimize(p, OptimizeOptions(seed=0, **SMALL), load_hardware("gh200"))
    assert r.program.plan.pools == (Pool("score", 64),)  # B R = 64 responses: one each
    assert r.evaluation.feasible and r.evaluation.r_host < 1.0


def test_the_summary_names_the_pool_and_the_cores_it_shares():
    from rpegc.search.report import summary_rows

    p = parse(SOURCE.replace("gpus = 1,", "gpus = 2,"), "v.rpeg")
    rows = dict(summary_rows(optimize(p, OptimizeOptions(seed=0, **SMALL), load_hardware("cpu-reference"))))
    assert rows["verifier @score"] == ("a pool of 2 host processes of the host's 2 cores, sharing the cores of "
                                       "devices 0, 1 (host cores needed: 100%)")
