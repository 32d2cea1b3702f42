"""Prove tests for the linear family (transposes of products, MatMul associativity, scales,
shifts and negations folded into MatMul/Gemm/Conv weights), a refutation, and a numeric check
through ``optimize``."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxsat.egraph import lang as L
from onnxsat.rules.families import linear

from .prove import conv, family_prove_tests, ints, optimized_and_verified, refute

F = TensorProto.FLOAT
X, Y, Z = (L.Tensor.input(n) for n in ("x", "y", "z"))
A, W, B, M, V = (L.Tensor.weight(n) for n in ("a", "w", "b", "m", "v"))
NONE = L.Tensor.none()
CONSTS = ("a", "w", "b", "m", "v")
T2 = L.ivec([1, 0])


def gemm(x: L.Tensor, w: L.Tensor, c: L.Tensor, trans_b: int = 0) -> L.Tensor:
    return L.gemm(x, w, c, 1.0, 1.0, 0, trans_b)


_factor = L.div(A, L.sqrt(L.add(V, L.Tensor.splat(1e-5, L.ivec([]), F))))

PROOFS = {
    "transpose-matmul": (
        L.transpose(L.matmul(X, W), T2),
        L.matmul(L.transpose(W, T2), L.transpose(X, T2)),
        {"x": (2, 3), "w": (3, 4)},
    ),
    "gemm-transpose-out": (
        L.transpose(gemm(X, W, NONE), T2),
        L.gemm(W, X, NONE, 1.0, 1.0, 1, 1),
        {"x": (2, 3), "w": (3, 4)},
    ),
    "matmul-assoc": (
        L.matmul(L.matmul(X, Y), Z),
        L.matmul(X, L.matmul(Y, Z)),
        {"x": (2, 3), "y": (3, 4), "z": (4, 5)},
    ),
    "matmul-input-scale-fold": (
        L.matmul(L.mul(X, A), W),
        L.matmul(X, L.mul(W, L.reshape(A, ints(3, 1), 0))),
        {"x": (2, 3), "a": (3,), "w": (3, 4)},
    ),
    "matmul-output-scale-fold": (
        L.mul(L.matmul(X, W), A),
        L.matmul(X, L.mul(W, A)),
        {"x": (2, 3), "a": (4,), "w": (3, 4)},
    ),
    "matmul-input-shift-fold": (
        L.matmul(L.add(X, A), W),
        L.add(L.matmul(X, W), L.matmul(L.reshape(A, ints(3), 0), W)),
        {"x": (2, 3), "a": (3,), "w": (3, 4)},
    ),
    "gemm-mul-fold": (
        L.mul(gemm(X, W, B, 1), A),
        gemm(X, L.mul(W, L.reshape(A, ints(4, 1), 0)), L.mul(B, L.reshape(A, ints(4), 0)), 1),
        {"x": (2, 3), "w": (4, 3), "b": (4,), "a": (4,)},
    ),
    "gemm-input-scale-fold": (
        gemm(L.mul(X, A), W, B, 1),
        gemm(X, L.mul(W, L.reshape(A, ints(3), 0)), B, 1),
        {"x": (2, 3), "a": (3,), "w": (4, 3), "b": (4,)},
    ),
    "gemm-input-shift-fold": (
        gemm(L.add(X, A), W, B),
        gemm(X, W, L.add(B, L.matmul(L.reshape(A, ints(3), 0), W))),
        {"x": (2, 3), "a": (3,), "w": (3, 4), "b": (4,)},
    ),
    "conv-input-shift-fold": (
        L.conv(L.add(X, A), W, NONE, L.ivec([1, 1]), L.ivec([0, 0, 0, 0]), L.ivec([1, 1]), 1),
        L.conv(
            X,
            W,
            L.reduce_sum(L.mul(W, L.reshape(A, ints(1, 3, 1, 1), 0)), ints(1, 2, 3), 0, 0),
            L.ivec([1, 1]),
            L.ivec([0, 0, 0, 0]),
            L.ivec([1, 1]),
            1,
        ),
        {"x": (1, 3, 5, 5), "a": (1, 3, 1, 1), "w": (4, 3, 3, 3)},
    ),
    "conv-input-scale-fold": (
        conv(L.mul(X, A), W),
        conv(X, L.mul(W, L.reshape(A, ints(1, 3, 1, 1), 0))),
        {"x": (1, 3, 5, 5), "a": (1, 3, 1, 1), "w": (4, 3, 3, 3)},
    ),
    "neg-into-weights": (L.matmul(L.neg(X), W), L.matmul(X, L.neg(W)), {"x": (2, 3), "w": (3, 4)}),
    "batchnorm-to-affine": (
        L.batch_norm(X, A, B, M, V, 1e-5),
        L.add(L.mul(X, L.reshape(_factor, ints(3), 0)), L.reshape(L.sub(B, L.mul(M, _factor)), ints(3), 0)),
        {"x": (4, 3), "a": (3,), "b": (3,), "m": (3,), "v": (3,)},
    ),
}


test_prove, test_every_rule_has_a_prove_test = family_prove_tests(PROOFS, CONSTS, linear.RULE_NAMES)


def test_guards_hold() -> None:
    # A scale that varies per row (not per input feature) does not fold into the weight.
    refute(
        L.matmul(L.mul(X, A), W),
        L.matmul(X, L.mul(W, L.reshape(A, ints(3, 1), 0))),
        {"x": (3, 3), "a": (3, 1), "w": (3, 4)},
        CONSTS,
        rounds=2,
    )
    # A scale of activations (not a weight) does not fold.
    refute(
        L.mul(L.matmul(X, W), Y),
        L.matmul(X, L.mul(W, Y)),
        {"x": (2, 3), "w": (3, 4), "y": (4,)},
        CONSTS,
        rounds=2,
    )


def test_numeric_layernorm_affine_folds_into_the_projection() -> None:
    """(x * gamma + beta) @ W + c, then * s: the affine ops and the scale fold into one Gemm."""
    rng = np.random.default_rng(11)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((6,)).astype(np.float32), "c"),
        numpy_helper.from_array(rng.standard_normal((6,)).astype(np.float32), "s"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["o"]),
        helper.make_node("Mul", ["o", "s"], ["y"]),
    ]
    out, report = optimized_and_verified(nodes, inits, [4, 8], [4, 6])
    fired = report.saturation.rule_matches()
    assert fired.get("matmul-input-scale-fold", 0) > 0 and fired.get("matmul-input-shift-fold", 0) > 0
    assert Counter(n.op_type for n in out.graph.node) == Counter({"Gemm": 1})
