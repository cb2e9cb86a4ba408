"""The plain-data form of a `.rpeg` module: workload, models, the cyclic graph G°, cluster and plan.

Paper: Sec. IV-A and App. A-A..A-D (Definitions A.1-A.5). These dataclasses are what `rpegc/core`
functions compute on; the xDSL dialects (`rpegc.dialects`) convert to and from them, and the text
parser/printer (`rpegc.syntax`) reads and writes them. Source locations never take part in equality,
so a module that went through print and parse again compares equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Optional

from rpegc.core.ir.errors import Loc, RpegError
from rpegc.core.ir.expr import Expr, Num, Sym, evaluate
from rpegc.core.ir.frozen import first_by_name, loc_field
from rpegc.core.ir.geometry import Alloc, Cluster, Strategy
from rpegc.core.ir.training import NO_TRAIN_SPEC, TrainSpec, Training, resolve

if TYPE_CHECKING:
    from rpegc.core.ir.exec_graph import ExecGraph

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ROLES = ("generation", "inference", "training", "verify")
DEVICE_ROLES = ("generation", "inference", "training")  # the roles that run a model on devices (placed by the plan)
VERIFY = "verify"  # a reward function on host CPU processes (a Verifier, placed by a Pool)
MODEL_KINDS = ("policy", "reference", "critic", "reward", "actor_critic")
# Element kinds of data containers. They only name what the runtime finds inside; the byte size is
# s_b per element unless a container says otherwise (spec 5.1: token ids count s_b bytes too).
ELEMENT_KINDS = ("tokens", "logprobs", "values", "rewards", "advantages", "scalars")


@dataclass(frozen=True)
class Workload:
    """One RL step's work: B prompts (the batch a step trains on), R responses each, prompt and response lengths
    Lp and Lr, the element type.

    `oversample` (DAPO's dynamic sampling, Yu et al. 2025) is how many times B prompts a step may draw: generation
    and inference run on oversample x B prompts (`drawn`), and the trainers keep B of them, preferring the groups
    whose rewards differ (a group of equal rewards has no advantage to learn from). The cost model prices what runs:
    generation and inference operators (`for_role`) and every data container (sizes evaluate `B` as the drawn
    prompts, `env`) at the drawn rows, training at B; the score counts the B trained prompts."""

    B: int
    R: int
    Lp: int
    Lr: int
    dtype: str = "bf16"
    loc: Loc = loc_field()
    train: TrainSpec = NO_TRAIN_SPEC  # the training fields of every training operator (a placement's override them)
    oversample: int = 1  # prompts drawn per step, in units of B (dynamic sampling; 1: exactly B)

    @property
    def drawn(self) -> int:
        """The prompts a step's generation draws."""
        return self.B * self.oversample

    def for_role(self, role: str) -> "Workload":
        """The workload an operator of `role` runs: training B prompts, generation and inference the drawn ones."""
        if self.oversample == 1 or role == "training":
            return self
        return replace(self, B=self.drawn, oversample=1)

    @property
    def s_b(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def training(self, spec: TrainSpec = NO_TRAIN_SPEC, loc: Optional[Loc] = None) -> Training:
        """How a training operator whose placement states `spec` trains (training.resolve)."""
        return resolve(self.dtype, self.train, spec, loc if loc is not None else self.loc)

    @property
    def env(self) -> dict[str, int]:
        """The symbols of size expressions: the data containers hold the drawn rows."""
        return {"B": self.drawn, "R": self.R, "Lp": self.Lp, "Lr": self.Lr}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's shape, and the parts of it that [PF]'s parameter count (spec 2.5) leaves out.

    The flags' defaults are the spec's form (its worked example): a two-projection FFN, no biases, no norm weights,
    one V x d matrix for embedding and LM head. Presets and checkpoints set what their networks have, so N_m is
    the real count (`transformers`' `num_parameters()` for a checkpoint):
    - `gated`: the FFN has a gate projection (SwiGLU: gate, up and down, three d x d_ff matrices, the Llama family);
    - `qkv_bias`: the query, key and value projections have biases (Qwen2);
    - `tied`: the LM head is the embedding matrix (counted once); False: a separate V x d head;
    - `norms`: the RMSNorm weights (two per layer and the final one, d each) are counted;
    - `qk_norm`: an RMSNorm over each head's query and key (Qwen3, Gemma 3), head_dim weights each, counted with
      `norms`;
    - `post_norms`: two more RMSNorms per layer, on the attention's and the FFN's outputs (Gemma 3), d each.
    Grouped-query attention (`kv_heads` < `heads`) is always counted: q and o are d x d_q, k and v d x d_kv, with
    d_q = heads x head_dim; the head dimension is hidden / heads unless `head_size` gives it (Qwen3's head_dim).
    """

    layers: int
    hidden: int
    ffn: int
    vocab: int
    heads: int
    kv_heads: int
    gated: bool = False
    qkv_bias: bool = False
    tied: bool = True
    norms: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    head_size: int = 0  # the head dimension where it is not hidden / heads (written `head_dim`); 0: hidden / heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """d_q = n_h d_h: the output width of the query projection (and the input width of the output one); d unless
        the head dimension is given."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """d_kv = n_kv d_h: the output width of the key (and of the value) projection."""
        return self.kv_heads * self.head_dim


# The shape fields and the flags of an Arch, in the order every form (text, JSON, MLIR) writes them.
ARCH_SIZES = ("layers", "hidden", "ffn", "vocab", "heads", "kv_heads")
ARCH_FLAGS = ("gated", "qkv_bias", "tied", "norms", "qk_norm", "post_norms")
HEAD_DIM = "head_dim"  # the optional size every form writes for Arch.head_size where it is not hidden / heads


def arch_flag_default(flag: str) -> bool:
    return Arch.__dataclass_fields__[flag].default


@dataclass(frozen=True)
class Model:
    name: str
    kind: str
    trainable: bool
    arch: Arch
    preset: Optional[str] = None  # the preset name the user wrote, kept so printing reproduces it
    loc: Loc = loc_field()
    hf: Optional[str] = None  # a Hugging Face checkpoint directory the arch was read from (core/ir/hf_config.py)

    @property
    def rope(self) -> bool:
        """Whether the network encodes positions with RoPE (a checkpoint's, as the torch backend builds it) rather
        than a learned embedding (a model without a checkpoint: the backend's run_config)."""
        return self.hf is not None


@dataclass(frozen=True)
class Verifier:
    """A reward function of response text that runs on host CPU processes, not on a device's model (`rpeg.verifier`):
    a math checker, an exact match, a code sandbox. `fn` is what the runtime calls (a built-in name, `module:function`,
    `file.py:function` or an entry point of `rpegc.rewards`); `per_response` the seconds one call takes on one
    process, None for a built-in whose time the hardware profile's calibration measured (`[host.verify]`)."""

    name: str
    fn: str
    per_response: Optional[float] = None
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Container:
    """A typed container: data (`elem` in ELEMENT_KINDS, `dims` over B,R,Lp,Lr) or weights of `model`."""

    name: str
    elem: str  # an ELEMENT_KINDS entry, or "weights"
    dims: tuple[Expr, ...] = ()
    model: Optional[str] = None
    bytes_per_elem: Optional[int] = None  # None: the workload's s_b
    loc: Loc = loc_field()

    @property
    def is_weights(self) -> bool:
        return self.elem == "weights"


@dataclass(frozen=True)
class Vertex:
    name: str
    role: str
    model: str  # the model a device vertex invokes; a verify vertex's verifier
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Edge:
    """A data edge (within one step) or a publication edge (across steps), carrying one container."""

    src: str
    dst: str
    container: str
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Quantile:
    """Cumulative fraction `f` of responses finished after `tokens` generated tokens (Def. A.9)."""

    f: float
    tokens: Expr
    loc: Loc = loc_field()


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
    loc: Loc = loc_field()
    staleness_loc: Loc = loc_field()
    quantiles_loc: Loc = loc_field()
    algorithm: Optional[str] = None  # one algorithms.algorithm_family knows; None: the runtime infers it (and warns)
    algorithm_loc: Loc = loc_field()

    def vertex(self, name: str) -> Vertex:
        return first_by_name(self, "vertices", self.vertices, lambda v: v.name)[name]

    def container(self, name: str) -> Container:
        return first_by_name(self, "containers", self.containers, lambda c: c.name)[name]

    def tau(self, model: str) -> int:
        # The last entry of a repeated model counts, as in dict(staleness) (verify-wellformed reports repeats).
        last = first_by_name(self, "staleness", self.staleness[::-1], lambda e: e[0])
        return last.get(model, (model, 0))[1]


@dataclass(frozen=True)
class Placement:
    vertex: str
    alloc: Alloc
    strategy: Strategy
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Pool:
    """Where a verify vertex runs: `size` worker processes on the host of the cluster's first node (the controller's),
    next to the devices, not on them (`@v pool = N`)."""

    vertex: str
    size: int
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Fuse:
    """Training vertices the plan runs as one fused operator in every step (`rpeg.fuse`, docs/stage-fusion.md)."""

    vertices: tuple[str, ...]
    loc: Loc = loc_field()


@dataclass(frozen=True)
class Plan:
    name: str
    graph: str
    cluster: str
    placements: tuple[Placement, ...]
    loc: Loc = loc_field()
    fusions: tuple[Fuse, ...] = ()
    pools: tuple[Pool, ...] = ()  # the verify vertices' placements

    def placement(self, vertex: str) -> Placement:
        return first_by_name(self, "placements", self.placements, lambda p: p.vertex)[vertex]

    def pool(self, vertex: str) -> Pool:
        return first_by_name(self, "pools", self.pools, lambda p: p.vertex)[vertex]


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
    verifiers: tuple[Verifier, ...] = ()

    def model(self, name: str) -> Model:
        return first_by_name(self, "models", self.models, lambda m: m.name)[name]

    def verifier(self, name: str) -> Verifier:
        return first_by_name(self, "verifiers", self.verifiers, lambda v: v.name)[name]


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
