"""Shard placement and routing of the torch backend (runtime/backends/torch/parallel/layout.py), checkpoint plan
restriction (checkpoints/shard_files.py): no worker processes."""

import itertools

import pytest

torch = pytest.importorskip("torch")

from rpegc.cli import main as rpegc_main  # noqa: E402
from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.runtime.plan import load_plan  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import run_config  # noqa: E402
from rpegc.runtime.backends.torch.checkpoints.shard_files import kept_versions, resume_plan  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import (Layout, param_stage, rank_pieces, replica_rows, route_rows,  # noqa: E402
                                                route_weights, shard_dim, split_rows, stage_bounds)
from rpegc.runtime.backends.torch.model.transformer import NetOptions, build_model, export_weights  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import param_shapes  # noqa: E402
from rpegc.runtime.backends.torch.parallel.parallel_model import shard_of  # noqa: E402

PIPELINE = "verify-wellformed,unroll{k=3},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"


def test_ranks_nest_tp_inside_pp_inside_dp():
    L = Layout(tuple(range(10, 18)), dp=2, pp=2, tp=2)
    assert [L.coord(r) for r in L.ranks] == list(itertools.product(range(2), range(2), range(2)))
    assert L.tp_group(1, 0) == (14, 15) and L.pp_group(0, 1) == (11, 13) and L.dp_group(1, 1) == (13, 17)
    assert L.replica(1) == (14, 15, 16, 17)
    assert (10, 14) in L.groups() and all(len(g) > 1 for g in L.groups())
    with pytest.raises(RpegError, match="dp \\* pp \\* tp"):
        Layout((0, 1, 2), dp=2, pp=1, tp=2)


def test_stages_split_blocks_and_hold_embeddings_and_heads():
    assert stage_bounds(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(RpegError, match="pp <= 2"):
        stage_bounds(2, 3)
    bounds = stage_bounds(4, 2)
    assert param_stage("embed.weight", bounds) == 0 and param_stage("lm_head.weight", bounds) == 1
    assert param_stage("layers.1.attn.wq.weight", bounds) == 0 and param_stage("layers.2.mlp.w_up.weight", bounds) == 1
    assert shard_dim("layers.0.attn.wq.weight") == 0 and shard_dim("layers.0.mlp.w_down.weight") == 1
    assert shard_dim("layers.0.attn_norm.weight") is None and shard_dim("value_head.bias") is None


def _full(kind: str):
    arch = lookup("tiny")
    net = NetOptions(max_seq=10, positions="learned")
    return arch, param_shapes(arch, kind, net), export_weights(build_model(arch, kind, 7, net))


def _apply(moves, src_shards, src_layout, dst_layout, shapes, layers):
    """Execute weight moves the way workers do, on in-memory shards."""
    out = {}
    for r in dst_layout.ranks:
        pieces = rank_pieces(shapes, dst_layout, r, layers)
        out[r] = {}
        for n, p in pieces.items():
            shape = list(shapes[n])
            if p.dim is not None:
                shape[p.dim] = p.hi - p.lo
            out[r][n] = torch.full(shape, float("nan"))
    for m in moves:
        src_piece = rank_pieces(shapes, src_layout, m.src, layers)[m.name]
        t = src_shards[m.src][m.name]
        if m.dim is not None:
            t = t.narrow(m.dim, m.lo - (src_piece.lo if src_piece.dim is not None else 0), m.hi - m.lo)
        dst_piece = rank_pieces(shapes, dst_layout, m.dst, layers)[m.name]
        d = out[m.dst][m.name]
        if m.dim is not None:
            d = d.narrow(m.dim, m.lo - (dst_piece.lo if dst_piece.dim is not None else 0), m.hi - m.lo)
        d.copy_(t)
    return out


LAYOUTS = [(4, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 1), (1, 1, 4)]


@pytest.mark.parametrize("src, dst", [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b])
def test_weight_routes_rebuild_every_shard_of_the_target_layout(src, dst):
    arch, shapes, full = _full("actor_critic")
    S = Layout((0, 1, 2, 3), *src)
    D = Layout((2, 3, 4, 5), *dst)  # overlapping allocations: devices 2, 3 hold both layouts
    src_shards = {r: shard_of(full, shapes, S, r, arch.layers) for r in S.ranks}
    moves = route_weights(shapes, arch.layers, S, D)
    got = _apply(moves, src_shards, S, D, shapes, arch.layers)
    for r in D.ranks:
        want = shard_of(full, shapes, D, r, arch.layers)
        assert set(got[r]) == set(want)
        for n in want:
            assert torch.equal(got[r][n], want[n]), (r, n)


def test_colocated_identical_layouts_move_nothing_over_the_network():
    arch, shapes, _ = _full("policy")
    L = Layout((0, 1, 2, 3), 1, 2, 2)
    moves = route_weights(shapes, arch.layers, L, L)
    assert moves and all(m.src == m.dst for m in moves)


def test_rows_split_by_whole_groups_and_routes_prefer_local_copies():
    assert split_rows(0, 12, 2, group=4) == [(0, 8), (8, 12)]
    with pytest.raises(RpegError, match="whole groups"):
        split_rows(0, 10, 2, group=4)
    L = Layout((5, 6, 7, 8), 2, 1, 2)
    assert replica_rows(L, 0, 8) == {5: (0, 4), 6: (0, 4), 7: (4, 8), 8: (4, 8)}
    held = {0: [(0, 4)], 1: [(4, 8)]}
    moves = route_rows(held, {0: (0, 8), 1: (0, 8)})
    assert sorted((m.src, m.dst, m.lo, m.hi) for m in moves) == [(0, 1, 0, 4), (1, 0, 4, 8)]
    # a new artifact (a Comm's target): rows the destination already holds are copied locally
    moves = route_rows(held, {0: (0, 8)}, have={})
    assert sorted((m.src, m.dst, m.lo, m.hi) for m in moves) == [(0, 0, 0, 4), (1, 0, 4, 8)]
    with pytest.raises(RpegError, match="held by no worker"):
        route_rows(held, {2: (0, 9)})


@pytest.fixture(scope="module")
def grpo_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans") / "grpo.exec.rpeg"
    assert rpegc_main(["examples/grpo-tiny.rpeg", "-p", PIPELINE, "-o", str(out)]) == 0
    return load_plan(str(out))


def test_resume_plan_keeps_later_steps_and_installs_what_they_read(grpo_plan):
    plan = resume_plan(grpo_plan, 2)
    assert {n.step for n in plan.nodes} == {2}
    assert [n.index for n in plan.nodes] == list(range(len(plan.nodes)))
    assert all(p < n.index for n in plan.nodes for p in n.preds)
    labels = {a.label for a in plan.initial}
    assert "weights @actor v2 @(0,0,0)+(1,1,4)" in labels  # made by train_actor#1, which is not rerun
    assert "weights @ref v0 @(0,0,2)+(1,1,2)" in labels
    assert all(a.kind == "weights" for a in plan.initial)
    assert plan.devices == grpo_plan.devices and plan.hash == grpo_plan.hash
    assert list(kept_versions(3, 1)) == [2, 3] and list(kept_versions(1, 4)) == [0, 1]


def test_resume_plan_installs_a_version_that_an_in_place_reshard_re_lays_out(tmp_path):
    # generation (dp 2) and training (tp 2) share devices 0-1: a Reshard reads and writes the same copy
    # of version 1 at the start of step 1; it re-lays the copy out, it does not make it, so a run resumed
    # at step 1 must install version 1 from the checkpoint
    src = open("examples/grpo-tiny.rpeg").read()
    src = src[:src.index("rpeg.cluster")] + """rpeg.cluster @cpu2 {racks = 1, nodes = 1, gpus = 2, hardware = "cpu"}
rpeg.plan @p for @grpo on @cpu2 {
  @gen         at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @ref_inf     at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @reward_inf  at (0, 0, 0) extent (1, 1, 2) dp = 2 pp = 1 tp = 1 mb = 1
  @train_actor at (0, 0, 0) extent (1, 1, 2) dp = 1 pp = 1 tp = 2 mb = 1
}
"""
    (tmp_path / "g.rpeg").write_text(src)
    out = tmp_path / "g.exec.rpeg"
    assert rpegc_main([str(tmp_path / "g.rpeg"), "-p", PIPELINE, "-o", str(out)]) == 0
    full = load_plan(str(out))
    v1 = "weights @actor v1 @(0,0,0)+(1,1,2)"
    assert any(n.kind == "reshard" and [a.label for a in n.inputs] == [v1] == [a.label for a in n.outputs]
               for n in full.nodes)
    assert v1 in {a.label for a in resume_plan(full, 1).initial}


def test_backend_run_config_is_the_toy_run_of_the_program(grpo_plan):
    cfg = run_config(grpo_plan.program, rl={"adam_eps": 1e-5})
    assert cfg.algorithm == "grpo" and cfg.rl.lr_actor == 5e-3 and cfg.rl.adam_eps == 1e-5
    assert cfg.positions == "learned" and cfg.workload.B == 16 and cfg.reward == "rule"
