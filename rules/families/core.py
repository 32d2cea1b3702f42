"""The first ruleset: cancellations, identities and weight-algebra folds every exported model has.

Each rule has a stable kebab-case name (``NAMES``), its guards inline, and a one-line why.
Rules that depend on a rank are generated once per rank under one name.
"""

from __future__ import annotations

from egglog import String, Vec, f64, i64, vars_

from ...egraph import lang as L
from ...egraph.shapes import MAX_RANK
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("core")
FAMILIES = (FAMILY,)

x, y, w, b, scale, bias, mean, var, c = vars_("x y w b scale bias mean var c", L.Tensor)
sa, sb, ws, pa, pb, strides, pads, dil = vars_("sa sb ws pa pb strides pads dil", Vec[i64])
ia, ib, dt, group = vars_("ia ib dt group", i64)
eps, fv = vars_("eps fv", f64)
(s_str,) = vars_("s_str", String)


def _splat(value: float) -> L.Tensor:
    return L.Tensor.splat(value, sb, dt)


# Dropout and Identity are no-ops at inference.
FAMILY.rewrite("identity-elim", L.identity(x), x)
# Two negations cancel.
FAMILY.rewrite("neg-neg", L.neg(L.neg(x)), x)
# Relu is idempotent.
FAMILY.rewrite("relu-relu", L.relu(L.relu(x)), L.relu(x))
# x*1, x/1, x+0, x-0 are x when the constant does not broadcast x to a larger shape.
for _i, (_name, _lhs) in enumerate(
    (
        ("mul-one", L.mul(x, _splat(1.0))),
        ("mul-one", L.mul(_splat(1.0), x)),
        ("div-one", L.div(x, _splat(1.0))),
        ("add-zero", L.add(x, _splat(0.0))),
        ("add-zero", L.add(_splat(0.0), x)),
        ("sub-zero", L.sub(x, _splat(0.0))),
    )
):
    FAMILY.rewrite(_name, _lhs, x, L.shape(t) == sa, L.shape(x) == sa, variant=str(_i))

for _r in range(1, MAX_RANK + 1):
    # Two transposes compose into one (and vanish when they are inverses, see below).
    composed = Vec(*[pa[pb[i]] for i in range(_r)])
    FAMILY.rewrite(
        "transpose-compose",
        L.transpose(L.transpose(x, pa), pb),
        L.transpose(x, composed),
        pa.length() == i64(_r),
        pb.length() == i64(_r),
        variant=str(_r),
    )
    # A transpose by the identity permutation is a copy.
    FAMILY.rewrite(
        "transpose-identity-elim",
        L.transpose(x, pa),
        x,
        pa == Vec(*[i64(i) for i in range(_r)]),
        variant=str(_r),
    )
    # Reshape of a reshape only needs the last target; written with the analysed shape.
    FAMILY.rewrite(
        "reshape-reshape",
        L.reshape(L.reshape(x, y, ia), c, ib),
        L.reshape(x, L.Tensor.ints(sa, i64(1)), i64(0)),
        L.shape(t) == sa,
        sa.length() == i64(_r),
        *[sa[i] >= i64(1) for i in range(_r)],
        variant=str(_r),
    )

# Shape of a tensor whose dims are all known is a constant (then the shape arithmetic folds).
for _r in range(MAX_RANK + 1):
    FAMILY.rewrite(
        "shape-of-known",
        L.shape_of(x, i64(0), i64(2**63 - 1)),
        L.Tensor.ints(sa, i64(1)),
        L.shape(x) == sa,
        sa.length() == i64(_r),
        *[sa[i] >= i64(0) for i in range(_r)],
        variant=str(_r),
    )

# where(c, x, x) is x when the condition does not broadcast x to a larger shape.
FAMILY.rewrite("where-same", L.where(c, x, x), x, L.shape(t) == sa, L.shape(x) == sa)
# Clip(x, 0) without an upper bound is Relu (Conv+Relu fusion, relu rules apply).
FAMILY.rewrite("clip-zero-to-relu", L.clip(x, L.Tensor.splat(0.0, Vec[i64].empty(), dt), L.Tensor.none()), L.relu(x))
# x ** 1 is x and x ** 2 is x * x (exact in IEEE arithmetic; a Mul is far cheaper than a Pow).
# (x ** 0.5 is not sqrt(x): they differ at -0 and -inf.)
FAMILY.rewrite("pow-one-elim", L.pow_(x, _splat(1.0)), x, L.shape(t) == sa, L.shape(x) == sa)
FAMILY.rewrite("pow-two-to-mul", L.pow_(x, _splat(2.0)), L.mul(x, x), L.shape(t) == sa, L.shape(x) == sa)
# GlobalAveragePool over 1x1 spatial dims is a copy.
FAMILY.rewrite("global-pool-noop", L.global_average_pool(x), x, L.shape(t) == sa, L.shape(x) == sa)

# A reshape to the shape its input already has is a no-op.
FAMILY.rewrite("reshape-noop", L.reshape(x, y, ia), x, L.shape(t) == sa, L.shape(x) == sa)

# BatchNormalization after Conv folds into the conv's weights and bias (weight algebra).
for _n in (1, 2, 3):
    factor = L.div(scale, L.sqrt(L.add(var, L.Tensor.splat(eps, Vec[i64].empty(), dt))))
    folded_w = L.mul(w, L.reshape(factor, L.Tensor.ints(Vec(ws[0], *[i64(1)] * (_n + 1)), i64(1)), i64(0)))
    guards = (
        L.shape(w) == ws,
        ws.length() == i64(_n + 2),
        L.dtype(var) == dt,
        L.is_const(w),
        L.is_const(scale),
        L.is_const(bias),
        L.is_const(mean),
        L.is_const(var),
    )
    FAMILY.rewrite(
        "conv-batchnorm-fold",
        L.batch_norm(L.conv(x, w, b, strides, pads, dil, group), scale, bias, mean, var, eps),
        L.conv(x, folded_w, L.add(L.mul(L.sub(b, mean), factor), bias), strides, pads, dil, group),
        L.shape(b) == sa,
        L.is_const(b),
        *guards,
        variant=f"bias{_n}",
    )
    FAMILY.rewrite(
        "conv-batchnorm-fold",
        L.batch_norm(L.conv(x, w, L.Tensor.none(), strides, pads, dil, group), scale, bias, mean, var, eps),
        L.conv(x, folded_w, L.add(L.mul(L.neg(mean), factor), bias), strides, pads, dil, group),
        *guards,
        variant=f"nobias{_n}",
    )

# MatMul + Add of a bias broadcastable to [M, N] is one Gemm (one kernel, bias fused).
for _variant, _lhs in (("right", L.add(L.matmul(x, w), c)), ("left", L.add(c, L.matmul(x, w)))):
    FAMILY.rewrite(
        "matmul-add-to-gemm",
        _lhs,
        L.gemm(x, w, c, 1.0, 1.0, i64(0), i64(0)),
        L.shape(x) == sa,
        sa.length() == i64(2),
        L.shape(w) == sb,
        sb.length() == i64(2),
        L.shape(t) == pa,
        L.shape(L.matmul(x, w)) == pa,
        L.dtype(x) == dt,
        Vec(i64(1), i64(10), i64(11)).contains(dt),  # float, float16, double: ORT has no integer Gemm
        variant=_variant,
    )


RULE_NAMES = list(FAMILY.names)
"""This family's rule names, in declaration order."""
