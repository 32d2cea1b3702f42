"""The verification tolerance follows the least precise float type an output is computed in."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsat.verification import compare_models, weakest_float_types

F, D = TensorProto.FLOAT, TensorProto.DOUBLE


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], in_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", in_type, [4, 16])],
        [helper.make_tensor_value_info("y", D, [4, 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weights(dtype: type, *names: str) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(dtype), n) for n in names]


def _chain(dtype: type, cast: bool) -> onnx.ModelProto:
    """(x @ W1) @ W2 in ``dtype``, cast to float64 when ``cast``."""
    last = "p" if cast else "y"
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], [last])]
    if cast:
        nodes.append(helper.make_node("Cast", ["p"], ["y"], to=D))
    return _model(nodes, _weights(dtype, "w1", "w2"), F if dtype is np.float32 else D)


def _reassociated(dtype: type, cast: bool) -> onnx.ModelProto:
    """x @ (W1 @ W2), the product computed in ``dtype`` as a weight (what matmul-const-assoc does)."""
    w1, w2 = (numpy_helper.to_array(t) for t in _weights(dtype, "w1", "w2"))
    fused = numpy_helper.from_array((w1 @ w2).astype(dtype), "w12")
    last = "p" if cast else "y"
    nodes = [helper.make_node("MatMul", ["x", "w12"], [last])]
    if cast:
        nodes.append(helper.make_node("Cast", ["p"], ["y"], to=D))
    return _model(nodes, [fused], F if dtype is np.float32 else D)


def test_float32_math_cast_to_float64_gets_float32_tolerance() -> None:
    assert weakest_float_types(_chain(np.float32, cast=True)) == {"y": F}
    result = compare_models(_chain(np.float32, cast=True), _reassociated(np.float32, cast=True))
    assert result.ok, result.outputs
    check = result.outputs[0]
    largest = (check.tolerance - 1e-5) / 1e-3  # max |reference|, from float32's bound atol + rtol * max
    assert check.max_abs_err > 1e-10 + 1e-7 * largest  # beyond float64's bound: the output dtype alone fails


def test_pure_float64_graph_keeps_float64_tolerance() -> None:
    """A float64 chain keeps float64's bound: a float32-sized error in it is caught."""
    original = _chain(np.float64, cast=False)
    assert weakest_float_types(original) == {"y": D}
    assert compare_models(original, _reassociated(np.float64, cast=False)).ok
    perturbed = _reassociated(np.float64, cast=False)
    w = numpy_helper.to_array(perturbed.graph.initializer[0])
    perturbed.graph.initializer[0].CopyFrom(numpy_helper.from_array((w * (1 + 1e-6)).astype(np.float64), "w12"))
    assert not compare_models(original, perturbed).ok


def test_integer_side_inputs_do_not_loosen_the_tolerance() -> None:
    """A float64 output reshaped by the Shape of a float32 tensor is still computed in float64."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x64"], to=D),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["x64", "s"], ["y"]),
    ]
    model = _model(nodes, [], F)
    assert weakest_float_types(model) == {"y": F}  # x itself is float32: the value went through it
    nodes[0] = helper.make_node("Identity", ["z"], ["x64"])
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [4, 16]), helper.make_tensor_value_info("z", D, [4, 16])],
        [helper.make_tensor_value_info("y", D, [4, 16])],
    )
    assert weakest_float_types(helper.make_model(graph)) == {"y": D}
