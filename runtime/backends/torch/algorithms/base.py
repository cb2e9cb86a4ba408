"""What every algorithm declares (algorithms/__init__.py), and the rollout fields PPO and GRPO share."""

from __future__ import annotations

from typing import Optional

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Container, Program, Vertex

# What a vertex of a rollout algorithm (PPO, GRPO) writes: generation the sampled sequences, their mask and the
# sampling log-probs; inference per model kind.
ROLLOUT_FIELDS = {
    "generation": {"tokens": ("sequences", "mask"), "logprobs": ("old_logprobs",), "values": ("values",)},
    "reference": {"logprobs": ("ref_logprobs",)},
    "policy": {"logprobs": ("old_logprobs",)},
    "critic": {"values": ("values",)},
    "actor_critic": {"values": ("values",), "logprobs": ("old_logprobs",)},
    "reward": {"rewards": ("scores", "task_scores"), "scalars": ("scores", "task_scores")},
}
ROLLOUT_TRAINING_FIELDS = ("sequences", "mask", "old_logprobs", "ref_logprobs", "scores", "task_scores")


class Algorithm:
    """One algorithm's declarations; subclasses override what differs."""

    name = ""
    generates = True  # samples rollouts (PPO, GRPO); DPO trains on given pairs
    # Statistics the training step reports (a metric each, besides the grad norm), per trained model kind
    stat_keys: dict[str, tuple[str, ...]] = {}

    def container_fields(self, program: Program, vertex: Vertex, container: Container) -> Optional[tuple[str, ...]]:
        """The fields `vertex` writes into `container` (None: it cannot write it)."""
        kind = program.model(vertex.model).kind
        if vertex.role == "generation":
            return ROLLOUT_FIELDS["generation"].get(container.elem)
        if vertex.role != "inference":
            return None
        return ROLLOUT_FIELDS.get(kind, {}).get(container.elem)

    def training_fields(self, has_critic: bool) -> tuple[str, ...]:
        """The fields a training vertex must read."""
        return ROLLOUT_TRAINING_FIELDS + (("values",) if has_critic else ())

    def check(self, cfg) -> None:
        """The run's errors this algorithm defines (RpegError)."""

    def vertex_fields(self, program: Program, cfg) -> dict[str, tuple[str, ...]]:
        """The fields of every data container written by a vertex; checks that every training vertex reads the
        fields its loss needs."""
        assert program.graph is not None
        fields: dict[str, tuple[str, ...]] = {}
        for v in program.graph.vertices:
            kind = program.model(v.model).kind
            for c in v.writes:
                cont = program.graph.container(c)
                if cont.is_weights:
                    continue
                got = self.container_fields(program, v, cont)
                if got is None:
                    raise RpegError(v.loc, f"the torch backend does not know what the {v.role} vertex @{v.name} "
                                    f"(model kind {kind}) writes into %{c} ({cont.elem}) under {self.name.upper()}; "
                                    f"{self.what_writes()}")
                fields[c] = got
        made = {f for fs in fields.values() for f in fs}
        need = set(self.training_fields(cfg.has_critic))
        for v in program.graph.vertices:
            if v.role != "training":
                continue
            missing = sorted(need - {f for c in v.reads if c in fields for f in fields[c]})
            if missing:
                unmade = sorted(need - made)
                hint = (f"no vertex writes {', '.join(unmade)}" if unmade else
                        "let it read the containers that hold them")
                raise RpegError(v.loc, f"training vertex @{v.name} must read {', '.join(missing)}; {hint}")
        return fields

    def what_writes(self) -> str:
        return ("generation writes tokens and log-probs, inference writes log-probs (reference), values (critic) "
                "or rewards")
