"""rpeg-calibrate's pure parts: the fits recover known parameters from synthetic measurements, bad
input is a located RpegError, and a calibration becomes a complete profile that load_hardware reads."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import pytest

from rpegc.core.ir.geometry import TIERS
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.hardware import load_hardware
from rpegc.tools.calibrate import (allreduce_terms, copied_links, cpu_plan, eta, fit_alpha_beta, fit_eta, fit_f_peak,
                                   mape, p2p_terms, profile_text)

from fixtures.calibration import calibration

ROWS = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], dtype=float)
WIDTHS = np.array([8, 16, 32, 64, 128, 256, 512], dtype=float)


def _grid():
    r, k = np.meshgrid(ROWS, WIDTHS, indexing="ij")
    return r.ravel(), k.ravel()


@pytest.mark.parametrize("scale, gm, gk", [(5e10, 12.0, 40.0), (6e14, 256.0, 512.0), (1e11, 0.0, 24.0)])
def test_fit_eta_recovers_exact_parameters(scale, gm, gk):
    r, k = _grid()
    fit = fit_eta(r, k, scale * eta(r, k, gm, gk))
    assert fit.scale == pytest.approx(scale, rel=0.02)
    assert fit.gamma_M == pytest.approx(gm, rel=0.02, abs=0.05)
    assert fit.gamma_K == pytest.approx(gk, rel=0.02, abs=0.05)
    assert fit.mape < 0.01 and fit.points == r.size


def test_fit_eta_with_noise_stays_close():
    r, k = _grid()
    rng = np.random.default_rng(0)
    noisy = 4e10 * eta(r, k, 20.0, 60.0) * np.exp(rng.normal(0, 0.1, r.size))
    fit = fit_eta(r, k, noisy)
    assert fit.gamma_M == pytest.approx(20.0, rel=0.2)
    assert fit.gamma_K == pytest.approx(60.0, rel=0.2)
    assert 0.05 < fit.mape < 0.15


def test_fit_eta_rejects_bad_points():
    with pytest.raises(RpegError, match="at least 3 points"):
        fit_eta([1, 2], [8, 8], [1.0, 2.0])
    with pytest.raises(RpegError, match="positive"):
        fit_eta([1, 2, 0], [8, 8, 8], [1.0, 2.0, 3.0])


def test_fit_alpha_beta_recovers_allreduce_parameters():
    msgs = np.array([2.0**e for e in range(8, 25, 2)])
    m, p = np.meshgrid(msgs, [2, 3, 4, 8], indexing="ij")
    a, b = allreduce_terms(m.ravel(), p.ravel())
    alpha, beta = 3e-4, 5e-10
    fit = fit_alpha_beta(a, b, alpha * a + beta * b)
    assert fit.alpha == pytest.approx(alpha, rel=1e-6)
    assert fit.beta == pytest.approx(beta, rel=1e-6)
    assert fit.mape < 1e-9 and fit.note == ""
    # The ring AllReduce terms of spec 4: 2(p-1) alpha + 2 (p-1)/p M beta.
    assert allreduce_terms(1000, 4) == (6, 1500)


def test_fit_alpha_beta_p2p_and_constraints():
    msgs = np.array([2.0**e for e in range(8, 25, 2)])
    a, b = p2p_terms(msgs)
    fit = fit_alpha_beta(a, b, 1.5e-3 + 2e-10 * msgs)
    assert (fit.alpha, fit.beta) == (pytest.approx(1.5e-3), pytest.approx(2e-10))
    # Times that shrink with size would need alpha < 0 or beta < 0: clamped, and said so.
    clamped = fit_alpha_beta(a, b, 1e-3 - 1e-11 * msgs + 1e-4)
    assert clamped.alpha >= 0 and clamped.beta > 0 and clamped.note
    with pytest.raises(RpegError, match="positive"):
        fit_alpha_beta(a, b, np.zeros_like(msgs))


def test_fit_f_peak_inverts_the_roofline():
    work = np.array([1e8, 4e8, 1.6e9, 6.4e9])
    etas = np.array([0.3, 0.5, 0.7, 0.8])
    compute_bound = np.full(4, 1e15)
    seconds = work / (5e10 * etas)
    fit = fit_f_peak(work, etas, compute_bound, seconds)
    assert fit.value == pytest.approx(5e10, rel=0.01) and fit.mape < 0.01
    # A point that is memory-bound at any plausible F_peak does not pull the fit.
    ceilings = np.array([1e6, 1e15, 1e15, 1e15])
    seconds_mem = seconds.copy()
    seconds_mem[0] = work[0] / 1e6
    assert fit_f_peak(work, etas, ceilings, seconds_mem).value == pytest.approx(5e10, rel=0.01)


def test_mape():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    with pytest.raises(RpegError):
        mape([1.0], [0.0])


def test_profile_round_trips_through_load_hardware(tmp_path: Path):
    cal = calibration()
    path = tmp_path / "cpu.toml"
    path.write_text(profile_text(cal))
    hw = load_hardware(str(path))
    assert hw.name == "unit" and hw.gpus_per_node is None  # CPU workers: any number per node
    gpu = dataclasses.replace(cal, backend="nccl")
    path.write_text(profile_text(gpu))
    assert load_hardware(str(path)).gpus_per_node == 2  # a GPU host bounds the GPUs of a node
    assert (hw.F_peak, hw.BW_mem, hw.gamma_M, hw.gamma_K, hw.c_ng, hw.B_cal) == (
        pytest.approx(5.6e10), pytest.approx(2.5e10), pytest.approx(9.0), pytest.approx(25.0),
        pytest.approx(1.6e-4), 8.0)
    assert hw.M_GPU == pytest.approx(1.2e10) and hw.eps_rt == 0.10
    # Only the intra-node tier is measurable on one host; the profile is still complete.
    for tier in TIERS:
        assert hw.coll(tier) == (pytest.approx(3.2e-4), pytest.approx(7.8e-10))
        assert hw.p2p(tier) == (pytest.approx(1.7e-3), pytest.approx(2.9e-10))
    assert cal.hardware().F_peak == pytest.approx(5.6e10)


def test_a_kernel_scale_moves_the_forward_terms_the_profile_writes(tmp_path: Path):
    """The operators' overheads were fitted against the forwards as they ran beside them (tools/overhead_timing.py):
    the profile's F_peak and t_layer are moved by the same scale, and say so."""
    cal = calibration()
    cal.eta_fit = dataclasses.replace(cal.eta_fit, t_layer=3e-4)
    cal.kernel_scale = 0.8
    path = tmp_path / "cpu.toml"
    path.write_text(profile_text(cal))
    hw = load_hardware(str(path))
    assert hw.F_peak == pytest.approx(5.6e10 / 0.8) and hw.t_layer == pytest.approx(3e-4 * 0.8)
    assert hw.BW_mem == pytest.approx(2.5e10) and hw.c_ng == pytest.approx(1.6e-4)  # not forward terms
    assert "then x 1.25: the operators' moment on one worker" in path.read_text()


def test_profile_comments_every_value_and_records_fit_quality():
    text = profile_text(calibration())
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if "=" in code and not code.startswith(("name", "description")):
            assert "#" in line, line  # the shipped-profile rule (tests/test_cost_hardware.py)
    assert "not reachable on one host" in text and "alpha clamped at 0" in text
    assert 'date = "2026-01-01T00:00:00"' in text and "fit_mape" in text


def test_incomplete_calibration_is_an_error():
    cal = calibration()
    cal.coll_fit = None
    with pytest.raises(RpegError, match="incomplete"):
        profile_text(cal)


def test_tiny_campaign_on_two_workers_writes_a_loadable_profile(tmp_path: Path):
    """A real (tiny) sweep on two gloo worker processes: every measured value is positive and the
    written profile loads. Values are not checked for accuracy: the machine is shared and noisy."""
    from rpegc.tools.calibrate import CPU_LAYER_ARCHS, ForwardCase, SweepPlan, calibrate

    d64 = CPU_LAYER_ARCHS["d64"]
    forwards = (ForwardCase("fwd", d64, 2, 8), ForwardCase("fwd", d64, 4, 8),
                ForwardCase("dec", d64, 2, 1, 8), ForwardCase("dec", CPU_LAYER_ARCHS["d128"], 4, 1, 8))
    plan = SweepPlan("fp32", "layers", (1 << 20,), (1, 8), (8, 32), 64, forwards, 8, 8, 64,
                     (1 << 10, 1 << 14), 0.001, 1, rounds=1, rope_shapes=((1, 1, 4, 4, 16), (8, 8, 4, 2, 16)))
    cal = calibrate(2, "gloo", plan, name="smoke", quiet=True)
    hw = cal.hardware()
    assert hw.F_peak > 0 and hw.BW_mem > 0 and hw.c_ng > 0 and hw.M_GPU > 0
    assert hw.beta_coll[0] > 0 and hw.beta_p2p[0] > 0
    assert {kind for kind, *_ in cal.raw} == {"copy", "forward", "non_gemm", "allreduce", "p2p"}
    assert hw.rope_call + hw.rope_element > 0 and cal.rope.forward.points == cal.rope.with_backward.points == 2
    path = tmp_path / "smoke.toml"
    path.write_text(profile_text(cal))
    loaded = load_hardware(str(path))
    assert loaded.gpus_per_node is None and loaded.rope_call == pytest.approx(hw.rope_call, rel=1e-5)
    assert "rope_backward_element = " in path.read_text()


class _RopePool:
    """A worker whose rotations take call + element * elements: forward, and with the backward's terms beside."""

    def __init__(self, forward: tuple[float, float], backward: tuple[float, float]):
        self.forward, self.backward = forward, backward

    def run(self, fn, b, t, h, kv, hd, dtype, min_time, repeats):
        n = b * t * (h + kv) * hd
        ahead = self.forward[0] + self.forward[1] * n
        both = ahead + self.backward[0] + self.backward[1] * n
        return [([ahead * 1.3, ahead], [both, both * 1.1]), None]


def test_the_rope_terms_are_the_rotations_fits_forward_and_backward(tmp_path: Path):
    from rpegc.tools.calibrate import CPU_ROPE_SHAPES, _rope_campaign, rope_keys

    plan = dataclasses.replace(cpu_plan(), kernel_statistic="min")
    rope = _rope_campaign(_RopePool((3e-5, 9e-10), (1.2e-4, 1.6e-9)), plan)
    keys = rope_keys(rope)
    assert (keys["rope_call"], keys["rope_element"]) == (pytest.approx(3e-5, rel=1e-9), pytest.approx(9e-10, rel=1e-9))
    assert (keys["rope_backward_call"], keys["rope_backward_element"]) == (pytest.approx(1.2e-4, rel=1e-9),
                                                                           pytest.approx(1.6e-9, rel=1e-9))
    assert rope.forward.points == len(CPU_ROPE_SHAPES) == len(plan.rope_shapes) and rope.forward.mape < 1e-9
    # a backward faster than its forward's terms (noise) is priced 0, never negative
    cheap = _rope_campaign(_RopePool((3e-5, 9e-10), (-1e-5, 1e-10)), plan)
    assert rope_keys(cheap)["rope_backward_call"] == 0.0 and rope_keys(cheap)["rope_backward_element"] > 0
    cal = calibration()
    cal.rope = rope
    path = tmp_path / "rope.toml"
    path.write_text(profile_text(cal))
    hw = load_hardware(str(path))
    assert (hw.rope_call, hw.rope_backward_element) == (pytest.approx(3e-5, rel=1e-5), pytest.approx(1.6e-9, rel=1e-5))
    assert rope_keys(None) == {} and load_hardware("h200").rope_call == 0.0  # not measured: not priced


LONG_GAP, SHORT_GAP, MESSAGE = 0.045, 0.015, 0.002


class _UnevenGap:
    """A link sweep's compute whose speed moves under it (a VM core switching speeds): 45 ms, then 15 ms, ..."""

    def __init__(self):
        self.spent, self.calls = 0.0, 0

    def __call__(self) -> None:
        import time

        start = time.perf_counter()
        time.sleep(SHORT_GAP if self.calls % 2 else LONG_GAP)
        self.calls += 1
        self.spent += time.perf_counter() - start


def _message_after_uneven_gaps(ctx):
    import time

    from rpegc.tools.calibrate import _seconds_per_iteration

    gap = _UnevenGap()

    def step() -> None:  # the "message": a collective's wait for the other rank's gap, then 2 ms
        gap()
        ctx.barrier([0, 1])
        time.sleep(MESSAGE)

    return _seconds_per_iteration(ctx, [0, 1], 2, 4, step, gap, gaps_in_turn=False)


def test_a_link_sweep_subtracts_the_compute_its_gaps_spent_as_they_ran():
    """The gaps' compute is timed as it runs: what is left is the message (2 ms, the barrier and a sleep's
    overshoot), not the gaps' 30 ms average (or whatever a gap timed alone at another speed would have left). The
    slowest rank's gaps are subtracted, as a collective waits for them. The bound is relative to what is
    subtracted (half the mean gap above the message), so a busy machine's few ms of scheduling slack cannot fail it
    while an unsubtracted sample (message + mean gap) still does."""
    from rpegc.tools.measure import WorkerPool

    with WorkerPool(2) as pool:
        per_rank = pool.run(_message_after_uneven_gaps)
    for samples in per_rank:
        mean_gap = (LONG_GAP + SHORT_GAP) / 2
        assert len(samples) == 2 and all(MESSAGE <= s < MESSAGE + mean_gap / 2 for s in samples)


def test_link_points_send_more_small_messages_up_to_the_plans_cap():
    from rpegc.tools.calibrate import cpu_plan, link_iterations, machine_plan

    full, machine = cpu_plan(), machine_plan()
    assert link_iterations(full, 1 << 8) == 200 and link_iterations(machine, 1 << 8) == 48
    assert link_iterations(full, max(full.message_bytes)) == 64  # about 64 of the largest
    assert link_iterations(machine, max(machine.message_bytes)) == 48


def test_points_keep_the_median_of_their_pooled_repeats_by_default():
    """The profile must predict the statistic rpeg-validate measures (the median): one stalled
    collective among five repeats moves the fastest-repeat estimate, not the median."""
    from rpegc.tools.calibrate import SweepPlan, slowest_rank, summarize

    assert SweepPlan.__dataclass_fields__["statistic"].default == "median"
    assert SweepPlan.__dataclass_fields__["kernel_statistic"].default == "median"
    samples = [4.1e-3, 2.0e-4, 2.2e-4, 2.1e-4, 4.0e-3]
    assert summarize(samples, "median") == 2.2e-4
    assert summarize(samples, "min") == 2.0e-4
    # An idle rank answers None; per repeat the busiest rank is what the operation took.
    assert slowest_rank([[1.0, 5.0, 2.0], None, [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_this_machines_profile_keeps_the_kernels_fastest_repeat_and_the_links_median():
    """A minute's campaign on a VM whose cores switch between two speeds: the kernels' fastest repeat is what stays
    put from one calibration to the next (docs/calibration.md, "Two speeds"); the links keep the median (STATISTICS)."""
    from rpegc.tools.calibrate import cpu_plan, machine_plan

    assert (machine_plan().kernel_statistic, machine_plan().statistic) == ("min", "median")
    assert (cpu_plan().kernel_statistic, cpu_plan().statistic) == ("median", "median")


def test_calibrate_cli_rejects_an_unknown_statistic(capsys):
    from rpegc.tools.calibrate import main

    with pytest.raises(SystemExit) as exc:
        main(["--statistic", "mean", "-o", "never-written.toml"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert not Path("never-written.toml").exists()


def test_fit_eta_overhead_recovers_roofline_and_layer_call_time():
    """Synthetic forwards t = W / (F eta) + layers * t_layer: the fit finds F, both gammas and t_layer
    (the fixed per-layer-call time that dominates small models on CPU workers)."""
    from rpegc.tools.calibrate import fit_eta_overhead

    r, k = _grid()
    work = 2.0 * r * k * 1000.0
    layers = np.where(r > 64, 2.0, 4.0)
    F, gm, gk, t_layer = 1e11, 40.0, 300.0, 3e-4
    seconds = work / (F * eta(r, k, gm, gk)) + layers * t_layer
    fit = fit_eta_overhead(r, k, work, layers, seconds)
    assert fit.scale == pytest.approx(F, rel=0.02) and fit.t_layer == pytest.approx(t_layer, rel=0.02)
    assert fit.gamma_M == pytest.approx(gm, rel=0.05) and fit.gamma_K == pytest.approx(gk, rel=0.05)
    assert fit.mape < 0.005
    # Without a fixed part the fit finds (next to) none: t_layer is clamped at 0, never negative.
    pure = fit_eta_overhead(r, k, work, layers, work / (F * eta(r, k, gm, gk)))
    assert pure.t_layer < 1e-3 * t_layer and pure.scale == pytest.approx(F, rel=0.02)
    with pytest.raises(RpegError):
        fit_eta_overhead(r[:3], k[:3], work[:3], layers[:3], seconds[:3])


def test_fit_eta_overhead_never_gives_a_negative_peak():
    """Per-layer time only, with noise that makes the larger forwards faster (a loaded machine): the
    unconstrained solve puts 1/F below 0; the fit falls back to a positive roofline instead."""
    from rpegc.tools.calibrate import fit_eta_overhead

    r, k = _grid()
    work = 2.0 * r * k * 1000.0
    layers = np.full(r.shape, 2.0)
    seconds = layers * 3e-4 * (1.0 - 0.3 * work / work.max())
    fit = fit_eta_overhead(r, k, work, layers, seconds)
    assert fit.scale > 0 and fit.t_layer >= 0 and np.isfinite(fit.mape)


def test_links_copied_from_a_profile_keep_every_tier_and_say_so(tmp_path: Path):
    """One CUDA device reaches no link: its profile takes every tier's collective and p2p terms from another."""
    h200 = load_hardware("h200")
    cal = dataclasses.replace(calibration(), backend="nccl", devices=1, links_from=h200)
    cal.coll_fit, cal.p2p_fit = copied_links(h200)
    path = tmp_path / "one-gpu.toml"
    path.write_text(profile_text(cal))
    hw = load_hardware(str(path))
    for tier in TIERS:
        assert hw.coll(tier) == tuple(pytest.approx(x) for x in h200.coll(tier))
        assert hw.p2p(tier) == tuple(pytest.approx(x) for x in h200.p2p(tier))
    assert h200.coll("inter_rack") != h200.coll("intra_node")  # so the copy is per tier
    text = path.read_text()
    assert "not measured" in text and "tiers_measured = []" in text and "not reachable on one host" not in text
    assert hw.F_peak == pytest.approx(5.6e10) and hw.gpus_per_node == 1
    assert cal.world == 1 and dataclasses.replace(cal, links_from=None).world == 2


def test_one_cuda_device_without_links_from_is_a_clear_error():
    from rpegc.tools.calibrate import calibrate, gpu_plan

    with pytest.raises(RpegError, match="--links-from"):
        calibrate(1, "nccl", gpu_plan(quick=True))



class _FakePool:
    """A pool whose first worker's forward takes `alone` seconds by itself and `beside` with the others busy."""

    def __init__(self, alone: float, beside: float):
        self.alone, self.beside, self.calls = alone, beside, []

    def run(self, fn, case, dtype, min_time, repeats, busy):
        self.calls.append(busy)
        t = self.alone if busy == 1 else self.beside
        return [[t * 1.1, t, t * 1.2]] + [[t * 2] if busy > 1 else None]


def test_co_running_is_the_narrow_forwards_beside_every_core_over_alone_alternated():
    from rpegc.tools.calibrate import CHECK_WIDTH, CO_RUN_ROUNDS, _co_running
    from rpegc.tools.overhead_timing import KernelCheck, co_run_lines

    plan = dataclasses.replace(cpu_plan(quick=True), kernel_statistic="min")
    narrow = [c for c in plan.forwards if c.width <= CHECK_WIDTH]
    pool = _FakePool(1e-3, 1.25e-3)
    got = _co_running(pool, plan, 2)
    # the first worker's fastest beside over its fastest alone (the other rank's slower time is not the operator's)
    assert got.value == pytest.approx(0.25, rel=1e-12) and got.forwards == len(narrow) > 0 and got.busy == 2
    assert pool.calls == [1, 2] * len(narrow) * CO_RUN_ROUNDS  # alone and beside alternated
    assert _co_running(_FakePool(1e-3, 0.9e-3), plan, 2).value == 0.0  # faster beside: nothing grows
    lines = co_run_lines(KernelCheck((), "min", "fp32", None, co_run=got))
    base = open(load_hardware("cpu-reference").source).read()
    loaded = load_hardware_text(base + "\n[overhead]\n" + "\n".join(lines) + "\n")
    assert loaded.overhead.co_run == pytest.approx(0.25, rel=1e-5) and "on 2 workers at once" in lines[0]
    assert co_run_lines(None) == [] and co_run_lines(KernelCheck((), "min", "fp32", None)) == []


def load_hardware_text(text: str):
    import tomllib

    from rpegc.core.cost.hardware import Hardware

    return Hardware.from_dict(tomllib.loads(text), source="t.toml")
