"""optimize: the joint structure and plan search of Sec. VI / App. A-J (Alg. 1, 6, 7).

Runs on the cyclic graph (before unroll) and replaces any existing plan: it writes the chosen structure
(actor-critic sharing applied when chosen, tau into rpeg.staleness) and a new rpeg.plan, so the rest of
the pipeline lowers it. Its options are the search's (`OptimizeOptions`, declared once with their help in
rpegc/search/optimizer.py; `rpegc --list-passes` prints them), `hardware=` (a profile in place of the cluster's) and
every cost option of annotate-cost (rpegc.core.cost.options.CostOptions, e.g. decode_rows=local_batch): the search
scores plans under the model annotate-cost then reports them with.

If no memory-feasible plan is found, the pass fails with the best peak reached and what to change.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.options import option, option_help, same_as
from rpegc.core.ir.program import Program
from rpegc.core.ir.stages import CYCLIC, TRANSFORMS_G, PassStages
from rpegc.passes.program_pass import CostModelPass, transform
from rpegc.search.optimizer import OptimizeOptions, check_options, optimize, parse_ablations

OPTIONS = {f.name: f for f in dataclasses.fields(OptimizeOptions)}  # the search's, each spelled below


@dataclass(frozen=True)
class OptimizePass(CostModelPass):
    name = "optimize"
    stages = PassStages(needs=CYCLIC, does=TRANSFORMS_G)

    budget: int | float = same_as(OPTIONS["budget_s"])
    evals: int = same_as(OPTIONS["evals"])
    seed: int = same_as(OPTIONS["seed"])
    jobs: int = same_as(OPTIONS["jobs"])
    objective: str = same_as(OPTIONS["objective"])
    delta: int | float = same_as(OPTIONS["delta"])
    taus: tuple[int, ...] = same_as(OPTIONS["taus"])
    ac: bool = same_as(OPTIONS["ac"])
    steps: int = same_as(OPTIONS["steps"])
    ablate: str = option("", option_help(OPTIONS["ablate"]) + ', as a comma list, e.g. ablate="A4,A7"')
    baseline: str = same_as(OPTIONS["baseline"])
    search_zero: bool = same_as(OPTIONS["search_zero"])
    search_recompute: bool = same_as(OPTIONS["search_recompute"])
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
