"""Legality of an execution plan: Def. A.5 (|sigma| = Pd*Pp*Pt) and rules P1-P8 (App. A-J2a).

Spec: cost-model.md Section 1.4. Per placement of vertex v invoking model m with L_m layers, on a
cluster of N_r racks x N_n nodes x N_g GPUs, workload B prompts x R rollouts:

  P1  tp | N_g                                    (a TP group stays inside one node)
  P2  pp | L_m, pp = 1 or even
  P3  dp | B (the paper's rule: B, not B*R), dp <= N_r*N_n*N_g
  P4  pp = 1  =>  mb = 1
  P5  pp > 1  =>  mb | B_local, mb >= pp, B_local/mb >= 8, with B_local = B*R/dp
  P8  s = min(pp, floor(N_g/tp)) stages per node, s | pp (each GPU hosts exactly one shard)
  P6  the allocation lies inside one rack or spans whole racks
  P7  the origin is a multiple of the extent in every dimension

Reading of P6 (the paper's n_need = dp * pp/s over-counts when several replicas share a node, which
P3 explicitly permits; taken literally it would reject the spec's own worked example, dp = 2 on one
8-GPU node). Shards are packed in nested order, TP innermost on consecutive GPUs of a node, then PP,
then DP, so an allocation of P = dp*pp*tp GPUs is legal in exactly one shape, `layout_extent`:
  - P <= N_g: a block of one node, extent (1, 1, P), with P | N_g so aligned blocks tile the node;
  - P >  N_g: whole nodes, n_need = P/N_g (which equals the paper's dp*pp/s whenever a replica fills
    at least one node), extent (1, n_need, N_g) if n_need <= N_n, else whole racks
    (n_need/N_n, N_n, N_g) if N_n | n_need and n_need/N_n <= N_r. A replica that is smaller than a
    node must not straddle two nodes (pp*tp | N_g), which is the exact-packing half of P8.
"""

from __future__ import annotations

from typing import Optional

from rpegc.core.check.fusion_rules import check_plan_fusions
from rpegc.core.ir.errors import RpegError
from rpegc.core.ir.program import VERIFY, Model, Placement, Program, Workload
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy

MIN_MICROBATCH_SEQUENCES = 8  # P5: B_local/mb >= 8 keeps the SMs busy
_DIMS = ("rack", "node", "GPU")


# --- shared predicates (one implementation for check_placement, is_legal and the candidates) ---


def stages_per_node(pp: int, tp: int, gpus: int) -> int:
    """s = min(P_p, floor(N_g/P_t)): pipeline stages one node hosts."""
    return min(pp, gpus // tp)


def p1_ok(tp: int, cluster: Cluster) -> bool:
    return cluster.gpus % tp == 0


def p2_ok(pp: int, layers: int) -> bool:
    return layers % pp == 0 and (pp == 1 or pp % 2 == 0)


def p3_ok(dp: int, workload: Workload, cluster: Cluster) -> bool:
    return workload.B % dp == 0 and dp <= cluster.num_devices


def p4_ok(pp: int, mb: int) -> bool:
    return pp != 1 or mb == 1


def p5_ok(dp: int, pp: int, mb: int, workload: Workload) -> bool:
    if pp == 1:
        return True
    br = workload.B * workload.R
    if br % dp:
        return False
    local = br // dp
    return local % mb == 0 and mb >= pp and local // mb >= MIN_MICROBATCH_SEQUENCES


def p8_ok(pp: int, tp: int, cluster: Cluster) -> bool:
    """s | P_p (meaningful only when P1 holds, so that s >= 1)."""
    s = stages_per_node(pp, tp, cluster.gpus)
    return s >= 1 and pp % s == 0


def layout_extent(dp: int, pp: int, tp: int, cluster: Cluster) -> Optional[tuple[int, int, int]]:
    """The one extent (P6, P8 packing) an allocation of dp*pp*tp GPUs may have, or None if none fits."""
    n_g = cluster.gpus
    size = dp * pp * tp
    if size <= n_g:
        return (1, 1, size) if n_g % size == 0 else None
    if size % n_g or (pp * tp < n_g and n_g % (pp * tp)):
        return None
    nodes = size // n_g
    if nodes <= cluster.nodes:
        return (1, nodes, n_g)
    if nodes % cluster.nodes == 0 and nodes // cluster.nodes <= cluster.racks:
        return (nodes // cluster.nodes, cluster.nodes, n_g)
    return None


def strategy_ok(s: Strategy, layers: int, workload: Workload, cluster: Cluster) -> bool:
    """P1-P5 and P8 (everything that does not look at the allocation's position)."""
    return (
        min(s.dp, s.pp, s.tp, s.mb) >= 1
        and p1_ok(s.tp, cluster)
        and p2_ok(s.pp, layers)
        and p3_ok(s.dp, workload, cluster)
        and p4_ok(s.pp, s.mb)
        and p5_ok(s.dp, s.pp, s.mb, workload)
        and p8_ok(s.pp, s.tp, cluster)
    )


def inside(alloc: Alloc, cluster: Cluster) -> bool:
    dims = (cluster.racks, cluster.nodes, cluster.gpus)
    return all(o >= 0 and e >= 1 and o + e <= n for o, e, n in zip(alloc.origin, alloc.extent, dims))


def aligned(alloc: Alloc) -> bool:
    """P7: every origin coordinate is a multiple of the extent in that dimension."""
    return all(e >= 1 and o % e == 0 for o, e in zip(alloc.origin, alloc.extent))


def is_legal(alloc: Alloc, strategy: Strategy, layers: int, workload: Workload, cluster: Cluster) -> bool:
    """True iff `check_placement` reports nothing (fast path for the optimizer, no messages built)."""
    return (
        strategy_ok(strategy, layers, workload, cluster)
        and inside(alloc, cluster)
        and aligned(alloc)
        and alloc.extent == layout_extent(strategy.dp, strategy.pp, strategy.tp, cluster)
    )


# --- located messages --------------------------------------------------------------------------


def check_plan(p: Program) -> list[RpegError]:
    """Def. A.5 and P1-P8 for every placement of `p.plan`, plus plan/graph/cluster consistency."""
    plan = p.plan
    if plan is None:
        return []
    errors: list[RpegError] = []
    g, c = p.graph, p.cluster
    if g is None:
        errors.append(RpegError(plan.loc, f"plan @{plan.name} is for graph @{plan.graph}, but the module has no "
                                          "graph; add the rpeg.graph the plan places"))
    elif plan.graph != g.name:
        errors.append(RpegError(plan.loc, f"plan @{plan.name} is for graph @{plan.graph}, but the module's graph is "
                                          f"@{g.name}; write 'for @{g.name}'"))
    if c is None:
        errors.append(RpegError(plan.loc, f"plan @{plan.name} runs on cluster @{plan.cluster}, but the module has no "
                                          "cluster; add an rpeg.cluster"))
    elif plan.cluster != c.name:
        errors.append(RpegError(plan.loc, f"plan @{plan.name} runs on cluster @{plan.cluster}, but the module's "
                                          f"cluster is @{c.name}; write 'on @{c.name}'"))
    if g is None:
        return errors
    vertices = {v.name: v for v in g.vertices}
    models = {m.name: m for m in p.models}
    placed: set[str] = set()
    for pl in plan.placements:
        if pl.vertex not in vertices:
            errors.append(RpegError(pl.loc, f"plan places unknown vertex '@{pl.vertex}'; graph @{g.name} has "
                                            f"{_names(vertices)} — remove the placement or fix the name"))
            continue
        if pl.vertex in placed:
            errors.append(RpegError(pl.loc, f"vertex @{pl.vertex} is placed twice; a plan gives each vertex "
                                            "exactly one placement — remove one"))
            continue
        placed.add(pl.vertex)
        model = models.get(vertices[pl.vertex].model)
        if c is not None and model is not None:
            errors += check_placement(pl, model, p.workload, c)
        errors += check_training_fields(pl, vertices[pl.vertex].role, p.workload)
    for pl in plan.placements:
        if pl.vertex in vertices and vertices[pl.vertex].role == VERIFY:
            errors.append(RpegError(pl.loc, f"@{pl.vertex} is a verify vertex: it runs on host processes, not on "
                                            f"devices; place it with '@{pl.vertex} pool = N'"))
    errors += _check_pools(plan, vertices, placed)
    for name, v in vertices.items():
        if name not in placed:
            how = "pool = N" if v.role == VERIFY else "at (...) extent (...) dp = .. pp = .. tp = .. mb = .."
            errors.append(RpegError(plan.loc, f"vertex @{name} has no placement in plan @{plan.name}; add "
                                              f"'@{name} {how}'"))
    return errors + check_plan_fusions(p)


def _check_pools(plan, vertices: dict, placed: set[str]) -> list[RpegError]:
    """A pool places a verify vertex once, on one or more host processes (the host's cores bound it where the cost
    model prices it: cost/host.py)."""
    errors = []
    for pool in plan.pools:
        v = vertices.get(pool.vertex)
        if v is None:
            errors.append(RpegError(pool.loc, f"plan gives a pool to unknown vertex '@{pool.vertex}'; remove it or "
                                              "fix the name"))
        elif v.role != VERIFY:
            errors.append(RpegError(pool.loc, f"@{pool.vertex} is a {v.role} vertex: it runs on devices; place it "
                                              "with 'at (...) extent (...) dp = ..', a pool places verify vertices"))
        elif pool.vertex in placed:
            errors.append(RpegError(pool.loc, f"vertex @{pool.vertex} is placed twice; keep one placement"))
        elif pool.size < 1:
            errors.append(RpegError(pool.loc, f"pool = {pool.size} of @{pool.vertex}: a pool has at least one "
                                              "process"))
        placed.add(pool.vertex)
    return errors


def check_placement(placement: Placement, model: Model, workload: Workload, cluster: Cluster) -> list[RpegError]:
    """Every violated rule of one placement, each its own error at the placement."""
    a, s = placement.alloc, placement.strategy
    where = f"@{placement.vertex}"
    messages = _degree_messages(s, model, workload, cluster) + _allocation_messages(a, s, cluster)
    return [RpegError(placement.loc, f"{where}: {m}") for m in messages]


def check_training_fields(placement: Placement, role: str, workload: Workload) -> list[RpegError]:
    """Training fields belong to training vertices, and mixed precision to a 16-bit workload (training.resolve)."""
    spec = placement.strategy.train
    if role != "training":
        if spec.empty:
            return []
        stated = ", ".join(f"{k} = {v}" for k, v in spec.items())
        return [RpegError(placement.loc, f"@{placement.vertex} is a {role} vertex; {stated} describes how a training "
                                         "operator trains: remove it")]
    try:
        workload.training(spec, placement.loc)
    except RpegError as err:
        return [RpegError(placement.loc if spec.precision else workload.loc, f"@{placement.vertex}: {err.message}")]
    return []


def _degree_messages(s: Strategy, model: Model, workload: Workload, cluster: Cluster) -> list[str]:
    bad = [f"{k} = {v}" for k, v in (("dp", s.dp), ("pp", s.pp), ("tp", s.tp), ("mb", s.mb)) if v < 1]
    if bad:
        return [f"{', '.join(bad)}: parallel degrees and the microbatch count must be positive integers"]
    out = []
    layers, n_g = model.arch.layers, cluster.gpus
    if not p1_ok(s.tp, cluster):
        out.append(f"P1: tp = {s.tp} does not divide the {n_g} GPUs of a node (a tensor-parallel group stays "
                   f"inside one node); use tp in {_set(divisors(n_g))}")
    if not p2_ok(s.pp, layers):
        ok = [d for d in divisors(layers) if d == 1 or d % 2 == 0]
        why = (f"does not divide the {layers} layers of @{model.name}" if layers % s.pp
               else "is odd; a pipeline is 1 stage or an even number of stages")
        out.append(f"P2: pp = {s.pp} {why}; use pp in {_set(ok)}")
    if workload.B % s.dp:
        out.append(f"P3: dp = {s.dp} does not divide the batch B = {workload.B} (every replica gets the same "
                   f"number of prompts); use a divisor of {workload.B}, e.g. {_some(divisors(workload.B))}")
    elif s.dp > cluster.num_devices:
        out.append(f"P3: dp = {s.dp} exceeds the {cluster.num_devices} GPUs of cluster @{cluster.name}; "
                   f"use dp <= {cluster.num_devices}")
    if not p4_ok(s.pp, s.mb):
        out.append(f"P4: mb = {s.mb} with pp = 1; microbatching only serves a pipeline, so set mb = 1")
    if s.pp > 1 and (workload.B * workload.R) % s.dp == 0 and not p5_ok(s.dp, s.pp, s.mb, workload):
        out.append(_p5_message(s, workload))
    if p1_ok(s.tp, cluster) and not p8_ok(s.pp, s.tp, cluster):
        st = stages_per_node(s.pp, s.tp, n_g)
        out.append(f"P8: a node hosts s = min(pp, N_g/tp) = min({s.pp}, {n_g // s.tp}) = {st} pipeline stages, "
                   f"which does not divide pp = {s.pp}, so the last node of a replica would be partly empty; "
                   f"use pp as a multiple of {st} or change tp")
    return out


def _p5_message(s: Strategy, workload: Workload) -> str:
    local = workload.B * workload.R // s.dp
    problems = []
    if local % s.mb:
        problems.append(f"mb = {s.mb} does not divide the local batch B*R/dp = {local}")
    if s.mb < s.pp:
        problems.append(f"mb = {s.mb} is below pp = {s.pp}, too few microbatches to fill the pipeline")
    if local // s.mb < MIN_MICROBATCH_SEQUENCES:
        problems.append(f"a microbatch of B*R/(dp*mb) = {local}/{s.mb} holds fewer than "
                        f"{MIN_MICROBATCH_SEQUENCES} sequences")
    choices = microbatch_choices(s.dp, s.pp, workload)
    if choices:
        fix = (f"use a divisor of {local} that is >= pp = {s.pp} and at most {local}/{MIN_MICROBATCH_SEQUENCES}, "
               f"e.g. {_some(choices)}")
    else:
        fix = (f"no mb satisfies P5 for dp = {s.dp}, pp = {s.pp} (it needs B*R/dp = {local} >= "
               f"{MIN_MICROBATCH_SEQUENCES}*pp = {MIN_MICROBATCH_SEQUENCES * s.pp}); lower dp or pp")
    return f"P5: {'; '.join(problems)}; {fix}"


def microbatch_choices(dp: int, pp: int, workload: Workload) -> list[int]:
    """All mb that satisfy P4/P5 for (dp, pp), ascending."""
    if pp == 1:
        return [1]
    br = workload.B * workload.R
    if br % dp:
        return []
    local = br // dp
    return [m for m in divisors(local) if m >= pp and local // m >= MIN_MICROBATCH_SEQUENCES]


def _allocation_messages(a: Alloc, s: Strategy, cluster: Cluster) -> list[str]:
    dims = (cluster.racks, cluster.nodes, cluster.gpus)
    shape = f"{cluster.racks}x{cluster.nodes}x{cluster.gpus}"
    if any(e < 1 for e in a.extent) or any(o < 0 for o in a.origin):
        return [f"allocation at {_tup(a.origin)} extent {_tup(a.extent)} needs a non-negative origin and a "
                "positive extent in every dimension"]
    out = []
    if not inside(a, cluster):
        over = [_DIMS[i] for i in range(3) if a.origin[i] + a.extent[i] > dims[i]]
        out.append(f"allocation at {_tup(a.origin)} extent {_tup(a.extent)} leaves cluster @{cluster.name} "
                   f"({shape} racks x nodes x GPUs) in the {', '.join(over)} dimension; move it inside or shrink it")
    if min(s.dp, s.pp, s.tp) < 1:
        return out
    size = s.dp * s.pp * s.tp
    if a.size != size:
        out.append(f"the allocation holds {a.size} GPUs but dp*pp*tp = {s.dp}*{s.pp}*{s.tp} = {size} (Def. A.5: "
                   f"|sigma| = dp*pp*tp, one shard per GPU); change the extent or the degrees")
    elif s.tp <= cluster.gpus and cluster.gpus % s.tp == 0 and p8_ok(s.pp, s.tp, cluster):
        out += _shape_messages(a, s, cluster)
    if not aligned(a):
        snapped = tuple(o - o % e for o, e in zip(a.origin, a.extent))
        off = [_DIMS[i] for i in range(3) if a.origin[i] % a.extent[i]]
        out.append(f"P7: origin {_tup(a.origin)} is not a multiple of the extent {_tup(a.extent)} in the "
                   f"{', '.join(off)} dimension, so allocations would not tile the device space; use an aligned "
                   f"origin such as {_tup(snapped)}")
    return out


def _shape_messages(a: Alloc, s: Strategy, cluster: Cluster) -> list[str]:
    """P6/P8 layout of a correctly sized allocation (P1 and the stages-per-node part of P8 hold)."""
    n_g, n_n = cluster.gpus, cluster.nodes
    size = s.dp * s.pp * s.tp
    want = layout_extent(s.dp, s.pp, s.tp, cluster)
    if want == a.extent:
        return []
    if size <= n_g and n_g % size:
        return [f"P6: an allocation inside one node takes a divisor of the node's {n_g} GPUs so that aligned "
                f"allocations tile the node; dp*pp*tp = {size} is not one — use dp*pp*tp in {_set(divisors(n_g))}"]
    if size > n_g and size % n_g:
        return [f"P6: an allocation larger than one node must consist of whole nodes; dp*pp*tp = {size} is not a "
                f"multiple of the {n_g} GPUs per node"]
    if size > n_g and s.pp * s.tp < n_g and n_g % (s.pp * s.tp):
        return [f"P8: a replica of pp*tp = {s.pp * s.tp} GPUs would straddle two nodes of {n_g} GPUs; with several "
                f"replicas per node, pp*tp must divide {n_g}"]
    if want is None:
        nodes = size // n_g
        return [f"P6: the allocation needs n_need = {nodes} nodes, which neither fits inside one rack of {n_n} "
                f"nodes nor fills whole racks ({nodes} is not a multiple of {n_n} or needs more than "
                f"{cluster.racks} racks); use fewer GPUs or a multiple of {n_n * n_g} GPUs"]
    return [f"P6: {size} GPUs must be laid out as extent {_tup(want)} (a block of one node, whole nodes inside a "
            f"rack, or whole racks, with TP innermost, then PP, then DP), not {_tup(a.extent)}; use extent "
            f"{_tup(want)}"]


# --- small helpers -----------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _some(xs: list[int], k: int = 6) -> str:
    return ", ".join(str(x) for x in xs[:k]) + (", ..." if len(xs) > k else "")


def _set(xs: list[int]) -> str:
    return "{" + _some(xs, 8) + "}"


def _tup(t: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(x) for x in t) + ")"


def _names(d: dict) -> str:
    return ", ".join(f"@{n}" for n in d) or "no vertices"

