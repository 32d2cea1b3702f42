"""Which kernels are split over threads (kernels/parallel.py), and that a split changes no result."""

from __future__ import annotations

import math

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


def test_a_packed_product_whose_panels_do_not_divide_over_the_threads_splits_its_last_panel_by_rows() -> None:
    """A 7 x 7 conv runs as a packed product of 49 rows; its 144 output channels are 3 panels, which
    two threads would run as 2 / 1. The odd panel is cut by rows into one part per thread, queued
    last; the parts cover every row of it once and compute what one thread does."""
    from onnxsat.kernels.gemm import MR
    from onnxsat.kernels.native_runner import KIND_PACKED_GEMM

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((144, 16, 3, 3)).astype(np.float32) * 0.05, "w")  # too few channels for Winograd
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 16, 7, 7)).astype(np.float32)}
    results = []
    for threads in (1, 2):
        compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))
        results.append(compiled(feeds)["y"])
        native = compiled.executable_for(feeds).native
        gemm = [t for t in native.tasks if t[0] == KIND_PACKED_GEMM]
        compiled.close()
    rows_by_panel: dict[int, list[int]] = {}
    for task in gemm:
        rows, p0, p1 = int(task[8]), int(task[10]), int(task[11])
        for p in range(p0, p1):
            rows_by_panel.setdefault(p, []).append(rows)
    assert sorted(rows_by_panel) == [0, 1, 2]
    strips = math.ceil(49 / MR)
    first = math.ceil(strips / 2) * MR  # whole micro-kernel strips: 32 of 8 rows (AVX-512), 30 of 6 (AVX2)
    assert rows_by_panel[0] == rows_by_panel[1] == [49] and sorted(rows_by_panel[2]) == sorted([first, 49 - first])
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize(
    ("rows", "columns", "split"),
    [
        (784, 128, [(None, 0, 3), (None, 0, 3)]),  # 3 panels would run 2 / 1: halves of the rows
        (784, 96, [(None, 0, 2), (None, 0, 2)]),  # 2 panels divide, but A outweighs the weights
        (512, 768, [(512, 0, 8), (512, 8, 16)]),  # the weights outweigh A: panel ranges
    ],
)
def test_a_large_packed_product_splits_by_rows_where_its_panels_do_not_divide_or_a_outweighs_the_weights(
    rows: int, columns: int, split: list[tuple[int | None, int, int]]
) -> None:
    """A of rows x 576 (more than L2 holds) times ``columns``: two threads take half the rows each,
    every panel, where the panels do not divide over them or A is larger than the weights (each
    thread then reads only its rows of A); otherwise a range of panels each. Both compute what one
    thread does."""
    from onnxsat.kernels.gemm import MR
    from onnxsat.kernels.native_runner import KIND_PACKED_GEMM

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((576, columns)).astype(np.float32) * 0.05, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 576])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((rows, 576)).astype(np.float32)}
    results = []
    for threads in (1, 2):
        compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))
        results.append(compiled(feeds)["y"])
        gemm = [t for t in compiled.executable_for(feeds).native.tasks if t[0] == KIND_PACKED_GEMM]
        compiled.close()
    first = math.ceil(math.ceil(rows / MR) / 2) * MR  # whole micro-kernel strips: 392 of 8-row strips, 396 of 6
    halves = iter(sorted([first, rows - first]))
    want = sorted((next(halves) if r is None else r, p0, p1) for r, p0, p1 in split)
    assert sorted((int(t[8]), int(t[10]), int(t[11])) for t in gemm) == want
    np.testing.assert_array_equal(results[0], results[1])
