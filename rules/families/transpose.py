"""Transpose sinking with axis remapping: a Transpose moves below Softmax, reductions, Concat,
Split, Slice, Pad and constant-operand binary ops, so two transposes meet and cancel (the
rewrite ORT's transpose optimizer does on NHWC/NCHW round trips); a Transpose that only moves
size-1 axes is a Reshape (a free view).

Axis remapping: output axis ``i`` of ``transpose(x, p)`` is axis ``p[i]`` of ``x``.
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import String, Vec, i64, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ...egraph.shapes import is_zero, norm_axis
from ..registry import ROOT as t
from ..registry import Family
from .layout import BINARY

LAYOUT_FAMILY = Family("layout")
FAMILIES = (LAYOUT_FAMILY,)

x, y, z, c, sizes, st, en, steps, value = vars_("x y z c sizes st en steps value", L.Tensor)
p, sa, sx, va, vb, vc = vars_("p sa sx va vb vc", Vec[i64])
ia, ib, ic, keep, noop = vars_("ia ib ic keep noop", i64)
(mode,) = vars_("mode", String)

INVERSE_RANKS = (2, 3, 4, 5)
"""Ranks for which rules that need the inverse permutation are generated (egglog has no loops)."""
CONST_OPERAND_RANKS = (3, 4)
"""Ranks of transpose-sink-binary-const ([B,S,D] and NCHW/NHWC; each rank costs 8 egglog rules)."""


def _axis(axis: i64) -> i64:
    """The input axis a (possibly negative) axis of ``transpose(x, p)`` reads."""
    return p[norm_axis(axis, p.length())]


def inverse(perm: Vec[i64], rank: int) -> list[i64]:
    """``q`` with ``q[perm[i]] == i`` (``q[j]`` = the sum of ``i * (perm[i] == j)``)."""
    return [sum((i64(i) * is_zero(perm[i] - j) for i in range(rank)), i64(0)) for j in range(rank)]


def _in_range(axes: Vec[i64], k: int) -> list[FactLike]:
    """The first ``k`` axes are valid axes of ``transpose(x, p)`` (an invalid one would index p)."""
    return [f for i in range(k) for f in (axes[i] < p.length(), axes[i] >= i64(0) - p.length())]


def _ints(items: list[i64]) -> L.Tensor:
    return L.Tensor.ints(Vec(*items), i64(1))


# Softmax over axis a of T(x) is T(softmax over p[a] of x).
LAYOUT_FAMILY.rewrite("transpose-sink-softmax", L.softmax(L.transpose(x, p), ia), L.transpose(L.softmax(x, _axis(ia)), p))

# A keepdims reduction keeps the rank, so the transpose moves below it with remapped axes.
_REDUCE: dict[str, Callable[..., L.Tensor]] = {"mean": L.reduce_mean, "sum": L.reduce_sum}
for _rname, _reduce in _REDUCE.items():
    for _k in (1, 2):
        LAYOUT_FAMILY.rewrite(
            "transpose-sink-reduce",
            _reduce(L.transpose(x, p), L.Tensor.ints(va, i64(1)), i64(1), noop),
            L.transpose(_reduce(x, _ints([_axis(va[i]) for i in range(_k)]), i64(1), noop), p),
            va.length() == i64(_k),
            *_in_range(va, _k),
            variant=f"{_rname}-{_k}",
        )

# Concat of equally transposed tensors is the transpose of their Concat on the remapped axis.
LAYOUT_FAMILY.rewrite(
    "transpose-sink-concat",
    L.concat(L.tlist([L.transpose(x, p), L.transpose(y, p)]), ia),
    L.transpose(L.concat(L.tlist([x, y]), _axis(ia)), p),
    variant="2",
)
LAYOUT_FAMILY.rewrite(
    "transpose-sink-concat",
    L.concat(L.tlist([L.transpose(x, p), L.transpose(y, p), L.transpose(z, p)]), ia),
    L.transpose(L.concat(L.tlist([x, y, z]), _axis(ia)), p),
    variant="3",
)

# Each output of a Split of T(x) is T(the same output of a Split of x on the remapped axis).
LAYOUT_FAMILY.rewrite(
    "transpose-sink-split",
    L.split(L.transpose(x, p), sizes, ia, ib, ic),
    L.transpose(L.split(x, sizes, _axis(ia), ib, ic), p),
)

# Slice of T(x) on axes A is T(Slice of x on axes p[A]) (explicit or implicit axes).
for _k in (1, 2):
    LAYOUT_FAMILY.rewrite(
        "transpose-sink-slice",
        L.slice_(L.transpose(x, p), st, en, L.Tensor.ints(vc, i64(1)), steps),
        L.transpose(L.slice_(x, st, en, _ints([_axis(vc[i]) for i in range(_k)]), steps), p),
        vc.length() == i64(_k),
        *_in_range(vc, _k),
        variant=f"axes{_k}",
    )
    LAYOUT_FAMILY.rewrite(
        "transpose-sink-slice",
        L.slice_(L.transpose(x, p), L.Tensor.ints(va, i64(1)), en, L.Tensor.none(), steps),
        L.transpose(L.slice_(x, L.Tensor.ints(va, i64(1)), en, _ints([p[i] for i in range(_k)]), steps), p),
        va.length() == i64(_k),
        p.length() >= i64(_k),
        variant=f"implicit{_k}",
    )

for _r in INVERSE_RANKS:
    _inv = inverse(p, _r)
    _rank = (p.length() == i64(_r),)
    # g(T(x), c) for a constant c of x's rank => T(g(x, T(c, p^-1))): T(c, p^-1) folds at export,
    # and the transpose keeps sinking towards its inverse (bias adds in NHWC round trips).
    for _gname, _g in BINARY.items():
        if _r not in CONST_OPERAND_RANKS or _gname == "pow":
            continue
        _const = (L.is_const(c), L.shape(c) == sa, sa.length() == i64(_r), *_rank)
        LAYOUT_FAMILY.rewrite(
            "transpose-sink-binary-const",
            _g(L.transpose(x, p), c),
            L.transpose(_g(x, L.transpose(c, Vec(*_inv))), p),
            *_const,
            variant=f"{_gname}-right-{_r}",
        )
        LAYOUT_FAMILY.rewrite(
            "transpose-sink-binary-const",
            _g(c, L.transpose(x, p)),
            L.transpose(_g(L.transpose(c, Vec(*_inv)), x), p),
            *_const,
            variant=f"{_gname}-left-{_r}",
        )
    # Pad of T(x) is T(Pad of x) with the pads permuted back (begins then ends).
    _pads = Vec(*[va[_inv[j]] for j in range(_r)], *[va[i64(_r) + _inv[j]] for j in range(_r)])
    LAYOUT_FAMILY.rewrite(
        "transpose-sink-pad",
        L.pad(L.transpose(x, p), L.Tensor.ints(va, i64(1)), value, L.Tensor.none(), mode),
        L.transpose(L.pad(x, L.Tensor.ints(_pads, i64(1)), value, L.Tensor.none(), mode), p),
        *_rank,
        va.length() == i64(2 * _r),
        variant=str(_r),
    )


def _gt(u: i64, v: i64) -> i64:
    """1 when ``u > v`` else 0."""
    return (u - v).max(i64(0)).min(i64(1))


for _r in range(2, 7):
    # A transpose that keeps the non-1 axes in order only moves size-1 axes: it is a Reshape (a
    # view, no copy). Every inverted pair of axes must include a size-1 axis.
    _inverted_pairs_have_a_unit_axis = [
        _gt(p[i], p[j]) * (sx[p[i]] - 1) * (sx[p[j]] - 1) == i64(0) for i in range(_r) for j in range(i + 1, _r)
    ]
    LAYOUT_FAMILY.rewrite(
        "transpose-to-reshape",
        L.transpose(x, p),
        L.reshape(x, L.Tensor.ints(sa, i64(1)), i64(0)),
        p.length() == i64(_r),
        L.shape(x) == sx,
        L.shape(t) == sa,
        *[sx[i] >= i64(1) for i in range(_r)],
        *_inverted_pairs_have_a_unit_axis,
        variant=str(_r),
    )

# Swapping the last two axes of [B * H, S, D] blocks and splitting B * H back is swapping the last
# two axes of the [B, H, S, D] tensor the blocks were flattened from (dynamo's key transpose for
# attention scores: flatten, 3-D transpose, unflatten), so attention fusion sees one Transpose.
(ta, tb) = vars_("ta tb", L.Tensor)
LAYOUT_FAMILY.rewrite(
    "transpose-through-batch-merge",
    L.reshape(L.transpose(L.reshape(x, ta, ia), Vec(i64(0), i64(2), i64(1))), tb, ib),
    L.transpose(x, Vec(i64(0), i64(1), i64(3), i64(2))),
    L.shape(x) == sx,
    sx.length() == i64(4),
    L.shape(L.reshape(x, ta, ia)) == va,
    va.length() == i64(3),
    va[1] == sx[2],
    va[2] == sx[3],
    L.shape(t) == Vec(sx[0], sx[1], sx[3], sx[2]),
)

RULE_NAMES = [
    "transpose-through-batch-merge",
    "transpose-sink-softmax",
    "transpose-sink-reduce",
    "transpose-sink-concat",
    "transpose-sink-split",
    "transpose-sink-slice",
    "transpose-sink-binary-const",
    "transpose-sink-pad",
    "transpose-to-reshape",
]
