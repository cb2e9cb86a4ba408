"""What running an operator costs on this machine beyond its kernels: the `[overhead]` table of a CPU profile
(rpegc/core/cost/hardware.py, priced in core/cost/optime.py and on every exec node by core/cost/annotate.py).

- `operator_overheads(hw)`: the torch backend's generation, inference and training operators (the worker's own code,
  through rpeg-validate's runner) of two tiny models over `SHAPES` on one worker. Per role, the time the profile's
  kernel terms (`hw`, the campaign's other tables) leave unexplained is fitted as `call * microbatches + token *
  tokens`, least squares in relative error with both terms >= 0; tokens are a replica's rows times the generated
  tokens (generation) or the whole sequence (inference, training). Small models spend most of an operator here.
- `control_round_trip(hw)`: the runtime's control round trip per exec node (a completion's report, the
  controller's reaction, the next command), as rpeg-run measures it (`runtime/report.control_overhead`) in a short
  real run of a one-device GRPO plan priced with `hw`.
- `overhead_text(hw)`: both as the `[overhead]` table `rpeg-calibrate` appends to a CPU profile.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from rpegc.core.cost.hardware import Hardware, Overhead
from rpegc.core.ir.errors import RpegError

ROLES = ("generation", "inference", "training")
MODELS = ("tiny", "tiny-4l")  # rpeg-validate's presets: the same width at two depths
SHAPES = ((4, 4, 4, 4), (16, 4, 4, 4), (4, 4, 4, 16), (16, 4, 4, 16), (8, 4, 16, 8))  # (B, R, Lp, Lr)
REPEATS, WARMUP = 5, 2
CONTROL_STEPS = 12


@dataclass(frozen=True)
class RoleFit:
    """One role's fitted terms and how well they explain its operators."""

    role: str
    call: float  # s per microbatch
    token: float  # s per token of one row
    points: int
    mape_before: float  # of the kernel terms alone
    mape_after: float  # with the fitted terms


def tokens(role: str, B: int, R: int, Lp: int, Lr: int) -> int:
    """The tokens whose per-token overhead an operator of one replica pays (core/cost/optime.py)."""
    return B * R * (Lr if role == "generation" else Lp + Lr)


def fit_role(role: str, calls: Sequence[float], toks: Sequence[float], kernels: Sequence[float],
             measured: Sequence[float]) -> RoleFit:
    """`call` and `token` >= 0 minimising the relative error of kernels + call * calls + token * toks."""
    m = np.asarray(measured, dtype=float)
    extra, w = (m - np.asarray(kernels, dtype=float)) / m, 1.0 / m
    X = np.stack([np.asarray(calls, dtype=float) * w, np.asarray(toks, dtype=float) * w], axis=1)
    best = (0.0, 0.0)
    for cols in ((0, 1), (0,), (1,)):  # both terms, else the one that fits alone (non-negative least squares)
        c, *_ = np.linalg.lstsq(X[:, cols], extra, rcond=None)
        if (c >= 0).all():
            coef = [0.0, 0.0]
            for j, v in zip(cols, c):
                coef[j] = float(v)
            if _sq(X, extra, coef) < _sq(X, extra, best):
                best = (coef[0], coef[1])
    before = float(np.mean(np.abs(extra)))
    after = float(np.mean(np.abs(extra - X @ np.asarray(best))))
    return RoleFit(role, best[0], best[1], len(m), before, after)


def _sq(X: np.ndarray, y: np.ndarray, coef) -> float:
    return float(np.sum((y - X @ np.asarray(coef)) ** 2))


def operator_overheads(hw: Hardware, quiet: bool = True) -> tuple[RoleFit, ...]:
    """Every role's fit over the backend's operators on one worker (~10 s)."""
    from rpegc.tools import validate

    cases = [validate.Case(role, kind, name, validate.VALIDATION_ARCHS[name], B, R, Lp, Lr, 1, 1, 1, 1)
             for name in MODELS for B, R, Lp, Lr in SHAPES for role, kind in validate.VALIDATION_OPERATORS]
    measured = validate.measure(cases, 1, repeats=REPEATS, warmup=WARMUP, quiet=quiet)
    bare = replace(hw, overhead=Overhead())
    opts = validate._parse_options([])
    fits = []
    for role in ROLES:
        picked = [(c, float(np.median(m[0]))) for c, m in zip(cases, measured) if c.role == role]
        kernels = [validate.predict(c, bare, opts, 1).T_op for c, _ in picked]
        fits.append(fit_role(role, [c.mb for c, _ in picked], [tokens(role, c.B, c.R, c.Lp, c.Lr) for c, _ in picked],
                             kernels, [s for _, s in picked]))
    return tuple(fits)


# A one-device GRPO of the tiny preset with a toy reward model (its rule runs there): the runtime's own round trips.
CONTROL_PROGRAM = """rpeg.workload {{B = 4, R = 4, Lp = 4, Lr = 4, dtype = fp32}}
rpeg.model @actor {{arch = "tiny", kind = policy, trainable}}
rpeg.model @ref {{arch = "tiny", kind = reference}}
rpeg.model @reward {{arch = "tiny", kind = reward}}
rpeg.graph @grpo {{
  %X = rpeg.container tokens[B, Lp]
  %Y = rpeg.container tokens[B*R, Lp + Lr]
  %logp = rpeg.container logprobs[B*R, Lr]
  %logp_ref = rpeg.container logprobs[B*R, Lr]
  %r = rpeg.container rewards[B*R]
  %W_actor = rpeg.weights @actor
  %W_ref = rpeg.weights @ref
  %W_reward = rpeg.weights @reward
  rpeg.input %X, %W_ref, %W_reward
  rpeg.vertex @gen generation @actor reads(%W_actor, %X) writes(%Y, %logp)
  rpeg.vertex @ref_inf inference @ref reads(%W_ref, %Y) writes(%logp_ref)
  rpeg.vertex @reward_inf inference @reward reads(%W_reward, %Y) writes(%r)
  rpeg.vertex @train training @actor reads(%W_actor, %Y, %logp, %logp_ref, %r) writes(%W_actor)
  rpeg.data @gen -> @ref_inf (%Y)
  rpeg.data @gen -> @reward_inf (%Y)
  rpeg.data @gen -> @train (%Y)
  rpeg.data @gen -> @train (%logp)
  rpeg.data @ref_inf -> @train (%logp_ref)
  rpeg.data @reward_inf -> @train (%r)
  rpeg.publish @train -> @gen (%W_actor)
  rpeg.staleness {{@actor = 0}}
  rpeg.algorithm grpo
}}
rpeg.cluster @one {{racks = 1, nodes = 1, gpus = 1, hardware = "{profile}"}}
rpeg.plan @p for @grpo on @one {{
  @gen at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @ref_inf at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @reward_inf at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
  @train at (0, 0, 0) extent (1, 1, 1) dp = 1 pp = 1 tp = 1 mb = 1
}}
"""


def control_round_trip(hw_text: str, steps: int = 0) -> tuple[float, int]:
    """(s per node, nodes measured) of the runtime's control round trip in a short run of `CONTROL_PROGRAM` priced
    with the profile `hw_text` (TOML): rpegc lowers it, rpeg-run runs it on one worker and its trace says."""
    from rpegc.cli import main as rpegc_main
    from rpegc.runtime.cli import main as run_main
    from rpegc.runtime.plan import load_plan
    from rpegc.runtime.report import control_overhead
    from rpegc.runtime.trace import read_trace

    steps = steps or CONTROL_STEPS
    with tempfile.TemporaryDirectory(prefix="rpeg-overhead-") as tmp:
        d = Path(tmp)
        (d / "profile.toml").write_text(hw_text, encoding="utf-8")
        (d / "grpo.rpeg").write_text(CONTROL_PROGRAM.format(profile=d / "profile.toml"), encoding="utf-8")
        pipeline = (f"verify-wellformed,unroll{{k={steps}}},split-quantiles,insert-comm,insert-reshard,fuse-stages,"
                    "annotate-cost,schedule")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = rpegc_main([str(d / "grpo.rpeg"), "-p", pipeline, "-o", str(d / "grpo.exec.rpeg")])
            if rc == 0:
                rc = run_main([str(d / "grpo.exec.rpeg"), "--backend", "torch", "--quiet",
                               "--trace", str(d / "trace.jsonl")])
        if rc != 0:
            raise RpegError(None, "the control round trip's run failed:\n" + out.getvalue()[-2000:])
        plan = load_plan(str(d / "grpo.exec.rpeg"))
        control = control_overhead(plan.pred_ids(), read_trace(str(d / "trace.jsonl")))
    if control is None:
        raise RpegError(None, "the control round trip's run has no steady state")
    return control.per_node_s, control.nodes


def overhead_text(hw: Hardware, hw_text: str, quiet: bool = True) -> str:
    """The `[overhead]` table of this machine's profile, every value with how it was measured; `hw` is the profile
    so far (its kernel terms), `hw_text` the same as TOML."""
    fits = {f.role: f for f in operator_overheads(hw, quiet)}
    node, nodes = control_round_trip(hw_text)
    shapes = ", ".join(f"{B}x{R}/{Lp}+{Lr}" for B, R, Lp, Lr in SHAPES)
    lines = ["", "# What operators cost beyond their kernels on this machine (tools/overhead_timing.py): the backend's "
             f"operators of the {' and '.join(MODELS)} presets", f"# over B x R / Lp + Lr = {shapes} on one worker "
             f"(median of {REPEATS}), fitted per role in relative error; and the control round trip of a real run.",
             "[overhead]"]
    for role in ROLES:
        f = fits[role]
        what = "generated token" if role == "generation" else "token"
        lines += [f"{role}_call = {f.call:.6g}    # s per microbatch; {f.points} operators, MAPE {f.mape_before:.1%} "
                  f"without the overhead, {f.mape_after:.1%} with it",
                  f"{role}_token = {f.token:.6g}    # s per {what} of a row; same fit"]
    lines += [f"node = {node:.6g}    # s per exec node: report, reaction, command (rpeg-run's control overhead over "
              f"{nodes} nodes of a {CONTROL_STEPS}-step one-device GRPO)", ""]
    return "\n".join(lines)

