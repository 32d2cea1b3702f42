"""Small ONNX models with one site of each partial rule: the tests run the ``small`` ones, the
benchmark (benchmarks/partial_rules.py) times the ``bench`` ones; one place builds both so the
two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Scale = Literal["small", "bench"]


def site_model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int]],
    outputs: dict[str, list[int] | None],
    weights: dict[str, tuple[int, ...]],
    *,
    weight_scale: float = 1.0,
    name: str = "partial",
) -> onnx.ModelProto:
    """A float32 opset-17 model; weights are seeded normal samples times ``weight_scale``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * weight_scale).astype(np.float32), n) for n, s in weights.items()]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv(n: int, c: int, hw: tuple[int, int], k: int, scale: float) -> onnx.ModelProto:
    return site_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
        {"x": [n, c, *hw]}, {"y": [n, k, *hw]}, {"w": (k, c, 3, 3), "b": (k,)}, weight_scale=scale,
    )


def _concat_width(c: int, k: int, h: int, w1: int, w2: int, scale: float) -> onnx.ModelProto:
    return site_model(
        [helper.make_node("Conv", [x, "w", "b"], [y], pads=[1, 1, 1, 1]) for x, y in (("x1", "y1"), ("x2", "y2"))],
        {"x1": [1, c, h, w1], "x2": [1, c, h, w2]}, {"y1": [1, k, h, w1], "y2": [1, k, h, w2]},
        {"w": (k, c, 3, 3), "b": (k,)}, weight_scale=scale,
    )


def _dilated(c: int, k: int, hw: int, scale: float) -> onnx.ModelProto:
    return site_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2])],
        {"x": [1, c, hw, hw]}, {"y": [1, k, hw, hw]}, {"w": (k, c, 3, 3)}, weight_scale=scale,
    )


def _matmul(a: list[int], n: int, scale: float) -> onnx.ModelProto:
    return site_model(
        [helper.make_node("MatMul", ["a", "m"], ["y"])], {"a": a}, {"y": [*a[:-1], n]}, {"m": (a[-1], n)}, weight_scale=scale
    )


def _pool(op: str, shape: list[int], k: int, stride: int, pad: int) -> onnx.ModelProto:
    out = [*shape[:2], *((d + 2 * pad - k) // stride + 1 for d in shape[2:])]
    return site_model(
        [helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)],
        {"x": shape}, {"y": out}, {},
    )


def spp_block(channels: int = 64, size: int = 20, seed_scale: float = 0.1) -> onnx.ModelProto:
    """A YOLO-style spatial-pyramid-pooling block: 1x1 Conv, MaxPool 5/9/13 (stride 1, 'same'),
    Concat with the Conv's output, 1x1 Conv: where separable pooling pays."""
    half = channels // 2
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        *(helper.make_node("MaxPool", ["r"], [f"p{k}"], kernel_shape=[k, k], pads=[k // 2] * 4) for k in (5, 9, 13)),
        helper.make_node("Concat", ["r", "p5", "p9", "p13"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["y"]),
    ]
    return site_model(
        nodes,
        {"x": [1, channels, size, size]},
        {"y": [1, channels, size, size]},
        {"w1": (half, channels, 1, 1), "b1": (half,), "w2": (channels, 4 * half, 1, 1), "b2": (channels,)},
        weight_scale=seed_scale,
        name="spp-block",
    )


def _conv_transpose(n: int, c: int, hw: int, k: int, kernel: int, scale: float) -> onnx.ModelProto:
    """A stride-2 ConvTranspose (kernel 4: pads 1; kernel 3: pads 1, output_padding 1): twice the size."""
    extra: dict[str, Any] = {"output_padding": [1, 1]} if kernel == 3 else {}
    return site_model(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[kernel] * 2, strides=[2, 2], pads=[1] * 4, **extra)],
        {"x": [n, c, hw, hw]}, {"y": [n, k, 2 * hw, 2 * hw]}, {"w": (c, k, kernel, kernel), "b": (k,)}, weight_scale=scale,
    )


def decoder_block(channels: int = 64, size: int = 28, seed_scale: float = 0.05) -> onnx.ModelProto:
    """A DCGAN/U-Net-style decoder: two ConvTranspose (kernel 4, stride 2, pads 1) + Relu upsamplings
    halving the channels, then a 3x3 Conv to 3 channels: where sub-pixel convolution pays."""
    half, quarter = channels // 2, channels // 4
    up: dict[str, Any] = {"kernel_shape": [4, 4], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["u1"], **up),
        helper.make_node("Relu", ["u1"], ["r1"]),
        helper.make_node("ConvTranspose", ["r1", "w2", "b2"], ["u2"], **up),
        helper.make_node("Relu", ["u2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], pads=[1, 1, 1, 1]),
    ]
    return site_model(
        nodes,
        {"x": [1, channels, size, size]},
        {"y": [1, 3, 4 * size, 4 * size]},
        {"w1": (channels, half, 4, 4), "b1": (half,), "w2": (half, quarter, 4, 4), "b2": (quarter,), "w3": (3, quarter, 3, 3), "b3": (3,)},
        weight_scale=seed_scale,
        name="decoder-block",
    )


def _pointwise_pair(c: int, mid: int, k: int, hw: tuple[int, int], scale: float) -> onnx.ModelProto:
    return site_model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["m"]), helper.make_node("Conv", ["m", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])],
        {"x": [1, c, *hw]}, {"y": [1, k, *hw]}, {"w1": (mid, c, 1, 1), "b1": (mid,), "w2": (k, mid, 3, 3), "b2": (k,)},
        weight_scale=scale,
    )


def linear_bottleneck(channels: int = 24, expansion: int = 4, size: int = 56, seed_scale: float = 0.1) -> onnx.ModelProto:
    """A residual block whose 1x1 expansion feeds a 3x3 Conv with no activation between (a linear
    bottleneck): where merging the pair into one 3x3 Conv with a border correction pays."""
    wide = channels * expansion
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["e"]),
        helper.make_node("Conv", ["e", "w2", "b2"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    return site_model(
        nodes,
        {"x": [1, channels, size, size]},
        {"y": [1, channels, size, size]},
        {"w1": (wide, channels, 1, 1), "b1": (wide,), "w2": (channels, wide, 3, 3), "b2": (channels,)},
        weight_scale=seed_scale,
        name="linear-bottleneck",
    )


MODELS: dict[str, dict[Scale, Callable[[], onnx.ModelProto]]] = {
    "conv-spatial-to-batch": {
        "small": lambda: _conv(1, 3, (16, 12), 4, 1.0),
        "bench": lambda: _conv(1, 16, (128, 64), 16, 0.1),
    },
    "pool-spatial-to-batch": {
        "small": lambda: _pool("MaxPool", [1, 3, 16, 16], 3, 2, 1),
        "bench": lambda: _pool("AveragePool", [1, 32, 128, 128], 3, 1, 1),
    },
    "conv-concat-width": {
        "small": lambda: _concat_width(3, 4, 8, 10, 12, 1.0),
        "bench": lambda: _concat_width(16, 16, 16, 16, 16, 0.1),
    },
    "dilated-conv-to-batch": {
        "small": lambda: _dilated(3, 4, 12, 1.0),
        "bench": lambda: _dilated(32, 32, 64, 0.1),
    },
    "matmul-batch-to-gemm": {
        "small": lambda: _matmul([2, 5, 8], 6, 1.0),
        "bench": lambda: _matmul([8, 64, 256], 256, 0.1),
    },
    "conv-transpose-subpixel": {
        "small": lambda: _conv_transpose(1, 3, 5, 4, 4, 1.0),
        "bench": lambda: _conv_transpose(1, 64, 56, 32, 4, 0.1),
    },
    "conv-pointwise-merge": {
        "small": lambda: _pointwise_pair(2, 6, 3, (17, 16), 1.0),  # odd height: no spatial-to-batch site on m
        "bench": lambda: _pointwise_pair(24, 96, 24, (56, 56), 0.1),
    },
}
"""Rule -> scale -> a model with exactly one site of that rule."""


def all_sites_model(scale: Scale = "small") -> onnx.ModelProto:
    """Every rule's site model side by side in one graph (names prefixed by the rule), so one
    import finds the sites of all rules (a fresh e-graph costs seconds)."""
    from onnx import compose

    parts = [compose.add_prefix(build[scale](), f"{rule}/") for rule, build in MODELS.items()]
    graph = helper.make_graph(
        [n for p in parts for n in p.graph.node],
        f"partial-sites-{scale}",
        [i for p in parts for i in p.graph.input],
        [o for p in parts for o in p.graph.output],
        initializer=[t for p in parts for t in p.graph.initializer],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
