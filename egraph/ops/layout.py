"""Layout and data-movement ops, reductions, and shape ops.

Opset history handled here: Squeeze/Unsqueeze/Split/ReduceSum took their axes/split as
attributes before opset 13 (ReduceMean before 18), Slice its starts/ends/axes before 10,
Pad its pads/value before 11, Reshape its shape before 5. Import always makes them inputs;
export turns constant inputs back into attributes where the target opset wants them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import lang as L
from .registry import (
    INT64_MAX,
    Attr,
    ExportNode,
    ImportNode,
    IntsConst,
    OpSpec,
    SplatConst,
    Unsupported,
    no_flops,
    numel,
    register,
)


def _attr_to_input(node: ImportNode, attr: str, position: int, before_opset: int) -> None:
    """Move an ints attribute into input ``position`` for opsets older than ``before_opset``."""
    if node.opset >= before_opset:
        return
    values = node.attrs.pop(attr, None)
    while len(node.inputs) <= position:
        node.inputs.append(None)
    node.inputs[position] = None if values is None else IntsConst(tuple(int(v) for v in values))


def _input_to_attr(node: ExportNode, attr: str, position: int, before_opset: int) -> None:
    """Turn constant input ``position`` back into an attribute for opsets older than ``before_opset``."""
    if node.opset >= before_opset:
        return
    if position < len(node.inputs) and node.inputs[position]:
        values = node.const_ints(position)
        if values is None:
            raise Unsupported(f"{node.op_type} at opset {node.opset} needs a constant {attr}")
        node.attrs[attr] = values
    node.inputs = node.inputs[:position]


LAYOUT_STAMP = "onnxsat.layout"
"""Node metadata key of the Identity a reorder e-node is written as: its value (``NCHWC``) is the
layout extraction chose for the depthwise Conv reading the Identity's output; the lowering runs
that conv in it and drops the Identity."""
NCHWC = "nchwc"


def _reorder_export(node: ExportNode) -> None:
    """An Identity stamped with the layout (onnxruntime copies it; the lowering reads the stamp and
    drops the node)."""
    node.op_type = "Identity"
    node.metadata[LAYOUT_STAMP] = NCHWC


def _transpose_normalize(node: ImportNode) -> None:
    if "perm" not in node.attrs:
        rank = node.input_rank(0)
        if rank is None:
            raise Unsupported("Transpose without perm and unknown rank")
        node.attrs["perm"] = list(range(rank))[::-1]


def _axis_normalize(node: ImportNode) -> None:
    """A negative ``axis`` (opset >= 11) counted from the front when the rank is known, so the
    shape rules (written per non-negative axis) and rewrite patterns see one form."""
    axis = node.attrs.get("axis")
    if axis is None or axis >= 0:
        return
    rank = next((r for i in range(len(node.inputs)) if (r := node.input_rank(i)) is not None), None)
    if rank is not None:
        node.attrs["axis"] = axis + rank


def _reshape_normalize(node: ImportNode) -> None:
    if node.opset < 5:
        node.inputs = [node.inputs[0], IntsConst(tuple(node.attrs.pop("shape")))]
        node.attrs.pop("consumed_inputs", None)


def _reshape_export(node: ExportNode) -> None:
    if node.opset < 14:
        if node.attrs.pop("allowzero", 0):
            raise Unsupported("Reshape allowzero needs opset 14")
    _input_to_attr(node, "shape", 1, 5)


def _axes_normalize(before_opset: int):
    def normalize(node: ImportNode) -> None:
        _attr_to_input(node, "axes", 1, before_opset)

    return normalize


def _axes_export(before_opset: int):
    def export(node: ExportNode) -> None:
        _input_to_attr(node, "axes", 1, before_opset)

    return export


def _split_normalize(node: ImportNode) -> None:
    _attr_to_input(node, "split", 1, 13)
    if len(node.inputs) < 2 or node.inputs[1] is None:
        node.attrs.setdefault("num_outputs", node.n_outputs)  # equal split: remember how many
    elif node.const_ints(node.inputs[1]) is None:
        # Sizes only known at run time: the node's output count is not recoverable from them.
        node.attrs["num_outputs"] = node.n_outputs


def _split_export(node: ExportNode) -> None:
    if node.opset < 18 or (len(node.inputs) > 1 and node.inputs[1]):
        node.attrs.pop("num_outputs", None)
    _input_to_attr(node, "split", 1, 13)


def _slice_normalize(node: ImportNode) -> None:
    """Opset < 10's attributes as inputs; unit steps as absent ones (the default), so rules over
    step-less Slices also match the exporters' explicit ``steps=[1]``."""
    if len(node.inputs) > 4 and node.inputs[4] is not None and set(node.const_ints(node.inputs[4]) or ()) == {1}:
        node.inputs[4] = None
    if node.opset < 10:
        starts = node.attrs.pop("starts")
        ends = node.attrs.pop("ends")
        axes = node.attrs.pop("axes", None)
        node.inputs = [
            node.inputs[0],
            IntsConst(tuple(starts)),
            IntsConst(tuple(ends)),
            None if axes is None else IntsConst(tuple(axes)),
            None,
        ]


def _slice_export(node: ExportNode) -> None:
    if node.opset >= 10:
        return
    values = [node.const_ints(i) if i < len(node.inputs) and node.inputs[i] else None for i in range(5)]
    if values[1] is None or values[2] is None or (values[4] is not None and any(s != 1 for s in values[4])):
        raise Unsupported("Slice at opset < 10 needs constant starts/ends and unit steps")
    node.attrs.update(starts=values[1], ends=values[2])
    if values[3] is not None:
        node.attrs["axes"] = values[3]
    node.inputs = node.inputs[:1]


def _pad_normalize(node: ImportNode) -> None:
    mode = node.attrs.get("mode", "constant")
    node.attrs["mode"] = mode.decode() if isinstance(mode, bytes) else mode
    if node.opset < 11:
        pads = node.attrs.pop("pads", None) or node.attrs.pop("paddings")
        value = float(node.attrs.pop("value", 0.0))
        node.inputs = [node.inputs[0], IntsConst(tuple(pads)), SplatConst(value, (), node.input_dtypes[0] or 1), None]


def _pad_export(node: ExportNode) -> None:
    if node.opset >= 11:
        return
    pads = node.const_ints(1)
    value = node.const_value(2) if len(node.inputs) > 2 and node.inputs[2] else None
    if pads is None or (len(node.inputs) > 3 and node.inputs[3]):
        raise Unsupported("Pad at opset < 11 needs constant pads and no axes")
    node.attrs["pads"] = pads
    if value is not None:
        node.attrs["value"] = float(value.reshape(-1)[0])
    node.inputs = node.inputs[:1]


def _reduce_normalize(before_opset: int):
    def normalize(node: ImportNode) -> None:
        _attr_to_input(node, "axes", 1, before_opset)

    return normalize


def _reduce_export(before_opset: int):
    def export(node: ExportNode) -> None:
        if node.opset < 18 and node.attrs.get("noop_with_empty_axes", 0) and node.op_type != "ReduceSum":
            raise Unsupported("noop_with_empty_axes needs opset 18")
        if node.opset < 13:
            node.attrs.pop("noop_with_empty_axes", None)
        _input_to_attr(node, "axes", 1, before_opset)

    return export


def _shape_export(node: ExportNode) -> None:
    if node.opset < 15:
        if node.attrs.get("start", 0) != 0 or node.attrs.get("end", INT64_MAX) != INT64_MAX:
            raise Unsupported("Shape start/end need opset 15")
        node.attrs.pop("start", None)
        node.attrs.pop("end", None)


def _constant_of_shape_normalize(node: ImportNode) -> None:
    value = node.attrs.pop("value", None)
    if value is None:
        node.attrs["value"], node.attrs["dtype"] = 0.0, 1
        return
    import onnx.numpy_helper

    array = onnx.numpy_helper.to_array(value)
    node.attrs["value"], node.attrs["dtype"] = float(array.reshape(-1)[0]), int(value.data_type)


def _constant_of_shape_export(node: ExportNode) -> None:
    import numpy as np
    import onnx.helper

    dt = node.attrs.pop("dtype")
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dt)
    node.attrs["value"] = onnx.numpy_helper.from_array(np.array([node.attrs.pop("value")], dtype=np_dtype), "value")


def _reduce(op_type: str, ctor: Callable[..., Any], axes_input_since: int) -> OpSpec:
    return OpSpec(
        op_type,
        ctor,
        ("data", "axes?"),
        (Attr("keepdims", "int", 1), Attr("noop_with_empty_axes", "int", 0)),
        family="reduce",
        normalize=_reduce_normalize(axes_input_since),
        export=_reduce_export(axes_input_since),
        flops=lambda ctx: float(numel(ctx.in_shapes[0])),
    )


register(
    OpSpec(
        "Transpose", L.transpose, ("data",), (Attr("perm", "ints"),), family="layout", normalize=_transpose_normalize
    ),
    OpSpec(
        "Reshape",
        L.reshape,
        ("data", "shape"),
        (Attr("allowzero", "int", 0),),
        family="layout",
        normalize=_reshape_normalize,
        export=_reshape_export,
        flops=no_flops,
    ),
    OpSpec(
        "Flatten",
        L.flatten,
        ("input",),
        (Attr("axis", "int", 1),),
        family="layout",
        normalize=_axis_normalize,
        flops=no_flops,
    ),
    OpSpec(
        "Squeeze",
        L.squeeze,
        ("data", "axes?"),
        family="layout",
        normalize=_axes_normalize(13),
        export=_axes_export(13),
        flops=no_flops,
    ),
    OpSpec(
        "Unsqueeze",
        L.unsqueeze,
        ("data", "axes"),
        family="layout",
        normalize=_axes_normalize(13),
        export=_axes_export(13),
        flops=no_flops,
    ),
    OpSpec(
        "Concat", L.concat, ("inputs*",), (Attr("axis", "int"),), family="layout", normalize=_axis_normalize
    ),
    OpSpec(
        "Split",
        L.split,
        ("input", "split?"),
        (Attr("axis", "int", 0), Attr("num_outputs", "int", 0)),
        family="layout",
        normalize=_split_normalize,
        export=_split_export,
        indexed_outputs=True,
    ),
    OpSpec(
        "Slice",
        L.slice_,
        ("data", "starts", "ends", "axes?", "steps?"),
        family="layout",
        normalize=_slice_normalize,
        export=_slice_export,
    ),
    OpSpec("Gather", L.gather, ("data", "indices"), (Attr("axis", "int", 0),), family="layout"),
    OpSpec("Expand", L.expand, ("input", "shape"), family="layout", min_opset=8),
    OpSpec(
        "Pad",
        L.pad,
        ("data", "pads", "constant_value?", "axes?"),
        (Attr("mode", "string", "constant"),),
        family="layout",
        normalize=_pad_normalize,
        export=_pad_export,
    ),
    _reduce("ReduceMean", L.reduce_mean, 18),
    _reduce("ReduceSum", L.reduce_sum, 13),
    _reduce("ReduceMax", L.reduce_max, 18),
    OpSpec(
        "Shape",
        L.shape_of,
        ("data",),
        (Attr("start", "int", 0), Attr("end", "int", INT64_MAX)),
        family="shape",
        export=_shape_export,
        flops=no_flops,
    ),
    OpSpec(
        "ConstantOfShape",
        L.constant_of_shape,
        ("input",),
        (Attr("value", "float"), Attr("dtype", "int")),
        family="shape",
        normalize=_constant_of_shape_normalize,
        export=_constant_of_shape_export,
        min_opset=9,
    ),
    OpSpec("onnxsat.ReorderNCHWc", L.reorder_nchwc, ("X",), family="layout", export=_reorder_export, flops=no_flops),
)
