"""A 1x1 conv that feeds a depthwise conv stores its product straight into that conv's zero-padded
input: a blocked conv's NCHWc image (the micro-kernel's channel-blocked store against float64
numpy), a flat conv's planes padded with zero rows only; the lowering (which products take it,
what they skip) against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.gemm import KC, pack_b, sgemm_function
from onnxsat.latency import ort_session
from onnxsat.lowering.program import KernelStep, MatMulStep

ACTIVATIONS = {
    "none": lambda y: y,
    "bias": lambda y: y,
    "bias_relu": lambda y: np.maximum(y, 0),
    "bias_silu": lambda y: y / (1 + np.exp(-y)),
    "bias_hardswish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1),
}


@pytest.mark.parametrize("epilogue", list(ACTIVATIONS))
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize(("height", "width", "k", "n", "pad"), [(5, 7, 16, 96, 1), (3, 3, 40, 48, 2), (7, 7, KC + 76, 32, 1), (1, 9, 3, 16, 0)])
@pytest.mark.parametrize("transposed", [False, True])
def test_blocked_store_writes_each_row_into_its_padded_position(
    epilogue: str, block: int, height: int, width: int, k: int, n: int, pad: int, transposed: bool
) -> None:
    """Rows of C land at their image positions inside the padding, channels split into blocks (two
    per vector for 8-channel blocks); the padding is not touched; two K blocks add up; A read with
    a column stride gives the same result."""
    _check_blocked_store(epilogue, block, height, width, k, n, pad, transposed)


@pytest.mark.parametrize("epilogue", ["none", "bias_silu"])
@pytest.mark.parametrize("n", [8, 24, 40, 56])
def test_blocked_store_of_a_last_half_vector(epilogue: str, n: int) -> None:
    """Channel counts that end half-way through a 16-lane vector (8-channel blocks): the last vector
    takes the masked store, the whole ones the plain stores, and nothing past the last block is written."""
    _check_blocked_store(epilogue, 8, 4, 5, 12, n, 1, False)


@pytest.mark.parametrize("epilogue", ["bias_silu", "bias_hardswish"])
@pytest.mark.parametrize("in_registers", [False, True])
def test_activation_epilogues_either_way(epilogue: str, in_registers: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """SiLU and HardSwish applied to the accumulators (AVX2's choice) or as a pass over the stored
    tile (AVX-512's), whichever this host takes by default, against float64 numpy."""
    import ctypes

    from onnxsat.kernels import gemm, jit

    monkeypatch.setattr(gemm, "ACTIVATE_IN_REGISTERS", in_registers)
    host = jit.host_target()
    loaded = jit.LoadedObjects([jit.emit_object(str(gemm.build_module(epilogue, blocked=True)), host, 3)], host)
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p if name in gemm.POINTER_ARGS else ctypes.c_int64 for name in gemm.BLOCKED_ARGS])
    _check_blocked_store(epilogue, 8, 5, 7, 20, 40, 1, False, proto(loaded.address(gemm.BLOCKED_EPILOGUES[epilogue])))


def _check_blocked_store(
    epilogue: str, block: int, height: int, width: int, k: int, n: int, pad: int, transposed: bool, fn: Any = None
) -> None:
    m = height * width
    rng = np.random.default_rng(m + k + n + block)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    bp = pack_b(w, None if epilogue == "none" else bias)
    hp, wp = height + 2 * pad, width + 2 * pad
    out = np.full((n // block, hp, wp, block), np.nan, np.float32)
    i = np.arange(m)
    rows = ((i // width + pad) * wp + i % width + pad).astype(np.int64) * block
    fn = fn or sgemm_function(epilogue, blocked=True)
    fn(a.ctypes.data, k, bp.ctypes.data, k, out.ctypes.data, hp * wp * block, m, n, 0, bp.shape[0], rows.ctypes.data, block, 1)
    if transposed:  # A read as the columns of its transpose (an NCHW image's positions x channels)
        a_t = np.ascontiguousarray(a.T)
        again = np.full_like(out, np.nan)
        fn(a_t.ctypes.data, 1, bp.ctypes.data, k, again.ctypes.data, hp * wp * block, m, n, 0, bp.shape[0], rows.ctypes.data, block, m)
        np.testing.assert_array_equal(again, out)
    product = a.astype(np.float64) @ w.astype(np.float64) + (0 if epilogue == "none" else bias)
    want = ACTIVATIONS[epilogue](product).reshape(height, width, n // block, block).transpose(2, 0, 1, 3)
    np.testing.assert_allclose(out[:, pad : pad + height, pad : pad + width, :], want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    inside = np.zeros(out.shape, bool)
    inside[:, pad : pad + height, pad : pad + width, :] = True
    assert np.all(np.isnan(out[~inside]))


def _block(
    channels: int, activation: str, stride: int, readers: int, size: int, kernel: int = 3, pads: tuple[int, ...] = (1, 1, 1, 1), dilation: int = 1
) -> onnx.ModelProto:
    """An expansion 1x1 conv (+ activation) of a ``size`` x ``size`` image, then a depthwise conv
    (3x3 unless told) of the given stride (and, with ``readers`` 2, a second reader of the
    expansion's result)."""
    rng = np.random.default_rng(channels)
    n = helper.make_node
    nodes = [n("Conv", ["x", "we", "be"], ["e"])]
    act = "e"
    if activation == "relu":
        nodes.append(n("Relu", ["e"], ["a"]))
        act = "a"
    elif activation == "hardswish":
        nodes.append(n("HardSwish", ["e"], ["a"]))
        act = "a"
    elif activation == "silu":
        nodes += [n("Sigmoid", ["e"], ["s"]), n("Mul", ["e", "s"], ["a"])]
        act = "a"
    nodes.append(n("Conv", [act, "wd", "bd"], ["y"], group=channels, kernel_shape=[kernel, kernel], pads=list(pads), strides=[stride, stride], dilations=[dilation, dilation]))
    outputs = ["y"] + (["z"] if readers == 2 else [])
    if readers == 2:
        nodes.append(n("ReduceMean", [act], ["z"], axes=[2, 3], keepdims=1))
    inits = {
        "we": rng.standard_normal((channels, 16, 1, 1)).astype(np.float32) * 0.3,
        "be": rng.standard_normal(channels).astype(np.float32),
        "wd": rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32) * 0.3,
        "bd": rng.standard_normal(channels).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, size, size])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("channels", "activation", "stride", "size"), [(32, "silu", 2, 20), (48, "hardswish", 2, 17), (24, "relu", 2, 20), (16, "none", 2, 9), (32, "relu", 1, 7), (192, "silu", 1, 7)]
)
@pytest.mark.parametrize("threads", [1, 2])
def test_an_expansion_feeding_a_blocked_depthwise_conv_is_stored_blocked(channels: int, activation: str, stride: int, size: int, threads: int) -> None:
    """Both block widths (24 channels: 8), both thread splits (a large image by rows, a small one by
    column panels), each activation the product applies."""
    model = _block(channels, activation, stride, readers=1, size=size)
    compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))
    session = ort_session(model, threads=1)
    for seed in (0, 1):  # the second run finds the padding the first left (the pinned buffer's zeros)
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, 16, size, size)).astype(np.float32)}
        got = compiled(feeds)["y"]
        want = session.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    exe = compiled.executable_for(feeds)
    blocked = [s for s in exe.program.steps if isinstance(s, MatMulStep) and s.blocked is not None]
    assert len(blocked) == 1 and exe.program.pinned == {blocked[0].out.name}
    assert not any(isinstance(s, KernelStep) and s.kernel.name.startswith("nchwc_") for s in exe.program.steps)  # no reorder copy
    start = exe.plan.offsets[blocked[0].out.name]
    end = start + blocked[0].out.nbytes
    others = [(exe.plan.offsets[b.name], exe.plan.offsets[b.name] + b.nbytes) for b in exe.program.buffers().values() if b.name in exe.plan.offsets and b.name != blocked[0].out.name]
    assert all(e <= start or end <= o for o, e in others)  # no other buffer shares its memory
    compiled.close()


@pytest.mark.parametrize(
    ("channels", "activation", "size", "kernel", "pads", "dilation"),
    [
        (32, "silu", 20, 3, (1, 1, 1, 1), 1),  # whole vectors per plane (400 positions)
        (48, "relu", 14, 3, (1, 1, 1, 1), 1),  # 196 positions: a 208-float plane of outputs
        (24, "hardswish", 28, 5, (2, 2, 2, 2), 1),
        (16, "silu", 12, 5, (1, 0, 3, 4), 1),  # padding uneven (none left, four right)
        (16, "none", 10, 3, (2, 2, 2, 2), 2),  # dilated
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_an_expansion_feeding_a_flat_depthwise_conv_stores_into_its_row_padded_planes(
    channels: int, activation: str, size: int, kernel: int, pads: tuple[int, ...], dilation: int, threads: int
) -> None:
    """The product stores C's rows into the conv's planes (zero rows above and below, pinned) with
    no padded copy; the conv masks the taps that fall left or right of the image. An infinite
    input at an image edge poisons the outputs whose windows hold it and not their neighbours
    across the edge (a mask that multiplied instead of selecting would make them NaN)."""
    model = _block(channels, activation, 1, readers=1, size=size, kernel=kernel, pads=pads, dilation=dilation)
    compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))
    session = ort_session(model, threads=1)
    for seed in (0, 1, 2):  # later runs find the padding the first left (the pinned buffer's zeros)
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, 16, size, size)).astype(np.float32)}
        if seed == 2:
            feeds["x"][0, :, 3, size - 1] = np.inf
        got = compiled(feeds)["y"]
        want = session.run(None, feeds)[0]
        assert np.array_equal(np.isfinite(got), np.isfinite(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4 * float(np.abs(want[finite]).max()))
    exe = compiled.executable_for(feeds)
    stored = [s for s in exe.program.steps if isinstance(s, MatMulStep) and s.c_rows is not None]
    assert len(stored) == 1 and exe.program.pinned == {stored[0].out.name}
    assert not any(isinstance(s, KernelStep) and s.kernel.name.startswith("pad_") for s in exe.program.steps)  # no padded copy
    compiled.close()


@pytest.mark.parametrize("stride", [1, 2])
def test_an_expansion_with_another_reader_is_stored_as_before(stride: int) -> None:
    model = _block(32, "silu", stride, readers=2, size=20)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 16, 20, 20)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)
    steps = compiled.executable_for(feeds).program.steps
    assert not any(isinstance(s, MatMulStep) and (s.blocked is not None or s.c_rows is not None) for s in steps)
    for name, want in zip(["y", "z"], ort_session(model, threads=1).run(None, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    compiled.close()


@pytest.mark.parametrize("output", [False, True])
def test_a_small_depthwise_result_is_stored_channels_last_for_its_position_major_readers(output: bool) -> None:
    """A 7 x 7 stage: the depthwise conv stores [H, W, C] (its squeeze-excitation pool and the
    projection read it by channel runs); as a graph output it stays NCHW."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    c = 96
    nodes = [
        n("Conv", ["x", "wd", "bd"], ["d"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("GlobalAveragePool", ["d"], ["s"]),
        n("Conv", ["s", "wg"], ["g"]),
        n("Sigmoid", ["g"], ["gs"]),
        n("Mul", ["d", "gs"], ["m"]),
        n("Conv", ["m", "wp"], ["y"]),
    ]
    inits = {
        "wd": rng.standard_normal((c, 1, 3, 3)).astype(np.float32) * 0.3,
        "bd": rng.standard_normal(c).astype(np.float32),
        "wg": rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.1,
        "wp": rng.standard_normal((64, c, 1, 1)).astype(np.float32) * 0.1,
    }
    outputs = ["y", "d"] if output else ["y"]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 7, 7])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, c, 7, 7)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)
    for name, want in zip(outputs, ort_session(model, threads=1).run(None, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    depthwise = [s.kernel for s in compiled.executable_for(feeds).program.steps if isinstance(s, KernelStep) and s.kernel.name.startswith("bdconv_")]
    assert len(depthwise) == 1
    stored = next(b for b in depthwise[0].params if b.name in depthwise[0].outputs)
    assert stored.shape == ((1, c, 7, 7) if output else (1, 7, 7, c))
    compiled.close()


def test_a_gated_projection_reads_the_row_padded_conv_output_where_it_lies() -> None:
    """EfficientNet's 14 x 14 block: the flat depthwise conv's output planes are 208 floats apart
    (whole vectors of 196 positions); its squeeze-excitation's projection (no bias, as the dynamo
    export has it) reads them as B's rows 208 apart and scales them as it packs them, with no copy
    of the gated image."""
    rng = np.random.default_rng(7)
    n = helper.make_node
    c = 48
    nodes = [
        n("Conv", ["x", "we", "be"], ["e"]),
        n("Sigmoid", ["e"], ["es"]),
        n("Mul", ["e", "es"], ["a"]),
        n("Conv", ["a", "wd", "bd"], ["d"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("GlobalAveragePool", ["d"], ["s"]),
        n("Conv", ["s", "wg", "bg"], ["g"]),
        n("Sigmoid", ["g"], ["gs"]),
        n("Mul", ["d", "gs"], ["m"]),
        n("Conv", ["m", "wp"], ["y"]),
    ]
    shapes = {"we": (c, 16, 1, 1), "be": (c,), "wd": (c, 1, 3, 3), "bd": (c,), "wg": (c, c, 1, 1), "bg": (c,), "wp": (24, c, 1, 1)}
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name) for name, shape in shapes.items()]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 16, 14, 14)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)["y"]
    (want,) = ort_session(model, threads=1).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    steps = compiled.executable_for(feeds).program.steps
    products = [s for s in steps if isinstance(s, MatMulStep)]
    assert [s.c_rows is not None for s in products] == [True, False]
    projection = products[1]
    assert projection.b_scale is not None and projection.b.strides[-2] == 208
    assert not any(isinstance(s, KernelStep) and ("operand" in s.kernel.name or s.kernel.name.startswith("pad_")) for s in steps)
    compiled.close()
