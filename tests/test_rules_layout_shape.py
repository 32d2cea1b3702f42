"""Prove tests (start => goal under fixed budgets) for the transpose, view, shape-folding, reduction
and dtype rules, refutations where a guard must hold, and numeric checks through ``optimize``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.rules.families import dtype, reduce, shape_fold, transpose, views

from .prove import prove, refute

F, F16, D, I64, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
MAX = 2**63 - 1
X, Y = L.Tensor.input("x"), L.Tensor.input("y")
A = L.Tensor.weight("a")
NONE = L.Tensor.none()
T2 = L.ivec([1, 0])
UNHURRIED = onnxsat.Options(budgets=onnxsat.Budgets(seconds=600.0))
"""Iteration budgets only: what the rules reach must not depend on how loaded the machine is."""


def ints(*values: int, rank: int = 1) -> L.Tensor:
    return L.Tensor.ints(L.ivec(list(values)), rank)


def splat(value: float, dims: tuple[int, ...] = ()) -> L.Tensor:
    return L.Tensor.splat(value, L.ivec(list(dims)), F)


def dim_of(src: L.Tensor, index: int) -> L.Tensor:
    return L.unsqueeze(L.gather(L.shape_of(src, 0, MAX), ints(index, rank=0), 0), ints(0))


PROOFS: dict[str, tuple[L.Tensor, L.Tensor, dict[str, tuple[int, ...]]]] = {
    # ---------------------------------------------------------------- transpose.py
    "transpose-sink-softmax": (
        L.softmax(L.transpose(X, T2), 1),
        L.transpose(L.softmax(X, 0), T2),
        {"x": (2, 3)},
    ),
    "transpose-sink-reduce": (
        L.reduce_mean(L.transpose(X, L.ivec([0, 2, 1])), ints(-1), 1, 0),
        L.transpose(L.reduce_mean(X, ints(1), 1, 0), L.ivec([0, 2, 1])),
        {"x": (2, 3, 4)},
    ),
    "transpose-sink-concat": (
        L.concat(L.tlist([L.transpose(X, T2), L.transpose(Y, T2)]), 0),
        L.transpose(L.concat(L.tlist([X, Y]), 1), T2),
        {"x": (2, 3), "y": (2, 4)},
    ),
    "transpose-sink-split": (
        L.split(L.transpose(X, T2), ints(1, 2), 0, 0, 1),
        L.transpose(L.split(X, ints(1, 2), 1, 0, 1), T2),
        {"x": (4, 3)},
    ),
    "transpose-sink-slice": (
        L.slice_(L.transpose(X, T2), ints(1), ints(3), ints(0), NONE),
        L.transpose(L.slice_(X, ints(1), ints(3), ints(1), NONE), T2),
        {"x": (2, 4)},
    ),
    # NHWC round trip around a bias add: both transposes cancel, the bias is transposed (folds).
    "transpose-sink-binary-const": (
        L.transpose(L.add(L.transpose(X, L.ivec([0, 2, 3, 1])), A), L.ivec([0, 3, 1, 2])),
        L.add(X, L.transpose(A, L.ivec([0, 3, 1, 2]))),
        {"x": (1, 3, 4, 5), "a": (1, 1, 1, 3)},
    ),
    "transpose-sink-pad": (
        L.pad(L.transpose(X, T2), ints(1, 0, 0, 2), NONE, NONE, "constant"),
        L.transpose(L.pad(X, ints(0, 1, 2, 0), NONE, NONE, "constant"), T2),
        {"x": (2, 3)},
    ),
    "transpose-to-reshape": (L.transpose(X, L.ivec([1, 0, 2])), L.reshape(X, ints(3, 1, 4), 0), {"x": (1, 3, 4)}),
    # dynamo's k^T for attention scores: flatten [B, H] to one dim, swap the last two, unflatten.
    "transpose-through-batch-merge": (
        L.reshape(L.transpose(L.reshape(X, ints(6, 5, 4), 0), L.ivec([0, 2, 1])), ints(3, 2, 4, 5), 0),
        L.transpose(X, L.ivec([0, 1, 3, 2])),
        {"x": (3, 2, 5, 4)},
    ),
    # ---------------------------------------------------------------- views.py (symbolic dims: -1, -2)
    "reshape-sink-unary": (
        L.relu(L.reshape(X, ints(6), 0)),
        L.reshape(L.relu(X), ints(6), 0),
        {"x": (2, 3)},
    ),
    "reshape-sink-binary": (
        L.add(L.reshape(X, ints(-1), 0), L.reshape(Y, ints(-1), 0)),
        L.reshape(L.add(X, Y), ints(-1), 0),
        {"x": (-1, 3), "y": (-1, 3)},
    ),
    # The attention round trip [B,S,H*D] -> [B,S,H,D] -> [B,S,H*D] with a symbolic batch and length.
    "reshape-absorbs-view": (
        L.reshape(L.reshape(X, ints(0, 0, 2, 4), 0), ints(-1, 8), 0),
        L.reshape(X, ints(-1, 8), 0),
        {"x": (-1, -2, 8)},
    ),
    "squeeze-unsqueeze-cancel": (L.squeeze(L.unsqueeze(X, ints(1)), ints(1)), X, {"x": (-1, 3)}),
    "unsqueeze-unsqueeze": (
        L.unsqueeze(L.unsqueeze(X, ints(1)), ints(0)),
        L.unsqueeze(X, ints(0, 2)),
        {"x": (-1, 3)},
    ),
    "squeeze-squeeze": (
        L.squeeze(L.squeeze(X, ints(1)), ints(1)),
        L.squeeze(X, ints(1, 2)),
        {"x": (-1, 1, 1, 3)},
    ),
    "reshape-identity-target": (L.reshape(X, ints(0, 0, -1), 0), X, {"x": (-1, -2, 8)}),
    "slice-noop": (L.slice_(X, ints(0), ints(MAX), ints(1), NONE), X, {"x": (-1, 3)}),
    "slice-slice": (
        L.slice_(L.slice_(X, ints(1), ints(5), ints(0), NONE), ints(1), ints(3), ints(0), NONE),
        L.slice_(X, ints(2), ints(4), ints(0), NONE),
        {"x": (6, 3)},
    ),
    "expand-noop": (L.expand(X, ints(2, 3)), X, {"x": (2, 3)}),
    "expand-expand": (
        L.expand(L.expand(X, ints(3, 1)), ints(2, 1, 4)),
        L.expand(X, ints(2, 3, 4)),
        {"x": (1, 1)},
    ),
    "expand-elim-broadcast": (
        L.add(L.expand(X, ints(2, 4, 3)), Y),
        L.add(X, Y),
        {"x": (1, 4, 3), "y": (2, 4, 3)},
    ),
    "view-of-splat": (L.reshape(splat(1.0, (6,)), ints(2, 3), 0), splat(1.0, (2, 3)), {}),
    "concat-single-elim": (L.concat(L.tlist([X]), 0), X, {"x": (-1, 3)}),
    "split-single-elim": (L.split(X, ints(3), 1, 0, 0), X, {"x": (-1, 3)}),
    # ---------------------------------------------------------------- shape_fold.py
    "gather-shape-known-dim": (L.gather(L.shape_of(X, 0, MAX), ints(1, rank=0), 0), ints(3, rank=0), {"x": (-1, 3)}),
    "shape-range-of-known": (L.shape_of(X, 1, MAX), ints(3, 4), {"x": (-1, 3, 4)}),
    "slice-const-ints": (L.slice_(ints(2, 3, 4), ints(1), ints(MAX), NONE, NONE), ints(3, 4), {}),
    "squeeze-const-ints": (L.squeeze(ints(5), NONE), ints(5, rank=0), {}),
    "reshape-const-ints": (L.reshape(ints(5, rank=0), ints(1), 0), ints(5), {}),
    "constant-of-shape-const": (L.constant_of_shape(ints(2, 3), 1.0, F), splat(1.0, (2, 3)), {}),
    "reshape-known-target": (L.reshape(X, ints(0, -1), 0), L.reshape(X, ints(2, 12), 0), {"x": (2, 3, 4)}),
    "expand-known-target": (L.expand(X, ints(1, 3)), L.expand(X, ints(2, 3)), {"x": (2, 3)}),
    # x.view(x.size(0), -1) with a symbolic batch: the Shape chain becomes the literal [0, -1].
    "reshape-target-copied-dims": (
        L.reshape(X, L.concat(L.tlist([dim_of(X, 0), ints(-1)]), 0), 0),
        L.reshape(X, ints(0, -1), 0),
        {"x": (-1, 3, 4)},
    ),
    # ---------------------------------------------------------------- reduce.py
    "reduce-unit-axes-elim": (L.reduce_sum(X, ints(1), 0, 0), L.squeeze(X, ints(1)), {"x": (-1, 1, 3)}),
    "reduce-mean-mean": (
        L.reduce_mean(L.reduce_mean(X, ints(1), 1, 0), ints(2), 1, 0),
        L.reduce_mean(X, ints(1, 2), 1, 0),
        {"x": (2, 3, 4)},
    ),
    "reduce-sum-sum": (
        L.reduce_sum(L.reduce_sum(X, ints(-1), 1, 0), ints(0), 1, 0),
        L.reduce_sum(X, ints(-1, 0), 1, 0),
        {"x": (2, 3, 4)},
    ),
    "reduce-max-max": (
        L.reduce_max(L.reduce_max(X, ints(0), 1, 0), ints(1), 1, 0),
        L.reduce_max(X, ints(0, 1), 1, 0),
        {"x": (2, 3)},
    ),
    "reduce-scalar-hoist": (
        L.reduce_sum(L.mul(X, splat(0.5)), ints(1), 1, 0),
        L.mul(L.reduce_sum(X, ints(1), 1, 0), splat(0.5)),
        {"x": (2, 3)},
    ),
    "reduce-mean-to-global-pool": (L.reduce_mean(X, ints(2, 3), 1, 0), L.global_average_pool(X), {"x": (1, 2, 3, 4)}),
    # ---------------------------------------------------------------- dtype.py
    "cast-cast-lossless": (L.cast(L.cast(X, D), F), X, {"x": (2, 3)}),
}


@pytest.mark.parametrize("rule", sorted(PROOFS))
def test_prove(rule: str) -> None:
    start, goal, shapes = PROOFS[rule]
    prove(start, goal, shapes, ("a",))


def test_every_rule_has_a_prove_test() -> None:
    mine = transpose.RULE_NAMES + views.RULE_NAMES + shape_fold.RULE_NAMES + reduce.RULE_NAMES + dtype.RULE_NAMES
    assert set(mine) <= set(PROOFS)


def test_guards_hold() -> None:
    # A transpose that moves a non-1 axis past another is not a reshape.
    refute(L.transpose(X, L.ivec([1, 0, 2])), L.reshape(X, ints(3, 2, 4), 0), {"x": (2, 3, 4)})
    # Narrowing casts are not exact: float -> float16 -> float and int64 -> float -> int64 stay.
    refute(L.cast(L.cast(X, F16), F), X, {"x": (2, 3)})
    refute(L.cast(L.cast(X, F), I64), X, {"x": (2, 3)}, dtypes={"x": I64})
    # sum(x * s) keeps its order in float16 (the unscaled sum could overflow).
    refute(
        L.reduce_sum(L.mul(X, L.Tensor.splat(0.5, L.ivec([]), F16)), ints(1), 1, 0),
        L.mul(L.reduce_sum(X, ints(1), 1, 0), L.Tensor.splat(0.5, L.ivec([]), F16)),
        {"x": (2, 3)},
        dtypes={"x": F16},
    )
    # An Expand that adds a dim the other operand lacks is needed.
    refute(L.add(L.expand(X, ints(2, 1, 3)), Y), L.add(X, Y), {"x": (1, 1, 3), "y": (1, 1, 3)})
    # A Reshape whose literal target copies a dim (0) of the view under it keeps the view.
    refute(L.reshape(L.unsqueeze(X, ints(0)), ints(0, -1), 0), L.reshape(X, ints(0, -1), 0), {"x": (2, 3)})
    # The copied dim must be the same dim: x's dim 1 is not its dim 0.
    refute(
        L.reshape(X, L.concat(L.tlist([dim_of(X, 1), ints(-1)]), 0), 0),
        L.reshape(X, ints(0, -1), 0),
        {"x": (-1, -2, 4)},
    )


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_numeric_attention_reshape_round_trip_with_symbolic_batch() -> None:
    """x.view(B, S, H, D).transpose(1, 2) -> relu -> transpose(1, 2) -> view(B, S, H*D) with B and S
    read from Shape: everything cancels to one Relu, with a symbolic batch and sequence length."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, dtype=np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["bv"]),
        helper.make_node("Unsqueeze", ["n", "ax"], ["nv"]),
        helper.make_node("Concat", ["bv", "nv", "hd"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["x", "split_shape"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["t1"], perm=[0, 2, 1, 3]),
        helper.make_node("Relu", ["t1"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t2"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["bv", "nv", "m1"], ["merge_shape"], axis=0),
        helper.make_node("Reshape", ["t2", "merge_shape"], ["y"]),
    ]
    inits = [i64("i0", 0), i64("i1", 1), i64("ax", [0]), i64("hd", [2, 4]), i64("m1", [-1])]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["B", "S", 8])],
        [helper.make_tensor_value_info("y", F, ["B", "S", 8])],
        inits,
    )
    out, report = onnxsat.optimize(model, UNHURRIED)
    assert report.verification.status == "passed"
    assert Counter(n.op_type for n in out.graph.node) == Counter({"Relu": 1})


def test_numeric_nhwc_round_trip_with_bias() -> None:
    """NCHW -> NHWC, add a per-channel bias, back to NCHW: the two transposes cancel."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Transpose", ["x"], ["nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("Add", ["nhwc", "bias"], ["biased"]),
        helper.make_node("Transpose", ["biased"], ["y"], perm=[0, 3, 1, 2]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 3, 4, 5])],
        [helper.make_tensor_value_info("y", F, [1, 3, 4, 5])],
        [numpy_helper.from_array(rng.standard_normal((1, 1, 1, 3)).astype(np.float32), "bias")],
    )
    out, report = onnxsat.optimize(model, UNHURRIED)
    assert report.verification.status == "passed"
    assert Counter(n.op_type for n in out.graph.node) == Counter({"Add": 1})
