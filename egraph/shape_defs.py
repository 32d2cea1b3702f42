"""The in-tree shape, dtype and constness rules, built in Python when this module is imported.

Importing it costs about a second (some 500 egglog rules); ``shapes.in_tree_rules`` imports it only
when the rules are not on disk (``rules/table_cache.py`` keeps their declarations), and a run
declares only the rules its model can fire (``egraph.reach``). The conventions (dims, broadcasting,
ranks up to ``MAX_RANK``) are described in ``egraph.shapes``.
"""

from __future__ import annotations

from egglog import RewriteOrRule, String, Vec, eq, f64, i64, rule, set_, var, vars_
from egglog.egraph import FactLike

from . import lang as L
from .ops import OPS
from .shapes import (
    MAX_RANK,
    axis_sum,
    axis_sum_req,
    bdim,
    bshape,
    bshape_req,
    clamp,
    int_ge,
    is_negative,
    is_one,
    is_zero,
    norm_axis,
    numel,
    numel_req,
    unsqueezed_dims,
    vec_of,
)

RULES: list[RewriteOrRule] = []
"""Every in-tree analysis rule, in declaration order (the order egglog runs them in)."""

t, a, b, c, d, e = vars_("t a b c d e", L.Tensor)
sa, sb, sc, sd = vars_("sa sb sc sd", Vec[i64])
(xs,) = vars_("xs", L.TList)
(ys,) = vars_("ys", L.TList)
ia, ib, ic = vars_("ia ib ic", i64)
va, vb, vc, vd = vars_("va vb vc vd", Vec[i64])
fa, fb, fc = vars_("fa fb fc", f64)
(str_a,) = vars_("str_a", String)
(dt,) = vars_("dt", i64)


# ---------------------------------------------------------------- leaves
RULES.append(
    rule(eq(t).to(L.Tensor.splat(fa, va, ia))).then(set_(L.shape(t)).to(va), set_(L.dtype(t)).to(ia))
)
RULES.append(rule(eq(t).to(L.Tensor.ints(va, i64(1)))).then(set_(L.shape(t)).to(Vec(va.length()))))
RULES.append(rule(eq(t).to(L.Tensor.ints(va, i64(0)))).then(set_(L.shape(t)).to(Vec[i64].empty())))
for _rank in (0, 1):
    RULES.append(rule(eq(t).to(L.Tensor.ints(va, i64(_rank)))).then(set_(L.dtype(t)).to(i64(7))))

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
    lambda x: L.reorder_nchwc(x),
    lambda x: L.leaky_relu(x, fa),
    lambda x: L.gelu(x, str_a),
    lambda x: L.clip(x, b, c),
    lambda x: L.softmax(x, ia),
    lambda x: L.batch_norm(x, b, c, d, e, fa),
    lambda x: L.layer_norm(x, b, c, ia, fa),
    lambda x: L.lrn(x, fa, fb, fc, ia),
    lambda x: L.hard_sigmoid(x, fa, fb),
    lambda x: L.hard_swish(x),
    lambda x: L.swish(x, fa),
    lambda x: L.fused_silu(x),
    lambda x: L.fused_gelu(x, str_a, ia),
    lambda x: L.fused_bias_gelu(x, b, str_a, ia),  # the fusion rule requires a bias that does not broadcast x
    lambda x: L.fused_rms_norm(x, b, fa, ia),  # the fusion rule requires a scale that does not broadcast x
    lambda x: L.fused_skip_rms_norm(x, b, c, fa, ia, ib),  # both outputs: the rule requires skip of x's shape
    lambda x: L.fused_rotary(x, b, c, ia),  # cos and sin of [1, 1, seq, head] never broadcast x
]
for _make in _SAME_SHAPE:
    RULES.append(rule(eq(t).to(_make(a)), L.shape(a) == sa).then(set_(L.shape(t)).to(sa)))
    RULES.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
RULES.append(
    rule(eq(t).to(L.cast(a, ia)), L.shape(a) == sa).then(set_(L.shape(t)).to(sa), set_(L.dtype(t)).to(ia))
)
RULES.append(rule(eq(t).to(L.isnan(a)), L.shape(a) == sa).then(set_(L.shape(t)).to(sa), set_(L.dtype(t)).to(i64(9))))

# ---------------------------------------------------------------- broadcasting
# Broadcast shapes are computed once per distinct pair of shapes: ops ask (bshape_req) and
# read the answer (bshape), so the rank-generated rules exist once, not once per op.


for _r in range(MAX_RANK + 1):
    # Equal ranks: dim by dim.
    RULES.append(
        rule(bshape_req(sa, sb), sa.length() == i64(_r), sb.length() == i64(_r)).then(
            set_(bshape(sa, sb)).to(vec_of([bdim(sa[i], sb[i]) for i in range(_r)]))
        )
    )
for _k in range(1, MAX_RANK + 1):
    # Unequal ranks: the shorter shape is padded with leading 1s first.
    ones = Vec(*[i64(1)] * _k)
    RULES.append(
        rule(bshape_req(sa, sb), sa.length() + _k == sb.length()).then(bshape_req(ones.append(sa), sb))
    )
    RULES.append(
        rule(bshape_req(sa, sb), sb.length() + _k == sa.length()).then(bshape_req(sa, ones.append(sb)))
    )
    RULES.append(
        rule(bshape_req(sa, sb), sa.length() + _k == sb.length(), bshape(ones.append(sa), sb) == sc).then(
            set_(bshape(sa, sb)).to(sc)
        )
    )
    RULES.append(
        rule(bshape_req(sa, sb), sb.length() + _k == sa.length(), bshape(sa, ones.append(sb)) == sc).then(
            set_(bshape(sa, sb)).to(sc)
        )
    )
for _op in (L.add, L.sub, L.mul, L.div, L.pow_):
    RULES.append(rule(eq(t).to(_op(a, b)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
    RULES.append(rule(eq(t).to(_op(a, b)), L.shape(a) == sa, L.shape(b) == sb).then(bshape_req(sa, sb)))
    RULES.append(
        rule(eq(t).to(_op(a, b)), L.shape(a) == sa, L.shape(b) == sb, bshape(sa, sb) == sc).then(
            set_(L.shape(t)).to(sc)
        )
    )
RULES.append(rule(eq(t).to(L.where(a, b, c)), L.dtype(b) == dt).then(set_(L.dtype(t)).to(dt)))
RULES.append(rule(eq(t).to(L.where(a, b, c)), L.shape(b) == sb, L.shape(c) == sc).then(bshape_req(sb, sc)))
RULES.append(
    rule(
        eq(t).to(L.where(a, b, c)), L.shape(a) == sa, L.shape(b) == sb, L.shape(c) == sc, bshape(sb, sc) == sd
    ).then(bshape_req(sa, sd))
)
RULES.append(
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
RULES.append(rule(eq(t).to(L.matmul(a, b)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
# Batched: the batch dims (all but the last two) broadcast; then [M, N].
_batched = (
    eq(t).to(L.matmul(a, b)),
    L.shape(a) == sa,
    L.shape(b) == sb,
    sa.length() >= i64(2),
    sb.length() >= i64(2),
)
RULES.append(rule(*_batched).then(bshape_req(sa.pop().pop(), sb.pop().pop())))
RULES.append(
    rule(*_batched, bshape(sa.pop().pop(), sb.pop().pop()) == sc).then(
        set_(L.shape(t)).to(sc.push(sa[sa.length() - 2]).push(sb[sb.length() - 1]))
    )
)
# Attention: q's [batch, heads, seq] and v's head size (the fusion rule requires equal batch dims).
_attention = L.fused_attention(a, b, c, d, fa, ia)
RULES.append(rule(eq(t).to(_attention), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
RULES.append(
    rule(eq(t).to(_attention), L.shape(a) == sa, L.shape(c) == sc, sa.length() == i64(4), sc.length() == i64(4)).then(
        set_(L.shape(t)).to(sa.pop().push(sc[3]))
    )
)
_attention_3d = L.fused_attention_3d(a, b, c, d, fa, ib, ia)  # [B, T, H * D] with v's [B, S, H * Dv]
RULES.append(rule(eq(t).to(_attention_3d), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
RULES.append(
    rule(eq(t).to(_attention_3d), L.shape(a) == sa, L.shape(c) == sc, sa.length() == i64(3), sc.length() == i64(3)).then(
        set_(L.shape(t)).to(sa.pop().push(sc[2]))
    )
)
# Vector operands: [K] x [..., K, N] drops M; [..., M, K] x [K] drops N.
RULES.append(
    rule(
        eq(t).to(L.matmul(a, b)),
        L.shape(a) == sa,
        L.shape(b) == sb,
        sa.length() == i64(1),
        sb.length() >= i64(2),
    ).then(set_(L.shape(t)).to(sb.remove(sb.length() - 2)))
)
RULES.append(
    rule(
        eq(t).to(L.matmul(a, b)),
        L.shape(a) == sa,
        L.shape(b) == sb,
        sa.length() >= i64(1),
        sb.length() == i64(1),
    ).then(set_(L.shape(t)).to(sa.pop()))
)
for _ta in (0, 1):
    for _tb in (0, 1):
        RULES.append(
            rule(
                eq(t).to(L.gemm(a, b, c, fa, fb, i64(_ta), i64(_tb))),
                L.shape(a) == sa,
                L.shape(b) == sb,
                sa.length() == i64(2),
                sb.length() == i64(2),
            ).then(set_(L.shape(t)).to(Vec(sa[_ta], sb[1 - _tb])))
        )
RULES.append(rule(eq(t).to(L.gemm(a, b, c, fa, fb, ia, ib)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))


# ---------------------------------------------------------------- conv and pooling
def _window(size: i64, k: i64, stride: i64, dil: i64, pad_total: i64) -> i64:
    return (size + pad_total - dil * (k - 1) - 1) / stride + 1


def _window_ceil(size: i64, k: i64, stride: i64, dil: i64, pad_begin: i64, pad_total: i64) -> i64:
    """ceil_mode=1 windows; a last window that would start in the end padding is dropped."""
    out = (size + pad_total - dil * (k - 1) - 1 + stride - 1) / stride + 1
    return out - int_ge((out - 1) * stride, size + pad_begin)


def _computable(size: i64, k: i64, stride: i64, dil: i64, pad_total: i64) -> FactLike:
    """A window size is known, or symbolic under a size-preserving geometry (stride 1, padding
    equal to the dilated kernel's extent minus one), where the window arithmetic returns the
    symbol itself. Any other arithmetic on a symbol's id would name another symbol (or a size),
    so such outputs keep no shape."""
    same = is_one(stride) * is_zero(pad_total - dil * (k - 1))
    return int_ge(size, i64(0)) + same >= i64(1)


for _n in (1, 2, 3):
    _conv_ok = [_computable(sa[2 + i], sb[2 + i], va[i], vc[i], vb[i] + vb[_n + i]) for i in range(_n)]
    _pool_ok = [_computable(sa[2 + i], va[i], vb[i], vd[i], vc[i] + vc[_n + i]) for i in range(_n)]
    _avg_ok = [_computable(sa[2 + i], va[i], vb[i], i64(1), vc[i] + vc[_n + i]) for i in range(_n)]
    # ConvTranspose keeps a symbolic size with stride 1, no output padding and padding equal to
    # the dilated kernel's extent minus one (the same window arithmetic, run backwards).
    _deconv_ok = [
        _computable(sa[2 + i], sb[2 + i], va[i] + vd[i], vc[i], vb[i] + vb[_n + i]) for i in range(_n)
    ]
    spatial = [
        _window(sa[2 + i], sb[2 + i], va[i], vc[i], vb[i] + vb[_n + i]) for i in range(_n)
    ]  # va strides, vb pads, vc dilations
    RULES.append(
        rule(
            eq(t).to(L.conv(a, b, c, va, vb, vc, ia)),
            L.shape(a) == sa,
            L.shape(b) == sb,
            sa.length() == i64(_n + 2),
            sb.length() == i64(_n + 2),
            *_conv_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sb[0]] + spatial)))
    )
    pool_spatial = [_window(sa[2 + i], va[i], vb[i], vd[i], vc[i] + vc[_n + i]) for i in range(_n)]
    RULES.append(
        rule(
            eq(t).to(L.max_pool(a, va, vb, vc, vd, i64(0))),
            L.shape(a) == sa,
            sa.length() == i64(_n + 2),
            va.length() == i64(_n),
            *_pool_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sa[1]] + pool_spatial)))
    )
    pool_ceil = [_window_ceil(sa[2 + i], va[i], vb[i], vd[i], vc[i], vc[i] + vc[_n + i]) for i in range(_n)]
    RULES.append(
        rule(
            eq(t).to(L.max_pool(a, va, vb, vc, vd, i64(1))),
            L.shape(a) == sa,
            sa.length() == i64(_n + 2),
            va.length() == i64(_n),
            *_pool_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sa[1]] + pool_ceil)))
    )
    avg_ceil = [_window_ceil(sa[2 + i], va[i], vb[i], i64(1), vc[i], vc[i] + vc[_n + i]) for i in range(_n)]
    RULES.append(
        rule(
            eq(t).to(L.average_pool(a, va, vb, vc, i64(1), ib)),
            L.shape(a) == sa,
            sa.length() == i64(_n + 2),
            va.length() == i64(_n),
            *_avg_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sa[1]] + avg_ceil)))
    )
    # ConvTranspose: va strides, vb pads, vc dilations, vd output padding.
    transposed = [
        va[i] * (sa[2 + i] - 1) + vd[i] + (sb[2 + i] - 1) * vc[i] + 1 - vb[i] - vb[_n + i] for i in range(_n)
    ]
    RULES.append(
        rule(
            eq(t).to(L.conv_transpose(a, b, c, va, vb, vc, ia, vd)),
            L.shape(a) == sa,
            L.shape(b) == sb,
            sa.length() == i64(_n + 2),
            sb.length() == i64(_n + 2),
            *_deconv_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sb[1] * ia] + transposed)))
    )
    avg_spatial = [_window(sa[2 + i], va[i], vb[i], i64(1), vc[i] + vc[_n + i]) for i in range(_n)]
    RULES.append(
        rule(
            eq(t).to(L.average_pool(a, va, vb, vc, i64(0), ib)),
            L.shape(a) == sa,
            sa.length() == i64(_n + 2),
            va.length() == i64(_n),
            *_avg_ok,
        ).then(set_(L.shape(t)).to(vec_of([sa[0], sa[1]] + avg_spatial)))
    )
    RULES.append(
        rule(eq(t).to(L.global_average_pool(a)), L.shape(a) == sa, sa.length() == i64(_n + 2)).then(
            set_(L.shape(t)).to(vec_of([sa[0], sa[1]] + [i64(1)] * _n))
        )
    )
for _make in (
    lambda x: L.conv(x, b, c, va, vb, vc, ia),
    lambda x: L.conv_transpose(x, b, c, va, vb, vc, ia, vd),
    lambda x: L.max_pool(x, va, vb, vc, vd, ia),
    lambda x: L.average_pool(x, va, vb, vc, ia, ib),
    lambda x: L.global_average_pool(x),
):
    RULES.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))

# ---------------------------------------------------------------- layout
for _r in range(MAX_RANK + 1):
    RULES.append(
        rule(
            eq(t).to(L.transpose(a, va)), L.shape(a) == sa, sa.length() == i64(_r), va.length() == i64(_r)
        ).then(set_(L.shape(t)).to(vec_of([sa[va[i]] for i in range(_r)])))
    )
    # Flatten of known dims.
    for _axis in range(_r + 1):
        outer = i64(1)
        for i in range(_axis):
            outer = outer * sa[i]
        inner = i64(1)
        for i in range(_axis, _r):
            inner = inner * sa[i]
        RULES.append(
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
    lambda x: L.reduce_max(x, b, ia, ib),
):
    RULES.append(rule(eq(t).to(_make(a)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))
RULES.append(
    rule(eq(t).to(L.concat(L.TList.cons(a, xs), ia)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt))
)
RULES.append(rule(eq(t).to(L.shape_of(a, ia, ib))).then(set_(L.dtype(t)).to(i64(7))))
RULES.append(rule(eq(t).to(L.constant_of_shape(a, fa, ia))).then(set_(L.dtype(t)).to(ia)))
for _r in range(MAX_RANK + 1):
    RULES.append(
        rule(eq(t).to(L.shape_of(a, i64(0), i64(2**63 - 1))), L.shape(a) == sa, sa.length() == i64(_r)).then(
            set_(L.shape(t)).to(Vec(i64(_r)))
        )
    )
# Concat: the axis dims of all inputs summed along the list (asked for by each concat).


RULES.append(rule(eq(t).to(L.concat(xs, ia))).then(axis_sum_req(xs, ia)))
RULES.append(rule(axis_sum_req(xs, ia), eq(xs).to(L.TList.cons(a, ys))).then(axis_sum_req(ys, ia)))
RULES.append(rule(axis_sum_req(xs, ia), eq(xs).to(L.TList.nil())).then(set_(axis_sum(xs, ia)).to(i64(0))))
# The axis may still be negative (its rank was unknown at import); a symbolic axis dim gives no
# sum (adding symbol ids would name another symbol, or a known size: -1 + 1 == 0).
_concat_axis = norm_axis(ia, sa.length())
_concat_ok = (_concat_axis >= i64(0), _concat_axis < sa.length())
RULES.append(
    rule(
        axis_sum_req(xs, ia),
        eq(xs).to(L.TList.cons(a, ys)),
        L.shape(a) == sa,
        axis_sum(ys, ia) == ib,
        *_concat_ok,
        sa[_concat_axis] >= i64(0),
    ).then(set_(axis_sum(xs, ia)).to(sa[_concat_axis] + ib))
)
RULES.append(
    rule(
        eq(t).to(L.concat(L.TList.cons(a, ys), ia)),
        L.shape(a) == sa,
        axis_sum(L.TList.cons(a, ys), ia) == ib,
        *_concat_ok,
    ).then(set_(L.shape(t)).to(sa.set(_concat_axis, ib)))
)

# Reshape: 0 copies the input dim (allowzero=0), -1 takes what is left of the element count.


for _q in range(MAX_RANK + 1):
    _count = i64(1)
    for i in range(_q):
        _count = _count * sa[i]
    RULES.append(
        rule(numel_req(sa), sa.length() == i64(_q), *[sa[i] >= i64(0) for i in range(_q)]).then(
            set_(numel(sa)).to(_count)
        )
    )
_ONES = Vec(*[i64(1)] * MAX_RANK)
for _r in range(MAX_RANK + 1):
    padded = sa.append(_ONES)
    zeros_copied = [va[i] + is_zero(va[i]) * (padded[i] - va[i]) for i in range(_r)]
    target = L.reshape(a, L.Tensor.ints(va, i64(1)), i64(0))
    RULES.append(
        rule(
            eq(t).to(target), L.shape(a) == sa, va.length() == i64(_r), *[va[i] >= i64(0) for i in range(_r)]
        ).then(set_(L.shape(t)).to(vec_of(zeros_copied)))
    )
    if _r == 0:
        continue
    RULES.append(rule(eq(t).to(target), L.shape(a) == sa, va.length() == i64(_r)).then(numel_req(sa)))
    known = i64(1)
    for i in range(_r):
        known = known * (zeros_copied[i] + is_zero(va[i] + 1) * 2)  # -1 counts as 1
    RULES.append(
        rule(
            eq(t).to(target),
            L.shape(a) == sa,
            va.length() == i64(_r),
            numel(sa) == ib,
            *[va[i] >= i64(-1) for i in range(_r)],
        ).then(
            set_(L.shape(t)).to(
                vec_of([zeros_copied[i] + is_zero(va[i] + 1) * (ib / known + 1) for i in range(_r)])
            )
        )
    )
for _r in range(MAX_RANK + 1):  # allowzero=1: the target is taken literally
    RULES.append(
        rule(
            eq(t).to(L.reshape(a, L.Tensor.ints(va, i64(1)), i64(1))),
            va.length() == i64(_r),
            *[va[i] >= i64(0) for i in range(_r)],
        ).then(set_(L.shape(t)).to(va))
    )

# Unsqueeze / Squeeze with constant axes (up to three, in ascending order once normalized).
for _n in (1, 2, 3):
    for _q in range(MAX_RANK + 1 - _n):
        out_rank = i64(_q + _n)
        axes = [norm_axis(va[k], out_rank) for k in range(_n)]
        dims = unsqueezed_dims([sa[i] for i in range(_q)], axes)
        RULES.append(
            rule(
                eq(t).to(L.unsqueeze(a, L.Tensor.ints(va, i64(1)))),
                L.shape(a) == sa,
                sa.length() == i64(_q),
                va.length() == i64(_n),
                *[axes[k] < axes[k + 1] for k in range(_n - 1)],
            ).then(set_(L.shape(t)).to(vec_of(dims)))
        )
    rank = sa.length()
    axes = [norm_axis(va[k], rank) for k in range(_n)]
    squeezed = sa
    for k in range(_n):
        squeezed = squeezed.remove(axes[k] - k)
    in_range = [f for k in range(_n) for f in (axes[k] >= i64(0), axes[k] < rank)]  # else egglog panics
    RULES.append(
        rule(
            eq(t).to(L.squeeze(a, L.Tensor.ints(va, i64(1)))),
            L.shape(a) == sa,
            va.length() == i64(_n),
            *in_range,
            *[axes[k] < axes[k + 1] for k in range(_n - 1)],
        ).then(set_(L.shape(t)).to(squeezed))
    )
    # Reductions over constant axes: kept as 1, or removed.
    for _reduce in (L.reduce_mean, L.reduce_sum, L.reduce_max):
        kept = sa
        for k in range(_n):
            kept = kept.set(axes[k], i64(1))
        RULES.append(
            rule(
                eq(t).to(_reduce(a, L.Tensor.ints(va, i64(1)), i64(1), ib)),
                L.shape(a) == sa,
                va.length() == i64(_n),
                *in_range,
            ).then(set_(L.shape(t)).to(kept))
        )
        RULES.append(
            rule(
                eq(t).to(_reduce(a, L.Tensor.ints(va, i64(1)), i64(0), ib)),
                L.shape(a) == sa,
                va.length() == i64(_n),
                *in_range,
                *[axes[k] < axes[k + 1] for k in range(_n - 1)],
            ).then(set_(L.shape(t)).to(squeezed))
        )
for _reduce in (L.reduce_mean, L.reduce_sum, L.reduce_max):
    # No axes: reduce everything (or nothing, with noop_with_empty_axes).
    RULES.append(
        rule(eq(t).to(_reduce(a, L.Tensor.none(), i64(0), i64(0))), L.shape(a) == sa).then(
            set_(L.shape(t)).to(Vec[i64].empty())
        )
    )
    RULES.append(
        rule(eq(t).to(_reduce(a, L.Tensor.none(), ia, i64(1))), L.shape(a) == sa).then(
            set_(L.shape(t)).to(sa)
        )
    )
    for _q in range(MAX_RANK + 1):
        RULES.append(
            rule(
                eq(t).to(_reduce(a, L.Tensor.none(), i64(1), i64(0))),
                L.shape(a) == sa,
                sa.length() == i64(_q),
            ).then(set_(L.shape(t)).to(vec_of([i64(1)] * _q)))
        )

# Gather by a scalar index drops the axis; by a vector index resizes it; at axis 0 the
# indices' dims replace the first dim (embeddings). Other cases keep their imported shape.
RULES.append(
    rule(eq(t).to(L.gather(a, b, ia)), L.shape(a) == sa, L.shape(b) == sb, sb.length() == i64(0)).then(
        set_(L.shape(t)).to(sa.remove(norm_axis(ia, sa.length())))
    )
)
RULES.append(
    rule(eq(t).to(L.gather(a, b, ia)), L.shape(a) == sa, L.shape(b) == sb, sb.length() == i64(1)).then(
        set_(L.shape(t)).to(sa.set(norm_axis(ia, sa.length()), sb[0]))
    )
)
RULES.append(
    rule(eq(t).to(L.gather(a, b, i64(0))), L.shape(a) == sa, L.shape(b) == sb, sb.length() >= i64(2)).then(
        set_(L.shape(t)).to(sb.append(sa.remove(0)))
    )
)
RULES.append(rule(eq(t).to(L.gather(a, b, ia)), L.dtype(a) == dt).then(set_(L.dtype(t)).to(dt)))

# Expand broadcasts the input with the target shape.
RULES.append(
    rule(eq(t).to(L.expand(a, L.Tensor.ints(va, i64(1)))), L.shape(a) == sa).then(bshape_req(sa, va))
)
RULES.append(
    rule(eq(t).to(L.expand(a, L.Tensor.ints(va, i64(1)))), L.shape(a) == sa, bshape(sa, va) == sb).then(
        set_(L.shape(t)).to(sb)
    )
)

# Split: given sizes, or an even split.
RULES.append(
    rule(eq(t).to(L.split(a, L.Tensor.ints(va, i64(1)), ia, ib, ic)), L.shape(a) == sa).then(
        set_(L.shape(t)).to(sa.set(norm_axis(ia, sa.length()), va[ic]))
    )
)
RULES.append(
    rule(
        eq(t).to(L.split(a, L.Tensor.none(), ia, ib, ic)),
        L.shape(a) == sa,
        ib > i64(0),
        sa[norm_axis(ia, sa.length())] >= i64(0),
        sa[norm_axis(ia, sa.length())] % ib == i64(0),
    ).then(set_(L.shape(t)).to(sa.set(norm_axis(ia, sa.length()), sa[norm_axis(ia, sa.length())] / ib)))
)

# Pad with constant pads over all axes.
for _q in range(1, MAX_RANK + 1):
    RULES.append(
        rule(
            eq(t).to(L.pad(a, L.Tensor.ints(va, i64(1)), c, L.Tensor.none(), str_a)),
            L.shape(a) == sa,
            sa.length() == i64(_q),
            va.length() == i64(2 * _q),
            # a symbolic dim only unpadded (a padded one is another, unnamed size)
            *[
                is_negative(sa[i]) * (va[i].max(i64(0) - va[i]) + va[_q + i].max(i64(0) - va[_q + i]))
                == i64(0)
                for i in range(_q)
            ],
        ).then(set_(L.shape(t)).to(vec_of([sa[i] + va[i] + va[_q + i] for i in range(_q)])))
    )

# Slice with constant starts/ends (and axes, steps > 0) on up to three axes.
for _n in (1, 2, 3):
    for _with_axes in (False, True):
        for _with_steps in (False, True):
            axes_t = L.Tensor.ints(vc, i64(1)) if _with_axes else L.Tensor.none()
            steps_t = L.Tensor.ints(vd, i64(1)) if _with_steps else L.Tensor.none()
            sliced = sa
            for k in range(_n):
                axis = norm_axis(vc[k], sa.length()) if _with_axes else i64(k)
                dim = sa[axis]
                step = vd[k] if _with_steps else i64(1)
                start = clamp(norm_axis(va[k], dim), 0, dim)
                end = clamp(norm_axis(vb[k], dim), 0, dim)
                sliced = sliced.set(axis, (end - start + step - 1).max(0) / step)
            guards: list = [va.length() == i64(_n), vb.length() == i64(_n)]
            if _with_axes:
                guards.append(vc.length() == i64(_n))
            if _with_steps:
                guards += [vd.length() == i64(_n), *[vd[k] > i64(0) for k in range(_n)]]
            RULES.append(
                rule(
                    eq(t).to(
                        L.slice_(a, L.Tensor.ints(va, i64(1)), L.Tensor.ints(vb, i64(1)), axes_t, steps_t)
                    ),
                    L.shape(a) == sa,
                    *guards,
                    *[sa[norm_axis(vc[k], sa.length()) if _with_axes else k] >= i64(0) for k in range(_n)],
                ).then(set_(L.shape(t)).to(sliced))
            )

# ConstantOfShape of a constant target; Shape with start/end.
RULES.append(
    rule(eq(t).to(L.constant_of_shape(L.Tensor.ints(va, i64(1)), fa, ia))).then(set_(L.shape(t)).to(va))
)
RULES.append(
    rule(eq(t).to(L.shape_of(a, ia, ib)), L.shape(a) == sa).then(
        set_(L.shape(t)).to(
            Vec(
                (
                    clamp(norm_axis(ib.min(i64(2**62)), sa.length()), 0, sa.length())
                    - clamp(norm_axis(ia, sa.length()), 0, sa.length())
                ).max(0)
            )
        )
    )
)


# ---------------------------------------------------------------- constness
RULES.append(rule(eq(t).to(L.Tensor.weight(str_a))).then(L.is_const(t)))
RULES.append(rule(eq(t).to(L.Tensor.splat(fa, va, ia))).then(L.is_const(t)))
RULES.append(rule(eq(t).to(L.Tensor.ints(va, ia))).then(L.is_const(t)))
RULES.append(rule(eq(t).to(L.Tensor.none())).then(L.is_const(t)))
_small = (fa <= f64(L.SMALL_MAGNITUDE), fa >= f64(-L.SMALL_MAGNITUDE))
RULES.append(rule(eq(t).to(L.Tensor.splat(fa, va, ia)), *_small).then(L.small_const(t)))
RULES.append(rule(eq(t).to(L.neg(a)), L.small_const(a)).then(L.small_const(t)))

_ATTR_SORTS: dict[str, type] = {"int": i64, "float": f64, "string": String, "ints": Vec[i64]}
for _spec in OPS.values():
    # An op whose tensor inputs all depend on weights alone depends on weights alone.
    if _spec.variadic:
        _items = var(f"items_{_spec.name}", L.TList)
        _args: list = [_items]
        _facts: list = [L.list_const(_items)]
    else:
        _args = list(vars_(" ".join(f"in{k}_{_spec.name}" for k in range(len(_spec.inputs))), L.Tensor))
        _facts = [L.is_const(v) for v in _args]
    for _attr in _spec.attrs:
        _args.append(var(f"{_attr.name}_{_spec.name}", _ATTR_SORTS[_attr.kind]))
    if _spec.indexed_outputs:
        _args.append(var(f"index_{_spec.name}", i64))
    RULES.append(rule(eq(t).to(_spec.ctor(*_args)), *_facts).then(L.is_const(t)))
RULES.append(rule(eq(xs).to(L.TList.nil())).then(L.list_const(xs)))
RULES.append(rule(eq(xs).to(L.TList.cons(a, ys)), L.is_const(a), L.list_const(ys)).then(L.list_const(xs)))

# ---------------------------------------------------------------- dependence on graph inputs
RULES.append(rule(eq(t).to(L.Tensor.input(str_a))).then(L.varies(t)))
RULES.append(rule(eq(t).to(L.opaque(ia, xs, ib))).then(L.varies(t)))
for _spec in OPS.values():
    # An op with an input that depends on a graph input depends on it.
    _args = (
        [var(f"items_{_spec.name}", L.TList)]
        if _spec.variadic
        else [var(f"in{k}_{_spec.name}", L.Tensor) for k in range(len(_spec.inputs))]
    )
    _args += [var(f"{_attr.name}_{_spec.name}", _ATTR_SORTS[_attr.kind]) for _attr in _spec.attrs]
    if _spec.indexed_outputs:
        _args.append(var(f"index_{_spec.name}", i64))
    _n_in = 1 if _spec.variadic else len(_spec.inputs)
    for _k in range(_n_in):
        _fact = L.list_varies(_args[_k]) if _spec.variadic else L.varies(_args[_k])
        RULES.append(rule(eq(t).to(_spec.ctor(*_args)), _fact).then(L.varies(t)))
RULES.append(rule(eq(xs).to(L.TList.cons(a, ys)), L.varies(a)).then(L.list_varies(xs)))
RULES.append(rule(eq(xs).to(L.TList.cons(a, ys)), L.list_varies(ys)).then(L.list_varies(xs)))
