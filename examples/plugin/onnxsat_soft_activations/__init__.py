"""An example onnxsat rule plugin: fuse decomposed Softplus and Softsign into their ONNX ops.

TensorFlow-style exporters write Softplus as ``Log(Exp(x) + 1)`` and Softsign as
``x / (Abs(x) + 1)``: two or three kernels (memory passes) where ONNX has one op. Neither op is
modelled in onnxsat's tensor language, so this plugin adds both op rows and one rule each.

Both rules need guards: the constant 1 must not broadcast ``x`` to a larger tensor (else the
fused op would have a smaller shape than the chain it replaces), and ``x`` must be float32 or
float64 (ONNX defines the ops for floats only). Known limit: onnxruntime has no float64 kernels
for Softplus/Softsign, so on a float64 model onnxsat's final check fails and names the rule
(``--disable-rules soft-activations``); the guard cannot say float32 only, because onnxsat's rule
verifier builds float64 instances only, and a rule it cannot instantiate is rejected.

onnxsat finds this plugin through the entry point in pyproject.toml::

    [project.entry-points."onnxsat.rules"]
    soft-activations = "onnxsat_soft_activations:PLUGIN"
"""

from __future__ import annotations

from egglog import Vec, function, i64, vars_

from onnxsat.plugin import ROOT, OpSpec, RulePlugin, numel
from onnxsat.plugin import lang as L

__all__ = ["PLUGIN", "softplus", "softsign"]


@function
def softplus(x: L.Tensor) -> L.Tensor:
    """ONNX Softplus: log(exp(x) + 1)."""


@function
def softsign(x: L.Tensor) -> L.Tensor:
    """ONNX Softsign: x / (1 + |x|)."""


PLUGIN = RulePlugin(
    "soft-activations",
    description="Fuse Log(Exp(x)+1) into Softplus and x/(Abs(x)+1) into Softsign",
    family="soft-activations",
)

# Op rows: constructor, ONNX op type and inputs (no attributes), FLOPs per element, and the
# shape rule (output has the shape and dtype of input 0). Reference numerics come from
# onnx.reference on the exported node; both ops exist since opset 1.
PLUGIN.op(
    OpSpec(
        "Softplus", softplus, ("X",), family="unary", flops=lambda c: 3.0 * numel(c.out_shape), min_opset=1
    )
)
PLUGIN.op(
    OpSpec(
        "Softsign", softsign, ("X",), family="unary", flops=lambda c: 3.0 * numel(c.out_shape), min_opset=1
    )
)

(x,) = vars_("x", L.Tensor)
(ones_dims, x_dims) = vars_("ones_dims x_dims", Vec[i64])
(dt,) = vars_("dt", i64)
_one = L.Tensor.splat(1.0, ones_dims, dt)
_guards = (
    L.shape(x) == x_dims,
    L.shape(ROOT) == x_dims,  # the constant 1 does not broadcast x to a larger shape
    L.dtype(x) == dt,
    (dt - i64(1)) * (dt - i64(11)) == i64(0),  # float32 (1) or float64 (11): see the module docstring
)

# Log(Exp(x) + 1) => Softplus(x): three kernels become one.
for _order, _sum in (("exp-first", L.add(L.exp(x), _one)), ("one-first", L.add(_one, L.exp(x)))):
    PLUGIN.rewrite(
        "softplus-fusion",
        L.log(_sum),
        softplus(x),
        *_guards,
        description="Log(Exp(x) + 1) -> Softplus(x)",
        variant=_order,
    )

# x / (Abs(x) + 1) => Softsign(x): three kernels become one.
for _order, _sum in (("abs-first", L.add(L.abs_(x), _one)), ("one-first", L.add(_one, L.abs_(x)))):
    PLUGIN.rewrite(
        "softsign-fusion",
        L.div(x, _sum),
        softsign(x),
        *_guards,
        description="x / (Abs(x) + 1) -> Softsign(x)",
        variant=_order,
    )
