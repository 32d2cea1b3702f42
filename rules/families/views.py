"""View-op rules that also work on symbolic dims: Reshape sinking through elementwise ops (so the
Reshape/Transpose round trips PyTorch exports around attention meet and cancel), Reshape absorbing
the view op under it, Squeeze/Unsqueeze cancellation and merging, Slice and Expand removal,
constant splats through views, single-input Concat and single-output Split.

``view-view-to-reshape`` (layout.py) needs every dim known; these rules read only the literal
targets and axes, so a symbolic batch or sequence dim does not stop them.
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import Vec, f64, i64, vars_

from ...egraph import lang as L
from ...egraph.shapes import is_zero, norm_axis
from ..registry import ROOT as t
from ..registry import Family
from .layout import BINARY, UNARY

LAYOUT_FAMILY = Family("layout")
FAMILIES = (LAYOUT_FAMILY,)

x, y, z, c, s, target, axes, st, en, steps = vars_("x y z c s target axes st en steps", L.Tensor)
sa, sx, sy, se, sv, va, vb = vars_("sa sx sy se sv va vb", Vec[i64])
ia, ib, ic, az, dt = vars_("ia ib ic az dt", i64)
(fv,) = vars_("fv", f64)

def _ints(v: Vec[i64]) -> L.Tensor:
    return L.Tensor.ints(v, i64(1))


# ---------------------------------------------------------------- Reshape through elementwise ops
for _name, _f in UNARY.items():
    # f(reshape(x)) => reshape(f(x)): Reshapes move next to each other and merge (attention round trips).
    LAYOUT_FAMILY.rewrite("reshape-sink-unary", _f(L.reshape(x, target, az)), L.reshape(_f(x), target, az), variant=_name)
for _name, _g in BINARY.items():
    if _name == "pow":
        continue  # rare between reshapes; each variant costs registration time in every e-graph
    # g(reshape(a, s), reshape(b, s)) => reshape(g(a, b), s) when a and b have one shape (no broadcasting).
    LAYOUT_FAMILY.rewrite(
        "reshape-sink-binary",
        _g(L.reshape(x, target, az), L.reshape(y, target, az)),
        L.reshape(_g(x, y), target, az),
        L.shape(x) == sx,
        L.shape(y) == sx,
        variant=_name,
    )
    # ... and with a scalar operand on either side.
    for _side, _lhs, _rhs in (
        ("right", _g(L.reshape(x, target, az), c), _g(x, c)),
        ("left", _g(c, L.reshape(x, target, az)), _g(c, x)),
    ):
        LAYOUT_FAMILY.rewrite(
            "reshape-sink-binary",
            _lhs,
            L.reshape(_rhs, target, az),
            L.shape(c) == Vec[i64].empty(),
            variant=f"{_name}-scalar-{_side}",
        )


# ---------------------------------------------------------------- Reshape absorbs the view under it
def _inner_views() -> dict[str, Callable[[L.Tensor], L.Tensor]]:
    inner_target, inner_axes = vars_("inner_target inner_axes", L.Tensor)
    (inner_attr,) = vars_("inner_attr", i64)
    return {
        "reshape": lambda v: L.reshape(v, inner_target, inner_attr),
        "flatten": lambda v: L.flatten(v, inner_attr),
        "squeeze": lambda v: L.squeeze(v, inner_axes),
        "unsqueeze": lambda v: L.unsqueeze(v, inner_axes),
    }


_NO_DIM = i64(-(1 << 50))
"""Below every real or symbolic dim (pair symbols are above -2**42)."""


def _padded(dims: Vec[i64]) -> Vec[i64]:
    """``dims`` followed by dims that equal no other, so indexing past its rank cannot panic."""
    return dims.append(Vec(*[_NO_DIM] * 6))


for _name, _v in _inner_views().items():
    # A Reshape to a literal target without 0s (which would copy the view's dims) only needs the
    # view's input: one view op instead of two, on symbolic dims too.
    LAYOUT_FAMILY.rewrite(
        "reshape-absorbs-view",
        L.reshape(_v(x), _ints(vb), i64(0)),
        L.reshape(x, _ints(vb), i64(0)),
        vb.not_contains(i64(0)),
        variant=f"{_name}-literal",
    )
    # A 0 entry copies the view's dim at that position: fine when x has the same dim there. One rule
    # for targets of 1 to 4 entries: the target padded with 1s (entries that copy nothing).
    _target = vb.append(Vec(*[i64(1)] * 4))
    _kept = [is_zero(_target[i]) * (i64(1) - is_zero(_padded(sv)[i] - _padded(sx)[i])) == i64(0) for i in range(4)]
    LAYOUT_FAMILY.rewrite(
        "reshape-absorbs-view",
        L.reshape(_v(x), _ints(vb), i64(0)),
        L.reshape(x, _ints(vb), i64(0)),
        vb.length() >= i64(1),
        vb.length() <= i64(4),
        L.shape(_v(x)) == sv,
        L.shape(x) == sx,
        sv.length() >= vb.length(),
        *_kept,
        variant=f"{_name}-copies",
    )
    # With allowzero=1 the target is always literal.
    LAYOUT_FAMILY.rewrite("reshape-absorbs-view", L.reshape(_v(x), target, i64(1)), L.reshape(x, target, i64(1)), variant=f"{_name}-allowzero")

for _r in range(1, 7):
    # A Reshape whose every target entry keeps x's dim (0 copies it, the same known value, or the
    # one -1 that is then what is left) is a copy: x.view(B, S, -1) of a [B, S, D] tensor.
    LAYOUT_FAMILY.rewrite(
        "reshape-identity-target",
        L.reshape(x, _ints(vb), i64(0)),
        x,
        L.shape(x) == sx,
        sx.length() == i64(_r),
        vb.length() == i64(_r),
        *[is_zero(vb[i]) + is_zero(vb[i] - sx[i]) + is_zero(vb[i] + 1) >= i64(1) for i in range(_r)],
        variant=str(_r),
    )

# ---------------------------------------------------------------- Squeeze / Unsqueeze
# squeeze(unsqueeze(x, A), A) => x: both count A in the unsqueezed rank, so equal axes cancel.
LAYOUT_FAMILY.rewrite("squeeze-unsqueeze-cancel", L.squeeze(L.unsqueeze(x, axes), axes), x)
# unsqueeze(squeeze(x, A), A) => x when the squeezed dims come back (the shapes say so).
LAYOUT_FAMILY.rewrite(
    "squeeze-unsqueeze-cancel",
    L.unsqueeze(L.squeeze(x, axes), axes),
    x,
    L.shape(t) == sx,
    L.shape(x) == sx,
    variant="unsqueeze-squeeze",
)


def _before(u: i64, v: i64) -> i64:
    """1 when ``u <= v`` else 0."""
    return (v - u + 1).max(i64(0)).min(i64(1))


# unsqueeze(unsqueeze(x, [a]), [b]) => unsqueeze(x, sorted([b, a + (b <= a)])): one op (PyTorch's
# x[:, None, None]). Axes non-negative (negative ones count from a different rank in each op).
_a, _b = va[0], vb[0]
_shifted = _a + _before(_b, _a)
LAYOUT_FAMILY.rewrite(
    "unsqueeze-unsqueeze",
    L.unsqueeze(L.unsqueeze(x, _ints(va)), _ints(vb)),
    L.unsqueeze(x, _ints(Vec(_b.min(_shifted), _b.max(_shifted)))),
    va.length() == i64(1),
    vb.length() == i64(1),
    _a >= i64(0),
    _b >= i64(0),
)
# squeeze(squeeze(x, [a]), [b]) => squeeze(x, sorted([a, b + (a <= b)])), axes normalized by rank.
_na = norm_axis(va[0], sx.length())
_nb = norm_axis(vb[0], sx.length() - 1)
_orig_b = _nb + _before(_na, _nb)
LAYOUT_FAMILY.rewrite(
    "squeeze-squeeze",
    L.squeeze(L.squeeze(x, _ints(va)), _ints(vb)),
    L.squeeze(x, _ints(Vec(_na.min(_orig_b), _na.max(_orig_b)))),
    L.shape(x) == sx,
    va.length() == i64(1),
    vb.length() == i64(1),
    _na >= i64(0),
    _na < sx.length(),
    _nb >= i64(0),
    _nb < sx.length() - 1,
)

# ---------------------------------------------------------------- Slice
# A Slice with positive steps that keeps the whole shape is a copy.
LAYOUT_FAMILY.rewrite("slice-noop", L.slice_(x, st, en, axes, L.Tensor.none()), x, L.shape(t) == sx, L.shape(x) == sx)
for _k in (1, 2, 3):
    LAYOUT_FAMILY.rewrite(
        "slice-noop",
        L.slice_(x, st, en, axes, _ints(vb)),
        x,
        L.shape(t) == sx,
        L.shape(x) == sx,
        vb.length() == i64(_k),
        *[vb[i] > i64(0) for i in range(_k)],
        variant=f"steps{_k}",
    )


def _slice1(v: L.Tensor, start: Vec[i64], end: Vec[i64], axis: Vec[i64]) -> L.Tensor:
    return L.slice_(v, _ints(start), _ints(end), _ints(axis), L.Tensor.none())


vs1, ve1, va1, vs2, ve2, va2 = vars_("vs1 ve1 va1 vs2 ve2 va2", Vec[i64])
_one_axis_each = [v.length() == i64(1) for v in (vs1, ve1, va1, vs2, ve2, va2)]
_inner = _slice1(x, vs1, ve1, va1)
# Slices of one axis each on two different axes are one Slice (PyTorch's x[:, a:b][..., c:d]).
LAYOUT_FAMILY.rewrite(
    "slice-slice",
    _slice1(_inner, vs2, ve2, va2),
    L.slice_(x, _ints(vs1.append(vs2)), _ints(ve1.append(ve2)), _ints(va1.append(va2)), L.Tensor.none()),
    *_one_axis_each,
    L.shape(x) == sx,
    norm_axis(va1[0], sx.length()) != norm_axis(va2[0], sx.length()),
    variant="two-axes",
)
# Two slices of one axis with non-negative bounds compose: x[s1:e1][s2:e2] = x[s1+s2 : min(e1, s1+e2)].
_dim = sx[norm_axis(va1[0], sx.length())]
_s1, _e1, _s2, _e2 = vs1[0], ve1[0], vs2[0], ve2[0]
LAYOUT_FAMILY.rewrite(
    "slice-slice",
    _slice1(_inner, vs2, ve2, va1),
    _slice1(x, Vec(_s1 + _s2.min(_dim)), Vec(_e1.min(_dim).min(_s1 + _e2.min(_dim))), va1),
    *_one_axis_each[:5],
    L.shape(x) == sx,
    va1[0] < sx.length(),
    va1[0] >= i64(0) - sx.length(),
    _dim >= i64(0),
    _s1 >= i64(0),
    _s1 <= _e1.min(_dim),
    _s2 >= i64(0),
    _e2 >= i64(0),
    variant="one-axis",
)

# ---------------------------------------------------------------- Expand
# An Expand that does not change the shape is a copy.
LAYOUT_FAMILY.rewrite("expand-noop", L.expand(x, s), x, L.shape(t) == sx, L.shape(x) == sx)
# expand(expand(x, a), b) => expand(x, final shape) once the final shape is known.
for _r in range(1, 5):
    LAYOUT_FAMILY.rewrite(
        "expand-expand",
        L.expand(L.expand(x, s), target),
        L.expand(x, _ints(sa)),
        L.shape(t) == sa,
        sa.length() == i64(_r),
        *[sa[i] >= i64(0) for i in range(_r)],
        variant=str(_r),
    )
# g(expand(x, s), y) => g(x, y) when y's shape already covers every dim the Expand adds: the
# broadcast in g does the expansion (attention masks). Dims may be symbolic (compared by id).
for _r in (3, 4):  # attention masks and [B,S,D] activations
    _covered = [is_zero(se[i] - sy[i]) + is_zero(se[i] - 1) >= i64(1) for i in range(_r)]
    _guards = (L.shape(L.expand(x, s)) == se, L.shape(y) == sy, se.length() == i64(_r), sy.length() == i64(_r), *_covered)
    for _name in ("add", "sub", "mul", "div"):
        _g = BINARY[_name]
        LAYOUT_FAMILY.rewrite("expand-elim-broadcast", _g(L.expand(x, s), y), _g(x, y), *_guards, variant=f"{_name}-right-{_r}")
        LAYOUT_FAMILY.rewrite("expand-elim-broadcast", _g(y, L.expand(x, s)), _g(y, x), *_guards, variant=f"{_name}-left-{_r}")

# ---------------------------------------------------------------- constants through views
_VIEW_OF: dict[str, Callable[[L.Tensor], L.Tensor]] = {
    "reshape": lambda v: L.reshape(v, target, az),
    "unsqueeze": lambda v: L.unsqueeze(v, axes),
    "expand": lambda v: L.expand(v, s),
}
for _name, _view in _VIEW_OF.items():
    for _r in range(5):
        # A view of a uniform constant is a uniform constant of the view's (known) shape, which
        # rules reading splat values (x*1, x+0) can use.
        LAYOUT_FAMILY.rewrite(
            "view-of-splat",
            _view(L.Tensor.splat(fv, sx, dt)),
            L.Tensor.splat(fv, sa, dt),
            L.shape(t) == sa,
            sa.length() == i64(_r),
            *[sa[i] >= i64(0) for i in range(_r)],
            variant=f"{_name}-{_r}",
        )

# ---------------------------------------------------------------- single-input Concat, single-output Split
LAYOUT_FAMILY.rewrite("concat-single-elim", L.concat(L.tlist([x]), ia), x)
LAYOUT_FAMILY.rewrite("split-single-elim", L.split(x, s, ia, ib, i64(0)), x, L.shape(t) == sx, L.shape(x) == sx)

RULE_NAMES = [
    "reshape-sink-unary",
    "reshape-sink-binary",
    "reshape-absorbs-view",
    "reshape-identity-target",
    "squeeze-unsqueeze-cancel",
    "unsqueeze-unsqueeze",
    "squeeze-squeeze",
    "slice-noop",
    "slice-slice",
    "expand-noop",
    "expand-expand",
    "expand-elim-broadcast",
    "view-of-splat",
    "concat-single-elim",
    "split-single-elim",
]
