"""Well-formedness of the cyclic graph G° (Def. A.2) and its topological order.

Paper: App. A-A (Def. A.1, Tables VII-IX) and A-B (Def. A.2). Def. A.2 asks for
  (1) interface consistency: an edge u -> v carrying a has a in O(u) and a in I(v);
  (2) publication edges leave training vertices and carry the trained model's weights;
  (3) boundary consistency: read-but-never-produced containers are inputs, written-but-never-read
      containers are outputs;
  (4) acyclic data edges (cycles only through publication edges).
On top of that this module checks what the later stages silently rely on: names resolve, model kinds
fit vertex roles (generation needs an LM head, training a trainable model), only a model's training
vertex writes its weights, each trainable model has exactly one training vertex (the cost and memory
model assume one t_m), staleness budgets name trainable models, and quantiles satisfy Def. A.9.

Every violation is its own `RpegError` at the offending declaration; `check_graph` returns them all.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Optional

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.expr import evaluate
from rpegc.core.ir.algorithms import algorithm_family
from rpegc.core.ir.program import (ELEMENT_KINDS, ROLES, VERIFY, Container, Edge, Graph, Model, Program,
                                   Vertex, container_shape)

GENERATIVE_KINDS = ("policy", "actor_critic")  # kinds with an LM head (spec 2.3)
_EPS = 1e-9


def check_program(p: Program) -> list[RpegError]:
    """Def. A.2 (the graph) and, with a plan, Def. A.5 and P1-P8: what verify-wellformed checks and rpeg-run checks
    of every plan it is given (one set of checks for both tools)."""
    from rpegc.core.check.plan_rules import check_plan

    return check_graph(p) + (check_plan(p) if p.plan is not None else [])


def check_graph(p: Program) -> list[RpegError]:
    """All Def. A.2 violations of `p.graph` (and the extra checks above), sorted by source position."""
    g = p.graph
    if g is None:
        return []
    ctx = _Context(p, g)
    errors: list[RpegError] = []
    for check in (
        _check_declarations,
        _check_vertices,
        _check_model_usage,
        _check_edges,
        _check_missing_publications,
        _check_boundary,
        _check_acyclic,
        _check_staleness,
        _check_quantiles,
        _check_sizes,
        _check_algorithm,
        _check_oversample,
        _check_training,
    ):
        errors += check(ctx)
    # A stable sort keeps checks in the order above for declarations without a source position.
    return sorted(errors, key=lambda e: (e.loc.line, e.loc.col))


def topological_order(graph: Graph) -> list[str]:
    """Vertex names ordered by data edges; among ready vertices the earlier-declared goes first.

    Raises RpegError on an edge to an undeclared vertex or on a cycle (run `check_graph` first)."""
    index = {v.name: i for i, v in enumerate(graph.vertices)}
    succ: list[list[int]] = [[] for _ in graph.vertices]
    indeg = [0] * len(graph.vertices)
    for e in graph.data_edges:
        for end in (e.src, e.dst):
            if end not in index:
                raise RpegError(e.loc, f"data edge names unknown vertex '@{end}'; declare it with rpeg.vertex")
        succ[index[e.src]].append(index[e.dst])
        indeg[index[e.dst]] += 1
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(graph.vertices):
        cycles = find_cycles(graph)
        raise cycles[0] if cycles else RpegError(graph.loc, "data edges form a cycle; data edges must be acyclic")
    return [graph.vertices[i].name for i in order]


def find_cycles(graph: Graph) -> list[RpegError]:
    """One error per cyclic strongly connected component of the data edges, at the cycle's first edge."""
    index = {v.name: i for i, v in enumerate(graph.vertices)}
    edges = [(k, e) for k, e in enumerate(graph.data_edges) if e.src in index and e.dst in index]
    succ: dict[str, list[tuple[int, Edge]]] = {v.name: [] for v in graph.vertices}
    for k, e in edges:
        succ[e.src].append((k, e))
    component = _strong_components([v.name for v in graph.vertices], succ)
    seen_components: set[int] = set()
    errors = []
    for k, e in edges:  # declaration order: the first edge met in a component starts its cycle
        c = component[e.src]
        if c != component[e.dst] or c in seen_components:
            continue
        seen_components.add(c)
        path = [e.src] + _path_within(e.dst, e.src, succ, component, c)
        cycle = " -> ".join(f"@{v}" for v in path)
        errors.append(
            RpegError(
                e.loc,
                f"data edges form a cycle {cycle}; data edges are within-step dependencies and must be "
                "acyclic (Def. A.2 (4)) — remove one of these edges, or carry a weight update to a "
                "later step with a publication edge (rpeg.publish)",
            )
        )
    return errors


# --- context -----------------------------------------------------------------------------------


class _Context:
    """Name tables of one graph; the first declaration of a duplicated name wins."""

    def __init__(self, p: Program, g: Graph):
        self.p = p
        self.g = g
        self.models: dict[str, Model] = {}
        for m in p.models:
            self.models.setdefault(m.name, m)
        self.containers: dict[str, Container] = {}
        for c in g.containers:
            self.containers.setdefault(c.name, c)
        self.vertices: dict[str, Vertex] = {}
        for v in g.vertices:
            self.vertices.setdefault(v.name, v)
        self.weights_of: dict[str, Container] = {}  # model -> its (first) weights container
        for c in self.containers.values():
            if c.is_weights and c.model is not None:
                self.weights_of.setdefault(c.model, c)
        self._sets: dict[tuple[str, str], frozenset[str]] = {}
        self.invoked: set[str] = {v.model for v in g.vertices}  # models some vertex invokes
        self.writers: dict[str, list[Vertex]] = {}
        self.readers: dict[str, list[Vertex]] = {}
        for v in self.vertices.values():
            for a in v.writes:
                self.writers.setdefault(a, []).append(v)
            for a in v.reads:
                self.readers.setdefault(a, []).append(v)

    def writes_of(self, vertex: str) -> frozenset[str]:
        """O(v) as a set, built once: an edge check is then O(1) however many containers v touches."""
        return self._set("w", vertex, self.vertices[vertex].writes)

    def reads_of(self, vertex: str) -> frozenset[str]:
        return self._set("r", vertex, self.vertices[vertex].reads)

    def _set(self, kind: str, vertex: str, names: tuple[str, ...]) -> frozenset[str]:
        key = (kind, vertex)
        if key not in self._sets:
            self._sets[key] = frozenset(names)
        return self._sets[key]

    def is_weights_of(self, container: str, model: str) -> bool:
        c = self.containers.get(container)
        return c is not None and c.is_weights and c.model == model

    def trainable(self, model: str) -> bool:
        m = self.models.get(model)
        return m is not None and m.trainable


# --- names and declarations --------------------------------------------------------------------


def _check_declarations(ctx: _Context) -> list[RpegError]:
    errors = []
    errors += _duplicates([(m.name, m.loc) for m in ctx.p.models], "model", "@")
    errors += _duplicates([(c.name, c.loc) for c in ctx.g.containers], "container", "%")
    errors += _duplicates([(v.name, v.loc) for v in ctx.g.vertices], "vertex", "@")
    for c in ctx.g.containers:
        if c.is_weights:
            if c.model is None or c.model not in ctx.models:
                errors.append(RpegError(c.loc, f"weights container %{c.name} names unknown model "
                                               f"'@{c.model}'; declare the model with rpeg.model"))
            elif ctx.weights_of[c.model].name != c.name:
                first = ctx.weights_of[c.model].name
                errors.append(RpegError(c.loc, f"model @{c.model} already has the weights container %{first}; "
                                               f"declare one weights container per model and use %{first}"))
        elif c.elem not in ELEMENT_KINDS:
            errors.append(RpegError(c.loc, f"container %{c.name} has unknown element kind '{c.elem}'; use one of "
                                           f"{', '.join(ELEMENT_KINDS)} or 'weights'"))
    for kind, names in (("input", ctx.g.inputs), ("output", ctx.g.outputs)):
        errors += _repeated(names, f"rpeg.{kind}", ctx.g.loc)
        for a in names:
            if a not in ctx.containers:
                errors.append(RpegError(ctx.g.loc, f"rpeg.{kind} names unknown container '%{a}'; declare it with "
                                                   "rpeg.container or rpeg.weights"))
    return errors


def _duplicates(items: list[tuple[str, Loc]], what: str, sigil: str) -> list[RpegError]:
    seen: set[str] = set()
    errors = []
    for name, loc in items:
        if name in seen:
            errors.append(RpegError(loc, f"{what} {sigil}{name} is declared twice; rename or remove the second one"))
        seen.add(name)
    return errors


def _repeated(names: tuple[str, ...], where: str, loc: Loc) -> list[RpegError]:
    seen: set[str] = set()
    errors = []
    for a in names:
        if a in seen:
            errors.append(RpegError(loc, f"%{a} appears twice in {where}; list it once"))
        seen.add(a)
    return errors


def _check_vertices(ctx: _Context) -> list[RpegError]:
    errors = []
    for v in ctx.g.vertices:
        if v.role not in ROLES:
            errors.append(RpegError(v.loc, f"vertex @{v.name} has unknown role '{v.role}'; use one of "
                                           f"{', '.join(ROLES)}"))
        if v.role == VERIFY:
            errors += _check_verify_vertex(ctx, v)
        elif v.model not in ctx.models:
            errors.append(RpegError(v.loc, f"vertex @{v.name} invokes unknown model '@{v.model}'; declare it "
                                           "with rpeg.model"))
        for kind, names in (("reads", v.reads), ("writes", v.writes)):
            errors += _repeated(names, f"the {kind} of @{v.name}", v.loc)
            for a in names:
                if a not in ctx.containers:
                    errors.append(RpegError(v.loc, f"vertex @{v.name} {kind} unknown container '%{a}'; declare it "
                                                   "with rpeg.container or rpeg.weights"))
    return errors


def _check_verify_vertex(ctx: _Context, v: Vertex) -> list[RpegError]:
    """A verify vertex runs a declared verifier over response tokens and writes rewards, nothing else: it has no
    model, so it reads no weights."""
    if v.model not in {f.name for f in ctx.p.verifiers}:
        return [RpegError(v.loc, f"verify vertex @{v.name} runs unknown verifier '@{v.model}'; declare it with "
                                 f'rpeg.verifier @{v.model} {{fn = "math"}}')]
    errors = []
    weights = [a for a in v.reads + v.writes if a in ctx.containers and ctx.containers[a].is_weights]
    if weights:
        errors.append(RpegError(v.loc, f"verify vertex @{v.name} reads or writes the weights %{weights[0]}; a "
                                       "verifier runs no model: remove them"))
    if not any(a in ctx.containers and ctx.containers[a].elem == "tokens" for a in v.reads):
        errors.append(RpegError(v.loc, f"verify vertex @{v.name} reads no tokens container; it scores responses: "
                                       "read the generated sequences (e.g. %Y)"))
    if [ctx.containers[a].elem for a in v.writes if a in ctx.containers] != ["rewards"]:
        errors.append(RpegError(v.loc, f"verify vertex @{v.name} must write exactly one rewards container (one "
                                       "score per response)"))
    return errors


# --- models and roles --------------------------------------------------------------------------


def _check_model_usage(ctx: _Context) -> list[RpegError]:
    errors = []
    training: dict[str, list[Vertex]] = {}
    for v in ctx.g.vertices:
        m = ctx.models.get(v.model)
        if m is None:
            continue
        if v.role == "generation" and m.kind not in GENERATIVE_KINDS:
            errors.append(RpegError(v.loc, f"generation vertex @{v.name} invokes @{m.name} of kind {m.kind}, "
                                           "which has no language-model head; generate with a model of kind "
                                           "policy or actor_critic"))
        if v.role == "training":
            if not m.trainable:
                errors.append(RpegError(v.loc, f"training vertex @{v.name} invokes @{m.name}, which is frozen; "
                                               f"declare @{m.name} trainable or make @{v.name} an inference vertex"))
            else:
                training.setdefault(m.name, []).append(v)
        errors += _check_own_weights(ctx, v, m)
        errors += _check_weight_writes(ctx, v)
    for m in ctx.models.values():
        if not m.trainable or not _is_used(ctx, m.name):
            continue
        trainers = training.get(m.name, [])
        if not trainers:
            errors.append(RpegError(m.loc, f"trainable model @{m.name} has no training vertex; add a training "
                                           f"vertex for @{m.name} or declare it frozen (drop 'trainable')"))
        for extra in trainers[1:]:
            errors.append(RpegError(extra.loc, f"trainable model @{m.name} already has the training vertex "
                                               f"@{trainers[0].name}; the cost and memory model assume exactly one "
                                               f"training vertex t_m per trainable model (one optimizer state, one "
                                               f"weight version per step) — merge @{extra.name} into "
                                               f"@{trainers[0].name}"))
    return errors


def _is_used(ctx: _Context, model: str) -> bool:
    """A model the graph mentions (a vertex invokes it or a container holds its weights)."""
    return model in ctx.invoked or model in ctx.weights_of


def _check_own_weights(ctx: _Context, v: Vertex, m: Model) -> list[RpegError]:
    """A vertex needs its model's parameters; a training vertex also produces the new version."""
    w = ctx.weights_of.get(m.name)
    if w is None:
        return [RpegError(v.loc, f"vertex @{v.name} invokes @{m.name}, but no container holds its weights; "
                                 f"declare one with rpeg.weights @{m.name} and add it to the reads of @{v.name}")]
    errors = []
    if not any(ctx.is_weights_of(a, m.name) for a in v.reads):
        errors.append(RpegError(v.loc, f"vertex @{v.name} invokes @{m.name} but does not read its weights; add "
                                       f"%{w.name} to the reads of @{v.name}"))
    if v.role == "training" and m.trainable and not any(ctx.is_weights_of(a, m.name) for a in v.writes):
        errors.append(RpegError(v.loc, f"training vertex @{v.name} updates @{m.name} but does not write its "
                                       f"weights; add %{w.name} to the writes of @{v.name}"))
    return errors


def _check_weight_writes(ctx: _Context, v: Vertex) -> list[RpegError]:
    """Only the training vertex of a trainable model writes that model's weights."""
    errors = []
    for a in v.writes:
        c = ctx.containers.get(a)
        if c is None or not c.is_weights or c.model not in ctx.models:
            continue
        owner = ctx.models[c.model]
        if not owner.trainable:
            errors.append(RpegError(v.loc, f"vertex @{v.name} writes %{a}, the weights of frozen model "
                                           f"@{owner.name}; frozen weights are never written — remove %{a} from "
                                           f"the writes of @{v.name}"))
        elif v.role != "training" or v.model != owner.name:
            errors.append(RpegError(v.loc, f"vertex @{v.name} writes %{a}, the weights of @{owner.name}, but only "
                                           f"the training vertex of @{owner.name} may update them; remove %{a} "
                                           f"from the writes of @{v.name}"))
    return errors


# --- edges: Def. A.2 (1) and (2) ---------------------------------------------------------------


def _check_edges(ctx: _Context) -> list[RpegError]:
    errors = []
    seen: set[tuple[str, str, str, str]] = set()
    for kind, edges in (("data", ctx.g.data_edges), ("publication", ctx.g.pub_edges)):
        for e in edges:
            key = (kind, e.src, e.dst, e.container)
            if key in seen:
                errors.append(RpegError(e.loc, f"{kind} edge @{e.src} -> @{e.dst} (%{e.container}) is declared "
                                               "twice; remove the second one"))
                continue
            seen.add(key)
            resolved = _resolve_edge(ctx, kind, e)
            if resolved:
                errors += resolved
                continue
            errors += _interface(ctx, kind, e)
            errors += _publication(ctx, e) if kind == "publication" else _data_payload(ctx, e)
    return errors


def _resolve_edge(ctx: _Context, kind: str, e: Edge) -> list[RpegError]:
    errors = []
    for end in (e.src, e.dst):
        if end not in ctx.vertices:
            errors.append(RpegError(e.loc, f"{kind} edge names unknown vertex '@{end}'; declare it with rpeg.vertex"))
    if e.container not in ctx.containers:
        errors.append(RpegError(e.loc, f"{kind} edge carries unknown container '%{e.container}'; declare it with "
                                       "rpeg.container or rpeg.weights"))
    return errors


def _interface(ctx: _Context, kind: str, e: Edge) -> list[RpegError]:
    """Def. A.2 (1): a in O(u) and a in I(v)."""
    errors = []
    if e.container not in ctx.writes_of(e.src):
        errors.append(RpegError(e.loc, f"{kind} edge @{e.src} -> @{e.dst} carries %{e.container}, but @{e.src} "
                                       f"does not write it (Def. A.2 (1)); add %{e.container} to the writes of "
                                       f"@{e.src} or carry a container that @{e.src} writes"))
    if e.container not in ctx.reads_of(e.dst):
        errors.append(RpegError(e.loc, f"{kind} edge @{e.src} -> @{e.dst} carries %{e.container}, but @{e.dst} "
                                       f"does not read it (Def. A.2 (1)); add %{e.container} to the reads of "
                                       f"@{e.dst} or remove the edge"))
    return errors


def _publication(ctx: _Context, e: Edge) -> list[RpegError]:
    """Def. A.2 (2): from a training vertex, carrying the weights of the model it trains."""
    src = ctx.vertices[e.src]
    if src.role != "training":
        return [RpegError(e.loc, f"publication edge leaves @{e.src}, a {src.role} vertex; publication edges carry "
                                 "updated weights and must leave a training vertex (Def. A.2 (2)) — use a data "
                                 "edge (rpeg.data) for within-step data")]
    if not ctx.is_weights_of(e.container, src.model):
        w = ctx.weights_of.get(src.model)
        fix = f"carry %{w.name}" if w is not None else f"carry the weights container of @{src.model}"
        return [RpegError(e.loc, f"publication edge @{e.src} -> @{e.dst} carries %{e.container}, which is not the "
                                 f"weights of @{src.model} trained by @{e.src} (Def. A.2 (2)); {fix}")]
    if e.src == e.dst:
        return [RpegError(e.loc, f"publication edge @{e.src} -> @{e.src} loops on one vertex; successive updates "
                                 "of a model are ordered automatically when the graph is unrolled — remove it")]
    return []


def _data_payload(ctx: _Context, e: Edge) -> list[RpegError]:
    if ctx.containers[e.container].is_weights:
        return [RpegError(e.loc, f"data edge @{e.src} -> @{e.dst} carries the weights %{e.container}; weights move "
                                 "across steps under the staleness budget, so carry them with a publication edge "
                                 "(rpeg.publish)")]
    return []


def _check_missing_publications(ctx: _Context) -> list[RpegError]:
    """A reader of trainable weights needs a publication edge, else unrolling never orders it after t_m."""
    published = {(e.dst, e.container) for e in ctx.g.pub_edges}
    errors = []
    for v in ctx.g.vertices:
        for a in v.reads:
            c = ctx.containers.get(a)
            if c is None or not c.is_weights or not ctx.trainable(c.model or ""):
                continue
            trainers = [w for w in ctx.writers.get(a, []) if w.role == "training" and w.model == c.model]
            if not trainers or v.name in {t.name for t in trainers} or (v.name, a) in published:
                continue
            t = trainers[0].name
            errors.append(RpegError(v.loc, f"vertex @{v.name} reads %{a}, the weights of trainable @{c.model}, but "
                                           f"no publication edge delivers them; add 'rpeg.publish @{t} -> @{v.name} "
                                           f"(%{a})' so the staleness budget decides which version it reads"))
    return errors


# --- boundary: Def. A.2 (3) --------------------------------------------------------------------


def _check_boundary(ctx: _Context) -> list[RpegError]:
    errors = []
    inputs, outputs = set(ctx.g.inputs), set(ctx.g.outputs)
    for c in ctx.g.containers:
        if ctx.containers[c.name] is not c:
            continue  # a duplicate declaration, reported already
        read, written = c.name in ctx.readers, c.name in ctx.writers
        if read and not written and c.name not in inputs:
            first = ctx.readers[c.name][0].name
            errors.append(RpegError(c.loc, f"%{c.name} is read by @{first} but no vertex writes it (Def. A.2 (3)); "
                                           f"list it in rpeg.input or add it to the writes of its producer"))
        if written and not read and c.name not in outputs:
            first = ctx.writers[c.name][0].name
            errors.append(RpegError(c.loc, f"%{c.name} is written by @{first} but no vertex reads it (Def. A.2 (3)); "
                                           f"list it in rpeg.output or add it to the reads of its consumer"))
        if c.name in inputs and written:
            first = ctx.writers[c.name][0].name
            errors.append(RpegError(c.loc, f"%{c.name} is a graph input but @{first} also writes it, so its readers "
                                           "would have two sources; remove it from rpeg.input (weights of a "
                                           "trainable model come from its training vertex) or stop writing it"))
        if c.name in inputs and not read:
            errors.append(RpegError(c.loc, f"%{c.name} is listed in rpeg.input but no vertex reads it; remove it "
                                           "from rpeg.input or add it to the reads of the vertex that needs it"))
        if c.name in outputs and not written:
            errors.append(RpegError(c.loc, f"%{c.name} is listed in rpeg.output but no vertex writes it; remove it "
                                           "from rpeg.output or add it to the writes of its producer"))
    return errors


# --- acyclicity: Def. A.2 (4) ------------------------------------------------------------------


def _check_acyclic(ctx: _Context) -> list[RpegError]:
    return find_cycles(ctx.g)


def _strong_components(names: list[str], succ: dict[str, list[tuple[int, Edge]]]) -> dict[str, int]:
    """Tarjan's algorithm, iterative (graphs are small but recursion limits are not worth the risk)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    counter = 0
    for root in names:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i][1].dst
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component[w] = index[v]
                    if w == v:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return component


def _path_within(start: str, goal: str, succ, component: dict[str, int], c: int) -> list[str]:
    """Shortest path start -> goal inside component c (BFS, successors in declaration order)."""
    previous: dict[str, Optional[str]] = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            break
        for _, e in succ[v]:
            if component.get(e.dst) == c and e.dst not in previous:
                previous[e.dst] = v
                queue.append(e.dst)
    path = [goal]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])  # type: ignore[arg-type]
    return path[::-1]


# --- staleness and quantiles -------------------------------------------------------------------


def _check_staleness(ctx: _Context) -> list[RpegError]:
    errors = []
    loc = ctx.g.staleness_loc
    seen: set[str] = set()
    for model, tau in ctx.g.staleness:
        if model in seen:
            errors.append(RpegError(loc, f"staleness budget of @{model} is given twice; keep one"))
        seen.add(model)
        if model not in ctx.models:
            errors.append(RpegError(loc, f"staleness budget names unknown model '@{model}'; declare it with "
                                         "rpeg.model or remove the entry"))
        elif not ctx.models[model].trainable:
            errors.append(RpegError(loc, f"staleness budget given for frozen model @{model}; staleness applies "
                                         "only to trainable models (their weights change) — remove the entry"))
        if not isinstance(tau, int) or tau < 0:
            errors.append(RpegError(loc, f"staleness budget of @{model} is {tau}; it must be an integer >= 0 "
                                         "(0 = synchronous)"))
    return errors


def fitting_algorithms(p: Program, g: Graph) -> tuple[str, ...]:
    """The algorithms whose shape the graph has: PPO samples and has a critic (or a shared actor-critic), GRPO
    samples without one, DPO samples nothing (it trains on given pairs)."""
    kinds = {m.name: m.kind for m in p.models}
    generates = any(v.role == "generation" for v in g.vertices)
    critic = any(kinds.get(v.model) in ("critic", "actor_critic") for v in g.vertices)
    return tuple(a for a, fits in (("ppo", generates and critic), ("grpo", generates and not critic),
                                   ("dpo", not generates)) if fits)


def _check_algorithm(ctx: _Context) -> list[RpegError]:
    named = ctx.g.algorithm
    name = algorithm_family(named) if named is not None else None  # a variant has its family's shape
    if name is None or name in fitting_algorithms(ctx.p, ctx.g):
        return []
    why = {"ppo": "PPO samples rollouts and trains a critic: it needs a generation vertex and a critic or "
                  "actor_critic model's vertex",
           "grpo": "GRPO samples rollouts and has no critic: it needs a generation vertex and no critic vertex",
           "dpo": "DPO trains on given preference pairs: it has no generation vertex"}[name]
    return [RpegError(ctx.g.algorithm_loc, f"graph @{ctx.g.name} names algorithm {named}, but {why}")]


def _check_oversample(ctx: _Context) -> list[RpegError]:
    """Dynamic sampling (`oversample`, program.Workload) keeps groups of a GRPO-shaped graph whose rewards differ."""
    w = ctx.p.workload
    if w.oversample == 1:
        return []
    named = ctx.g.algorithm
    family = algorithm_family(named) if named is not None else None
    shaped = (family or "grpo") == "grpo" and "grpo" in fitting_algorithms(ctx.p, ctx.g)
    if shaped and w.R >= 2:
        return []
    why = f"has R = {w.R}" if shaped else f"is not GRPO-shaped ({named or 'no algorithm named'})"
    return [RpegError(w.loc, f"oversample = {w.oversample} (dynamic sampling) keeps, of every {w.oversample} groups of "
                             f"R responses drawn, one whose rewards differ: it needs a graph of GRPO's family (a "
                             f"generation vertex, no critic) and R >= 2, but graph @{ctx.g.name} {why}; remove "
                             "oversample")]


def _check_training(ctx: _Context) -> list[RpegError]:
    """The workload's training fields resolve (mixed precision needs a 16-bit dtype; training.resolve)."""
    try:
        ctx.p.workload.training()
    except RpegError as err:
        return [err]
    return []


def _check_quantiles(ctx: _Context) -> list[RpegError]:
    """Def. A.9: 0 < f_1 < ... < f_Q = 1 and 0 < t_1 < ... < t_Q = Lr."""
    qs = ctx.g.quantiles
    if not qs:
        return []
    errors = []
    lr = ctx.p.workload.Lr
    prev_f, prev_t = 0.0, 0
    for q in qs:
        if not (prev_f < q.f <= 1.0 + _EPS):
            errors.append(RpegError(q.loc, f"quantile fraction {q.f} must lie in (0, 1] and exceed the previous "
                                           f"fraction {prev_f}; write cumulative fractions in strictly increasing "
                                           "order"))
        prev_f = max(prev_f, q.f)
        t = _tokens(q.tokens, ctx)
        if isinstance(t, RpegError):
            errors.append(RpegError(q.loc, t.message))
            continue
        if not (t > prev_t):
            errors.append(RpegError(q.loc, f"quantile length {q.tokens} = {_num(t)} tokens must be positive and "
                                           f"exceed the previous length {_num(prev_t)}; write token lengths in "
                                           "strictly increasing order"))
        prev_t = max(prev_t, t)
    last = qs[-1]
    if abs(last.f - 1.0) > _EPS:
        errors.append(RpegError(last.loc, f"the last quantile fraction is {last.f}, but every response has ended "
                                          "by the last quantile; end the list with f = 1"))
    t_last = _tokens(last.tokens, ctx)
    if not isinstance(t_last, RpegError) and t_last != lr:
        errors.append(RpegError(last.loc, f"the last quantile length is {last.tokens} = {_num(t_last)} tokens, but "
                                          f"responses end by Lr = {lr}; end the list with length Lr"))
    return errors


def _check_sizes(ctx: _Context) -> list[RpegError]:
    """Every data container's dimensions evaluate, once, to positive whole numbers (container_shape)."""
    errors = []
    for c in ctx.g.containers:
        if c.is_weights:
            continue
        try:
            container_shape(c, ctx.p.workload)
        except RpegError as err:
            errors.append(err)
    return errors


def _tokens(expr, ctx: _Context):
    try:
        return evaluate(expr, ctx.p.workload.env)
    except (ZeroDivisionError, KeyError) as err:
        return RpegError(ctx.g.quantiles_loc, f"quantile length {expr} cannot be evaluated ({err}); write it over "
                                              "B, R, Lp and Lr without dividing by zero")


def _num(x) -> str:
    return str(int(x)) if x == int(x) else str(float(x))
