"""Reduction rules: reductions over size-1 axes vanish, nested means/sums merge into one
reduction, scalar factors leave the reduction, and a spatial ReduceMean is a GlobalAveragePool.

Low precision: ``reduce-scalar-hoist`` sums before it scales, so in float16/bfloat16 a sum that
fit after scaling can overflow; it is guarded to float32/float64.
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import Vec, i64, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ...egraph.shapes import norm_axis
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("reduce")
FAMILIES = (FAMILY,)

x, c, axes = vars_("x c axes", L.Tensor)
sx, va, vb = vars_("sx va vb", Vec[i64])
keep, keep2, noop, noop2, dt = vars_("keep keep2 noop noop2 dt", i64)

FLOAT, DOUBLE = 1, 11
_WIDE_FLOATS = Vec(i64(FLOAT), i64(DOUBLE))

REDUCTIONS: dict[str, Callable[..., L.Tensor]] = {"mean": L.reduce_mean, "sum": L.reduce_sum, "max": L.reduce_max}


def _ints(v: Vec[i64]) -> L.Tensor:
    return L.Tensor.ints(v, i64(1))


def _axis_ok(v: Vec[i64], k: int) -> list[FactLike]:
    return [f for i in range(k) for f in (v[i] < sx.length(), v[i] >= i64(0) - sx.length())]


for _rname, _reduce in REDUCTIONS.items():
    # Mean, sum or max over axes of size 1 (kept) is the input itself.
    FAMILY.rewrite("reduce-unit-axes-elim", _reduce(x, axes, i64(1), noop), x, L.shape(t) == sx, L.shape(x) == sx, variant=f"{_rname}-keep")
    # ... and, with keepdims=0, a Squeeze of those axes.
    for _k in (1, 2):
        FAMILY.rewrite(
            "reduce-unit-axes-elim",
            _reduce(x, _ints(va), i64(0), noop),
            L.squeeze(x, _ints(va)),
            L.shape(x) == sx,
            va.length() == i64(_k),
            *_axis_ok(va, _k),
            *[sx[norm_axis(va[i], sx.length())] == i64(1) for i in range(_k)],
            *([norm_axis(va[0], sx.length()) < norm_axis(va[1], sx.length())] if _k == 2 else []),
            variant=f"{_rname}-drop{_k}",
        )

# mean(mean(x, [a], keep), [b], keep) => mean(x, [a, b], keep) for different axes: one pass.
# (Reassociates the sum; the mean of equal-size group means is the mean.) Likewise sums and maxes.
for _rname, _name in (("mean", "reduce-mean-mean"), ("sum", "reduce-sum-sum"), ("max", "reduce-max-max")):
    _reduce = REDUCTIONS[_rname]
    FAMILY.rewrite(
        _name,
        _reduce(_reduce(x, _ints(va), i64(1), noop), _ints(vb), i64(1), noop2),
        _reduce(x, _ints(va.append(vb)), i64(1), i64(0)),
        L.shape(x) == sx,
        va.length() == i64(1),
        vb.length() == i64(1),
        *_axis_ok(va, 1),
        *_axis_ok(vb, 1),
        norm_axis(va[0], sx.length()) != norm_axis(vb[0], sx.length()),
    )

# sum(x * s) => sum(x) * s and sum(x / s) => sum(x) / s for a scalar s: one multiply per output
# instead of one per input. float32/float64 only (see the module docstring).
for _rname in ("mean", "sum"):
    _reduce = REDUCTIONS[_rname]
    for _variant, _inner, _outer in (
        ("mul-right", lambda v: L.mul(v, c), lambda r: L.mul(r, c)),
        ("mul-left", lambda v: L.mul(c, v), lambda r: L.mul(c, r)),
        ("div", lambda v: L.div(v, c), lambda r: L.div(r, c)),
    ):
        FAMILY.rewrite(
            "reduce-scalar-hoist",
            _reduce(_inner(x), axes, keep, noop),
            _outer(_reduce(x, axes, keep, noop)),
            L.shape(c) == Vec[i64].empty(),
            L.dtype(x) == dt,
            _WIDE_FLOATS.contains(dt),
            variant=f"{_rname}-{_variant}",
        )

# ReduceMean over all spatial axes with keepdims is GlobalAveragePool (one specialised kernel).
for _r in (3, 4, 5):
    FAMILY.rewrite(
        "reduce-mean-to-global-pool",
        L.reduce_mean(x, _ints(va), i64(1), noop),
        L.global_average_pool(x),
        L.shape(x) == sx,
        sx.length() == i64(_r),
        va.length() == i64(_r - 2),
        *_axis_ok(va, _r - 2),
        *[norm_axis(va[i], i64(_r)) == i64(2 + i) for i in range(_r - 2)],
        variant=str(_r),
    )

RULE_NAMES = list(FAMILY.names)
