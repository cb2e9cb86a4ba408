"""Property: every Program survives Program -> module -> (generic MLIR text ->) Program exactly.

Checked on the project's strategies (tests/fixtures/strategies.py) and on the local ones below, which draw
structurally valid Programs (the op verifiers accept them) with awkward values: symbol names
needing quotes, non-ASCII text, integers beyond 64 bits, signed zeros and infinities, empty and
long lists, every optional field both present and absent.
"""

from __future__ import annotations

from io import StringIO

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from fixtures.strategies import exec_programs
from fixtures.strategies import programs as wellformed_programs
from xdsl.printer import Printer

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc
from rpegc.core.ir.exec_graph import EDGE_KINDS, DataRef, ExecEdge, ExecGraph, ExecNode, MemoryReport, ScheduleReport
from rpegc.core.ir.expr import SYMBOLS, BinOp, Num, Sym
from rpegc.core.ir.program import (DTYPE_BYTES, ELEMENT_KINDS, MODEL_KINDS, ROLES, Arch, Container, Edge, Graph,
                                   Model, Placement, Plan, Pool, Program, Quantile, Verifier, Vertex, Workload)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.dialects.convert import make_context, module_to_program, program_to_module
from rpegc.dialects.mlir_form import parse_mlir

names = st.text(alphabet="abXY_#.-é0", min_size=1, max_size=6)
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
small = st.integers(min_value=0, max_value=64)
big = st.integers(min_value=-(2**70), max_value=2**70)  # inside rpeg attributes (expressions, archs, versions)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # an op's own integers are MLIR's i64
floats = st.floats(allow_nan=False)
locs = st.one_of(st.just(UNKNOWN_LOC), st.builds(Loc, texts, st.integers(0, 10**6), st.integers(0, 500)))


def opt(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | strategy


def tuples_of(strategy: st.SearchStrategy, n: int = 4) -> st.SearchStrategy:
    return st.lists(strategy, max_size=n).map(tuple)


exprs = st.recursive(
    st.one_of(st.builds(Num, big), st.builds(Sym, st.sampled_from(SYMBOLS))),
    lambda sub: st.builds(BinOp, st.sampled_from("+-*/"), sub, sub),
    max_leaves=6,
)
triples = st.tuples(small, small, small)
allocs = st.builds(Alloc, triples, triples)
strategies_ = st.builds(Strategy, small, small, small, small)
model_ints = st.lists(st.tuples(names, big), max_size=3).map(tuple)
data_refs = st.lists(st.builds(DataRef, names, st.one_of(st.none(), st.integers(1, 2**62))), max_size=3).map(tuple)

workloads = st.builds(Workload, int64, int64, int64, int64, st.sampled_from(tuple(DTYPE_BYTES)), loc=locs)
archs = st.builds(Arch, *(big,) * 6)
models = st.builds(Model, names, st.sampled_from(MODEL_KINDS), st.booleans(), archs, opt(texts), loc=locs)
verifiers = st.builds(Verifier, names, texts, opt(floats), loc=locs)
pool_sizes = st.integers(min_value=1, max_value=2**63 - 1)  # an i64; rpeg.pool and exec.op reject sizes below 1
data_containers = st.builds(
    Container, names, st.sampled_from(ELEMENT_KINDS), tuples_of(exprs, 3), opt(names), opt(int64), loc=locs
)
weight_containers = st.builds(Container, names, st.just("weights"), tuples_of(exprs, 1), names, opt(int64), loc=locs)
vertices = st.builds(Vertex, names, st.sampled_from(ROLES), names, tuples_of(names), tuples_of(names), loc=locs)
edges = st.builds(Edge, names, names, names, loc=locs)
graphs = st.builds(
    Graph,
    names,
    tuples_of(st.one_of(data_containers, weight_containers)),
    tuples_of(names),
    tuples_of(names),
    tuples_of(vertices),
    tuples_of(edges),
    tuples_of(edges),
    model_ints,
    tuples_of(st.builds(Quantile, floats, exprs, loc=locs), 3),
    loc=locs,
    staleness_loc=locs,
    quantiles_loc=locs,
)
clusters = st.builds(Cluster, names, int64, int64, int64, texts, loc=locs)
plans = st.builds(
    Plan, names, names, names, tuples_of(st.builds(Placement, names, allocs, strategies_, loc=locs)), loc=locs,
    pools=tuples_of(st.builds(Pool, names, pool_sizes, loc=locs), 3),
)


@st.composite
def exec_nodes(draw) -> ExecNode:
    kind = draw(st.sampled_from(("op", "comm", "reshard")))
    nphases = draw(opt(st.integers(1, 5)))
    phase = None if nphases is None else draw(st.integers(1, nphases))
    model = draw(names if kind != "comm" else opt(names))
    container = draw(opt(names)) if model is not None else draw(names)
    return ExecNode(
        id=draw(names),
        kind=kind,
        step=draw(int64),
        order=draw(int64),
        vertex=draw(names if kind == "op" else opt(names)),
        role=draw(st.sampled_from(ROLES) if kind == "op" else opt(st.sampled_from(ROLES))),
        model=model,
        container=container,
        phase=phase,
        nphases=nphases,
        alloc=draw(opt(allocs)),
        strategy=draw(opt(strategies_)),
        src_alloc=draw(opt(allocs)),
        src_strategy=draw(opt(strategies_)),
        bytes=draw(int64),
        pool=draw(opt(pool_sizes)),
        fraction=draw(opt(floats)),
        version_in=draw(model_ints),
        version_out=draw(model_ints),
        data_in=draw(data_refs),
        data_out=draw(data_refs),
        time=draw(opt(floats)),
        start=draw(opt(floats)),
        finish=draw(opt(floats)),
        loc=draw(locs),
    )


@st.composite
def exec_edges(draw) -> ExecEdge:
    kind = draw(st.sampled_from(EDGE_KINDS))
    container = draw(names if kind in ("data", "pub") else opt(names))
    return ExecEdge(draw(names), draw(names), kind, container, loc=draw(locs))


device_map = tuples_of(st.tuples(st.integers(0, 2**40), floats), 5)
memories = st.builds(MemoryReport, device_map, device_map, device_map, floats, floats, st.booleans())
schedules = st.builds(ScheduleReport, floats, floats, floats, floats, floats)
exec_graphs = st.builds(
    ExecGraph,
    names,
    int64,
    tuples_of(exec_nodes(), 5),
    tuples_of(exec_edges(), 5),
    st.booleans(),
    opt(memories),
    opt(schedules),
    loc=locs,
)
programs = st.builds(
    Program,
    workloads,
    tuples_of(models, 3),
    opt(graphs),
    opt(clusters),
    opt(plans),
    opt(exec_graphs),
    file=texts,
    verifiers=tuples_of(verifiers, 3),
)


def all_locs(p: Program) -> list[Loc]:
    found: list[Loc] = []

    def walk(value: object) -> None:
        if isinstance(value, Loc):
            found.append(value)
        elif isinstance(value, tuple):
            for v in value:
                walk(v)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))

    walk(p)
    return found


def generic_text(p: Program) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True, print_debuginfo=True).print_op(program_to_module(p))
    return out.getvalue()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_program_module_program_is_identity(p: Program) -> None:
    module = program_to_module(p)
    module.verify()
    back = module_to_program(module)
    assert back == p
    assert back.file == p.file
    assert all_locs(back) == all_locs(p)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_generic_mlir_text_reparses_to_the_same_program(p: Program) -> None:
    parsed = parse_mlir(make_context(), generic_text(p), "<t>")
    parsed.verify()
    back = module_to_program(parsed)
    assert back == p
    assert back.file == p.file
    assert all_locs(back) == all_locs(p)


# The project-wide strategies (tests/fixtures/strategies.py): well-formed graphs, legal plans, exec graphs.
shared_programs = st.one_of(
    wellformed_programs(plan=True), exec_programs(exotic=False), exec_programs(exotic=True)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_programs)
def test_shared_strategy_programs_round_trip(p: Program) -> None:
    module = program_to_module(p)
    module.verify()
    back = module_to_program(module)
    assert back == p
    assert all_locs(back) == all_locs(p)
    reparsed = module_to_program(parse_mlir(make_context(), generic_text(p), "<t>"))
    assert reparsed == p
    assert all_locs(reparsed) == all_locs(p)
