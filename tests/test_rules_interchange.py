"""Prove tests for the interchange family (Concat/Split/Slice across elementwise ops, pooling,
MatMul and Conv), refutations where a guard must hold, and a numeric check through ``optimize``."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxsat.egraph import lang as L
from onnxsat.rules.families import interchange

from .prove import conv, family_prove_tests, ints, optimized_and_verified, refute

F = TensorProto.FLOAT
X, Y, Z, U = (L.Tensor.input(n) for n in ("x", "y", "z", "u"))
A, W, W2, B, B2 = (L.Tensor.weight(n) for n in ("a", "w", "w2", "b", "b2"))
NONE = L.Tensor.none()
CONSTS = ("a", "w", "w2", "b", "b2")


def cat(items: list[L.Tensor], axis: int) -> L.Tensor:
    return L.concat(L.tlist(items), axis)


def pool(x: L.Tensor) -> L.Tensor:
    return L.max_pool(x, L.ivec([2, 2]), L.ivec([2, 2]), L.ivec([0, 0, 0, 0]), L.ivec([1, 1]), 0)


def split(x: L.Tensor, sizes: tuple[int, ...], axis: int, index: int) -> L.Tensor:
    return L.split(x, ints(*sizes), axis, 0, index)


def sliced(x: L.Tensor, start: int, end: int, axis: int) -> L.Tensor:
    return L.slice_(x, ints(start), ints(end), ints(axis), NONE)


ZERO = L.Tensor.splat(0.0, L.ivec([]), F)
SIX = L.Tensor.splat(6.0, L.ivec([]), F)

PROOFS = {
    "concat-binary": (
        cat([L.add(X, Y), L.add(Z, U)], 0),
        L.add(cat([X, Z], 0), cat([Y, U], 0)),
        {"x": (2, 3), "y": (2, 3), "z": (4, 3), "u": (4, 3)},
    ),
    "concat-shared-operand": (
        cat([L.mul(X, A), L.mul(Z, A)], 0),
        L.mul(cat([X, Z], 0), A),
        {"x": (2, 3), "z": (4, 3), "a": (3,)},
    ),
    "concat-clip": (
        cat([L.clip(X, ZERO, SIX), L.clip(Y, ZERO, SIX)], 1),
        L.clip(cat([X, Y], 1), ZERO, SIX),
        {"x": (2, 3), "y": (2, 4)},
    ),
    "concat-softmax": (
        cat([L.softmax(X, 1), L.softmax(Y, 1)], 0),
        L.softmax(cat([X, Y], 0), 1),
        {"x": (2, 3), "y": (4, 3)},
    ),
    "concat-pool": (
        cat([pool(X), pool(Y)], 1),
        pool(cat([X, Y], 1)),
        {"x": (1, 2, 4, 4), "y": (1, 3, 4, 4)},
    ),
    "concat-flatten": (
        cat([cat([X, Y], 0), Z], 0),
        cat([X, Y, Z], 0),
        {"x": (1, 3), "y": (2, 3), "z": (3, 3)},
    ),
    "concat-single": (cat([X], 1), X, {"x": (2, 3)}),
    "split-concat": (split(cat([X, Y], 1), (3, 4), 1, 1), Y, {"x": (2, 3), "y": (2, 4)}),
    "split-single": (split(X, (3,), 1, 0), X, {"x": (2, 3)}),
    "concat-split": (cat([split(X, (1, 2), 1, 0), split(X, (1, 2), 1, 1)], 1), X, {"x": (2, 3)}),
    "slice-concat": (
        sliced(cat([X, Y], 0), 3, 5, 0),
        L.slice_(Y, ints(1), ints(3), ints(0), NONE),
        {"x": (2, 3), "y": (4, 3)},
    ),
    "concat-slices": (
        cat([sliced(X, 0, 1, 1), sliced(X, 1, 3, 1)], 1),
        sliced(X, 0, 3, 1),
        {"x": (2, 4)},
    ),
    "split-unary": (
        L.tanh(split(X, (1, 2), 1, 0)),
        split(L.tanh(X), (1, 2), 1, 0),
        {"x": (2, 3)},
    ),
    "concat-matmul-shared-left": (
        cat([L.matmul(X, W), L.matmul(X, W2)], 1),
        L.matmul(X, cat([W, W2], 1)),
        {"x": (2, 3), "w": (3, 4), "w2": (3, 5)},
    ),
    "concat-matmul-shared-right": (
        cat([L.matmul(X, W), L.matmul(Y, W)], 0),
        L.matmul(cat([X, Y], 0), W),
        {"x": (2, 3), "y": (5, 3), "w": (3, 4)},
    ),
    "matmul-sum-to-concat": (
        L.add(L.matmul(X, Y), L.matmul(Z, U)),
        L.matmul(cat([X, Z], 1), cat([Y, U], 0)),
        {"x": (2, 3), "y": (3, 4), "z": (2, 5), "u": (5, 4)},
    ),
    "concat-conv-batch": (
        cat([conv(X, W), conv(Y, W)], 0),
        conv(cat([X, Y], 0), W),
        {"x": (1, 3, 5, 5), "y": (2, 3, 5, 5), "w": (4, 3, 3, 3)},
    ),
    "concat-conv-channels": (
        cat([conv(X, W, B), conv(X, W2, B2)], 1),
        conv(X, cat([W, W2], 0), cat([B, B2], 0)),
        {"x": (1, 3, 5, 5), "w": (4, 3, 3, 3), "w2": (2, 3, 3, 3), "b": (4,), "b2": (2,)},
    ),
    "concat-conv-grouped": (
        cat([conv(X, W), conv(Y, W2)], 1),
        L.conv(
            cat([X, Y], 1), cat([W, W2], 0), NONE, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 2
        ),
        {"x": (1, 3, 5, 5), "y": (1, 3, 5, 5), "w": (4, 3, 3, 3), "w2": (4, 3, 3, 3)},
    ),
    "conv-sum-to-concat": (
        L.add(conv(X, W), conv(Y, W2)),
        conv(cat([X, Y], 1), cat([W, W2], 1)),
        {"x": (1, 3, 5, 5), "y": (1, 2, 5, 5), "w": (4, 3, 3, 3), "w2": (4, 2, 3, 3)},
    ),
}


test_prove, test_every_rule_has_a_prove_test = family_prove_tests(PROOFS, CONSTS, interchange.RULE_NAMES)


def test_guards_hold() -> None:
    # A shared operand that varies along the concat axis does not move out of the Concat.
    refute(
        cat([L.add(X, Y), L.add(Z, Y)], 0),
        L.add(cat([X, Z], 0), Y),
        {"x": (2, 3), "y": (2, 3), "z": (2, 3)},
        rounds=2,
    )
    # A Slice that straddles both parts of a Concat is not a Slice of one part.
    refute(
        sliced(cat([X, Y], 0), 1, 3, 0),
        sliced(X, 1, 3, 0),
        {"x": (2, 3), "y": (4, 3)},
        rounds=2,
    )
    # Sizes that do not match the parts do not cancel a Split against a Concat.
    refute(split(cat([X, Y], 1), (4, 3), 1, 1), Y, {"x": (2, 3), "y": (2, 4)}, rounds=2)


def test_numeric_concatenated_matmuls_become_one_and_verify() -> None:
    """concat(x@W1 + b1, x@W2 + b2) with relu on both (Q/K-style heads feeding one Concat)."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("MatMul", ["x", "w2"], ["m2"]),
        helper.make_node("Relu", ["m1"], ["r1"]),
        helper.make_node("Relu", ["m2"], ["r2"]),
        helper.make_node("Concat", ["r1", "r2"], ["y"], axis=1),
    ]
    out, report = optimized_and_verified(nodes, inits, [32, 16], [32, 12])
    fired = report.saturation.rule_matches()
    assert fired.get("concat-unary", 0) > 0 and fired.get("concat-matmul-shared-left", 0) > 0
    assert Counter(n.op_type for n in out.graph.node) == Counter({"MatMul": 1, "Relu": 1})
