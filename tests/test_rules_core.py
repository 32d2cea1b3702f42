"""The first ruleset: egg-style prove tests (start => goal under fixed budgets) and numeric tests.

Numeric tests write a tiny model with onnx.helper, optimize it, assert the remaining op list and
compare against onnxruntime (``optimize`` verifies too; the assert here makes the check explicit).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.rules.families.core import RULE_NAMES
from onnxsat.verification import compare_models

from .models import EXAMPLES
from .prove import prove, refute

F = TensorProto.FLOAT


X = L.Tensor.input("x")


def test_prove_identity_neg_relu() -> None:
    prove(L.identity(L.neg(L.neg(X))), X, {"x": (2, 3)})
    prove(L.relu(L.relu(L.relu(X))), L.relu(X), {"x": (2, 3)})


def test_prove_constants() -> None:
    one = L.Tensor.splat(1.0, L.ivec([]), F)
    zero = L.Tensor.splat(0.0, L.ivec([1]), F)
    prove(L.sub(L.add(L.div(L.mul(one, X), one), zero), zero), X, {"x": (2, 3)})


def test_mul_one_does_not_fire_when_the_constant_broadcasts() -> None:
    big_one = L.Tensor.splat(1.0, L.ivec([4, 2, 3]), F)
    refute(L.mul(X, big_one), X, {"x": (2, 3)})


def test_prove_transposes() -> None:
    p = L.ivec([0, 2, 3, 1])
    q = L.ivec([0, 3, 1, 2])
    prove(L.transpose(L.transpose(X, p), q), X, {"x": (1, 2, 3, 4)})
    prove(L.transpose(L.transpose(X, L.ivec([1, 0, 2])), L.ivec([0, 2, 1])), L.transpose(X, L.ivec([1, 2, 0])), {"x": (2, 3, 4)})


def test_prove_reshapes() -> None:
    t1 = L.Tensor.ints(L.ivec([6, 4]), 1)
    t2 = L.Tensor.ints(L.ivec([3, 8]), 1)
    prove(L.reshape(L.reshape(X, t1, 0), t2, 0), L.reshape(X, L.Tensor.ints(L.ivec([3, 8]), 1), 0), {"x": (2, 3, 4)})
    prove(L.reshape(X, L.Tensor.ints(L.ivec([2, 3, 4]), 1), 0), X, {"x": (2, 3, 4)})


def test_prove_shape_of_known_dims() -> None:
    prove(L.shape_of(X, 0, 2**63 - 1), L.Tensor.ints(L.ivec([2, 3, 4]), 1), {"x": (2, 3, 4)})


def test_numeric_shape_chain_folds_when_input_shape_is_pinned() -> None:
    model = onnx.load(str(EXAMPLES / "transformer_block.onnx"))
    pins = {"input_ids": (1, 16), "attention_mask": (1, 16)}
    out, report = onnxsat.optimize(model, onnxsat.Options(input_shapes=pins))
    assert report.verification.status == "passed"
    assert "Shape" in report.nodes_before and "Shape" not in report.nodes_after
    assert report.total_after < report.total_before


def test_prove_matmul_add_to_gemm() -> None:
    w = L.Tensor.weight("w")
    b = L.Tensor.weight("b")
    prove(L.add(L.matmul(X, w), b), L.gemm(X, w, b, 1.0, 1.0, 0, 0), {"x": (2, 3), "w": (3, 4), "b": (4,)}, ("w", "b"))


def test_matmul_add_to_gemm_needs_2d() -> None:
    w, b = L.Tensor.weight("w"), L.Tensor.weight("b")
    start = L.add(L.matmul(X, w), b)
    refute(start, L.gemm(X, w, b, 1.0, 1.0, 0, 0), {"x": (5, 2, 3), "w": (3, 4), "b": (4,)}, ("w", "b"))


# ---------------------------------------------------------------- numeric, through optimize()
def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _optimized_ops(model: onnx.ModelProto) -> Counter:
    out, report = onnxsat.optimize(model, onnxsat.Options())
    assert report.verification.status == "passed"
    assert compare_models(model, out, seeds=(7,)).ok
    return Counter(n.op_type for n in out.graph.node)


def test_numeric_conv_batchnorm_fold() -> None:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "s"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bb"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "m"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "v"),
    ]
    for with_bias in (True, False):
        nodes = [
            helper.make_node("Conv", ["x", "w", "b"] if with_bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3),
        ]
        model = _model(
            nodes,
            [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
            [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
            inits if with_bias else [i for i in inits if i.name != "b"],
        )
        assert _optimized_ops(model) == Counter({"Conv": 1})


def test_numeric_matmul_add_to_gemm_and_layout() -> None:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
        helper.make_node("Reshape", ["t2", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([3, 8], dtype=np.int64), "s1"),
        numpy_helper.from_array(np.array([6, 4], dtype=np.int64), "s2"),
        numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b"),
    ]
    model = _model(
        nodes, [helper.make_tensor_value_info("x", F, [6, 4])], [helper.make_tensor_value_info("y", F, [6, 5])], inits
    )
    assert _optimized_ops(model) == Counter({"Gemm": 1})


def test_prove_elementwise_identities() -> None:
    zero, one, two = (L.Tensor.splat(v, L.ivec([]), F) for v in (0.0, 1.0, 2.0))
    cond = L.Tensor.input("c")
    shapes = {"x": (2, 3), "c": (2, 3)}
    prove(L.where(cond, X, X), X, shapes, dtypes={"c": TensorProto.BOOL})
    prove(L.clip(X, zero, L.Tensor.none()), L.relu(X), shapes)
    prove(L.pow_(X, one), X, shapes)
    prove(L.pow_(X, two), L.mul(X, X), shapes)
    prove(L.global_average_pool(L.Tensor.input("p")), L.Tensor.input("p"), {"p": (1, 3, 1, 1)})
    # where(c, x, x) keeps the Where when the condition broadcasts x to a larger shape.
    refute(L.where(cond, X, X), X, {"x": (1, 3), "c": (2, 3)}, dtypes={"c": TensorProto.BOOL})
    # Clip with a non-zero lower bound is not Relu.
    refute(L.clip(X, one, L.Tensor.none()), L.relu(X), shapes)


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_every_rule_is_tested_here(rule: str) -> None:
    """Each rule of the first ruleset appears in a prove test above (keeps this file complete)."""
    covered = {
        "identity-elim", "neg-neg", "relu-relu", "mul-one", "div-one", "add-zero", "sub-zero",
        "transpose-compose", "transpose-identity-elim", "reshape-reshape", "reshape-noop",
        "conv-batchnorm-fold", "matmul-add-to-gemm", "shape-of-known",
        "where-same", "clip-zero-to-relu", "pow-one-elim", "pow-two-to-mul", "global-pool-noop",
    }  # fmt: skip
    assert rule in covered


def test_equal_weights_are_one_leaf() -> None:
    """Weight tying: two initializers with equal values are one e-class, so their users merge
    (two branches x@W1 and x@W2 with W1 == W2 become one MatMul); a different one stays apart."""
    from egglog import eq

    from onnxsat.egraph.importer import from_onnx

    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w1"),
        numpy_helper.from_array(w.copy(), "w2"),
        numpy_helper.from_array(w + 1, "w3"),
    ]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]) for i in (1, 2, 3)]
    nodes += [helper.make_node("Relu", [f"m{i}"], [f"y{i}"]) for i in (1, 2, 3)]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [3, 4])],
        [helper.make_tensor_value_info(f"y{i}", F, [3, 5]) for i in (1, 2, 3)],
        inits,
    )
    program = from_onnx(model)
    program.egraph.check(eq(program.terms["w1"]).to(program.terms["w2"]))
    program.egraph.check_fail(eq(program.terms["w1"]).to(program.terms["w3"]))
    ops = _optimized_ops(model)  # y1 and y2 are one tensor now (the second output is an Identity of it)
    assert (ops["MatMul"], ops["Relu"]) == (2, 2)
