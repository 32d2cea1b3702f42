"""Whole-model opset conversion, so a fused node can be written as a standard op newer than the model.

RMSNormalization, RotaryEmbedding and Attention exist from opset 23 on; a model exported at opset 17
can hold them only if every other node is converted to opset 23 too (one opset per domain and
model: an op's meaning can change between versions, e.g. ReduceMean's axes became an input at 18).
The exporter writes such fused nodes in their final form but in a private domain
(``UPGRADE_DOMAIN``), which onnx's version converter carries through unchanged; after the whole
model is converted, those nodes move to the default domain. The result is checked and verified
against the original model like every optimized model (``onnxsat.pipeline``).
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from ..base.weightless import has_large_weights, restore_weights, weightless

UPGRADE_DOMAIN = "onnxsat.upgrade"
"""Domain of the nodes that become default-domain ops once the model is converted."""

UPGRADE_OPSET = 23
"""The opset the fused standard ops need (RMSNormalization, RotaryEmbedding, Attention)."""


class UpgradeError(Exception):
    """The version converter could not convert the model (an op without an adapter, a large model)."""


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def has_placeholders(model: onnx.ModelProto) -> bool:
    return any(node.domain == UPGRADE_DOMAIN for node in model.graph.node)


def convert_whole_model(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` with every node at ``opset`` and the placeholder nodes moved to the default domain.

    The converter gets the model without its large weights (`weightless`: serializing them for
    its C++ side was most of its time) and they are put back after; where that fails (an adapter
    that rewrote a weight), the whole model is converted. Raises ``UpgradeError`` when the
    converter fails (the caller writes the chains instead).
    """
    converted = None
    if has_large_weights(model):
        try:
            converted = version_converter.convert_version(weightless(model), opset)
        except Exception:  # an adapter that reads weight values: converted whole below
            converted = None
        if converted is not None and not restore_weights(converted, model):
            converted = None
    if converted is None:
        try:
            converted = version_converter.convert_version(model, opset)
        except Exception as exc:  # the converter raises RuntimeError, ValueError or C++ errors
            raise UpgradeError(f"onnx.version_converter to opset {opset} failed: {str(exc).splitlines()[0]}") from exc
    if default_opset(converted) != opset:
        raise UpgradeError(f"onnx.version_converter left the model at opset {default_opset(converted)}")
    for node in converted.graph.node:
        if node.domain == UPGRADE_DOMAIN:
            node.domain = ""
    kept = [o for o in converted.opset_import if o.domain != UPGRADE_DOMAIN]
    del converted.opset_import[:]
    converted.opset_import.extend(kept)
    needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    converted.ir_version = max(converted.ir_version, needed)  # the checker wants the opset's IR version
    return converted
