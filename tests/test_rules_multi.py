"""Multi-pattern rules: parallel MatMuls / Convs sharing an input merge into one op + Split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from egglog import eq, union
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.rules.families import multi

from .prove import _egraph, _run, refute

F = TensorProto.FLOAT
X = L.Tensor.input("x")


def test_prove_parallel_matmuls_merge() -> None:
    w1, w2 = L.Tensor.weight("w1"), L.Tensor.weight("w2")
    shapes = {"x": (2, 5, 4), "w1": (4, 3), "w2": (4, 6)}
    with _egraph([L.matmul(X, w1), L.matmul(X, w2)], shapes, ("w1", "w2"), {}) as eg:
        # Weights carry import indices (tensor_ref), which the ordering guard reads.
        eg.register(union(L.tensor_ref(1)).with_(w1), union(L.tensor_ref(2)).with_(w2))
        _run(eg, 2)
        merged = L.matmul(X, L.concat(L.tlist([w1, w2]), 1))
        sizes = L.Tensor.ints(L.ivec([3, 6]), 1)
        eg.check(eq(L.matmul(X, w1)).to(L.split(merged, sizes, 2, 0, 0)))
        eg.check(eq(L.matmul(X, w2)).to(L.split(merged, sizes, 2, 0, 1)))
        # Ordering guard: never merged the other way round.
        swapped = L.matmul(X, L.concat(L.tlist([w2, w1]), 1))
        eg.check_fail(eq(L.matmul(X, w1)).to(L.split(swapped, L.Tensor.ints(L.ivec([6, 3]), 1), 2, 0, 1)))


def test_prove_parallel_gemms_merge() -> None:
    w1, w2, b1, b2 = (L.Tensor.weight(n) for n in ("w1", "w2", "b1", "b2"))
    shapes = {"x": (2, 4), "w1": (3, 4), "w2": (5, 4), "b1": (3,), "b2": (5,)}

    def gemm(w: L.Tensor, b: L.Tensor) -> L.Tensor:
        return L.gemm(X, w, b, 1.0, 1.0, 0, 1)

    with _egraph([gemm(w1, b1), gemm(w2, b2)], shapes, ("w1", "w2", "b1", "b2"), {}) as eg:
        eg.register(union(L.tensor_ref(1)).with_(w1), union(L.tensor_ref(2)).with_(w2))
        _run(eg, 2)
        merged = L.gemm(X, L.concat(L.tlist([w1, w2]), 0), L.concat(L.tlist([b1, b2]), 0), 1.0, 1.0, 0, 1)
        sizes = L.Tensor.ints(L.ivec([3, 5]), 1)
        eg.check(eq(gemm(w1, b1)).to(L.split(merged, sizes, 1, 0, 0)))
        eg.check(eq(gemm(w2, b2)).to(L.split(merged, sizes, 1, 0, 1)))


def test_non_constant_weights_do_not_merge() -> None:
    y, z = L.Tensor.input("y"), L.Tensor.input("z")
    merged = L.matmul(X, L.concat(L.tlist([y, z]), 1))
    refute(
        L.matmul(X, y),
        L.split(merged, L.Tensor.ints(L.ivec([3, 3]), 1), 1, 0, 0),
        {"x": (2, 4), "y": (4, 3), "z": (4, 3)},
    )


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=inits),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    model.ir_version = 8
    return model


def test_numeric_merge_is_chosen_when_it_pays_and_verifies() -> None:
    """A big shared input and narrow outputs: reading x once beats reading it twice. Only the exact
    extractor sees it (greedy prices each output's sub-DAG alone, so a shared merge never looks
    cheaper for one output); ILP picks it, and the result matches onnxruntime."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((512, 8)).astype(np.float32), n)
        for n in ("w1", "w2", "w3")
    ]
    nodes = [helper.make_node("MatMul", ["x", n], [f"y{k}"]) for k, n in enumerate(("w1", "w2", "w3"))]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2048, 512])],
        [helper.make_tensor_value_info(f"y{k}", F, [2048, 8]) for k in range(3)],
        inits,
    )
    _, greedy = onnxsat.optimize(model, onnxsat.Options(verify=False))
    out, report = onnxsat.optimize(model, onnxsat.Options(extractor="ilp"))
    assert report.verification.status == "passed"
    assert report.saturation.rule_matches().get("merge-parallel-matmul", 0) > 0
    assert report.cost_after < greedy.cost_after
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["MatMul"] < 3 and ops["Split"] >= 1, ops


def test_numeric_inception_block_merges_verify() -> None:
    """Parallel 1x1 convs (and a 1x1 enlarged to merge with a 3x3) verify whatever is extracted."""
    from .models import EXAMPLES

    model = onnx.load(str(EXAMPLES / "inception_block.onnx"))
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    fired = report.saturation.rule_matches()
    assert fired.get("merge-parallel-conv", 0) > 0
    assert fired.get("merge-enlarge-1x1-into-3x3", 0) > 0


def test_every_multi_rule_is_tested() -> None:
    assert set(multi.RULE_NAMES) == {
        "merge-parallel-matmul",
        "merge-parallel-gemm",
        "merge-parallel-conv",
        "merge-enlarge-1x1-into-3x3",
    }
