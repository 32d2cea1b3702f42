"""Shape computations on small constants evaluated at import (``egraph.const_eval``): exact values
where every input is a small integer or boolean constant, nothing otherwise."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsat.egraph import const_eval
from onnxsat.egraph import lang as L
from onnxsat.egraph.importer import from_onnx


def _node(op: str, n_inputs: int, **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, [f"i{k}" for k in range(n_inputs)], ["o"], **attrs)


def test_torchscript_expand_target_is_evaluated() -> None:
    """``Where(Equal(c, -1), 1, c)``: the -1 entries of x.expand(...) become 1."""
    c = np.array([1, -1, 128, 128], np.int64)
    eq = const_eval.evaluate(_node("Equal", 2), [c, np.full(4, -1, np.int64)], 17)
    assert eq is not None and eq[0].tolist() == [False, True, False, False]
    out = const_eval.evaluate(_node("Where", 3), [eq[0], np.ones(4, np.int64), c], 17)
    assert out is not None and out[0].dtype == np.int64 and out[0].tolist() == [1, 1, 128, 128]


def test_integer_division_truncates_like_onnxruntime() -> None:
    out = const_eval.evaluate(_node("Div", 2), [np.array([-7, 7], np.int64), np.array([2, -2], np.int64)], 17)
    assert out is not None and out[0].tolist() == [-3, -3]


def test_what_is_not_evaluated() -> None:
    ints = np.array([2, 3], np.int64)
    assert const_eval.evaluate(_node("Add", 2), [np.array([1.5], np.float32), np.array([1.0], np.float32)], 17) is None
    assert const_eval.evaluate(_node("Cast", 1, to=TensorProto.INT64), [np.array([np.nan], np.float32)], 17) is None
    assert const_eval.evaluate(_node("Expand", 2), [np.ones(1, np.int64), ints], 17) is None  # size set by a value
    assert const_eval.evaluate(_node("Div", 2), [ints, np.array([1, 0], np.int64)], 17) is None
    big = np.arange(const_eval.MAX_ELEMENTS + 1, dtype=np.int64)
    assert const_eval.evaluate(_node("Neg", 1), [big], 17) is None
    wide = np.arange(const_eval.MAX_ELEMENTS, dtype=np.int64)
    assert const_eval.evaluate(_node("Add", 2), [wide.reshape(-1, 1), wide], 17) is None  # a large broadcast
    node = helper.make_node("Add", ["i0", "i1"], ["o"], domain="com.microsoft")
    assert const_eval.evaluate(node, [ints, ints], 17) is None


def _expand_model(target_from_input: bool) -> onnx.ModelProto:
    """x [1, 1, 1, 8] expanded to Where(Equal(c, -1 * ones), ones, c) with c = [1, -1, 8, 8] (an
    initializer, or a graph input where ``target_from_input``)."""
    inits = [
        numpy_helper.from_array(np.array([4], np.int64), "n4"),
        numpy_helper.from_array(np.array(-1, np.int64), "minus"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 8])]
    if target_from_input:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.INT64, [4]))
    else:
        inits.append(numpy_helper.from_array(np.array([1, -1, 8, 8], np.int64), "c"))
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("ConstantOfShape", ["n4"], ["ones"], value=one),
        helper.make_node("Mul", ["ones", "minus"], ["neg"]),
        helper.make_node("Equal", ["c", "neg"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "c"], ["target"]),
        helper.make_node("Expand", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "expand", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)



def test_the_expand_gets_its_shape_from_the_evaluated_target() -> None:
    program = from_onnx(_expand_model(False), trust_onnx_shapes=False)
    assert program.egraph.extract(L.shape(program.terms["y"])) == L.ivec([1, 1, 8, 8])
    assert "Equal" not in program.unknown_ops  # evaluated, not an opaque node


def test_a_target_from_a_graph_input_is_not_evaluated() -> None:
    program = from_onnx(_expand_model(True), trust_onnx_shapes=False)
    assert program.egraph.lookup_function_value(L.shape(program.terms["y"])) is None
    assert program.unknown_ops["Equal"] == 1
