"""QuantizeLinear and DequantizeLinear compile to native kernels: the ONNX backend's per-tensor node
cases exactly, and the committed int8 QDQ ResNet-18 export (opset 17, where onnx's reference
evaluator has no DequantizeLinear) as one native call equal to onnxruntime's output."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel

from .realmodels_feeds import feeds_for

REALMODELS = Path(__file__).parent / "data" / "realmodels"
NATIVE_CASES = (
    "test_dequantizelinear",
    "test_dequantizelinear_int16",
    "test_dequantizelinear_uint16",
    "test_quantizelinear",
    "test_quantizelinear_int16",
    "test_quantizelinear_uint16",
)
"""The per-tensor cases of 8- and 16-bit integers (per-axis and blocked ones run the fallback)."""


def _case(name: str):  # type: ignore[no-untyped-def]
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return next(c for c in node_cases.collect_testcases(None) if c.name == name)


@pytest.mark.parametrize("name", NATIVE_CASES)
def test_backend_case_compiles_natively_and_exactly(name: str) -> None:
    case = _case(name)
    feeds = dict(zip([i.name for i in case.model.graph.input], case.data_sets[0][0], strict=False))
    compiled = CompiledModel(case.model, CompileOptions(cache=False, opt_level=0))
    (got,) = compiled(feeds).values()
    (expected,) = case.data_sets[0][1]
    expected = expected if isinstance(expected, np.ndarray) else numpy_helper.to_array(expected)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert not compiled.stats(feeds).fallbacks


def test_qdq_export_is_one_native_call_equal_to_onnxruntime() -> None:
    record = json.loads((REALMODELS / "INDEX.json").read_text())["resnet18-ts-static-qdq"]
    model = onnx.load(REALMODELS / record["file"])
    feeds = feeds_for(record["inputs"], seed=5)
    compiled = CompiledModel(model, CompileOptions(cache=False, opt_level=0))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (got,) = compiled(feeds).values()
    np.testing.assert_array_equal(got, expected)
    assert compiled.stats(feeds).one_native_call
