"""The `exec` dialect: the unrolled graph G-bar and the executable DAG G-hat.

Paper: App. A-F (Def. A.7, Alg. 3), A-G (Def. A.8, Alg. 4) and spec 6-7 (memory and schedule
reports); one op per concept of `rpegc/core/ir/exec_graph.py`. Nodes (`exec.op`, `exec.comm`,
`exec.reshard`) declare their id in `ident`; edges (`exec.data`, `exec.publish`, `exec.order`,
`exec.dep`) name their endpoints by SymbolRefAttr. Analysis results (`time`, `start`, `finish`)
are discardable FloatAttr attributes on node ops, so a pass may drop them without touching the
node. `exec.memory` stores the per-device peaks of up to thousands of devices as dense arrays.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    DenseArrayBase,
    FloatAttr,
    I64,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
)
from xdsl.dialects.builtin import IntAttr
from xdsl.ir import Dialect, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition, irdl_op_definition, opt_prop_def, prop_def, region_def, traits_def
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import HasParent, NoTerminator
from xdsl.utils.exceptions import VerifyException

from rpegc.core.ir.exec_graph import MICROTASK_PATTERN, DataRef
from rpegc.core.ir.program import ROLES
from rpegc.dialects.attrs import AllocAttr, I64Attr, ModelIntAttr, StrategyAttr, Text, TrainAttr, int_of, parse_text
from rpegc.dialects.rpeg import LocatedOp, check_member

# Discardable analysis results written by annotate-cost (time) and schedule (start, finish).
RESULT_ATTRS = ("time", "start", "finish")

DeviceIds = DenseArrayBase[I64]
# Not a dense f64 array: xDSL prints large integral floats there as hex, which its parser rejects.
DeviceBytes = ArrayAttr[FloatAttr]


@irdl_attr_definition
class DataRefAttr(ParametrizedAttribute):
    """A container of the node's step that a node reads or writes: `#exec.data_ref<"Y">` (whole) or
    `#exec.data_ref<"Y" phase 2>` (one quantile phase; phase 0 stands for the whole container)."""

    name = "exec.data_ref"
    container: StringAttr
    phase: IntAttr

    @staticmethod
    def from_ref(ref: DataRef) -> "DataRefAttr":
        return DataRefAttr(StringAttr(ref.container), IntAttr(ref.phase or 0))

    def to_ref(self) -> DataRef:
        return DataRef(self.container.data, self.phase.data or None)

    def verify(self) -> None:
        if self.phase.data < 0:
            raise VerifyException(f"{self.name}: phase {self.phase.data} must be >= 1 (0: the whole container)")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string_literal(self.container.data)
            if self.phase.data:
                printer.print_string(f" phase {self.phase.data}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[StringAttr, IntAttr]:
        with parser.in_angle_brackets():
            container = parse_text(parser)
            phase = 0
            if parser.parse_optional_keyword("phase") is not None:
                phase = parser.parse_integer(allow_boolean=False, allow_negative=False)
        return StringAttr(container), IntAttr(phase)


@irdl_op_definition
class ExecGraphOp(LocatedOp):
    """`exec.graph`: the DAG unrolled from rpeg graph `graph` over `steps` steps (K_eval)."""

    name = "exec.graph"
    graph = prop_def(SymbolRefAttr)
    steps = prop_def(I64Attr)
    lowered = opt_prop_def(UnitAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())


class NodeFields(LocatedOp):
    """Every field of `ExecNode` except `kind` (the op name) and the discardable results."""

    ident = prop_def(Text)
    step = prop_def(I64Attr)
    order = prop_def(I64Attr)
    vertex = opt_prop_def(SymbolRefAttr)
    role = opt_prop_def(StringAttr)
    model = opt_prop_def(SymbolRefAttr)
    container = opt_prop_def(Text)
    phase = opt_prop_def(I64Attr)
    nphases = opt_prop_def(I64Attr)
    alloc = opt_prop_def(AllocAttr)  # omitted for a verify op, and on a comm's host-pool side
    strategy = opt_prop_def(StrategyAttr)
    train = opt_prop_def(TrainAttr)  # an op's training fields, when its placement states any
    src_alloc = opt_prop_def(AllocAttr)
    src_strategy = opt_prop_def(StrategyAttr)
    bytes = opt_prop_def(I64Attr)  # omitted when 0
    pool = opt_prop_def(I64Attr)  # a verify op: its worker processes on the host (its rpeg.pool's size)
    shares = opt_prop_def(ArrayAttr[I64Attr])  # on the pool: devices whose host cores it shares; omitted when none
    fraction = opt_prop_def(FloatAttr)
    version_in = opt_prop_def(ArrayAttr[ModelIntAttr])  # omitted when empty
    version_out = opt_prop_def(ArrayAttr[ModelIntAttr])
    data_in = opt_prop_def(ArrayAttr[DataRefAttr])  # omitted when empty
    data_out = opt_prop_def(ArrayAttr[DataRefAttr])
    traits = traits_def(HasParent(ExecGraphOp))

    def verify_(self) -> None:
        if self.role is not None:
            check_member(self.name, "role", self.role.data, ROLES)
        if (self.phase is None) != (self.nphases is None):
            raise VerifyException(f"{self.name}: 'phase' and 'nphases' must be given together")
        if self.phase is not None and self.nphases is not None:
            phase, nphases = int_of(self.phase), int_of(self.nphases)
            if not 1 <= phase <= nphases:
                raise VerifyException(f"{self.name}: phase {phase} is outside 1..{nphases}")
        if self.pool is not None and int_of(self.pool) < 1:
            raise VerifyException(f"{self.name}: pool {int_of(self.pool)} must be >= 1 (worker processes)")
        if self.shares is not None:
            if self.alloc is not None:
                raise VerifyException(f"{self.name}: 'shares' names devices whose cores a verifier pool shares; only "
                                      "a node on the pool (a verify op, a transfer into its pool: no 'alloc') has it")
            if any(int_of(d) < 0 for d in self.shares.data):
                raise VerifyException(f"{self.name}: shares {[int_of(d) for d in self.shares.data]} must be device "
                                      "ids >= 0")
        for key in RESULT_ATTRS:
            value = self.attributes.get(key)
            if value is not None and not isinstance(value, FloatAttr):
                raise VerifyException(f"{self.name}: '{key}' must be a float attribute")


@irdl_op_definition
class OpNodeOp(NodeFields):
    """`exec.op`: one step (or quantile phase) of an RPEG vertex; a verify vertex's runs on its host `pool`, with no
    `alloc` or `strategy`."""

    name = "exec.op"

    def verify_(self) -> None:
        super().verify_()
        if self.vertex is None or self.role is None or self.model is None:
            raise VerifyException(f"{self.name}: an op node needs 'vertex', 'role' and 'model'")


@irdl_op_definition
class CommOp(NodeFields):
    """`exec.comm`: a transfer of a data container or of published weights."""

    name = "exec.comm"

    def verify_(self) -> None:
        super().verify_()
        if self.container is None and self.model is None:
            raise VerifyException(f"{self.name}: a comm node moves a 'container' or a 'model'")


@irdl_op_definition
class ReshardOp(NodeFields):
    """`exec.reshard`: a change of weight layout of `model` from src_strategy to strategy."""

    name = "exec.reshard"

    def verify_(self) -> None:
        super().verify_()
        if self.model is None:
            raise VerifyException(f"{self.name}: a reshard node needs 'model'")


class EdgeFields(LocatedOp):
    src = prop_def(SymbolRefAttr)
    dst = prop_def(SymbolRefAttr)
    container = opt_prop_def(Text)
    traits = traits_def(HasParent(ExecGraphOp))


class ContainerEdgeFields(EdgeFields):
    def verify_(self) -> None:
        if self.container is None:
            raise VerifyException(f"{self.name}: this edge must name the container it carries")


@irdl_op_definition
class DataEdgeOp(ContainerEdgeFields):
    """`exec.data`: a data edge of the unrolled graph (before insert-comm)."""

    name = "exec.data"


@irdl_op_definition
class PublishEdgeOp(ContainerEdgeFields):
    """`exec.publish`: a publication edge of the unrolled graph (before insert-comm/reshard)."""

    name = "exec.publish"


@irdl_op_definition
class OrderEdgeOp(EdgeFields):
    """`exec.order`: the ordered-update edge t_m,k-1 -> t_m,k of Alg. 3."""

    name = "exec.order"


@irdl_op_definition
class DepEdgeOp(EdgeFields):
    """`exec.dep`: a plain dependency of the lowered DAG."""

    name = "exec.dep"


@irdl_op_definition
class MemoryOp(LocatedOp):
    """`exec.memory`: per-device peak, persistent and transient bytes, M_eff, r_peak, feasibility.

    Each per-device map is a dense array of device ids and an equally long array of byte counts.
    """

    name = "exec.memory"
    peak_devices = prop_def(DeviceIds)
    peak = prop_def(DeviceBytes)
    persistent_devices = prop_def(DeviceIds)
    persistent = prop_def(DeviceBytes)
    transient_devices = prop_def(DeviceIds)
    transient = prop_def(DeviceBytes)
    m_eff = prop_def(FloatAttr)
    r_peak = prop_def(FloatAttr)
    feasible = prop_def(BoolAttr)
    traits = traits_def(HasParent(ExecGraphOp))

    def verify_(self) -> None:
        for key in ("peak", "persistent", "transient"):
            devices, values = self.properties[f"{key}_devices"], self.properties[key]
            assert isinstance(devices, DenseArrayBase) and isinstance(values, ArrayAttr)
            if len(devices) != len(values):
                raise VerifyException(
                    f"{self.name}: {key}_devices has {len(devices)} entries but {key} has {len(values)}"
                )


@irdl_op_definition
class ScheduleOp(LocatedOp):
    """`exec.schedule`: makespan, score, penalised score, utilisation and P_eff (spec 7)."""

    name = "exec.schedule"
    makespan = prop_def(FloatAttr)
    score = prop_def(FloatAttr)
    score_pen = prop_def(FloatAttr)
    util = prop_def(FloatAttr)
    p_eff = prop_def(FloatAttr)
    traits = traits_def(HasParent(ExecGraphOp))


@irdl_op_definition
class FusionOp(LocatedOp):
    """`exec.fusion`: Op nodes run as one fused operator; per pipeline stage, its microtasks in order, each written
    as in the text form (`F1.3`: member 1's forward of microbatch 3; docs/stage-fusion.md)."""

    name = "exec.fusion"
    ident = prop_def(Text)
    members = prop_def(ArrayAttr[SymbolRefAttr])
    stages = prop_def(ArrayAttr[ArrayAttr[StringAttr]])
    traits = traits_def(HasParent(ExecGraphOp))

    def verify_(self) -> None:
        for order in self.stages.data:
            for task in order.data:
                if MICROTASK_PATTERN.fullmatch(task.data) is None:
                    raise VerifyException(f"{self.name}: '{task.data}' is not a microtask such as F0.1")


NODE_OPS = {"op": OpNodeOp, "comm": CommOp, "reshard": ReshardOp}
EDGE_OPS = {"data": DataEdgeOp, "pub": PublishEdgeOp, "order": OrderEdgeOp, "dep": DepEdgeOp}

EXEC = Dialect(
    "exec",
    [ExecGraphOp, *NODE_OPS.values(), *EDGE_OPS.values(), MemoryOp, ScheduleOp, FusionOp],
    [DataRefAttr],
)
