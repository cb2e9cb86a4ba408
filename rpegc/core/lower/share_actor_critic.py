"""Actor–critic parameter sharing as a graph transformation (Sec. VI, App. A-J2b, structural choice ac = 1).

The policy model and the critic model are replaced by one `actor_critic` model (the actor's backbone with an
LM head and a scalar value head, spec 2.5/A4). Generation and value inference both invoke it; the two training
vertices merge into one training vertex that reads the union of their inputs and publishes the shared weights
to every former consumer of either model. Applicability (S1): the graph has exactly one trainable policy model
and one trainable critic model.
"""

from __future__ import annotations

from dataclasses import replace

from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import Container, Edge, Graph, Model, Placement, Plan, Program, Vertex

SHARED_SUFFIX = "_ac"


def _single(models: list[Model], kind: str, p: Program) -> Model:
    found = [m for m in models if m.kind == kind and m.trainable]
    if len(found) != 1:
        raise RpegError(p.graph.loc, f"actor-critic sharing needs exactly one trainable '{kind}' model, "
                                     f"found {len(found)} (S1); drop share-actor-critic for this graph")
    return found[0]


def sharing_applicable(p: Program) -> bool:
    """S1: both a trainable policy and a trainable critic exist (each with one training vertex)."""
    if p.graph is None:
        return False
    kinds = [m.kind for m in p.models if m.trainable]
    return kinds.count("policy") == 1 and kinds.count("critic") == 1


def _training_vertex(g: Graph, model: str, p: Program) -> Vertex:
    found = [v for v in g.vertices if v.model == model and v.role == "training"]
    if len(found) != 1:
        raise RpegError(g.loc, f"actor-critic sharing needs one training vertex of @{model}, found {len(found)}")
    return found[0]


def _unique(items):
    seen, out = set(), []
    for it in items:
        if it not in seen:
            seen.add(it)
            out.append(it)
    return tuple(out)


def share_actor_critic(p: Program) -> Program:
    """Rewrite the program so that one actor_critic model replaces the actor and the critic."""
    g = p.graph
    actor = _single(list(p.models), "policy", p)
    critic = _single(list(p.models), "critic", p)
    shared = Model(name=actor.name + SHARED_SUFFIX, kind="actor_critic", trainable=True, arch=actor.arch,
                   preset=actor.preset, loc=actor.loc, hf=actor.hf)
    t_actor, t_critic = _training_vertex(g, actor.name, p), _training_vertex(g, critic.name, p)
    weights = {c.name for c in g.containers if c.is_weights and c.model in (actor.name, critic.name)}
    w_shared = "W_" + shared.name
    merged_name = "train" + SHARED_SUFFIX

    def rename_container(name: str) -> str:
        return w_shared if name in weights else name

    def rename_vertex(name: str) -> str:
        return merged_name if name in (t_actor.name, t_critic.name) else name

    vertices = []
    for v in g.vertices:
        if v.name == t_critic.name:
            continue
        if v.name == t_actor.name:
            v = Vertex(merged_name, "training", shared.name,
                       _unique(rename_container(c) for c in t_actor.reads + t_critic.reads),
                       _unique(rename_container(c) for c in t_actor.writes + t_critic.writes), loc=t_actor.loc)
        elif v.model in (actor.name, critic.name):
            v = replace(v, model=shared.name, reads=_unique(rename_container(c) for c in v.reads),
                        writes=_unique(rename_container(c) for c in v.writes))
        vertices.append(v)

    def rewire(edges: tuple[Edge, ...]) -> tuple[Edge, ...]:
        out, seen = [], set()
        for e in edges:
            e2 = replace(e, src=rename_vertex(e.src), dst=rename_vertex(e.dst), container=rename_container(e.container))
            key = (e2.src, e2.dst, e2.container)
            if e2.src != e2.dst and key not in seen:
                seen.add(key)
                out.append(e2)
        return tuple(out)

    containers = [c for c in g.containers if c.name not in weights]
    containers.append(Container(w_shared, "weights", model=shared.name, loc=t_actor.loc))
    tau = max(g.tau(actor.name), g.tau(critic.name))
    staleness = tuple((m, t) for m, t in g.staleness if m not in (actor.name, critic.name))
    staleness += ((shared.name, tau),)
    new_graph = replace(g, containers=tuple(containers),
                        inputs=_unique(rename_container(c) for c in g.inputs),
                        outputs=_unique(rename_container(c) for c in g.outputs),
                        vertices=tuple(vertices), data_edges=rewire(g.data_edges), pub_edges=rewire(g.pub_edges),
                        staleness=staleness)
    models = tuple(m for m in p.models if m.name not in (actor.name, critic.name)) + (shared,)
    return replace(p, models=models, graph=new_graph, plan=_merge_plan(p.plan, t_actor, t_critic, merged_name))


def _merge_plan(plan: Plan | None, t_actor: Vertex, t_critic: Vertex, merged: str) -> Plan | None:
    """The merged training vertex keeps the actor training placement; the critic's is dropped."""
    if plan is None:
        return None
    placements: list[Placement] = []
    for pl in plan.placements:
        if pl.vertex == t_critic.name:
            continue
        placements.append(replace(pl, vertex=merged) if pl.vertex == t_actor.name else pl)
    return replace(plan, placements=tuple(placements))
