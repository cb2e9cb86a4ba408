"""optimize: the joint structure and plan search of Sec. VI / App. A-J (Alg. 1, 6, 7).

Runs on the cyclic graph (before unroll) and replaces any existing plan: it writes the chosen structure
(actor-critic sharing applied when chosen, tau into rpeg.staleness) and a new rpeg.plan, so the rest of
the pipeline lowers it. Options:

  budget=60        wall-clock seconds for the search, the polish included (0: no time limit)
  evals=0          total uncached evaluations, the polish included (0: no limit); with both, whichever ends first
  jobs=0           worker processes (0: every core, once the budget is large enough to pay for starting them;
                   with an evaluation budget the result does not depend on jobs)
  seed=0           random seed: the same seed and evaluation budget give the same result
  objective=throughput | util     Score_pen (Eq. 5) or the throughput x utilization score (Eq. 6)
  delta=0.1        allowed throughput loss of objective=util
  taus=0,1         staleness candidates per trainable model (S2)
  ac=true          consider actor-critic parameter sharing (S1, when an actor and a critic exist)
  steps=8          K_eval, the unrolled horizon the plans are scored on (use the same k in unroll{k=..})
  ablate=""        comma list of Table IV ablations A1..A9 (e.g. ablate="A4,A7")
  search_zero=true       choose each training vertex's ZeRO stage (false: the workload's, default 2)
  search_recompute=true  choose its activation recomputation (false: the workload's, default interval)
  baseline=none | greedy | concurrent   write that baseline plan instead of searching
  hardware=""      hardware profile override (default: the cluster's)
  and every cost option of annotate-cost (rpegc.core.cost.options.CostOptions, e.g. decode_rows=local_batch):
                   the search scores plans under the model annotate-cost then reports them with
  progress=false   show the progress bar even when stderr is not a terminal
  summary=true     print the summary table on stderr at the end

If no memory-feasible plan is found, the pass fails with the best peak reached and what to change.
"""

from __future__ import annotations

import dataclasses

import sys
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.options import option
from rpegc.core.ir.program import Program
from rpegc.core.ir.stages import CYCLIC, TRANSFORMS_G, PassStages
from rpegc.passes.program_pass import CostModelPass, transform
from rpegc.search.optimizer import OptimizeOptions, check_options, optimize, parse_ablations


@dataclass(frozen=True)
class OptimizePass(CostModelPass):
    name = "optimize"
    stages = PassStages(needs=CYCLIC, does=TRANSFORMS_G)

    budget: int | float = option(60, "wall-clock seconds for the search, the polish included (0: no time limit)")
    evals: int = option(0, "uncached evaluations, the polish included (0: no limit); with budget, whichever ends first")
    seed: int = option(0, "random seed: the same seed and evaluation budget give the same plan")
    jobs: int = option(0, "worker processes (0: every core once the budget pays for starting them)")
    objective: str = option("throughput", "throughput (Score_pen, Eq. 5) or util (throughput x utilization, Eq. 6)")
    delta: int | float = option(0.1, "throughput loss that objective=util may trade for utilization")
    taus: tuple[int, ...] = option((0, 1), "staleness candidates per trainable model (S2)")
    ac: bool = option(True, "consider actor-critic parameter sharing (S1), where an actor and a critic exist")
    steps: int = option(8, "K_eval, the unrolled horizon plans are scored on (use the same k in unroll)")
    ablate: str = option("", "comma list of Table IV ablations A1..A9, e.g. ablate=\"A4,A7\"")
    baseline: str = option("none", "none (search), or write the greedy or concurrent baseline plan instead")
    search_zero: bool = option(True, "choose each training vertex's ZeRO stage (false: the workload's, default 2)")
    search_recompute: bool = option(
        True, "choose each training vertex's activation recomputation (false: the workload's, default interval)")
    progress: bool = option(False, "show the progress bar even when stderr is not a terminal")
    summary: bool = option(True, "print the summary table on stderr at the end")

    def options(self) -> OptimizeOptions:
        return OptimizeOptions(
            budget_s=float(self.budget),
            evals=self.evals,
            seed=self.seed,
            jobs=self.jobs,
            objective=self.objective,
            delta=float(self.delta),
            taus=tuple(self.taus),
            ac=self.ac,
            steps=self.steps,
            ablate=parse_ablations(self.ablate),
            baseline=self.baseline,
            search_zero=self.search_zero,
            search_recompute=self.search_recompute,
        )

    def check_options(self, where=None) -> None:
        check_options(self.options())
        super().check_options(where)

    def run(self, p: Program) -> Program:
        try:
            options = self.options()
            check_options(options)
            cost = self.cost_options()
        except RpegError as err:  # option errors have no source location: point at the graph
            raise RpegError(p.graph.loc if p.graph else err.loc, f"optimize: {err.message}") from None
        hw = self.program_hardware(p)
        if self.progress or sys.stderr.isatty():
            from rpegc.search.report import ProgressBar

            with ProgressBar(options.budget_s, options.evals, force=self.progress) as bar:
                result = optimize(p, options, hw, cost, on_progress=bar.update)
        else:
            result = optimize(p, options, hw, cost)
        if self.summary:
            from rpegc.search.report import print_summary

            print_summary(result)
        plan = result.program.plan
        if p.plan is not None:  # keep the user's plan name and location for readable output
            plan = dataclasses.replace(plan, name=p.plan.name, loc=p.plan.loc)
        return dataclasses.replace(p, models=result.program.models, graph=result.program.graph, plan=plan, exec=None)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, self.run)
