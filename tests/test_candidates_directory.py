"""The candidate directory X_cand(v): exactly the legal (allocation, strategy) pairs, in a fixed order."""

from __future__ import annotations

import itertools

import pytest

from rpegc.core.check.candidates import aligned_origins, enumerate_candidates, legal_strategies
from rpegc.core.check.plan_rules import check_placement, is_legal
from rpegc.core.ir.presets import PRESETS
from rpegc.core.ir.program import Arch, Model, Placement, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy


def model(layers: int) -> Model:
    return Model("m", "policy", True, Arch(layers, 64, 256, 64, 4, 4))


def test_hand_counted_directory_of_one_four_gpu_node():
    # 1x1x4, L = 4, B*R = 16. tp in {1,2,4}, pp in {1,2,4}, dp in {1,2,4}; sizes must divide 4.
    # Strategies (dp,pp,tp,mb): size 1: (1,1,1,1); size 2: (2,1,1,1), (1,2,1,2), (1,1,2,1);
    # size 4: (4,1,1,1), (2,1,2,1), (1,2,2,2), (1,1,4,1). (2,2,1) and (1,4,1) have no mb with
    # B*R/(dp*mb) >= 8 and mb >= pp. Origins: 4 for size 1, 2 for size 2, 1 for size 4.
    cluster = Cluster("c", 1, 1, 4, "cpu")
    cands = enumerate_candidates(model(4), Workload(B=16, R=1, Lp=8, Lr=8), cluster)
    assert len(cands) == 4 + 3 * 2 + 4 * 1
    strategies = [(s.dp, s.pp, s.tp, s.mb) for s in legal_strategies(model(4), Workload(16, 1, 8, 8), cluster)]
    assert strategies == [
        (1, 1, 1, 1),
        (2, 1, 1, 1), (1, 1, 2, 1), (1, 2, 1, 2),
        (4, 1, 1, 1), (2, 1, 2, 1), (1, 1, 4, 1), (1, 2, 2, 2),
    ]
    assert [a.origin for a, s in cands[:4]] == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3)]


def test_aligned_origins():
    c = Cluster("c", 2, 5, 4, "cpu")
    assert aligned_origins((1, 1, 2), c)[:3] == [(0, 0, 0), (0, 0, 2), (0, 1, 0)]
    assert len(aligned_origins((1, 1, 2), c)) == 2 * 5 * 2
    assert aligned_origins((1, 2, 4), c) == [(0, 0, 0), (0, 2, 0), (1, 0, 0), (1, 2, 0)]
    assert aligned_origins((2, 5, 4), c) == [(0, 0, 0)]


CLUSTERS = [(1, 2, 4), (2, 8, 4), (16, 16, 4)]


@pytest.mark.parametrize("arch", ["llama2-7b", "llama2-13b"])
@pytest.mark.parametrize("shape", CLUSTERS)
def test_every_candidate_passes_check_placement(arch, shape):
    m = Model("actor", "policy", True, PRESETS[arch])
    w = Workload(B=512, R=1, Lp=128, Lr=384)
    c = Cluster("c", *shape, "gh200")
    cands = enumerate_candidates(m, w, c)
    assert len(set(cands)) == len(cands)
    # All pass the fast path; a spread-out sample also passes the located checker.
    assert all(is_legal(a, s, m.arch.layers, w, c) for a, s in cands)
    for a, s in cands[:: max(1, len(cands) // 300)]:
        assert check_placement(Placement("v", a, s), m, w, c) == []


def test_directory_is_deterministic_and_ordered():
    m = Model("actor", "policy", True, PRESETS["llama2-7b"])
    w, c = Workload(B=512, R=1, Lp=128, Lr=384), Cluster("c", 2, 8, 4, "gh200")
    first = enumerate_candidates(m, w, c)
    assert first == enumerate_candidates(m, w, c)
    keys = [(s.size, s.pp, s.tp, s.mb, a.origin) for a, s in first]
    assert keys == sorted(keys)


def brute_force(layers: int, workload: Workload, cluster: Cluster) -> set[tuple[Alloc, Strategy]]:
    """Every origin in the box, every extent up to the cluster size, every degree and mb, filtered by is_legal.

    Degrees are bounded by the GPU count because Def. A.5 ties dp*pp*tp to an extent inside the cluster;
    mb is bounded by B*R because P5 needs mb | B*R/dp."""
    dims = (cluster.racks, cluster.nodes, cluster.gpus)
    n = cluster.num_devices
    br = workload.B * workload.R
    found = set()
    boxes = [Alloc(o, e) for o in itertools.product(*(range(d) for d in dims))
             for e in itertools.product(*(range(1, d + 1) for d in dims))]
    triples = [(dp, pp, tp) for dp in range(1, n + 1) for pp in range(1, n + 1) for tp in range(1, n + 1)
               if dp * pp * tp <= n]
    for dp, pp, tp in triples:
        for mb in range(1, br + 1):
            s = Strategy(dp, pp, tp, mb)
            for a in boxes:
                if is_legal(a, s, layers, workload, cluster):
                    found.add((a, s))
    return found


@pytest.mark.parametrize(
    "shape, layers, B, R",
    [((1, 2, 4), 4, 16, 1), ((2, 2, 2), 8, 8, 2), ((1, 1, 8), 6, 12, 2), ((2, 1, 4), 2, 32, 1)],
)
def test_brute_force_agrees_with_the_enumerator(shape, layers, B, R):
    cluster = Cluster("c", *shape, "cpu")
    workload = Workload(B=B, R=R, Lp=8, Lr=8)
    cands = enumerate_candidates(model(layers), workload, cluster)
    assert set(cands) == brute_force(layers, workload, cluster)
    assert cands  # the case is not vacuous
