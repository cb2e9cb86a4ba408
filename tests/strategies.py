"""Hypothesis strategies for random `.rpeg` modules (App. A-A..A-D graphs and plans, A-F..A-H exec graphs).

Shared by the syntax tests and by anyone who needs random inputs:

- `programs(plan=None, quantiles=None, exotic=False)`: a workload, models and a graph that is
  well-formed (Def. A.2, as rpegc/core/wellformed.py checks it), optionally with a cluster and a plan
  whose every placement is legal (P1-P8, rpegc/core/plan_rules.py).
- `exec_programs(exotic=False)`: such a program plus an exec graph whose nodes and edges name the
  graph's vertices, models and containers: op nodes per step (quantile phase sub-nodes for generation
  when the graph has quantiles), comm and reshard nodes, data/pub/order/dep edges that always point
  forward in node order (a DAG), optional time annotations and memory / schedule reports. It is
  structurally plausible, not the output of the unroll and lowering passes (run those on
  `programs(plan=True)` for that).
- Building blocks: `names`, `exprs`, `workloads`, `models`, `clusters`.

`exotic=True` stresses the printer: quoted names (`@"a b"`), preset models with overridden fields,
infinities and negative zero in floats, size expressions with negative literals, op nodes whose vertex
differs from their id, and memory reports whose three series list devices in different orders.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from hypothesis import strategies as st

from rpegc.core import presets
from rpegc.core.candidates import aligned_origins, legal_strategies
from rpegc.core.exec_graph import ExecEdge, ExecGraph, ExecNode, MemoryReport, ScheduleReport
from rpegc.core.expr import SYMBOLS, BinOp, Expr, Num, Sym
from rpegc.core.plan_rules import layout_extent
from rpegc.core.program import (
    DTYPE_BYTES,
    ELEMENT_KINDS,
    Alloc,
    Arch,
    Cluster,
    Container,
    Edge,
    Graph,
    Model,
    Placement,
    Plan,
    Program,
    Quantile,
    Strategy,
    Vertex,
    Workload,
)
from rpegc.core.wellformed import fitting_algorithms

# Bare identifiers as a user writes them; `exotic` adds names that need quoting.
BARE_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
EXOTIC_NAMES = st.one_of(
    BARE_NAMES,
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.#$]{0,6}", fullmatch=True),
    st.text(min_size=0, max_size=6),
)
HARDWARE = ("gh200", "h100-80g", "a100-40g", "h200")
# Container shapes of the paper's pipelines (Table VIII); they evaluate to positive integers.
REALISTIC_DIMS = (
    (),
    (Sym("B"),),
    (BinOp("*", Sym("B"), Sym("R")),),
    (Sym("B"), Sym("Lp")),
    (BinOp("*", Sym("B"), Sym("R")), Sym("Lr")),
    (BinOp("*", Sym("B"), Sym("R")), BinOp("+", Sym("Lp"), Sym("Lr"))),
    (BinOp("*", Num(2), Sym("B")), BinOp("/", Sym("Lr"), Num(4))),
)
SMALL_PRESETS = ("tiny", "tiny-4l", "llama2-7b", "llama-7b", "llama3.1-8b")


def names(exotic: bool = False) -> st.SearchStrategy[str]:
    return EXOTIC_NAMES if exotic else BARE_NAMES


def unique_names(n: int, exotic: bool = False) -> st.SearchStrategy[list[str]]:
    return st.lists(names(exotic), min_size=n, max_size=n, unique=True)


def exprs(max_leaves: int = 6, negative: bool = False) -> st.SearchStrategy[Expr]:
    """Size expressions over B, R, Lp, Lr and integer literals (negative literals when asked)."""
    ints = st.integers(-50, 1000) if negative else st.integers(1, 1000)
    leaves = st.one_of(st.sampled_from(SYMBOLS).map(Sym), ints.map(Num))
    return st.recursive(
        leaves,
        lambda sub: st.builds(BinOp, st.sampled_from("+-*/"), sub, sub),
        max_leaves=max_leaves,
    )


def workloads(exotic: bool = False) -> st.SearchStrategy[Workload]:
    if exotic:
        # B and R stay small: plans enumerate the divisors of B.
        small, large = st.integers(1, 4096), st.integers(1, 10**12)
        return st.builds(Workload, small, small, large, large, st.sampled_from(sorted(DTYPE_BYTES)))
    return st.builds(
        Workload,
        st.sampled_from([8, 16, 32, 64, 128, 256, 512]),
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from([16, 64, 128, 256]),
        st.sampled_from([32, 128, 384, 1024]),
        st.sampled_from(sorted(DTYPE_BYTES)),
    )


@st.composite
def archs(draw, exotic: bool = False) -> tuple[Arch, Optional[str]]:
    """(arch, preset name or None): a preset, a preset with overrides (exotic), or explicit fields."""
    choice = draw(st.sampled_from(["preset", "explicit", "override"] if exotic else ["preset", "explicit"]))
    if choice != "explicit":
        preset = draw(st.sampled_from(SMALL_PRESETS))
        arch = presets.lookup(preset)
        if choice == "override":
            arch = replace(arch, layers=draw(st.sampled_from([1, 2, 6, 12, 48])), gated=draw(st.booleans()))
        return arch, preset
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if h <= heads]))
    arch = Arch(
        layers=draw(st.sampled_from([2, 4, 8, 16, 32])),
        hidden=heads * draw(st.sampled_from([8, 16, 32])),
        ffn=draw(st.sampled_from([64, 128, 512])),
        vocab=draw(st.sampled_from([64, 256, 32000])),
        heads=heads,
        kv_heads=kv,
        gated=draw(st.booleans()),
    )
    return arch, None


def models(name: str, kind: str, trainable: bool, exotic: bool = False) -> st.SearchStrategy[Model]:
    return archs(exotic).map(lambda ap: Model(name, kind, trainable, ap[0], preset=ap[1]))


def clusters(name: str = "c") -> st.SearchStrategy[Cluster]:
    return st.builds(
        Cluster,
        st.just(name),
        st.sampled_from([1, 2]),
        st.sampled_from([1, 2, 4]),
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from(HARDWARE),
    )


# ---------------------------------------------------------------------------------------------------
# Well-formed graphs


@st.composite
def _graph_program(draw, quantiles: Optional[bool], exotic: bool) -> Program:
    """Workload, models and a Def. A.2 well-formed graph built in topological order.

    Shape: an optional generation vertex (policy or actor_critic), one inference vertex per other
    model (and maybe one more for the policy), one training vertex per trainable model. Every vertex
    reads its model's weights; inference and generation write fresh data; training vertices read data
    of earlier vertices and write their weights; readers of trainable weights get publication edges.
    """
    workload = draw(workloads(exotic))
    policy_kind = draw(st.sampled_from(["policy", "actor_critic"]))
    policy_trainable = draw(st.booleans())
    has_critic = draw(st.booleans())
    frozen_kinds = draw(st.lists(st.sampled_from(["reference", "reward"]), max_size=2))
    has_gen = draw(st.booleans()) or not policy_trainable  # a frozen, never-generating policy is unused

    kinds = [(policy_kind, policy_trainable)] + ([("critic", True)] if has_critic else [])
    kinds += [(k, False) for k in frozen_kinds]
    n_models = len(kinds)
    n_vertices = int(has_gen) + (n_models - 1) + 2 * n_models  # an upper bound on what is named below
    all_names = draw(unique_names(1 + n_models + n_vertices, exotic))
    graph_name, model_names, vertex_names = all_names[0], all_names[1 : 1 + n_models], all_names[1 + n_models :]
    model_list = [draw(models(n, k, t, exotic)) for n, (k, t) in zip(model_names, kinds)]

    # Containers share one namespace; draw enough names for the weights and every data container.
    ctr_names = iter(draw(unique_names(n_models + 3 * n_vertices + 2, exotic)))
    weights = {m.name: Container(next(ctr_names), "weights", (), m.name) for m in model_list}
    containers: list[Container] = list(weights.values())
    x = Container(next(ctr_names), "tokens", (Sym("B"), Sym("Lp")))
    containers.append(x)
    available: list[tuple[Optional[str], Container]] = [(None, x)]  # (producer vertex, container)

    def data_container() -> Container:
        elem = draw(st.sampled_from(ELEMENT_KINDS))
        if exotic:
            dims = tuple(draw(st.lists(exprs(3, negative=True), max_size=3)))
        else:
            dims = draw(st.sampled_from(REALISTIC_DIMS))
        bytes_per = draw(st.one_of(st.none(), st.sampled_from([1, 2, 4, 8])))
        c = Container(next(ctr_names), elem, dims, None, bytes_per)
        containers.append(c)
        return c

    vertex_iter = iter(vertex_names)
    plan_roles: list[tuple[str, str]] = []  # (role, model) in topological order
    policy = model_list[0]
    if has_gen:
        plan_roles.append(("generation", policy.name))
    plan_roles += [("inference", m.name) for m in model_list[1:]]
    if draw(st.booleans()):
        plan_roles.append(("inference", policy.name))
    middle = plan_roles[int(has_gen) :]
    plan_roles = plan_roles[: int(has_gen)] + draw(st.permutations(middle))
    plan_roles += [("training", m.name) for m in model_list if m.trainable]

    vertices: list[Vertex] = []
    data_edges: list[Edge] = []
    for role, model in plan_roles:
        name = next(vertex_iter)
        reads = [weights[model].name]
        chosen = draw(st.lists(st.sampled_from(range(len(available))), min_size=1, max_size=3, unique=True))
        for i in chosen:
            producer, c = available[i]
            reads.append(c.name)
            if producer is not None and draw(st.integers(0, 9)) < 7:
                data_edges.append(Edge(producer, name, c.name))
        if role == "training":
            writes = [weights[model].name]
        else:
            outs = [data_container() for _ in range(draw(st.integers(1, 2)))]
            writes = [c.name for c in outs]
            available += [(name, c) for c in outs]
        vertices.append(Vertex(name, role, model, tuple(reads), tuple(writes)))

    trainers = {v.model: v.name for v in vertices if v.role == "training"}
    pub_edges = [
        Edge(trainers[v.model], v.name, weights[v.model].name)
        for v in vertices
        if v.model in trainers and v.role != "training"
    ]
    read = {a for v in vertices for a in v.reads}
    written = {a for v in vertices for a in v.writes}
    inputs = tuple(c.name for c in containers if c.name in read and c.name not in written)
    outputs = tuple(c.name for c in containers if c.name in written and c.name not in read)
    staleness = tuple((m, draw(st.integers(0, 2))) for m in trainers if draw(st.booleans()))
    want_quantiles = draw(st.booleans()) if quantiles is None else quantiles
    graph = Graph(
        name=graph_name,
        containers=tuple(containers),
        inputs=inputs,
        outputs=outputs,
        vertices=tuple(vertices),
        data_edges=tuple(data_edges),
        pub_edges=tuple(pub_edges),
        staleness=staleness,
        quantiles=draw(_quantiles(exotic)) if want_quantiles else (),
    )
    program = Program(workload=workload, models=tuple(model_list), graph=graph)
    algorithm = draw(st.sampled_from((None,) + fitting_algorithms(program, graph)))
    return replace(program, graph=replace(graph, algorithm=algorithm))


@st.composite
def _quantiles(draw, exotic: bool) -> tuple[Quantile, ...]:
    """Def. A.9: increasing fractions ending at 1, increasing lengths ending at Lr (Lr/8 .. Lr)."""
    divisors = sorted(draw(st.sets(st.sampled_from([2, 4, 8]), max_size=3)), reverse=True)
    fractions = sorted(draw(st.sets(st.floats(0.01, 0.99), min_size=len(divisors), max_size=len(divisors))))
    qs = [Quantile(f, BinOp("/", Sym("Lr"), Num(d))) for f, d in zip(fractions, divisors)]
    qs.append(Quantile(1.0, Sym("Lr")))
    if exotic and draw(st.booleans()):  # arbitrary values: only the syntax has to carry them
        qs.append(Quantile(draw(st.floats(allow_nan=False)), draw(exprs(4, negative=True))))
    return tuple(qs)


@st.composite
def _plan_for(draw, p: Program, exotic: bool) -> Program:
    """A cluster and a plan with one legal (P1-P8) placement per vertex."""
    names_ = draw(unique_names(2, exotic))
    cluster = draw(clusters(names_[0]))
    models_by_name = {m.name: m for m in p.models}
    placements = []
    for v in p.graph.vertices:
        strategy = draw(st.sampled_from(legal_strategies(models_by_name[v.model], p.workload, cluster)))
        extent = layout_extent(strategy.dp, strategy.pp, strategy.tp, cluster)
        origin = draw(st.sampled_from(aligned_origins(extent, cluster)))
        placements.append(Placement(v.name, Alloc(origin, extent), strategy))
    plan = Plan(names_[1], p.graph.name, cluster.name, tuple(placements))
    return replace(p, cluster=cluster, plan=plan)


@st.composite
def programs(draw, plan: Optional[bool] = None, quantiles: Optional[bool] = None, exotic: bool = False) -> Program:
    """A well-formed graph program; `plan`: True always, False never, None maybe a cluster and plan."""
    p = draw(_graph_program(quantiles, exotic))
    want_plan = draw(st.booleans()) if plan is None else plan
    if want_plan:
        p = draw(_plan_for(p, exotic))
    elif draw(st.booleans()):
        p = replace(p, cluster=draw(clusters(draw(names(exotic)))))
    return p


# ---------------------------------------------------------------------------------------------------
# Exec graphs


def _floats(exotic: bool) -> st.SearchStrategy[float]:
    if exotic:
        return st.floats(allow_nan=False)
    return st.floats(0.0, 1e6, allow_nan=False)


@st.composite
def _allocs(draw, cluster: Optional[Cluster]) -> Alloc:
    dims = (cluster.racks, cluster.nodes, cluster.gpus) if cluster else (2, 4, 8)
    extent = tuple(draw(st.integers(1, d)) for d in dims)
    origin = tuple(draw(st.integers(0, d - e)) for d, e in zip(dims, extent))
    return Alloc(origin, extent)


_strategies = st.builds(Strategy, st.integers(1, 16), st.integers(1, 8), st.integers(1, 8), st.integers(1, 16))


@st.composite
def exec_graphs(draw, p: Program, exotic: bool = False) -> ExecGraph:
    """An exec graph over `p`'s graph (see the module docstring)."""
    g = p.graph
    steps = draw(st.integers(1, 3))
    floats = _floats(exotic)
    placement = {pl.vertex: pl for pl in p.plan.placements} if p.plan else {}
    trained = {v.model for v in g.vertices if v.role == "training"}
    annotate = draw(st.booleans())

    def timed(node: ExecNode) -> ExecNode:
        if not annotate:
            return node
        return node.with_(time=draw(floats), start=draw(floats), finish=draw(st.one_of(st.none(), floats)))

    nodes: list[ExecNode] = []
    for k in range(steps):
        for order, v in enumerate(g.vertices):
            pl = placement.get(v.name)
            base = ExecNode(
                id=f"{v.name}#{k}",
                kind="op",
                step=k,
                order=order,
                vertex=v.name,
                role=v.role,
                model=v.model,
                alloc=pl.alloc if pl else None,
                strategy=pl.strategy if pl else None,
                version_in=((v.model, max(0, k - g.tau(v.model))),),
                version_out=((v.model, k + 1),) if v.role == "training" else (),
            )
            if exotic and draw(st.integers(0, 9)) == 0:
                base = base.with_(vertex=draw(st.sampled_from([u.name for u in g.vertices])))
            split = v.role == "generation" and g.quantiles and draw(st.booleans())
            if not split:
                nodes.append(timed(base))
                continue
            prev = 0.0
            for q, quantile in enumerate(g.quantiles, start=1):
                fraction = quantile.f - prev if not exotic else draw(floats)
                prev = quantile.f
                nodes.append(timed(base.with_(id=f"{base.id}.q{q}", phase=q, nphases=len(g.quantiles), fraction=fraction)))
    data = [c for c in g.containers if not c.is_weights]
    for j in range(draw(st.integers(0, 4))):
        ident = draw(names(True)) if exotic else f"c{j}"
        if any(n.id == ident for n in nodes):
            continue
        step, order = draw(st.integers(0, steps - 1)), draw(st.integers(0, len(g.vertices) - 1))
        comm = ExecNode(
            id=ident, kind="comm", step=step, order=order,
            src_alloc=draw(_allocs(p.cluster)), alloc=draw(_allocs(p.cluster)), bytes=draw(st.integers(0, 10**12)),
        )
        if data and draw(st.booleans()):
            comm = comm.with_(container=draw(st.sampled_from(data)).name)
            if g.quantiles and draw(st.booleans()):
                q = draw(st.integers(1, len(g.quantiles)))
                comm = comm.with_(phase=q, nphases=len(g.quantiles), fraction=draw(floats))
        else:
            model = draw(st.sampled_from([m.name for m in p.models]))
            comm = comm.with_(model=model, version_in=((model, draw(st.integers(0, steps))),))
        nodes.append(timed(comm))
    for j in range(draw(st.integers(0, 3)) if trained else 0):
        model = draw(st.sampled_from(sorted(trained)))
        nodes.append(timed(ExecNode(
            id=f"r{j}", kind="reshard", step=draw(st.integers(0, steps - 1)), order=0, model=model,
            version_in=((model, draw(st.integers(0, steps))),), alloc=draw(_allocs(p.cluster)),
            src_strategy=draw(_strategies), strategy=draw(_strategies), bytes=draw(st.integers(0, 10**12)),
        )))
    edges: list[ExecEdge] = []
    if len(nodes) >= 2:
        for _ in range(draw(st.integers(0, 3 * len(nodes)))):
            i = draw(st.integers(0, len(nodes) - 2))
            j = draw(st.integers(i + 1, len(nodes) - 1))
            kind = draw(st.sampled_from(["data", "pub", "order", "dep"]))
            container = None
            if kind in ("data", "pub") and g.containers:
                container = draw(st.sampled_from(g.containers)).name
            edges.append(ExecEdge(nodes[i].id, nodes[j].id, kind, container))
    memory = draw(st.one_of(st.none(), _memory_reports(p.cluster, exotic)))
    schedule = draw(st.one_of(st.none(), st.builds(ScheduleReport, floats, floats, floats, floats, floats)))
    return ExecGraph(g.name, steps, tuple(nodes), tuple(edges), draw(st.booleans()), memory, schedule)


@st.composite
def _memory_reports(draw, cluster: Optional[Cluster], exotic: bool) -> MemoryReport:
    n = cluster.num_devices if cluster else 8
    devices = sorted(draw(st.sets(st.integers(0, n - 1), max_size=8)))
    floats = _floats(exotic)

    def series():
        devs = draw(st.permutations(devices)) if exotic and draw(st.booleans()) else devices
        return tuple((d, draw(floats)) for d in devs)

    return MemoryReport(series(), series(), series(), draw(floats), draw(floats), draw(st.booleans()))


@st.composite
def exec_programs(draw, exotic: bool = False) -> Program:
    """A program (maybe with a plan) carrying an exec graph over its graph."""
    p = draw(programs(exotic=exotic))
    return replace(p, exec=draw(exec_graphs(p, exotic)))
