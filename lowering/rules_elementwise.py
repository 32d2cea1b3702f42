"""Lowering rules of elementwise ops: they compose ``Lazy`` tensors, so chains fuse into one kernel."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .kernel_ir import Binary, Cast, Compare, Const, Expr, Select, Unary, dtype_of, is_float
from .table import NotLowered, lowering
from .values import Lazy, elementwise, scalar

SQRT1_2 = 1.0 / math.sqrt(2.0)
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)


def c(value: float, like: Expr | str) -> Const:
    """A constant of the dtype of ``like`` (an expression or a dtype name)."""
    dtype = like if isinstance(like, str) else dtype_of(like)
    if not is_float(dtype):
        value = int(value)
    return Const(value, dtype)


def _floats(x: Lazy, op: str) -> None:
    if not is_float(x.dtype):
        raise NotLowered(f"{op} on {x.dtype}")


# ---------------------------------------------------------------- scalar formulas
def relu(a: Expr) -> Expr:
    return Select(Compare("gt", a, c(0, a)), a, c(0, a))


def sigmoid(a: Expr) -> Expr:
    return Unary("sigmoid", a)


def gelu_erf(a: Expr) -> Expr:
    half_x = Binary("mul", a, c(0.5, a))
    return Binary("mul", half_x, Binary("add", c(1.0, a), Unary("erf", Binary("mul", a, c(SQRT1_2, a)))))


def gelu_tanh(a: Expr) -> Expr:
    cube = Binary("mul", Binary("mul", a, a), a)
    inner = Binary("mul", Binary("add", a, Binary("mul", cube, c(0.044715, a))), c(GELU_TANH_SCALE, a))
    return Binary("mul", Binary("mul", a, c(0.5, a)), Binary("add", c(1.0, a), Unary("tanh", inner)))


def hard_sigmoid(a: Expr, alpha: float, beta: float) -> Expr:
    lin = Binary("add", Binary("mul", a, c(alpha, a)), c(beta, a))
    return Binary("min", Binary("max", lin, c(0.0, a)), c(1.0, a))


_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "Relu": relu,
    "Sigmoid": sigmoid,
    "Tanh": lambda a: Unary("tanh", a),
    "Erf": lambda a: Unary("erf", a),
    "Neg": lambda a: Unary("neg", a),
    "Exp": lambda a: Unary("exp", a),
    "Log": lambda a: Unary("log", a),
    "Sqrt": lambda a: Unary("sqrt", a),
    "Reciprocal": lambda a: Unary("recip", a),
    "Abs": lambda a: Unary("abs", a),
    "Identity": lambda a: a,
    "onnxsat.ReorderNCHWc": lambda a: a,  # a layout choice, written as a stamped Identity (``layout_marks``)
    "onnxsat.FusedSiLU": lambda a: Binary("mul", a, sigmoid(a)),
}
_FLOAT_ONLY = {"Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "onnxsat.FusedSiLU"}


@lowering(*_UNARY, kind="elementwise")
def _unary(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    (x,) = xs[:1]
    assert x is not None
    if nv.op_type in _FLOAT_ONLY:
        _floats(x, nv.op_type)
    if nv.op_type == "Identity":
        return [x]
    return [elementwise(_UNARY[nv.op_type], [x], x.dtype)]


@lowering("LeakyRelu", kind="elementwise")
def _leaky_relu(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    alpha = float(nv.attr("alpha", 0.01))
    return [elementwise(lambda a: Select(Compare("lt", a, c(0, a)), Binary("mul", a, c(alpha, a)), a), [x], x.dtype)]


@lowering("HardSigmoid", kind="elementwise")
def _hard_sigmoid(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    alpha, beta = float(nv.attr("alpha", 0.2)), float(nv.attr("beta", 0.5))
    return [elementwise(lambda a: hard_sigmoid(a, alpha, beta), [x], x.dtype)]


@lowering("HardSwish", kind="elementwise")
def _hard_swish(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    return [elementwise(lambda a: Binary("mul", a, hard_sigmoid(a, 1.0 / 6.0, 0.5)), [x], x.dtype)]


@lowering("Swish", kind="elementwise")
def _swish(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    alpha = float(nv.attr("alpha", 1.0))
    return [elementwise(lambda a: Binary("mul", a, sigmoid(Binary("mul", a, c(alpha, a)))), [x], x.dtype)]


@lowering("Gelu", "onnxsat.FusedGelu", kind="elementwise")
def _gelu(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    formula = gelu_tanh if nv.attr("approximate", "none") == "tanh" else gelu_erf
    return [elementwise(formula, [x], x.dtype)]


@lowering("onnxsat.FusedBiasGelu", kind="elementwise")
def _bias_gelu(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x, bias = xs[0], xs[1]
    assert x is not None and bias is not None
    formula = gelu_tanh if nv.attr("approximate", "none") == "tanh" else gelu_erf
    return [elementwise(lambda a, b: formula(Binary("add", a, b)), [x, bias], x.dtype)]


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@lowering(*_BINARY, kind="elementwise")
def _binary(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    if a.dtype != b.dtype:
        raise NotLowered(f"{nv.op_type} of {a.dtype} and {b.dtype}")
    if a.dtype == "bool":
        raise NotLowered(f"{nv.op_type} on bool")
    op = _BINARY[nv.op_type]
    return [elementwise(lambda p, q: Binary(op, p, q), [a, b], a.dtype)]


def _pow_formula(exponent: float | None, base_dtype: str, exp_dtype: str) -> Callable[[Expr, Expr], Expr]:
    """``a ** b``; small constant exponents become multiplies (x*x, sqrt), as ORT does."""
    if is_float(base_dtype):
        if exponent == 1.0:
            return lambda a, b: a
        if exponent == 2.0:
            return lambda a, b: Binary("mul", a, a)
        if exponent == 3.0:
            return lambda a, b: Binary("mul", Binary("mul", a, a), a)
        if exponent == 0.5:
            return lambda a, b: Unary("sqrt", a)

        def general(a: Expr, b: Expr) -> Expr:
            return Binary("pow", a, b if exp_dtype == base_dtype else Cast(b, base_dtype))

        return general

    def integer(a: Expr, b: Expr) -> Expr:
        return Cast(Binary("pow", Cast(a, "f64"), Cast(b, "f64")), base_dtype)

    return integer


@lowering("Pow", kind="elementwise")
def _pow(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    if a.dtype == "bool" or b.dtype == "bool":
        raise NotLowered("Pow on bool")
    value = nv.const(1)
    exponent = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.asarray(value).size == 1 else None
    return [elementwise(_pow_formula(exponent, a.dtype, b.dtype), [a, b], a.dtype)]


_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}


@lowering(*_COMPARE, kind="elementwise")
def _compare(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """Ordered comparisons: false where either side is NaN, as ONNX (and IEEE) define them."""
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    if a.dtype != b.dtype or (a.dtype == "bool" and nv.op_type != "Equal"):
        raise NotLowered(f"{nv.op_type} of {a.dtype} and {b.dtype}")
    op = _COMPARE[nv.op_type]
    return [elementwise(lambda p, q: Compare(op, p, q), [a, b], "bool")]


_LOGICAL = {"And": "and", "Or": "or"}


@lowering("And", "Or", "Xor", kind="elementwise")
def _logical(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    if a.dtype != "bool" or b.dtype != "bool":
        raise NotLowered(f"{nv.op_type} of {a.dtype} and {b.dtype}")
    if nv.op_type == "Xor":
        return [elementwise(lambda p, q: Compare("ne", p, q), [a, b], "bool")]
    op = _LOGICAL[nv.op_type]
    return [elementwise(lambda p, q: Binary(op, p, q), [a, b], "bool")]


@lowering("Not", kind="elementwise")
def _not(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None and x.dtype == "bool"
    return [elementwise(lambda a: Unary("not", a), [x], "bool")]


@lowering("IsNaN", kind="elementwise")
def _isnan(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """x != x: the unordered comparison is true exactly on NaN."""
    x = xs[0]
    assert x is not None
    return [elementwise(lambda a: Compare("ne", a, a), [x], "bool")]


@lowering("Where", kind="elementwise")
def _where(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    cond, a, b = xs[0], xs[1], xs[2]
    assert cond is not None and a is not None and b is not None
    if a.dtype != b.dtype:
        raise NotLowered("Where of different dtypes")
    return [elementwise(lambda k, p, q: Select(k if dtype_of(k) == "bool" else Compare("ne", k, c(0, k)), p, q), [cond, a, b], a.dtype)]


@lowering("Clip", kind="elementwise")
def _clip(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    lo = xs[1] if len(xs) > 1 else None
    hi = xs[2] if len(xs) > 2 else None
    if nv.opset < 11:
        lo = scalar(float(nv.attr("min", -math.inf)), x.dtype) if "min" in nv.attrs else None
        hi = scalar(float(nv.attr("max", math.inf)), x.dtype) if "max" in nv.attrs else None
    parts = [x] + [v for v in (lo, hi) if v is not None]
    has_lo, has_hi = lo is not None, hi is not None

    def clip(a: Expr, *bounds: Expr) -> Expr:
        out, k = a, 0
        if has_lo:
            out = Select(Compare("lt", out, bounds[k]), bounds[k], out)
            k += 1
        if has_hi:
            out = Select(Compare("gt", out, bounds[k]), bounds[k], out)
        return out

    return [elementwise(clip, parts, x.dtype, shape=x.shape)]


@lowering("Cast", kind="elementwise")
def _cast(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    from .lower import ir_dtype

    x = xs[0]
    assert x is not None
    to = ir_dtype(int(nv.attr("to")))
    if nv.attr("saturate", 1) != 1 and to.startswith("f"):
        raise NotLowered("Cast saturate=0")
    if to == x.dtype:
        return [x]
    if to == "bool":
        return [elementwise(lambda a: Compare("ne", a, c(0, a)), [x], "bool")]
    return [elementwise(lambda a: Cast(a, to), [x], to)]


@lowering("BatchNormalization", kind="elementwise")
def _batch_norm(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    _floats(x, nv.op_type)
    if nv.attr("training_mode", 0):
        raise NotLowered("BatchNormalization training_mode")
    eps = float(nv.attr("epsilon", 1e-5))
    channel_shape = (x.shape[1],) + (1,) * (len(x.shape) - 2) if len(x.shape) > 1 else (1,)
    consts = [nv.const(i) for i in range(1, 5)]
    if all(v is not None for v in consts):
        scale, bias, mean, var = (np.asarray(v, dtype=np.float64) for v in consts)  # type: ignore[arg-type]
        a = scale / np.sqrt(var + eps)
        b = bias - mean * a
        np_dt = np.float32 if x.dtype == "f32" else np.float64
        la = cx.const_lazy(a.astype(np_dt).reshape(channel_shape))
        lb = cx.const_lazy(b.astype(np_dt).reshape(channel_shape))
        return [elementwise(lambda p, q, r: Binary("add", Binary("mul", p, q), r), [x, la, lb], x.dtype)]
    from .values import reshape

    params = [reshape(v, channel_shape) for v in xs[1:5] if v is not None]

    def bn(p: Expr, s: Expr, bb: Expr, m: Expr, v: Expr) -> Expr:
        inv = Unary("recip", Unary("sqrt", Binary("add", v, c(eps, v))))
        return Binary("add", Binary("mul", Binary("mul", Binary("sub", p, m), inv), s), bb)

    return [elementwise(bn, [x, *params], x.dtype)]


_VARIADIC = {"Sum": "add", "Max": "max", "Min": "min", "Mean": "add"}


@lowering(*_VARIADIC, kind="elementwise")
def _variadic(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    parts = [x for x in xs if x is not None]
    if len({x.dtype for x in parts}) != 1 or not is_float(parts[0].dtype):
        raise NotLowered(f"{nv.op_type} of {[x.dtype for x in parts]}")
    op = _VARIADIC[nv.op_type]
    scale = 1.0 / len(parts) if nv.op_type == "Mean" else None

    def fold(*values: Expr) -> Expr:
        out = values[0]
        for v in values[1:]:
            out = Binary(op, out, v)
        return out if scale is None else Binary("mul", out, c(scale, out))

    return [elementwise(fold, parts, parts[0].dtype)]


@lowering("Dropout", kind="elementwise")
def _dropout(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """Inference: the identity (a training-mode Dropout is random and is not lowered)."""
    x = xs[0]
    assert x is not None
    training = nv.const(2) if nv.has(2) else None
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        raise NotLowered("Dropout in training mode")
    if nv.has(2) and training is None:
        raise NotLowered("Dropout training_mode known only at run time")
    mask = scalar(True, "bool", x.shape) if len(nv.outputs) > 1 and nv.outputs[1] else None
    return [x, mask]
