"""The op table: one ``OpSpec`` row per modelled ONNX op.

A row says how the op enters the e-graph (inputs, typed attributes, opset normalization), how
it leaves it (export at the model's opset), how much it costs (FLOPs), and which shape/dtype
family its analysis rules come from. Reference numerics come from ``onnx.reference`` on the
exported node, so the table never re-implements an op's math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

AttrKind = Literal["int", "float", "string", "ints"]

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Attr:
    """A typed constructor argument backed by an ONNX attribute of the same name."""

    name: str
    kind: AttrKind
    default: Any = None


@dataclass(frozen=True)
class IntsConst:
    """A small int64 constant created by normalization (becomes ``Tensor.ints``)."""

    values: tuple[int, ...]
    rank: int = 1


@dataclass(frozen=True)
class SplatConst:
    """A uniform constant created by normalization (becomes ``Tensor.splat``)."""

    value: float
    dims: tuple[int, ...]
    dtype: int


InputRef = str | IntsConst | SplatConst | None
"""An input while importing: a tensor name, a new constant, or None for an absent optional."""


@dataclass
class ImportNode:
    """A node during import, after attribute defaults were applied; normalizers edit it."""

    op_type: str
    inputs: list[InputRef]
    attrs: dict[str, Any]
    opset: int
    input_shapes: list[tuple[int, ...] | None]
    input_dtypes: list[int | None]
    n_outputs: int
    const_ints: Callable[[InputRef], tuple[int, ...] | None]
    """Values of an int constant input (None when not a known constant)."""

    def input_rank(self, i: int) -> int | None:
        s = self.input_shapes[i] if i < len(self.input_shapes) else None
        return None if s is None else len(s)


class Unsupported(Exception):
    """Raised by a normalizer when this instance of the op must stay opaque."""


@dataclass
class ExportNode:
    """An extracted node being written back: input names, attribute values, target opset."""

    op_type: str
    inputs: list[str]
    attrs: dict[str, Any]
    opset: int
    const_value: Callable[[int], np.ndarray | None]
    """Values of input ``i`` when it is a constant (for opsets that want it as an attribute)."""
    outputs: list[str] = field(default_factory=list)
    folded_value: Callable[[int], np.ndarray | None] = lambda i: None
    """Values of input ``i`` when it is computed from constants only (evaluated: a fused kind whose
    single-op form depends on constant values, e.g. RotaryEmbedding's caches)."""
    fresh: Callable[[str], str] = str
    """A new unused tensor name from a hint (for the inner tensors of an expansion)."""
    in_shape: Callable[[int], tuple[int, ...] | None] = lambda i: None
    """The shape of input ``i`` where the e-graph knows it (``< 0``: a symbolic dim), else None
    (a contrib op whose attribute is a dim, e.g. MultiHeadAttention's head count)."""
    allow_contrib: bool = False
    """onnxruntime's com.microsoft contrib ops may be written (``--allow-contrib-ops``)."""
    upgrade_opset: int | None = None
    """The whole model may be converted to this opset (``egraph/opset_upgrade.py``): an op new at it
    is written in the placeholder domain, and becomes the standard op when the model is converted."""
    domain: str = ""
    expansion: list[Any] = field(default_factory=list)
    """NodeProtos to write instead of the one node (a fused kind with no single ONNX op)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Metadata the written node carries (a layout choice for the lowering)."""

    def const_ints(self, i: int) -> list[int] | None:
        value = self.const_value(i)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


@dataclass(frozen=True)
class CostCtx:
    """What a FLOP formula sees: input and output shapes (known dims) and attributes."""

    in_shapes: list[tuple[int, ...] | None]
    out_shape: tuple[int, ...] | None
    attrs: dict[str, Any]


def numel(shape: tuple[int, ...] | None) -> int:
    if shape is None:
        return 0
    return math.prod(max(d, 1) for d in shape)


def elementwise_flops(ctx: CostCtx) -> float:
    return float(numel(ctx.out_shape))


def no_flops(ctx: CostCtx) -> float:
    return 0.0


Family = Literal[
    "leaf", "unary", "binary", "ternary", "matmul", "gemm", "conv", "norm", "pool", "layout", "reduce", "shape", "opaque"
]


@dataclass(frozen=True)
class OpSpec:
    """One modelled op. ``inputs`` names ONNX inputs in order; a trailing ``?`` marks optional,
    ``*`` a variadic list (a ``TList`` argument)."""

    op_type: str
    ctor: Callable[..., Any]
    inputs: tuple[str, ...]
    attrs: tuple[Attr, ...] = ()
    family: Family = "unary"
    normalize: Callable[[ImportNode], None] | None = None
    export: Callable[[ExportNode], None] | None = None
    flops: Callable[[CostCtx], float] = elementwise_flops
    min_opset: int = 1
    extra_outputs_ok: bool = False
    indexed_outputs: bool = False
    """One constructor per output (Split): the last constructor argument is the output index."""
    output_count: int = 0
    """Outputs of an ``indexed_outputs`` op that always has the same number (0: Split's, from its sizes)."""
    notes: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return ctor_name(self.ctor)

    @property
    def variadic(self) -> bool:
        return any(i.endswith("*") for i in self.inputs)


OPS: dict[str, OpSpec] = {}
"""ONNX op_type -> spec (default domain)."""

BY_CTOR: dict[str, OpSpec] = {}
"""egglog constructor name -> spec."""


def register(*specs: OpSpec) -> None:
    for spec in specs:
        OPS[spec.op_type] = spec


def ctor_name(ctor: Any) -> str:
    """The name egglog gives a constructor's nodes in the serialized e-graph."""
    return str(ctor.__egg_ref__.ident.name)
