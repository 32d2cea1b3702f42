"""Linear-op rules (TASO/TENSAT class): MatMul associativity and transposes of products, and
constant scales, shifts and negations folded into MatMul/Gemm/Conv weights.

Folding turns an elementwise op on activations into arithmetic on weights, which is computed
once at export (LayerNorm's gamma/beta into the next projection, a Mul after a Gemm, a
BatchNorm written out before a Linear). Rules that reassociate floating-point sums or products
say so in their comment (results differ in the last bits, as TASO's do); no rule here is
guarded by dtype because each is exact up to that rounding in every float type.
"""

from __future__ import annotations

from egglog import String, Vec, f64, i64, ne, vars_

from ...egraph import lang as L
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("linear")
FAMILIES = (FAMILY,)

x, y, z, w, v, b, c = vars_("x y z w v b c", L.Tensor)
scale, bias, mean, var = vars_("scale bias mean var", L.Tensor)
sx, sy, sz, sw, sv, so, strides, pads, dil = vars_("sx sy sz sw sv so strides pads dil", Vec[i64])
ta, tb, group, dt = vars_("ta tb group dt", i64)
alpha, beta, eps = vars_("alpha beta eps", f64)


def _ints(*values: i64 | int) -> L.Tensor:
    return L.Tensor.ints(Vec(*(i64(d) if isinstance(d, int) else d for d in values)), i64(1))


def _swap_last(rank: int) -> Vec[i64]:
    """The permutation that swaps the last two axes of a ``rank``-D tensor."""
    return Vec(*[i64(i) for i in range(rank - 2)], i64(rank - 1), i64(rank - 2))


_matrix_w = (L.is_const(w), L.shape(w) == sw, sw.length() == i64(2))
"""A constant weight matrix ``w`` of shape ``sw = [K, N]``."""

# ---------------------------------------------------------------- transposes of products
for _rx, _rw in ((2, 2), (3, 3), (4, 4), (3, 2), (4, 2)):
    # (x @ w)^T => w^T @ x^T over the last two axes (TASO): the transposes fold into constant
    # operands or cancel against neighbouring ones (attention's K^T).
    FAMILY.rewrite(
        "transpose-matmul",
        L.transpose(L.matmul(x, w), _swap_last(max(_rx, _rw))),
        L.matmul(L.transpose(w, _swap_last(_rw)), L.transpose(x, _swap_last(_rx))),
        L.shape(x) == sx,
        sx.length() == i64(_rx),
        L.shape(w) == sw,
        sw.length() == i64(_rw),
        variant=f"{_rx}-{_rw}",
    )
# Gemm(a, b)^T => Gemm(b, a) with the transpose flags swapped and flipped: the Transpose is free.
FAMILY.rewrite(
    "gemm-transpose-out",
    L.transpose(L.gemm(x, y, L.Tensor.none(), alpha, beta, ta, tb), Vec(i64(1), i64(0))),
    L.gemm(y, x, L.Tensor.none(), alpha, beta, i64(1) - tb, i64(1) - ta),
)

# ---------------------------------------------------------------- associativity
_matrices = (
    L.shape(x) == sx,
    sx.length() == i64(2),
    L.shape(y) == sy,
    sy.length() == i64(2),
    L.shape(z) == sz,
    sz.length() == i64(2),
)
# (x @ y) @ z <=> x @ (y @ z) for matrices (TASO): the cheaper order depends on the shapes, so
# both are offered to the extractor. Reassociates.
FAMILY.rewrite(
    "matmul-assoc",
    L.matmul(L.matmul(x, y), z),
    L.matmul(x, L.matmul(y, z)),
    *_matrices,
    variant="to-right",
)
FAMILY.rewrite(
    "matmul-assoc",
    L.matmul(x, L.matmul(y, z)),
    L.matmul(L.matmul(x, y), z),
    *_matrices,
    variant="to-left",
)

# ---------------------------------------------------------------- scales and shifts into MatMul weights
_k_col = _ints(sw[0], 1)
for _variant, _v_shape, _w_scaled in (
    ("vector", Vec(sw[0]), L.mul(w, L.reshape(v, _k_col, i64(0)))),
    ("row", Vec(i64(1), sw[0]), L.mul(w, L.reshape(v, _k_col, i64(0)))),
    ("scalar", Vec[i64].empty(), L.mul(w, v)),
):
    # (x * v) @ W => x @ (v[:, None] * W) for a constant per-input-feature scale v (LayerNorm's
    # gamma before a projection): the Mul folds into the weight. Reassociates.
    FAMILY.rewrite(
        "matmul-input-scale-fold",
        L.matmul(L.mul(x, v), w),
        L.matmul(x, _w_scaled),
        *_matrix_w,
        L.is_const(v),
        L.shape(v) == _v_shape,
        L.shape(x) == sx,
        L.shape(L.mul(x, v)) == sx,
        ne(L.mul(x, v)).to(x),
        variant=_variant,
    )
for _variant, _v_shape, _w_scaled in (
    ("vector", Vec(sw[1]), L.mul(w, v)),
    ("row", Vec(i64(1), sw[1]), L.mul(w, L.reshape(v, _ints(sw[1]), i64(0)))),
    ("scalar", Vec[i64].empty(), L.mul(w, v)),
):
    # (x @ W) * v => x @ (W * v) for a constant per-output-feature scale v. Reassociates.
    FAMILY.rewrite(
        "matmul-output-scale-fold",
        L.mul(L.matmul(x, w), v),
        L.matmul(x, _w_scaled),
        *_matrix_w,
        L.is_const(v),
        L.shape(v) == _v_shape,
        L.shape(t) == so,
        L.shape(L.matmul(x, w)) == so,
        ne(t).to(L.matmul(x, w)),
        variant=_variant,
    )
for _variant, _v_shape in (("vector", Vec(sw[0])), ("row", Vec(i64(1), sw[0]))):
    # (x + v) @ W => x @ W + v @ W for a constant shift v (LayerNorm's beta before a projection):
    # v @ W folds, and the sum becomes a Gemm bias. Reassociates.
    FAMILY.rewrite(
        "matmul-input-shift-fold",
        L.matmul(L.add(x, v), w),
        L.add(L.matmul(x, w), L.matmul(L.reshape(v, _ints(sw[0]), i64(0)), w)),
        *_matrix_w,
        L.is_const(v),
        L.shape(v) == _v_shape,
        L.shape(x) == sx,
        L.shape(L.add(x, v)) == sx,
        ne(L.add(x, v)).to(x),
        variant=_variant,
    )

# ---------------------------------------------------------------- scales into Gemm weights and bias
for _tb, _col in ((0, _ints(so[1])), (1, _ints(so[1], 1))):
    _n = _ints(so[1])
    _gemm_scale = (
        L.is_const(w),
        L.is_const(v),
        L.shape(v) == Vec(so[1]),
        L.shape(t) == so,
        so.length() == i64(2),
    )
    # Gemm(x, W, c) * v => Gemm(x, W * v, c * v) for a constant per-output-feature scale v (ONNX
    # keeps alpha/beta in float32, so the scale goes into the tensors, not into alpha). Reassociates.
    FAMILY.rewrite(
        "gemm-mul-fold",
        L.mul(L.gemm(x, w, c, alpha, beta, ta, i64(_tb)), v),
        L.gemm(
            x,
            L.mul(w, L.reshape(v, _col, i64(0))),
            L.mul(c, L.reshape(v, _n, i64(0))),
            alpha,
            beta,
            ta,
            i64(_tb),
        ),
        *_gemm_scale,
        ne(t).to(L.gemm(x, w, c, alpha, beta, ta, i64(_tb))),
        L.is_const(c),
        L.shape(c) == sz,
        variant=f"transb{_tb}",
    )
    FAMILY.rewrite(
        "gemm-mul-fold",
        L.mul(L.gemm(x, w, L.Tensor.none(), alpha, beta, ta, i64(_tb)), v),
        L.gemm(x, L.mul(w, L.reshape(v, _col, i64(0))), L.Tensor.none(), alpha, beta, ta, i64(_tb)),
        *_gemm_scale,
        ne(t).to(L.gemm(x, w, L.Tensor.none(), alpha, beta, ta, i64(_tb))),
        variant=f"transb{_tb}-noc",
    )

# ---------------------------------------------------------------- scales and shifts into Gemm inputs
# Gemm(x * v, W, c) => Gemm(x, v[:, None] * W, c) (W^T scaled per column under transB): a Linear
# layer exported as Gemm after LayerNorm's gamma. Reassociates.
for _tb, _k, _col in ((0, sw[0], _ints(sw[0], 1)), (1, sw[1], _ints(sw[1]))):
    for _variant, _v_shape in (("vector", Vec(_k)), ("row", Vec(i64(1), _k))):
        FAMILY.rewrite(
            "gemm-input-scale-fold",
            L.gemm(L.mul(x, v), w, c, alpha, beta, i64(0), i64(_tb)),
            L.gemm(x, L.mul(w, L.reshape(v, _col, i64(0))), c, alpha, beta, i64(0), i64(_tb)),
            *_matrix_w,
            L.is_const(v),
            L.shape(v) == _v_shape,
            L.shape(x) == sx,
            L.shape(L.mul(x, v)) == sx,
            ne(L.mul(x, v)).to(x),
            variant=f"transb{_tb}-{_variant}",
        )
# Gemm(x + v, W, c) => Gemm(x, W, c + v @ W) for a constant shift v (W^T under transB): LayerNorm's
# beta folds into the bias. Only for alpha == beta == 1, the exported default. Reassociates.
for _tb, _k, _w_kn in ((0, sw[0], w), (1, sw[1], L.transpose(w, Vec(i64(1), i64(0))))):
    _shift = L.matmul(L.reshape(v, _ints(_k), i64(0)), _w_kn)
    for _variant, _c, _c_new, _c_guards in (
        ("bias", c, L.add(c, _shift), (L.is_const(c), L.shape(c) == sz, sz.length() <= i64(1))),
        ("nobias", L.Tensor.none(), _shift, ()),
    ):
        FAMILY.rewrite(
            "gemm-input-shift-fold",
            L.gemm(L.add(x, v), w, _c, f64(1.0), f64(1.0), i64(0), i64(_tb)),
            L.gemm(x, w, _c_new, f64(1.0), f64(1.0), i64(0), i64(_tb)),
            *_matrix_w,
            *_c_guards,
            L.is_const(v),
            L.shape(v) == Vec(_k),
            L.shape(x) == sx,
            L.shape(L.add(x, v)) == sx,
            ne(L.add(x, v)).to(x),
            variant=f"transb{_tb}-{_variant}",
        )

# ---------------------------------------------------------------- scales into Conv weights
for _n in (1, 2):
    _per_in = _ints(1, sw[1], *[1] * _n)
    for _variant, _v_shape in (
        ("1c11", Vec(i64(1), sw[1], *[i64(1)] * _n)),
        ("c11", Vec(sw[1], *[i64(1)] * _n)),
    ):
        # conv(x * v, W) => conv(x, W * v[None, :, None, None]) for a constant per-input-channel
        # scale v (group 1; zero padding stays zero). Reassociates.
        FAMILY.rewrite(
            "conv-input-scale-fold",
            L.conv(L.mul(x, v), w, b, strides, pads, dil, i64(1)),
            L.conv(x, L.mul(w, L.reshape(v, _per_in, i64(0))), b, strides, pads, dil, i64(1)),
            L.is_const(w),
            L.is_const(v),
            L.shape(w) == sw,
            sw.length() == i64(_n + 2),
            L.shape(v) == _v_shape,
            L.shape(x) == sx,
            L.shape(L.mul(x, v)) == sx,
            ne(L.mul(x, v)).to(x),
            variant=f"{_variant}-{_n}",
        )
FAMILY.rewrite(
    "conv-input-scale-fold",
    L.conv(L.mul(x, v), w, b, strides, pads, dil, group),
    L.conv(x, L.mul(w, v), b, strides, pads, dil, group),
    L.is_const(w),
    L.is_const(v),
    L.shape(v) == Vec[i64].empty(),
    variant="scalar",
)

# conv(x + v, W, b) => conv(x, W, b + sum(W * v[None, :, None, None])) for a constant per-input-
# channel shift v and no padding (padding would add the shift's zeros at the border): the Add folds
# into the bias (group 1, 2-D). Reassociates.
_unpadded = Vec(i64(0), i64(0), i64(0), i64(0))
_shift_sum = L.reduce_sum(
    L.mul(w, L.reshape(v, _ints(1, sw[1], 1, 1), i64(0))), _ints(1, 2, 3), i64(0), i64(0)
)
_conv_shift = (
    L.is_const(w),
    L.is_const(v),
    L.shape(w) == sw,
    sw.length() == i64(4),
    L.shape(v) == Vec(i64(1), sw[1], i64(1), i64(1)),
    L.shape(x) == sx,
    L.shape(L.add(x, v)) == sx,
    ne(L.add(x, v)).to(x),
)
FAMILY.rewrite(
    "conv-input-shift-fold",
    L.conv(L.add(x, v), w, b, strides, _unpadded, dil, i64(1)),
    L.conv(x, w, L.add(b, _shift_sum), strides, _unpadded, dil, i64(1)),
    *_conv_shift,
    L.is_const(b),
    L.shape(b) == Vec(sw[0]),
    variant="bias",
)
FAMILY.rewrite(
    "conv-input-shift-fold",
    L.conv(L.add(x, v), w, L.Tensor.none(), strides, _unpadded, dil, i64(1)),
    L.conv(x, w, _shift_sum, strides, _unpadded, dil, i64(1)),
    *_conv_shift,
    variant="nobias",
)

# ---------------------------------------------------------------- negation into weights
# -x @ W => x @ (-W), conv(-x, W) => conv(x, -W), (-x) * c => x * (-c) for an initializer W or a
# uniform constant c: the negation folds (exact). Only leaf constants: with x == -(-x) in the
# e-graph, a negated weight would otherwise be negated again on every iteration.
(wname,) = vars_("wname", String)
(cval,) = vars_("cval", f64)
_leaf = L.Tensor.weight(wname)
FAMILY.rewrite("neg-into-weights", L.matmul(L.neg(x), _leaf), L.matmul(x, L.neg(_leaf)), variant="matmul")
FAMILY.rewrite(
    "neg-into-weights",
    L.conv(L.neg(x), _leaf, b, strides, pads, dil, group),
    L.conv(x, L.neg(_leaf), b, strides, pads, dil, group),
    variant="conv",
)
FAMILY.rewrite("neg-into-weights", L.mul(L.neg(x), _leaf), L.mul(x, L.neg(_leaf)), L.varies(x), variant="mul")
_splat = L.Tensor.splat(cval, sv, dt)
FAMILY.rewrite("neg-into-weights", L.mul(L.neg(x), _splat), L.mul(x, L.neg(_splat)), L.varies(x), variant="mul-splat")

# ---------------------------------------------------------------- BatchNormalization as an affine map
for _r in (2,):
    _factor = L.div(scale, L.sqrt(L.add(var, L.Tensor.splat(eps, Vec[i64].empty(), dt))))
    _per_channel = _ints(sx[1], *[1] * (_r - 2))
    # BN(x) => x * f + (b - mean * f), f = scale / sqrt(var + eps), for constant statistics on a
    # [N, C] input (BatchNorm1d next to a Linear): the Mul and Add then fold into the MatMul/Gemm.
    # Not for conv feature maps: after a Conv, conv-batchnorm-fold does it in one step, and before
    # one (BN-ReLU-Conv) nothing folds, so the extra terms would only grow the e-graph. Reassociates.
    FAMILY.rewrite(
        "batchnorm-to-affine",
        L.batch_norm(x, scale, bias, mean, var, eps),
        L.add(
            L.mul(x, L.reshape(_factor, _per_channel, i64(0))),
            L.reshape(L.sub(bias, L.mul(mean, _factor)), _per_channel, i64(0)),
        ),
        L.shape(x) == sx,
        sx.length() == i64(_r),
        L.dtype(var) == dt,
        L.is_const(scale),
        L.is_const(bias),
        L.is_const(mean),
        L.is_const(var),
        variant=str(_r),
    )

RULE_NAMES = list(FAMILY.names)
"""This family's rule names, in declaration order."""
