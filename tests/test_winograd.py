"""Winograd convs (lowering/winograd.py): the transform matrices compute a correlation, and
compiled 3x3 convs (both tile sizes, whole and partial tiles, batches, pads, bias, activation,
a residual block kept channels last, a strided conv reading it) match onnxruntime; the lowering
chooses Winograd exactly where it should."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.extract.conv_algorithm import winograd_tile
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.latency import ort_session
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep
from onnxsat.lowering.winograd import TRANSFORMS, transform_weight


@pytest.mark.parametrize("m", sorted(TRANSFORMS))
def test_transforms_compute_a_correlation(m: int) -> None:
    """``A^T ((G g) * (B^T d))`` is ``y[i] = sum_k d[i + k] g[k]`` for m outputs (ONNX's Conv is a
    correlation), and the 2-D weight transform is ``G g G^T``."""
    t = TRANSFORMS[m]
    rng = np.random.default_rng(m)
    for _ in range(20):
        d, g = rng.standard_normal(m + 2), rng.standard_normal(3)
        want = np.array([d[i : i + 3] @ g for i in range(m)])
        np.testing.assert_allclose(t.at @ ((t.g @ g) * (t.bt @ d)), want, rtol=0, atol=1e-12)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    u = transform_weight(w, m)
    assert u.shape == (t.alpha**2, 3, 5) and u.dtype == np.float32
    for o in range(5):
        for c in range(3):
            np.testing.assert_allclose(u[:, c, o].reshape(t.alpha, t.alpha), t.g @ w[o, c] @ t.g.T, rtol=1e-6, atol=1e-6)


def _conv_model(cin: int, cout: int, shape: tuple[int, int], batch: int, pads: list[int], bias: bool, relu: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(cin * cout + shape[0])
    inits = [numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c" if relu else "y"], pads=pads, kernel_shape=[3, 3])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, *shape])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kernel_names(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[str]:
    program = lower(model, {k: v.shape for k, v in feeds.items()}, {}, gemm_epilogues=True)
    return [s.kernel.name for s in program.steps if isinstance(s, KernelStep)]


def _check_against_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: object) -> None:
    want = ort_session(model, threads=1).run(None, feeds)
    got = CompiledModel(model, CompileOptions(threads=2, cache_dir=str(tmp_path)))(feeds)
    for value, ref in zip(got.values(), want, strict=True):
        assert value.shape == ref.shape
        assert np.abs(value - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-6


@pytest.mark.parametrize(
    ("cin", "cout", "shape", "batch", "pads", "bias", "relu", "m"),
    [
        (64, 64, (16, 16), 1, [1, 1, 1, 1], True, True, 4),  # whole 4 x 4 tiles
        (32, 48, (18, 21), 1, [1, 1, 1, 1], True, False, 4),  # partial tiles: a strided view of the grid
        (48, 32, (9, 11), 1, [1, 1, 1, 1], False, True, 2),
        (64, 128, (8, 8), 2, [1, 1, 1, 1], True, True, 2),  # a batch: tiles of both images in one product
        (32, 32, (20, 17), 1, [0, 2, 1, 0], True, False, 4),  # asymmetric pads
        (32, 64, (10, 10), 1, [0, 0, 0, 0], True, True, 2),  # no padding
        (256, 256, (14, 14), 1, [1, 1, 1, 1], True, False, 2),  # ResNet's 14 x 14 stage: long sums
        (64, 64, (56, 56), 1, [1, 1, 1, 1], True, True, 4),  # ResNet's 56 x 56 stage
    ],
)
def test_winograd_conv_matches_onnxruntime(cin: int, cout: int, shape: tuple[int, int], batch: int, pads: list[int], bias: bool, relu: bool, m: int, tmp_path: object) -> None:
    model = _conv_model(cin, cout, shape, batch, pads, bias, relu)
    out_sp = (shape[0] + pads[0] + pads[2] - 2, shape[1] + pads[1] + pads[3] - 2)
    assert winograd_tile((batch, cin, *shape), (cout, cin, 3, 3), 1, [3, 3], [1, 1], [1, 1], out_sp) == m
    feeds = {"x": np.random.default_rng(1).standard_normal((batch, cin, *shape)).astype(np.float32)}
    names = _kernel_names(model, feeds)
    # the padded copy, the two transforms (the second applies bias and Relu), the NCHW output copy
    assert len(names) == 4 and names[0].endswith("_nhwc") and [n.split("_")[0] for n in names[1:3]] == ["wgin", "wgout"], names
    _check_against_onnxruntime(model, feeds, tmp_path)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "group", "strides", "out_sp"),
    [
        ((1, 16, 56, 56), (64, 16, 3, 3), 1, [1, 1], (56, 56)),  # too few input channels
        ((1, 64, 56, 56), (64, 64, 3, 3), 1, [2, 2], (28, 28)),  # strided
        ((1, 64, 56, 56), (64, 32, 3, 3), 2, [1, 1], (56, 56)),  # grouped
        ((1, 512, 6, 6), (512, 512, 3, 3), 1, [1, 1], (6, 6)),  # 9 tiles: too few rows for the products
        ((1, 64, 56, 56), (64, 64, 5, 5), 1, [1, 1], (56, 56)),  # 5x5
    ],
)
def test_winograd_is_not_chosen_outside_its_range(x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int, strides: list[int], out_sp: tuple[int, int]) -> None:
    assert winograd_tile(x_shape, w_shape, group, list(w_shape[2:]), strides, [1, 1], out_sp) is None


def _residual_model(channels: int, size: int) -> onnx.ModelProto:
    """A ResNet basic block (conv, relu, conv, add the input, relu), then a strided 3x3 conv and a
    strided 1x1 conv (a downsample) reading the block's channels-last output."""
    rng = np.random.default_rng(channels)
    inits = []

    def weight(name: str, cout: int, k: int) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, channels, k, k)) / np.sqrt(k * k * channels)).astype(np.float32), name))
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), name + "_b"))
        return name

    n = helper.make_node
    nodes = [
        n("Conv", ["x", weight("w1", channels, 3), "w1_b"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", weight("w2", channels, 3), "w2_b"], ["c2"], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "x"], ["s"]),
        n("Relu", ["s"], ["block"]),
        n("Conv", ["block", weight("w3", 2 * channels, 3), "w3_b"], ["down3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Conv", ["block", weight("w4", 2 * channels, 1), "w4_b"], ["down1"], strides=[2, 2]),
        n("Add", ["down3", "down1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("channels", "size"), [(64, 16), (32, 9)])
def test_residual_block_stays_channels_last(channels: int, size: int, tmp_path: object) -> None:
    """The residual Add and Relu store channels last (the Winograd conv's layout), the strided convs
    read that store as windows of channels, and the result comes out NCHW and right."""
    model = _residual_model(channels, size)
    feeds = {"x": np.random.default_rng(2).standard_normal((1, channels, size, size)).astype(np.float32)}
    program = lower(model, {"x": feeds["x"].shape}, {}, gemm_epilogues=True)
    kernels = [s.kernel for s in program.steps if isinstance(s, KernelStep)]
    assert sum(k.name.startswith("wgout_") for k in kernels) == 2
    stored = [b.shape for k in kernels if k.name.endswith("_block") for b in k.params if b.name in k.outputs]
    assert stored == [(1, size, size, channels)], "the residual Add + Relu is stored channels last"
    names = [k.name for k in kernels]  # no implicit GEMM's padded copy or phases, no im2col
    assert sum(n.endswith("_windows") for n in names) == 2 and not any(n.startswith("pad_") or n.endswith(("_phases", "_im2col")) for n in names), names
    _check_against_onnxruntime(model, feeds, tmp_path)
