"""What rpeg-calibrate --overhead measures (tools/overhead_timing.py): the `[overhead]` table of a CPU profile. The fit
is checked on synthetic operators (it recovers the terms, keeps them >= 0, subtracts the kernels as they ran); the
measurement end to end on a small grid, a kernel forward timed beside it and a short real run. No test asserts a
time: only that the values are >= 0 and load as a profile's."""

import re
import tomllib
from dataclasses import replace

import pytest

from rpegc.core.cost.hardware import Hardware, Overhead, load_hardware
from rpegc.core.ir.errors import RpegError
from rpegc.core.cost.options import cost_options
from rpegc.tools import overhead_timing, validate
from rpegc.tools.calibrate import _measure_forward, cpu_plan
from rpegc.runtime.report import host_cores
from rpegc.tools.overhead_timing import (ControlFit, ControlRuns, KernelCheck, control_lines, fit_role, kernel_scale,
                                         moved_kernels, tokens)


def test_the_fit_recovers_per_call_and_per_token_terms():
    calls = [1, 1, 2, 1, 2]
    toks = [64, 256, 256, 1024, 512]
    kernels = [1e-3, 4e-3, 5e-3, 9e-3, 6e-3]
    measured = [k + 2e-3 * c + 5e-6 * t for k, c, t in zip(kernels, calls, toks)]
    f = fit_role("training", calls, toks, kernels, measured)
    assert f.call == pytest.approx(2e-3, rel=1e-9) and f.token == pytest.approx(5e-6, rel=1e-9)
    assert f.mape_after == pytest.approx(0.0, abs=1e-12) and f.mape_before > 0.3 and f.points == 5


def test_the_fit_keeps_both_terms_non_negative():
    calls, toks = [1, 1, 1, 1], [64, 128, 256, 512]
    kernels = [1e-3, 2e-3, 4e-3, 8e-3]
    # a per-call cost, and kernels that overprice long operators: the per-token slope is negative, so it is 0
    measured = [k + 3e-3 - 2e-6 * t for k, t in zip(kernels, toks)]
    f = fit_role("inference", calls, toks, kernels, measured)
    assert f.token == 0.0 and f.call > 0
    # operators faster than their kernels: no overhead at all
    f = fit_role("inference", calls, toks, kernels, [0.5 * k for k in kernels])
    assert (f.call, f.token) == (0.0, 0.0)


def test_kernels_subtracted_as_they_ran_beside_the_operators_recover_the_terms():
    """The campaign timed the kernels at a slower moment (1/0.6 of their time beside the operators): subtracted as the
    campaign timed them they leave nothing to fit, scaled as they ran they leave the true terms."""
    calls, toks = [1, 1, 1, 1, 1], [128, 256, 512, 1024, 2048]
    campaign = [4e-3, 5e-3, 7e-3, 11e-3, 19e-3]
    measured = [0.6 * k + 5e-4 + 4e-6 * t for k, t in zip(campaign, toks)]
    assert fit_role("generation", calls, toks, campaign, measured).call == 0.0
    f = fit_role("generation", calls, toks, [0.6 * k for k in campaign], measured)
    assert f.call == pytest.approx(5e-4, rel=1e-9) and f.token == pytest.approx(4e-6, rel=1e-9)


def test_the_kernel_scale_is_the_median_forwards_time_now_over_then_in_the_campaigns_statistic():
    now = [[2.0, 3.0, 4.0], [1.0, 1.5], [0.9, 5.0]]
    campaign = [1.0, 0.5, 1.0]
    assert kernel_scale(now, campaign, "min") == pytest.approx(2.0)  # ratios 2, 2, 0.9
    assert kernel_scale(now, campaign, "median") == pytest.approx(2.95)  # ratios 3, 2.5, 2.95
    with pytest.raises(RpegError, match="no kernel forward"):
        kernel_scale([[]], [1.0], "min")


def test_moved_kernels_make_every_forward_that_much_longer():
    hw = replace(load_hardware("cpu-reference"), overhead=Overhead())
    case = validate.Case("inference", "reference", "tiny", validate.VALIDATION_ARCHS["tiny"], 8, 4, 8, 8, 1, 1, 1, 1)
    opts = cost_options(validate.BACKEND_COST_OPTIONS)
    before = validate.predict(case, hw, opts, 1).T_op
    assert validate.predict(case, moved_kernels(hw, 1.5), opts, 1).T_op == pytest.approx(1.5 * before, rel=1e-12)


def test_tokens_are_those_each_operator_runs():
    """A generation pays its prompts' and responses' tokens; a teacher-forced forward its `forward_length`: under the
    backend's accounting a row less its last token, a reward model's whole row (the spec's: every row whole)."""
    arch, backend = validate.VALIDATION_ARCHS["tiny"], cost_options(validate.BACKEND_COST_OPTIONS)

    def case(role, kind):
        return validate.Case(role, kind, "tiny", arch, 4, 2, 8, 16, 1, 1, 1, 1)

    assert tokens(case("generation", "policy"), backend) == 4 * 2 * 24
    assert tokens(case("inference", "reference"), backend) == tokens(case("training", "policy"), backend) == 4 * 2 * 23
    assert tokens(case("inference", "reward"), backend) == 4 * 2 * 24
    assert tokens(case("inference", "reference"), cost_options({"accounting": "spec"})) == 4 * 2 * 24


def test_the_overhead_table_loads_into_a_profile():
    """The whole measurement, as `rpeg-calibrate --machine --quick` runs it: a small grid with a kernel forward timed
    after every round, and a 4-step run."""
    hw = load_hardware("cpu-reference")
    base = open(hw.source).read()
    forward = cpu_plan(quick=True).forwards[0]
    check = KernelCheck(((forward, 1e-3),), "min", "fp32", _measure_forward, repeats=2)
    table = overhead_timing.overhead_table(hw, base, overhead_timing.QUICK, check=check)
    text = base + table.text
    loaded = Hardware.from_dict(tomllib.loads(text), source="t.toml")
    oh = loaded.overhead
    values = [oh.call(r) for r in overhead_timing.FITS] + [oh.token(r) for r in overhead_timing.FITS]
    assert all(v >= 0 for v in values) and oh.transfer >= 0 and oh.node > 0  # a real run's round trips take time
    assert "recompute_call = " in text and "(training without recomputation)" in text
    assert "[overhead]" in text and "4-step GRPO of the tiny preset" in text
    scale = re.search(r"less the kernel terms x ([0-9.e+-]+) \(F_peak and t_layer moved so\): 1 of the", text)
    assert scale and float(scale.group(1)) == pytest.approx(table.kernel_scale, rel=1e-2)  # timed beside the grid
    assert "on one worker (min of 2)" in text  # the operators keep the campaign's statistic of their repeats
    two = host_cores() == 2  # both conditions are measured on a 2-core host only (overhead_timing.control_runs)
    assert (oh.node_free is not None, "node_free = " in text, "contention = " in text) == (two, two, two)
    assert oh.contention >= 0 and (oh.node_free is None or oh.node_free > 0)
    assert ("co_busy = " in text) == (host_cores() >= 2) and oh.co_busy >= 0  # the pair and one alone: 2 cores or more
    # the speed witness after each of the grid's operators (validate._OpRuns), the fastest round's median
    assert 0 < oh.witness < 0.1 and re.search(r"witness = [0-9.e+-]+    # s per operator: .* after each of the "
                                              r"grid's \d+ operators, the fastest round's median", text)


def test_the_witness_is_the_fastest_rounds_median_where_the_operators_keep_their_fastest_repeat():
    """The rounds' witnesses describe the speed the operators' prices were taken at: the fastest round's where they
    keep their fastest repeat, the median round's where they keep the median."""
    rounds = ((3e-4, 5e-4, 4e-4), (2e-4, 9e-4, 2.5e-4), (6e-4, 6e-4, 7e-4))  # medians 4e-4, 2.5e-4, 6e-4
    fits = overhead_timing.OperatorFits((), 1.0, 0, "min", rounds)
    assert fits.witness_s == 2.5e-4 and replace(fits, statistic="median").witness_s == 4e-4
    assert replace(fits, witness=()).witness_s == 0.0
    line, = overhead_timing.witness_lines(fits)
    assert line.startswith("witness = 0.00025    # s per operator") and "the rounds' medians 0.4, 0.25, 0.6 ms" in line
    assert overhead_timing.witness_lines(replace(fits, witness=())) == []


def test_the_grid_trains_without_recomputation_and_times_the_recompute_shapes_recomputing_apart():
    """The training fit prices a step that recomputes nothing (what the optimizer picks where memory allows); the
    recompute shapes' training recomputes, in a backend worker of its own (one worker trains a model one way)."""
    plan = overhead_timing.FULL
    cases = overhead_timing.grid_cases(plan)
    train = [c for c in cases if c.role == "training"]
    plain = [c for c in train if not c.model.endswith(overhead_timing.RECOMPUTING)]
    again = [c for c in train if c.model.endswith(overhead_timing.RECOMPUTING)]
    assert {c.training.recompute for c in plain} == {"none"} and {c.training.recompute for c in again} == {"interval"}
    assert len(plain) == len(plan.models) * len(plan.shapes) and len(again) == len(plan.models) * len(
        plan.recompute_shapes) > 0
    assert not {c.suite for c in plain} & {c.suite for c in again}
    assert [overhead_timing.recomputes(c) for c in cases] == [c in again for c in cases]
    assert {c.training for c in cases if c.role != "training"} == {None}


def fit(devices: int, node: float, op_s: float, nodes_per_step: float = 9.0, forward_s: float = 0.0) -> ControlFit:
    return ControlFit(node, 1e-4, 300, 150, devices, op_s, nodes_per_step, forward_s)


def test_contention_is_the_operator_time_a_full_host_loses_per_node():
    runs = ControlRuns(free=fit(1, 3e-4, 0.025, 4.0), full=fit(2, 1.4e-3, 0.034))
    assert runs.contention == pytest.approx(0.009 / 9, rel=1e-12) and runs.transfers.devices == 2
    assert ControlRuns(fit(1, 3e-4, 0.03), fit(2, 1e-3, 0.025)).contention == 0.0  # faster: nothing taken
    assert ControlRuns(None, fit(1, 1e-3, 0.03)).contention == 0.0  # a 1-core host: no run with a core left
    lines = "\n".join(control_lines(runs, 40))
    assert "node = 0.0014 " in lines and "every core taken" in lines and "node_free = 0.0003 " in lines
    assert "contention = 0.001 " in lines and "34 ms on 2 workers against 25 ms on 1" in lines
    roomy = "\n".join(control_lines(ControlRuns(fit(2, 3e-4, 0.03), None), 40))  # a host of more cores
    assert "node = 0.0003 " in roomy and "no run here takes every core" in roomy and "node_free" not in roomy


def test_contention_is_what_the_full_runs_operators_waited_for_a_core_where_the_workers_measure_it():
    """Measured where it happens, the wait does not move with the machine's moment as a difference of two runs does:
    here the full run's operators took 9 ms a step more than the free run's, of which they waited 2.7 ms."""
    full = replace(fit(2, 1.4e-3, 0.034), op_wait_s=0.0027)
    runs = ControlRuns(free=fit(1, 3e-4, 0.025, 4.0), full=full)
    assert runs.contention == pytest.approx(0.0027 / 9, rel=1e-12)
    lines = "\n".join(control_lines(runs, 40))
    assert "contention = 0.0003 " in lines
    assert "operators on 2 workers waited 2.7 ms for a core (they took 34 ms, 25 on 1)" in lines
    assert ControlRuns(None, full).contention == 0.0  # a 1-core host: no run with a core left


def test_a_weights_transfer_has_its_own_fixed_cost_where_the_control_run_moved_weights():
    full = replace(fit(2, 1.4e-3, 0.034), transfer_weights=2.5e-3, weight_transfers=38)
    lines = control_lines(ControlRuns(free=fit(1, 3e-4, 0.025, 4.0), full=full), 40)
    assert "transfer = 0.0001    # s per transfer of a data field" in "\n".join(lines)
    assert any(line.startswith("transfer_weights = 0.0025    # s per transfer of a model's weights") and
               "median over 38 of the same run's" in line for line in lines)
    assert not any("transfer_weights" in line for line in control_lines(ControlRuns(fit(1, 3e-4, 0.025, 4.0),
                                                                                    fit(2, 1.4e-3, 0.034)), 40))


def test_co_busy_is_the_pairs_forwards_beyond_one_workers_share_and_the_contention_stretch():
    free, full = fit(1, 3e-4, 0.025, 4.0), fit(2, 1.4e-3, 0.034)  # contention 1 ms per node
    pair, alone = fit(2, 1e-3, 0.05, 10.0, 0.03), fit(1, 3e-4, 0.03, 10.0, 0.02)
    runs = ControlRuns(free, full, pair, alone, cores=2)
    floating = 1 + 1e-3 * 10 / (2 * 0.05)  # the pair takes both cores: its operators' contention stretch
    assert runs.co_busy == pytest.approx(0.03 / (0.02 * floating) - 1, rel=1e-12)
    assert runs.co_busy > 0.3  # not lost in the tolerance
    # on a host of 5 cores the pair leaves cores free (no contention) and one sibling is a quarter of the others
    assert ControlRuns(fit(2, 3e-4, 0.03), None, pair, alone, cores=5).co_busy == pytest.approx(0.5 * 4, rel=1e-12)
    assert ControlRuns(free, full, pair, fit(1, 3e-4, 0.03, 10.0, 0.04)).co_busy == 0.0  # faster: nothing grows
    assert ControlRuns(free, full).co_busy == 0.0 and ControlRuns(None, fit(1, 1e-3, 0.03)).co_busy == 0.0
    lines = "\n".join(control_lines(runs, 40))
    assert f"co_busy = {runs.co_busy:.6g} " in lines and "30 ms data-parallel on a 40-step GRPO" in lines
    assert "against 20 ms of one's share on 1" in lines
    assert "co_busy" not in "\n".join(control_lines(ControlRuns(free, full), 40))
