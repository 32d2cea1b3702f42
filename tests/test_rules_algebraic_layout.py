"""Prove tests for the algebraic, layout and shape-arithmetic families (start => goal), refutations
where a guard must hold, and numeric end-to-end checks through ``optimize``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.rules.families import algebraic, layout

from .prove import prove, refute

F = TensorProto.FLOAT
X, Y, Z = L.Tensor.input("x"), L.Tensor.input("y"), L.Tensor.input("z")
A, B = L.Tensor.weight("a"), L.Tensor.weight("b")
W, W2 = L.Tensor.weight("w"), L.Tensor.weight("w2")
T2 = L.ivec([1, 0])
NONE = L.Tensor.none()


def conv(x: L.Tensor, w: L.Tensor, b: L.Tensor = NONE) -> L.Tensor:
    return L.conv(x, w, b, L.ivec([1, 1]), L.ivec([0, 0, 0, 0]), L.ivec([1, 1]), 1)


PROOFS = {
    "add-const-assoc": (L.add(L.add(X, A), B), L.add(X, L.add(A, B)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "mul-const-assoc": (L.mul(L.mul(X, A), B), L.mul(X, L.mul(A, B)), {"x": (2, 3), "a": (3,), "b": ()}),
    "sub-add-const": (L.add(L.sub(X, A), B), L.add(X, L.sub(B, A)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "div-mul-const": (L.mul(L.div(X, A), B), L.mul(X, L.div(B, A)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "mul-factor": (
        L.add(L.mul(X, Y), L.mul(X, Z)),
        L.mul(X, L.add(Y, Z)),
        {"x": (2, 3), "y": (2, 3), "z": (3,)},
    ),
    "add-neg": (L.add(L.neg(Y), X), L.sub(X, Y), {"x": (2, 3), "y": (2, 3)}),
    "sub-neg": (L.sub(X, L.neg(Y)), L.add(X, Y), {"x": (2, 3), "y": (2, 3)}),
    "neg-mul-neg": (L.mul(L.neg(X), L.neg(Y)), L.mul(X, Y), {"x": (2, 3), "y": (2, 3)}),
    "neg-div-neg": (L.div(L.neg(X), L.neg(Y)), L.div(X, Y), {"x": (2, 3), "y": (2, 3)}),
    "neg-sub": (L.neg(L.sub(X, Y)), L.sub(Y, X), {"x": (2, 3), "y": (2, 3)}),
    "abs-abs": (L.abs_(L.abs_(X)), L.abs_(X), {"x": (2, 3)}),
    "abs-neg": (L.abs_(L.neg(X)), L.abs_(X), {"x": (2, 3)}),
    "relu-difference": (L.sub(L.relu(X), L.relu(L.neg(X))), X, {"x": (2, 3)}),
    "matmul-const-assoc": (
        L.matmul(L.matmul(X, W), W2),
        L.matmul(X, L.matmul(W, W2)),
        {"x": (2, 3), "w": (3, 4), "w2": (4, 5)},
    ),
    "matmul-factor-right": (
        L.add(L.matmul(X, Y), L.matmul(X, Z)),
        L.matmul(X, L.add(Y, Z)),
        {"x": (2, 3), "y": (3, 4), "z": (3, 4)},
    ),
    "matmul-factor-left": (
        L.add(L.matmul(Y, X), L.matmul(Z, X)),
        L.matmul(L.add(Y, Z), X),
        {"x": (3, 4), "y": (2, 3), "z": (2, 3)},
    ),
    "matmul-transposes": (
        L.matmul(L.transpose(Y, T2), L.transpose(X, T2)),
        L.transpose(L.matmul(X, Y), T2),
        {"x": (2, 3), "y": (3, 4)},
    ),
    "gemm-fold-transpose-b": (
        L.gemm(X, L.transpose(W, T2), A, 1.0, 1.0, 0, 0),
        L.gemm(X, W, A, 1.0, 1.0, 0, 1),
        {"x": (2, 3), "w": (4, 3), "a": (4,)},
    ),
    "gemm-fold-transpose-a": (
        L.gemm(L.transpose(X, T2), W, A, 1.0, 1.0, 0, 0),
        L.gemm(X, W, A, 1.0, 1.0, 1, 0),
        {"x": (3, 2), "w": (3, 4), "a": (4,)},
    ),
    "gemm-bias-fold": (
        L.add(L.gemm(X, W, A, 1.0, 1.0, 0, 0), B),
        L.gemm(X, W, L.add(A, B), 1.0, 1.0, 0, 0),
        {"x": (2, 3), "w": (3, 4), "a": (4,), "b": (1, 4)},
    ),
    "conv-mul-fold": (
        L.mul(conv(X, W, A), B),
        conv(
            X,
            L.mul(W, L.reshape(B, L.Tensor.ints(L.ivec([4, 1, 1, 1]), 1), 0)),
            L.mul(A, L.reshape(B, L.Tensor.ints(L.ivec([4]), 1), 0)),
        ),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3), "a": (4,), "b": (4, 1, 1)},
    ),
    "conv-add-fold": (
        L.add(conv(X, W), B),
        conv(X, W, L.reshape(B, L.Tensor.ints(L.ivec([4]), 1), 0)),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3), "b": (1, 4, 1, 1)},
    ),
    "conv-weight-sum": (
        L.add(conv(X, W), conv(X, W2)),
        conv(X, L.add(W, W2)),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3), "w2": (4, 3, 3, 3)},
    ),
    "conv-input-sum": (
        L.add(conv(X, W), conv(Y, W)),
        conv(L.add(X, Y), W),
        {"x": (1, 3, 5, 5), "y": (1, 3, 5, 5), "w": (4, 3, 3, 3)},
    ),
    "transpose-sink-unary": (
        L.transpose(L.relu(L.transpose(X, L.ivec([0, 2, 1]))), L.ivec([0, 2, 1])),
        L.relu(X),
        {"x": (2, 3, 4)},
    ),
    "transpose-sink-binary": (
        L.add(L.transpose(X, T2), L.transpose(Y, T2)),
        L.transpose(L.add(X, Y), T2),
        {"x": (2, 3), "y": (1, 3)},
    ),
    "transpose-sink-scalar": (
        L.mul(L.Tensor.splat(2.0, L.ivec([]), F), L.transpose(X, T2)),
        L.transpose(L.mul(L.Tensor.splat(2.0, L.ivec([]), F), X), T2),
        {"x": (2, 3)},
    ),
    "concat-unary": (
        L.concat(L.tlist([L.sigmoid(X), L.sigmoid(Y)]), 1),
        L.sigmoid(L.concat(L.tlist([X, Y]), 1)),
        {"x": (2, 3), "y": (2, 4)},
    ),
    "view-view-to-reshape": (
        L.squeeze(L.flatten(X, 1), L.Tensor.ints(L.ivec([0]), 1)),
        L.reshape(X, L.Tensor.ints(L.ivec([12]), 1), 0),
        {"x": (1, 3, 4)},
    ),
    "view-noop": (
        L.unsqueeze(L.squeeze(X, L.Tensor.ints(L.ivec([1]), 1)), L.Tensor.ints(L.ivec([1]), 1)),
        X,
        {"x": (2, 1, 3)},
    ),
    "cast-same": (L.cast(X, F), X, {"x": (2, 3)}),
    "pad-into-conv": (
        conv(L.pad(X, L.Tensor.ints(L.ivec([0, 0, 1, 2, 0, 0, 1, 2]), 1), NONE, NONE, "constant"), W),
        L.conv(X, W, NONE, L.ivec([1, 1]), L.ivec([1, 2, 1, 2]), L.ivec([1, 1]), 1),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3)},
    ),
    "pad-into-avgpool": (
        L.average_pool(
            L.pad(
                X,
                L.Tensor.ints(L.ivec([0, 0, 1, 1, 0, 0, 1, 1]), 1),
                L.Tensor.splat(0.0, L.ivec([]), F),
                NONE,
                "constant",
            ),
            L.ivec([3, 3]),
            L.ivec([1, 1]),
            L.ivec([0, 0, 0, 0]),
            0,
            1,
        ),
        L.average_pool(X, L.ivec([3, 3]), L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), 0, 1),
        {"x": (1, 3, 5, 5)},
    ),
    "pad-noop": (L.pad(X, L.Tensor.ints(L.ivec([0, 0, 0, 0]), 1), NONE, NONE, "constant"), X, {"x": (2, 3)}),
    "pad-pad": (
        L.pad(L.pad(X, L.Tensor.ints(L.ivec([1, 0, 0, 0]), 1), NONE, NONE, "constant"), L.Tensor.ints(L.ivec([0, 0, 0, 2]), 1), NONE, NONE, "constant"),
        L.pad(X, L.Tensor.ints(L.ivec([1, 0, 0, 2]), 1), NONE, NONE, "constant"),
        {"x": (2, 3)},
    ),
    "gather-const-ints": (
        L.gather(L.shape_of(X, 0, 2**63 - 1), L.Tensor.ints(L.ivec([-1]), 0), 0),
        L.Tensor.ints(L.ivec([4]), 0),
        {"x": (2, 3, 4)},
    ),
    "unsqueeze-const-ints": (
        L.unsqueeze(L.Tensor.ints(L.ivec([7]), 0), L.Tensor.ints(L.ivec([0]), 1)),
        L.Tensor.ints(L.ivec([7]), 1),
        {},
    ),
    "concat-const-ints": (
        L.concat(L.tlist([L.Tensor.ints(L.ivec([2]), 1), L.Tensor.ints(L.ivec([3, 4]), 1)]), 0),
        L.Tensor.ints(L.ivec([2, 3, 4]), 1),
        {},
    ),
    "cast-const-ints": (L.cast(L.Tensor.ints(L.ivec([5]), 0), 7), L.Tensor.ints(L.ivec([5]), 0), {}),
    "int-arith-const": (
        L.mul(L.Tensor.ints(L.ivec([6]), 0), L.Tensor.ints(L.ivec([7]), 0)),
        L.Tensor.ints(L.ivec([42]), 0),
        {},
    ),
    "add-sub-const": (L.sub(L.add(X, A), B), L.add(X, L.sub(A, B)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "sub-sub-const": (L.sub(L.sub(X, A), B), L.sub(X, L.add(A, B)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "mul-div-const": (L.div(L.mul(X, A), B), L.mul(X, L.div(A, B)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "div-div-const": (L.div(L.div(X, A), B), L.div(X, L.mul(A, B)), {"x": (2, 3), "a": (3,), "b": (3,)}),
    "mul-add-const-distribute": (
        L.mul(L.add(X, A), B),
        L.add(L.mul(X, B), L.mul(A, B)),
        {"x": (2, 3), "a": (3,), "b": (3,)},
    ),
    "sub-const-to-add": (L.sub(X, A), L.add(X, L.neg(A)), {"x": (2, 3), "a": (3,)}),
    "div-const-to-mul": (L.div(X, A), L.mul(X, L.reciprocal(A)), {"x": (2, 3), "a": (3,)}),
    "mul-const-commute": (L.mul(A, X), L.mul(X, A), {"x": (2, 3), "a": (3,)}),
    "add-const-commute": (L.add(A, X), L.add(X, A), {"x": (2, 3), "a": (3,)}),
    "add-self": (L.add(X, X), L.mul(X, L.Tensor.splat(2.0, L.ivec([]), F)), {"x": (2, 3)}),
    "relu-nonnegative": (L.relu(L.sigmoid(X)), L.sigmoid(X), {"x": (2, 3)}),
    "depthwise-conv-nchwc": (
        L.conv(X, W, NONE, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 16),
        L.conv(L.reorder_nchwc(X), W, NONE, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 16),
        {"x": (1, 16, 7, 7), "w": (16, 1, 3, 3)},
    ),
    "reorder-nchwc-idempotent": (L.reorder_nchwc(L.reorder_nchwc(X)), L.reorder_nchwc(X), {"x": (1, 16, 7, 7)}),
}
CONSTS = ("a", "b", "w", "w2")


@pytest.mark.parametrize("rule", sorted(PROOFS))
def test_prove(rule: str) -> None:
    start, goal, shapes = PROOFS[rule]
    prove(start, goal, shapes, CONSTS)


def test_every_rule_has_a_prove_test() -> None:
    assert set(algebraic.RULE_NAMES) | set(layout.RULE_NAMES) <= set(PROOFS)


def test_guards_hold() -> None:
    # Constant folding needs constants.
    refute(L.add(L.add(X, Y), Z), L.add(X, L.add(Y, Z)), {"x": (2, 3), "y": (3,), "z": (3,)})
    # Division by a float16 constant stays a division (x * (1/c) rounds differently there).
    refute(L.div(X, A), L.mul(X, L.reciprocal(A)), {"x": (2, 3), "a": (3,)}, CONSTS, {"x": TensorProto.FLOAT16, "a": TensorProto.FLOAT16})
    # A dense conv (or one of several input channels per group) keeps its input's layout.
    refute(conv(X, W), L.conv(L.reorder_nchwc(X), W, NONE, L.ivec([1, 1]), L.ivec([0, 0, 0, 0]), L.ivec([1, 1]), 1), {"x": (1, 16, 7, 7), "w": (8, 16, 1, 1)}, CONSTS)
    # Cast to another type stays.
    refute(L.cast(X, TensorProto.DOUBLE), X, {"x": (2, 3)})
    # A non-zero pad value does not fold into a Conv.
    refute(
        conv(
            L.pad(
                X,
                L.Tensor.ints(L.ivec([0, 0, 1, 1, 0, 0, 1, 1]), 1),
                L.Tensor.splat(1.0, L.ivec([]), F),
                NONE,
                "constant",
            ),
            W,
        ),
        L.conv(X, W, NONE, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 1),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3)},
        CONSTS,
    )
    # A per-channel scale of the wrong shape does not fold into a Conv.
    refute(
        L.mul(conv(X, W), B),
        conv(X, L.mul(W, L.reshape(B, L.Tensor.ints(L.ivec([4, 1, 1, 1]), 1), 0))),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3), "b": (1, 1, 3, 1)},
        CONSTS,
    )


def test_numeric_batchnorm_decomposition_folds_into_conv() -> None:
    """Conv -> Add(c) -> Mul(s) (a BatchNorm written out, as densenet's light model does) is one Conv."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "shift"),
        numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "shift"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert Counter(n.op_type for n in out.graph.node) == Counter({"Conv": 1})


def test_numeric_shape_chain_folds_to_constant_reshape() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape over known dims becomes one Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["d0v"]),
        helper.make_node("Concat", ["d0v", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "i0"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "ax"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "rest"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [2, 3, 4])],
        [helper.make_tensor_value_info("y", F, [2, 12])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert [n.op_type for n in out.graph.node] == ["Reshape"]
    assert onnx.numpy_helper.to_array(out.graph.initializer[0]).tolist() in ([2, 12], [2, -1])
