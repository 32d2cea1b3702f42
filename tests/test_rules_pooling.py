"""Separable pooling (rules/families/pooling.py): proved in the e-graph, kept off small windows, chosen on a
large MaxPool and equal to the original on onnxruntime; wrong separations fail verification."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from egglog import Vec, i64
from onnx import helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.rules.families import pooling
from onnxsat.rules.pet.partial_models import site_model
from onnxsat.rules.registry import RuleTable, rewrite_rule
from onnxsat.rules.verification.verify import RuleVerifier

from .prove import prove, refute

X = L.Tensor.input("x")
SHAPES = {"x": (1, 2, 11, 10)}


def _max(t: L.Tensor, kernel: list[int], strides: list[int], pads: list[int]) -> L.Tensor:
    return L.max_pool(t, L.ivec(kernel), L.ivec(strides), L.ivec(pads), L.ivec([1, 1]), 0)


def _avg(t: L.Tensor, kernel: list[int], strides: list[int], pads: list[int], cip: int) -> L.Tensor:
    return L.average_pool(t, L.ivec(kernel), L.ivec(strides), L.ivec(pads), 0, cip)


def test_prove_pool_separable() -> None:
    """Each pass takes its own axis's stride and begin/end pads (unequal here)."""
    start = _max(X, [7, 5], [2, 1], [3, 1, 2, 4])
    prove(start, _max(_max(X, [7, 1], [2, 1], [3, 0, 2, 0]), [1, 5], [1, 1], [0, 1, 0, 4]), SHAPES, rounds=1)
    start = _avg(X, [5, 6], [1, 2], [2, 0, 1, 3], 1)
    prove(start, _avg(_avg(X, [5, 1], [1, 1], [2, 0, 1, 0], 1), [1, 6], [1, 2], [0, 0, 0, 3], 1), SHAPES, rounds=1)


def test_small_windows_stay_whole() -> None:
    """A 3 x 5 window is below the measured threshold on one side: no separation."""
    start = _max(X, [3, 5], [1, 1], [1, 2, 1, 2])
    refute(start, _max(_max(X, [3, 1], [1, 1], [1, 0, 1, 0]), [1, 5], [1, 1], [0, 2, 0, 2]), SHAPES, rounds=1)


def test_large_maxpool_is_separated_and_matches_onnxruntime() -> None:
    """A 13 x 13 MaxPool (a YOLO SPP pyramid's largest, here with a stride and unequal pads) is
    cheaper as two passes under the built-in cost model; the written model equals the original."""
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[13, 13], strides=[1, 2], pads=[6, 5, 6, 7])
    model = site_model([node], {"x": [1, 32, 20, 20]}, {"y": [1, 32, 20, 10]}, {})
    out, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("pool-separable",)))
    assert report.verification.status == "passed"
    pools = [(n.op_type, {a.name: list(a.ints) for a in n.attribute}) for n in out.graph.node]
    assert pools == [
        ("MaxPool", {"kernel_shape": [13, 1], "strides": [1, 1], "pads": [6, 0, 6, 0], "dilations": [1, 1]}),
        ("MaxPool", {"kernel_shape": [1, 13], "strides": [1, 2], "pads": [0, 5, 0, 7], "dilations": [1, 1]}),
    ], pools
    x = np.random.default_rng(0).standard_normal((1, 32, 20, 20)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x}) for m in (model, out))
    np.testing.assert_array_equal(got[0], want[0])


def test_wrong_separations_fail_verification() -> None:
    """Rules like pool-separable with one slip each (the column pass's end pad taken from its begin
    pad; the row pass's divisor convention flipped) are caught on the rule's own instances."""
    x, kernel, strides, pads, cip = pooling.x, pooling.kernel, pooling.strides, pooling.pads, pooling.cip
    one, zero = i64(1), i64(0)
    row = (Vec(one, kernel[1]), Vec(one, strides[1]), Vec(zero, pads[1], zero, pads[3]))
    column = (Vec(kernel[0], one), Vec(strides[0], one), Vec(pads[0], zero, pads[2], zero))
    table = RuleTable()
    slip = (Vec(kernel[0], one), Vec(strides[0], one), Vec(pads[0], zero, pads[0], zero))
    lhs = L.max_pool(x, kernel, strides, pads, pooling.dil, zero)
    rhs = L.max_pool(L.max_pool(x, *slip, Vec(one, one), zero), *row, Vec(one, one), zero)
    rewrite_rule(table, "bad", "bad-pad", lhs, rhs, *pooling._GUARDS)
    lhs = L.average_pool(x, kernel, strides, pads, zero, cip)
    rhs = L.average_pool(L.average_pool(x, *column, zero, cip), *row, zero, one - cip)
    rewrite_rule(table, "bad", "bad-divisor", lhs, rhs, *pooling._GUARDS, pads[1] > zero)
    verifier = RuleVerifier(table, seeds=2, max_candidates=150)
    for name in ("bad-pad", "bad-divisor"):
        result = verifier.verify(name)
        assert not result.ok and result.counterexample is not None, (name, result.detail)


def test_prove_pool_cascade() -> None:
    """A 'same' stride-1 13 x 13 MaxPool is the 9 x 9 of the 5 x 5, and so three 5 x 5 pools."""
    same = {k: _max(X, [k, k], [1, 1], [k // 2] * 4) for k in (5, 9, 13)}
    prove(same[13], _max(same[9], [5, 5], [1, 1], [2] * 4), SHAPES, rounds=2)
    five = same[5]
    prove(same[13], _max(_max(five, [5, 5], [1, 1], [2] * 4), [5, 5], [1, 1], [2] * 4), SHAPES, rounds=2)


def test_cascade_only_on_same_stride_1_windows() -> None:
    """No cascade with a stride, unequal pads or a 7 x 7 window; the cascade's windows are not
    also made separable (their passes lose at ORT_ENABLE_BASIC), other large windows still are."""
    refute(_max(X, [9, 9], [2, 2], [4] * 4), _max(_max(X, [5, 5], [1, 1], [2] * 4), [5, 5], [2, 2], [2] * 4), SHAPES, rounds=1)
    refute(_max(X, [9, 9], [1, 1], [4, 3, 4, 4]), _max(_max(X, [5, 5], [1, 1], [2] * 4), [5, 5], [1, 1], [2, 1, 2, 2]), SHAPES, rounds=1)
    refute(_max(X, [7, 7], [1, 1], [3] * 4), _max(_max(X, [5, 5], [1, 1], [2] * 4), [3, 3], [1, 1], [1] * 4), SHAPES, rounds=1)
    refute(_max(X, [9, 9], [1, 1], [4] * 4), _max(_max(X, [9, 1], [1, 1], [4, 0, 4, 0]), [1, 9], [1, 1], [0, 4, 0, 4]), SHAPES, rounds=1)
    prove(_max(X, [9, 9], [1, 1], [4, 3, 4, 4]), _max(_max(X, [9, 1], [1, 1], [4, 0, 4, 0]), [1, 9], [1, 1], [0, 3, 0, 4]), SHAPES, rounds=1)


def test_pyramid_becomes_one_shared_chain_of_5x5_pools() -> None:
    """An SPP pyramid (5, 9, 13 and 21) saturates small and is written as YOLOv5's SPPF: five chained
    5 x 5 pools (each window shares the previous one; 17 x 17 is 21's step), equal to the original on
    onnxruntime."""
    nodes = [helper.make_node("MaxPool", ["x"], [f"p{k}"], kernel_shape=[k, k], pads=[k // 2] * 4) for k in (5, 9, 13, 21)]
    nodes.append(helper.make_node("Concat", ["x", "p5", "p9", "p13", "p21"], ["y"], axis=1))
    model = site_model(nodes, {"x": [1, 16, 20, 20]}, {"y": [1, 80, 20, 20]}, {})
    out, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("pool-separable", "pool-cascade")))
    assert report.verification.status == "passed"
    sat = report.saturation
    assert sat.stop_reason == "saturated" and sat.enodes_after <= 2 * sat.enodes_before, (sat.stop_reason, sat.enodes_before, sat.enodes_after)
    pools = [(n.input[0], {a.name: list(a.ints) for a in n.attribute if a.name in ("kernel_shape", "pads")}) for n in out.graph.node if n.op_type == "MaxPool"]
    assert [p[1] for p in pools] == [{"kernel_shape": [5, 5], "pads": [2] * 4}] * 5, pools
    assert [p[0] for p in pools][0] == "x" and len({p[0] for p in pools}) == 5, pools  # a chain, not four branches
    x = np.random.default_rng(0).standard_normal((1, 16, 20, 20)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x}) for m in (model, out))
    np.testing.assert_array_equal(got[0], want[0])


def test_wrong_cascades_fail_verification() -> None:
    """pool-cascade with the second pass's pads left at the whole window's, or with a 5 x 5 first
    pass unpadded, is caught on the rule's own instances."""
    x, kernel, strides, pads, dil = pooling.x, pooling.kernel, pooling.strides, pooling.pads, pooling.dil
    one, zero = i64(1), i64(0)
    rest = kernel[0] - i64(4)
    lhs = L.max_pool(x, kernel, strides, pads, dil, zero)
    first = L.max_pool(x, L.ivec([5, 5]), strides, L.ivec([2] * 4), Vec(one, one), zero)
    table = RuleTable()
    rhs = L.max_pool(first, Vec(rest, rest), strides, pads, Vec(one, one), zero)
    rewrite_rule(table, "bad", "bad-rest-pad", lhs, rhs, *pooling._SQUARE_SAME_STRIDE_1)
    unpadded = L.max_pool(x, L.ivec([5, 5]), strides, L.ivec([0] * 4), Vec(one, one), zero)
    rest_pad = pads[0] - i64(2)
    rhs = L.max_pool(unpadded, Vec(rest, rest), strides, Vec(rest_pad, rest_pad, rest_pad, rest_pad), Vec(one, one), zero)
    rewrite_rule(table, "bad", "bad-first-pad", lhs, rhs, *pooling._SQUARE_SAME_STRIDE_1)
    verifier = RuleVerifier(table, seeds=2, max_candidates=150)
    for name in ("bad-rest-pad", "bad-first-pad"):
        result = verifier.verify(name)
        assert not result.ok and result.counterexample is not None, (name, result.detail)
