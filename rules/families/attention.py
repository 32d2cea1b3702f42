"""Attention rules: the scaled dot-product attention that torch's exporters write as a chain becomes
one fused node (opset 23's Attention).

Attention: softmax(q @ k^T * scale (+ mask)) @ v over 4-D [batch, heads, seq, head] tensors, the
scale written as q * a and k^T * b (torch's SDPA decomposition, scale a * b), as a Div or Mul of the
scores, or absent; the softmax over the last axis; batch and head dims equal (no broadcasting
matmul). Grouped-query exports repeat k and v to q's heads before the matmul: the fused node
takes the repeated k and v. A float mask is taken only in the form whose fully masked rows the
exporters zero (``Where(IsNaN(p), 0, p)``): that is what Attention does for a row whose every score
is -inf (its errata, measured on onnxruntime 1.32), while a plain softmax makes such a row NaN; or,
unguarded, a mask of finite constants (T5's position bias table where kept), under which no row is
fully masked.
The mask must not grow the scores and must end in the keys' dim; one over the keys only
([.., 1, S]) is expanded to the scores' query dim (onnxruntime broadcasts only its leading dims). Scale folding is exact up to rounding: (q * a) @ (k * b) is (q @ k) * (a * b) in
real arithmetic, and Attention stores its scale as float32.

Rotary embedding: x * cos + rotate_half(x) * sin, rotate_half(x) being concat(-x[..., h:], x[..., :h])
of a 4-D x whose last dim is 2h and cos, sin of [1, 1, seq, head], becomes ``fused_rotary``
(exact: the fused node is defined as that chain; its export writes RotaryEmbedding where cos and
sin are constants with equal halves and onnxruntime runs it, else the chain).
"""

from __future__ import annotations

import numpy as np
from egglog import Vec, f64, i64, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ..registry import Family
from .fusion import FLOAT32_RTOL

FAMILY = Family("attention")
FAMILIES = (FAMILY,)

q, kt, v, m = vars_("q kt v m", L.Tensor)
sq, sk, svv, sv, sm, sa, sb = vars_("sq sk svv sv sm sa sb", Vec[i64])
dt, cd1, cd2 = vars_("dt cd1 cd2", i64)
ca, cb = vars_("ca cb", f64)

_s_len = sk[3]
FLOAT_TYPES = Vec(i64(1), i64(11))
"""float32 and float64: the fused nodes' exports probe onnxruntime's kernel for the type and write
the chain where it has none. Rotary chains in float16 are left alone (their tables are
float16-rounded)."""
ATTENTION_TYPES = Vec(i64(1), i64(10), i64(11))
"""float32, float16 and float64 attention: onnxruntime 1.32 runs float16 Attention on the CPU
(computing the products in float32, so the fused block rounds less than the float16 chain: its
scale is folded from float16-rounded constants, which real arithmetic keeps)."""


def _float(tensor: L.Tensor, types: Vec[i64] = ATTENTION_TYPES) -> tuple[FactLike, ...]:
    return (L.dtype(tensor) == dt, types.contains(dt))


_TRANSPOSE_LAST = Vec(i64(0), i64(1), i64(3), i64(2))


def _scalar(value: f64, dims: Vec[i64], cdt: i64) -> L.Tensor:
    return L.Tensor.splat(value, dims, cdt)


def _qkv_shapes() -> tuple[FactLike, ...]:
    """q [B, H, T, D], k^T [B, H, D, S], v [B, H, S, Dv] of one float type onnxruntime runs."""
    return (
        L.shape(q) == sq,
        sq.length() == i64(4),
        L.shape(kt) == sk,
        sk.length() == i64(4),
        sk[0] == sq[0],
        sk[1] == sq[1],
        sk[2] == sq[3],
        L.shape(v) == svv,
        svv.length() == i64(4),
        svv[0] == sq[0],
        svv[1] == sq[1],
        svv[2] == _s_len,
        *_float(q),
        L.dtype(kt) == dt,
        L.dtype(v) == dt,
    )


# ---------------------------------------------------------------- attention
# Scores as the exporters write them: (variant, scores term, scale, guards on the constants).
_qk = L.matmul(q, kt)
_scores_shape = Vec(sq[0], sq[1], sq[2], _s_len)
_qa, _kb = L.mul(q, _scalar(ca, sa, cd1)), L.mul(kt, _scalar(cb, sb, cd2))
_one = (L.shape(_qa) == sq,)  # the uniform scale keeps the operand's shape (it never broadcasts it)
_SCORES: list[tuple[str, L.Tensor, f64, tuple[FactLike, ...]]] = [
    ("sdpa", L.matmul(_qa, _kb), ca * cb, (*_one, L.shape(_kb) == sk)),
    ("q-scaled", L.matmul(_qa, kt), ca, _one),
    ("div", L.div(_qk, _scalar(ca, sa, cd1)), f64(1.0) / ca, (L.shape(L.div(_qk, _scalar(ca, sa, cd1))) == _scores_shape, ca != f64(0.0))),
    ("mul", L.mul(_qk, _scalar(ca, sa, cd1)), ca, (L.shape(L.mul(_qk, _scalar(ca, sa, cd1))) == _scores_shape,)),
    ("unscaled", _qk, f64(1.0), ()),
]
_k = L.transpose(kt, _TRANSPOSE_LAST)

_keep, _table = vars_("keep table", L.Tensor)
ca_m, cb_m = vars_("ca_m cb_m", f64)
sma, smb = vars_("sma smb", Vec[i64])
F32_LOWEST = float(np.finfo(np.float32).min)
F32_NEXT = float(np.nextafter(np.float32(F32_LOWEST), np.float32(0)))
F64_LOWEST = float(np.finfo(np.float64).min)
F16_LOWEST = float(np.finfo(np.float16).min)


def _not_lowest(c: f64) -> tuple[FactLike, ...]:
    """A mask constant onnxruntime's Attention treats as an ordinary value (in float32, float64 or
    float16)."""
    return (c != f64(F32_LOWEST), c != f64(F64_LOWEST), c != f64(F16_LOWEST))


def _is_f32_lowest(c: f64) -> tuple[FactLike, ...]:
    return (c >= f64(F32_LOWEST), c <= f64(F32_LOWEST))  # an equality the rule verifier's sampler reads


_MASK_BRANCHES: list[tuple[str, f64, f64, tuple[FactLike, ...]]] = [
    ("where-mask", ca_m, cb_m, (*_not_lowest(ca_m), *_not_lowest(cb_m))),
    ("where-mask-lowest", ca_m, f64(F32_NEXT), (*_not_lowest(ca_m), *_is_f32_lowest(cb_m))),
    ("where-mask-lowest-first", f64(F32_NEXT), cb_m, (*_is_f32_lowest(ca_m), *_not_lowest(cb_m))),
]
"""Mask branches (variant, the fused mask's two constants, guards): kept, or float32's lowest moved up."""
_TABLE_BRANCHES: list[tuple[str, f64, tuple[FactLike, ...]]] = [
    ("where-table", cb_m, (*_not_lowest(cb_m), cb_m >= f64(F32_LOWEST), cb_m <= f64(-F32_LOWEST))),  # finite
    ("where-table-lowest", f64(F32_NEXT), _is_f32_lowest(cb_m)),
]
"""Masks of a constant table where kept and a finite constant elsewhere (T5's position bias):
(variant, the fused mask's constant, guards)."""
_GUARDED = ("sdpa", "unscaled")
_LAST = i64(3)  # the softmax axis: import counts a negative axis from the front where the rank is known
for _name, _scores, _scale, _guards in _SCORES:
    _common = (*_qkv_shapes(), *_guards)
    # softmax(q k^T * s) v => Attention(q, k, v, scale=s): five to seven ops and the [T, S] scores
    # in memory become one kernel (onnxruntime does not fuse attention itself).
    _p = L.softmax(_scores, _LAST)
    _zeroed = L.where(L.isnan(_p), _scalar(f64(0.0), sv, dt), _p)
    _forms: list[tuple[str, L.Tensor, tuple[FactLike, ...]]] = [("plain", L.matmul(_p, v), ())]
    if _name in _GUARDED:  # the forms torch's SDPA decomposition writes (scaled q and k, or none)
        _forms.append(("nan-guard", L.matmul(_zeroed, v), (L.shape(_zeroed) == _scores_shape,)))
    for _form, _out, _zero in _forms:
        FAMILY.rewrite(
            "attention-fusion",
            _out,
            L.fused_attention(q, _k, v, L.Tensor.none(), _scale, dt),
            *_common,
            *_zero,
            variant=f"{_name}-{_form}",
            rtol=FLOAT32_RTOL,
        )
    if _name not in _GUARDED:
        continue
    # softmax(q k^T * s + mask) with the exporters' zeroed fully masked rows => Attention with the
    # float mask, where the mask is a boolean one made float (Where(keep, a, b) of two constants):
    # onnxruntime's Attention takes a mask entry equal to the float's lowest value for -inf (its
    # row is zero when fully masked) while the softmax keeps it finite (the row is uniform), so a
    # mask that may hold that value (a float input, torch's finfo.min) is not taken as it is; a
    # constant branch at float32's lowest (what dynamo exports write) becomes the next float up,
    # which masks an entry as well (exp underflows to 0) and is not special to onnxruntime.
    # A mask over the keys only ([.., 1, S], TorchScript's decode steps, and its grouped-query
    # queries folded into [B, Hkv, n_rep * T, D]) is written expanded to the scores' [T, S]:
    # onnxruntime's Attention broadcasts only the mask's leading dims. The Expand target is [T, 1]
    # (T known: a symbolic T would need Concat(Shape(q)[2:3], [1]), which this phase does not fold).
    for _kind, _ma, _mb, _guards_m in _MASK_BRANCHES:
        _m = L.where(_keep, _scalar(ca_m, sma, dt), _scalar(cb_m, smb, dt))
        _pm = L.softmax(L.add(_scores, _m), _LAST)
        _zeroed_m = L.where(L.isnan(_pm), _scalar(f64(0.0), sv, dt), _pm)
        _fused_m = L.where(_keep, _scalar(_ma, sma, dt), _scalar(_mb, smb, dt))
        _mask_guards = (
            *_common,
            *_guards_m,
            L.shape(_zeroed_m) == _scores_shape,
            L.shape(_m) == sm,
            sm.length() == i64(4),
            sm[3] == _s_len,
            L.shape(L.add(_scores, _m)) == _scores_shape,  # the mask does not grow the scores
        )
        _keys_only = (sm[2] == i64(1), sq[2] != i64(1))
        for _rule, _over, _mask, _query_guard in (
            ("attention-mask-fusion", "", _fused_m, (sm[2] == sq[2],)),
            (
                "attention-mask-fusion",
                "-keys-only",
                L.expand(_fused_m, L.Tensor.ints(Vec(sq[2], i64(1)), i64(1))),
                (*_keys_only, sq[2] >= i64(0)),
            ),
        ):
            FAMILY.rewrite(
                _rule,
                L.matmul(_zeroed_m, v),
                L.fused_attention(q, _k, v, _mask, _scale, dt),
                *_mask_guards,
                *_query_guard,
                variant=f"{_name}-{_kind}{_over}",
                rtol=FLOAT32_RTOL,
            )

    # softmax(q k^T * s + Where(keep, table, c)) without a guard => Attention with that mask, where
    # the table is a constant of small values (|x| <= 2**12, T5's relative position bias) and c a
    # finite constant: no score is -inf, so no row is fully masked for onnxruntime and the plain
    # softmax's rows are the fused node's (c at float32's lowest moves up as above).
    for _kind, _mb, _guards_m in _TABLE_BRANCHES:
        _m = L.where(_keep, _table, _scalar(cb_m, smb, dt))
        _pm = L.softmax(L.add(_scores, _m), _LAST)
        FAMILY.rewrite(
            "attention-mask-fusion",
            L.matmul(_pm, v),
            L.fused_attention(q, _k, v, L.where(_keep, _table, _scalar(_mb, smb, dt)), _scale, dt),
            *_common,
            *_guards_m,
            L.is_const(_table),
            L.small_const(_table),
            L.dtype(_table) == dt,
            L.shape(_pm) == _scores_shape,
            L.shape(_m) == sm,
            sm.length() == i64(4),
            sm[2] == sq[2],
            sm[3] == _s_len,
            variant=f"{_name}-{_kind}",
            rtol=FLOAT32_RTOL,
        )

# Attention(q, (k^T)^T) => Attention(q, k): the fused node takes k untransposed, and the exporters'
# k^T is a Transpose of k (this phase runs after the layout rules that would cancel the pair).
(_kk,) = vars_("kk", L.Tensor)
FAMILY.rewrite(
    "attention-key-transpose-cancel",
    L.fused_attention(q, L.transpose(L.transpose(_kk, _TRANSPOSE_LAST), _TRANSPOSE_LAST), v, m, ca, dt),
    L.fused_attention(q, _kk, v, m, ca, dt),
)

# ---------------------------------------------------------------- heads packed in the last dim
q3, k3, v3, tq, tk, tv, to = vars_("q3 k3 v3 tq tk tv to", L.Tensor)
s3q, s3k, s3v, s4q, s4k, s4v = vars_("s3q s3k s3v s4q s4k s4v", Vec[i64])
azq, azk, azv, azo = vars_("azq azk azv azo", i64)
_HEADS_FIRST = Vec(i64(0), i64(2), i64(1), i64(3))


def _heads_split(packed: L.Tensor, target: L.Tensor, allowzero: i64, s3: Vec[i64], s4: Vec[i64]) -> tuple[L.Tensor, tuple[FactLike, ...]]:
    """[B, T, H * D] reshaped to [B, T, H, D] and transposed to [B, H, T, D], and its guards."""
    split = L.reshape(packed, target, allowzero)
    guards = (
        L.shape(packed) == s3,
        s3.length() == i64(3),
        L.shape(split) == s4,
        s4.length() == i64(4),
        s4[0] == s3[0],
        s4[1] == s3[1],
        s4[2] >= i64(1),
        s4[3] >= i64(1),
        s4[2] * s4[3] == s3[2],
    )
    return L.transpose(split, _HEADS_FIRST), guards


_q4, _q_guards = _heads_split(q3, tq, azq, s3q, s4q)
_k4, _k_guards = _heads_split(k3, tk, azk, s3k, s4k)
_v4, _v_guards = _heads_split(v3, tv, azv, s3v, s4v)
_KEY_FORMS = {
    "key": _k4,
    # k^T split straight to [B, H, D, S] (TorchScript's permute; dynamo's flattened transpose after
    # transpose-through-batch-merge), which the attention rule transposes back: fusion runs after
    # the algebra phase, so the two Transposes are not composed here.
    "key-transposed": L.transpose(L.transpose(L.reshape(k3, tk, azk), Vec(i64(0), i64(2), i64(3), i64(1))), _TRANSPOSE_LAST),
}
(vo,) = vars_("vo", Vec[i64])
for _form, _key in _KEY_FORMS.items():
    _packed = L.fused_attention_3d(q3, k3, v3, m, ca, s4q[2], dt)
    # The heads merged to [B, T, H * Dv], or to rows [B * T, H * Dv] (GPT-2's Conv1D input; a
    # target of two entries whose 0s can only copy B or T, which the 3-D result has as well).
    for _out, _target, _result, _out_guards in (
        ("", to, _packed, ()),
        ("-rows", L.Tensor.ints(vo, i64(1)), L.reshape(_packed, L.Tensor.ints(vo, i64(1)), azo), (vo.length() <= i64(2),)),
    ):
        _merged = L.reshape(L.transpose(L.fused_attention(_q4, _key, _v4, m, ca, dt), _HEADS_FIRST), _target, azo)
        _merged_guards = (L.shape(_merged) == Vec(s3q[0], s3q[1], s3v[2]),) if not _out else _out_guards
        # merge_heads(Attention(split_heads(q), split_heads(k), split_heads(v))) => Attention on the
        # packed [B, T, H * D] tensors (q_num_heads = kv_num_heads = H): the Reshape and Transpose of
        # q, k, v and of the output (four copies of a [T, H * D] activation per layer) are in the kernel.
        FAMILY.rewrite(
            "attention-packed-heads",
            _merged,
            _result,
            *_q_guards,
            *_k_guards,
            *_v_guards,
            s4k[2] == s4q[2],
            s4v[2] == s4q[2],
            *_merged_guards,
            variant=_form + _out,
        )

# ---------------------------------------------------------------- rotary embedding
xr, cos_, sin_ = vars_("xr cos_ sin_", L.Tensor)
sxr, vh, ve = vars_("sxr vh ve", Vec[i64])


def _half(start: L.Tensor, end: L.Tensor, axis: int) -> L.Tensor:
    return L.slice_(xr, start, end, L.Tensor.ints(Vec(i64(axis)), i64(1)), L.Tensor.none())


_mid, _zero = L.Tensor.ints(vh, i64(1)), L.Tensor.ints(Vec(i64(0)), i64(1))
_table = Vec(i64(1), i64(1), sxr[2], sxr[3])  # cos and sin: [1, 1, seq, head], so they never broadcast x
for _axis in (3, -1):
    # x * cos + concat(-x[..., h:], x[..., :h]) * sin => fused_rotary(x, cos, sin): the rotate-half
    # chain of Llama/Mistral/Qwen2 exports (two Slices, Neg, Concat, two Muls, Add per q and k) is
    # one RotaryEmbedding kernel.
    _upper, _lower = _half(_mid, L.Tensor.ints(ve, i64(1)), _axis), _half(_zero, _mid, _axis)
    FAMILY.rewrite(
        "rotary-fusion",
        L.add(L.mul(xr, cos_), L.mul(L.concat(L.tlist([L.neg(_upper), _lower]), i64(3)), sin_)),
        L.fused_rotary(xr, cos_, sin_, dt),
        L.shape(xr) == sxr,
        sxr.length() == i64(4),
        vh.length() == i64(1),
        ve.length() == i64(1),
        vh[0] >= i64(1),
        sxr[3] == vh[0] * i64(2),
        ve[0] >= sxr[3],
        L.shape(cos_) == _table,
        L.shape(sin_) == _table,
        *_float(xr, FLOAT_TYPES),
        L.dtype(cos_) == dt,
        L.dtype(sin_) == dt,
        variant=f"axis{_axis}",
    )

RULE_NAMES = list(FAMILY.names)
