"""The pool lowering: separable, row-vectorizable passes that agree with onnxruntime on the cases
the node tests lack (SPP-size windows, ceil_mode overhang with count_include_pad, dilation)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.lowering.kernel_ir import Loop, Store, loads_in
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep

POOLS = {
    "max13": helper.make_node("MaxPool", ["r"], ["max13"], kernel_shape=[13, 13], pads=[6, 6, 6, 6]),
    "max3s2": helper.make_node("MaxPool", ["r"], ["max3s2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1),
    "avg5": helper.make_node("AveragePool", ["r"], ["avg5"], kernel_shape=[5, 5], strides=[2, 2], pads=[2, 2, 2, 2], ceil_mode=1),
    "avg5pad": helper.make_node(
        "AveragePool", ["r"], ["avg5pad"], kernel_shape=[5, 4], strides=[2, 3], pads=[2, 1, 2, 1], ceil_mode=1, count_include_pad=1
    ),
    "avg3dil": helper.make_node("AveragePool", ["r"], ["avg3dil"], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
    "avg3same": helper.make_node("AveragePool", ["r"], ["avg3same"], kernel_shape=[3, 2], auto_pad="SAME_LOWER", count_include_pad=1),
    "gavg": helper.make_node("GlobalAveragePool", ["r"], ["gavg"]),
    "gmax": helper.make_node("GlobalMaxPool", ["r"], ["gmax"]),
}


POOLS_3D = {
    "max331": helper.make_node("MaxPool", ["r"], ["max331"], kernel_shape=[3, 3, 1], strides=[2, 1, 1], pads=[1, 1, 0, 1, 1, 0]),
    "avg232": helper.make_node("AveragePool", ["r"], ["avg232"], kernel_shape=[2, 3, 2], strides=[2, 2, 2], ceil_mode=1),
}


def _model(pools: dict[str, onnx.NodeProto], shape: list[int]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in pools]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), *pools.values()]
    return helper.make_model(helper.make_graph(nodes, "pools", [x], outs), opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("pools, shape", [(POOLS, [2, 3, 15, 18]), (POOLS_3D, [1, 2, 7, 6, 5])], ids=["2d", "3d"])
def test_pools_match_onnxruntime(pools: dict[str, onnx.NodeProto], shape: list[int]) -> None:
    model = _model(pools, shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = dict(zip(pools, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x}), strict=True))
    got = CompiledModel(model, CompileOptions(threads=2, cache=False))(x=x)
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_large_window_is_two_unrolled_passes() -> None:
    """13x13: a column pass then a row pass, 13 loads each and no window loop (the inner loop is the
    output row, which the vectorizer handles), instead of 169 guarded loads per output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 20, 20])
    y = helper.make_tensor_value_info("max13", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([POOLS["max13"]], "p", [x], [y]), opset_imports=[helper.make_opsetid("", 19)])
    model.graph.node[0].input[0] = "x"
    kernels = [s.kernel for s in lower(model, {"x": (1, 4, 20, 20)}).steps if isinstance(s, KernelStep)]
    passes = [k for k in kernels if k.body and isinstance(k.body[0], Loop) and isinstance(k.body[0].body[0], Store) and len(list(loads_in(k.body[0].body[0].value))) == 13]
    assert len(passes) == 2, [k.name for k in kernels]
    assert all(len(k.body) == 1 and len(k.body[0].body) == 1 for k in passes)


@pytest.mark.parametrize("pool", ["GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"])
def test_a_global_pool_of_a_stored_plane_is_one_loop(pool: str) -> None:
    """A global pool, or a reduction over the spatial axes (a dynamo export's squeeze-excitation
    mean), over a stored plane reduces one loop: over rows of 56, LLVM unrolled the row and
    vectorized the row loop with gathers (3x onnxruntime's time on 96x56x56; EfficientNet-B0's
    ReduceMeans were 11% of its run). A depthwise conv's output stored on its padded width (rows
    58 apart) is one loop over the rows and the gaps between them, the gaps read as the
    reduction's identity."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((3, 1, 3, 3)).astype(np.float32), "w")
    axes = onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
    inputs = ["axes"] if pool.startswith("Reduce") else []
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], group=3, pads=[1, 1, 1, 1]),
        helper.make_node(pool, ["x", *inputs], ["y"]),
        helper.make_node(pool, ["c", *inputs], ["z"]),
        helper.make_node("Neg", ["c"], ["n"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 56, 56])
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "yzn"]
    model = helper.make_model(helper.make_graph(nodes, "p", [x], outs, [weight, axes]), opset_imports=[helper.make_opsetid("", 19)])
    steps = lower(model, {"x": (1, 3, 56, 56)}).steps
    kernels = [s.kernel for s in steps if isinstance(s, KernelStep) and s.kernel.name.startswith(("gpool", "reduce"))]
    assert len(kernels) == 2
    for kernel in kernels:
        loops = [st for st in kernel.body if isinstance(st, Loop)]
        assert len(loops) == 1 and not any(isinstance(st, Loop) for st in loops[0].body), kernel.name
    feeds = {"x": rng.standard_normal((1, 3, 56, 56)).astype(np.float32) - 0.5}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = CompiledModel(model, CompileOptions(threads=1, cache=False))(feeds)
    for name, expected in zip("yzn", want, strict=True):
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("pool", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("chans", [96, 48])
def test_a_global_pool_of_a_channels_last_product_adds_whole_channel_runs(pool: str, chans: int) -> None:
    """A 1x1 conv on a 7 x 7 image runs position-major (its result laid out [positions, C]); the
    pool after it (its HardSwish fused in) reduces position by position over contiguous channels."""
    rng = np.random.default_rng(chans)
    n = helper.make_node
    weights = [
        onnx.numpy_helper.from_array(rng.standard_normal((chans, 64, 1, 1)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(chans).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        [n("Conv", ["x", "w", "b"], ["c"]), n("HardSwish", ["c"], ["a"]), n(pool, ["a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 7, 7])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 64, 7, 7)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    pools = [s.kernel for s in compiled.executable_for(feeds).program.steps if isinstance(s, KernelStep) and s.kernel.name.startswith("gpool_")]
    assert len(pools) == 1 and pools[0].parallel_extent == chans // math.gcd(chans, 64)  # tasks of whole channel runs
    compiled.close()
