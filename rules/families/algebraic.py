"""Algebraic rules (TASO/TENSAT class): constant folding through elementwise chains, factoring,
MatMul/Gemm/Conv weight algebra.

Every rule is valid in exact arithmetic; rules that reassociate floating-point sums or products
are marked ``reassociates`` in their comment (results differ in the last bits, as TASO's do).
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import Vec, f64, i64, ne, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("algebraic")
FAMILIES = (FAMILY,)
Op = Callable[[L.Tensor, L.Tensor], L.Tensor]

x, y, z, a, b, c, w, w2, bias, bias2 = vars_("x y z a b c w w2 bias bias2", L.Tensor)
sa, sb, sc, ws, strides, pads, dil = vars_("sa sb sc ws strides pads dil", Vec[i64])
ia, ib, dt, group, ta, tb = vars_("ia ib dt group ta tb", i64)
alpha, beta, fv = vars_("alpha beta fv", f64)


# ---------------------------------------------------------------- constant folding (x op a) op b
# Each fold rewrites (x inner a) outer b, for a and b that depend on weights only, so the constant
# part folds at export: one op on the activation instead of two. They reassociate, so they are
# dtype-guarded: never on float16/bfloat16, where the extra rounding step of the folded form is
# ~1e-3 relative (integer Add/Sub/Mul wrap exactly; integer Div truncates, so Div folds are for
# float32/float64 only: (3/2)*2 is not 3*(2/2), (x*3)/2 is not x*(3/2), and a*b may overflow).
_NOT_LOW_PRECISION = (ne(dt).to(i64(10)), ne(dt).to(i64(16)))
_WIDE_FLOATS = (Vec(i64(1), i64(11)).contains(dt),)


# Additive folds change how x is rounded, not only the constants: (x + 1e8) - 1e8 in float32
# rounds x to a multiple of 8, x + (1e8 - 1e8) is x. On floats they need both constants small
# (``small_const``: |values| <= 2**12, so x is rounded by at most 2**-12 more or less); integer
# sums wrap exactly, so int32/int64 fold whatever the values.
_SMALL_TERMS = (*_WIDE_FLOATS, L.small_const(a), L.small_const(b))
_EXACT_INTS = {
    name: (L.dtype(x) == i64(code), L.dtype(a) == i64(code), L.dtype(b) == i64(code))
    for name, code in (("int64", 7), ("int32", 6))
}


def _const_fold(
    name: str,
    inner: Op,
    outer: Op,
    rhs: L.Tensor,
    types: tuple[FactLike, ...] = _NOT_LOW_PRECISION,
    variant: str = "",
) -> None:
    """(x inner a) outer b => rhs. (``ne(inner).to(x)`` skips an inner op that an identity already
    merged with x, as in x == x + 0: folding it again would add a new constant term every iteration.)"""
    lhs = outer(inner(x, a), b)
    FAMILY.rewrite(
        name,
        lhs,
        rhs,
        L.is_const(a),
        L.is_const(b),
        L.varies(x),
        ne(inner(x, a)).to(x),
        L.dtype(x) == dt,
        *types,
        variant=variant,
    )


def _additive_fold(name: str, inner: Op, outer: Op, rhs: L.Tensor) -> None:
    """An additive fold: on float32/float64 with small constants, on int32/int64 with any."""
    _const_fold(name, inner, outer, rhs, _SMALL_TERMS, variant="float")
    for _int, _pinned in _EXACT_INTS.items():
        _const_fold(name, inner, outer, rhs, _pinned, variant=_int)


_additive_fold("add-const-assoc", L.add, L.add, L.add(x, L.add(a, b)))  # (x+a)+b => x+(a+b)
_const_fold("mul-const-assoc", L.mul, L.mul, L.mul(x, L.mul(a, b)))  # (x*a)*b => x*(a*b)
_additive_fold("sub-add-const", L.sub, L.add, L.add(x, L.sub(b, a)))  # (x-a)+b => x+(b-a)
_additive_fold("add-sub-const", L.add, L.sub, L.add(x, L.sub(a, b)))  # (x+a)-b => x+(a-b)
_additive_fold("sub-sub-const", L.sub, L.sub, L.sub(x, L.add(a, b)))  # (x-a)-b => x-(a+b)
_const_fold("div-mul-const", L.div, L.mul, L.mul(x, L.div(b, a)), _WIDE_FLOATS)  # (x/a)*b => x*(b/a)
_const_fold("mul-div-const", L.mul, L.div, L.mul(x, L.div(a, b)), _WIDE_FLOATS)  # (x*a)/b => x*(a/b)
_const_fold("div-div-const", L.div, L.div, L.div(x, L.mul(a, b)), _WIDE_FLOATS)  # (x/a)/b => x/(a*b)
# (x+a)*b => x*b + a*b (TASO's distributivity, towards the affine form x*s + t every chain of
# constant scales and shifts folds into).
# (x + a rounds x like the additive folds: small constants on floats.)
_const_fold("mul-add-const-distribute", L.add, L.mul, L.add(L.mul(x, b), L.mul(a, b)), _SMALL_TERMS, variant="float")
for _int, _pinned in _EXACT_INTS.items():
    _const_fold("mul-add-const-distribute", L.add, L.mul, L.add(L.mul(x, b), L.mul(a, b)), _pinned, variant=_int)
# x - c => x + (-c) (exact) and x / c => x * (1/c) for a constant c, so the Add/Mul folds above
# apply (x / c and x * (1/c) differ in the last bit: float32/float64 only, not float16/bfloat16).
FAMILY.rewrite("sub-const-to-add", L.sub(x, a), L.add(x, L.neg(a)), L.is_const(a), L.varies(x))
FAMILY.rewrite(
    "div-const-to-mul",
    L.div(x, a),
    L.mul(x, L.reciprocal(a)),
    L.varies(x),
    L.is_const(a),
    L.dtype(x) == dt,
    *_WIDE_FLOATS,
)
# c*x => x*c and c+x => x+c for a constant c: one canonical side for every fold (exact).
# (Constant folds ask ``varies(x)``: weight-only arithmetic folds at export, and rewriting it only
# grows the e-graph.)
FAMILY.rewrite("mul-const-commute", L.mul(a, x), L.mul(x, a), L.is_const(a), L.varies(x))
FAMILY.rewrite("add-const-commute", L.add(a, x), L.add(x, a), L.is_const(a), L.varies(x))
# x + x => x * 2 (exact): joins the Mul folds.
FAMILY.rewrite(
    "add-self",
    L.add(x, x),
    L.mul(x, L.Tensor.splat(f64(2.0), Vec[i64].empty(), dt)),
    L.dtype(x) == dt,
    L.varies(x),
)
# ---------------------------------------------------------------- factoring and negation
# x*a + x*b => x*(a+b): one multiply instead of two.
# Reassociates (a+b is rounded once more), so not on float16/bfloat16 like the constant folds.
FAMILY.rewrite("mul-factor", L.add(L.mul(x, a), L.mul(x, b)), L.mul(x, L.add(a, b)), L.dtype(x) == dt, *_NOT_LOW_PRECISION)
# x + (-y) => x - y, and x - (-y) => x + y: one op instead of two.
FAMILY.rewrite("add-neg", L.add(x, L.neg(y)), L.sub(x, y))
FAMILY.rewrite("add-neg", L.add(L.neg(y), x), L.sub(x, y), variant="left")
FAMILY.rewrite("sub-neg", L.sub(x, L.neg(y)), L.add(x, y))
# (-x) * (-y) => x * y; (-x) / (-y) => x / y.
FAMILY.rewrite("neg-mul-neg", L.mul(L.neg(x), L.neg(y)), L.mul(x, y))
FAMILY.rewrite("neg-div-neg", L.div(L.neg(x), L.neg(y)), L.div(x, y))
# -(x - y) => y - x.
FAMILY.rewrite("neg-sub", L.neg(L.sub(x, y)), L.sub(y, x))
# exp(x) * exp(y) => exp(x + y) is not included: exp(1000) * exp(-1000) is inf * 0 = NaN, not 1.
# sqrt(x) * sqrt(x) => x is only valid for x >= 0; not included either.
# abs(abs(x)) => abs(x).
FAMILY.rewrite("abs-abs", L.abs_(L.abs_(x)), L.abs_(x))
# abs(neg(x)) => abs(x).
FAMILY.rewrite("abs-neg", L.abs_(L.neg(x)), L.abs_(x))
# relu(x) - relu(-x) => x (exact for every float: one of the two terms is zero).
FAMILY.rewrite("relu-difference", L.sub(L.relu(x), L.relu(L.neg(x))), x)
# reciprocal(reciprocal(x)) is x only up to rounding of 1/x; not included.
# relu(f(x)) => f(x) where f is never negative (sigmoid, exp, abs; sqrt gives NaN or >= 0).
for _name, _f in (("sigmoid", L.sigmoid), ("exp", L.exp), ("abs", L.abs_), ("sqrt", L.sqrt)):
    FAMILY.rewrite("relu-nonnegative", L.relu(_f(x)), _f(x), variant=_name)

# ---------------------------------------------------------------- MatMul and Gemm
_2d = (L.shape(x) == sa, sa.length() == i64(2), L.shape(w) == sb, sb.length() == i64(2))
# (x@W1)@W2 => x@(W1@W2) for constant W1, W2: two matmuls become one (the product folds). Reassociates.
FAMILY.rewrite(
    "matmul-const-assoc",
    L.matmul(L.matmul(x, w), w2),
    L.matmul(x, L.matmul(w, w2)),
    L.is_const(w),
    L.is_const(w2),
    L.shape(w) == sb,
    sb.length() == i64(2),
    L.shape(w2) == sc,
    sc.length() == i64(2),
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
)
# x@a + x@b => x@(a+b) (distributivity): one matmul instead of two.
# (Guarded so that the sum does not broadcast: both products have the result's shape; not on
# float16/bfloat16, where summing the weights first rounds differently.)
FAMILY.rewrite(
    "matmul-factor-right",
    L.add(L.matmul(x, a), L.matmul(x, b)),
    L.matmul(x, L.add(a, b)),
    L.shape(t) == sc,
    L.shape(L.matmul(x, a)) == sc,
    L.shape(L.matmul(x, b)) == sc,
    L.shape(a) == sa,
    L.shape(b) == sa,
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
)
# a@x + b@x => (a+b)@x.
FAMILY.rewrite(
    "matmul-factor-left",
    L.add(L.matmul(a, x), L.matmul(b, x)),
    L.matmul(L.add(a, b), x),
    L.shape(t) == sc,
    L.shape(L.matmul(a, x)) == sc,
    L.shape(L.matmul(b, x)) == sc,
    L.shape(a) == sa,
    L.shape(b) == sa,
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
)
# B^T @ A^T => (A @ B)^T for matrices: one transpose instead of two.
_T = Vec(i64(1), i64(0))
FAMILY.rewrite(
    "matmul-transposes",
    L.matmul(L.transpose(w, _T), L.transpose(x, _T)),
    L.transpose(L.matmul(x, w), _T),
    *_2d,
)
for _r in (3, 4):
    # ... and for batched products (the last two axes swapped, batch axes kept).
    _swap = Vec(*[i64(i) for i in range(_r - 2)], i64(_r - 1), i64(_r - 2))
    FAMILY.rewrite(
        "matmul-transposes",
        L.matmul(L.transpose(w, _swap), L.transpose(x, _swap)),
        L.transpose(L.matmul(x, w), _swap),
        L.shape(x) == sa,
        sa.length() == i64(_r),
        L.shape(w) == sb,
        sb.length() == i64(_r),
        variant=f"batched{_r}",
    )
# x @ W^T + c => Gemm(transB=1): the transpose is free inside Gemm.
FAMILY.rewrite(
    "gemm-fold-transpose-b",
    L.gemm(x, L.transpose(w, _T), c, alpha, beta, ta, i64(0)),
    L.gemm(x, w, c, alpha, beta, ta, i64(1)),
)
FAMILY.rewrite(
    "gemm-fold-transpose-b",
    L.gemm(x, L.transpose(w, _T), c, alpha, beta, ta, i64(1)),
    L.gemm(x, w, c, alpha, beta, ta, i64(0)),
    variant="untranspose",
)
FAMILY.rewrite(
    "gemm-fold-transpose-a",
    L.gemm(L.transpose(x, _T), w, c, alpha, beta, i64(0), tb),
    L.gemm(x, w, c, alpha, beta, i64(1), tb),
)
# Gemm(...) * s => Gemm(alpha*s, beta*s) is not included: ONNX stores alpha/beta as float32, so the
# fold would round the scale of a float64 model (found by rule verification).
# Gemm(a, b, c) + d for a constant d that does not enlarge the output => bias c + d (folds).
FAMILY.rewrite(
    "gemm-bias-fold",
    L.add(L.gemm(x, w, c, alpha, f64(1.0), ta, tb), bias),
    L.gemm(x, w, L.add(c, bias), alpha, f64(1.0), ta, tb),
    L.is_const(c),
    L.is_const(bias),
    L.shape(c) == sc,
    L.shape(t) == sa,
    L.shape(L.gemm(x, w, c, alpha, f64(1.0), ta, tb)) == sa,
)

# ---------------------------------------------------------------- Conv weight algebra
# Conv of any spatial rank 1-3 (weights [O, I, k...] of rank 3-5) in one rule per scale layout: the
# scale's shape sa is [O, 1, ...] or [1, O, 1, ...] of the matching rank (sa padded with 1s, so the
# entries past its rank compare as 1).
_conv_consts = (L.shape(w) == ws, ws.length() >= i64(3), ws.length() <= i64(5), L.is_const(w))
_ONES = Vec(*[i64(1)] * 4)
_SCALE_LAYOUTS = (
    # ([O, 1, ...] of rank ws - 1, the scale as [O, 1, ...] of rank ws)
    ("c11", (sa.length() + 1 == ws.length(), sa[0] == ws[0], *[sa.append(_ONES)[i] == i64(1) for i in range(1, 4)]), sa.push(i64(1))),
    # ([1, O, 1, ...] of rank ws, the same with the first two axes swapped)
    ("1c11", (sa.length() == ws.length(), sa[0] == i64(1), sa[1] == ws[0], *[sa.append(_ONES)[i] == i64(1) for i in range(2, 5)]), sa.set(i64(0), ws[0]).set(i64(1), i64(1))),
)  # fmt: skip
for _variant, _scale_shape, _per_out_dims in _SCALE_LAYOUTS:
    # Conv followed by a per-channel constant scale folds into W and b.
    per_out = L.reshape(a, L.Tensor.ints(_per_out_dims, i64(1)), i64(0))
    per_bias = L.reshape(a, L.Tensor.ints(Vec(ws[0]), i64(1)), i64(0))
    FAMILY.rewrite(
        "conv-mul-fold",
        L.mul(L.conv(x, w, b, strides, pads, dil, group), a),
        L.conv(x, L.mul(w, per_out), L.mul(b, per_bias), strides, pads, dil, group),
        ne(t).to(L.conv(x, w, b, strides, pads, dil, group)),
        *_conv_consts,
        L.is_const(a),
        L.shape(a) == sa,
        *_scale_shape,
        L.shape(b) == sb,
        L.is_const(b),
        variant=_variant,
    )
    FAMILY.rewrite(
        "conv-mul-fold",
        L.mul(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group), a),
        L.conv(x, L.mul(w, per_out), L.Tensor.none(), strides, pads, dil, group),
        ne(t).to(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group)),
        *_conv_consts,
        L.is_const(a),
        L.shape(a) == sa,
        *_scale_shape,
        variant=f"{_variant}-nobias",
    )
    # Conv followed by a per-channel constant shift folds into the bias.
    FAMILY.rewrite(
        "conv-add-fold",
        L.add(L.conv(x, w, b, strides, pads, dil, group), a),
        L.conv(x, w, L.add(b, per_bias), strides, pads, dil, group),
        ne(t).to(L.conv(x, w, b, strides, pads, dil, group)),
        *_conv_consts,
        L.is_const(a),
        L.shape(a) == sa,
        *_scale_shape,
        L.shape(b) == sb,
        L.is_const(b),
        variant=_variant,
    )
    FAMILY.rewrite(
        "conv-add-fold",
        L.add(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group), a),
        L.conv(x, w, per_bias, strides, pads, dil, group),
        ne(t).to(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group)),
        *_conv_consts,
        L.is_const(a),
        L.shape(a) == sa,
        *_scale_shape,
        variant=f"{_variant}-nobias",
    )

# Conv followed by a constant scalar scale folds into W and b (TASO's conv bilinearity with smul).
FAMILY.rewrite(
    "conv-mul-fold",
    L.mul(L.conv(x, w, b, strides, pads, dil, group), a),
    L.conv(x, L.mul(w, a), L.mul(b, a), strides, pads, dil, group),
    ne(t).to(L.conv(x, w, b, strides, pads, dil, group)),
    L.is_const(w),
    L.is_const(a),
    L.shape(a) == Vec[i64].empty(),
    L.shape(b) == sb,
    L.is_const(b),
    variant="scalar",
)
FAMILY.rewrite(
    "conv-mul-fold",
    L.mul(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group), a),
    L.conv(x, L.mul(w, a), L.Tensor.none(), strides, pads, dil, group),
    ne(t).to(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group)),
    L.is_const(w),
    L.is_const(a),
    L.shape(a) == Vec[i64].empty(),
    variant="scalar-nobias",
)

# Conv bilinearity: conv(x, W1) + conv(x, W2) => conv(x, W1 + W2) (TASO): one conv instead of two.
# Like every reassociating rule here, not on float16/bfloat16.
FAMILY.rewrite(
    "conv-weight-sum",
    L.add(
        L.conv(x, w, L.Tensor.none(), strides, pads, dil, group),
        L.conv(x, w2, L.Tensor.none(), strides, pads, dil, group),
    ),
    L.conv(x, L.add(w, w2), L.Tensor.none(), strides, pads, dil, group),
    L.shape(w) == ws,
    L.shape(w2) == ws,
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
)
FAMILY.rewrite(
    "conv-weight-sum",
    L.add(L.conv(x, w, bias, strides, pads, dil, group), L.conv(x, w2, bias2, strides, pads, dil, group)),
    L.conv(x, L.add(w, w2), L.add(bias, bias2), strides, pads, dil, group),
    L.shape(w) == ws,
    L.shape(w2) == ws,
    L.shape(bias) == sb,
    L.shape(bias2) == sb,
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
    variant="bias",
)
# conv(x1, W) + conv(x2, W) => conv(x1 + x2, W) without bias (TASO): one conv instead of two.
FAMILY.rewrite(
    "conv-input-sum",
    L.add(
        L.conv(x, w, L.Tensor.none(), strides, pads, dil, group),
        L.conv(y, w, L.Tensor.none(), strides, pads, dil, group),
    ),
    L.conv(L.add(x, y), w, L.Tensor.none(), strides, pads, dil, group),
    L.shape(x) == sa,
    L.shape(y) == sa,
    L.dtype(x) == dt,
    *_NOT_LOW_PRECISION,
)

RULE_NAMES = list(FAMILY.names)
