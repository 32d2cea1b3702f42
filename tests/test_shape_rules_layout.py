"""Shape rules of the layout, reduction and shape ops with constant operands.

Each model is imported with the egglog analysis alone (no ONNX shapes trusted); the analysed
shape must equal what onnxruntime actually produces, and symbolic dims must flow by name.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxsat.verification import make_inputs, run_ort

from .helpers_onnx import imported, symbolic_shape

INT64_MAX = 2**63 - 1


def _model(node: onnx.NodeProto, x_dims: list, consts: dict[str, list[int]], opset: int = 18) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in consts.items()]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, x_dims)],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in node.output],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _analysed(model: onnx.ModelProto) -> dict[str, tuple | None]:
    with imported(model) as program:
        return {o: symbolic_shape(program, o) for o in model.graph.node[0].output}


def _check_against_ort(model: onnx.ModelProto) -> None:
    """Every analysed output shape is the shape onnxruntime computes."""
    got = _analysed(model)
    actual = run_ort(model, make_inputs(model, seed=0))
    for name, shape in got.items():
        assert shape is not None, f"{model.graph.node[0].op_type}: no shape for {name}"
        assert shape == actual[name].shape, (name, shape, actual[name].shape)


CASES = {
    "unsqueeze-1": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [2, 3], {"ax": [1]}),
    "unsqueeze-neg": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [2, 3], {"ax": [-1]}),
    "unsqueeze-2": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [2, 3], {"ax": [0, 3]}),
    "unsqueeze-3": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [5], {"ax": [0, 1, 3]}),
    "unsqueeze-scalar": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [], {"ax": [0]}),
    "squeeze-1": (helper.make_node("Squeeze", ["x", "ax"], ["y"]), [2, 1, 3], {"ax": [1]}),
    "squeeze-2-neg": (helper.make_node("Squeeze", ["x", "ax"], ["y"]), [1, 2, 1, 3], {"ax": [0, -2]}),
    "reducemean-keep": (helper.make_node("ReduceMean", ["x", "ax"], ["y"]), [2, 3, 4], {"ax": [-1]}),
    "reducemean-drop": (helper.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=0), [2, 3, 4], {"ax": [0, 2]}),
    "reducesum-all": (helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0), [2, 3, 4], {}),
    "reducesum-all-keep": (helper.make_node("ReduceSum", ["x"], ["y"]), [2, 3, 4], {}),
    "gather-scalar": (helper.make_node("Gather", ["x", "i"], ["y"], axis=1), [2, 3, 4], {}),
    "gather-vector": (helper.make_node("Gather", ["x", "iv"], ["y"], axis=-1), [2, 3, 4], {"iv": [0, 2, 1, 1, 0]}),
    "expand": (helper.make_node("Expand", ["x", "s"], ["y"]), [3, 1], {"s": [2, 1, 4]}),
    "split-sizes": (helper.make_node("Split", ["x", "s"], ["y0", "y1"], axis=1), [2, 5], {"s": [2, 3]}),
    "split-even": (helper.make_node("Split", ["x"], ["y0", "y1", "y2"], axis=-1, num_outputs=3), [2, 6], {}),
    "pad": (helper.make_node("Pad", ["x", "p"], ["y"]), [2, 3], {"p": [0, 1, 2, 3]}),
    "slice-1": (helper.make_node("Slice", ["x", "st", "en"], ["y"]), [6, 4], {"st": [1], "en": [-1]}),
    "slice-axes-steps": (
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"]),
        [6, 7, 8],
        {"st": [0, -5], "en": [INT64_MAX, 100], "ax": [2, 1], "sp": [3, 2]},
    ),
    "reshape-zero-minus-one": (helper.make_node("Reshape", ["x", "s"], ["y"]), [2, 3, 4], {"s": [0, -1]}),
    "reshape-minus-one-first": (helper.make_node("Reshape", ["x", "s"], ["y"]), [2, 3, 4], {"s": [-1, 2, 2]}),
    "maxpool-ceil": (
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        [1, 2, 8, 9],
        {},
    ),
    "averagepool-ceil-pads": (
        helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1),
        [1, 2, 10],
        {},
    ),
    "convtranspose": (
        helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0], group=2),
        [1, 4, 5, 6],
        {},
    ),
    "shape-start-end": (helper.make_node("Shape", ["x"], ["y"], start=1, end=-1), [2, 3, 4, 5], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shape_rule_matches_onnxruntime(case: str) -> None:
    node, dims, consts = CASES[case]
    if node.op_type == "Gather" and "i" in node.input:
        consts = {"i": 2}  # a rank-0 index
        model = _model(node, dims, {})
        model.graph.initializer.append(numpy_helper.from_array(np.array(2, dtype=np.int64), "i"))
    else:
        model = _model(node, dims, consts)
    if node.op_type == "ConvTranspose":
        w = np.ones((4, 3, 3, 2), dtype=np.float32)
        model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    if node.op_type == "Shape":
        model.graph.output[0].type.tensor_type.elem_type = TP.INT64
    _check_against_ort(model)


def test_constant_of_shape_and_matmul_vectors() -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["s"], ["c"]),
        helper.make_node("MatMul", ["v", "x"], ["vx"]),
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TP.FLOAT, [5, 3, 4]),
            helper.make_tensor_value_info("v", TP.FLOAT, [3]),
            helper.make_tensor_value_info("w", TP.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("c", "vx", "xw")],
        initializer=[numpy_helper.from_array(np.array([2, 7], dtype=np.int64), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    with imported(model) as program:
        got = {o: symbolic_shape(program, o) for o in ("c", "vx", "xw")}
    actual = run_ort(model, make_inputs(model, seed=0))
    assert got == {k: v.shape for k, v in actual.items()}


def test_symbolic_dims_flow_through_unsqueeze_gather_and_reshape() -> None:
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Unsqueeze", ["mask", "ax"], ["m4"]),
        helper.make_node("Reshape", ["emb", "s"], ["heads"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", TP.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TP.FLOAT, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("emb", "m4", "heads")],
        initializer=[
            numpy_helper.from_array(np.zeros((10, 8), np.float32), "table"),
            numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "ax"),
            numpy_helper.from_array(np.array([0, 0, 2, 4], dtype=np.int64), "s"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    with imported(model) as program:
        got = {o: symbolic_shape(program, o) for o in ("emb", "m4", "heads")}
    assert got == {
        "emb": ("batch", "seq", 8),
        "m4": ("batch", 1, 1, "seq"),
        "heads": ("batch", "seq", 2, 4),
    }


def test_constness_propagates_through_ops_but_not_from_inputs() -> None:
    from egglog import EGraph, union

    from onnxsat.egraph import lang as L
    from onnxsat.egraph.shapes import shape_rules

    egraph = EGraph()
    w = L.Tensor.weight("w")
    folded = L.concat(L.tlist([w, L.unsqueeze(w, L.Tensor.ints(L.ivec([1]), 1))]), 0)
    live = L.add(L.Tensor.input("x"), w)
    egraph.register(union(L.graph_output(0)).with_(folded), union(L.graph_output(1)).with_(live))
    egraph.run(shape_rules.saturate())
    assert egraph.check_bool(L.is_const(folded))
    assert not egraph.check_bool(L.is_const(live))
