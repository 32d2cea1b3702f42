"""The calibration set: single-node models of every cost class at the sizes models run.

Each ``Sample`` is one ONNX node (or a chain of copies of it) with its shapes, what the cost model
sees of it (its e-graph op and attributes, so ``node_work`` gives its FLOPs and bytes) and its
role: fitted, held out (never fitted: the error on it is the model's prediction error), or a
dispatch sample (so small its time is all dispatch). ``onnxsat.calibrate`` times and fits them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .extract.cost import nchwc_reorders, node_work

OPSET = 17
_F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class Sample:
    """One single-node model: what ORT runs and what the cost model sees of it."""

    cls: str
    op_type: str
    op: str
    """The e-graph constructor (``node_work`` looks up its FLOP formula)."""
    inputs: tuple[tuple[int, ...], ...]
    weights: frozenset[int]
    """Indices of inputs that are initializers (read each run, like weights in a model)."""
    out_shape: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    """ONNX attributes of the node."""
    egraph_attrs: dict[str, Any] = field(default_factory=dict)
    """The same attributes as the e-graph constructor names them (for FLOP formulas)."""
    held_out: bool = False
    int_values: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Initializers that are int64 constants (Reshape's shape, Split's sizes), by input index."""
    outputs: int = 1
    """Outputs of one kernel (Split); ``out_shape`` is then their concatenation along axis 1, which
    is what the cost model's per-output nodes add up to."""
    dispatch: bool = False
    """A kernel so small that its time is all dispatch (and per-output hand-over): these samples
    pin the per-kernel and per-output costs, which the roofline fit then leaves alone."""
    chain: int = 1
    """Copies of the node run one after the other, each reading the previous one's output (a
    dispatch sample: the time per extra copy is what one more kernel costs inside a model,
    without the hand-over of a graph output that a single-node model also pays)."""
    fed: bool = False
    """Measured on onnxsat's target after a 1x1 conv that computes its input, as a depthwise conv
    runs in MobileNet and EfficientNet (fed by its expansion, whose product stores into the conv's
    padded input: the conv copies nothing); that conv alone (``feeder_model``) is timed too and
    its time taken off."""

    @property
    def label(self) -> str:
        shapes = "x".join(",".join(map(str, s)) for s in self.inputs)
        window = self.attrs.get("kernel_shape") if self.cls == "pool" else None
        label = f"{self.op_type}[{shapes}]" + (f"k{'x'.join(map(str, window))}" if window else "")
        return label + (f"*{self.chain}" if self.chain > 1 else "")

    def work(self) -> tuple[float, float]:
        dtypes: list[int | None] = [_F32] * len(self.inputs)
        return node_work(self.op, list(self.inputs), dtypes, self.out_shape, _F32, self.egraph_attrs)

    def reorders(self) -> tuple[int, float]:
        """(count, bytes) of the layout copies onnxruntime adds around this node alone (its
        input is a graph input)."""
        return nchwc_reorders(
            self.op, list(self.inputs), self.out_shape, reorder_input=True, reorder_output=True
        )

    def model(self, fed: bool = False) -> onnx.ModelProto:
        """The node (or chain); ``fed``: after the 1x1 conv of ``feeder_model``, which computes its input."""
        rng = np.random.default_rng(0)
        names = [f"in{i}" for i in range(len(self.inputs))]
        graph_inputs = [
            helper.make_tensor_value_info("src" if fed and i == 0 else n, _F32, s)
            for i, (n, s) in enumerate(zip(names, self.inputs, strict=True))
            if i not in self.weights
        ]
        inits = [
            numpy_helper.from_array(
                np.array(self.int_values[i], dtype=np.int64)
                if i in self.int_values
                else rng.standard_normal(self.inputs[i]).astype(np.float32),
                names[i],
            )
            for i in sorted(self.weights)
        ]
        if self.outputs == 1:
            outs = [helper.make_tensor_value_info("out", _F32, self.out_shape)]
        else:  # equal parts along axis 1 (Split)
            part = (self.out_shape[0], self.out_shape[1] // self.outputs, *self.out_shape[2:])
            outs = [helper.make_tensor_value_info(f"out{i}", _F32, part) for i in range(self.outputs)]
        links = [names[0]] + [f"t{j}" for j in range(self.chain - 1)] + [o.name for o in outs][:1]
        nodes = [
            helper.make_node(self.op_type, [links[j], *names[1:]], [links[j + 1]], **self.attrs)
            for j in range(self.chain - 1)
        ]
        if fed:
            feeder, feeder_inits = self._feeder("src", names[0])
            nodes.insert(0, feeder)
            inits += feeder_inits
        nodes.append(
            helper.make_node(self.op_type, [links[-2], *names[1:]], [o.name for o in outs], **self.attrs)
        )
        graph = helper.make_graph(nodes, f"calibrate_{self.op_type}", graph_inputs, outs, inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


    def _feeder(self, source: str, target: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        """A 1x1 conv with a bias from ``source`` to ``target``, both shaped like input 0."""
        channels = self.inputs[0][1]
        rng = np.random.default_rng(1)
        inits = [
            numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 1)) * 0.1).astype(np.float32), "feed_w"),
            numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "feed_b"),
        ]
        return helper.make_node("Conv", [source, "feed_w", "feed_b"], [target]), inits

    def feeder_model(self) -> onnx.ModelProto:
        """The 1x1 conv a ``fed`` sample runs first, alone."""
        node, inits = self._feeder("src", "out")
        shape = self.inputs[0]
        graph = helper.make_graph(
            [node], "calibrate_feeder", [helper.make_tensor_value_info("src", _F32, shape)],
            [helper.make_tensor_value_info("out", _F32, shape)], inits,
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _matmul(m: int, k: int, n: int, held: bool = False, dispatch: bool = False) -> Sample:
    return Sample(
        "matmul",
        "MatMul",
        "matmul",
        ((m, k), (k, n)),
        frozenset({1}),
        (m, n),
        held_out=held,
        dispatch=dispatch,
    )


def _gemm(m: int, k: int, n: int, held: bool = False) -> Sample:
    return Sample(
        "matmul", "Gemm", "gemm", ((m, k), (n, k), (n,)), frozenset({1, 2}), (m, n),
        {"transB": 1}, {"transB": 1}, held_out=held,
    )  # fmt: skip


def _conv(
    c: int, hw: int, o: int, k: int, stride: int = 1, held: bool = False, dispatch: bool = False, group: int = 1
) -> Sample:
    pad = k // 2
    out = (hw + 2 * pad - k) // stride + 1
    attrs = {"kernel_shape": [k, k], "pads": [pad] * 4, "strides": [stride] * 2, "group": group}
    return Sample(
        "conv", "Conv", "conv", ((1, c, hw, hw), (o, c // group, k, k), (o,)), frozenset({1, 2}),
        (1, o, out, out), attrs, held_out=held, dispatch=dispatch,
    )  # fmt: skip


def _depthwise(c: int, hw: int, k: int, stride: int = 1, held: bool = False) -> Sample:
    return replace(_conv(c, hw, c, k, stride, held, group=c), cls="depthwise", fed=True)


def _eltwise(
    op_type: str, op: str, shape: tuple[int, ...], arity: int, held: bool = False, dispatch: bool = False
) -> Sample:
    return Sample(
        "elementwise", op_type, op, (shape,) * arity, frozenset(), shape, held_out=held, dispatch=dispatch
    )


def _reduce(
    op_type: str, op: str, rows: int, cols: int, held: bool = False, dispatch: bool = False
) -> Sample:
    keep = op_type != "Softmax"
    attrs: dict[str, Any] = {"axes": [1], "keepdims": 1} if keep else {"axis": 1}
    out = (rows, 1) if keep else (rows, cols)
    return Sample(
        "reduce", op_type, op, ((rows, cols),), frozenset(), out, attrs, held_out=held, dispatch=dispatch
    )


def _transpose(
    shape: tuple[int, ...], perm: tuple[int, ...], held: bool = False, dispatch: bool = False
) -> Sample:
    out = tuple(shape[p] for p in perm)
    return Sample(
        "transpose", "Transpose", "transpose", (shape,), frozenset(), out, {"perm": list(perm)},
        held_out=held, dispatch=dispatch,
    )  # fmt: skip


def _concat(a: tuple[int, ...], b: tuple[int, ...], held: bool = False, dispatch: bool = False) -> Sample:
    out = (a[0], a[1] + b[1], *a[2:])
    return Sample(
        "layout", "Concat", "concat", (a, b), frozenset(), out, {"axis": 1}, held_out=held, dispatch=dispatch
    )


def _split(shape: tuple[int, ...], parts: int, held: bool = False, dispatch: bool = False) -> Sample:
    """Equal parts along axis 1 (the channels of a merged conv, the columns of a merged MatMul)."""
    return Sample(
        "split", "Split", "split", (shape, (parts,)), frozenset({1}), shape, {"axis": 1},
        {"num_outputs": parts}, held_out=held, int_values={1: (shape[1] // parts,) * parts}, outputs=parts,
        dispatch=dispatch,
    )  # fmt: skip


def _maxpool(
    c: int,
    hw: int,
    kernel: tuple[int, int] = (3, 3),
    stride: int = 2,
    held: bool = False,
    dispatch: bool = False,
) -> Sample:
    """A MaxPool with "same" pads; 3x3 stride 2 as in a CNN's stem, or a large stride-1 window as
    in a spatial-pyramid block (and its separable passes, k x 1 and 1 x k)."""
    kh, kw = kernel
    pads = [kh // 2, kw // 2, kh // 2, kw // 2]
    out_h, out_w = (hw + 2 * (kh // 2) - kh) // stride + 1, (hw + 2 * (kw // 2) - kw) // stride + 1
    attrs = {"kernel_shape": [kh, kw], "strides": [stride] * 2, "pads": pads}
    return Sample(
        "pool", "MaxPool", "max_pool", ((1, c, hw, hw),), frozenset(), (1, c, out_h, out_w), attrs,
        {"kernel": kernel}, held_out=held, dispatch=dispatch,
    )  # fmt: skip


def _gap(c: int, hw: int, held: bool = False, dispatch: bool = False) -> Sample:
    return Sample(
        "pool", "GlobalAveragePool", "global_average_pool", ((1, c, hw, hw),), frozenset(), (1, c, 1, 1),
        held_out=held, dispatch=dispatch,
    )  # fmt: skip


CHAIN = 8
"""Copies of a tiny node in a dispatch chain."""


def _chain(sample: Sample) -> Sample:
    """``CHAIN`` copies of a tiny shape-preserving node in a row (a dispatch sample)."""
    return replace(sample, dispatch=True, chain=CHAIN)


def samples(quick: bool = False) -> list[Sample]:
    """The calibration set: per class tiny dispatch-only kernels, several fit shapes and held-out
    shapes between them."""
    full = [
        _matmul(1, 16, 16, dispatch=True), _chain(_matmul(1, 16, 16)), _gemm(1, 16, 16), _matmul(1, 64, 64),
        _matmul(8, 64, 64), _matmul(1, 256, 256), _matmul(16, 512, 512), _matmul(64, 256, 1024),
        _matmul(256, 512, 256), _matmul(128, 1024, 512), _matmul(2, 1024, 1024), _matmul(1, 512, 2048), _gemm(64, 512, 512), _gemm(4, 128, 128),
        _matmul(32, 384, 768, True), _matmul(4, 1024, 512, True), _matmul(96, 128, 128, True),
        _gemm(16, 768, 256, True),
        _conv(8, 2, 8, 1, dispatch=True), _conv(16, 2, 16, 1, dispatch=True), _chain(_conv(16, 2, 16, 1)),
        _conv(3, 64, 16, 3), _conv(32, 28, 32, 3), _conv(64, 14, 128, 1), _conv(128, 7, 128, 3),
        _conv(16, 56, 16, 1), _conv(64, 28, 64, 3, stride=2), _conv(64, 56, 64, 1), _conv(256, 14, 64, 1),
        _conv(16, 28, 16, 1), _conv(8, 16, 8, 3), _conv(32, 28, 32, 1), _conv(32, 14, 32, 1, held=True),
        _conv(32, 56, 64, 1, held=True), _conv(64, 14, 64, 3, held=True), _conv(16, 32, 32, 3, held=True),
        _eltwise("Relu", "relu", (16,), 1, dispatch=True), _eltwise("Add", "add", (16,), 2, dispatch=True),
        _chain(_eltwise("Relu", "relu", (16,), 1)), _chain(_eltwise("Add", "add", (16,), 2)),
        _eltwise("Relu", "relu", (1000,), 1), _eltwise("Relu", "relu", (64, 256), 1),
        _eltwise("Relu", "relu", (256, 1024), 1), _eltwise("Relu", "relu", (1024, 1024), 1),
        _eltwise("Add", "add", (4, 1024), 2), _eltwise("Add", "add", (256, 256), 2),
        _eltwise("Add", "add", (512, 1024), 2), _eltwise("Mul", "mul", (128, 512), 2),
        _eltwise("Relu", "relu", (128, 512), 1, True), _eltwise("Add", "add", (64, 1024), 2, True),
        _eltwise("Mul", "mul", (1024, 1024), 2, True), _eltwise("Relu", "relu", (32, 64), 1, True),
        _reduce("ReduceMean", "reduce_mean", 4, 16, dispatch=True),
        _reduce("ReduceMean", "reduce_mean", 64, 256), _reduce("ReduceMean", "reduce_mean", 512, 1024),
        _reduce("Softmax", "softmax", 128, 128), _reduce("Softmax", "softmax", 256, 1024),
        _reduce("ReduceMean", "reduce_mean", 256, 768, True), _reduce("Softmax", "softmax", 64, 512, True),
        _transpose((4, 4), (1, 0), dispatch=True),
        _transpose((60, 60), (1, 0)), _transpose((1000, 1000), (1, 0)), _transpose((1, 64, 56, 56), (0, 2, 3, 1)),
        _transpose((200, 700), (1, 0)), _transpose((1, 16, 28, 28), (0, 2, 3, 1)),
        _transpose((500, 300), (1, 0), True), _transpose((1, 32, 28, 28), (0, 2, 3, 1), True),
        _concat((1, 4), (1, 4), dispatch=True),
        _concat((1, 32, 28, 28), (1, 32, 28, 28)), _concat((64, 512), (64, 256)),
        _concat((1, 16, 56, 56), (1, 16, 56, 56)), _concat((256, 1024), (256, 1024)),
        _concat((1, 64, 14, 14), (1, 128, 14, 14), True),
        _maxpool(4, 4, dispatch=True), _gap(4, 2, dispatch=True),
        _maxpool(64, 56), _maxpool(32, 28), _maxpool(128, 14), _gap(256, 7), _gap(1024, 7),
        _maxpool(32, 20, (5, 5), 1), _maxpool(32, 20, (9, 9), 1), _maxpool(32, 20, (1, 9), 1),
        _maxpool(32, 20, (5, 1), 1), _maxpool(64, 28, held=True), _gap(512, 14, True),
        _maxpool(32, 20, (13, 13), 1, True), _maxpool(32, 20, (1, 5), 1, True),
        # A graph output cannot alias a graph input, so ORT copies here: tiny tensors measure the dispatch.
        _split((1, 6), 2, dispatch=True), _split((1, 12), 4, dispatch=True),
        _split((64, 256), 2), _split((256, 768), 3), _split((16, 1024), 4), _split((4, 384), 3), _split((1, 192), 3),
        _split((1, 48, 28, 28), 3), _split((1, 128, 28, 28), 2), _split((1, 96, 7, 7), 3),
        _split((128, 600), 3, True), _split((1, 64, 14, 14), 2, True),
        Sample("view", "Reshape", "reshape", ((4, 4), (1,)), frozenset({1}), (16,), int_values={1: (-1,)}),
        Sample("view", "Reshape", "reshape", ((8, 8), (1,)), frozenset({1}), (64,), int_values={1: (-1,)}),
        # The sizes real models run: ResNet's 3x3 convs, MobileNet's and EfficientNet's depthwise
        # and 1x1 convs, BERT's and Whisper's products (a kernel's rate grows with its size, and
        # depthwise convs are bound by memory, not FLOPs).
        _conv(64, 56, 64, 3), _conv(128, 28, 128, 3), _conv(256, 14, 256, 3), _conv(512, 7, 512, 3),
        _conv(64, 56, 128, 3, stride=2, held=True), _conv(256, 14, 512, 3, stride=2, held=True),
        # the convs onnxsat runs as implicit GEMMs at these sizes (the 3x3 stride-1 ones above run
        # as Winograd on onnxsat-cpu, a class of their own): image heads and strided 3x3 convs
        _conv(3, 224, 64, 7, stride=2), _conv(3, 224, 16, 3, stride=2), _conv(128, 28, 256, 3, stride=2),
        _conv(96, 56, 24, 1), _conv(24, 56, 144, 1), _conv(240, 28, 40, 1), _conv(112, 14, 672, 1),
        _conv(960, 7, 160, 1), _conv(40, 28, 240, 1, held=True), _conv(672, 14, 112, 1, held=True),
        _depthwise(96, 112, 3), _depthwise(144, 56, 3), _depthwise(240, 28, 5), _depthwise(672, 14, 5),
        _depthwise(96, 112, 3, stride=2), _depthwise(576, 7, 5), _depthwise(144, 56, 5, stride=2, held=True),
        _depthwise(480, 14, 3, held=True), _depthwise(32, 112, 3, held=True),
        _matmul(128, 768, 768), _matmul(128, 768, 3072), _matmul(128, 3072, 768), _matmul(1500, 384, 384),
        _matmul(1500, 384, 1536, True), _matmul(128, 512, 2048, True),
        _reduce("Softmax", "softmax", 4096, 1500), _reduce("ReduceMean", "reduce_mean", 3000, 384),
        _reduce("Softmax", "softmax", 2048, 1024, True),
    ]  # fmt: skip
    if not quick:
        return full
    keep: dict[tuple[str, bool], int] = {}
    out = []
    # Per class: the dispatch samples, the first three fit samples and the first two held-out ones.
    for s in full:
        n = keep.get((s.cls, s.held_out), 0)
        if s.dispatch or n < (2 if s.held_out else 3):
            out.append(s)
            keep[(s.cls, s.held_out)] = n + (not s.dispatch)
    return out


def empty_model() -> onnx.ModelProto:
    """No node at all: what one ``run`` costs before any kernel."""
    x = helper.make_tensor_value_info("x", _F32, (1,))
    graph = helper.make_graph([], "empty", [x], [x])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
