"""Local structural checks of the rpeg/exec ops and attributes, and located conversion errors."""

from __future__ import annotations

import dataclasses

import pytest
from xdsl.dialects.builtin import ArrayAttr, IntAttr, ModuleOp, StringAttr
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.exec_graph import ExecEdge, ExecGraph, ExecNode, MemoryReport
from rpegc.core.ir.expr import Sym
from rpegc.core.ir.program import Arch, Container, Edge, Graph, Model, Plan, Pool, Program, Verifier, Vertex, Workload
from rpegc.core.ir.geometry import Cluster
from rpegc.dialects import exec as ex
from rpegc.dialects import rpeg
from rpegc.dialects.attrs import BinOpAttr, NumAttr, SymAttr
from rpegc.dialects.convert import make_context, module_to_program, program_to_module

ARCH = Arch(2, 64, 256, 64, 4, 4)
WORKLOAD = Workload(8, 1, 4, 4)
MODELS = (Model("m", "policy", True, ARCH),)


GRAPH = Graph(
    name="g",
    containers=(Container("X", "tokens", (Sym("B"), Sym("Lp"))), Container("W", "weights", model="m")),
    inputs=("X", "W"),
    outputs=(),
    vertices=(Vertex("train", "training", "m", ("W", "X"), ("W",)),),
    data_edges=(),
    pub_edges=(Edge("train", "train", "W"),),
    staleness=(("m", 1),),
)


def module_with_graph(**changes) -> ModuleOp:
    return program_to_module(Program(WORKLOAD, MODELS, graph=dataclasses.replace(GRAPH, **changes)))


def module_with_nodes(*nodes: ExecNode, edges: tuple[ExecEdge, ...] = (), memory=None) -> ModuleOp:
    return program_to_module(Program(WORKLOAD, MODELS, exec=ExecGraph("g", 1, nodes, edges, memory=memory)))


def verify_error(module: ModuleOp) -> str:
    with pytest.raises(VerifyException) as info:
        module.verify()
    return str(info.value)


def op_node(**changes) -> ExecNode:
    return dataclasses.replace(ExecNode("v#0", "op", 0, 0, vertex="v", role="training", model="m"), **changes)


def test_valid_modules_verify() -> None:
    module_with_graph().verify()
    module_with_nodes(op_node(), edges=(ExecEdge("v#0", "v#0", "data", "X"),)).verify()


def test_vertex_role_must_be_a_known_role() -> None:
    bad = Vertex("gen", "sampling", "m", (), ())
    assert "role 'sampling' is not one of generation, inference, training" in verify_error(
        module_with_graph(vertices=(bad,))
    )


def test_workload_dtype_and_model_kind_are_checked() -> None:
    module = program_to_module(Program(Workload(8, 1, 4, 4, "int3"), (Model("m", "teacher", True, ARCH),)))
    assert "dtype 'int3'" in verify_error(module)
    module = program_to_module(Program(WORKLOAD, (Model("m", "teacher", True, ARCH),)))
    assert "kind 'teacher'" in verify_error(module)


def test_container_element_kind_and_weights_model_are_checked() -> None:
    assert "elem 'pixels'" in verify_error(module_with_graph(containers=(Container("X", "pixels"),)))
    assert "must name its model" in verify_error(module_with_graph(containers=(Container("W", "weights"),)))


def test_exec_node_kinds_require_their_fields() -> None:
    assert "needs 'vertex', 'role' and 'model'" in verify_error(module_with_nodes(op_node(vertex=None)))
    assert "moves a 'container' or a 'model'" in verify_error(module_with_nodes(ExecNode("c", "comm", 0, 0)))
    assert "reshard node needs 'model'" in verify_error(module_with_nodes(ExecNode("r", "reshard", 0, 0)))
    assert "role 'eval'" in verify_error(module_with_nodes(op_node(role="eval")))


def test_phase_must_lie_within_the_phase_count() -> None:
    assert "phase 4 is outside 1..3" in verify_error(module_with_nodes(op_node(phase=4, nphases=3)))
    assert "given together" in verify_error(module_with_nodes(op_node(phase=1)))


def test_data_and_publish_edges_name_a_container() -> None:
    module = module_with_nodes(op_node(), edges=(ExecEdge("v#0", "v#0", "pub"),))
    assert "must name the container" in verify_error(module)


def test_analysis_results_must_be_floats() -> None:
    module = module_with_nodes(op_node(time=1.0))
    node = next(op for op in module.walk() if isinstance(op, ex.OpNodeOp))
    node.attributes["time"] = IntAttr(3)
    assert "'time' must be a float attribute" in verify_error(module)


def test_memory_device_arrays_must_have_equal_length() -> None:
    module = module_with_nodes(op_node(), memory=MemoryReport(((0, 1.0),), (), (), 1.0, 0.5, True))
    mem = next(op for op in module.walk() if isinstance(op, ex.MemoryOp))
    mem.properties["peak"] = ArrayAttr(())
    assert "peak_devices has 1 entries but peak has 0" in verify_error(module)


def test_graph_body_ops_need_a_graph_parent() -> None:
    module = module_with_graph()
    vertex = next(op for op in module.walk() if isinstance(op, rpeg.VertexOp))
    vertex.detach()
    module.body.block.add_op(vertex)
    assert "expects parent op 'rpeg.graph'" in verify_error(module)


def test_expression_attributes_reject_unknown_symbols_and_operators() -> None:
    with pytest.raises(VerifyException, match="unknown symbol 'T'"):
        SymAttr(StringAttr("T"))
    with pytest.raises(VerifyException, match="unknown operator '%'"):
        BinOpAttr(StringAttr("%"), NumAttr(IntAttr(1)), NumAttr(IntAttr(2)))
    with pytest.raises(VerifyException, match="ExprAttr"):
        BinOpAttr(StringAttr("+"), IntAttr(1), NumAttr(IntAttr(2)))  # type: ignore[arg-type]


def test_generic_text_with_a_bad_attribute_does_not_parse() -> None:
    text = '"builtin.module"() ({\n  "rpeg.place"() <{vertex = @v, alloc = #rpeg.alloc<(0, 0), (1, 1, 1)>, strategy = #rpeg.strategy<dp = 1, pp = 1, tp = 1, mb = 1>}> {loc = #rpeg.loc<"f", 1, 1>} : () -> ()\n}) : () -> ()'
    with pytest.raises(ParseError, match="origin and extent triples"):
        Parser(make_context(), text).parse_module()


def test_module_without_workload_is_a_located_user_error() -> None:
    module = program_to_module(Program(WORKLOAD, MODELS))
    next(iter(module.ops)).detach()
    with pytest.raises(RpegError, match="no rpeg.workload"):
        module_to_program(module)


def test_duplicate_top_level_op_is_reported_at_its_position() -> None:
    module = program_to_module(Program(WORKLOAD, MODELS, cluster=Cluster("c", 1, 1, 1, "cpu", loc=Loc("a.rpeg", 5, 1))))
    cluster = next(op for op in module.ops if isinstance(op, rpeg.ClusterOp))
    module.body.block.add_op(cluster.clone())
    with pytest.raises(RpegError, match="at most one rpeg.cluster") as info:
        module_to_program(module)
    assert info.value.loc == Loc("a.rpeg", 5, 1)


def test_unknown_exec_node_kind_is_reported() -> None:
    with pytest.raises(RpegError, match="kind 'barrier'"):
        module_with_nodes(op_node(kind="barrier"))


def test_verify_vertex_verifier_and_pool_are_accepted() -> None:
    score = Vertex("score", "verify", "math", ("X",), ("X",))
    program = Program(WORKLOAD, MODELS, graph=dataclasses.replace(GRAPH, vertices=GRAPH.vertices + (score,)),
                      plan=Plan("p", "g", "c", (), pools=(Pool("score", 1),)),
                      verifiers=(Verifier("math", "math", per_response=0.0),))
    program_to_module(program).verify()
    module_with_nodes(op_node(vertex="score", role="verify", model="math", pool=1),
                      ExecNode("c", "comm", 0, 0, container="X", src_alloc=None, alloc=None)).verify()


def test_pool_sizes_must_be_positive() -> None:
    module = program_to_module(Program(WORKLOAD, MODELS, plan=Plan("p", "g", "c", (), pools=(Pool("score", 0),))))
    assert "rpeg.pool: size 0 must be >= 1" in verify_error(module)
    module = module_with_nodes(op_node(vertex="score", role="verify", model="math", pool=-1))
    assert "exec.op: pool -1 must be >= 1" in verify_error(module)


def test_pool_op_needs_a_plan_parent() -> None:
    module = program_to_module(Program(WORKLOAD, MODELS, plan=Plan("p", "g", "c", (), pools=(Pool("score", 2),))))
    pool = next(op for op in module.walk() if isinstance(op, rpeg.PoolOp))
    pool.detach()
    module.body.block.add_op(pool)
    assert "expects parent op 'rpeg.plan'" in verify_error(module)


def test_verifier_op_inside_a_graph_is_a_located_error() -> None:
    module = program_to_module(Program(WORKLOAD, MODELS, graph=GRAPH,
                                       verifiers=(Verifier("math", "math", loc=Loc("a.rpeg", 2, 1)),)))
    verifier = next(op for op in module.ops if isinstance(op, rpeg.VerifierOp))
    graph = next(op for op in module.ops if isinstance(op, rpeg.GraphOp))
    verifier.detach()
    graph.body.block.add_op(verifier)
    with pytest.raises(RpegError, match="'rpeg.verifier' cannot appear inside rpeg.graph") as info:
        module_to_program(module)
    assert info.value.loc == Loc("a.rpeg", 2, 1)
