"""onnxsat fused kinds: one e-graph node for a chain that has no standard ONNX op at the model's opset.

The fusion rules create them so extraction prices the chain as one memory pass and the lowering
layer can emit one kernel. On export they become onnxruntime contrib ops when
``--allow-contrib-ops`` asks for them, else the original chain of standard ops (never a custom op
onnxruntime cannot run).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .. import lang as L
from .registry import Attr, CostCtx, ExportNode, OpSpec, numel, register

CONTRIB = "com.microsoft"
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


class _Chain:
    """Builds the nodes of an expansion: fresh inner names and typed scalar constants."""

    def __init__(self, node: ExportNode, dtype: int):
        self.node, self.dtype = node, dtype
        self.nodes: list[Any] = []

    def const(self, value: float) -> str:
        name = self.node.fresh("onnxsat_const")
        array = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(self.dtype))
        self.nodes.append(
            helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))
        )
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        name = out or self.node.fresh(f"onnxsat_{op_type.lower()}")
        self.nodes.append(helper.make_node(op_type, inputs, [name], **attrs))
        return name


def _gelu_chain(chain: _Chain, x: str, approximate: str, out: str) -> None:
    """0.5 * x * (1 + erf(x / sqrt 2)), or the tanh form, as PyTorch exports them."""
    if chain.node.opset >= 20:
        chain.op("Gelu", [x], out, **({"approximate": approximate} if approximate != "none" else {}))
        return
    if approximate == "tanh":
        cube = chain.op("Mul", [chain.op("Mul", [x, x]), x])
        inner = chain.op("Add", [x, chain.op("Mul", [cube, chain.const(GELU_TANH_CUBIC)])])
        core = chain.op("Tanh", [chain.op("Mul", [inner, chain.const(GELU_TANH_SCALE)])])
    else:
        core = chain.op("Erf", [chain.op("Div", [x, chain.const(math.sqrt(2.0))])])
    half_x = chain.op("Mul", [x, chain.const(0.5)])
    chain.op("Mul", [half_x, chain.op("Add", [core, chain.const(1.0)])], out)


def _silu_export(node: ExportNode) -> None:
    (x,), (out,) = node.inputs, node.outputs
    if node.allow_contrib:  # QuickGelu(alpha=1) is x * sigmoid(x)
        node.op_type, node.domain, node.attrs = "QuickGelu", CONTRIB, {"alpha": 1.0}
        return
    chain = _Chain(node, 0)
    chain.op("Mul", [x, chain.op("Sigmoid", [x])], out)
    node.expansion = chain.nodes


def _contrib_runs(approximate: str, dtype: int) -> bool:
    """onnxruntime 1.32 has float64 kernels for FastGelu (tanh) but not for com.microsoft Gelu and
    BiasGelu (erf): a float64 erf GELU is written as its chain even with contrib ops allowed."""
    return approximate == "tanh" or dtype != TensorProto.DOUBLE


def _gelu_export(node: ExportNode) -> None:
    approximate, dtype = str(node.attrs.pop("approximate", "none")), int(node.attrs.pop("dtype"))
    if node.allow_contrib and _contrib_runs(approximate, dtype):
        node.op_type, node.domain = ("FastGelu" if approximate == "tanh" else "Gelu"), CONTRIB
        return
    chain = _Chain(node, dtype)
    _gelu_chain(chain, node.inputs[0], approximate, node.outputs[0])
    node.expansion = chain.nodes


def _bias_gelu_export(node: ExportNode) -> None:
    approximate, dtype = str(node.attrs.pop("approximate", "none")), int(node.attrs.pop("dtype"))
    if node.allow_contrib and _contrib_runs(approximate, dtype):
        node.op_type, node.domain = ("FastGelu" if approximate == "tanh" else "BiasGelu"), CONTRIB
        return
    chain = _Chain(node, dtype)
    _gelu_chain(chain, chain.op("Add", node.inputs), approximate, node.outputs[0])
    node.expansion = chain.nodes


def _flops(per_element: float) -> Callable[[CostCtx], float]:
    return lambda ctx: per_element * numel(ctx.out_shape)


_GELU_ATTRS = (Attr("approximate", "string", "none"), Attr("dtype", "int"))

register(
    OpSpec("onnxsat.FusedSiLU", L.fused_silu, ("X",), export=_silu_export, flops=_flops(4.0)),
    OpSpec("onnxsat.FusedGelu", L.fused_gelu, ("X",), _GELU_ATTRS, export=_gelu_export, flops=_flops(8.0)),
    OpSpec(
        "onnxsat.FusedBiasGelu",
        L.fused_bias_gelu,
        ("X", "bias"),
        _GELU_ATTRS,
        family="binary",
        export=_bias_gelu_export,
        flops=_flops(9.0),
    ),
)
