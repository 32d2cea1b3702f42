"""Interchange rules (TASO/TENSAT): Concat, Split and Slice moved across elementwise ops, pooling,
MatMul and Conv, and Concat/Split/Slice pairs that cancel.

They let one op run over a concatenation instead of once per part (fewer kernels, larger GEMMs)
and let a Split that a merge introduced meet the Concat that undoes it. Each rule's root is a
single term built from its own subterms, so no rule here can create a cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import Vec, f64, i64, ne, vars_

from ...egraph import lang as L
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("interchange")
FAMILIES = (FAMILY,)

x, y, z, w, c, w1, w2, b1, b2 = vars_("x y z w c w1 w2 b1 b2", L.Tensor)
sizes, steps, lo, hi = vars_("sizes steps lo hi", L.Tensor)
sa, sb, sc, sd, so, vs, ve, vm, va = vars_("sa sb sc sd so vs ve vm va", Vec[i64])
strides, pads, dil, kernel = vars_("strides pads dil kernel", Vec[i64])
ia, ib, nout, dt, cm, cip, group = vars_("ia ib nout dt cm cip group", i64)
(fa,) = vars_("fa", f64)


def _cat(items: list[L.Tensor], axis: i64 | int) -> L.Tensor:
    return L.concat(L.tlist(items), i64(axis) if isinstance(axis, int) else axis)


def _ints(values: Vec[i64]) -> L.Tensor:
    return L.Tensor.ints(values, i64(1))


BINARY: dict[str, Callable[[L.Tensor, L.Tensor], L.Tensor]] = {
    "add": L.add,
    "sub": L.sub,
    "mul": L.mul,
    "div": L.div,
}

# ---------------------------------------------------------------- Concat and elementwise ops
for _name, _g in BINARY.items():
    # concat(g(x, y), g(z, w)) => g(concat(x, z), concat(y, w)) (TASO) for operands that do not
    # broadcast: one op over the concatenation instead of two.
    FAMILY.rewrite(
        "concat-binary",
        _cat([_g(x, y), _g(z, w)], ia),
        _g(_cat([x, z], ia), _cat([y, w], ia)),
        L.shape(x) == sa,
        L.shape(y) == sa,
        L.shape(z) == sb,
        L.shape(w) == sb,
        variant=_name,
    )

# concat(g(x, c), g(z, c)) => g(concat(x, z), c) for a shared operand c (a bias, a scale) that is
# constant along the concat axis (TASO's scalar-multiply case, generalized to broadcasts). Sub and
# Div by a constant become Add and Mul (algebraic's sub-const-to-add, div-const-to-mul).
for _name, _g in (("add", L.add), ("mul", L.mul)):
    _keeps = (L.shape(x) == sa, L.shape(_g(x, c)) == sa, L.shape(z) == sb, L.shape(_g(z, c)) == sb)
    _lhs, _rhs = _cat([_g(x, c), _g(z, c)], ia), _g(_cat([x, z], ia), c)
    # c does not reach the concat axis ...
    FAMILY.rewrite(
        "concat-shared-operand",
        _lhs,
        _rhs,
        *_keeps,
        L.shape(c) == sc,
        sc.length() + ia < sa.length(),
        variant=f"{_name}-short",
    )
    # ... or has a 1 there.
    FAMILY.rewrite(
        "concat-shared-operand",
        _lhs,
        _rhs,
        *_keeps,
        L.shape(c) == sc,
        sc.length() == sa.length(),
        sc[ia] == i64(1),
        variant=f"{_name}-one",
    )

# concat(clip(x), clip(y)) => clip(concat(x, y)) for equal bounds (Relu6 branches).
FAMILY.rewrite(
    "concat-clip",
    _cat([L.clip(x, lo, hi), L.clip(y, lo, hi)], ia),
    L.clip(_cat([x, y], ia), lo, hi),
    L.dtype(x) == dt,
    L.dtype(y) == dt,
)
# concat(softmax(x, a), softmax(y, a)) over another axis => softmax(concat(x, y), a).
FAMILY.rewrite(
    "concat-softmax",
    _cat([L.softmax(x, ib), L.softmax(y, ib)], ia),
    L.softmax(_cat([x, y], ia), ib),
    ne(ia).to(ib),
    ib >= i64(0),
    L.dtype(x) == dt,
    L.dtype(y) == dt,
)

# ---------------------------------------------------------------- Concat and pooling
for _axis in (0, 1):
    _same_but_axis = (
        L.shape(x) == sa,
        L.shape(y) == sb,
        sa.length() >= i64(3),  # before the set: a pool input always has a batch and a channel axis
        sb.length() >= i64(3),
        sa.set(i64(_axis), i64(0)) == sb.set(i64(_axis), i64(0)),
    )
    _pools: dict[str, Callable[[L.Tensor], L.Tensor]] = {
        "max": lambda v: L.max_pool(v, kernel, strides, pads, dil, cm),
        "average": lambda v: L.average_pool(v, kernel, strides, pads, cm, cip),
        "global-average": L.global_average_pool,
    }
    for _name, _pool in _pools.items():
        # concat(pool(x), pool(y)) on the batch or channel axis => pool(concat(x, y)) (TASO): one pool.
        FAMILY.rewrite(
            "concat-pool",
            _cat([_pool(x), _pool(y)], _axis),
            _pool(_cat([x, y], _axis)),
            *_same_but_axis,
            variant=f"{_name}-{_axis}",
        )

# ---------------------------------------------------------------- Concat structure
# concat(concat(x, y, a), z, a) => concat(x, y, z, a): flat concats meet Split/Slice rules.
FAMILY.rewrite("concat-flatten", _cat([_cat([x, y], ia), z], ia), _cat([x, y, z], ia), variant="left")
FAMILY.rewrite("concat-flatten", _cat([x, _cat([y, z], ia)], ia), _cat([x, y, z], ia), variant="right")
# A Concat of one tensor is that tensor.
FAMILY.rewrite("concat-single", _cat([x], ia), x)

# ---------------------------------------------------------------- Split / Slice against Concat
# split(concat(x, y)) on the same axis with the parts' sizes gives the parts back (TASO's split definition).
_parts = (L.shape(x) == sa, L.shape(y) == sb)
for _i, _part in ((0, x), (1, y)):
    FAMILY.rewrite(
        "split-concat",
        L.split(_cat([x, y], ia), _ints(vs), ia, nout, i64(_i)),
        _part,
        *_parts,
        vs == Vec(sa[ia], sb[ia]),
        variant=f"sizes-{_i}",
    )
    FAMILY.rewrite(
        "split-concat",
        L.split(_cat([x, y], ia), L.Tensor.none(), ia, i64(2), i64(_i)),
        _part,
        *_parts,
        sa[ia] == sb[ia],
        variant=f"even-{_i}",
    )
# A Split into one part is its input.
FAMILY.rewrite("split-single", L.split(x, _ints(vs), ia, nout, i64(0)), x, vs.length() == i64(1), variant="sizes")
FAMILY.rewrite("split-single", L.split(x, L.Tensor.none(), ia, i64(1), i64(0)), x, variant="even")
# concat(split(x)_0, split(x)_1[, split(x)_2]) on the split axis is x.
for _n in (2, 3):
    FAMILY.rewrite(
        "concat-split",
        _cat([L.split(x, sizes, ia, nout, i64(i)) for i in range(_n)], ia),
        x,
        L.shape(x) == sa,
        L.shape(t) == sa,
        variant=str(_n),
    )

# A Slice of a Concat that stays inside one part is a Slice of that part (ends past the
# part are clamped alike, so only the part's bounds matter); positive steps only.
_one_axis = (vs.length() == i64(1), ve.length() == i64(1), vs[0] >= i64(0), ve[0] >= i64(0))
for _steps_name, _steps in (("nosteps", L.Tensor.none()), ("steps", L.Tensor.ints(vm, i64(1)))):
    _steps_ok = () if _steps_name == "nosteps" else (vm.length() == i64(1), vm[0] >= i64(1))
    _axes = _ints(Vec(ia))
    FAMILY.rewrite(
        "slice-concat",
        L.slice_(_cat([x, y], ia), _ints(vs), _ints(ve), _axes, _steps),
        L.slice_(x, _ints(vs), _ints(ve), _axes, _steps),
        *_one_axis,
        *_steps_ok,
        L.shape(x) == sa,
        ve[0] <= sa[ia],
        variant=f"first-{_steps_name}",
    )
    FAMILY.rewrite(
        "slice-concat",
        L.slice_(_cat([x, y], ia), _ints(vs), _ints(ve), _axes, _steps),
        L.slice_(y, _ints(Vec(vs[0] - sa[ia])), _ints(Vec(ve[0] - sa[ia])), _axes, _steps),
        *_one_axis,
        *_steps_ok,
        L.shape(x) == sa,
        vs[0] >= sa[ia],
        ve[0] >= sa[ia],
        variant=f"second-{_steps_name}",
    )
# concat(x[s:m], x[m:e]) on the sliced axis => x[s:e]: adjacent slices merge.
FAMILY.rewrite(
    "concat-slices",
    _cat(
        [
            L.slice_(x, _ints(vs), _ints(vm), _ints(Vec(ia)), L.Tensor.none()),
            L.slice_(x, _ints(vm), _ints(ve), _ints(Vec(ia)), L.Tensor.none()),
        ],
        ia,
    ),
    L.slice_(x, _ints(vs), _ints(ve), _ints(Vec(ia)), L.Tensor.none()),
    vs.length() == i64(1),
    vm.length() == i64(1),
    ve.length() == i64(1),
    vs[0] >= i64(0),
    vm[0] >= vs[0],
    ve[0] >= vm[0],
)

# ---------------------------------------------------------------- unary ops hoisted above a Split
_UNARY: dict[str, Callable[[L.Tensor], L.Tensor]] = {
    "relu": L.relu,
    "sigmoid": L.sigmoid,
    "tanh": L.tanh,
    "erf": L.erf,
    "neg": L.neg,
    "exp": L.exp,
    "abs": L.abs_,
    "leaky_relu": lambda v: L.leaky_relu(v, fa),
}
for _name, _f in _UNARY.items():
    # f(split(x)_i) => split(f(x))_i: after a merge, one activation over the merged output is
    # shared by every part (TENSAT's relu-of-concat multi-pattern rule, without the cycle risk).
    FAMILY.rewrite(
        "split-unary",
        _f(L.split(x, sizes, ia, nout, ib)),
        L.split(_f(x), sizes, ia, nout, ib),
        variant=_name,
    )

# ---------------------------------------------------------------- Concat and MatMul
# concat(x @ w1, x @ w2, last axis) => x @ concat(w1, w2, axis 1) (TASO): one wider GEMM.
FAMILY.rewrite(
    "concat-matmul-shared-left",
    _cat([L.matmul(x, w1), L.matmul(x, w2)], ia),
    L.matmul(x, _cat([w1, w2], 1)),
    L.shape(w1) == sa,
    sa.length() == i64(2),
    L.shape(w2) == sb,
    sb.length() == i64(2),
    L.shape(t) == so,
    ia == so.length() - i64(1),
)
# concat(x @ w, y @ w, a row/batch axis) => concat(x, y, a) @ w for a matrix w: one taller GEMM.
FAMILY.rewrite(
    "concat-matmul-shared-right",
    _cat([L.matmul(x, w), L.matmul(y, w)], ia),
    L.matmul(_cat([x, y], ia), w),
    L.shape(w) == sc,
    sc.length() == i64(2),
    L.shape(x) == sa,
    L.shape(y) == sb,
    sa.length() == sb.length(),
    ia + i64(1) < sa.length(),
)
# x @ y + z @ w => concat(x, z, last) @ concat(y, w, 0) (TASO): one GEMM over the joint inner dim.
FAMILY.rewrite(
    "matmul-sum-to-concat",
    L.add(L.matmul(x, y), L.matmul(z, w)),
    L.matmul(_cat([x, z], sa.length() - i64(1)), _cat([y, w], 0)),
    L.shape(x) == sa,
    L.shape(z) == sb,
    sa.length() == sb.length(),
    sa.length() >= i64(2),
    sa.set(sa.length() - i64(1), i64(0)) == sb.set(sb.length() - i64(1), i64(0)),
    L.shape(y) == sc,
    sc.length() == i64(2),
    L.shape(w) == sd,
    sd.length() == i64(2),
    sc[1] == sd[1],
)

# ---------------------------------------------------------------- Concat and Conv
# concat(conv(x, w), conv(y, w), batch axis) => conv(concat(x, y), w) (TASO).
FAMILY.rewrite(
    "concat-conv-batch",
    _cat([L.conv(x, w, c, strides, pads, dil, group), L.conv(y, w, c, strides, pads, dil, group)], 0),
    L.conv(_cat([x, y], 0), w, c, strides, pads, dil, group),
    L.shape(x) == sa,
    L.shape(y) == sb,
    sa.set(i64(0), i64(0)) == sb.set(i64(0), i64(0)),
)
# concat(conv(x, w1, b1), conv(x, w2, b2), channels) => conv(x, concat(w1, w2), concat(b1, b2)) (TASO):
# sibling convs whose outputs are concatenated (Inception) become one conv.
_same_kernel = (L.shape(w1) == sa, L.shape(w2) == sb, sa.set(i64(0), i64(0)) == sb.set(i64(0), i64(0)))
FAMILY.rewrite(
    "concat-conv-channels",
    _cat(
        [
            L.conv(x, w1, L.Tensor.none(), strides, pads, dil, i64(1)),
            L.conv(x, w2, L.Tensor.none(), strides, pads, dil, i64(1)),
        ],
        1,
    ),
    L.conv(x, _cat([w1, w2], 0), L.Tensor.none(), strides, pads, dil, i64(1)),
    *_same_kernel,
    variant="nobias",
)
FAMILY.rewrite(
    "concat-conv-channels",
    _cat([L.conv(x, w1, b1, strides, pads, dil, i64(1)), L.conv(x, w2, b2, strides, pads, dil, i64(1))], 1),
    L.conv(x, _cat([w1, w2], 0), _cat([b1, b2], 0), strides, pads, dil, i64(1)),
    *_same_kernel,
    L.shape(b1) == Vec(sa[0]),
    L.shape(b2) == Vec(sb[0]),
    variant="bias",
)
# concat(conv(x, w1, b1), conv(y, w2, b2), channels) with equal kernels => one conv with two groups
# over concat(x, y) (TASO infers the group from the channel counts): one kernel instead of two.
_grouped = (L.shape(w1) == sa, L.shape(w2) == sa, L.shape(x) == sb, L.shape(y) == sb)
for _variant, _b1, _b2, _b in (
    ("nobias", L.Tensor.none(), L.Tensor.none(), L.Tensor.none()),
    ("bias", b1, b2, _cat([b1, b2], 0)),
):
    FAMILY.rewrite(
        "concat-conv-grouped",
        _cat(
            [L.conv(x, w1, _b1, strides, pads, dil, i64(1)), L.conv(y, w2, _b2, strides, pads, dil, i64(1))],
            1,
        ),
        L.conv(_cat([x, y], 1), _cat([w1, w2], 0), _b, strides, pads, dil, i64(2)),
        *_grouped,
        *((L.shape(b1) == Vec(sa[0]), L.shape(b2) == Vec(sa[0])) if _variant == "bias" else ()),
        variant=_variant,
    )
# conv(x, w1) + conv(y, w2) => conv(concat(x, y), concat(w1, w2), over input channels) (TASO): one conv.
_in_channels = (
    L.shape(x) == sa,
    L.shape(y) == sb,
    sa.set(i64(1), i64(0)) == sb.set(i64(1), i64(0)),
    L.shape(w1) == sc,
    L.shape(w2) == sd,
    sc.set(i64(1), i64(0)) == sd.set(i64(1), i64(0)),
)
FAMILY.rewrite(
    "conv-sum-to-concat",
    L.add(
        L.conv(x, w1, L.Tensor.none(), strides, pads, dil, i64(1)),
        L.conv(y, w2, L.Tensor.none(), strides, pads, dil, i64(1)),
    ),
    L.conv(_cat([x, y], 1), _cat([w1, w2], 1), L.Tensor.none(), strides, pads, dil, i64(1)),
    *_in_channels,
    variant="nobias",
)
FAMILY.rewrite(
    "conv-sum-to-concat",
    L.add(L.conv(x, w1, b1, strides, pads, dil, i64(1)), L.conv(y, w2, b2, strides, pads, dil, i64(1))),
    L.conv(_cat([x, y], 1), _cat([w1, w2], 1), L.add(b1, b2), strides, pads, dil, i64(1)),
    *_in_channels,
    L.shape(b1) == Vec(sc[0]),
    L.shape(b2) == Vec(sd[0]),
    variant="bias",
)

RULE_NAMES = list(FAMILY.names)
"""This family's rule names, in declaration order."""
