"""The graph builder: emits ONNX nodes while tracking each tensor's dims, dtype and sign.

Generators (``ops``, ``motifs``) ask it for inputs that fit an op (``pick``), for weights
(``weight``, ``splat``) and emit nodes (``node1``); every draw is a hypothesis choice, so a
failing model shrinks. Dims are ints 1..5 or the symbolic ``"batch"``; weights come from one
seeded numpy generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

BATCH = "batch"
"""The one symbolic dim; the fuzz property runs it at several sizes."""
Dim = int | str
Dims = tuple[Dim, ...]
OPSETS = (13, 17, 20)
MAX_DIM = 5
FLOATS = (TP.FLOAT, TP.DOUBLE, TP.FLOAT16)
INTS = (TP.INT64, TP.INT32)
NP_TYPES = {
    TP.FLOAT: np.float32,
    TP.DOUBLE: np.float64,
    TP.FLOAT16: np.float16,
    TP.INT64: np.int64,
    TP.INT32: np.int32,
    TP.BOOL: np.bool_,
}
_LAYOUT = {
    "Identity",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Expand",
    "Cast",
    "Where",
    "Pad",
}
_ORT_RUNS = {  # ops onnxruntime's CPU provider runs per dtype (as far as they are generated)
    TP.DOUBLE: _LAYOUT
    | {
        "Relu",
        "Sigmoid",
        "Tanh",
        "Neg",
        "Exp",
        "Abs",
        "Sqrt",
        "Log",
        "Reciprocal",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "MatMul",
        "ReduceSum",
        "ReduceMean",
        "Softmax",
    },
    TP.FLOAT16: _LAYOUT | {"Relu", "Neg", "Abs", "Add", "Sub", "Mul", "Sigmoid", "Tanh"},
    TP.INT64: _LAYOUT | {"Neg", "Abs", "Add", "Sub", "Mul", "Div", "MatMul", "ReduceSum"},
    TP.INT32: _LAYOUT | {"Neg", "Abs", "Add", "Sub", "Mul", "Div", "MatMul"},
    TP.BOOL: {"Identity", "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Cast", "Where", "Expand"},
}


def runs(op: str, dtype: int) -> bool:
    return dtype == TP.FLOAT or op in _ORT_RUNS.get(dtype, set())


def broadcast(*shapes: Dims) -> Dims | None:
    """Numpy broadcast of tracked dims; None when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        seen = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(seen) > 1:
            return None
        out.append(seen.pop() if seen else 1)
    return tuple(out)


def product(dims: Sequence[Dim]) -> Dim | None:
    """Product of dims: an int, ``BATCH`` when the other factors are 1, else None."""
    known = math.prod(d for d in dims if isinstance(d, int))
    symbolic = [d for d in dims if not isinstance(d, int)]
    if not symbolic:
        return known
    return symbolic[0] if len(symbolic) == 1 and known == 1 else None


def concrete(dims: Dims, batch: int = 1) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else batch for d in dims)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Tensor:
    name: str
    dims: Dims
    dtype: int
    const: bool = False
    """Depends on initializers only (folds at export)."""
    sign: str = ""
    """"pos": all values > 0 (a safe divisor, Log's input); "nonneg": >= 0 (Sqrt's); "" unknown."""

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass
class FuzzCase:
    """A generated model and the output dims/dtypes the generator expects of it."""

    model: onnx.ModelProto
    expected: dict[str, tuple[Dims, int]] = field(default_factory=dict)

    def __repr__(self) -> str:  # how hypothesis prints a failing example
        return "FuzzCase(\n" + onnx.printer.to_text(self.model) + "\n)"


class GraphBuilder:
    """Emits nodes and initializers while tracking each tensor's dims, dtype and sign."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any], opset: int, seed: int, symbolic: bool):
        self.draw, self.opset, self.symbolic = draw, opset, symbolic
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[Tensor] = []
        self.pool: list[Tensor] = []
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ---- draws (each a hypothesis choice, so examples shrink)
    def flag(self) -> bool:
        return bool(self.draw(st.booleans()))

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(options)))

    def integer(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def perm(self, rank: int) -> list[int]:
        return [int(p) for p in self.draw(st.permutations(range(rank)))]

    # ---- leaves
    def add_input(self, dims: Dims, dtype: int = TP.FLOAT) -> Tensor:
        t = Tensor(self.name("in"), dims, dtype)
        self.inputs.append(t)
        self.pool.append(t)
        return t

    def const(self, array: np.ndarray, sign: str = "", pool: bool = True) -> Tensor:
        array = np.asarray(array)
        t = Tensor(
            self.name("c"),
            tuple(int(d) for d in array.shape),
            helper.np_dtype_to_tensor_dtype(array.dtype),
            const=True,
            sign=sign,
        )
        self.inits.append(numpy_helper.from_array(array, t.name))
        if pool:
            self.pool.append(t)
        return t

    def ints(self, values: Sequence[int], scalar: bool = False) -> str:
        """An int64 initializer for a shape-like argument (kept out of the pool)."""
        return self.const(np.array(values[0] if scalar else list(values), np.int64), pool=False).name

    def weight(self, dims: Sequence[int], dtype: int = TP.FLOAT, sign: str = "") -> Tensor:
        """Random values: positive ones for ``sign="pos"``, small whole numbers for integers."""
        data = (
            self.rng.uniform(0.5, 2.0, tuple(dims))
            if sign == "pos"
            else self.rng.standard_normal(tuple(dims))
        )
        if dtype in INTS:
            data = np.abs(np.round(data * 2)) + 1 if sign == "pos" else np.round(data * 2)
        if dtype == TP.BOOL:
            return self.const(data > 0)
        return self.const(np.asarray(data, NP_TYPES[dtype]), sign=sign)

    def splat(self, value: float, dims: Sequence[int], dtype: int) -> Tensor:
        """A uniform constant (0, 1, ... : what the identity rules look for)."""
        sign = "pos" if value > 0 else ("nonneg" if value == 0 else "")
        return self.const(np.full(tuple(dims), value, NP_TYPES[dtype]), sign=sign)

    # ---- nodes
    def node(
        self,
        op: str,
        inputs: Sequence[str],
        outs: Sequence[tuple[Dims, int]],
        sign: str = "",
        pool: bool = True,
        **attrs: Any,
    ) -> list[Tensor]:
        const = all(
            any(t.name == i and t.const for t in self.pool) or i in self.init_names() for i in inputs if i
        )
        assert all(not isinstance(d, int) or d >= 1 for dims, _ in outs for d in dims), (
            op,
            outs,
        )  # no empty tensors
        made = [Tensor(self.name("t"), tuple(dims), dtype, const=const, sign=sign) for dims, dtype in outs]
        self.nodes.append(helper.make_node(op, list(inputs), [t.name for t in made], **attrs))
        if pool:
            self.pool.extend(made)
        return made

    def node1(
        self, op: str, inputs: Sequence[str], dims: Dims, dtype: int, sign: str = "", **attrs: Any
    ) -> Tensor:
        return self.node(op, inputs, [(dims, dtype)], sign=sign, **attrs)[0]

    def init_names(self) -> set[str]:
        return {t.name for t in self.inits}

    def pick(self, pred: Callable[[Tensor], bool], allow_const: bool | None = None) -> Tensor | None:
        """A pool tensor satisfying ``pred``, newest first (hypothesis shrinks to the newest)."""
        if allow_const is None:
            allow_const = self.integer(0, 7) == 7
        cands = [t for t in reversed(self.pool) if pred(t) and (allow_const or not t.const)]
        cands = cands or [t for t in reversed(self.pool) if pred(t)]
        return cands[self.integer(0, len(cands) - 1)] if cands else None

    def pick_or_input(
        self, pred: Callable[[Tensor], bool], make: Callable[[GraphBuilder], Dims]
    ) -> Tensor | None:
        """``pick``, or (when nothing fits, and sometimes anyway) a new float input of ``make``'s
        dims, so ops that want a particular rank (Conv, Gemm) are not rare."""
        found = self.pick(pred)
        if found is None or self.integer(0, 3) == 3:
            dims = make(self)
            found = self.add_input(dims) if pred(Tensor("", dims, TP.FLOAT)) else found
        return found

    def partner_dims(self, dims: Dims) -> tuple[int, ...]:
        """Dims of a constant broadcasting with ``dims`` (sometimes growing the result)."""
        base = list(concrete(dims))
        mode = self.choice(["scalar", "same", "ones", "suffix", "grow"])
        if mode == "scalar":
            return ()
        if mode == "ones":
            return tuple(1 if self.flag() else d for d in base)
        if mode == "suffix":
            return tuple(base[self.integer(0, len(base)) :])
        if mode == "grow":
            base = [self.integer(2, 3) if d == 1 and self.flag() else d for d in base]
            return tuple([self.integer(1, 3), *base] if len(base) < 4 and self.flag() else base)
        return tuple(base)


def image_dims(b: GraphBuilder) -> Dims:
    batch: Dim = BATCH if b.symbolic and b.flag() else b.integer(1, 2)
    return (batch, b.integer(1, 4), *[b.integer(2, 5) for _ in range(b.integer(1, 2))])


def is_image(t: Tensor) -> bool:
    return t.dtype == TP.FLOAT and 3 <= t.rank <= 4 and all(isinstance(d, int) for d in t.dims[1:])


def is_matrix(t: Tensor) -> bool:
    return t.dtype == TP.FLOAT and t.rank == 2 and isinstance(t.dims[1], int)
