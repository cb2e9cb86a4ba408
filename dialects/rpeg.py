"""The `rpeg` dialect: workload, models, the cyclic graph G°, the cluster and the plan.

Paper: Sec. IV-A and App. A-A..A-D (Definitions A.1-A.5); one op per concept of
`rpegc/core/ir/program.py`. Ops have no SSA operands or results: containers, vertices and models are
named by attributes (a declaration's own name is the `ident` StringAttr property, a reference is a
SymbolRefAttr; container names are StringAttr). `ident` is deliberately not `sym_name`: the module
is an xDSL SymbolTable, and a model and a graph may legally share a name. Every op carries its
source position as MLIR's own op location, `loc("file":line:col)`; integers are builtin `N : i64`
attributes, so mlir-opt reads the generic form. Verifiers check only local
structure (enumerations, parents); graph semantics live in `rpegc/core`.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, StringAttr, SymbolRefAttr, UnitAttr
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import HasParent, NoTerminator
from xdsl.utils.exceptions import VerifyException

from rpegc.dialects.attrs import (
    AllocAttr,
    ArchAttr,
    BinOpAttr,
    ExprAttr,
    I64Attr,
    ModelIntAttr,
    NumAttr,
    QuantileAttr,
    StrategyAttr,
    SymAttr,
    Text,
    TrainAttr,
    int_of,
)
from rpegc.core.ir.algorithms import algorithm_family, algorithm_names
from rpegc.core.ir.program import DTYPE_BYTES, ELEMENT_KINDS, MODEL_KINDS, ROLES


def check_member(op_name: str, field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise VerifyException(f"{op_name}: {field} '{value}' is not one of {', '.join(allowed)}")


class LocatedOp(IRDLOperation):
    """Base of every rpeg and exec op; its `location` is the source position that locates pass errors."""


@irdl_op_definition
class WorkloadOp(LocatedOp):
    """`rpeg.workload`: batch B, samples per prompt R, prompt/response lengths Lp, Lr, dtype."""

    name = "rpeg.workload"
    B = prop_def(I64Attr)
    R = prop_def(I64Attr)
    Lp = prop_def(I64Attr)
    Lr = prop_def(I64Attr)
    dtype = prop_def(StringAttr)
    train = opt_prop_def(TrainAttr)  # the training fields of every training operator, when any is stated
    oversample = opt_prop_def(I64Attr)  # dynamic sampling's draws per step in units of B, when not 1

    def verify_(self) -> None:
        check_member(self.name, "dtype", self.dtype.data, tuple(DTYPE_BYTES))


@irdl_op_definition
class ModelOp(LocatedOp):
    """`rpeg.model`: a named model with its kind, trainability, architecture and preset name."""

    name = "rpeg.model"
    ident = prop_def(Text)
    kind = prop_def(StringAttr)
    arch = prop_def(ArchAttr)
    trainable = opt_prop_def(UnitAttr)
    preset = opt_prop_def(Text)
    hf = opt_prop_def(Text)  # the Hugging Face checkpoint directory the arch came from

    def verify_(self) -> None:
        check_member(self.name, "kind", self.kind.data, MODEL_KINDS)


@irdl_op_definition
class VerifierOp(LocatedOp):
    """`rpeg.verifier`: a reward function of response text run on host CPU processes (program.Verifier): what the
    runtime calls (`fn`) and, unless the hardware profile calibrates it, the seconds one call takes."""

    name = "rpeg.verifier"
    ident = prop_def(Text)
    fn = prop_def(Text)
    per_response = opt_prop_def(FloatAttr)  # omitted when the calibration of a built-in gives the time


@irdl_op_definition
class GraphOp(LocatedOp):
    """`rpeg.graph`: the cyclic RPEG G° (Def. A.2); its single block holds the graph-body ops."""

    name = "rpeg.graph"
    ident = prop_def(Text)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())


class ContainerFields(LocatedOp):
    """Fields shared by data and weight containers (`rpegc.core.ir.program.Container`)."""

    ident = prop_def(Text)
    dims = opt_prop_def(ArrayAttr[ExprAttr])
    model = opt_prop_def(SymbolRefAttr)
    bytes_per_elem = opt_prop_def(I64Attr)
    traits = traits_def(HasParent(GraphOp))


@irdl_op_definition
class ContainerOp(ContainerFields):
    """`rpeg.container`: a data container of element kind `elem` and shape `dims`."""

    name = "rpeg.container"
    elem = prop_def(StringAttr)

    def verify_(self) -> None:
        check_member(self.name, "elem", self.elem.data, ELEMENT_KINDS)


@irdl_op_definition
class WeightsOp(ContainerFields):
    """`rpeg.weights`: the weight container of `model` (its size is N_m, spec 2.5)."""

    name = "rpeg.weights"

    def verify_(self) -> None:
        if self.model is None:
            raise VerifyException(f"{self.name}: a weight container must name its model")


class ContainerListFields(LocatedOp):
    containers = prop_def(ArrayAttr[Text])
    traits = traits_def(HasParent(GraphOp))


@irdl_op_definition
class InputOp(ContainerListFields):
    """`rpeg.input`: containers supplied from outside the graph (boundary, Def. A.2)."""

    name = "rpeg.input"


@irdl_op_definition
class OutputOp(ContainerListFields):
    """`rpeg.output`: containers the graph hands back."""

    name = "rpeg.output"


@irdl_op_definition
class VertexOp(LocatedOp):
    """`rpeg.vertex`: a generation, inference or training task over one model, or a verify task whose `model`
    names an `rpeg.verifier`."""

    name = "rpeg.vertex"
    ident = prop_def(Text)
    role = prop_def(StringAttr)
    model = prop_def(SymbolRefAttr)
    reads = prop_def(ArrayAttr[Text])
    writes = prop_def(ArrayAttr[Text])
    traits = traits_def(HasParent(GraphOp))

    def verify_(self) -> None:
        check_member(self.name, "role", self.role.data, ROLES)


class EdgeFields(LocatedOp):
    src = prop_def(SymbolRefAttr)
    dst = prop_def(SymbolRefAttr)
    container = prop_def(Text)
    traits = traits_def(HasParent(GraphOp))


@irdl_op_definition
class DataOp(EdgeFields):
    """`rpeg.data`: a data edge within one step."""

    name = "rpeg.data"


@irdl_op_definition
class PublishOp(EdgeFields):
    """`rpeg.publish`: a publication edge carrying weights across steps."""

    name = "rpeg.publish"


@irdl_op_definition
class StalenessOp(LocatedOp):
    """`rpeg.staleness`: tau(m) per model, in source order (models not listed have tau = 0)."""

    name = "rpeg.staleness"
    entries = prop_def(ArrayAttr[ModelIntAttr])
    traits = traits_def(HasParent(GraphOp))


@irdl_op_definition
class AlgorithmOp(LocatedOp):
    """`rpeg.algorithm`: the RL algorithm the graph runs (core/ir/algorithms.py: built-in or a plugin's)."""

    name = "rpeg.algorithm"
    algorithm = prop_def(StringAttr)
    traits = traits_def(HasParent(GraphOp))

    def verify_(self) -> None:
        if algorithm_family(self.algorithm.data) is None:
            check_member(self.name, "algorithm", self.algorithm.data, algorithm_names())


@irdl_op_definition
class QuantilesOp(LocatedOp):
    """`rpeg.quantiles`: the response-length quantiles (f, tokens) of Def. A.9."""

    name = "rpeg.quantiles"
    entries = prop_def(ArrayAttr[QuantileAttr])
    traits = traits_def(HasParent(GraphOp))


@irdl_op_definition
class ClusterOp(LocatedOp):
    """`rpeg.cluster`: racks x nodes per rack x GPUs per node, and a hardware profile."""

    name = "rpeg.cluster"
    ident = prop_def(Text)
    racks = prop_def(I64Attr)
    nodes = prop_def(I64Attr)
    gpus = prop_def(I64Attr)
    hardware = prop_def(Text)


@irdl_op_definition
class PlanOp(LocatedOp):
    """`rpeg.plan`: the placement P of `graph` on `cluster` (Def. A.5); holds `rpeg.place`, `rpeg.pool` and
    `rpeg.fuse` ops."""

    name = "rpeg.plan"
    ident = prop_def(Text)
    graph = prop_def(SymbolRefAttr)
    cluster = prop_def(SymbolRefAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())


@irdl_op_definition
class PlaceOp(LocatedOp):
    """`rpeg.place`: sigma(v) and Pi(v) of one vertex."""

    name = "rpeg.place"
    vertex = prop_def(SymbolRefAttr)
    alloc = prop_def(AllocAttr)
    strategy = prop_def(StrategyAttr)
    train = opt_prop_def(TrainAttr)  # the vertex's training fields, when its placement states any
    traits = traits_def(HasParent(PlanOp))


@irdl_op_definition
class PoolOp(LocatedOp):
    """`rpeg.pool`: where a verify vertex runs: `size` worker processes on the controller's host (program.Pool)."""

    name = "rpeg.pool"
    vertex = prop_def(SymbolRefAttr)
    size = prop_def(I64Attr)
    traits = traits_def(HasParent(PlanOp))

    def verify_(self) -> None:
        size = int_of(self.size)
        if size < 1:
            raise VerifyException(f"{self.name}: size {size} must be >= 1 (worker processes)")


@irdl_op_definition
class FuseOp(LocatedOp):
    """`rpeg.fuse`: training vertices the plan runs as one fused operator (docs/stage-fusion.md)."""

    name = "rpeg.fuse"
    vertices = prop_def(ArrayAttr[SymbolRefAttr])
    traits = traits_def(HasParent(PlanOp))


GRAPH_BODY_OPS = (
    ContainerOp,
    WeightsOp,
    InputOp,
    OutputOp,
    VertexOp,
    DataOp,
    PublishOp,
    StalenessOp,
    QuantilesOp,
    AlgorithmOp,
)

RPEG = Dialect(
    "rpeg",
    [WorkloadOp, ModelOp, VerifierOp, GraphOp, *GRAPH_BODY_OPS, ClusterOp, PlanOp, PlaceOp, PoolOp, FuseOp],
    [NumAttr, SymAttr, BinOpAttr, AllocAttr, StrategyAttr, TrainAttr, ArchAttr, ModelIntAttr, QuantileAttr],
)
