"""Elementwise ops: unary activations, broadcasting binary arithmetic, Where, Clip, Cast, Softmax."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import lang as L
from .registry import Attr, ExportNode, ImportNode, OpSpec, SplatConst, Unsupported, numel, register


def _clip_normalize(node: ImportNode) -> None:
    # Before opset 11 the bounds were float attributes; since then they are optional inputs.
    if node.opset < 11:
        dt = node.input_dtypes[0] or 1
        lo = node.attrs.pop("min", -math.inf)
        hi = node.attrs.pop("max", math.inf)
        node.inputs = [node.inputs[0], SplatConst(float(lo), (), dt), SplatConst(float(hi), (), dt)]


def _clip_export(node: ExportNode) -> None:
    if node.opset < 11:
        for i, attr in ((1, "min"), (2, "max")):
            if i < len(node.inputs) and node.inputs[i]:
                value = node.const_value(i)
                if value is None:
                    raise Unsupported(f"Clip at opset {node.opset} needs constant bounds")
                node.attrs[attr] = float(value.reshape(-1)[0])
        node.inputs = node.inputs[:1]


def _softmax_normalize(node: ImportNode) -> None:
    # Before opset 13 Softmax flattened the input to 2-D at `axis`; that equals the single-axis
    # form only when `axis` is the last axis.
    rank = node.input_rank(0)
    axis = node.attrs.get("axis", 1 if node.opset < 13 else -1)
    if node.opset < 13:
        if rank is None or (axis % rank if rank else 0) != rank - 1:
            raise Unsupported("Softmax before opset 13 over more than the last axis")
    if rank is not None and rank > 0:
        axis %= rank
    node.attrs["axis"] = axis


def _softmax_export(node: ExportNode) -> None:
    # At opset < 13 the modelled single-axis form is only imported/created for the last axis,
    # where both meanings agree.
    pass


def _legacy_broadcast(node: ImportNode) -> None:
    # Opset < 7 binary ops broadcast only with an explicit attribute and axis; keep the
    # numpy-style cases (no `axis`) and leave the others opaque.
    if node.opset < 7:
        if node.attrs.pop("axis", None) is not None:
            raise Unsupported("legacy broadcast with axis")
        node.attrs.pop("broadcast", None)
        node.attrs.pop("consumed_inputs", None)


def _legacy_broadcast_export(node: ExportNode) -> None:
    # Import dropped `broadcast=1`; without it an opset < 7 binary op needs equal shapes.
    if node.opset < 7:
        node.attrs["broadcast"] = 1


def _unary(op_type: str, ctor: Callable[..., Any], min_opset: int = 6) -> OpSpec:
    return OpSpec(op_type, ctor, ("X",), family="unary", min_opset=min_opset)


def _binary(op_type: str, ctor: Callable[..., Any]) -> OpSpec:
    return OpSpec(
        op_type,
        ctor,
        ("A", "B"),
        family="binary",
        normalize=_legacy_broadcast,
        export=_legacy_broadcast_export,
    )


register(
    _unary("Relu", L.relu),
    _unary("Sigmoid", L.sigmoid),
    _unary("Tanh", L.tanh),
    _unary("Erf", L.erf, 9),
    _unary("IsNaN", L.isnan, 9),
    _unary("Neg", L.neg),
    _unary("Exp", L.exp),
    _unary("Log", L.log),
    _unary("Sqrt", L.sqrt),
    _unary("Reciprocal", L.reciprocal),
    _unary("Abs", L.abs_),
    _unary("Identity", L.identity, 1),
    OpSpec("LeakyRelu", L.leaky_relu, ("X",), (Attr("alpha", "float", 0.01),), min_opset=6),
    OpSpec("Gelu", L.gelu, ("X",), (Attr("approximate", "string", "none"),), min_opset=20),
    OpSpec("HardSigmoid", L.hard_sigmoid, ("X",), (Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)), min_opset=6),
    _unary("HardSwish", L.hard_swish, 14),
    OpSpec("Swish", L.swish, ("X",), (Attr("alpha", "float", 1.0),), min_opset=24),
    OpSpec("Cast", L.cast, ("input",), (Attr("to", "int", None),), min_opset=6),
    OpSpec(
        "Clip", L.clip, ("input", "min?", "max?"), family="unary", normalize=_clip_normalize, export=_clip_export, min_opset=6
    ),
    OpSpec(
        "Softmax",
        L.softmax,
        ("input",),
        (Attr("axis", "int", -1),),
        normalize=_softmax_normalize,
        export=_softmax_export,
        flops=lambda ctx: 5.0 * numel(ctx.out_shape),
    ),
    _binary("Add", L.add),
    _binary("Sub", L.sub),
    _binary("Mul", L.mul),
    _binary("Div", L.div),
    _binary("Pow", L.pow_),
    OpSpec("Where", L.where, ("condition", "X", "Y"), family="ternary", min_opset=9),
)
