"""The plain-data form of the unrolled graph G-bar and the executable DAG G-hat.

Paper: App. A-F (Def. A.7, Alg. 3) and A-G (Def. A.8, Alg. 4). One structure serves every stage:
`unroll` creates Op nodes and typed edges (data, pub, order); `split-quantiles` replaces Op nodes by
phase sub-nodes; `insert-comm` / `insert-reshard` turn data and publication edges into Comm / Reshard
nodes and plain `dep` edges. When lowering is complete every edge is a `dep` edge.
`annotate-cost` and `schedule` fill `time`, `start`, `finish` and the graph-level reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from rpegc.core.ir.errors import Loc
from rpegc.core.ir.frozen import first_by_name, loc_field
from rpegc.core.ir.geometry import Alloc, Strategy

NODE_KINDS = ("op", "comm", "reshard")
EDGE_KINDS = ("data", "pub", "order", "dep")


@dataclass(frozen=True)
class DataRef:
    """A data container of the node's own step that a node reads or writes: one quantile phase, or the
    whole container (phase None). Data never crosses a step. Where the copy lives follows from the node:
    an Op reads and writes on its allocation; a Comm reads on its source and writes on its destination."""

    container: str
    phase: Optional[int] = None


@dataclass(frozen=True)
class ExecNode:
    id: str  # unique in the graph; op nodes are "<vertex>#<step>" or "<vertex>#<step>.q<phase>"
    kind: str  # NODE_KINDS
    step: int
    order: int  # topological index of the RPEG vertex (for comm/reshard: of the consumer)
    vertex: Optional[str] = None  # op: the RPEG vertex
    role: Optional[str] = None  # op: generation | inference | training | verify
    model: Optional[str] = None  # op: model invoked; reshard and weight comm: model moved
    container: Optional[str] = None  # comm: the container moved
    phase: Optional[int] = None  # quantile sub-node index q (1-based) ...
    nphases: Optional[int] = None  # ... of Q
    alloc: Optional[Alloc] = None  # op: sigma(v); comm/reshard: destination allocation (None: the host's pool)
    strategy: Optional[Strategy] = None  # op: its plan; reshard: the target layout
    src_alloc: Optional[Alloc] = None  # comm/reshard: source allocation
    src_strategy: Optional[Strategy] = None  # reshard: the source layout
    bytes: int = 0  # comm/reshard payload; 0 for op nodes
    pool: Optional[int] = None  # verify op: the host processes it runs on (its Pool's size); alloc and strategy None
    shares: tuple[int, ...] = ()  # on the pool (verify op, comm into it): devices whose cores it shares, held too
    fraction: Optional[float] = None  # quantile phase share f_q - f_{q-1} (phase comm and sub-nodes)
    version_in: tuple[tuple[str, int], ...] = ()  # op: parameter version read per model; comm/reshard: version moved
    version_out: tuple[tuple[str, int], ...] = ()  # training op: version produced (k + 1)
    # Data bindings, written by the lowering when it creates the node (the weights it reads and writes are
    # version_in / version_out: an Op on its allocation; a Comm or Reshard moves version_in from src_alloc
    # to alloc).
    data_in: tuple[DataRef, ...] = ()
    data_out: tuple[DataRef, ...] = ()
    time: Optional[float] = None
    start: Optional[float] = None
    finish: Optional[float] = None
    loc: Loc = loc_field()

    def with_(self, **changes) -> "ExecNode":
        return replace(self, **changes)


FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True, order=True)
class Microtask:
    """Member `member` (an index into a fusion's members)'s forward (F) or backward (B, recomputation included) of
    microbatch `micro` on pipeline stage `stage` (docs/stage-fusion.md)."""

    member: int
    kind: str
    micro: int
    stage: int


Schedule = tuple[tuple[Microtask, ...], ...]  # per pipeline stage, the order it runs its microtasks in
MICROTASK_PATTERN = re.compile(r"([FB])([0-9]+)\.([0-9]+)")


def microtask_text(t: Microtask) -> str:
    """How every form writes a microtask (its stage is the list's): "F1.3" is member 1's forward of microbatch 3."""
    return f"{t.kind}{t.member}.{t.micro}"


def microtask_of(text: str, stage: int) -> Microtask:
    """The microtask `text` (as `microtask_text` writes it) in the list of `stage`; ValueError if it is not one."""
    match = MICROTASK_PATTERN.fullmatch(text)
    if match is None:
        raise ValueError(f"'{text}' is not a microtask such as F0.1 (member 0's forward of microbatch 1)")
    return Microtask(int(match[2]), match[1], int(match[3]), stage)


@dataclass(frozen=True)
class ExecFusion:
    """Training Op nodes of one step run as one fused operator (`fuse-stages`): every stage of their devices runs
    `stages[s]`, the members' microtasks interleaved. The members keep their nodes (bindings, versions, edges); they
    start together and finish together, after the fused time."""

    id: str
    members: tuple[str, ...]  # Op node ids; Microtask.member indexes this
    stages: Schedule
    loc: Loc = loc_field()


@dataclass(frozen=True)
class ExecEdge:
    src: str
    dst: str
    kind: str = "dep"  # EDGE_KINDS
    container: Optional[str] = None  # data and pub edges
    loc: Loc = loc_field()


@dataclass(frozen=True)
class MemoryReport:
    """Per-device peaks (bytes, keyed by flat device id) and the feasibility verdict (spec 6.6)."""

    peak: tuple[tuple[int, float], ...]
    persistent: tuple[tuple[int, float], ...]
    transient: tuple[tuple[int, float], ...]
    m_eff: float
    r_peak: float
    feasible: bool


@dataclass(frozen=True)
class ScheduleReport:
    """Makespan and scores of a scheduled graph (spec 7)."""

    makespan: float
    score: float
    score_pen: float
    util: float
    p_eff: float


@dataclass(frozen=True)
class ExecGraph:
    graph: str  # name of the RPEG it was unrolled from
    steps: int  # K_eval
    nodes: tuple[ExecNode, ...]
    edges: tuple[ExecEdge, ...]
    lowered: bool = False  # set by insert-reshard once Comm and Reshard insertion is complete
    memory: Optional[MemoryReport] = None
    schedule: Optional[ScheduleReport] = None
    fusions: tuple[ExecFusion, ...] = ()
    loc: Loc = loc_field()

    def node(self, node_id: str) -> ExecNode:
        return first_by_name(self, "nodes", self.nodes, lambda n: n.id)[node_id]
