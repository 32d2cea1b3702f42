"""Multi-pattern rules (TENSAT): sibling ops that read the same input merge into one op over
concatenated weights, followed by a Split that gives each sibling its part.

Guards: the siblings' weights depend on weights alone (so the merged weight folds at export and
no cycle can form), an ordering guard on the weights' import indices (``tensor_ref``) so a
pair merges once, not in both orders, and the siblings are distinct e-classes (after weight tying
an op would otherwise merge with itself). merge-enlarge-1x1-into-3x3 needs no ordering guard: its
siblings' kernels differ in size, so they are never one e-class. These rules run for ``Budgets.k_multi`` iterations only.
"""

from __future__ import annotations

from egglog import Vec, f64, i64, ne, union, vars_

from ...egraph import lang as L
from ..registry import Family

FAMILY = Family("multi")
FAMILIES = (FAMILY,)

t1, t2, x, w1, w2, b1, b2 = vars_("t1 t2 x w1 w2 b1 b2", L.Tensor)
s1, s2, sx, strides, pads, dil = vars_("s1 s2 sx strides pads dil", Vec[i64])
i1, i2, group = vars_("i1 i2 group", i64)


def _ordered(a: L.Tensor, b: L.Tensor) -> tuple:
    """``a`` was imported before ``b`` (each pair of siblings merges in one order only), and the two
    siblings are different e-classes: weight tying makes equal weights one leaf, so two imported
    names can be one e-class and ``t1``/``t2`` one op, which must not merge with itself."""
    return (a == L.tensor_ref(i1), b == L.tensor_ref(i2), i1 < i2, ne(t1).to(t2))


def _parts(merged: L.Tensor, axis: i64, n1: i64, n2: i64) -> tuple[L.Tensor, L.Tensor]:
    sizes = L.Tensor.ints(Vec(n1, n2), i64(1))
    return L.split(merged, sizes, axis, i64(0), i64(0)), L.split(merged, sizes, axis, i64(0), i64(1))


# Parallel MatMuls x@W1, x@W2 (attention Q/K/V) => x@[W1|W2] split on the last axis.
_merged = L.matmul(x, L.concat(L.tlist([w1, w2]), i64(1)))
_p1, _p2 = _parts(_merged, sx.length() - 1, s1[1], s2[1])
FAMILY.rule(
    "merge-parallel-matmul",
    t1 == L.matmul(x, w1),
    t2 == L.matmul(x, w2),
    *_ordered(w1, w2),
    L.is_const(w1),
    L.is_const(w2),
    L.shape(w1) == s1,
    L.shape(w2) == s2,
    s1.length() == i64(2),
    s2.length() == i64(2),
    s1[0] == s2[0],
    L.shape(x) == sx,
    sx.length() >= i64(2),
    then=[union(t1).with_(_p1), union(t2).with_(_p2)],
    variant="2d-weights",
)

# Parallel Gemms x*W1 + b1, x*W2 + b2 with equal alpha/beta/transA (fully connected heads) => one
# Gemm over [W1|W2] (or stacked rows under transB) and [b1|b2], split on the feature axis.
a1, a2 = vars_("a1 a2", f64)
ta, tb = vars_("ta tb", i64)
for _tb, _waxis, _n1, _n2 in ((0, 1, s1[1], s2[1]), (1, 0, s1[0], s2[0])):
    for _with_bias in (True, False):
        _c1 = b1 if _with_bias else L.Tensor.none()
        _c2 = b2 if _with_bias else L.Tensor.none()
        _c = L.concat(L.tlist([b1, b2]), i64(0)) if _with_bias else L.Tensor.none()
        _merged_gemm = L.gemm(x, L.concat(L.tlist([w1, w2]), i64(_waxis)), _c, a1, a2, ta, i64(_tb))
        _g1, _g2 = _parts(_merged_gemm, i64(1), _n1, _n2)
        FAMILY.rule(
            "merge-parallel-gemm",
            t1 == L.gemm(x, w1, _c1, a1, a2, ta, i64(_tb)),
            t2 == L.gemm(x, w2, _c2, a1, a2, ta, i64(_tb)),
            *_ordered(w1, w2),
            L.is_const(w1),
            L.is_const(w2),
            L.shape(w1) == s1,
            L.shape(w2) == s2,
            s1.length() == i64(2),
            s2.length() == i64(2),
            s1[1 - _waxis] == s2[1 - _waxis],
            *((L.is_const(b1), L.is_const(b2), L.shape(b1) == Vec(_n1), L.shape(b2) == Vec(_n2)) if _with_bias else ()),
            then=[union(t1).with_(_g1), union(t2).with_(_g2)],
            variant=f"transb{_tb}-{'bias' if _with_bias else 'nobias'}",
        )

# Parallel Convs with equal stride/padding/dilation and kernel size (Inception branches) => one
# Conv over concatenated output channels, split on the channel axis.
_same_kernel = (L.shape(w1) == s1, L.shape(w2) == s2, s1.length() == s2.length(), s1.set(i64(0), i64(0)) == s2.set(i64(0), i64(0)))
for _with_bias in (True, False):
    c1 = L.conv(x, w1, b1 if _with_bias else L.Tensor.none(), strides, pads, dil, i64(1))
    c2 = L.conv(x, w2, b2 if _with_bias else L.Tensor.none(), strides, pads, dil, i64(1))
    bias = L.concat(L.tlist([b1, b2]), i64(0)) if _with_bias else L.Tensor.none()
    merged = L.conv(x, L.concat(L.tlist([w1, w2]), i64(0)), bias, strides, pads, dil, i64(1))
    p1, p2 = _parts(merged, i64(1), s1[0], s2[0])
    bias_guards = (L.is_const(b1), L.is_const(b2), L.shape(b1) == Vec(s1[0]), L.shape(b2) == Vec(s2[0])) if _with_bias else ()
    FAMILY.rule(
        "merge-parallel-conv",
        t1 == c1,
        t2 == c2,
        *_ordered(w1, w2),
        L.is_const(w1),
        L.is_const(w2),
        *_same_kernel,
        *bias_guards,
        then=[union(t1).with_(p1), union(t2).with_(p2)],
        variant="bias" if _with_bias else "nobias",
    )

# A 1x1 Conv next to a 3x3 sibling (padding one more on each side, unit dilation) is the 3x3 Conv
# of its zero-padded kernel: enlarge it and merge the two (TENSAT's kernel enlargement).
_one = Vec(i64(1), i64(1))
_pads3 = Vec(pads[0] + 1, pads[1] + 1, pads[2] + 1, pads[3] + 1)
_grow = L.Tensor.ints(Vec(i64(0), i64(0), i64(1), i64(1), i64(0), i64(0), i64(1), i64(1)), i64(1))
for _with_bias in (True, False):
    _b1 = b1 if _with_bias else L.Tensor.none()
    _b2 = b2 if _with_bias else L.Tensor.none()
    c1 = L.conv(x, w1, _b1, strides, pads, _one, i64(1))
    c2 = L.conv(x, w2, _b2, strides, _pads3, _one, i64(1))
    w1_3x3 = L.pad(w1, _grow, L.Tensor.none(), L.Tensor.none(), "constant")
    bias = L.concat(L.tlist([b1, b2]), i64(0)) if _with_bias else L.Tensor.none()
    merged = L.conv(x, L.concat(L.tlist([w1_3x3, w2]), i64(0)), bias, strides, _pads3, _one, i64(1))
    p1, p2 = _parts(merged, i64(1), s1[0], s2[0])
    FAMILY.rule(
        "merge-enlarge-1x1-into-3x3",
        t1 == c1,
        t2 == c2,
        L.is_const(w1),
        L.is_const(w2),
        L.shape(w1) == s1,
        L.shape(w2) == s2,
        s1 == Vec(s1[0], s2[1], i64(1), i64(1)),
        s2 == Vec(s2[0], s2[1], i64(3), i64(3)),
        *((L.is_const(b1), L.is_const(b2), L.shape(b1) == Vec(s1[0]), L.shape(b2) == Vec(s2[0])) if _with_bias else ()),
        then=[union(t1).with_(p1), union(t2).with_(p2)],
        variant="bias" if _with_bias else "nobias",
    )

RULE_NAMES = list(FAMILY.names)
