"""Program <-> xDSL module conversion: exact round trips, source positions, generic MLIR text."""

from __future__ import annotations

import dataclasses
from io import StringIO

from xdsl.dialects.builtin import ModuleOp
from rpegc.dialects.mlir_form import parse_mlir, print_mlir
from xdsl.printer import Printer
from xdsl.dialects.builtin import UnknownLoc

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc
from rpegc.core.ir.exec_graph import (DataRef, ExecEdge, ExecFusion, ExecGraph, ExecNode, MemoryReport, Microtask,
                                      ScheduleReport)
from rpegc.core.ir.expr import BinOp, Num, Sym
from rpegc.core.ir.program import (Arch, Container, Edge, Fuse, Graph, Model, Placement, Plan, Pool, Program,
                                   Quantile, Verifier, Vertex, Workload)
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.dialects import exec as ex
from rpegc.dialects import rpeg
from rpegc.dialects.convert import (
    loc_of,
    make_context,
    module_to_program,
    program_to_module,
    replace_module,
)

F = "ppo.rpeg"


def at(line: int, col: int = 1) -> Loc:
    return Loc(F, line, col)


ARCH = Arch(layers=32, hidden=4096, ffn=11008, vocab=32000, heads=32, kv_heads=8)
A0 = Alloc((0, 0, 0), (1, 8, 4))
A1 = Alloc((1, 2, 0), (1, 1, 4))
S0 = Strategy(16, 1, 2, 1)
S1 = Strategy(2, 2, 2, 4)


def full_graph() -> Graph:
    return Graph(
        name="ppo",
        containers=(
            Container("X", "tokens", (Sym("B"), Sym("Lp")), loc=at(5, 3)),
            Container("Y", "tokens", (BinOp("*", Sym("B"), Sym("R")), BinOp("+", Sym("Lp"), Sym("Lr"))), loc=at(6, 3)),
            Container("r", "rewards", (BinOp("*", Sym("B"), Sym("R")),), bytes_per_elem=4, loc=at(7, 3)),
            Container("W_actor", "weights", model="actor", loc=at(8, 3)),
        ),
        inputs=("X", "W_actor"),
        outputs=("r",),
        vertices=(
            Vertex("gen", "generation", "actor", ("W_actor", "X"), ("Y",), loc=at(10, 3)),
            Vertex("reward", "inference", "rm", ("Y",), ("r",), loc=at(11, 3)),
            Vertex("train", "training", "actor", ("W_actor", "Y", "r"), ("W_actor",), loc=at(12, 3)),
        ),
        data_edges=(Edge("gen", "reward", "Y", loc=at(13, 3)), Edge("reward", "train", "r", loc=at(14, 3))),
        pub_edges=(Edge("train", "gen", "W_actor", loc=at(15, 3)),),
        staleness=(("actor", 1), ("rm", 0)),
        quantiles=(
            Quantile(0.5, BinOp("/", Sym("Lr"), Num(4)), loc=at(17, 20)),
            Quantile(0.85, BinOp("-", Sym("Lr"), BinOp("*", Num(2), Sym("R"))), loc=at(17, 40)),
            Quantile(1.0, Sym("Lr"), loc=at(17, 60)),
        ),
        loc=at(4),
        staleness_loc=at(16, 3),
        quantiles_loc=at(17, 3),
    )


def full_exec() -> ExecGraph:
    nodes = (
        ExecNode(
            "gen#0", "op", 0, 0, vertex="gen", role="generation", model="actor", alloc=A0, strategy=S0,
            version_in=(("actor", 0),), time=1.25, start=0.0, finish=1.25, loc=at(10, 3),
        ),
        ExecNode(
            "gen#1.q2", "op", 1, 0, vertex="gen", role="generation", model="actor", phase=2, nphases=3,
            fraction=0.35, alloc=A0, strategy=S0, version_in=(("actor", 0),), loc=at(10, 3),
        ),
        ExecNode(
            "train#0", "op", 0, 2, vertex="train", role="training", model="actor", alloc=A1, strategy=S1,
            version_in=(("actor", 0),), version_out=(("actor", 1),), time=3.0, loc=at(12, 3),
        ),
        ExecNode("c0", "comm", 0, 1, container="Y", alloc=A1, src_alloc=A0, bytes=81920, time=0.01),
        ExecNode(
            "c5", "comm", 1, 0, model="actor", container="W_actor", alloc=A0, src_alloc=A1,
            bytes=10328473600, version_in=(("actor", 1),), phase=1, nphases=3, fraction=0.5,
        ),
        ExecNode(
            "r0", "reshard", 1, 0, model="actor", alloc=A0, strategy=S0, src_alloc=A1, src_strategy=S1,
            bytes=2**62 + 1, version_in=(("actor", 1),), time=float("inf"), start=-0.0, finish=7.0,
        ),
    )
    edges = (
        ExecEdge("gen#0", "c0", "dep", loc=at(13, 3)),
        ExecEdge("gen#0", "train#0", "data", "Y", loc=at(13, 3)),
        ExecEdge("train#0", "gen#1.q2", "pub", "W_actor", loc=at(15, 3)),
        ExecEdge("train#0", "c5", "order"),
        ExecEdge("c5", "r0", "dep", container="W_actor"),
    )
    memory = MemoryReport(
        peak=((0, 6.1e10), (1, 6123456789.0), (5, 1 / 3)),
        persistent=((0, 2.0e10), (1, 2.0e10)),
        transient=(),
        m_eff=8.6e10,
        r_peak=0.71,
        feasible=False,
    )
    schedule = ScheduleReport(makespan=12.5, score=1.2e5, score_pen=1.25e5, util=0.61, p_eff=3.2)
    stages = ((Microtask(0, "F", 0, 0), Microtask(1, "F", 0, 0), Microtask(0, "B", 0, 0), Microtask(1, "B", 0, 0)),)
    fusions = (ExecFusion("fuse0#0", ("train#0", "gen#0"), stages, loc=at(16, 3)),)
    return ExecGraph("ppo", 2, nodes, edges, lowered=True, memory=memory, schedule=schedule, fusions=fusions,
                     loc=at(30))


def full_program() -> Program:
    return Program(
        workload=Workload(512, 2, 128, 384, "fp16", loc=at(1), oversample=3),
        models=(
            Model("actor", "policy", True, ARCH, preset="llama2-7b", loc=at(2)),
            Model("rm", "reward", False, ARCH, loc=at(3)),
        ),
        graph=full_graph(),
        cluster=Cluster("c64", 2, 8, 4, "gh200", loc=at(20)),
        plan=Plan(
            "p", "ppo", "c64",
            (Placement("gen", A0, S0, loc=at(22, 3)), Placement("train", A1, S1, loc=at(23, 3))),
            loc=at(21),
            fusions=(Fuse(("train", "gen"), loc=at(24, 3)),),
        ),
        exec=full_exec(),
        file=F,
    )


def locs(value: object, path: str = "p") -> list[tuple[str, Loc]]:
    """Every Loc reachable from a Program (they do not take part in ==), with where it was found."""
    if isinstance(value, Loc):
        return [(path, value)]
    if isinstance(value, tuple):
        return [item for i, v in enumerate(value) for item in locs(v, f"{path}[{i}]")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [item for f in dataclasses.fields(value) for item in locs(getattr(value, f.name), f"{path}.{f.name}")]
    return []


def assert_same(a: Program, b: Program) -> None:
    assert a == b
    assert a.file == b.file
    assert locs(a) == locs(b)


def generic_text(module: ModuleOp) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True, print_debuginfo=True).print_op(module)
    return out.getvalue()


def test_full_program_round_trips_with_locations() -> None:
    p = full_program()
    module = program_to_module(p)
    module.verify()
    back = module_to_program(module)
    assert_same(back, p)
    assert len(locs(p)) > 30  # the comparison covers every op kind's position


def test_round_trip_keeps_non_finite_and_huge_values() -> None:
    eg = full_exec()
    nan_node = eg.node("r0").with_(finish=float("nan"))
    p = dataclasses.replace(full_program(), exec=dataclasses.replace(eg, nodes=eg.nodes[:-1] + (nan_node,)))
    module = program_to_module(p)
    for prog in (module_to_program(module), module_to_program(parse_mlir(make_context(), generic_text(module), "<t>"))):
        r0 = prog.exec.node("r0")
        assert r0.bytes == 2**62 + 1
        assert r0.time == float("inf") and r0.finish != r0.finish
        assert str(r0.start) == "-0.0"


def test_generic_mlir_reparses_to_the_same_program() -> None:
    p = full_program()
    text = generic_text(program_to_module(p))
    assert '"rpeg.vertex"' in text and '"exec.reshard"' in text
    parsed = parse_mlir(make_context(), text, "<t>")
    parsed.verify()
    assert_same(module_to_program(parsed), p)
    assert generic_text(parsed) == text


def test_non_ascii_text_survives_generic_mlir() -> None:
    """xDSL reads escaped non-ASCII string literals back as bytes; the conversion decodes them."""
    p = dataclasses.replace(
        full_program(),
        cluster=Cluster("c64", 1, 2, 4, "profiles/grüne-h100.toml", loc=Loc("dür/ppo.rpeg", 3, 4)),
        file="dür/ppo.rpeg",
    )
    parsed = parse_mlir(make_context(), generic_text(program_to_module(p)), "<t>")
    parsed.verify()
    assert_same(module_to_program(parsed), p)


def test_minimal_program_has_only_a_workload_and_models() -> None:
    p = Program(Workload(8, 1, 4, 4), (Model("m", "policy", True, ARCH),))
    module = program_to_module(p)
    assert [op.name for op in module.ops] == ["rpeg.workload", "rpeg.model"]
    assert_same(module_to_program(module), p)


def test_empty_lists_with_a_position_are_kept() -> None:
    """`rpeg.staleness {}` written by the user keeps its op (and position); unwritten ones add no op."""
    g = dataclasses.replace(
        full_graph(), staleness=(), quantiles=(), staleness_loc=at(40, 3), quantiles_loc=UNKNOWN_LOC
    )
    p = dataclasses.replace(full_program(), graph=g)
    module = program_to_module(p)
    graph_op = next(op for op in module.ops if isinstance(op, rpeg.GraphOp))
    names = [op.name for op in graph_op.body.block.ops]
    assert "rpeg.staleness" in names and "rpeg.quantiles" not in names
    assert_same(module_to_program(module), p)


def test_exec_nodes_and_edges_keep_their_interleaved_order() -> None:
    eg = full_exec()
    module = program_to_module(dataclasses.replace(full_program(), exec=eg))
    exec_op = next(op for op in module.ops if isinstance(op, ex.ExecGraphOp))
    kinds = [op.name for op in exec_op.body.block.ops]
    assert kinds == [
        "exec.op", "exec.op", "exec.op", "exec.comm", "exec.comm", "exec.reshard",
        "exec.dep", "exec.data", "exec.publish", "exec.order", "exec.dep",
        "exec.memory", "exec.schedule", "exec.fusion",
    ]
    back = module_to_program(module).exec
    assert [n.kind for n in back.nodes] == [n.kind for n in eg.nodes]
    assert [e.kind for e in back.edges] == [e.kind for e in eg.edges]


def test_analysis_results_are_discardable_attributes() -> None:
    module = program_to_module(full_program())
    gen0 = next(op for op in module.walk() if isinstance(op, ex.OpNodeOp) and op.ident.data == "gen#0")
    assert {"time", "start", "finish"} <= set(gen0.attributes)
    assert not {"time", "start", "finish"} & set(gen0.properties)
    del gen0.attributes["time"]
    module.verify()
    assert module_to_program(module).exec.node("gen#0").time is None


def test_memory_report_is_one_op_with_dense_device_ids() -> None:
    peaks = tuple((d, float(d) * 1e9 + 0.5) for d in range(2048))
    mem = MemoryReport(peaks, peaks, peaks, 9e10, 0.5, True)
    eg = dataclasses.replace(full_exec(), memory=mem)
    module = program_to_module(dataclasses.replace(full_program(), exec=eg))
    memory_ops = [op for op in module.walk() if isinstance(op, ex.MemoryOp)]
    assert len(memory_ops) == 1
    assert len(memory_ops[0].peak_devices) == 2048
    assert module_to_program(module).exec.memory == mem


def test_replace_module_mutates_the_given_module() -> None:
    first = Program(Workload(8, 1, 4, 4), (Model("m", "policy", True, ARCH),), file="a.rpeg")
    module = program_to_module(first)
    p = full_program()
    replace_module(module, p)
    module.verify()
    assert_same(module_to_program(module), p)
    replace_module(module, first)
    assert_same(module_to_program(module), first)


def test_replace_module_keeps_the_ops_of_sections_left_unchanged() -> None:
    module = program_to_module(full_program())
    before = module_to_program(module)
    ops = {type(op): op for op in module.ops}
    after = dataclasses.replace(before, exec=dataclasses.replace(before.exec, steps=before.exec.steps + 1))
    replace_module(module, after, before)
    module.verify()
    now = {type(op): op for op in module.ops}
    assert now[rpeg.GraphOp] is ops[rpeg.GraphOp] and now[rpeg.PlanOp] is ops[rpeg.PlanOp]
    assert now[rpeg.ClusterOp] is ops[rpeg.ClusterOp]
    assert now[ex.ExecGraphOp] is not ops[ex.ExecGraphOp] and ops[ex.ExecGraphOp].parent is None
    assert_same(module_to_program(module), after)
    # A graph equal to the one read but not the same object is built anew: only identity proves it untouched.
    again = module_to_program(module)
    replace_module(module, dataclasses.replace(again, graph=dataclasses.replace(again.graph)), again)
    assert next(op for op in module.ops if isinstance(op, rpeg.GraphOp)) is not now[rpeg.GraphOp]
    assert_same(module_to_program(module), after)


def test_loc_of_reads_the_op_position() -> None:
    module = program_to_module(full_program())
    by_name = {op.name: op for op in module.walk()}
    assert loc_of(by_name["rpeg.workload"]) == at(1)
    assert loc_of(by_name["rpeg.place"]) == at(23, 3)
    assert loc_of(by_name["exec.schedule"]) == at(30)
    assert loc_of(module) == UNKNOWN_LOC


def test_loc_of_falls_back_to_the_enclosing_op() -> None:
    module = program_to_module(full_program())
    place = next(op for op in module.walk() if isinstance(op, rpeg.PlaceOp))
    place.location = UnknownLoc()
    assert loc_of(place) == at(21)


# --- verify vertices: rpeg.verifier, rpeg.pool, exec op nodes on the host pool ---------------------------------


def verify_program() -> Program:
    """full_program with two verifiers, a verify vertex scoring the responses, its pool, and an exec graph whose
    verify op runs on the pool (no alloc, no strategy) fed and drained by comm nodes with a host side."""
    g = full_graph()
    graph = dataclasses.replace(
        g,
        containers=g.containers + (Container("s", "rewards", (BinOp("*", Sym("B"), Sym("R")),), loc=at(9, 3)),),
        vertices=g.vertices + (Vertex("score", "verify", "math", ("Y",), ("s",), loc=at(12, 30)),),
        data_edges=g.data_edges + (Edge("gen", "score", "Y", loc=at(14, 30)), Edge("score", "train", "s")),
    )
    base = full_program()
    plan = dataclasses.replace(base.plan, pools=(Pool("score", 2, loc=at(23, 30)),))
    eg = base.exec
    nodes = eg.nodes + (
        ExecNode("c_in", "comm", 0, 3, container="Y", alloc=None, src_alloc=A0, bytes=4096, time=0.002,
                 data_in=(DataRef("Y"),), data_out=(DataRef("Y"),), loc=at(14, 30)),
        ExecNode("score#0", "op", 0, 3, vertex="score", role="verify", model="math", pool=2,
                 data_in=(DataRef("Y"),), data_out=(DataRef("s"),), time=0.5, start=1.25, finish=1.75,
                 loc=at(12, 30)),
        ExecNode("c_out", "comm", 0, 2, container="s", alloc=A1, src_alloc=None, bytes=2048),
    )
    edges = eg.edges + (ExecEdge("gen#0", "c_in"), ExecEdge("c_in", "score#0"), ExecEdge("score#0", "c_out"),
                        ExecEdge("c_out", "train#0"))
    return dataclasses.replace(
        base,
        verifiers=(Verifier("math", "math", loc=at(3, 40)),
                   Verifier("mine", "pkg.mod:score", per_response=0.004, loc=at(3, 60))),
        graph=graph,
        plan=plan,
        exec=dataclasses.replace(eg, nodes=nodes, edges=edges),
    )


def test_verifiers_verify_vertex_and_pool_round_trip_with_locations() -> None:
    p = verify_program()
    module = program_to_module(p)
    module.verify()
    assert [op.name for op in module.ops][:5] == ["rpeg.workload", "rpeg.model", "rpeg.model", "rpeg.verifier",
                                                  "rpeg.verifier"]
    by_ident = {op.ident.data: op for op in module.ops if isinstance(op, rpeg.VerifierOp)}
    assert by_ident["math"].per_response is None and by_ident["mine"].per_response.value.data == 0.004
    plan_op = next(op for op in module.ops if isinstance(op, rpeg.PlanOp))
    assert [op.name for op in plan_op.body.block.ops] == ["rpeg.place", "rpeg.place", "rpeg.pool", "rpeg.fuse"]
    back = module_to_program(module)
    assert_same(back, p)
    assert back.verifier("mine").per_response == 0.004 and back.plan.pool("score").size == 2
    assert back.graph.vertex("score").role == "verify" and back.plan.placements == p.plan.placements


def test_verify_exec_nodes_keep_pool_and_absent_allocs() -> None:
    module = program_to_module(verify_program())
    nodes = {op.ident.data: op for op in module.walk() if isinstance(op, ex.NodeFields)}
    score = nodes["score#0"]
    assert int(score.pool.value.data) == 2 and score.alloc is None and score.strategy is None
    assert nodes["c_in"].alloc is None and nodes["c_in"].src_alloc is not None
    assert nodes["c_out"].src_alloc is None and nodes["c_out"].alloc is not None
    assert all(op.pool is None for ident, op in nodes.items() if ident != "score#0")
    back = module_to_program(module).exec
    assert back.node("score#0") == verify_program().exec.node("score#0")
    assert back.node("score#0").pool == 2 and back.node("score#0").alloc is None
    assert back.node("c_in").alloc is None and back.node("c_out").src_alloc is None


def test_verify_program_survives_generic_and_printed_mlir() -> None:
    p = verify_program()
    text = generic_text(program_to_module(p))
    assert '"rpeg.verifier"' in text and '"rpeg.pool"' in text and "pool = 2 : i64" in text
    parsed = parse_mlir(make_context(), text, "<t>")
    parsed.verify()
    assert_same(module_to_program(parsed), p)
    assert generic_text(parsed) == text
    printed = print_mlir(program_to_module(p))
    assert_same(module_to_program(parse_mlir(make_context(), printed, "<t>")), p)


def test_programs_without_verifiers_print_no_verify_ops_or_properties() -> None:
    """The new ops and properties appear only where a program has verifiers, pools or pooled nodes."""
    text = generic_text(program_to_module(full_program()))
    assert "rpeg.verifier" not in text and "rpeg.pool" not in text and "pool =" not in text
    assert "per_response" not in text


def test_replace_module_keeps_verifiers() -> None:
    module = program_to_module(full_program())
    before = module_to_program(module)
    p = verify_program()
    replace_module(module, dataclasses.replace(p, graph=before.graph, cluster=before.cluster), before)
    module.verify()
    assert module_to_program(module).verifiers == p.verifiers
