"""The training states of a torch worker (one per trained model and layout; `holdings.TrainState`): made on first use
as the plan's training says, started from the float32 version a step trains (never from a reduced-precision copy),
given that version as their own working copy, and publishing each trained version as a serving copy."""

from __future__ import annotations

import torch
from torch import Tensor

from rpegc.core.ir.training import Training
from rpegc.runtime.backends.torch.channel.commands import Op
from rpegc.runtime.backends.torch.checkpoints import shard_files as ckpt
from rpegc.runtime.backends.torch.model.master_weights import MasterWeights, training_dtype
from rpegc.runtime.backends.torch.model.transformer import cast_weights
from rpegc.runtime.backends.torch.parallel.layout import Layout
from rpegc.runtime.backends.torch.parallel.parallel_model import ParallelModel, ProcessGroups
from rpegc.runtime.backends.torch.worker.holdings import CommandError, Entry, Holdings, TrainState


class TrainStates:
    """The training states in `held.training`, and the versions they load and publish."""

    def __init__(self, held: Holdings, groups: ProcessGroups):
        self.held, self.groups = held, groups
        self.setup, self.run, self.rank, self.device = held.setup, held.run, held.rank, held.device

    def state(self, model: str, layout: Layout, train: Training) -> TrainState:
        """The training state of (model, layout), made on first use for `train`: its module computes in the training
        dtype, recomputes and reduces as `train` says, its optimizer steps the parameters of its ZeRO share."""
        key = (model, layout)
        st = self.held.training.get(key)
        if st is None:
            spec = self.setup.models[model]
            pm = ParallelModel(spec.arch, spec.kind, self.held.nets[model], layout, self.rank, self.groups,
                               self.setup.tp_impl, self.device, training_dtype(self.run.workload, train))
            pm.grads.zero, pm.module.recompute = train.zero, train.recompute
            lr = self.run.rl.lr_critic if spec.kind == "critic" else self.run.rl.lr_actor
            master = MasterWeights(pm.params(), pm.grads.stepped(), lr, self.run.rl)
            resume = self.held.resume
            if resume is not None and model in resume.index.get("optimizer", ()):
                self._load_optimizer(master, pm, model)
            st = self.held.training[key] = TrainState(pm, master, train)
        elif st.train != train:
            raise CommandError(f"@{model} trains in layout {layout.short()} as {st.train}, and now as {train}: one "
                               "training vertex per model and layout trains one way")
        return st

    def _load_optimizer(self, master: MasterWeights, pm: ParallelModel, model: str) -> None:
        """This rank's pieces of the checkpointed Adam state under its layout (reshard on load), for the parameters
        of its replica's share (another replica's share: its owner keeps that state)."""
        resume = self.held.resume
        assert resume is not None
        pieces = self.held.pieces(model, pm.layout)
        for name in master.names:
            device = master.values[name].device
            prefix = ckpt.adam_key(model, name, "")
            local = {}
            for key in resume.keys(prefix):
                k = key[len(prefix):]
                if resume.shape(key):
                    local[k] = resume.read_piece(key, pieces[name]).to(device)
                else:  # 0-dim state (Adam's step count), on the parameter's device as the fused Adam keeps it
                    local[k] = resume.read(key).to(device)
            if local:
                master.set_adam_state(name, local)

    def master_shards(self, model: str, layout: Layout, e: Entry) -> dict[str, Tensor]:
        """The float32 values a training state (re)starts from at version `e.version`: the entry when it is
        float32; else the full-precision version it was cast from (version 0 by seed, or the checkpoint),
        since a bf16 serving copy has lost bits the master must keep."""
        if e.full_precision():
            return e.shards
        try:
            return self.held.version_shards(model, e.version, layout)
        except CommandError as err:
            raise CommandError(f"training @{model} cannot start from the {self.held.serving_dtype} serving copy of "
                               f"version {e.version}: {err}") from None

    def loaded(self, cmd: Op) -> tuple[TrainState, Entry]:
        """The training state of the command's model and layout, holding the version it trains as its own working
        copy: the published copy it shares is taken over when the command is its last reader (`take`: the memory
        model's one 16-bit copy, M_w of the training operator), else copied first, so that a later reader of that
        version finds it unchanged; a copy the command does not need (the state holds the version already, or
        loaded it from the masters) it lets go of when it is the last reader."""
        model, layout = cmd.model, cmd.layout
        st = self.state(model, layout, cmd.train or self.run.workload.training())
        label, take = cmd.weights, cmd.take
        e = self.held.held(label)
        if st.pm.loaded != (model, e.version):
            values = self.master_shards(model, layout, e)
            self._own_parameters(st, keep_values=False)
            st.pm.load(values)
            st.master.load(values)
            st.pm.loaded = (model, e.version)
        elif st.shares is not None and not (take and st.shares == label):
            self._own_parameters(st)  # a copy of the shared tensors, which stay with their entry
        if take:
            self.held.free([label])
        if st.shares == label:
            st.shares = None  # taken over: the tensors are the module's alone now
        return st, e

    @staticmethod
    def _own_parameters(st: TrainState, keep_values: bool = True) -> None:
        """Give the module tensors of its own where it shares an entry's (before it loads or trains in place): copies,
        or uninitialised ones when a load follows."""
        if st.shares is not None:
            with torch.no_grad():
                for p in st.pm.params().values():
                    p.data = p.data.clone() if keep_values else torch.empty_like(p.data)
            st.shares = None

    def publish(self, cmd: Op, st: TrainState) -> int:
        """The trained version as a serving copy of the working weights (the masters stay in the training state):
        in mixed precision the module's own tensors, one copy (a later step takes it over or copies it); under
        fp32 a copy (cast to the serving dtype), the module's float32 parameters staying as the masters."""
        pm = st.pm
        model, version = cmd.model, cmd.version_out
        pm.loaded = (model, version)
        weights = pm.export() if st.train.persistent_weights else {n: p.detach() for n, p in pm.params().items()}
        self.held.put_weights(cmd.output, Entry("weights", model, version, cmd.layout,
                                                   shards=cast_weights(weights, self.held.serving_dtype)))
        if not st.train.persistent_weights:
            st.shares = cmd.output
        return version
