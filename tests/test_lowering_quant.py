"""The committed int8 QDQ ResNet-18 export (opset 17, where onnx's reference evaluator has no
DequantizeLinear) compiles to one native call whose output equals onnxruntime's (the backend's
QuantizeLinear/DequantizeLinear node cases: test_lowering_exact_ops)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel

from .realmodels_feeds import feeds_for

REALMODELS = Path(__file__).parent / "data" / "realmodels"
def test_qdq_export_is_one_native_call_equal_to_onnxruntime() -> None:
    record = json.loads((REALMODELS / "INDEX.json").read_text())["resnet18-ts-static-qdq"]
    model = onnx.load(REALMODELS / record["file"])
    feeds = feeds_for(record["inputs"], seed=5)
    compiled = CompiledModel(model, CompileOptions(cache=False, opt_level=0))
    # onnxruntime running the QDQ graph as written (basic optimizations): with all of them it fuses
    # QLinearConvs whose integer kernels round differently on AVX2 hosts (one output step off there)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (got,) = compiled(feeds).values()
    np.testing.assert_array_equal(got, expected)
    assert compiled.stats(feeds).one_native_call
