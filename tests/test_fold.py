"""Weight-only subgraphs fold without making the weights larger than the run allows (`Options.fold_growth`)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxsat
from onnxsat.base.modelio import weight_bytes
from onnxsat.egraph.fold import fold_constants


def _model(nodes: list, inits: list, out_dims: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "fold",
        [helper.make_tensor_value_info("x", TP.FLOAT, [4, 512])],
        [helper.make_tensor_value_info("y", TP.FLOAT, out_dims)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_fold_that_frees_its_inputs_is_made() -> None:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32), "w2")
    nodes = [helper.make_node("Add", ["w1", "w2"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = _model(nodes, [w1, w2], [4, 512])
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert [n.op_type for n in out.graph.node] == ["MatMul"]
    assert out.ByteSize() < model.ByteSize()


def test_fold_that_would_bloat_the_file_is_not_made_unless_asked() -> None:
    row = numpy_helper.from_array(np.arange(512, dtype=np.float32).reshape(1, 512), "row")
    shape = numpy_helper.from_array(np.array([2048, 512], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Expand", ["row", "shape"], ["big"]),  # 4 MiB if materialized
        helper.make_node("Transpose", ["big"], ["bt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "bt"], ["y"]),
    ]
    model = _model(nodes, [row, shape], [4, 2048])
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert weight_bytes(out) <= weight_bytes(model)
    assert "Expand" in {n.op_type for n in out.graph.node}
    big, report = onnxsat.optimize(model, onnxsat.Options(materialize_constants=True))
    assert report.verification.status == "passed"
    assert big.ByteSize() > 4 * (1 << 20)
    assert [n.op_type for n in big.graph.node] == ["MatMul"]


def test_uniform_results_stay_constant_of_shape() -> None:
    """Folding over ConstantOfShape weights writes ConstantOfShape back, never the dense values."""
    shape = numpy_helper.from_array(np.array([512, 512], dtype=np.int64), "shape")
    fill = numpy_helper.from_array(np.array([0.5], dtype=np.float32), "value")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"], value=fill),
        helper.make_node("Mul", ["w", "w"], ["w2"]),
        helper.make_node("MatMul", ["x", "w2"], ["y"]),
    ]
    model = _model(nodes, [shape], [4, 512])
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert sorted(n.op_type for n in out.graph.node) == ["ConstantOfShape", "MatMul"]
    assert out.ByteSize() < 4096


def test_a_sequence_is_never_folded_into_a_tensor_initializer() -> None:
    """SequenceEmpty has no inputs, so it looks foldable; its value is a list, not a tensor."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
            helper.make_node("SequenceInsert", ["empty", "x"], ["seq"]),
        ],
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded, _ = fold_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["SequenceEmpty", "SequenceInsert"]
    assert not folded.graph.initializer
    onnx.checker.check_model(folded, full_check=True)


def _tied_embedding(extra_copy: bool = False) -> onnx.ModelProto:
    """GPT-2's tied embedding: the table is gathered for the input and, transposed, is the output
    projection (``extra_copy``: a second, scaled copy feeds another projection)."""
    table = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Transpose", ["table"], ["tt"], perm=[1, 0]),
        helper.make_node("MatMul", ["e", "tt"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, [8, 256])]
    inits = [numpy_helper.from_array(table, "table")]
    if extra_copy:
        nodes[0] = helper.make_node("Gather", ["table2", "ids"], ["e"])
        nodes += [helper.make_node("Mul", ["table", "half"], ["th"]), helper.make_node("MatMul", ["y", "th"], ["z"])]
        inits += [numpy_helper.from_array(table + 1, "table2"), numpy_helper.from_array(np.float32(0.5), "half")]
        outputs.append(helper.make_tensor_value_info("z", TP.FLOAT, [8, 64]))
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TP.INT64, [8])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_transposed_copy_of_a_weight_still_read_elsewhere_stays_a_node() -> None:
    """Folding Transpose(table) would store the table twice (+12% on GPT-2): the Transpose is kept
    over the one table (onnxruntime folds it at load), unless materialized constants are asked for."""
    model = _tied_embedding()
    folded, _ = fold_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["Gather", "Transpose", "MatMul"]
    assert weight_bytes(folded) == weight_bytes(model)
    materialized, _ = fold_constants(model, max_weight_bytes=math.inf)
    assert [n.op_type for n in materialized.graph.node] == ["Gather", "MatMul"]
    assert weight_bytes(materialized) == 2 * weight_bytes(model)
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert weight_bytes(out) <= weight_bytes(model)
    assert not [w for w in report.warnings if "weight bytes" in w]


def test_two_copies_of_a_weight_that_dies_are_not_both_made() -> None:
    """A transposed and a scaled copy of one table, which no other node reads: each copy on its own
    frees the table, together they double it; folding keeps the weights at most as large."""
    model = _tied_embedding(extra_copy=True)
    folded, _ = fold_constants(model)
    assert weight_bytes(folded) <= weight_bytes(model)
    onnx.checker.check_model(folded, full_check=True)


def test_small_growing_folds_fit_in_the_limit_and_the_largest_stays_a_node() -> None:
    """A Range of positions (1 KiB) and an Expand of a row (2 MiB) both make the weights larger:
    within a limit of 2 KiB more, the Range is folded and the Expand is kept over its row; the
    default run (1% + 4 KiB) does the same and its report says by how much the weights grew."""
    row = numpy_helper.from_array(np.arange(256, dtype=np.float32).reshape(1, 256), "row")
    inits = [
        row,
        numpy_helper.from_array(np.array([2048, 256], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array(0.0, np.float32), "start"),
        numpy_helper.from_array(np.array(256.0, np.float32), "limit"),
        numpy_helper.from_array(np.array(1.0, np.float32), "delta"),
    ]
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["positions"]),
        helper.make_node("Add", ["x", "positions"], ["shifted"]),
        helper.make_node("Expand", ["row", "shape"], ["big"]),
        helper.make_node("Transpose", ["big"], ["bt"], perm=[1, 0]),
        helper.make_node("MatMul", ["shifted", "bt"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TP.FLOAT, [4, 256])
    graph = helper.make_graph(nodes, "fold", [x], [helper.make_tensor_value_info("y", TP.FLOAT, [4, 2048])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folded, count = fold_constants(model, max_weight_bytes=weight_bytes(model) + 2048)
    assert count == 1 and [n.op_type for n in folded.graph.node] == ["Add", "Expand", "Transpose", "MatMul"]
    assert weight_bytes(folded) == weight_bytes(model) + 1024 - 12  # the Range's scalars died
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert "Range" not in {n.op_type for n in out.graph.node} and "Expand" in {n.op_type for n in out.graph.node}
    assert [w for w in report.warnings if w.startswith("weight bytes ") and "within --fold-growth" in w]
    _, none_grown = onnxsat.optimize(model, onnxsat.Options(fold_growth=0))
    assert none_grown.nodes_after.get("Range") == 1
