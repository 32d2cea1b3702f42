"""Integer and boolean computations on small constants, evaluated at import.

Exporters compute shapes with ops the e-graph keeps opaque: TorchScript writes
``x.expand(b, -1, t, s)`` as ``Where(Equal(target, -1 * ones), ones, target)``, so the Expand's
target, and with it the shape of an attention mask, would stay unknown to the shape analysis
(and ONNX shape inference names its dims ``unk__N``). Such a node, when every input is a small
constant and every output a small integer or boolean tensor, is evaluated with
``onnx.reference`` and imported as a constant: the values are exact (integer arithmetic and
comparisons on integer and boolean inputs), so nothing about a size is guessed. Only ops whose output size is bounded by
their inputs' sizes are evaluated (never Expand, Tile, Range or ConstantOfShape of a value).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .fold import evaluate_node

MAX_ELEMENTS = 64
"""Inputs and outputs of an evaluated node have at most this many elements each."""

OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Sign", "Min", "Max",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where",
    "Cast", "Identity", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten",
    "Shape", "Size", "ReduceSum", "ReduceProd", "ReduceMin", "ReduceMax",
})  # fmt: skip
"""Ops evaluated: elementwise (the output is the broadcast of the inputs) and views of their input."""

_EXACT = frozenset({
    onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8,
    onnx.TensorProto.BOOL,
})  # fmt: skip


def _type(array: np.ndarray) -> int:
    try:
        return int(helper.np_dtype_to_tensor_dtype(array.dtype))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.UNDEFINED


def small(array: np.ndarray) -> bool:
    """Whether a constant is small enough to take part (a shape-sized value)."""
    return array.size <= MAX_ELEMENTS


def evaluate(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """The outputs of ``node`` on constant ``inputs`` (None for an absent optional input), or None
    where it is not evaluated: another op or domain, a graph attribute, an input or output that is
    not small, an output that is not an integer or boolean tensor, or onnx.reference failing."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in OPS or not node.output:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    given = [a for a in inputs if a is not None]
    if any(not small(a) for a in given):
        return None
    if node.op_type not in ("Shape", "Size") and any(_type(a) not in _EXACT for a in given):
        return None  # float inputs (a Cast of a NaN, rounding) are left to the e-graph
    if node.op_type in ("Div", "Mod") and len(given) == 2 and not np.all(given[1]):
        return None  # division by zero has no defined value
    try:
        results = evaluate_node(node, inputs, [helper.make_opsetid("", opset)])
    except Exception:  # onnx.reference cannot compute it: the node stays a node
        return None
    arrays = []
    for out in results:
        if not isinstance(out, np.ndarray | np.generic):
            return None
        array = np.asarray(out)
        if not small(array) or array.dtype == object:
            return None
        if _type(array) not in _EXACT:
            return None
        arrays.append(array)
    return arrays
