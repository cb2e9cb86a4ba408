"""`rpeg-run`: execute a compiled RPEG plan and verify the trace (paper Sec. VII; docs/architecture.md, Runtime).

    rpeg-run PLAN [--backend sim|torch] [--steps K] [--trace out.jsonl] [--jitter X] [--seed S]
                  [--jitter-dist uniform|lognormal] [--policy auto|plan|alg2]
                  [--lookahead N] [--reserve destination|endpoints] [--gantt out.png] [--quiet]
                  [--run-dir DIR] [--checkpoint-every N] [--keep-checkpoints N] [--resume DIR]
                  [--tp-impl auto|megatron|torch]
                  [--dist-backend auto|gloo|nccl] [--no-memory-check]
                  [--rl-config RL.toml] [--rl NAME=VALUE ...] [--lr LR]
                  [--data FILE] [--task pattern|reverse] [--reward rule|model|FUNCTION]
    rpeg-run verify PLAN TRACE
    rpeg-run export RUN_DIR OUT [--model NAME] [--step N]

PLAN is a lowered exec module: `.json` (rpegc --emit=json) or the `.rpeg` text form. The run prints
a line per completed RL step and a summary (steps, wall time, measured vs predicted makespan,
verification result); the trace is verified against the plan before exiting. Errors print
`file:line:col: error: ...` (or `file: error: ...`) and exit 1, as does a trace that fails to verify.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
from typing import Optional, Sequence

from rpegc.core.ir.errors import RpegError, render
from rpegc.runtime.backends import backend_specs
from rpegc.runtime.backends.base import BackendSpec
from rpegc.runtime.plan import RunPlan, load_plan
from rpegc.version import PrintVersion

VERIFY_SHOWN = 30
MAX_SEED = 2**63 - 1


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are rpeg-run's one-line errors with exit status 1 (not argparse's 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise RpegError(None, f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rpeg-run",
        description="Execute a compiled RPEG plan completion-driven (Alg. 2) and verify its trace. "
                    "`rpeg-run verify PLAN TRACE` checks an existing trace; `rpeg-run export RUN_DIR OUT` writes a "
                    "trained model as a Hugging Face directory.",
    )
    p.add_argument("plan", help="lowered exec module (.json or .rpeg text)")
    p.add_argument("--version", action=PrintVersion)
    specs = backend_specs()
    p.add_argument("--backend", choices=tuple(specs), default="sim" if "sim" in specs else next(iter(specs)),
                   help="; ".join(f"{name}: {spec.help}" for name, spec in specs.items()))
    p.add_argument("--steps", type=int, default=None, metavar="K",
                   help="run the first K RL steps (K <= the steps the plan was unrolled for: the runtime "
                        "executes the compiled DAG and never unrolls further; recompile with unroll{k=..} for more)")
    p.add_argument("--trace", metavar="OUT.jsonl",
                   help="write the JSON-lines trace here, when the run completes; a run that completes but fails "
                        "verification keeps its trace (it is the evidence), a run that stops with an error "
                        "leaves none")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the backend (the sim backend's jitter draws, the torch backend's models and data)")
    p.add_argument("--policy", choices=("auto", "plan", "alg2"), default="auto",
                   help="dispatch order: plan = keep the schedule's order per device (reproduces the schedule "
                        "without jitter); alg2 = greedy by step, transfers first, topological order; "
                        "auto = plan if the plan is scheduled")
    p.add_argument("--lookahead", type=int, default=2, metavar="N",
                   help="plan policy: commands a worker may hold queued behind its running one, so it starts "
                        "the next node without waiting for the controller (0: one command at a time)")
    p.add_argument("--reserve", choices=("destination", "endpoints"), default=None,
                   help="resource set of a transfer: its destination (the scheduler's rule, the default; the torch "
                        "backend's sources send on a sender thread of their own beside their operators) or both "
                        "endpoints (Table III: the sources send in their command loop)")
    p.add_argument("--gantt", metavar="OUT.png", help="draw predicted and measured Gantt charts (.png/.svg/.pdf)")
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    for name, spec in specs.items():
        spec.declare(p.add_argument_group(f"{name} backend", spec.help))
    return p


def _verify_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rpeg-run verify", description="Verify a runtime trace against its plan.")
    p.add_argument("plan", help="the plan the trace ran (.json or .rpeg text)")
    p.add_argument("trace", help="the JSON-lines trace")
    return p


def _export_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rpeg-run export", description="Write a trained model of a torch run (its final weights, or a "
                "checkpoint's) as a Hugging Face directory that transformers' from_pretrained loads.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (rpeg-run --run-dir)")
    p.add_argument("out", metavar="OUT", help="a new (or empty) directory")
    p.add_argument("--model", default=None, help="the model to export (default: the run's trained policy)")
    p.add_argument("--step", type=int, default=None, help="export checkpoint step N instead of the final weights")
    return p


def _export_main(args: argparse.Namespace) -> int:
    from rpegc.runtime.backends.torch.checkpoints.hf_export import export

    if not os.path.isdir(args.run_dir):
        raise RpegError(None, f"{args.run_dir} is not a run directory")
    name = export(args.run_dir, args.out, model=args.model, step=args.step)
    print(f"exported @{name} to {args.out} (load it with transformers.AutoModelForCausalLM.from_pretrained)")
    return 0


def _rl_settings_parser() -> argparse.ArgumentParser:
    return _Parser(prog="rpeg-run rl-settings", description="List the torch backend's RL and data settings (what "
                   "--rl-config and --rl set): each one's type, default, range and meaning.")


def _rl_settings_main(args: argparse.Namespace) -> int:
    try:
        from rpegc.runtime.backends.torch.rl.hyperparameters import settings_listing
    except ImportError as e:
        raise RpegError(None, f"cannot load the torch backend: {e}; install the runtime extras "
                              "(pip install 'rpegc[runtime]')") from None
    sys.stdout.write(settings_listing())
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from rpegc.runtime.interrupt import Interrupted

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "verify":
            return _verify_main(_verify_parser().parse_args(args[1:]))
        if args and args[0] == "export":
            return _export_main(_export_parser().parse_args(args[1:]))
        if args and args[0] == "rl-settings":
            return _rl_settings_main(_rl_settings_parser().parse_args(args[1:]))
        return _run_main(_parser().parse_args(args), args)
    except Interrupted as e:  # the run already printed its one line
        return e.exit_code
    except RpegError as e:
        print(format_error(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rpeg-run: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `rpeg-run` command: `main`, then the exit handlers, and a hard exit. After a torch run the interpreter's
    own teardown (torch, gloo, the control store) took 1-4 s on a 2-core host and releases nothing the OS does not;
    the fork server (the workers' parent) is ended too, not left to tear down its own imports while it still holds
    the terminal. Outputs are closed by the code that writes them (never left to the garbage collector)."""
    import atexit

    from rpegc.runtime.backends.torch.controller.processes import stop_forkserver

    code = main()
    stop_forkserver()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def format_error(e: RpegError) -> str:
    """`file:line:col: error: msg` with the source line, or `file: error: msg` without a position."""
    errors = getattr(e, "errors", [e])
    lines = []
    for err in errors:
        loc = err.loc
        if loc.line > 0:
            source = None
            if os.path.isfile(loc.file):
                try:
                    with open(loc.file, encoding="utf-8") as f:
                        source = f.read()
                except (OSError, UnicodeDecodeError):
                    source = None
            lines.append(render(err, source))
        elif loc.file and loc.file != "<unknown>":
            lines.append(f"{loc.file}: error: {err.message}")
        else:
            lines.append(f"rpeg-run: error: {err.message}")
    return "\n".join(lines)


def check_options(args: argparse.Namespace) -> None:
    """Range checks of the numeric options, before anything is loaded or launched."""
    if args.steps is not None and args.steps < 1:
        raise RpegError(None, f"--steps {args.steps}: run at least 1 step (K >= 1)")
    if args.lookahead < 0:
        raise RpegError(None, f"--lookahead {args.lookahead}: give N >= 0 queued commands (0: none)")
    if not 0 <= args.seed <= MAX_SEED:
        raise RpegError(None, f"--seed {args.seed}: give a seed in 0..2^63-1")
    for spec in backend_specs().values():
        spec.check(backend_options(spec, args))


def backend_options(spec: BackendSpec, args: argparse.Namespace):
    """The options of backend `spec` as its own dataclass (its fields are the options' destinations)."""
    return spec.options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(spec.options)})


def _given(spec: BackendSpec, args: argparse.Namespace) -> list[str]:
    """The options of `spec` this command line sets (to something other than their defaults)."""
    probe = argparse.ArgumentParser(add_help=False)
    spec.declare(probe.add_argument_group(spec.name))
    return [a.option_strings[0] for a in probe._actions if a.option_strings and getattr(args, a.dest) != a.default]


def chosen_backend(args: argparse.Namespace) -> BackendSpec:
    """The backend --backend names; another backend's options are an error."""
    specs = backend_specs()
    for name, spec in specs.items():
        given = _given(spec, args) if name != args.backend else []
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise RpegError(None, f"{', '.join(given)} {verb} to the {name} backend only; this run uses the "
                                  f"{args.backend} backend")
    return specs[args.backend]


def make_backend(args: argparse.Namespace):
    """The backend --backend names, built from its own options."""
    spec = chosen_backend(args)
    return spec.create(backend_options(spec, args))


def _run_main(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    from rpegc.core.cost.annotate import priced_round_trip
    from rpegc.runtime.controller import RunOptions, StepProgress, run
    from rpegc.runtime.speed_probe import drift_note, spaced_probe_seconds
    from rpegc.runtime.trace import TraceWriter
    from rpegc.runtime.verify import compare, verify

    check_options(args)
    spec = chosen_backend(args)
    check_run_outputs(args, spec)
    plan = load_plan(args.plan, steps=args.steps)
    backend = spec.create(backend_options(spec, args))
    plan = backend.prepare(plan)
    print(f"rpeg-run: {args.plan} (plan {plan.hash[:12]}), {plan.steps} of {plan.plan_steps} step(s), "
          f"{len(plan.nodes)} nodes on {_devices_text(plan)}, backend {backend.name}")

    done: list[int] = []

    def progress(s: StepProgress) -> None:
        done.append(s.step)
        if args.quiet:
            return
        pred = f" (predicted {s.predicted_finish:.6g} s)" if s.predicted_finish is not None else ""
        measured = backend.step_metrics(s.step)
        extra = "".join(f", {k} {measured[k]:.4g}" for k in ("reward", "policy_loss", "value_loss", "dpo_loss",
                                                             "reward_accuracy", "informative_groups") if k in measured)
        print(f"step {s.step} done ({s.steps_done}/{s.steps_total}) at t = {s.finish:.6g} s{pred}, "
              f"wall {s.wall_s:.3f} s{extra}", flush=True)

    priced = _priced_profile(plan, backend)  # resolved once: the probe, the control round trip, the profile line
    probed = _with_probe(priced)
    probe_s = spaced_probe_seconds() if probed is not None else None  # before the workers start: the probe runs alone
    writer = TraceWriter(args.trace) if args.trace else None
    options = {"jitter": args.jitter, "jitter_dist": args.jitter_dist, "seed": args.seed,
               **backend.header_options(plan)}
    try:
        with backend.stop_signals():
            result = run(plan, backend, RunOptions(policy=args.policy, reserve=args.reserve,
                                                        lookahead=args.lookahead),
                         sink=writer, on_step=progress, header_options=options)
    except BaseException as e:
        if writer is not None:
            writer.discard()
        _say_interrupted(e, args, argv, plan, backend, done)
        raise
    if writer is not None:
        writer.close()  # the run completed: its trace stays even if verification fails below
    # again once the workers have stopped: a drift is named only if the run is bracketed by two slow (fast) probes
    drift = (drift_note((probe_s, spaced_probe_seconds()), probed.speed_probe_s, probed.calibrated)
             if probed is not None else None)
    violations = verify(plan, result.trace)
    cmp = compare(plan, result.trace)
    print(f"ran {plan.steps} step(s), {len(result.trace.nodes)} nodes in {result.wall_s:.3f} s wall "
          f"(dispatch policy {result.policy}, transfers reserve {result.reserve}; the controller's own work "
          f"{1000 * result.controller_s / max(1, len(result.trace.nodes)):.3g} ms per node)")
    writes = _priced_writes(plan, backend, priced)
    round_trip = priced_round_trip(plan.program, priced) if priced is not None else None
    for line in _summary_lines(cmp, result.trace, plan, round_trip, writes, priced):
        print(line)
    for line in _checkpoint_lines(backend, priced, writes, _oversubscribed(result.trace) is not None):
        print(line)
    if priced is not None:  # measured against predicted
        print(_profile_line(plan.program, priced))
        stale = _recalibrated_note(args.plan, priced)
        if stale is not None:
            print(f"note: {stale}")
        if drift is not None:
            print(f"note: {drift}")
    for line in backend.memory_summary():
        print(line)
    for line in backend.cpu_summary(priced is not None and priced.overhead.node_free is not None):
        print(line)
    for line in backend.run_notes():
        print(line)
    if args.gantt:
        _gantt(plan, result.trace, args.gantt)
    if args.trace:
        print(f"trace: {args.trace}")
    return _report(violations, len(result.trace.nodes))


def _say_interrupted(e: BaseException, args, argv, plan: RunPlan, backend, done: list) -> None:
    """The one line after SIGINT/SIGTERM: the last completed step and the resume command."""
    from rpegc.runtime.interrupt import Interrupted, RunState, interrupted_line, print_interrupted

    if not isinstance(e, Interrupted):
        return
    state = RunState(max(done) if done else None, plan.first_step, plan.steps, backend.run_dir,
                     backend.last_checkpoint_step())
    print_interrupted(interrupted_line(e.name, state, args.plan, argv))


def check_run_outputs(args: argparse.Namespace, spec: BackendSpec) -> None:
    """Every file the run writes (--trace, --gantt, and what the backend's options make it write, like a run
    directory's checkpoints, logs and final weights) against the plan, the backend's inputs and each other,
    before anything runs."""
    from rpegc.outputs import GANTT_FORMATS, Output, check_outputs

    options = backend_options(spec, args)
    wanted = list(spec.outputs(options))
    if args.trace is not None:
        wanted.append(Output(args.trace, "the trace"))
    if args.gantt is not None:
        wanted.append(Output(args.gantt, "the Gantt chart", suffixes=GANTT_FORMATS))
    check_outputs(wanted, inputs=[args.plan] + list(spec.inputs(options)))


def _summary_lines(cmp, trace, plan: RunPlan, priced_control_s: Optional[float] = None,
                   writes=None, hw=None) -> list[str]:
    """start-up, oversubscription, steady state, control overhead and makespan lines of a run
    (rpegc.runtime.report); given the control round trip the plan's profile prices before every node, a wall-clock
    run on no more workers than cores also says where its steady state's time went. `writes` (report.PricedWrites):
    the run's checkpoint writes as priced, which the predicted steady state includes. `hw`: the plan's profile, whose
    speed witnesses a compared run's are held against: how fast its cores ran."""
    from rpegc.runtime.report import control_overhead, steady_state, witness_speed

    h = trace.header
    over = _oversubscribed(trace)
    steady = steady_state(trace, writes)
    lines = []
    if h.clock == "wall" and steady is not None:
        lines.append(f"start-up: {steady.startup_s:.3g} s (workers, process groups, installs)")
    if over is not None:
        lines.append(over.label)
    if steady is not None:
        lines.append(_steady_line(steady, cmp.steady_abs_rel_error, compared=over is None))
    speed = (witness_speed(trace, steady, _witnessed_nodes(plan, cmp, hw))
             if steady is not None and over is None and hw is not None else None)
    if speed is not None and steady.ratio is not None:
        lines.append(_witness_line(speed, steady.ratio))
    control = control_overhead(plan.pred_ids(), trace) if h.clock == "wall" else None
    priced = priced_control_s if h.clock == "wall" and over is None and steady is not None else None
    if control is not None:
        also = f"; priced {1000 * priced:.3g} ms" if priced is not None else ""
        lines.append(f"control overhead: {1000 * control.per_node_s:.3g} ms per node (report, reaction, "
                     f"command{also}), {1000 * control.critical_s:.3g} ms per step on the critical chain "
                     f"({100 * control.step_share:.3g} % of the step)")
    if priced is not None:
        waited = {r.id: r.waited for r in trace.nodes.values() if r.kind == "op" and r.waited is not None}
        lines += _part_lines(cmp, plan, range(steady.first_step, steady.last_step + 1), priced, waited)
    lines.append(_makespan_line(cmp.measured_makespan, None if over else cmp.predicted_makespan,
                                None if over or steady is not None else cmp.mean_abs_rel_error, h.clock))
    return lines


def _oversubscribed(trace):
    """The run's report.Oversubscription (more local workers than cores, or the plan's nodes on this one host), or
    None."""
    from rpegc.runtime.report import oversubscription

    opts = trace.header.options
    return oversubscription(int(opts.get("local_workers", 0)), int(opts.get("host_cores", 1)),
                            int(opts.get("plan_nodes", 1))) if "local_workers" in opts else None


def _part_lines(cmp, plan: RunPlan, steps: range, control_s: float, waited: dict[str, float]) -> list[str]:
    """Where the steady state's time went, per vertex and kind of transfer, measured against predicted, how much of
    each operator's time another core of its host computed beside it (rpegc.runtime.report.part_times,
    beside_shares) and how long its worker thread waited for a core in it (`waited`: node id -> s, the trace's)."""
    from rpegc.runtime.report import beside_shares, part_label, part_times

    parts = part_times(cmp.nodes, {n.id: part_label(n.node) for n in plan.nodes}, steps, control_s,
                       beside_shares(_operator_runs(cmp, plan)), waited)
    if not parts:
        return []
    width = max(len(p.label) for p in parts)
    shown = any(p.beside for p in parts)  # a plan on one core has nothing beside it
    waits = any(p.waited for p in parts)  # nor anything that preempts its operators
    lines = ["time per node (steady steps' medians, the control round trip apart"
             + ("; the share of an operator's time another core computed beside it" if shown else "")
             + ("; the mean time an operator's worker waited for a core in it" if waits else "") + "):"]
    for p in parts:
        ratio = f" ({p.ratio:.2f}x)" if p.ratio is not None else ""
        beside = f", {100 * p.beside:3.0f} % beside" if shown and p.beside is not None else ""
        wait = f", waited {1000 * p.waited:.2g} ms" if waits and p.waited is not None else ""
        lines.append(f"  {p.label:<{width}}  {1000 * p.measured_s:8.3g} ms measured, "
                     f"{1000 * p.predicted_s:8.3g} ms predicted{ratio}{beside}{wait}")
    return lines


def _operator_runs(cmp, plan: RunPlan) -> list:
    """The measured runs of the plan's operator nodes with their hosts and cores (report.Busy): a device's on its
    node's host, the verifier pool's on the first node's, on its own id and the devices whose cores it shares."""
    from rpegc.core.cost.contention import host_of
    from rpegc.runtime.report import Busy

    if plan.program.cluster is None:
        return []
    gpus = plan.program.cluster.gpus
    devices = len(plan.model_devices)
    nodes = {n.id: n for n in plan.nodes}
    return [Busy(t.id, 0 if min(n.devices) >= devices else host_of(min(n.devices), gpus),
                 frozenset(n.devices) | frozenset(n.node.shares), t.measured_start, t.measured_finish)
            for t in cmp.nodes if (n := nodes.get(t.id)) is not None and n.kind == "op" and n.devices]


def _devices_text(plan) -> str:
    """'2 devices', or '1 device and a verifier pool' (its worker is one past the cluster's devices), and the devices
    whose cores the pool shares (cost/host.py)."""
    n = len(plan.model_devices)
    text = f"{n} device{'s' if n != 1 else ''}"
    if len(plan.devices) == n:
        return text
    shared = sorted({d for x in plan.nodes for d in x.node.shares})
    sharing = f" sharing the core{'s' if len(shared) > 1 else ''} of device{'s' if len(shared) > 1 else ''} " \
              f"{', '.join(map(str, shared))}" if shared else ""
    return f"{text} and a verifier pool{sharing}"


def _priced_profile(plan: RunPlan, backend):
    """The profile a wall-clock run is measured against (its plan's cluster's); None on a simulated clock or
    without a cluster."""
    from rpegc.core.cost.hardware import program_hardware

    if backend.clock != "wall" or plan.program.cluster is None:
        return None
    return program_hardware(plan.program, what="the prediction")


def _priced_writes(plan: RunPlan, backend, hw):
    """The run's checkpoint writes as the cost model prices them (report.PricedWrites), or None: no checkpoints, no
    profile, or a profile without the checkpoint terms ([host] checkpoint_rate)."""
    from rpegc.core.cost.checkpoint import checkpoint_steps, checkpoint_time, commit_time
    from rpegc.runtime.report import PricedWrites

    steps = checkpoint_steps(plan.first_step, plan.steps, backend.checkpoint_every)
    seconds = checkpoint_time(plan.program, hw, backend.checkpoint_every) if hw is not None and steps else None
    if seconds is None:
        return None
    return PricedWrites(steps, seconds, commit_time(plan.program, hw, backend.checkpoint_every))


def _checkpoint_lines(backend, hw, writes, oversubscribed: bool = False) -> list[str]:
    """The checkpoints a wall-clock run wrote: their measured write (the slowest worker's serialise, write and fsync)
    against the price the steady state's prediction includes, or why they are not priced; measured only on an
    `oversubscribed` host (more workers than cores), as the run's other times."""
    measured = backend.checkpoint_write_seconds()
    if hw is None or not measured:
        return []
    what = f"checkpoint writes: {len(measured)}, median {1000 * statistics.median(measured):.3g} ms measured"
    if oversubscribed:
        return [what]
    if writes is None:
        return [f"{what}, not priced: the profile '{hw.name}' has no [host] checkpoint_rate (rpeg-calibrate "
                "measures it), so the predicted steady state leaves them out"]
    lines = [f"{what}, {1000 * writes.seconds:.3g} ms priced each (core/cost/checkpoint.py; the predicted steady "
             "state includes them)"]
    commits = backend.checkpoint_commit_seconds()
    if commits and writes.commit_s:
        median = 1000 * statistics.median(commits)
        lines.append(f"checkpoint commits (the controller's index, rename and pruning): median {median:.3g} ms "
                     f"measured, {1000 * writes.commit_s:.3g} ms priced each")
    return lines


def _recalibrated_note(plan_path: str, hw) -> Optional[str]:
    """Why the run's prices may be another calibration's: the plan's node times were fixed when it was compiled, but
    the profile that names the machine (`hw`, whose control round trip the per-part lines take apart) was calibrated
    after the plan file was written (`rpeg-calibrate --machine` refreshes the cached profile in place); None
    otherwise, or when the profile does not say when it was calibrated."""
    try:
        calibrated = datetime.datetime.fromisoformat(hw.calibrated)
        written = os.path.getmtime(plan_path)
    except (ValueError, OSError):
        return None
    if calibrated.tzinfo is None or calibrated.timestamp() <= written:
        return None
    compiled = datetime.datetime.fromtimestamp(written).astimezone().isoformat(timespec="seconds")
    return (f"the profile was calibrated ({hw.calibrated}) after the plan was compiled ({compiled}): the plan's times "
            "are an earlier profile's prices; compile it again to price it with this one")


def _with_probe(hw):
    """`hw` if it recorded runtime/speed_probe.py's probe, else None."""
    return hw if hw is not None and hw.speed_probe_s is not None else None


def _profile_line(program, hw) -> str:
    """Whose machine the predictions were priced for (`hw`, the plan's cluster's profile)."""
    return f"predictions priced with hardware '{program.cluster.hardware}' = '{hw.name}': {hw.provenance()}"


def _steady_line(steady, err: Optional[float], compared: bool = True) -> str:
    text = f"steady state: measured {steady.measured_s:.3g} s/step"
    if compared and steady.predicted_s:
        writes = f", {1000 * steady.written_s:.3g} ms of it checkpoint writes" if steady.written_s else ""
        text += f", predicted {steady.predicted_s:.3g} s/step{writes} (measured/predicted {steady.ratio:.4g})"
    steps = f"step {steady.first_step}" if steady.steps == 1 else f"steps {steady.first_step}-{steady.last_step}"
    text += f" over {steps}"
    if compared and err is not None:
        text += f"; mean |node time error| {100 * err:.2f} %"
    return text


def _witnessed_nodes(plan: RunPlan, cmp, hw) -> dict:
    """The op nodes whose speed witnesses a run's summary counts (report.WitnessedNode), each held against the witness
    the cost model prices it with: an operator's its worker's ([overhead] witness), a verify vertex's the one that ends
    it (host.verify_witness: its pool's, or its worker's where the worker scores the rows itself). A pool's is timed
    after math; after another function the pass reads differently, and is not counted."""
    from rpegc.core.cost.host import IN_WORKER, verify_witness
    from rpegc.core.ir.program import VERIFY
    from rpegc.runtime.report import WitnessedNode

    nodes = {n.id: n.node for n in plan.nodes}
    out = {}
    for t in cmp.nodes:
        if t.kind != "op" or t.predicted_time is None:
            continue
        node = nodes[t.id]
        verifier = plan.program.verifier(node.model) if node.role == VERIFY else None
        if verifier is None:
            out[t.id] = WitnessedNode("workers", hw.overhead.witness, t.predicted_time)
        elif verifier.fn in IN_WORKER or verifier.fn == "math":
            group = "workers" if verifier.fn in IN_WORKER else "verifier pools"
            out[t.id] = WitnessedNode(group, verify_witness(verifier, hw), t.predicted_time)
    return out


def _witness_line(speed, ratio: float) -> str:
    """How fast the run's cores ran against the calibration (report.WitnessSpeed), and the steady state's
    measured/predicted at that speed: what the prediction would have said of cores that fast."""
    groups = "; ".join(f"{g.what} {1e3 * g.median_s:.3g} ms against {1e3 * g.calibrated_s:.3g} (median of {g.count})"
                       for g in speed.groups)
    return (f"speed witness ({groups}): the cores ran at {1 / speed.factor:.3g}x the speed they were priced at; "
            f"measured/predicted at that speed {ratio / speed.factor:.4g}")


def _makespan_line(measured: float, predicted: Optional[float], err: Optional[float], clock: str) -> str:
    """predicted None: measured only (an oversubscribed host); err: given when there is no steady state."""
    text = f"makespan: measured {measured:.6g} s ({clock} clock)"
    if predicted:
        text += f", predicted {predicted:.6g} s (measured/predicted {measured / predicted:.4f})"
    if err is not None:
        text += f"; mean |node time error| {100 * err:.2f} %"
    return text


def _report(violations, nodes: int) -> int:
    if not violations:
        print(f"verification: OK ({nodes} nodes, 0 violations)")
        return 0
    print(f"verification: FAILED, {len(violations)} violation(s)")
    for v in violations[:VERIFY_SHOWN]:
        print(f"  {v}")
    if len(violations) > VERIFY_SHOWN:
        print(f"  ... and {len(violations) - VERIFY_SHOWN} more")
    return 1


def _verify_main(args: argparse.Namespace) -> int:
    from rpegc.runtime.trace import read_trace
    from rpegc.runtime.verify import compare, verify

    plan = load_plan(args.plan)
    trace = read_trace(args.trace)
    violations = verify(plan, trace)
    if not any(v.rule in ("plan-hash", "node-set") for v in violations):
        for line in _summary_lines(compare(plan, trace), trace, plan):
            print(line)
    return _report(violations, len(trace.nodes))


def gantt_panels(plan: RunPlan, trace) -> list:
    """(name, bars) panels: the predicted schedule, and the measured steady state, its clock shifted so
    that 0 is the end of start-up (rpegc.runtime.report.startup_time), where the schedule starts; a fused member's
    measured microtasks are drawn over its block."""
    from rpegc.runtime.report import startup_time
    from rpegc.tools.gantt import bars_from_program, microtask_bars, node_bar

    ids = set(plan.index)
    panels = []
    if plan.scheduled:
        panels.append(("predicted", [b for b in bars_from_program(plan.program) if b.node in ids]))
    t0 = startup_time(trace)
    measured = [node_bar(plan.node(r.id).node, r.devices, r.start - t0, r.finish - t0) for r in trace.nodes.values()]
    device_of = {rank: device for device, rank in trace.header.workers.items()}
    for i, r in enumerate(trace.nodes.values()):  # a fused member's microtasks over its block (docs/stage-fusion.md)
        if r.microtasks:
            measured[i] = dataclasses.replace(measured[i], label="", short="")  # its microtasks say what ran
            measured += microtask_bars(plan.node(r.id).node.vertex or r.id, r.step, r.microtasks, device_of, t0)
    name = "measured" if trace.header.clock == "sim" else f"measured, after start-up ({t0:.3g} s)"
    panels.append((name, measured))
    return panels


def gantt_unit(trace) -> str:
    """Row names: `worker N` for the torch backend's CPU workers (gloo), `GPU N` otherwise."""
    opts = trace.header.options
    return "worker" if trace.header.backend == "torch" and opts.get("dist_backend", "gloo") != "nccl" else "GPU"


def _gantt(plan: RunPlan, trace, path: str) -> None:
    try:
        from rpegc.tools.gantt import draw_bars
    except ImportError as e:
        print(f"rpeg-run: skipping --gantt: the Gantt tool is not available ({e})", file=sys.stderr)
        return
    cluster = plan.program.cluster
    assert cluster is not None
    from rpegc.outputs import PendingOutput

    with PendingOutput(path, "the Gantt chart") as tmp:
        draw_bars(gantt_panels(plan, trace), tmp, title=f"{os.path.basename(plan.file)}: {plan.steps} step(s)",
                  num_devices=cluster.num_devices, gpus_per_node=cluster.gpus, unit=gantt_unit(trace))
    print(f"gantt: {path}")


if __name__ == "__main__":
    entry()
