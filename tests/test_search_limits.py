"""The optimizer bounds what it builds: the size of a candidate directory is counted
before it is built, and a cluster too large to optimize is a located error naming the size and the limit,
instead of a MemoryError after half a minute."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rpegc.core.check import candidates
from rpegc.core.check.candidates import (
    MAX_CANDIDATES,
    MAX_DIRECTORY_CELLS,
    candidate_count,
    check_directory_size,
    enumerate_candidates,
)
from rpegc.core.ir.errors import RpegError
from rpegc.syntax.parser import parse

ROOT = Path(__file__).parent.parent
PPO8 = parse((ROOT / "examples" / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")


@pytest.mark.parametrize("racks,nodes,gpus", [(1, 2, 4), (1, 3, 4), (2, 4, 8), (1, 1, 6), (3, 2, 2)])
def test_candidate_count_is_the_directory_size(racks, nodes, gpus):
    cluster = dataclasses.replace(PPO8.cluster, racks=racks, nodes=nodes, gpus=gpus)
    for m in PPO8.models:
        assert candidate_count(m, PPO8.workload, cluster) == len(enumerate_candidates(m, PPO8.workload, cluster))


def test_a_huge_cluster_is_refused_before_anything_is_built(monkeypatch):
    def never(*args):
        raise AssertionError("the directory was built")

    monkeypatch.setattr(candidates, "enumerate_candidates", never)
    cluster = dataclasses.replace(PPO8.cluster, nodes=20000)
    with pytest.raises(RpegError) as info:
        check_directory_size(PPO8.model("actor"), PPO8.workload, cluster, "gen")
    assert info.value.loc == cluster.loc
    message = info.value.message
    assert "cluster @c8 (80000 GPUs) is too large to optimize: the candidate directory of @gen would hold" in message
    assert f"more than the limit of {MAX_CANDIDATES} placements and {MAX_DIRECTORY_CELLS:.3g} cells" in message


def test_optimize_pass_on_a_huge_cluster_is_a_located_error(tmp_path, capsys):
    from rpegc.cli import main

    src = tmp_path / "big.rpeg"
    src.write_text((ROOT / "examples" / "ppo-8gpu.rpeg").read_text().replace("nodes = 2,", "nodes = 20000,"))
    assert main([str(src), "-p", "verify-wellformed,optimize{budget=5}"]) == 1
    err = capsys.readouterr().err
    line = next(i for i, l in enumerate(src.read_text().splitlines(), 1) if l.startswith("rpeg.cluster"))
    assert f"big.rpeg:{line}:1: error: cluster @c8 (80000 GPUs) is too large to optimize" in err
    assert "internal error" not in err


def test_the_largest_example_fits_the_limits():
    p = parse((ROOT / "examples" / "ppo-1024.rpeg").read_text())
    for v in p.graph.vertices:
        assert check_directory_size(p.model(v.model), p.workload, p.cluster, v.name) > 0
