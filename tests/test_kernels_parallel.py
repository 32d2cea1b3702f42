"""Which kernels are split over threads (kernels/parallel.py), and that a split changes no result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels import parallel
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.lowering.kernel_ir import Binary, Buffer, Const, Kernel, Load, Store, Var


def _scale(n: int, extent: int, cost: float) -> Kernel:
    x, y = Buffer("x", "f32", (n,)), Buffer("y", "f32", (n,))
    body = (Store(y, Var("p"), Binary("mul", Load(x, Var("p")), Const(2.0))),)
    return Kernel("scale", (x, y), ("y",), "p", extent, body, cost)


def test_split_follows_operations_or_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Either measure alone decides; a kernel with one parallel unit is never split."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN_COST", 1000.0)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 8000.0)
    assert parallel.touched_bytes(_scale(1000, 1000, 0.0)) == 8000
    assert parallel.parallel_pays(_scale(1000, 1000, 0.0))  # bytes
    assert not parallel.parallel_pays(_scale(999, 999, 999.0))  # neither
    assert parallel.parallel_pays(_scale(10, 10, 1000.0))  # operations
    assert not parallel.parallel_pays(_scale(10**6, 1, 1e12))  # nothing to split


def _model() -> object:
    """A head merge (memory-bound), an exp-heavy chain and a softmax in place over its input."""
    mk = helper.make_node
    nodes = [
        mk("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        mk("Sigmoid", ["t"], ["g"]),
        mk("Mul", ["t", "g"], ["m"]),
        mk("MatMul", ["m", "w"], ["s"]),
        mk("Softmax", ["s"], ["y"], axis=-1),
    ]
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32), "w")
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 40, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_split_kernels_compute_what_serial_ones_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel split over two threads (thresholds 0) against every kernel serial: same bits,
    and the split program really has more tasks."""
    model = _model()
    feeds = {"x": np.random.default_rng(0).standard_normal((12, 40, 64)).astype(np.float32)}
    results, tasks = [], []
    for threshold in (float("inf"), 0.0):
        monkeypatch.setattr(parallel, "PARALLEL_MIN_COST", threshold)
        monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", threshold)
        compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
        results.append(compiled(feeds)["y"])
        tasks.append(len(compiled.executable_for(feeds).native.tasks))
        compiled.close()
    assert tasks[1] > tasks[0]
    np.testing.assert_array_equal(results[0], results[1])
    t = feeds["x"].transpose(1, 0, 2)
    s = (t / (1 + np.exp(-t))) @ numpy_helper.to_array(model.graph.initializer[0])  # type: ignore[attr-defined]
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(results[1], e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
