"""The standard RL post-training programs (PPO, GRPO, DPO) as `.rpeg` text, from Python.

`ppo`, `grpo` and `dpo` write the steady-state graph of each algorithm with the names of the shipped examples
(`examples/ppo.rpeg`, `grpo.rpeg`, `dpo.rpeg`), and the workload, model, verifier and cluster lines around it; a
plan, written for the graph (`@ppo`, `@grpo`, `@dpo`) and the cluster, is appended as given. What the programs
differ in is a keyword: the models (`Model`: a preset or a checkpoint), the reward (a reward `Model` or a host
`Verifier`), whether the trainers receive the rollouts over explicit edges, staleness, response-length quantiles,
the `rpeg.algorithm` line and header comments.

    from rpegc.programs import Cluster, Model, Workload, grpo
    text = grpo(Workload(B=16, R=4, Lp=4, Lr=6, dtype="fp32"), Model("tiny"), cluster=Cluster(1, 1, 4, "cpu"))

The edges follow from the vertices: a data edge from every vertex to every later one that reads what it writes
(weights excepted, and generation's outputs to the trainers only with `direct_edges`), a publication edge from
every trainer to the first other vertex that reads the weights it writes, and every container no vertex writes
is an input. Importing this module needs neither torch nor xDSL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

from rpegc.core.ir.program import Vertex
from rpegc.syntax.printer import ctr, sym

# Response-length phases of App. B: half the responses end by Lr/4 tokens, 85% by Lr/2, all by Lr.
PAPER_QUANTILES = ((0.5, "Lr/4"), (0.85, "Lr/2"), (1.0, "Lr"))


@dataclass(frozen=True)
class Workload:
    """One RL step's work (`rpeg.workload`)."""

    B: int = field(metadata={"help": "prompts a step trains on"})
    R: int = field(metadata={"help": "responses per prompt"})
    Lp: int = field(metadata={"help": "prompt tokens"})
    Lr: int = field(metadata={"help": "response tokens"})
    dtype: str = field(default="bf16", metadata={"help": "element type: bf16, fp16 or fp32"})
    oversample: int = field(default=1, metadata={"help": "prompts drawn per step in units of B (dynamic sampling)"})

    def text(self) -> str:
        drawn = f", oversample = {self.oversample}" if self.oversample != 1 else ""
        return (f"rpeg.workload {{B = {self.B}, R = {self.R}, Lp = {self.Lp}, Lr = {self.Lr}, "
                f"dtype = {self.dtype}{drawn}}}")


@dataclass(frozen=True)
class Model:
    """A model's network: a preset (`arch = "..."`, with optional shape attributes) or a checkpoint (`hf = "..."`).
    The program gives it its name, kind and trainability."""

    arch: Optional[str] = field(default=None, metadata={"help": "a preset name (docs/language.md lists them)"})
    hf: Optional[str] = field(default=None, metadata={"help": "a Hugging Face checkpoint directory"})
    attrs: tuple[tuple[str, Union[bool, int, str]], ...] = field(
        default=(), metadata={"help": "more attributes after arch, in order, e.g. (('gated', False),)"})

    def __post_init__(self):
        if (self.arch is None) == (self.hf is None):
            raise ValueError("a Model has exactly one of arch and hf")

    def fields(self) -> str:
        """The attributes before `kind`: `arch = "llama2-7b", gated = false`."""
        first = ("arch", self.arch) if self.arch is not None else ("hf", self.hf)
        return ", ".join(f"{k} = {_value(v)}" for k, v in (first, *self.attrs))


@dataclass(frozen=True)
class Verifier:
    """A reward function of response text on host processes (`rpeg.verifier`), in place of a reward model."""

    fn: str = field(metadata={"help": "a built-in name, module:function, file.py:function or an entry point"})
    name: Optional[str] = field(default=None, metadata={"help": "the verifier's symbol; None: fn"})
    per_response: Optional[float] = field(default=None, metadata={"help": "seconds per call; None: calibrated"})

    @property
    def symbol(self) -> str:
        return self.name or self.fn

    def text(self) -> str:
        timed = f", per_response = {self.per_response!r}" if self.per_response is not None else ""
        return f"rpeg.verifier {sym(self.symbol)} {{fn = {_value(self.fn)}{timed}}}"


Reward = Union[Model, Verifier]


@dataclass(frozen=True)
class Cluster:
    """Racks x nodes x GPUs of one hardware profile (`rpeg.cluster`)."""

    racks: int = field(metadata={"help": "racks"})
    nodes: int = field(metadata={"help": "nodes per rack"})
    gpus: int = field(metadata={"help": "devices per node"})
    hardware: str = field(default="gh200", metadata={"help": "a profile name or a TOML path"})
    name: Optional[str] = field(default=None, metadata={"help": "the cluster's symbol; None: c<devices>"})

    @property
    def symbol(self) -> str:
        return self.name or f"c{self.racks * self.nodes * self.gpus}"

    def text(self) -> str:
        return (f"rpeg.cluster {sym(self.symbol)} {{racks = {self.racks}, nodes = {self.nodes}, gpus = {self.gpus}, "
                f"hardware = {_value(self.hardware)}}}")


@dataclass(frozen=True)
class _Declared:
    """A model line: its symbol, what network, its kind and whether it trains."""

    name: str
    model: Model
    kind: str
    trainable: bool = False


@dataclass(frozen=True)
class _Rest:
    """What follows the graph's edges, and the text around the graph."""

    staleness: Mapping[str, int]
    quantiles: Sequence[tuple[float, str]]
    algorithm: Optional[str]
    header: Sequence[str]
    cluster: Optional[Cluster]
    plan: str


def ppo(workload: Workload, actor: Model, *, critic: Optional[Model] = None, reward: Optional[Reward] = None,
        ref: Optional[Model] = None, reference: bool = True, direct_edges: bool = False,
        critic_reads_logp: Optional[bool] = None, reward_vertex: Optional[str] = None,
        staleness: Optional[Mapping[str, int]] = None, quantiles: Sequence[tuple[float, str]] = (),
        algorithm: Optional[str] = None, header: Sequence[str] = (), cluster: Optional[Cluster] = None,
        plan: str = "") -> str:
    """PPO (App. A-D): generation, reference, reward and value inference, actor and critic training.

    `critic`, `ref` and a reward model default to the actor's network; `reference=False` leaves the reference
    model out. `direct_edges` gives the trainers generation's outputs over edges (the runtime moves only what an
    edge carries); the critic's trainer reads the old log-probs when `critic_reads_logp` says so (default: with
    direct edges). `staleness` maps models to tau (default 0 for actor and critic; empty: no line); `quantiles`
    are (fraction, tokens) pairs; `algorithm` the `rpeg.algorithm` line (None: none); `header` comment lines."""
    critic_logp = direct_edges if critic_reads_logp is None else critic_reads_logp
    declared = _actor_models(actor, ref, reference) + (_Declared("critic", critic or actor, "critic", True),)
    scorer, verifier = _reward(reward or actor, reward_vertex)
    ref_out = ("logp_ref",) if reference else ()
    vertices = (_generation(), *_reference(reference), scorer,
                Vertex("critic_inf", "inference", "critic", ("W_critic", "Y"), ("v",)),
                Vertex("train_actor", "training", "actor", ("W_actor", "Y", "logp", *ref_out, "r", "v"), ("W_actor",)),
                Vertex("train_critic", "training", "critic",
                       ("W_critic", "Y", *(("logp",) if critic_logp else ()), *ref_out, "r", "v"), ("W_critic",)))
    containers = _rollouts(ref_out) + (("v", "values[B*R, Lr]"),) + _weights(("actor", "critic"), declared, verifier)
    rest = _Rest(_tau(staleness, ("actor", "critic")), quantiles, algorithm, header, cluster, plan)
    return _program(workload, declared + _reward_model(reward or actor), verifier, "ppo", containers, vertices,
                    direct_edges, rest)


def grpo(workload: Workload, actor: Model, *, reward: Optional[Reward] = None, ref: Optional[Model] = None,
         reference: bool = True, direct_edges: bool = False, reward_vertex: Optional[str] = None,
         staleness: Optional[Mapping[str, int]] = None, quantiles: Sequence[tuple[float, str]] = (),
         algorithm: Optional[str] = "grpo", header: Sequence[str] = (), cluster: Optional[Cluster] = None,
         plan: str = "") -> str:
    """GRPO (App. A-E): PPO without the critic, advantages from each prompt's group of R rewards. The keywords are
    `ppo`'s; `algorithm` names one of GRPO's family (grpo, dapo, ...)."""
    declared = _actor_models(actor, ref, reference)
    scorer, verifier = _reward(reward or actor, reward_vertex)
    ref_out = ("logp_ref",) if reference else ()
    vertices = (_generation(), *_reference(reference), scorer,
                Vertex("train_actor", "training", "actor", ("W_actor", "Y", "logp", *ref_out, "r"), ("W_actor",)))
    containers = _rollouts(ref_out) + _weights(("actor",), declared, verifier)
    rest = _Rest(_tau(staleness, ("actor",)), quantiles, algorithm, header, cluster, plan)
    return _program(workload, declared + _reward_model(reward or actor), verifier, "grpo", containers, vertices,
                    direct_edges, rest)


def dpo(workload: Workload, policy: Model, *, ref: Optional[Model] = None, algorithm: Optional[str] = "dpo",
        header: Sequence[str] = (), cluster: Optional[Cluster] = None, plan: str = "") -> str:
    """DPO (App. A-E): reference log-probs of the chosen and of the rejected responses, then the policy update;
    offline, so no generation, no reward and no publication. `ref` defaults to the policy's network."""
    declared = (_Declared("policy", policy, "policy", True), _Declared("ref", ref or policy, "reference"))
    containers = (("chosen", "tokens[B, Lp + Lr]"), ("rejected", "tokens[B, Lp + Lr]"),
                  ("logp_ref_c", "logprobs[B, Lr]"), ("logp_ref_r", "logprobs[B, Lr]"),
                  ("W_policy", "weights @policy"), ("W_ref", "weights @ref"))
    vertices = (Vertex("ref_chosen", "inference", "ref", ("W_ref", "chosen"), ("logp_ref_c",)),
                Vertex("ref_rejected", "inference", "ref", ("W_ref", "rejected"), ("logp_ref_r",)),
                Vertex("train_policy", "training", "policy",
                       ("W_policy", "chosen", "rejected", "logp_ref_c", "logp_ref_r"), ("W_policy",)))
    rest = _Rest({}, (), algorithm, header, cluster, plan)
    return _program(workload, declared, None, "dpo", containers, vertices, False, rest)


def _actor_models(actor: Model, ref: Optional[Model], reference: bool) -> tuple[_Declared, ...]:
    policy = _Declared("actor", actor, "policy", True)
    return (policy, _Declared("ref", ref or actor, "reference")) if reference else (policy,)


def _generation() -> Vertex:
    return Vertex("gen", "generation", "actor", ("W_actor", "X"), ("Y", "logp"))


def _reference(reference: bool) -> tuple[Vertex, ...]:
    return (Vertex("ref_inf", "inference", "ref", ("W_ref", "Y"), ("logp_ref",)),) if reference else ()


def _reward(reward: Reward, vertex: Optional[str]) -> tuple[Vertex, Optional[Verifier]]:
    """The vertex that scores the responses, and the verifier it calls (None: the reward model does)."""
    if isinstance(reward, Verifier):
        return Vertex(vertex or "verify", "verify", reward.symbol, ("Y",), ("r",)), reward
    return Vertex(vertex or "reward_inf", "inference", "reward", ("W_reward", "Y"), ("r",)), None


def _reward_model(reward: Reward) -> tuple[_Declared, ...]:
    return () if isinstance(reward, Verifier) else (_Declared("reward", reward, "reward"),)


def _rollouts(ref_out: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Prompts, responses, their log-probs (the reference's too, when there is one) and rewards."""
    return (("X", "tokens[B, Lp]"), ("Y", "tokens[B*R, Lp + Lr]"), ("logp", "logprobs[B*R, Lr]"),
            *((name, "logprobs[B*R, Lr]") for name in ref_out), ("r", "rewards[B*R]"))


def _weights(trained: Sequence[str], declared: Sequence[_Declared], verifier: Optional[Verifier]):
    """The weight containers: the trained models' first, then the frozen ones' (a reward model's unless a verifier
    scores)."""
    frozen = [d.name for d in declared if d.name not in trained] + ([] if verifier else ["reward"])
    return tuple((f"W_{name}", f"weights {sym(name)}") for name in (*trained, *frozen))


def _tau(staleness: Optional[Mapping[str, int]], trained: Sequence[str]) -> Mapping[str, int]:
    return {name: 0 for name in trained} if staleness is None else staleness


def _program(workload: Workload, declared: Sequence[_Declared], verifier: Optional[Verifier], name: str,
             containers: Sequence[tuple[str, str]], vertices: Sequence[Vertex], direct_edges: bool,
             rest: _Rest) -> str:
    lines = [f"// {line}" if line else "//" for line in rest.header]
    lines += [workload.text(), ""] + _model_lines(declared, verifier) + [""]
    lines += _graph_lines(name, containers, vertices, direct_edges, rest)
    if rest.cluster is not None:
        lines += ["", rest.cluster.text()]
    text = "\n".join(lines) + "\n"
    return text + "\n" + rest.plan if rest.plan else text


def _model_lines(declared: Sequence[_Declared], verifier: Optional[Verifier]) -> list[str]:
    width = max(len(sym(d.name)) for d in declared)
    verb = "rpeg.model   " if verifier else "rpeg.model"  # aligns the symbols with `rpeg.verifier`'s
    out = [f"{verb} {sym(d.name).ljust(width)} {{{d.model.fields()}, kind = {d.kind}{', trainable' * d.trainable}}}"
           for d in declared]
    return out + [verifier.text()] if verifier else out


def _graph_lines(name: str, containers: Sequence[tuple[str, str]], vertices: Sequence[Vertex],
                 direct_edges: bool, rest: _Rest) -> list[str]:
    width = max(len(c) for c, _ in containers) + 1
    written = {w for v in vertices for w in v.writes}
    lines = [f"rpeg.graph {sym(name)} {{"]
    lines += [f"  {ctr(c).ljust(width)} = {_container(kind)}" for c, kind in containers]
    lines += ["  rpeg.input " + ", ".join(ctr(c) for c, _ in containers if c not in written), ""]
    lines += _vertex_lines(vertices) + [""]
    lines += [f"  rpeg.data {sym(s)} -> {sym(d)} ({ctr(c)})" for s, d, c in _data_edges(vertices, direct_edges)]
    lines += [f"  rpeg.publish {sym(s)} -> {sym(d)} ({ctr(c)})" for s, d, c in _publications(vertices)]
    if rest.staleness:
        lines.append("  rpeg.staleness {" + ", ".join(f"{sym(m)} = {t}" for m, t in rest.staleness.items()) + "}")
    if rest.quantiles:
        lines.append("  rpeg.quantiles [" + ", ".join(f"({f!r}, {tokens})" for f, tokens in rest.quantiles) + "]")
    if rest.algorithm is not None:
        lines.append(f"  rpeg.algorithm {rest.algorithm}")
    return lines + ["}"]


def _container(kind: str) -> str:
    """`rpeg.weights @m` for weights (`weights @m`), else `rpeg.container` of the element kind and sizes."""
    return f"rpeg.{kind}" if kind.startswith("weights ") else f"rpeg.container {kind}"


def _vertex_lines(vertices: Sequence[Vertex]) -> list[str]:
    name_w, role_w = max(len(v.name) for v in vertices) + 1, max(len(v.role) for v in vertices)
    model_w = max(len(v.model) for v in vertices) + 1
    return [f"  rpeg.vertex {sym(v.name).ljust(name_w)} {v.role.ljust(role_w)} {sym(v.model).ljust(model_w)} "
            f"reads({', '.join(map(ctr, v.reads))}) writes({', '.join(map(ctr, v.writes))})" for v in vertices]


def _data_edges(vertices: Sequence[Vertex], direct_edges: bool) -> list[tuple[str, str, str]]:
    """(source, destination, container) for each data container a later vertex reads from its writer; generation's
    outputs reach the trainers over an edge only when `direct_edges` (otherwise from device memory)."""
    def carried(src: Vertex, dst: Vertex) -> bool:
        return direct_edges or not (src.role == "generation" and dst.role == "training")

    return [(src.name, dst.name, c) for i, src in enumerate(vertices) for dst in vertices[i + 1:]
            if carried(src, dst) for c in src.writes if c in dst.reads and not c.startswith("W_")]


def _publications(vertices: Sequence[Vertex]) -> list[tuple[str, str, str]]:
    """A trainer's new weights go to the first other vertex that reads them (none when only the trainer does)."""
    out = []
    for trainer in (v for v in vertices if v.role == "training"):
        for w in trainer.writes:
            user = next((v for v in vertices if v is not trainer and w in v.reads), None)
            if user is not None:
                out.append((trainer.name, user.name, w))
    return out


def _value(v: Union[bool, int, float, str]) -> str:
    """An attribute value as the language writes it: true/false, a number, a quoted string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # the printer's quoting: the grammar's escapes are JSON's
    return repr(v)
