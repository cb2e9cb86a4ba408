"""print/parse round trip (docs/architecture.md, IR: `rpegc` prints what it parses) and the printer's canonical form."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from rpegc.core.ir.exec_graph import DataRef, ExecEdge, ExecGraph, ExecNode, MemoryReport, ScheduleReport
from rpegc.core.ir.expr import BinOp, Num, Sym
from rpegc.core.check.plan_rules import check_plan
from rpegc.core.ir.presets import lookup
from rpegc.core.ir.program import Arch, Model, Program, Workload
from rpegc.core.ir.geometry import Alloc, Strategy
from rpegc.core.check.wellformed import check_graph
from rpegc.syntax.parser import parse
from rpegc.syntax.printer import fmt_float, print_program
from fixtures.strategies import exec_programs, programs

FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

# The exec stage as the syntax sketch writes it (every node and statement kind), over a small graph.
SKETCH = """
rpeg.workload {B = 512, R = 1, Lp = 128, Lr = 384, dtype = bf16}
rpeg.model @actor {arch = "llama2-7b", kind = policy, trainable}
rpeg.model @ref {arch = "llama2-7b", kind = reference}
rpeg.graph @ppo {
  %X = rpeg.container tokens[B, Lp]
  %Y = rpeg.container tokens[B*R, Lp + Lr]
  %logp_ref = rpeg.container logprobs[B*R, Lr]
  %W_actor = rpeg.weights @actor
  %W_ref = rpeg.weights @ref
  rpeg.input %X, %W_ref
  rpeg.vertex @gen generation @actor reads(%W_actor, %X) writes(%Y)
  rpeg.vertex @ref_inf inference @ref reads(%W_ref, %Y) writes(%logp_ref)
  rpeg.vertex @train_actor training @actor reads(%W_actor, %Y, %logp_ref) writes(%W_actor)
  rpeg.data @gen -> @ref_inf (%Y)
  rpeg.data @ref_inf -> @train_actor (%logp_ref)
  rpeg.publish @train_actor -> @gen (%W_actor)
  rpeg.staleness {@actor = 1}
  rpeg.quantiles [(0.5, Lr/4), (0.85, Lr/2), (1.0, Lr)]
}
exec.graph @ppo steps = 2 lowered {
  exec.op @gen#0 generation @actor step 0 order 0 at (0, 0, 0) extent (1, 8, 4) dp = 16 pp = 1 tp = 2 mb = 1 reads {@actor = 0}
  exec.op @train_actor#0 training @actor step 0 order 2 at (1, 0, 0) extent (1, 4, 4) dp = 4 pp = 2 tp = 2 mb = 8 reads {@actor = 0} writes {@actor = 1}
  exec.op @gen#1.q2 generation @actor step 1 order 0 phase 2 of 3 fraction 0.35 {time = 1.25, start = 0.0, finish = 1.25}
  exec.op @ref_inf#0 inference @ref step 0 order 1 reads {@ref = 0, %Y phases 1 to 3} writes {%logp_ref}
  exec.comm @c0 step 0 order 1 (%Y) from (0,0,0) extent (1,1,4) to (0,1,0) extent (1,1,4) bytes = 81920 reads {%Y phase 2, %Y phase 3} writes {%Y}
  exec.comm @c5 step 1 order 0 weights @actor version 1 from (1,0,0) extent (1,4,4) to (0,0,0) extent (1,8,4) bytes = 10328473600
  exec.reshard @r0 step 1 order 0 @actor version 1 at (0,0,0) extent (1,8,4) from (dp = 2, pp = 2, tp = 2, mb = 4) to (dp = 4, pp = 1, tp = 2, mb = 1) bytes = 5
  exec.data @gen#0 -> @ref_inf#0 (%Y)
  exec.publish @train_actor#0 -> @gen#1.q2 (%W_actor)
  exec.order @train_actor#0 -> @gen#0
  exec.dep @gen#0 -> @c0
  exec.memory {m_eff = 8.6e10, r_peak = 0.71, feasible = true}
  exec.device 5 {peak = 6.1e10, persistent = 2.0e10, transient = 4.1e10}
  exec.device 6 {peak = 1.0, persistent = 0.5, transient = 0.5}
  exec.schedule {makespan = 12.5, score = 1.2e5, score_pen = 1.2e5, util = 0.61, p_eff = 3.2}
}
"""


def round_trip(p: Program) -> Program:
    return parse(print_program(p))


# --- properties ---------------------------------------------------------------------------------


@FAST
@given(programs())
def test_generated_programs_round_trip(p):
    assert round_trip(p) == p


@FAST
@given(exec_programs())
def test_generated_exec_programs_round_trip(p):
    assert round_trip(p) == p


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(exec_programs(exotic=True))
def test_exotic_programs_round_trip(p):
    """Quoted names, preset overrides, inf / -0.0 / huge floats, negative literals, odd device series."""
    text = print_program(p)
    assert parse(text) == p
    assert print_program(parse(text)) == text


@FAST
@given(programs(plan=True))
def test_generated_programs_are_wellformed_and_legal(p):
    """The shared strategies promise Def. A.2 graphs and P1-P8 plans; hold them to it."""
    assert [str(e) for e in check_graph(p)] == []
    assert [str(e) for e in check_plan(p)] == []


# --- the exec syntax ----------------------------------------------------------------------------


def test_sketch_exec_stage_fields():
    p = parse(SKETCH, "sketch.rpeg")
    g = p.exec
    assert g.graph == "ppo" and g.steps == 2 and g.lowered
    gen0 = g.node("gen#0")
    assert (gen0.kind, gen0.vertex, gen0.role, gen0.model, gen0.step, gen0.order) == ("op", "gen", "generation", "actor", 0, 0)
    assert gen0.alloc == Alloc((0, 0, 0), (1, 8, 4)) and gen0.strategy == Strategy(16, 1, 2, 1)
    assert gen0.version_in == (("actor", 0),) and gen0.bytes == 0
    assert g.node("train_actor#0").version_out == (("actor", 1),)
    q2 = g.node("gen#1.q2")
    assert (q2.vertex, q2.phase, q2.nphases, q2.fraction, q2.time, q2.start, q2.finish) == ("gen", 2, 3, 0.35, 1.25, 0.0, 1.25)
    c0 = g.node("c0")
    assert (c0.kind, c0.container, c0.vertex, c0.bytes) == ("comm", "Y", None, 81920)
    assert c0.src_alloc == Alloc((0, 0, 0), (1, 1, 4)) and c0.alloc == Alloc((0, 1, 0), (1, 1, 4))
    assert c0.data_in == (DataRef("Y", 2), DataRef("Y", 3)) and c0.data_out == (DataRef("Y"),)
    ref0 = g.node("ref_inf#0")
    assert ref0.version_in == (("ref", 0),) and ref0.data_in == tuple(DataRef("Y", q) for q in (1, 2, 3))
    assert ref0.data_out == (DataRef("logp_ref"),)
    c5 = g.node("c5")
    assert (c5.model, c5.version_in, c5.bytes) == ("actor", (("actor", 1),), 10328473600)
    r0 = g.node("r0")
    assert r0.src_strategy == Strategy(2, 2, 2, 4) and r0.strategy == Strategy(4, 1, 2, 1)
    assert r0.alloc == Alloc((0, 0, 0), (1, 8, 4)) and r0.version_in == (("actor", 1),)
    assert [(e.kind, e.container) for e in g.edges] == [("data", "Y"), ("pub", "W_actor"), ("order", None), ("dep", None)]
    assert g.memory == MemoryReport(
        peak=((5, 6.1e10), (6, 1.0)), persistent=((5, 2.0e10), (6, 0.5)), transient=((5, 4.1e10), (6, 0.5)),
        m_eff=8.6e10, r_peak=0.71, feasible=True,
    )
    assert g.schedule == ScheduleReport(12.5, 1.2e5, 1.2e5, 0.61, 3.2)
    assert g.nodes[0].loc.line == 22 and g.nodes[0].loc.col == 3
    assert round_trip(p) == p


def test_exec_node_lines_are_canonical():
    p = parse(SKETCH)
    lines = print_program(p).splitlines()
    assert "  exec.graph" not in lines and "exec.graph @ppo steps = 2 lowered {" in lines
    assert (
        "  exec.op @gen#0 generation @actor step 0 order 0 at (0, 0, 0) extent (1, 8, 4) "
        "dp = 16 pp = 1 tp = 2 mb = 1 reads {@actor = 0}"
    ) in lines
    assert (
        "  exec.comm @c5 step 1 order 0 weights @actor version 1 from (1, 0, 0) extent (1, 4, 4) "
        "to (0, 0, 0) extent (1, 8, 4) bytes = 10328473600"
    ) in lines
    assert (
        "  exec.reshard @r0 step 1 order 0 @actor version 1 at (0, 0, 0) extent (1, 8, 4) "
        "from (dp = 2, pp = 2, tp = 2, mb = 4) to (dp = 4, pp = 1, tp = 2, mb = 1) bytes = 5"
    ) in lines
    assert "  exec.device 5 {peak = 6.1e10, persistent = 2e10, transient = 4.1e10}" in lines


def test_op_vertex_is_implied_by_its_id_unless_it_differs():
    p = parse(SKETCH)
    node = p.exec.node("gen#0")
    assert " vertex @" not in print_program(p).split("exec.graph")[1]
    other = replace(p, exec=replace(p.exec, nodes=(node.with_(vertex="ref_inf"),) + p.exec.nodes[1:]))
    text = print_program(other)
    assert "exec.op @gen#0 vertex @ref_inf generation @actor" in text
    assert parse(text) == other


def test_device_series_in_different_orders_print_one_value_per_line():
    mem = MemoryReport(peak=((1, 1.0), (0, 2.0)), persistent=((0, 3.0), (1, 4.0)), transient=(), m_eff=1.0,
                       r_peak=0.5, feasible=False)
    p = parse(SKETCH)
    q = replace(p, exec=replace(p.exec, memory=mem))
    text = print_program(q)
    assert "exec.device 1 {peak = 1.0}" in text and "exec.device 0 {persistent = 3.0}" in text
    assert parse(text).exec.memory == mem


def test_a_thousand_node_exec_graph_round_trips():
    p = parse(SKETCH)
    nodes = tuple(
        ExecNode(id=f"gen#{k}", kind="op", step=k, order=0, vertex="gen", role="generation", model="actor",
                 alloc=Alloc((0, 0, 0), (1, 8, 4)), strategy=Strategy(16, 1, 2, 1), version_in=(("actor", k),),
                 time=0.1 * k, start=float(k), finish=k + 0.1 * k)
        for k in range(1200)
    )
    edges = tuple(ExecEdge(f"gen#{k}", f"gen#{k + 1}", "order") for k in range(1199))
    big = replace(p, exec=ExecGraph("ppo", 1200, nodes, edges, lowered=True))
    text = print_program(big)
    assert text.count("\n  exec.op ") == 1200
    assert parse(text) == big


# --- the static graph, models and floats --------------------------------------------------------


def test_graph_block_is_aligned_and_ordered():
    text = print_program(parse(SKETCH))
    assert "  %X        = rpeg.container tokens[B, Lp]" in text
    assert "  %W_actor  = rpeg.weights @actor" in text
    assert "  rpeg.vertex @gen         generation @actor reads(%W_actor, %X) writes(%Y)" in text
    assert "  rpeg.quantiles [(0.5, Lr/4), (0.85, Lr/2), (1.0, Lr)]" in text
    order = [line.split()[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert order[:4] == ["rpeg.workload", "rpeg.model", "rpeg.model", "rpeg.graph"]


def test_models_print_presets_overrides_and_explicit_arch():
    wl = Workload(8, 1, 16, 16)
    base = lookup("llama2-7b")
    models = (
        Model("a", "policy", True, base, preset="llama2-7b"),
        Model("b", "critic", True, replace(base, layers=16), preset="llama2-7b"),
        Model("c", "reward", False, Arch(4, 64, 128, 100, 4, 2)),
        Model("d", "reference", False, base, preset="llama-7b"),  # an alias stays as written
    )
    p = Program(wl, models)
    text = print_program(p)
    assert 'rpeg.model @a {arch = "llama2-7b", kind = policy, trainable}' in text
    assert 'rpeg.model @b {arch = "llama2-7b", layers = 16, kind = critic, trainable}' in text
    assert "rpeg.model @c {layers = 4, hidden = 64, ffn = 128, vocab = 100, heads = 4, kv_heads = 2, kind = reward}" in text
    assert parse(text) == p


def test_kv_heads_defaults_to_heads():
    p = parse("rpeg.workload {B = 1, R = 1, Lp = 1, Lr = 1}\n"
              "rpeg.model @m {layers = 2, hidden = 64, ffn = 128, vocab = 10, heads = 4, kind = policy}")
    assert p.models[0].arch.kv_heads == 4 and p.models[0].preset is None and not p.models[0].trainable
    assert p.workload.dtype == "bf16"


def test_floats_print_to_identical_values():
    for x in (0.1 + 0.2, 8.6e10, 1e-300, 5e-324, -0.0, 1.0, 2.0**70, float("inf"), float("-inf"), 12345678901234567.0):
        text = fmt_float(x)
        assert float(text) == x and ("." in text or "e" in text or "inf" in text)
    assert fmt_float(86000000000.0) == "8.6e10" and fmt_float(0.35) == "0.35"


def test_quoted_names_and_negative_literals_round_trip():
    p = parse(SKETCH)
    g = p.graph
    odd = replace(g.containers[0], name="x y\"z", dims=(BinOp("-", Sym("Lp"), Num(-3)), BinOp("*", Num(-2), Sym("B"))))
    q = replace(p, graph=replace(g, name="my graph", containers=g.containers + (odd,)),
                exec=replace(p.exec, graph="my graph"))
    text = print_program(q)
    assert '%"x y\\"z" = rpeg.container tokens[Lp - -3, -2*B]' in text and 'rpeg.graph @"my graph" {' in text
    assert parse(text) == q


def test_printing_is_deterministic():
    p = parse(SKETCH)
    assert print_program(p) == print_program(parse(SKETCH))
