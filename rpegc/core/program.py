"""The plain-data form of a `.rpeg` module: workload, models, the cyclic graph G°, cluster and plan.

Paper: Sec. IV-A and App. A-A..A-D (Definitions A.1-A.5). These dataclasses are what `rpegc/core`
functions compute on; the xDSL dialects (`rpegc.dialects`) convert to and from them, and the text
parser/printer (`rpegc.syntax`) reads and writes them. Source locations never take part in equality,
so a module that went through print and parse again compares equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Optional

from rpegc.core.errors import UNKNOWN_LOC, Loc, RpegError
from rpegc.core.expr import Expr, Num, Sym, evaluate

if TYPE_CHECKING:
    from rpegc.core.exec_graph import ExecGraph

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ROLES = ("generation", "inference", "training")
MODEL_KINDS = ("policy", "reference", "critic", "reward", "actor_critic")
# The RL algorithms a graph may name (`rpeg.algorithm NAME`); the torch backend runs each (its algorithms/).
ALGORITHMS = ("ppo", "grpo", "dpo")
# Element kinds of data containers. They only name what the runtime finds inside; the byte size is
# s_b per element unless a container says otherwise (spec 5.1: token ids count s_b bytes too).
ELEMENT_KINDS = ("tokens", "logprobs", "values", "rewards", "advantages", "scalars")


def _loc():
    # A fresh Field per attribute: one shared Field object would be renamed by every class
    # that uses it, which breaks __init__ and replace() for classes with several Loc fields.
    return field(default=UNKNOWN_LOC, compare=False, repr=False)


@dataclass(frozen=True)
class Workload:
    B: int
    R: int
    Lp: int
    Lr: int
    dtype: str = "bf16"
    loc: Loc = _loc()

    @property
    def s_b(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def env(self) -> dict[str, int]:
        return {"B": self.B, "R": self.R, "Lp": self.Lp, "Lr": self.Lr}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's shape. `gated`: the FFN has a gate projection (SwiGLU: gate, up and down,
    three d x d_ff matrices, as the Llama family); False is the spec's two-projection FFN (up, down)."""

    layers: int
    hidden: int
    ffn: int
    vocab: int
    heads: int
    kv_heads: int
    gated: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Model:
    name: str
    kind: str
    trainable: bool
    arch: Arch
    preset: Optional[str] = None  # the preset name the user wrote, kept so printing reproduces it
    loc: Loc = _loc()
    hf: Optional[str] = None  # a Hugging Face checkpoint directory the arch was read from (core/hf_config.py)


@dataclass(frozen=True)
class Container:
    """A typed container: data (`elem` in ELEMENT_KINDS, `dims` over B,R,Lp,Lr) or weights of `model`."""

    name: str
    elem: str  # an ELEMENT_KINDS entry, or "weights"
    dims: tuple[Expr, ...] = ()
    model: Optional[str] = None
    bytes_per_elem: Optional[int] = None  # None: the workload's s_b
    loc: Loc = _loc()

    @property
    def is_weights(self) -> bool:
        return self.elem == "weights"


@dataclass(frozen=True)
class Vertex:
    name: str
    role: str
    model: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class Edge:
    """A data edge (within one step) or a publication edge (across steps), carrying one container."""

    src: str
    dst: str
    container: str
    loc: Loc = _loc()


@dataclass(frozen=True)
class Quantile:
    """Cumulative fraction `f` of responses finished after `tokens` generated tokens (Def. A.9)."""

    f: float
    tokens: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Graph:
    name: str
    containers: tuple[Container, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    vertices: tuple[Vertex, ...]
    data_edges: tuple[Edge, ...]
    pub_edges: tuple[Edge, ...]
    staleness: tuple[tuple[str, int], ...] = ()  # (model, tau); models not listed have tau = 0
    quantiles: tuple[Quantile, ...] = ()
    loc: Loc = _loc()
    staleness_loc: Loc = _loc()
    quantiles_loc: Loc = _loc()
    algorithm: Optional[str] = None  # ALGORITHMS; None: the runtime infers it from the graph (and warns)
    algorithm_loc: Loc = _loc()

    def vertex(self, name: str) -> Vertex:
        return _first_by_name(self, "vertices", self.vertices, lambda v: v.name)[name]

    def container(self, name: str) -> Container:
        return _first_by_name(self, "containers", self.containers, lambda c: c.name)[name]

    def tau(self, model: str) -> int:
        # The last entry of a repeated model counts, as in dict(staleness) (verify-wellformed reports repeats).
        last = _first_by_name(self, "staleness", self.staleness[::-1], lambda e: e[0])
        return last.get(model, (model, 0))[1]


# The largest GPU clusters built are ~10^5 devices; per-device tables (memory, schedule) stay small below this.
MAX_DEVICES = 2**20


@dataclass(frozen=True)
class Cluster:
    name: str
    racks: int
    nodes: int  # per rack
    gpus: int  # per node
    hardware: str  # a profile name in rpegc/hardware/ or a path to a TOML profile
    loc: Loc = _loc()

    @property
    def num_devices(self) -> int:
        return self.racks * self.nodes * self.gpus

    def size_problem(self) -> Optional[str]:
        """Why the cluster is too large to model, or None. Both readers (text and JSON) ask."""
        if self.num_devices <= MAX_DEVICES:
            return None
        return (f"cluster @{self.name} has {self.num_devices:,} devices ({self.racks} x {self.nodes} x {self.gpus}); "
                f"rpegc models clusters of at most {MAX_DEVICES:,} devices; shrink racks, nodes or gpus")


@dataclass(frozen=True)
class Alloc:
    """A device allocation D(o, delta): a contiguous hyper-rectangle of the device space (Def. A.4)."""

    origin: tuple[int, int, int]
    extent: tuple[int, int, int]

    @property
    def size(self) -> int:
        return self.extent[0] * self.extent[1] * self.extent[2]

    def devices(self, cluster: Cluster) -> tuple[int, ...]:
        """Flat device ids `(rack*N_n + node)*N_g + gpu`, in rack, node, gpu order."""
        (o_r, o_n, o_g), (e_r, e_n, e_g) = self.origin, self.extent
        return tuple(
            (r * cluster.nodes + n) * cluster.gpus + g
            for r in range(o_r, o_r + e_r)
            for n in range(o_n, o_n + e_n)
            for g in range(o_g, o_g + e_g)
        )


@dataclass(frozen=True)
class Strategy:
    dp: int
    pp: int
    tp: int
    mb: int

    @property
    def size(self) -> int:
        return self.dp * self.pp * self.tp

    def layout(self) -> tuple[int, int, int]:
        """Pi(v) = (P_d, P_p, P_t); the microbatch count is not part of the weight layout."""
        return (self.dp, self.pp, self.tp)


@dataclass(frozen=True)
class Placement:
    vertex: str
    alloc: Alloc
    strategy: Strategy
    loc: Loc = _loc()


@dataclass(frozen=True)
class Plan:
    name: str
    graph: str
    cluster: str
    placements: tuple[Placement, ...]
    loc: Loc = _loc()

    def placement(self, vertex: str) -> Placement:
        return _first_by_name(self, "placements", self.placements, lambda p: p.vertex)[vertex]


@dataclass(frozen=True)
class Program:
    """One `.rpeg` module. `exec` is set once the graph has been unrolled (see exec_graph.py)."""

    workload: Workload
    models: tuple[Model, ...]
    graph: Optional[Graph] = None
    cluster: Optional[Cluster] = None
    plan: Optional[Plan] = None
    exec: Optional["ExecGraph"] = None
    file: str = field(default="<input>", compare=False)

    def model(self, name: str) -> Model:
        return _first_by_name(self, "models", self.models, lambda m: m.name)[name]


def _first_by_name(owner, field_name: str, items: tuple, key) -> dict:
    """An index name -> first of `items` (derived from the field `field_name` of the frozen `owner`), built
    once per object.

    Lookups by name used to scan the tuple, which made passes over a graph of n vertices or containers
    O(n^2). The index lives in the instance's __dict__ beside the fields (which never change): equality,
    repr and dataclasses.replace see only the fields, and a replaced object builds its own index."""
    cache = owner.__dict__.get("_index")
    if cache is None:
        cache = {}
        object.__setattr__(owner, "_index", cache)
    index = cache.get(field_name)
    if index is None:
        index = {}
        for item in items:
            index.setdefault(key(item), item)
        cache[field_name] = index
    return index


# The largest element count a data container may have: 2**50 elements (a PiB of bf16) exceeds the memory of
# any cluster the cost model describes, and keeps every byte count exact in a float64 (< 2**53).
MAX_ELEMENTS = 2**50


def container_shape(c: Container, workload: Workload) -> tuple[int, ...]:
    """The dimensions of a data container under the workload, each a positive integer.

    The one check of container sizes: verify-wellformed reports its error, and every later consumer (lowering,
    cost, memory) calls it too, so a pass run without verification still fails with the same located error."""
    dims = []
    total = 1
    env = workload.env
    for d in c.dims:
        # The common cases (a symbol, a literal) without Fraction arithmetic: verification calls this per container.
        if isinstance(d, Sym) and d.name in env:
            value: int | Fraction = env[d.name]
        elif isinstance(d, Num):
            value = d.value
        else:
            try:
                value = evaluate(d, env)
            except ZeroDivisionError:
                raise RpegError(c.loc, f"size {d} of container %{c.name} = {_shape(c)} divides by zero under the "
                                       f"workload ({_env_text(workload)}); write sizes that stay positive") from None
            if value.denominator != 1:
                raise RpegError(c.loc, f"size {d} of container %{c.name} = {_shape(c)} is {float(value):g}, not a "
                                       f"whole number of elements, under the workload ({_env_text(workload)}); write "
                                       "sizes that divide evenly")
            value = int(value)
        if value <= 0:
            raise RpegError(c.loc, f"size {d} of container %{c.name} = {_shape(c)} is {value} under the workload "
                                   f"({_env_text(workload)}); every size must be a positive number of elements")
        total *= value
        if total > MAX_ELEMENTS:
            raise RpegError(c.loc, f"container %{c.name} = {_shape(c)} has more than {MAX_ELEMENTS} (2**50) elements "
                                   f"under the workload ({_env_text(workload)}); no cluster holds it")
        dims.append(value)
    return tuple(dims)


def _shape(c: Container) -> str:
    return f"{c.elem}[{', '.join(str(d) for d in c.dims)}]"


def _env_text(workload: Workload) -> str:
    return ", ".join(f"{k} = {v}" for k, v in workload.env.items())


def container_elements(c: Container, workload: Workload, param_count) -> int:
    """#a: element count of a container; weights use `param_count(model_name)` (N_m, spec 2.5)."""
    if c.is_weights:
        return int(param_count(c.model))
    n = 1
    for d in container_shape(c, workload):
        n *= d
    return n


def container_bytes(c: Container, workload: Workload, param_count) -> int:
    """|a|·s(a) in bytes."""
    per = c.bytes_per_elem if c.bytes_per_elem is not None else workload.s_b
    return container_elements(c, workload, param_count) * per
