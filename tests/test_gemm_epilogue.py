"""GEMM epilogues: the packed micro-kernel's bias (+ ReLU) store against float64 numpy, and
MatMul + Add (+ Relu) lowered into one product step only when nothing else reads what it skips,
against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.gemm import KC, NR, pack_b, rows_a, sgemm_function
from onnxsat.lowering.program import PACKED_GEMM_MAX_ROWS, MatMulStep


@pytest.mark.parametrize("shape", [(13, 7, 45), (9, KC + 37, 50), (64, 33, 96), (3, 5, 1), (1, KC + 5, 100), (2, 40, 49), (4, 9, 50), (12, 6, 48)])
@pytest.mark.parametrize("epilogue", ["bias", "bias_relu"])
def test_packed_gemm_epilogue(shape: tuple[int, int, int], epilogue: str) -> None:
    """Row tails (M % 8: one row, two to four, more), column tails (N % 48) and two K blocks (the
    bias is added once, after the last); columns past N (ldc > N) stay untouched."""
    m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) * 4
    c = np.full((m, n + 3), np.nan, np.float32)
    bp = pack_b(b, bias)
    sgemm_function(epilogue)(a.ctypes.data, k, bp.ctypes.data, k, c.ctypes.data, n + 3, m, n, 0, bp.shape[0])
    want = a.astype(np.float64) @ b.astype(np.float64) + bias
    if epilogue == "bias_relu":
        want = np.maximum(want, 0)
    np.testing.assert_allclose(c[:, :n], want, rtol=1e-4, atol=1e-4 * k)
    assert np.all(np.isnan(c[:, n:]))


def _model(nodes: list[onnx.NodeProto], x_shape: list[int], outputs: list[str], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [onnx.numpy_helper.from_array(v, name) for name, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(k: int, n: int, bias_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(k * n)
    return {"w": rng.standard_normal((k, n)).astype(np.float32), "b": rng.standard_normal(bias_shape).astype(np.float32)}


mm = helper.make_node
CASES = {
    # nodes, x shape, outputs, bias shape, products expected to carry (bias, relu)
    "bias-relu-3d": ([mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["h", "b"], ["s"]), mm("Relu", ["s"], ["y"])], [2, 9, 40], ["y"], (70,), [(True, True)]),
    "bias-first-1xn": ([mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["b", "h"], ["y"])], [13, 40], ["y"], (1, 70), [(True, False)]),
    "relu-output-read-twice": (
        [mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["h", "b"], ["s"]), mm("Relu", ["s"], ["y"]), mm("Neg", ["s"], ["z"])],
        [13, 40], ["y", "z"], (70,), [(True, False)],
    ),
    "product-read-twice": (
        [mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["h", "b"], ["y"])], [13, 40], ["y", "h"], (70,), [(False, False)],
    ),
    "bias-broadcasts-rows": ([mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["h", "b"], ["y"])], [13, 40], ["y"], (13, 1), [(False, False)]),
    # a classifier's Gemm: beta * C is the bias row of the packed GEMM, a Relu after it its clamp
    "gemm-transb-beta": ([mm("Gemm", ["x", "wt", "b"], ["y"], transB=1, beta=0.5)], [13, 40], ["y"], (70,), [(True, False)]),
    "gemm-one-row-relu": ([mm("Gemm", ["x", "wt", "b"], ["h"], transB=1), mm("Relu", ["h"], ["y"])], [1, 40], ["y"], (70,), [(True, True)]),
    "gemm-flattened-row": ([mm("Flatten", ["x"], ["f"]), mm("Gemm", ["f", "wt", "b"], ["y"], transB=1)], [1, 40, 1, 1], ["y"], (70,), [(True, False)]),
    "gemm-bias-broadcasts-rows": ([mm("Gemm", ["x", "wt", "b"], ["y"], transB=1)], [13, 40], ["y"], (13, 1), [(False, False)]),
    "too-many-rows": ([mm("MatMul", ["x", "w"], ["h"]), mm("Add", ["h", "b"], ["y"])], [PACKED_GEMM_MAX_ROWS + 8, 40], ["y"], (70,), [(False, False)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matmul_bias_relu_epilogue(case: str) -> None:
    """The epilogue is taken exactly where the skipped tensors have no other reader (and the
    product runs on the packed GEMM); every output equals onnxruntime's."""
    nodes, x_shape, outputs, bias_shape, expected = CASES[case]
    inits = _weights(40, 70, bias_shape)
    inits["wt"] = np.ascontiguousarray(inits["w"].T)
    model = _model(nodes, x_shape, outputs, inits)
    feeds = {"x": np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)
    exe = compiled.executable_for(feeds)
    steps = [s for s in exe.program.steps if isinstance(s, MatMulStep)]
    assert [(s.bias is not None, s.relu) for s in steps] == expected
    assert exe.stats.one_native_call
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(outputs, feeds)
    for name, value in zip(outputs, want, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(13, 7, 45), (9, KC + 37, 50), (64, 33, 96), (3, 5, 1), (20, 9, 49), (17, 4, 17), (8, 3, 33), (11, 6, 68), (16, 40, 80)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu", "bias_silu", "bias_hardswish"])
@pytest.mark.parametrize("scaled", [False, True], ids=["", "scaled"])
def test_unpacked_gemm_row_epilogue(shape: tuple[int, int, int], epilogue: str, scaled: bool) -> None:
    """The unpacked-B form (a Conv's ``W @ col``): B read in place with row stride N (its rows
    multiplied by a scale when one is given), a per-row bias from A's extra column, short last panels of one or two vectors; run as the runtime
    splits it (a later row block and a panel range per call), columns past N untouched."""
    m, k, n = shape
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32) * 4
    aa = rows_a(a, None if epilogue == "none" else bias)
    c = np.full((m, n + 3), np.nan, np.float32)
    fn = sgemm_function(epilogue, packed=False)
    b_rows = np.arange(k, dtype=np.int64) * n
    scale = rng.standard_normal(k).astype(np.float32) if scaled else None
    panels = -(-n // NR)
    split = min(m, 8)
    for r0, rows in ((0, split), (split, m - split)):
        for p0, p1 in ((0, panels // 2), (panels // 2, panels)):
            if rows and p1 > p0:
                fn(aa.ctypes.data + r0 * aa.shape[1] * 4, aa.shape[1], b.ctypes.data, b_rows.ctypes.data, 0 if scale is None else scale.ctypes.data, k, c.ctypes.data + r0 * (n + 3) * 4, n + 3, rows, n, p0, p1, n, n)
    want = a.astype(np.float64) @ (b if scale is None else b * scale[:, None]).astype(np.float64)
    if epilogue != "none":
        want += bias[:, None]
    if epilogue == "bias_relu":
        want = np.maximum(want, 0)
    if epilogue == "bias_silu":
        want = want / (1.0 + np.exp(-want))
    if epilogue == "bias_hardswish":
        want = want * np.clip(want / 6.0 + 0.5, 0.0, 1.0)
    np.testing.assert_allclose(c[:, :n], want, rtol=1e-4, atol=1e-4 * k)
    assert np.all(np.isnan(c[:, n:]))


@pytest.mark.parametrize(("width", "pitch", "rows"), [(8, 10, 9), (14, 16, 14), (16, 18, 5), (28, 30, 7), (9, 9, 6), (56, 58, 3)])
def test_unpacked_gemm_skips_the_columns_between_rows(width: int, pitch: int, rows: int) -> None:
    """An implicit conv's B: each row of B is ``rows`` input rows ``pitch`` apart, of which the first
    ``width`` values are columns of the product (the output positions) and the rest are padding
    that is neither read into the product nor stored: C has ``rows * width`` columns."""
    m, k = 19, 13
    n = rows * width
    rng = np.random.default_rng(width * pitch)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    stored = rng.standard_normal((k + 2) * rows * pitch).astype(np.float32)
    b_rows = np.arange(k, dtype=np.int64) * rows * pitch // 2 + np.arange(k) % 3  # overlapping windows
    columns = np.arange(n) // width * pitch + np.arange(n) % width
    b = stored[b_rows[:, None] + columns]
    aa = rows_a(a, bias)
    c = np.full((m, n + 1), np.nan, np.float32)
    fn = sgemm_function("bias_relu", packed=False)
    panels = -(-n // NR)
    for p0, p1 in ((0, panels // 2), (panels // 2, panels)):
        if p1 > p0:
            fn(aa.ctypes.data, aa.shape[1], stored.ctypes.data, b_rows.ctypes.data, 0, k, c.ctypes.data, n + 1, m, n, p0, p1, width, pitch)
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias[:, None], 0)
    np.testing.assert_allclose(c[:, :n], want, rtol=1e-4, atol=1e-4 * k)
    assert np.all(np.isnan(c[:, n:]))


def test_batched_products_with_one_weight_run_as_one_gemm() -> None:
    """A sequence-first projection (Transpose to [S, B=1, D], then MatMul + bias, as
    nn.MultiheadAttention's dynamo export writes it) is one product of S rows with its bias in the
    packed GEMM's store (it ran as S one-row products and a numpy step), and matches onnxruntime."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 192)).astype(np.float32)
    bias = rng.standard_normal(192).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["t", "w"], ["p"]),
        helper.make_node("Add", ["p", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "seq_first",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [17, 1, 192])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 17, 64)).astype(np.float32)
    compiled = CompiledModel(model, CompileOptions(cache=False))
    (got,) = compiled({"x": x}).values()
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    steps = [s for s in compiled.executable_for({"x": x}).program.steps if isinstance(s, MatMulStep)]
    assert [s.out.shape for s in steps] == [(17, 192)] and steps[0].bias is not None
    assert compiled.stats({"x": x}).one_native_call


def test_products_whose_rows_are_not_evenly_spaced_keep_their_batch() -> None:
    from onnxsat.lowering.kernel_ir import Buffer
    from onnxsat.lowering.program import StridedOperand
    from onnxsat.lowering.rules_nn import batch_as_rows

    a_buf, b_buf, out = Buffer("a", "f32", (4, 8, 16)), Buffer("b", "f32", (16, 5)), Buffer("c", "f32", (2, 3, 5))
    b = StridedOperand(b_buf, (16, 5), (5, 1))
    sliced = StridedOperand(a_buf, (2, 3, 16), (128, 16, 1))  # 3 of every 8 rows: a gap between batches
    assert batch_as_rows(sliced, b, out) == (sliced, b, out)
    whole = StridedOperand(a_buf, (2, 3, 16), (48, 16, 1))
    folded, _, flat = batch_as_rows(whole, b, out)
    assert (folded.shape, folded.strides, flat.shape) == ((6, 16), (16, 1), (6, 5))
    batched_b = StridedOperand(b_buf, (2, 16, 5), (0, 5, 1))
    assert batch_as_rows(whole, batched_b, out)[0] is whole
