"""The plugin's own tests: its rules pass onnxsat's verifier, fire on the example model, and respect their guards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.plugin import PluginLoad, ensure_plugins, unload_plugin

PACKAGE = Path(__file__).resolve().parent.parent / "onnxsat_soft_activations"
MODEL = PACKAGE / "soft_activations.onnx"
OPTIONS = onnxsat.Options(
    rules_only=("soft-activations",), rule_files=(str(PACKAGE / "__init__.py"),), entry_point_plugins=False
)
"""A run sees a plugin only when its options name it (here by file; installed, by entry point)."""


@pytest.fixture(scope="module")
def loaded() -> Iterator[PluginLoad]:
    (load,) = ensure_plugins(OPTIONS.rule_files, entry_points=False)
    yield load
    unload_plugin(load)


def test_both_rules_pass_verification(loaded: PluginLoad) -> None:
    assert loaded.error is None and not loaded.rejected
    assert loaded.accepted == ["softplus-fusion", "softsign-fusion"]
    assert loaded.ops == ["Softplus", "Softsign"]


def test_rules_fire_on_the_example_model(loaded: PluginLoad) -> None:
    optimized, report = onnxsat.optimize(onnx.load(str(MODEL)), OPTIONS)
    assert sorted(n.op_type for n in optimized.graph.node) == ["MatMul", "MatMul", "Softplus", "Softsign"]
    assert report.verification.status == "passed"
    assert report.cost_after < report.cost_before


def _softplus_model(one_shape: list[int], dtype: int) -> onnx.ModelProto:
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    one = numpy_helper.from_array(np.ones(one_shape, dtype=np_type), "one")
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["s"]),
        helper.make_node("Log", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "softplus",
        [helper.make_tensor_value_info("x", dtype, [1, 8])],
        [helper.make_tensor_value_info("y", dtype, list(np.broadcast_shapes((1, 8), tuple(one_shape))))],
        [one],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("one_shape", "dtype", "fires"),
    [
        pytest.param(
            [1],
            TensorProto.DOUBLE,
            True,
            marks=pytest.mark.xfail(
                strict=True,
                reason="onnxruntime has no float64 Softplus; the verifier cannot check a float32-only guard",
            ),
        ),
        ([1], TensorProto.FLOAT, True),
        ([3, 8], TensorProto.FLOAT, False),  # the 1 broadcasts x to [3, 8]: Softplus(x) would be [1, 8]
        ([1], TensorProto.FLOAT16, False),  # onnxruntime has no float16 Softplus kernel
    ],
)
def test_guards(loaded: PluginLoad, one_shape: list[int], dtype: int, fires: bool) -> None:
    optimized, report = onnxsat.optimize(_softplus_model(one_shape, dtype), OPTIONS)
    assert ("Softplus" in [n.op_type for n in optimized.graph.node]) is fires
    assert report.verification.status == "passed"
