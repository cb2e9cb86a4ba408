"""Candidate directories X_cand(v) (Sec. VI-B, App. A-J2a/f): legal, isolated-feasible, fastest first,
shared by staleness variants, A3's fixed microbatch rule, and a located error when nothing fits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rpegc.core.cost.options import CostOptions
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import load_hardware
from rpegc.core.check.plan_rules import is_legal
from rpegc.search.directory import MB_FIXED, DirectoryCache, DirectoryRules, build_directory, fixed_microbatch
from rpegc.search.space import ordered_vertices, structural_candidates
from rpegc.syntax.parser import parse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OPTS = CostOptions()


@pytest.fixture(scope="module")
def ppo():
    p = parse((EXAMPLES / "ppo-8gpu.rpeg").read_text(), "ppo-8gpu.rpeg")
    return p, load_hardware(p.cluster.hardware)


def test_directory_entries_are_legal_feasible_alone_and_sorted(ppo):
    p, hw = ppo
    models = {m.name: m for m in p.models}
    for v in ordered_vertices(p):
        d = build_directory(p, v, hw, OPTS)
        assert len(d) > 0
        assert all(is_legal(a, s, models[v.model].arch.layers, p.workload, p.cluster)
                   for a, s in zip(d.allocs, d.strategies))
        assert np.all(d.isolated_peak <= 1.0)
        assert np.all(np.diff(d.t_op) >= 0)  # sorted by estimated time
        # every (strategy, origin) group lists the aligned origins of one strategy
        for group in d.by_strategy:
            assert len({d.strategies[i] for i in group}) == 1
            assert len({d.allocs[i] for i in group}) == len(group)


def test_memory_filter_drops_only_choices_that_do_not_fit_alone(ppo):
    p, hw = ppo
    v = next(v for v in p.graph.vertices if v.name == "train_actor")
    small = replace(hw, M_GPU=hw.M_GPU / 3)
    full = build_directory(p, v, small, OPTS, memory_filter=False)
    kept = build_directory(p, v, small, OPTS)
    assert 0 < len(kept) < len(full) and kept.dropped == len(full) - len(kept)
    kept_at = [full.index(a, s) for a, s in zip(kept.allocs, kept.strategies)]
    dropped = np.isin(np.arange(len(full)), kept_at, invert=True)
    assert np.all(full.isolated_peak[dropped] > 1.0) and np.all(full.isolated_peak[kept_at] <= 1.0)


def test_nothing_fits_is_a_located_error_that_says_what_to_change(ppo):
    p, hw = ppo
    v = next(v for v in p.graph.vertices if v.name == "train_actor")
    with pytest.raises(RpegError) as err:
        build_directory(p, v, replace(hw, M_GPU=1e9), OPTS)
    assert "@train_actor" in err.value.message and "more GPUs" in err.value.message
    assert err.value.loc == v.loc


def test_fixed_microbatch_rule_of_ablation_a3(ppo):
    p, hw = ppo
    for v in ordered_vertices(p):
        d = build_directory(p, v, hw, OPTS, DirectoryRules(MB_FIXED))
        assert all(s.mb == fixed_microbatch(v.role, s.pp) for s in d.strategies)
    assert fixed_microbatch("training", 4) == 8 and fixed_microbatch("inference", 4) == 4
    assert fixed_microbatch("generation", 1) == 1


def test_staleness_variants_share_directories(ppo):
    p, hw = ppo
    cache = DirectoryCache(hw, OPTS)
    variants = structural_candidates(p, (0, 1), ac=True)
    dirs = {}
    for y in variants:
        got = cache.directories(y.program, ordered_vertices(y.program))
        for v, d in zip(ordered_vertices(y.program), got):
            dirs.setdefault((v.name, v.role, v.model), set()).add(id(d))
    assert all(len(ids) == 1 for ids in dirs.values())  # one directory per vertex, whatever the variant
    # actor-critic sharing renames the actor's model and merges the trainers; ref_inf and reward_inf stay
    assert ("ref_inf", "inference", "ref") in dirs and ("reward_inf", "inference", "reward") in dirs
    assert len(dirs) == 6 + 3


def test_a_trainers_entries_choose_how_it_trains_and_drop_dominated_choices(ppo):
    """The ZeRO stage and the recomputation are plan choices (issue 32): at every (allocation, strategy) the
    directory keeps the choices no other is at least as good as in time, optimizer state and transient memory.
    Recomputing every c layers does the work of recomputing every layer while holding more (it is never kept); ZeRO 0
    loses to ZeRO 1 wherever P_d > 1; at one microbatch ZeRO-2 costs no more time than ZeRO-1 and holds less, at
    more microbatches it reduces once per microbatch and both stay; at P_d = 1 the stage is no choice (the workload's)."""
    from rpegc.search.directory import training_choices

    p, hw = ppo
    v = next(v for v in p.graph.vertices if v.name == "train_actor")
    d = build_directory(p, replace(p, plan=None).graph.vertex(v.name), hw, OPTS, memory_filter=False)
    by_base: dict = {}
    for a, s in zip(d.allocs, d.strategies):
        by_base.setdefault((a, replace(s, train=replace(s.train, zero=None, recompute=None))), set()).add(
            (s.train.zero, s.train.recompute))
    for (a, base), chosen in by_base.items():
        assert all(r in ("none", "full") for _, r in chosen)
        zeros = {z for z, _ in chosen}
        if base.dp == 1:
            assert zeros == {None}
        elif base.mb == 1:
            assert zeros == {2}
        else:
            assert 0 not in zeros and 2 in zeros
    assert {s.train.recompute for s in d.strategies} == {"none", "full"}
    assert len(training_choices(v, d.strategies[0], p, DirectoryRules())) == (9 if d.strategies[0].dp > 1 else 3)


def test_the_ablation_switches_leave_the_workloads_training(ppo):
    p, hw = ppo
    v = next(v for v in p.graph.vertices if v.name == "train_actor")
    fixed = build_directory(p, v, hw, OPTS, DirectoryRules(zero=False, recompute=False))
    assert {s.train for s in fixed.strategies} == {replace(fixed.strategies[0].train, zero=None, recompute=None)}
    assert all(s.train.empty for s in fixed.strategies)
    serving = next(v for v in p.graph.vertices if v.role == "generation")
    assert all(s.train.empty for s in build_directory(p, serving, hw, OPTS).strategies)
