"""Shape, dtype and constness analyses as egglog rules.

Shapes are ``Vec[i64]`` per e-class (``>= 0`` known dims, ``< 0`` symbolic). The rules below
compute the shape of a term from its inputs' shapes, so a term a rewrite creates gets a shape
without help from Python. Where a rule needs a rank (broadcasting, transposes, conv windows)
one rule per rank is generated; ranks up to ``MAX_RANK`` are covered. Ops or instances not
covered here keep the shape ONNX shape inference gave them at import.

Broadcasting a dim pair uses only i64 arithmetic (egglog has no conditionals in actions):
``1`` is mapped below every other value, the larger of the pair wins (a known dim beats a
symbolic one), and two 1s give 1.
"""

from __future__ import annotations

from egglog import Ruleset, String, Vec, eq, f64, function, i64, relation, rule, ruleset, set_, vars_

from . import lang as L

MAX_RANK = 6
_BIG = 1 << 40

shape_rules: Ruleset = ruleset(name="shapes")
"""Shape, dtype and constness analysis; run to saturation between rewrite iterations."""


def _is_one(x: i64) -> i64:
    """1 when ``x == 1`` else 0 (for integers)."""
    return i64(1) - (x - 1).max(i64(1) - x).min(1)


def _is_zero(x: i64) -> i64:
    return i64(1) - x.max(i64(0) - x).min(1)


def _is_negative(x: i64) -> i64:
    return i64(1) - (x + 1).max(0).min(1)


PAIR_BASE = 1 << 40
"""Symbolic dims at or below ``-PAIR_BASE`` stand for the broadcast of two other symbols."""


def bdim(a: i64, b: i64) -> i64:
    """The broadcast of two dims.

    Two different symbols give a third one named by the pair (either may be 1 at run time, so
    the result is neither); the pair code is symmetric so ``a+b`` and ``b+a`` agree.
    """
    fa = a - _is_one(a) * (_BIG + 1)
    fb = b - _is_one(b) * (_BIG + 1)
    r = fa.max(fb)
    r = r + _is_zero(r + _BIG) * (_BIG + 1)
    lo, hi = a.min(b), a.max(b)
    pair = i64(0) - (i64(PAIR_BASE) + ((i64(0) - lo) % (1 << 20)) * (1 << 20) + (i64(0) - hi) % (1 << 20))
    two_symbols = _is_negative(a) * _is_negative(b) * (i64(1) - _is_zero(a - b))
    return r + two_symbols * (pair - r)


def _vec(items: list) -> Vec[i64]:
    return Vec(*items) if items else Vec[i64].empty()


t, a, b, c, d, e = vars_("t a b c d e", L.Tensor)
sa, sb, sc, sd = vars_("sa sb sc sd", Vec[i64])
(xs,) = vars_("xs", L.TList)
(ys,) = vars_("ys", L.TList)
ia, ib, ic = vars_("ia ib ic", i64)
va, vb, vc, vd = vars_("va vb vc vd", Vec[i64])
fa, fb, fc = vars_("fa fb fc", f64)
(str_a,) = vars_("str_a", String)
(dt,) = vars_("dt", i64)


def _broadcast(shapes: list[Vec[i64]], ranks: list[int]) -> Vec[i64]:
    return _vec(_broadcast_dims(shapes, ranks))


def _broadcast_dims(shapes: list[Vec[i64]], ranks: list[int]) -> list[i64 | None]:
    """Numpy broadcasting of the leading ``ranks[k]`` dims of each shape (right-aligned)."""
    r = max(ranks)
    dims = []
    for i in range(r):
        acc = None
        for s, rk in zip(shapes, ranks, strict=True):
            j = i - (r - rk)
            if j < 0:
                continue
            acc = s[j] if acc is None else bdim(acc, s[j])
        dims.append(acc)
    return dims


# ---------------------------------------------------------------- leaves
shape_rules.append(rule(eq(t).to(L.Tensor.splat(fa, va, ia))).then(set_(L.shape(t)).to(va), set_(L.dtype(t)).to(ia)))
shape_rules.append(rule(eq(t).to(L.Tensor.ints(va, i64(1)))).then(set_(L.shape(t)).to(Vec(va.length()))))
shape_rules.append(rule(eq(t).to(L.Tensor.ints(va, i64(0)))).then(set_(L.shape(t)).to(Vec[i64].empty())))
for _rank in (0, 1):
    shape_rules.append(rule(eq(t).to(L.Tensor.ints(va, i64(_rank)))).then(set_(L.dtype(t)).to(i64(7))))

# ---------------------------------------------------------------- same shape as input 0
_SAME_SHAPE = [
    lambda x: L.relu(x),
    lambda x: L.sigmoid(x),
    lambda x: L.tanh(x),
    lambda x: L.erf(x),
    lambda x: L.neg(x),
    lambda x: L.exp(x),
    lambda x: L.log(x),
    lambda x: L.sqrt(x),
    lambda x: L.reciprocal(x),
    lambda x: L.abs_(x),
    lambda x: L.identity(x),
    lambda x: L.leaky_relu(x, fa),
    lambda x: L.gelu(x, str_a),
    lambda x: L.clip(x, b, c),
    lambda x: L.softmax(x, ia),
    lambda x: L.batch_norm(x, b, c, d, e, fa),
    lambda x: L.layer_norm(x, b, c, ia, fa),
    lambda x: L.lrn(x, fa, fb, fc, ia),
]
for _make in _SAME_SHAPE:
    shape_rules.append(rule(eq(t).to(_make(a)), L.shape(a) == sa).then(set_(L.shape(t)).to(sa)))
    shape_rules.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
shape_rules.append(rule(eq(t).to(L.cast(a, ia)), L.shape(a) == sa).then(set_(L.shape(t)).to(sa), set_(L.dtype(t)).to(ia)))

# ---------------------------------------------------------------- broadcasting
# Broadcast shapes are computed once per distinct pair of shapes: ops ask (bshape_req) and
# read the answer (bshape), so the rank-generated rules exist once, not once per op.
bshape_req = relation("bshape_req", Vec[i64], Vec[i64])


@function
def bshape(x: Vec[i64], y: Vec[i64]) -> Vec[i64]:
    """The numpy broadcast of two shapes."""


for ra in range(MAX_RANK + 1):
    for rb in range(MAX_RANK + 1):
        shape_rules.append(
            rule(bshape_req(sa, sb), sa.length() == i64(ra), sb.length() == i64(rb)).then(
                set_(bshape(sa, sb)).to(_broadcast([sa, sb], [ra, rb]))
            )
        )
for _op in (L.add, L.sub, L.mul, L.div, L.pow_):
    shape_rules.append(rule(eq(t).to(_op(a, b)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
    shape_rules.append(rule(eq(t).to(_op(a, b)), L.shape(a) == sa, L.shape(b) == sb).then(bshape_req(sa, sb)))
    shape_rules.append(
        rule(eq(t).to(_op(a, b)), L.shape(a) == sa, L.shape(b) == sb, bshape(sa, sb) == sc).then(set_(L.shape(t)).to(sc))
    )
shape_rules.append(rule(eq(t).to(L.where(a, b, c)), L.dtype(b) == dt).then(set_(L.dtype(t)).to(dt)))
shape_rules.append(rule(eq(t).to(L.where(a, b, c)), L.shape(b) == sb, L.shape(c) == sc).then(bshape_req(sb, sc)))
shape_rules.append(
    rule(eq(t).to(L.where(a, b, c)), L.shape(a) == sa, L.shape(b) == sb, L.shape(c) == sc, bshape(sb, sc) == sd).then(
        bshape_req(sa, sd)
    )
)
shape_rules.append(
    rule(
        eq(t).to(L.where(a, b, c)),
        L.shape(a) == sa,
        L.shape(b) == sb,
        L.shape(c) == sc,
        bshape(sb, sc) == sd,
        bshape(sa, sd) == va,
    ).then(set_(L.shape(t)).to(va))
)

# ---------------------------------------------------------------- matmul and gemm
shape_rules.append(rule(eq(t).to(L.matmul(a, b)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
for ra in range(2, MAX_RANK + 1):
    for rb in range(2, MAX_RANK + 1):
        out = _vec(_broadcast_dims([sa, sb], [ra - 2, rb - 2]) + [sa[ra - 2], sb[rb - 1]])
        shape_rules.append(
            rule(
                eq(t).to(L.matmul(a, b)), L.shape(a) == sa, L.shape(b) == sb, sa.length() == i64(ra), sb.length() == i64(rb)
            ).then(set_(L.shape(t)).to(out))
        )
for ra in range(2, MAX_RANK + 1):  # matrix x vector
    shape_rules.append(
        rule(eq(t).to(L.matmul(a, b)), L.shape(a) == sa, L.shape(b) == sb, sa.length() == i64(ra), sb.length() == i64(1)).then(
            set_(L.shape(t)).to(_vec([sa[i] for i in range(ra - 1)]))
        )
    )
for _ta in (0, 1):
    for _tb in (0, 1):
        shape_rules.append(
            rule(
                eq(t).to(L.gemm(a, b, c, fa, fb, i64(_ta), i64(_tb))),
                L.shape(a) == sa,
                L.shape(b) == sb,
                sa.length() == i64(2),
                sb.length() == i64(2),
            ).then(set_(L.shape(t)).to(Vec(sa[_ta], sb[1 - _tb])))
        )
shape_rules.append(rule(eq(t).to(L.gemm(a, b, c, fa, fb, ia, ib)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))


# ---------------------------------------------------------------- conv and pooling
def _window(size: i64, k: i64, stride: i64, dil: i64, pad_total: i64) -> i64:
    return (size + pad_total - dil * (k - 1) - 1) / stride + 1


for _n in (1, 2, 3):
    spatial = [
        _window(sa[2 + i], sb[2 + i], va[i], vc[i], vb[i] + vb[_n + i]) for i in range(_n)
    ]  # va strides, vb pads, vc dilations
    shape_rules.append(
        rule(
            eq(t).to(L.conv(a, b, c, va, vb, vc, ia)),
            L.shape(a) == sa,
            L.shape(b) == sb,
            sa.length() == i64(_n + 2),
            sb.length() == i64(_n + 2),
        ).then(set_(L.shape(t)).to(_vec([sa[0], sb[0]] + spatial)))
    )
    pool_spatial = [_window(sa[2 + i], va[i], vb[i], vd[i], vc[i] + vc[_n + i]) for i in range(_n)]
    shape_rules.append(
        rule(
            eq(t).to(L.max_pool(a, va, vb, vc, vd, i64(0))), L.shape(a) == sa, sa.length() == i64(_n + 2), va.length() == i64(_n)
        ).then(set_(L.shape(t)).to(_vec([sa[0], sa[1]] + pool_spatial)))
    )
    avg_spatial = [_window(sa[2 + i], va[i], vb[i], i64(1), vc[i] + vc[_n + i]) for i in range(_n)]
    shape_rules.append(
        rule(
            eq(t).to(L.average_pool(a, va, vb, vc, i64(0), ib)),
            L.shape(a) == sa,
            sa.length() == i64(_n + 2),
            va.length() == i64(_n),
        ).then(set_(L.shape(t)).to(_vec([sa[0], sa[1]] + avg_spatial)))
    )
    shape_rules.append(
        rule(eq(t).to(L.global_average_pool(a)), L.shape(a) == sa, sa.length() == i64(_n + 2)).then(
            set_(L.shape(t)).to(_vec([sa[0], sa[1]] + [i64(1)] * _n))
        )
    )
for _make in (
    lambda x: L.conv(x, b, c, va, vb, vc, ia),
    lambda x: L.conv_transpose(x, b, c, va, vb, vc, ia, vd),
    lambda x: L.max_pool(x, va, vb, vc, vd, ia),
    lambda x: L.average_pool(x, va, vb, vc, ia, ib),
    lambda x: L.global_average_pool(x),
):
    shape_rules.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))

# ---------------------------------------------------------------- layout
for _r in range(MAX_RANK + 1):
    shape_rules.append(
        rule(eq(t).to(L.transpose(a, va)), L.shape(a) == sa, sa.length() == i64(_r), va.length() == i64(_r)).then(
            set_(L.shape(t)).to(_vec([sa[va[i]] for i in range(_r)]))
        )
    )
    # Reshape to an all-positive constant target: the target is the shape.
    shape_rules.append(
        rule(
            eq(t).to(L.reshape(a, L.Tensor.ints(va, i64(1)), ia)),
            va.length() == i64(_r),
            *[va[i] > i64(0) for i in range(_r)],
        ).then(set_(L.shape(t)).to(va))
    )
    # Flatten of known dims.
    for _axis in range(_r + 1):
        outer = i64(1)
        for i in range(_axis):
            outer = outer * sa[i]
        inner = i64(1)
        for i in range(_axis, _r):
            inner = inner * sa[i]
        shape_rules.append(
            rule(
                eq(t).to(L.flatten(a, i64(_axis))),
                L.shape(a) == sa,
                sa.length() == i64(_r),
                *[sa[i] >= i64(0) for i in range(_r)],
            ).then(set_(L.shape(t)).to(Vec(outer, inner)))
        )
for _make in (
    lambda x: L.transpose(x, va),
    lambda x: L.reshape(x, b, ia),
    lambda x: L.flatten(x, ia),
    lambda x: L.squeeze(x, b),
    lambda x: L.unsqueeze(x, b),
    lambda x: L.split(x, b, ia, ib, ic),
    lambda x: L.slice_(x, b, c, d, e),
    lambda x: L.gather(x, b, ia),
    lambda x: L.expand(x, b),
    lambda x: L.pad(x, b, c, d, str_a),
    lambda x: L.reduce_mean(x, b, ia, ib),
    lambda x: L.reduce_sum(x, b, ia, ib),
):
    shape_rules.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
shape_rules.append(rule(eq(t).to(L.concat(L.TList.cons(a, xs), ia)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
shape_rules.append(rule(eq(t).to(L.shape_of(a, ia, ib))).then(set_(L.dtype(t)).to(i64(7))))
shape_rules.append(rule(eq(t).to(L.constant_of_shape(a, fa, ia))).then(set_(L.dtype(t)).to(ia)))
for _r in range(MAX_RANK + 1):
    shape_rules.append(
        rule(eq(t).to(L.shape_of(a, i64(0), i64(2**63 - 1))), L.shape(a) == sa, sa.length() == i64(_r)).then(
            set_(L.shape(t)).to(Vec(i64(_r)))
        )
    )
# Concat of two or three inputs along a known axis.
for _r in range(1, MAX_RANK + 1):
    for _axis in range(_r):
        shape_rules.append(
            rule(
                eq(t).to(L.concat(L.TList.cons(a, L.TList.cons(b, L.TList.nil())), i64(_axis))),
                L.shape(a) == sa,
                L.shape(b) == sb,
                sa.length() == i64(_r),
            ).then(set_(L.shape(t)).to(sa.set(i64(_axis), sa[_axis] + sb[_axis])))
        )

# ---------------------------------------------------------------- constness
shape_rules.append(rule(eq(t).to(L.Tensor.weight(str_a))).then(L.is_const(t)))
shape_rules.append(rule(eq(t).to(L.Tensor.splat(fa, va, ia))).then(L.is_const(t)))
shape_rules.append(rule(eq(t).to(L.Tensor.ints(va, ia))).then(L.is_const(t)))
shape_rules.append(rule(eq(t).to(L.Tensor.none())).then(L.is_const(t)))
shape_rules.append(rule(eq(xs).to(L.TList.nil())).then(L.list_const(xs)))
shape_rules.append(rule(eq(xs).to(L.TList.cons(a, ys)), L.is_const(a), L.list_const(ys)).then(L.list_const(xs)))
