"""Integer, bool and quantized ops compile to native kernels and give exactly the ONNX backend node
cases' expected outputs: comparisons, logical ops, GatherND, per-tensor QuantizeLinear and
DequantizeLinear. Transformer exports compute their masks with these; a fallback among them
splits a compiled model into several native calls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from tests.helpers_onnx import single_node_cases

OPS = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "GatherND"}
QUANTIZED = {"QuantizeLinear", "DequantizeLinear"}
NOT_NATIVE = ("_string", "_axis", "_blocked", "_e4m3fn", "_e5m2", "int4", "int2", "float4")
"""Cases out of scope: strings (no kernel type), per-axis and blocked quantization (their weights
fold at compile time; at run time they take the fallback), float8/float4/int4/int2 types."""


def _cases() -> list[Any]:
    chosen = [c for c in single_node_cases(frozenset(OPS | QUANTIZED)) if not any(word in c.name for word in NOT_NATIVE)]
    return [pytest.param(c, id=c.name) for c in chosen]


@pytest.mark.parametrize("case", _cases())
def test_backend_case_compiles_natively_and_exactly(case: Any) -> None:
    names = [i.name for i in case.model.graph.input]
    compiled = CompiledModel(case.model, CompileOptions(cache=False, opt_level=0))
    for inputs, outputs in case.data_sets:
        feeds = dict(zip(names, inputs, strict=False))
        got = list(compiled(feeds).values())
        for have, want in zip(got, outputs, strict=True):
            want = want if isinstance(want, np.ndarray) else numpy_helper.to_array(want)
            assert have.dtype == want.dtype and np.array_equal(have, want)
        assert not compiled.stats(feeds).fallbacks
