"""The operators a torch worker runs for Op nodes (paper Sec. VII): generation, inference, verify and training
vertices on this rank's rows, in the node's layout, and fusions of them (their members in turns, interleave.py).
What a vertex computes is its algorithm's (rl/algorithms/): `Operators` is the worker an algorithm is given."""

from __future__ import annotations

from typing import Callable, Optional

import torch.distributed as dist
from torch import Tensor

from rpegc.core.ir.exec_graph import microtask_of
from rpegc.core.ir.program import VERIFY
from rpegc.runtime.backends.torch.channel.commands import Fused, Op, PrepRows
from rpegc.runtime.backends.torch.controller.verifier_pool import VerifierPool
from rpegc.runtime.backends.torch.model.generation import expand_rollouts
from rpegc.runtime.backends.torch.parallel.layout import Layout, split_rows
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, ProcessGroups
from rpegc.runtime.backends.torch.parallel.schedules import generate, infer
from rpegc.runtime.backends.torch.rl.rewards import reward_stats, score_responses, score_rows
from rpegc.runtime.backends.torch.rl.step import last_token_scores, response_forward
from rpegc.runtime.backends.torch.worker.holdings import CommandError, Holdings
from rpegc.runtime.backends.torch.worker.interleave import Interleave, run_members
from rpegc.runtime.backends.torch.worker.step_inputs import StepInputs
from rpegc.runtime.backends.torch.worker.train_states import TrainStates
from rpegc.runtime.backends.torch.worker.transfers import Transfers
from rpegc.runtime.speed_probe import witness_seconds


class Operators:
    """The `op` and `fused` commands. An algorithm's vertices get this object as their worker (the interface
    `algorithms/base.Worker` documents): the run, the setup, the device, and the calls below and those bound from the
    parts that implement them (rows from the transfers, steps' inputs, training states)."""

    def __init__(self, held: Holdings, transfers: Transfers, inputs: StepInputs, states: TrainStates,
                 groups: ProcessGroups, now: Callable[[], float]):
        self.held, self.transfers, self.inputs, self.states, self.groups, self.now = (held, transfers, inputs,
                                                                                      states, groups, now)
        self.setup, self.run, self.rank, self.device = held.setup, held.run, held.rank, held.device
        self.alg = self.run.alg  # what the vertices compute (algorithms/)
        self.pool: Optional[VerifierPool] = None  # a verify vertex's processes, if this rank is the plan's pool
        # what the algorithms call (algorithms/base.Worker), bound once from the parts that do it
        self.rows_of = transfers.rows_of
        self.row_pads, self.step_pairs, self.pair_rows = inputs.row_pads, inputs.step_pairs, inputs.pair_rows
        self.loaded_state, self.publish = states.loaded, states.publish

    def close(self) -> None:
        """Stop the verifier pool's processes, if any were started."""
        if self.pool is not None:
            self.pool.close()

    # -- commands -----------------------------------------------------------------------------------

    def op(self, cmd: Op, witnessed: Optional[bool] = None) -> dict:
        """An Op command's operator and what it reports; then the speed witness where the run has it
        (`WorkerSetup.witness`; `witnessed` overrides: a fusion runs its members' after them), except in a verify
        vertex whose reward function runs in a pool, whose processes run it as they end their shares."""
        out = self.run_op(cmd)
        own = self.setup.witness if witnessed is None else witnessed
        if own and not (cmd.role == VERIFY and self.run.reward_function):
            out["witness"] = out.get("witness", []) + [witness_seconds()]
        return out

    def run_op(self, cmd: Op) -> dict:
        self.prep(cmd)
        role = cmd.role
        lo, hi = cmd.rows[self.rank]
        if role == "training":
            return self.alg.train(self, cmd, lo, hi)
        if role == VERIFY:
            return self.op_verify(cmd, lo, hi)
        pm, version = self.serving_model(cmd.model, cmd.layout, cmd.weights)
        report: dict = {}
        if role == "generation":
            fields = self.op_generation(cmd, pm, lo, hi)
        else:  # the fields of an inference vertex, and what a reward function's calls report from one rank of each
            fields, report = self.alg.inference(self, cmd, pm, lo, hi)  # replica (accuracy sums, failures)
        for label, names in cmd.outputs.items():
            self.held.put_rows(label, lo, hi, {f: fields[f] for f in names})
        out = {"bytes": 0, "versions_in": {cmd.model: version}}
        if "reward_stats" in report:
            out["reward_stats"] = report["reward_stats"]
        return out

    def fused(self, cmd: Fused) -> dict:
        """The members of a fusion (their op commands) as one operator: each in a thread of its own, taking turns in
        the order of this rank's pipeline stage (interleave.py); one report per member."""
        members = cmd.members
        _, p, _ = members[0].layout.coord(self.rank)
        order = [microtask_of(t, p) for t in cmd.stages[p]]
        inter = Interleave(len(members), [(t.member, t.kind, t.micro) for t in order], self.now)
        results = run_members(inter, [lambda c=c: self.op(c, witnessed=False) for c in members])
        if self.setup.witness:  # the members' witnesses here, one after another: in their threads they would meet
            for info in results:
                info["witness"] = info.get("witness", []) + [witness_seconds()]
        return {"members": [dict(info, node=c.node, microtasks=[[self.rank, p, *t] for t in inter.records[i]])
                            for i, (c, info) in enumerate(zip(members, results))]}

    def prep(self, cmd: Op) -> None:
        """Move inputs into the invocation's layout first (rows to replicas, weights to shards)."""
        for i, step in enumerate(cmd.prep):
            tag = cmd.tag + 100000 * (i + 1)
            if isinstance(step, PrepRows):
                self.transfers.move_rows(step.moves, [step.label], step.label, step.fields, tag)
            else:
                self.transfers.reshard(step, tag)

    # -- models -------------------------------------------------------------------------------------

    def serving_model(self, model: str, layout: Layout, label: str) -> tuple[ParallelModel, int]:
        """The execution module of (model, layout) loaded with the version in `label`."""
        key = (model, layout)
        pm = self.held.serving.get(key)
        if pm is None:
            spec = self.setup.models[model]
            pm = self.held.serving[key] = ParallelModel(spec.arch, spec.kind, self.held.nets[model], layout, self.rank,
                                                        self.groups, self.setup.tp_impl, self.device,
                                                        self.held.serving_dtype)
        e = self.held.held(label)
        if pm.bound != label or pm.loaded != (model, e.version):
            pm.bind(e.shards, label)  # the module serves the entry's own tensors: one copy
            pm.loaded = (model, e.version)
        return pm, e.version

    def chunks(self, cmd: Op, lo: int, hi: int) -> list[tuple[int, int]]:
        n = hi - lo
        return [c for c in split_rows(lo, hi, max(1, min(cmd.mb, n))) if c[1] > c[0]] if n else []

    def dp_sum(self, pm: ParallelModel):
        def reduce(t: Tensor) -> Tensor:
            t = t.clone()
            if pm.dp_group is not None:
                dist.all_reduce(t, group=pm.dp_group)
            return t
        return reduce

    # -- vertices -----------------------------------------------------------------------------------

    def op_generation(self, cmd: Op, pm: ParallelModel, lo: int, hi: int) -> dict[str, Tensor]:
        w, rl, inputs = self.run.workload, self.run.rl, self.inputs
        prompts = expand_rollouts(inputs.step_batch(cmd.step).tokens, w.R).to(self.device)
        pads = inputs.row_pads(cmd.step, lo, hi)
        roll = generate(pm, prompts[lo:hi], self.chunks(cmd, lo, hi), seed=self.setup.seed, step=cmd.step,
                        max_new_tokens=w.Lr, sampling=rl.sampling, eos_id=inputs.prompts.eos_id,
                        pad_id=inputs.prompts.pad_id, pads=pads)
        out = {"sequences": roll.sequences, "mask": roll.mask, "old_logprobs": roll.logprobs}
        if "values" in cmd.fields:
            out["values"] = self.forward_field(cmd, pm, out, "values", lo, hi, pads)
        return out

    def verifier_scores(self, cmd: Op, pm: ParallelModel, data: dict[str, Tensor], lo: int, hi: int,
                        report: dict) -> Tensor:
        """The toy rule's or the reward function's scores of the rows (computed once per vertex)."""
        if "verifier" not in report:
            inputs = self.inputs
            scores, scored = score_responses(inputs.prompts, inputs.reward_fn, inputs.step_batch(cmd.step),
                                             data["sequences"], data["mask"], range(lo, hi), self.run.workload.R)
            report["verifier"] = scores
            if scored is not None and pm.is_last and pm.t == 0:  # the rows' one reporter in its replica
                report["reward_stats"] = reward_stats(scored)
        return report["verifier"]

    def op_verify(self, cmd: Op, lo: int, hi: int) -> dict:
        """A verify vertex: the run's reward function over the rows' responses in the plan's pool of processes (the
        toy rule here), written as the rewards container's fields; what its calls report."""
        data = self.rows_of(cmd.inputs, lo, hi, ["sequences", "mask"])
        pool = self.verifier_pool(cmd.pool)
        inputs, batch = self.inputs, self.inputs.step_batch(cmd.step)
        if pool.function:
            scores, scored = score_rows(pool.score_texts, inputs.prompts, batch, data["sequences"], data["mask"],
                                        range(lo, hi), self.run.workload.R)
        else:
            scores, scored = score_responses(inputs.prompts, None, batch, data["sequences"], data["mask"],
                                             range(lo, hi), self.run.workload.R)
        for label, names in cmd.outputs.items():
            self.held.put_rows(label, lo, hi, {f: scores for f in names})
        out: dict = {"bytes": 0, "versions_in": {}}
        if scored is not None:
            out["reward_stats"] = reward_stats(scored)
            out["witness"] = scored.witness
        return out

    def verifier_pool(self, size: int) -> VerifierPool:
        """The pool of the run's reward function, of the plan's size (started on first use)."""
        if self.pool is None or self.pool.size != size:
            if self.pool is not None:
                self.pool.close()
            self.pool = VerifierPool(self.run.reward, size, self.setup.witness)
        return self.pool

    def forward_field(self, cmd: Op, pm: ParallelModel, data: dict[str, Tensor], f: str, lo: int,
                      hi: int, pads: Optional[Tensor], temperature: Optional[float] = None) -> Tensor:
        """A teacher-forced field (log-probs, values, reward-model scores) for the rows, in pipelined microbatches;
        log-probs at the sampling temperature unless `temperature` is given."""
        lp = self.run.workload.Lp
        temp = self.run.rl.temperature if temperature is None else temperature
        if f not in ("old_logprobs", "ref_logprobs", "values", "scores"):
            raise CommandError(f"the torch backend cannot compute field '{f}'")
        fns, rows = [], []
        for a, b in self.chunks(cmd, lo, hi):
            rows.append(b - a)
            seqs, mask = data["sequences"][a - lo:b - lo], data["mask"][a - lo:b - lo]
            p = None if pads is None else pads[a - lo:b - lo]
            if f == "values":
                fns.append(lambda v, s=seqs, p=p: response_forward(v, s, lp, pads=p).values)
            elif f == "scores":
                fns.append(lambda v, s=seqs, m=mask, p=p: last_token_scores(v, s, lp, m, p))
            else:
                fns.append(lambda v, s=seqs, p=p: response_forward(v, s, lp, temp, pads=p).logprobs)
        return infer(pm, fns, rows) if fns else self.transfers.empty(f, 0)
