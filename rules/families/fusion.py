"""Fusion rules: decompositions PyTorch/TF exporters write become one fused node.

A chain of elementwise/reduction ops that an exporter wrote for LayerNorm, GELU, SiLU, HardSwish,
Softmax or bias+GELU becomes the standard ONNX op when the model's opset has it (the guard reads
``model_opset``), else an onnxsat fused kind (``egraph/ops/fused.py``) that exports back as its
chain or, with ``--allow-contrib-ops``, as an onnxruntime contrib op. A fused node costs one
memory pass instead of one per op of the chain.

Guards: constants must equal the exact values up to float32 rounding (``_near``), reductions must
run over the last axis with kept dims, constants must not broadcast the input to a larger shape,
and the input must be of a float type onnxruntime's CPU provider runs the fused op on
(``ORT_TYPES``, measured on onnxruntime 1.32: it has no float64 HardSigmoid, HardSwish or
Gelu(approximate=none) kernel, so fusing a float64 chain into one would leave a model nothing can
run). float16 decompositions are left alone everywhere: they carry float16-rounded constants and
the fused ops compute in higher precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from egglog import String, Vec, eq, f64, i64, union, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ..registry import ROOT as t
from ..registry import Family

FAMILY = Family("fusion")
FAMILIES = (FAMILY,)
MATCH_RTOL = 2.0**-22
"""Constants match within this relative distance (float32 rounding is at most 2**-24)."""
FLOAT32_RTOL = 2.0**-18
"""Verification tolerance of rules whose result differs from the chain by float32 rounding of its
constants (matched within ``MATCH_RTOL``, or float32 attributes and constants of the fused op)."""

x, d, g, bias, scale, total = vars_("x d g bias scale total", L.Tensor)
sx, sd, sg, sb, va = vars_("sx sd sg sb va", Vec[i64])
dt, cd1, cd2, cd3, cd4, cd5, nz, nz2, ax = vars_("dt cd1 cd2 cd3 cd4 cd5 nz nz2 ax", i64)
c1, c2, c3, c4, c5, eps = vars_("c1 c2 c3 c4 c5 eps", f64)
(approx,) = vars_("approx", String)


def _near(value: f64, exact: float) -> tuple[FactLike, ...]:
    """``value`` is ``exact`` up to float32 rounding."""
    tol = abs(exact) * MATCH_RTOL
    return (value >= f64(exact - tol), value <= f64(exact + tol))


def _const(value: f64, dims: Vec[i64], cdt: i64) -> L.Tensor:
    """A uniform constant operand (its value is guarded with ``_near``)."""
    return L.Tensor.splat(value, dims, cdt)


FLOAT, DOUBLE = 1, 11
F32_F64 = (FLOAT, DOUBLE)
ORT_TYPES: dict[str, tuple[int, ...]] = {
    "LayerNormalization": F32_F64,
    "Gelu": (FLOAT,),  # approximate=none; onnxruntime 1.32 runs float64 only for approximate=tanh
    "Gelu-tanh": F32_F64,
    "Swish": F32_F64,
    "HardSigmoid": (FLOAT,),
    "HardSwish": (FLOAT,),
    "Softmax": F32_F64,
    "fused": F32_F64,  # onnxsat fused kinds: written as their chain, or as a contrib op that runs the type
}
"""Input types (ONNX codes) each fusion target runs on in onnxruntime's CPU provider.
tests/test_rules_fusion.py checks the table against onnxruntime. (onnxruntime 1.32 runs every one of
these targets on float16 too, and has no bfloat16 kernel for any of them but LayerNormalization;
float16 and bfloat16 are excluded on purpose, see the module docstring.)"""


def _float_input(target: str) -> tuple[FactLike, ...]:
    """The root keeps x's shape (no constant broadcasts it), and x has a type ``target`` runs on."""
    return (L.shape(x) == sx, L.shape(t) == sx, *_dtype_in(x, ORT_TYPES[target]))


def _dtype_in(tensor: L.Tensor, codes: tuple[int, ...]) -> tuple[FactLike, ...]:
    """``tensor``'s type is one of ``codes`` (a single type as a literal, which rule verification
    reads to give the instance's leaves that type)."""
    if len(codes) == 1:
        return (L.dtype(tensor) == i64(codes[0]),)
    return (L.dtype(tensor) == dt, Vec(*(i64(code) for code in codes)).contains(dt))


def _const_types(target: str) -> tuple[i64, ...]:
    """Types of a chain's constants: x's one type as a literal where ``target`` runs one type (ONNX
    elementwise ops take operands of one type; rule verification then makes constants of it), else free."""
    codes = ORT_TYPES[target]
    return (i64(codes[0]),) * 5 if len(codes) == 1 else (cd1, cd2, cd3, cd4, cd5)


def _opset(at_least: int) -> FactLike:
    return L.model_opset() >= i64(at_least)


def _opset_below(limit: int) -> FactLike:
    return L.model_opset() < i64(limit)


def _last_axis(axes: Vec[i64]) -> tuple[FactLike, ...]:
    """``axes`` is exactly the last axis of x (given as -1 or rank-1)."""
    rank = sx.length()
    return (axes.length() == i64(1), rank >= i64(1), (axes[0] + rank) % rank == rank - i64(1))


# ---------------------------------------------------------------- LayerNorm
# (x - mean) / sqrt(var + eps) over the last axis => LayerNormalization (opset >= 17): 9 ops become
# one pass. The core is fused with unit scale; scale and bias are absorbed by the next two rules.
_axes = L.Tensor.ints(va, i64(1))
_centered = L.sub(x, L.reduce_mean(x, _axes, i64(1), nz))
_squares = {
    "pow": L.pow_(_centered, _const(f64(2.0), sd, cd1)),
    "mul": L.mul(_centered, _centered),
}
_dim = sx[sx.length() - i64(1)]
_unit_scale = L.Tensor.splat(f64(1.0), Vec(_dim), dt)
for _sq_name, _squared in _squares.items():
    _std = L.sqrt(L.add(L.reduce_mean(_squared, _axes, i64(1), nz2), _const(eps, sg, cd2)))
    for _div_name, _normed in (
        ("div", L.div(_centered, _std)),
        ("rsqrt", L.mul(_centered, L.reciprocal(_std))),
    ):
        FAMILY.rewrite(
            "layer-norm-fusion",
            _normed,
            L.layer_norm(x, _unit_scale, L.Tensor.none(), i64(-1), eps),
            _opset(17),
            *_float_input("LayerNormalization"),
            *_last_axis(va),
            _dim >= i64(0),
            eps >= f64(0.0),
            variant=f"{_sq_name}-{_div_name}",
            rtol=FLOAT32_RTOL,  # LayerNormalization stores epsilon as float32
        )
_ln_last_axis = (
    L.shape(x) == sx,
    sx.length() >= i64(1),
    (ax + sx.length()) % sx.length() == sx.length() - i64(1),
)
# LayerNorm(x, 1) * gamma => LayerNorm(x, gamma) for a gamma over the normalized axis: one op fewer.
FAMILY.rewrite(
    "layer-norm-absorb-scale",
    L.mul(L.layer_norm(x, L.Tensor.splat(f64(1.0), sd, cd1), L.Tensor.none(), ax, eps), g),
    L.layer_norm(x, g, L.Tensor.none(), ax, eps),
    *_ln_last_axis,
    sd == Vec(_dim),
    L.shape(g) == sd,
    L.dtype(g) == cd1,
)
# LayerNorm(x, gamma) + beta => LayerNorm(x, gamma, beta) for a beta over the normalized axis.
FAMILY.rewrite(
    "layer-norm-absorb-bias",
    L.add(L.layer_norm(x, g, L.Tensor.none(), ax, eps), bias),
    L.layer_norm(x, g, bias, ax, eps),
    *_ln_last_axis,
    L.shape(g) == sd,
    sd == Vec(_dim),
    L.shape(bias) == sd,
    L.dtype(bias) == dt,
    L.dtype(x) == dt,
)


# ---------------------------------------------------------------- GELU
_Forms = dict[str, tuple[L.Tensor, tuple[FactLike, ...]]]
"""variant -> (left-hand side, its constant guards)."""


def _gelu_targets(name: str, forms: Callable[[tuple[i64, ...]], _Forms], approximate: str) -> None:
    """Gelu at opset >= 20, the onnxsat fused kind below (``forms`` builds the chains with the
    given constant types)."""
    std = "Gelu-tanh" if approximate == "tanh" else "Gelu"
    for target, rhs, opset, suffix in (
        (std, L.gelu(x, approximate), _opset(20), "std"),
        ("fused", L.fused_gelu(x, approximate, dt), _opset_below(20), "fused"),
    ):
        for variant, (lhs, guards) in forms(_const_types(target)).items():
            FAMILY.rewrite(
                name,
                lhs,
                rhs,
                opset,
                *_float_input(target),
                *guards,
                variant=f"{variant}-{suffix}",
                rtol=FLOAT32_RTOL,
            )


_erf_consts = (*_near(c2, 0.5), *_near(c3, 1.0))


def _gelu_erf_forms(cd: tuple[i64, ...]) -> _Forms:
    """0.5 * x * (1 + erf(x / sqrt 2)): PyTorch writes (x*A)*0.5, Hugging Face (x*0.5)*A; x/sqrt2
    may be constant-folded to x*(1/sqrt2)."""
    half, one = _const(c2, sg, cd[1]), _const(c3, sb, cd[2])
    args = {
        "div": (L.div(x, _const(c1, sd, cd[0])), _near(c1, math.sqrt(2.0))),
        "mul": (L.mul(x, _const(c1, sd, cd[0])), _near(c1, 1.0 / math.sqrt(2.0))),
    }
    forms: _Forms = {}
    for arg_name, (arg, arg_guard) in args.items():
        a = L.add(L.erf(arg), one)
        for form, lhs in (("torch", L.mul(L.mul(x, a), half)), ("hf", L.mul(L.mul(x, half), a))):
            forms[f"{arg_name}-{form}"] = (lhs, (*arg_guard, *_erf_consts))
    return forms


def _gelu_tanh_forms(cd: tuple[i64, ...]) -> _Forms:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 exactly (x^2.99 is NaN for x < 0)."""
    cubic = L.add(x, L.mul(L.pow_(x, _const(f64(3.0), sd, cd[3])), _const(c5, va, cd[4])))
    a = L.add(L.tanh(L.mul(cubic, _const(c1, sd, cd[0]))), _const(c3, sb, cd[2]))
    guards = (*_near(c1, math.sqrt(2.0 / math.pi)), *_near(c5, 0.044715), *_erf_consts)
    return {"hf": (L.mul(L.mul(x, _const(c2, sg, cd[1])), a), guards)}


# 0.5 * x * (1 + erf(x / sqrt 2)) => Gelu: five ops become one pass.
_gelu_targets("gelu-erf-fusion", _gelu_erf_forms, "none")
# 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) => Gelu(approximate=tanh): nine ops, one pass.
_gelu_targets("gelu-tanh-fusion", _gelu_tanh_forms, "tanh")

# ---------------------------------------------------------------- SiLU / Swish
# x * sigmoid(x) => Swish (opset >= 24) or the fused kind: two passes become one.
for _order, _lhs in (("xs", L.mul(x, L.sigmoid(x))), ("sx", L.mul(L.sigmoid(x), x))):
    FAMILY.rewrite("silu-fusion", _lhs, L.swish(x, 1.0), _opset(24), *_float_input("Swish"), variant=f"{_order}-std")
    FAMILY.rewrite(
        "silu-fusion",
        _lhs,
        L.fused_silu(x),
        _opset_below(24),
        *_float_input("fused"),
        variant=f"{_order}-fused",
    )

# ---------------------------------------------------------------- HardSigmoid / HardSwish
# relu6(x + 3) / 6 (MobileNetV3 code) => HardSigmoid(1/6, 1/2): three ops become one. ONNX stores
# alpha as float32, so the result differs from the chain by float32 rounding of 1/6.
_cd = _const_types("HardSigmoid")
_relu6 = L.clip(L.add(x, _const(c1, sd, _cd[0])), _const(c2, sg, _cd[1]), _const(c3, sb, _cd[2]))
_relu6_consts = (*_near(c1, 3.0), c2 == f64(0.0), *_near(c3, 6.0))
FAMILY.rewrite(
    "hard-sigmoid-fusion",
    L.div(_relu6, _const(c4, va, _cd[3])),
    L.hard_sigmoid(x, 1.0 / 6.0, 0.5),
    _opset(6),
    *_float_input("HardSigmoid"),
    *_relu6_consts,
    *_near(c4, 6.0),
    rtol=FLOAT32_RTOL,
)
# x * relu6(x + 3) / 6 => HardSwish (opset >= 14): four ops become one.
FAMILY.rewrite(
    "hard-swish-fusion",
    L.div(L.mul(x, _relu6), _const(c4, va, _cd[3])),  # HardSwish runs the types HardSigmoid does
    L.hard_swish(x),
    _opset(14),
    *_float_input("HardSwish"),
    *_relu6_consts,
    *_near(c4, 6.0),
    variant="relu6",
    rtol=FLOAT32_RTOL,
)
# x * HardSigmoid(x, 1/6, 1/2) => HardSwish: two ops become one.
for _order, _lhs in (
    ("xh", L.mul(x, L.hard_sigmoid(x, c1, c2))),
    ("hx", L.mul(L.hard_sigmoid(x, c1, c2), x)),
):
    FAMILY.rewrite(
        "hard-swish-fusion",
        _lhs,
        L.hard_swish(x),
        _opset(14),
        *_float_input("HardSwish"),
        *_near(c1, 1.0 / 6.0),
        *_near(c2, 0.5),
        variant=_order,
        rtol=FLOAT32_RTOL,
    )

# ---------------------------------------------------------------- Softmax
# exp(x - max(x)) / sum(exp(x - max(x))) over one axis => Softmax (opset >= 13, any axis): five ops,
# one pass. (exp(x) / sum(exp(x)) without the max is not fused: it overflows where Softmax does not.)
_shifted = L.exp(L.sub(x, L.reduce_max(x, _axes, i64(1), nz)))
FAMILY.rewrite(
    "softmax-fusion",
    L.div(_shifted, L.reduce_sum(_shifted, _axes, i64(1), nz2)),
    L.softmax(x, (va[0] + sx.length()) % sx.length()),
    _opset(13),
    *_float_input("Softmax"),
    va.length() == i64(1),
    sx.length() >= i64(1),
)

# ---------------------------------------------------------------- bias + activation
# Gelu(x + b) for a bias over the last axis => one fused pass (onnxruntime BiasGelu / FastGelu with
# contrib ops; the lowering layer's kernel otherwise).
_bias_guards = (
    L.shape(x) == sx,
    L.shape(t) == sx,
    L.shape(bias) == Vec(_dim),
    *_dtype_in(x, ORT_TYPES["fused"]),
)
FAMILY.rewrite(
    "bias-gelu-fusion",
    L.gelu(L.add(x, bias), approx),
    L.fused_bias_gelu(x, bias, approx, dt),
    *_bias_guards,
    variant="std",
    rtol=FLOAT32_RTOL,
)
FAMILY.rewrite(
    "bias-gelu-fusion",
    L.fused_gelu(L.add(x, bias), approx, dt),
    L.fused_bias_gelu(x, bias, approx, dt),
    *_bias_guards,
    variant="fused",
    rtol=FLOAT32_RTOL,
)

# ---------------------------------------------------------------- RMSNorm
# x * (1 / sqrt(mean(x * x) + eps)) over the last axis, as Llama, Qwen2 and Mistral exports write it
# (1 / sqrt as Reciprocal, or as a Div of a constant 1 from TorchScript; x * x as Pow(x, 2)) =>
# one pass (RMSNormalization at opset 23; onnxruntime does not fuse the chain itself): seven ops
# become one. The core is fused with unit scale; the weight multiply is absorbed by the next rule.
_rms_one = (*_near(c1, 1.0),)
for _sq_name, _squared in {"pow": L.pow_(x, _const(f64(2.0), sd, cd1)), "mul": L.mul(x, x)}.items():
    _rms = L.sqrt(L.add(L.reduce_mean(_squared, _axes, i64(1), nz), _const(eps, sg, cd2)))
    _inv_forms: dict[str, tuple[L.Tensor, tuple[FactLike, ...]]] = {
        "div": (L.div(x, _rms), ()),
        "rsqrt": (L.mul(x, L.reciprocal(_rms)), ()),
        "rsqrt-rev": (L.mul(L.reciprocal(_rms), x), ()),
        "one-div": (L.mul(x, L.div(_const(c1, sb, cd3), _rms)), _rms_one),
        "one-div-rev": (L.mul(L.div(_const(c1, sb, cd3), _rms), x), _rms_one),
    }
    for _form, (_normed, _guards) in _inv_forms.items():
        FAMILY.rewrite(
            "rms-norm-fusion",
            _normed,
            L.fused_rms_norm(x, _unit_scale, eps, dt),
            *_float_input("fused"),
            *_last_axis(va),
            *_guards,
            _dim >= i64(0),
            eps >= f64(0.0),
            variant=f"{_sq_name}-{_form}",
            rtol=FLOAT32_RTOL,  # RMSNormalization stores epsilon as float32
        )
# RMSNorm(x, 1) * gamma => RMSNorm(x, gamma) for a gamma over the normalized axis: one op fewer.
_rms_unit = L.fused_rms_norm(x, L.Tensor.splat(f64(1.0), sd, cd1), eps, dt)
for _order, _lhs in (("ng", L.mul(_rms_unit, g)), ("gn", L.mul(g, _rms_unit))):
    FAMILY.rewrite(
        "rms-norm-absorb-scale",
        _lhs,
        L.fused_rms_norm(x, g, eps, dt),
        L.shape(x) == sx,
        sx.length() >= i64(1),
        sd == Vec(_dim),
        L.shape(g) == sd,
        L.dtype(g) == dt,
        variant=_order,
    )
# RMSNorm(x + skip) and x + skip => one pass that writes both (onnxruntime's
# SkipSimplifiedLayerNormalization with contrib ops; 2-D or 3-D, skip of x's shape): the residual
# stream of a decoder reads the sum again, so both e-classes get an output of the fused node.
_SKIP_RMS = "rms-norm-skip-fusion"
_skip_args = (x, d, g, eps, dt)
FAMILY.rule(
    _SKIP_RMS,
    eq(t).to(L.fused_rms_norm(L.add(x, d), g, eps, dt)),
    eq(total).to(L.add(x, d)),  # the same e-class (a term, not ``total``, so verification builds it)
    L.shape(x) == sx,
    L.shape(d) == sx,
    sx.length() >= i64(2),
    sx.length() <= i64(3),
    then=[
        union(t).with_(L.fused_skip_rms_norm(*_skip_args, i64(0))),
        union(total).with_(L.fused_skip_rms_norm(*_skip_args, i64(1))),
    ],
)
# Shape(RMSNorm(x)) => Shape(x) (TorchScript exports read the batch and sequence dims of the norm's
# output): a norm whose other readers take it through folded weights is then not computed twice.
for _which, _normed in (("rms", L.fused_rms_norm(x, g, eps, dt)), ("skip", L.fused_skip_rms_norm(x, d, g, eps, dt, ax))):
    FAMILY.rewrite(
        "rms-norm-shape-of",
        L.shape_of(_normed, nz, nz2),
        L.shape_of(x, nz, nz2),
        L.shape(_normed) == sx,
        L.shape(x) == sx,
        variant=_which,
    )

RULE_NAMES = list(FAMILY.names)
