"""Layout rules: transposes through elementwise ops and Concat, view-op chains (Reshape,
Flatten, Squeeze, Unsqueeze), Cast-to-same, Pad folded into Conv/AveragePool, and folding of the
Shape -> Gather -> Concat shape arithmetic PyTorch exports (onnx-simplifier's main win).
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import String, Vec, f64, i64, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ...egraph.shapes import MAX_RANK, norm_axis
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("layout")
SHAPE_FAMILY = Family("shape-arith")
FAMILIES = (FAMILY, SHAPE_FAMILY)

x, y, z, c, lo, hi, w, b = vars_("x y z c lo hi w b", L.Tensor)
p, sa, sb, va, vb, vc, strides, pads, dil, kernel = vars_("p sa sb va vb vc strides pads dil kernel", Vec[i64])
ia, ib, ic, to, group, ceil_mode, dt = vars_("ia ib ic to group ceil_mode dt", i64)
fa, fb = vars_("fa fb", f64)
(mode,) = vars_("mode", String)


UNARY: dict[str, Callable[[L.Tensor], L.Tensor]] = {
    "relu": L.relu,
    "sigmoid": L.sigmoid,
    "tanh": L.tanh,
    "erf": L.erf,
    "neg": L.neg,
    "exp": L.exp,
    "log": L.log,
    "sqrt": L.sqrt,
    "reciprocal": L.reciprocal,
    "abs": L.abs_,
    "leaky_relu": lambda v: L.leaky_relu(v, fa),
    "gelu": lambda v: L.gelu(v, mode),
    "cast": lambda v: L.cast(v, to),
    "clip": lambda v: L.clip(v, lo, hi),
}
"""Elementwise unary ops (with their attributes as pattern variables)."""

BINARY: dict[str, Callable[[L.Tensor, L.Tensor], L.Tensor]] = {
    "add": L.add,
    "sub": L.sub,
    "mul": L.mul,
    "div": L.div,
    "pow": L.pow_,
}

# ---------------------------------------------------------------- transposes through elementwise ops
for _name, _f in UNARY.items():
    # f(transpose(x)) => transpose(f(x)): moves transposes next to each other so they cancel.
    FAMILY.rewrite("transpose-sink-unary", _f(L.transpose(x, p)), L.transpose(_f(x), p), variant=_name)
for _name, _g in BINARY.items():
    # g(T(a), T(b)) => T(g(a, b)) for equal ranks (broadcasting commutes with a shared permutation).
    FAMILY.rewrite(
        "transpose-sink-binary",
        _g(L.transpose(x, p), L.transpose(y, p)),
        L.transpose(_g(x, y), p),
        L.shape(x) == sa,
        L.shape(y) == sb,
        sa.length() == sb.length(),
        variant=_name,
    )
    # g(T(a), s) and g(s, T(a)) => T(g(a, s)) for a scalar s.
    FAMILY.rewrite(
        "transpose-sink-scalar",
        _g(L.transpose(x, p), c),
        L.transpose(_g(x, c), p),
        L.shape(c) == Vec[i64].empty(),
        variant=f"{_name}-right",
    )
    FAMILY.rewrite(
        "transpose-sink-scalar",
        _g(c, L.transpose(x, p)),
        L.transpose(_g(c, x), p),
        L.shape(c) == Vec[i64].empty(),
        variant=f"{_name}-left",
    )

# ---------------------------------------------------------------- Concat and elementwise ops
for _name, _f in UNARY.items():
    # concat(f(a), f(b)) => f(concat(a, b)) (TASO): one op over the concatenation.
    # (The inputs must share a dtype for the inner Concat to be valid: Cast may unify them.)
    FAMILY.rewrite(
        "concat-unary",
        L.concat(L.tlist([_f(x), _f(y)]), ia),
        _f(L.concat(L.tlist([x, y]), ia)),
        L.dtype(x) == dt,
        L.dtype(y) == dt,
        variant=f"{_name}-2",
    )
    FAMILY.rewrite(
        "concat-unary",
        L.concat(L.tlist([_f(x), _f(y), _f(z)]), ia),
        _f(L.concat(L.tlist([x, y, z]), ia)),
        L.dtype(x) == dt,
        L.dtype(y) == dt,
        L.dtype(z) == dt,
        variant=f"{_name}-3",
    )

# ---------------------------------------------------------------- view chains
def _views(tag: str) -> dict[str, Callable[[L.Tensor], L.Tensor]]:
    """View ops over pattern variables of their own (``tag`` keeps inner and outer apart)."""
    target, axes = vars_(f"target{tag} axes{tag}", L.Tensor)
    (attr,) = vars_(f"attr{tag}", i64)
    return {
        "reshape": lambda v: L.reshape(v, target, attr),
        "flatten": lambda v: L.flatten(v, attr),
        "squeeze": lambda v: L.squeeze(v, axes),
        "unsqueeze": lambda v: L.unsqueeze(v, axes),
    }


VIEWS = _views("")
_INNER = _views("_inner")
VIEW_CHAIN_MAX_RANK = 4
"""Output ranks up to which view-view-to-reshape applies (views.py covers any rank whose Reshape
target is literal)."""
# Every dim of the result known, at any rank up to the maximum in one rule: the shape padded with
# known dims (0s) to the maximum rank, each entry of that at least 0.
_all_known = (
    L.shape(t) == sa,
    sa.length() <= i64(VIEW_CHAIN_MAX_RANK),
    *[sa.append(Vec(*[i64(0)] * (VIEW_CHAIN_MAX_RANK + 1)))[i] >= i64(0) for i in range(VIEW_CHAIN_MAX_RANK)],
)
for _outer, _v2 in VIEWS.items():
    for _inner, _v1 in _INNER.items():
        if _outer == _inner == "reshape":
            continue  # core's reshape-reshape
        # Two view ops are one Reshape to the final shape (then it may vanish, see below).
        FAMILY.rewrite(
            "view-view-to-reshape",
            _v2(_v1(x)),
            L.reshape(x, L.Tensor.ints(sa, i64(1)), i64(0)),
            *_all_known,
            variant=f"{_outer}-{_inner}",
        )
for _name, _v in VIEWS.items():
    if _name in ("reshape", "unsqueeze"):
        continue  # core's reshape-noop; an Unsqueeze always adds dims
    # A view op that does not change the shape is a no-op.
    FAMILY.rewrite("view-noop", _v(x), x, L.shape(t) == sa, L.shape(x) == sa, variant=_name)

# Cast to the type a tensor already has is a no-op.
FAMILY.rewrite("cast-same", L.cast(x, to), x, L.dtype(x) == to)

# ---------------------------------------------------------------- Pad folded into Conv / AveragePool
for _n in (1, 2, 3):
    _r = _n + 2
    _spatial_pads = Vec(*[pads[i] + va[2 + i] for i in range(_n)], *[pads[_n + i] + va[_r + 2 + i] for i in range(_n)])
    _pad_ok: tuple[FactLike, ...] = (
        va.length() == i64(2 * _r),
        va[0] == i64(0),
        va[1] == i64(0),
        va[_r] == i64(0),
        va[_r + 1] == i64(0),
        *[va[i] >= i64(0) for i in range(2 * _r)],
    )
    for _variant, _value in (("zero", L.Tensor.splat(f64(0.0), vb, ic)), ("default", L.Tensor.none())):
        _padded = L.pad(x, L.Tensor.ints(va, i64(1)), _value, L.Tensor.none(), String("constant"))
        # A zero Pad before a Conv is the Conv's own padding.
        FAMILY.rewrite(
            "pad-into-conv",
            L.conv(_padded, w, b, strides, pads, dil, group),
            L.conv(x, w, b, strides, _spatial_pads, dil, group),
            *_pad_ok,
            variant=f"{_variant}-{_n}",
        )
        # ... and an AveragePool's when padded zeros are counted (count_include_pad=1).
        # (floor mode only: with ceil_mode a window starting in the end padding is kept after an
        # explicit Pad but dropped by the pool's own padding; pads must stay below the kernel.)
        FAMILY.rewrite(
            "pad-into-avgpool",
            L.average_pool(_padded, kernel, strides, pads, i64(0), i64(1)),
            L.average_pool(x, kernel, strides, _spatial_pads, i64(0), i64(1)),
            *_pad_ok,
            kernel.length() == i64(_n),
            *[_spatial_pads[i] < kernel[i % _n] for i in range(2 * _n)],
            variant=f"{_variant}-{_n}",
        )

# ---------------------------------------------------------------- the layout a depthwise conv reads
# A depthwise conv (one input channel per group) may read its input channel-blocked: the same
# values in another layout, priced by the onnxsat-cpu cost model (its kernel, and the reorder copy
# unless the producer stores blocked) against the flat kernel's; other targets price the reorder as
# a copy and never take it. A reorder of a reorder is one.
FAMILY.rewrite(
    "depthwise-conv-nchwc",
    L.conv(x, w, b, strides, pads, dil, group),
    L.conv(L.reorder_nchwc(x), w, b, strides, pads, dil, group),
    L.shape(x) == sa,
    L.shape(w) == sb,
    sa.length() == i64(4),
    sb.length() == i64(4),
    sb[1] == i64(1),
    sa[1] == group,
    group > i64(1),
)
FAMILY.rewrite("reorder-nchwc-idempotent", L.reorder_nchwc(L.reorder_nchwc(x)), L.reorder_nchwc(x))

# ---------------------------------------------------------------- Pad chains
for _r in range(1, MAX_RANK + 1):
    # A Pad by zeros everywhere is a copy.
    FAMILY.rewrite(
        "pad-noop",
        L.pad(x, L.Tensor.ints(va, i64(1)), z, c, mode),
        x,
        va == Vec(*[i64(0)] * (2 * _r)),
        variant=str(_r),
    )
    # Two constant Pads with one value (or both the default 0) are one Pad by the summed pads.
    FAMILY.rewrite(
        "pad-pad",
        L.pad(L.pad(x, L.Tensor.ints(va, i64(1)), z, L.Tensor.none(), String("constant")), L.Tensor.ints(vb, i64(1)), z, L.Tensor.none(), String("constant")),
        L.pad(x, L.Tensor.ints(Vec(*[va[i] + vb[i] for i in range(2 * _r)]), i64(1)), z, L.Tensor.none(), String("constant")),
        va.length() == i64(2 * _r),
        vb.length() == i64(2 * _r),
        *[va[i] >= i64(0) for i in range(2 * _r)],
        *[vb[i] >= i64(0) for i in range(2 * _r)],
        variant=str(_r),
    )

# ---------------------------------------------------------------- shape arithmetic on constants
_SCALAR = i64(0)
_VECTOR = i64(1)
# Gather of a constant int vector by a constant scalar index is a constant.
SHAPE_FAMILY.rewrite(
    "gather-const-ints",
    L.gather(L.Tensor.ints(va, _VECTOR), L.Tensor.ints(vb, _SCALAR), i64(0)),
    L.Tensor.ints(Vec(va[norm_axis(vb[0], va.length())]), _SCALAR),
    vb[0] < va.length(),
    vb[0] >= i64(0) - va.length(),
)
for _k in range(1, 5):
    SHAPE_FAMILY.rewrite(
        "gather-const-ints",
        L.gather(L.Tensor.ints(va, _VECTOR), L.Tensor.ints(vb, _VECTOR), i64(0)),
        L.Tensor.ints(Vec(*[va[norm_axis(vb[i], va.length())] for i in range(_k)]), _VECTOR),
        vb.length() == i64(_k),
        *[vb[i] < va.length() for i in range(_k)],
        *[vb[i] >= i64(0) - va.length() for i in range(_k)],
        variant=f"vector{_k}",
    )
# Unsqueeze of a constant scalar to a vector; Concat of constant vectors; Cast to int64 of a constant.
SHAPE_FAMILY.rewrite(
    "unsqueeze-const-ints",
    L.unsqueeze(L.Tensor.ints(va, _SCALAR), L.Tensor.ints(Vec(i64(0)), _VECTOR)),
    L.Tensor.ints(va, _VECTOR),
)
SHAPE_FAMILY.rewrite(
    "concat-const-ints",
    L.concat(L.tlist([L.Tensor.ints(va, _VECTOR), L.Tensor.ints(vb, _VECTOR)]), i64(0)),
    L.Tensor.ints(va.append(vb), _VECTOR),
)
SHAPE_FAMILY.rewrite(
    "concat-const-ints",
    L.concat(L.tlist([L.Tensor.ints(va, _VECTOR), L.Tensor.ints(vb, _VECTOR), L.Tensor.ints(vc, _VECTOR)]), i64(0)),
    L.Tensor.ints(va.append(vb).append(vc), _VECTOR),
    variant="3",
)
SHAPE_FAMILY.rewrite("cast-const-ints", L.cast(L.Tensor.ints(va, ia), i64(7)), L.Tensor.ints(va, ia))
# Scalar int arithmetic on constants (sequence length * heads, ...).
_SMALL = i64(1 << 31)  # operands bounded so the i64 result cannot overflow
for _name, _g, _op in (
    ("add", L.add, lambda u, v: u + v),
    ("sub", L.sub, lambda u, v: u - v),
    ("mul", L.mul, lambda u, v: u * v),
):
    SHAPE_FAMILY.rewrite(
        "int-arith-const",
        _g(L.Tensor.ints(va, ia), L.Tensor.ints(vb, ia)),
        L.Tensor.ints(Vec(_op(va[0], vb[0])), ia),
        va.length() == i64(1),
        vb.length() == i64(1),
        va[0] < _SMALL,
        vb[0] < _SMALL,
        va[0] > i64(0) - _SMALL,
        vb[0] > i64(0) - _SMALL,
        variant=_name,
    )
# Division only of non-negative values (ONNX and egglog agree on truncation there).
SHAPE_FAMILY.rewrite(
    "int-arith-const",
    L.div(L.Tensor.ints(va, ia), L.Tensor.ints(vb, ia)),
    L.Tensor.ints(Vec(va[0] / vb[0]), ia),
    va.length() == i64(1),
    vb.length() == i64(1),
    va[0] >= i64(0),
    vb[0] > i64(0),
    variant="div",
)

RULE_NAMES = FAMILY.names + SHAPE_FAMILY.names
