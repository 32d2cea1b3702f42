"""Lowering rules of QuantizeLinear and DequantizeLinear with one scale and zero point per tensor.

These are the activations' quantize/dequantize pairs of a QDQ model; its weights' per-channel
DequantizeLinear has constant inputs and is folded at compile time. Both are elementwise, so they
fuse into the kernels around them, computed as onnxruntime's MLAS does: dequantize subtracts the
zero point in integers and multiplies by the scale; quantize divides by the scale, rounds half to
even, adds the zero point and saturates to the integer type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .kernel_ir import (
    NUMPY_DTYPES,
    Binary,
    Cast,
    Compare,
    Const,
    Expr,
    Select,
    Unary,
    as_dtype,
    compute_dtype,
    is_float,
)
from .table import NotLowered, lowering
from .values import Lazy, elementwise

INTEGER_TYPES = ("i8", "u8", "i16", "u16")
"""Quantized types lowered natively (their values and differences are exact in int32 and float32)."""


def _per_tensor(nv: Any, xs: list[Lazy | None]) -> tuple[Lazy, Lazy, Lazy | None]:
    """The node's input, scale and zero point (None when absent); ``NotLowered`` unless the scale
    and zero point are one float and one integer for the whole tensor."""
    x, scale = xs[0], xs[1]
    assert x is not None and scale is not None
    zero = xs[2] if len(xs) > 2 else None
    if math.prod(scale.shape) != 1 or (zero is not None and math.prod(zero.shape) != 1):
        raise NotLowered(f"{nv.op_type} per axis or per block")
    if not is_float(scale.dtype):
        raise NotLowered(f"{nv.op_type} with a {scale.dtype} scale")
    return x, scale, zero


@lowering("DequantizeLinear", kind="elementwise")
def _dequantize(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x, scale, zero = _per_tensor(nv, xs)
    if x.dtype not in (*INTEGER_TYPES, "i32"):
        raise NotLowered(f"DequantizeLinear of {x.dtype}")
    dt = scale.dtype

    def dequantize(a: Expr, s: Expr, *z: Expr) -> Expr:
        centered = Binary("sub", Cast(a, "i32"), Cast(z[0], "i32")) if z else a
        return Binary("mul", Cast(centered, dt), s)

    return [elementwise(dequantize, [x, scale, *([zero] if zero is not None else [])], dt, shape=x.shape)]


@lowering("QuantizeLinear", kind="elementwise")
def _quantize(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    from .lower import ir_dtype

    x, scale, zero = _per_tensor(nv, xs)
    out = zero.dtype if zero is not None else ir_dtype(int(nv.attr("output_dtype", 0)) or 2)  # uint8 by default
    if out not in INTEGER_TYPES or not is_float(x.dtype):
        raise NotLowered(f"QuantizeLinear of {x.dtype} to {out}")
    info = np.iinfo(NUMPY_DTYPES[out])
    dt = compute_dtype(x.dtype)

    def quantize(a: Expr, s: Expr, *z: Expr) -> Expr:
        level: Expr = Unary("round", Binary("div", as_dtype(a, dt), as_dtype(s, dt)))  # half to even
        if z:
            level = Binary("add", level, Cast(z[0], dt))
        low, high = Const(float(info.min), dt), Const(float(info.max), dt)
        level = Select(Compare("lt", level, low), low, Select(Compare("gt", level, high), high, level))
        return Cast(level, out)

    return [elementwise(quantize, [x, scale, *([zero] if zero is not None else [])], out, shape=x.shape)]
