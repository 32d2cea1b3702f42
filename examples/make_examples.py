"""Generate the small example ONNX models shipped in ``examples/``.

Deterministic: every model draws its weights from its own seeded numpy RNG, is built with
``onnx.helper`` only, and pins ``ir_version`` and opsets, so regenerating yields
byte-identical files (``tests/test_examples_models.py`` checks this).

Run ``python examples/make_examples.py`` to rewrite the files next to this script.

Models:

- ``transformer_block.onnx``: a BERT-style encoder block as the PyTorch exporter writes it
  (separate Q/K/V MatMuls, reshape/transpose head round trips, a Shape->Gather->Concat chain,
  Erf GELU, one fused and one decomposed LayerNorm).
- ``custom_op.onnx``: ``Relu -> com.example.MyOp -> Add``; ONNX Runtime cannot run it, on purpose.
- ``layout_algebra.onnx``: identities, transposes, reshapes and algebraic no-ops around a
  Conv+BatchNormalization and a MatMul+Add; its hand-derived minimum is in
  ``layout_algebra.expected.json`` (see :func:`layout_algebra`).
- ``small_cnn.onnx``: the quick-start CNN (Conv+BN+Relu x3, residual Add, pooling, Gemm, Softmax).
- ``inception_block.onnx``: four parallel branches concatenated on channels.
- ``control_flow.onnx``: an ``If`` whose branches capture an outer-scope tensor by name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsat.rules.pet.partial_models import decoder_block, linear_bottleneck, spp_block

IR_VERSION = 8
PRODUCER = "onnxsat-examples"

Dims = Sequence[int | str | None]


class _Builder:
    """Accumulates nodes and initializers of one graph, naming values ``<prefix><op>_<n>``."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{self.prefix}{stem}_{self._count}"

    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer (a weight) and return its name."""
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(self, array: np.ndarray | float | int, dtype: Any = np.float32) -> str:
        """Add a ``Constant`` node (how the PyTorch exporter writes scalars and indices)."""
        value = np.asarray(array, dtype=dtype)
        name = self._fresh("Constant")
        self.nodes.append(
            helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value))
        )
        return name

    def op(self, op_type: str, inputs: Sequence[str], domain: str = "", **attrs: Any) -> str:
        """Add a single-output node and return the name of its output."""
        name = self._fresh(op_type)
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [name], name=name, domain=domain or None, **attrs)
        )
        return name

    def rename_last_output(self, new_name: str) -> str:
        """Give the last node's output a public name (a graph output)."""
        self.nodes[-1].output[0] = new_name
        return new_name

    def graph(
        self, name: str, inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto]
    ) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.initializers)


def _value(name: str, elem_type: int, dims: Dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(dims))


def _model(
    graph: onnx.GraphProto, opset: int, extra_opsets: Sequence[tuple[str, int]] = ()
) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    return model


def _normal(rng: np.random.Generator, shape: Sequence[int], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _fan_in(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """He-style init: std sqrt(2 / fan_in), fan_in = product of all but the first dim (OIHW)."""
    fan_in = int(np.prod(shape[1:]))
    return _normal(rng, shape, math.sqrt(2.0 / fan_in))


def _conv(b: _Builder, rng: np.random.Generator, x: str, c_in: int, c_out: int, k: int, tag: str) -> str:
    """Conv with bias, 'same' padding, stride 1."""
    w = b.init(f"{tag}.weight", _fan_in(rng, [c_out, c_in, k, k]))
    bias = b.init(f"{tag}.bias", _normal(rng, [c_out], 0.1))
    pad = k // 2
    return b.op("Conv", [x, w, bias], kernel_shape=[k, k], pads=[pad] * 4, strides=[1, 1])


def _batch_norm(b: _Builder, rng: np.random.Generator, x: str, c: int, tag: str) -> str:
    """Inference BatchNormalization with random statistics and positive variance."""
    scale = b.init(f"{tag}.scale", (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32))
    shift = b.init(f"{tag}.shift", _normal(rng, [c], 0.1))
    mean = b.init(f"{tag}.mean", _normal(rng, [c], 0.1))
    var = b.init(f"{tag}.var", rng.uniform(0.5, 1.5, c).astype(np.float32))
    return b.op("BatchNormalization", [x, scale, shift, mean, var], epsilon=1e-5)


# --------------------------------------------------------------------------------------
# 1. transformer block
# --------------------------------------------------------------------------------------

VOCAB, HIDDEN, HEADS, HEAD_DIM, FFN = 100, 32, 2, 16, 64


def _linear(b: _Builder, rng: np.random.Generator, x: str, d_in: int, d_out: int, tag: str) -> str:
    """PyTorch nn.Linear as exported: MatMul by the transposed weight, then Add the bias."""
    w = b.init(f"{tag}.weight_t", _normal(rng, [d_in, d_out], 1.0 / math.sqrt(d_in)))
    bias = b.init(f"{tag}.bias", _normal(rng, [d_out], 0.02))
    return b.op("Add", [b.op("MatMul", [x, w]), bias])


def transformer_block() -> onnx.ModelProto:
    """A BERT-style encoder block (2 heads x 16, hidden 32, FFN 64), opset 17, as PyTorch exports it."""
    rng = np.random.default_rng(17)
    b = _Builder()
    ids, mask = "input_ids", "attention_mask"

    table = b.init("embeddings.word_embeddings.weight", _normal(rng, [VOCAB, HIDDEN], 0.5))
    x = b.op("Gather", [table, ids], axis=0)  # [batch, seq, hidden]

    # Q, K, V: three MatMuls on the same input.
    q = _linear(b, rng, x, HIDDEN, HIDDEN, "attention.self.query")
    k = _linear(b, rng, x, HIDDEN, HIDDEN, "attention.self.key")
    v = _linear(b, rng, x, HIDDEN, HIDDEN, "attention.self.value")

    # Head split of Q with a shape-computation target: Concat(batch, seq, heads, head_dim).
    shape = b.op("Shape", [x])
    batch = b.op("Unsqueeze", [b.op("Gather", [shape, b.const(0, np.int64)], axis=0), b.const([0], np.int64)])
    seq = b.op("Unsqueeze", [b.op("Gather", [shape, b.const(1, np.int64)], axis=0), b.const([0], np.int64)])
    split_shape = b.op(
        "Concat", [batch, seq, b.const([HEADS], np.int64), b.const([HEAD_DIM], np.int64)], axis=0
    )
    q = b.op("Transpose", [b.op("Reshape", [q, split_shape])], perm=[0, 2, 1, 3])  # [b, h, s, d]

    # K and V head splits with constant targets (0 copies the input dim, -1 is inferred).
    heads_target = b.init("heads_shape", np.array([0, -1, HEADS, HEAD_DIM], dtype=np.int64))
    k = b.op("Transpose", [b.op("Reshape", [k, heads_target])], perm=[0, 2, 1, 3])
    k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])  # key.transpose(-1, -2): [b, h, d, s]
    v = b.op("Transpose", [b.op("Reshape", [v, heads_target])], perm=[0, 2, 1, 3])

    scores = b.op("Div", [b.op("MatMul", [q, k_t]), b.const(math.sqrt(HEAD_DIM))])

    # Extended attention mask: (1 - mask[:, None, None, :].float()) * -1e4.
    ext = b.op("Cast", [b.op("Unsqueeze", [mask, b.const([1, 2], np.int64)])], to=TensorProto.FLOAT)
    bias = b.op("Mul", [b.op("Sub", [b.const(1.0), ext]), b.const(-10000.0)])
    probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)

    # Head merge: Transpose back, Reshape to [batch, seq, hidden].
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    merge_target = b.init("merge_shape", np.array([0, 0, HIDDEN], dtype=np.int64))
    ctx = b.op("Reshape", [ctx, merge_target])

    attn = _linear(b, rng, ctx, HIDDEN, HIDDEN, "attention.output.dense")
    h = b.op(
        "LayerNormalization",
        [
            b.op("Add", [attn, x]),
            b.init("attention.output.LayerNorm.weight", (1.0 + _normal(rng, [HIDDEN], 0.05))),
            b.init("attention.output.LayerNorm.bias", _normal(rng, [HIDDEN], 0.05)),
        ],
        axis=-1,
        epsilon=1e-12,
    )

    # FFN with the exporter's Erf GELU: x * 0.5 * (1 + erf(x / sqrt(2))) -> Div, Erf, Add, Mul, Mul.
    f = _linear(b, rng, h, HIDDEN, FFN, "intermediate.dense")
    erf = b.op("Erf", [b.op("Div", [f, b.const(math.sqrt(2.0))])])
    f = b.op("Mul", [b.op("Mul", [f, b.const(0.5)]), b.op("Add", [erf, b.const(1.0)])])
    f = _linear(b, rng, f, FFN, HIDDEN, "output.dense")
    r = b.op("Add", [f, h])

    # Decomposed LayerNorm, as older exports write it.
    mean = b.op("ReduceMean", [r], axes=[-1], keepdims=1)
    centered = b.op("Sub", [r, mean])
    var = b.op("ReduceMean", [b.op("Pow", [centered, b.const(2.0)])], axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, b.const(1e-12)])])
    normed = b.op("Div", [centered, std])
    gamma = b.init("output.LayerNorm.weight", 1.0 + _normal(rng, [HIDDEN], 0.05))
    beta = b.init("output.LayerNorm.bias", _normal(rng, [HIDDEN], 0.05))
    b.op("Add", [b.op("Mul", [normed, gamma]), beta])
    out = b.rename_last_output("last_hidden_state")

    graph = b.graph(
        "transformer_block",
        [_value(ids, TensorProto.INT64, ["batch", "seq"]), _value(mask, TensorProto.INT64, ["batch", "seq"])],
        [_value(out, TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
    )
    return _model(graph, 17)


# --------------------------------------------------------------------------------------
# 2. custom op
# --------------------------------------------------------------------------------------


def custom_op() -> onnx.ModelProto:
    """Relu -> com.example.MyOp -> Add; the custom node must survive import/export untouched."""
    rng = np.random.default_rng(2)
    b = _Builder()
    relu = b.op("Relu", ["x"])
    my = b.op(
        "MyOp",
        [relu],
        domain="com.example",
        alpha=0.5,
        mode="fast",
        axes=[0, 1],
        count=3,
        scales=[1.0, 2.0],
    )
    b.op("Add", [my, b.init("offset", _normal(rng, [1, 4], 1.0))])
    out = b.rename_last_output("y")
    graph = b.graph(
        "custom_op", [_value("x", TensorProto.FLOAT, [1, 4])], [_value(out, TensorProto.FLOAT, [1, 4])]
    )
    graph.value_info.append(_value(my, TensorProto.FLOAT, [1, 4]))
    return _model(graph, 13, extra_opsets=[("com.example", 1)])


# --------------------------------------------------------------------------------------
# 3. layout / algebra playground
# --------------------------------------------------------------------------------------

LAYOUT_ALGEBRA_EXPECTED: dict[str, Any] = {
    "min_ops": 5,
    "remaining_op_types": {"Conv": 1, "Gemm": 1, "Relu": 1, "Reshape": 1, "Transpose": 1},
}


LAYOUT_C_IN, LAYOUT_C, LAYOUT_N = 3, 16, 8


def layout_algebra() -> onnx.ModelProto:
    """A chain of removable layout and algebra no-ops around a few real ops, opset 13.

    The input is x: [batch, 3, height, width] with symbolic dims, so the same small file runs
    at any size: tests use tiny images, benchmarks/rule_latency.py large ones, where the passes
    onnxsat removes (onnxruntime does not remove all of them itself: Neg pairs, repeated Relu)
    cost real time next to the Conv. C = 16 channels after the Conv. The chain and what the
    obvious simplifications do with it:

    ==============================================  ===========================================
    Identity, Dropout (inference)                   removed (identities)
    Transpose[0,2,3,1] -> Transpose[0,3,1,2]        removed (inverse pair)
    Conv(3->C, 3x3, pad 1) -> BatchNormalization    one Conv (BN folded into weight and bias)
    Mul 1.0, Add 0.0                                removed (neutral elements)
    Neg -> Neg                                      removed (involution)
    Relu -> Relu                                    one Relu (idempotent)
    Transpose[0,2,1,3] -> Transpose[0,1,3,2]        one Transpose[0,2,3,1] (composition)
    Reshape[0, -1] -> Reshape[-1, C]                one Reshape[-1, C]
    MatMul([N, C] x [C, 8]) -> Add bias[8]          one Gemm
    Identity (feeding the graph output)             removed
    ==============================================  ===========================================

    Minimum: 5 ops, Conv, Relu, Transpose, Reshape, Gemm (6 if MatMul+Add is kept unfused).
    Nothing further is obvious: the Transpose permutes the spatial/channel axes before a
    flattening Reshape, which no single standard op does, and Relu cannot be folded into Conv
    in standard ONNX.
    """
    rng = np.random.default_rng(3)
    c_in, c, out_features = LAYOUT_C_IN, LAYOUT_C, LAYOUT_N
    b = _Builder()
    t = b.op("Identity", ["x"])
    t = b.op("Dropout", [t])
    t = b.op("Transpose", [b.op("Transpose", [t], perm=[0, 2, 3, 1])], perm=[0, 3, 1, 2])
    t = _batch_norm(b, rng, _conv(b, rng, t, c_in, c, 3, "conv"), c, "bn")  # [batch, c, height, width]
    t = b.op("Mul", [t, b.init("one", np.array(1.0, dtype=np.float32))])
    t = b.op("Add", [t, b.init("zero", np.array(0.0, dtype=np.float32))])
    t = b.op("Neg", [b.op("Neg", [t])])
    t = b.op("Relu", [b.op("Relu", [t])])
    t = b.op("Transpose", [b.op("Transpose", [t], perm=[0, 2, 1, 3])], perm=[0, 1, 3, 2])  # [batch, h, w, c]
    t = b.op("Reshape", [t, b.init("shape_a", np.array([0, -1], dtype=np.int64))])  # [batch, h * w * c]
    t = b.op("Reshape", [t, b.init("shape_b", np.array([-1, c], dtype=np.int64))])  # [batch * h * w, c]
    t = b.op("MatMul", [t, b.init("fc.weight_t", _normal(rng, [c, out_features], 0.5))])
    t = b.op("Add", [t, b.init("fc.bias", _normal(rng, [out_features], 0.1))])
    b.op("Identity", [t])
    out = b.rename_last_output("y")
    graph = b.graph(
        "layout_algebra",
        [_value("x", TensorProto.FLOAT, ["batch", c_in, "height", "width"])],
        [_value(out, TensorProto.FLOAT, ["positions", out_features])],
    )
    return _model(graph, 13)


# --------------------------------------------------------------------------------------
# 4. small CNN (quick start)
# --------------------------------------------------------------------------------------


def small_cnn() -> onnx.ModelProto:
    """Conv+BN+Relu x3 with a residual Add, MaxPool, GlobalAveragePool, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(4)
    b = _Builder()
    a = b.op("Relu", [_batch_norm(b, rng, _conv(b, rng, "input", 3, 8, 3, "conv1"), 8, "bn1")])
    t = b.op("Relu", [_batch_norm(b, rng, _conv(b, rng, a, 8, 8, 3, "conv2"), 8, "bn2")])
    t = _batch_norm(b, rng, _conv(b, rng, t, 8, 8, 3, "conv3"), 8, "bn3")
    t = b.op("Relu", [b.op("Add", [t, a])])  # residual, ResNet-style Relu after the Add
    t = b.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])  # [1, 8, 16, 16]
    t = b.op("Flatten", [b.op("GlobalAveragePool", [t])], axis=1)  # [1, 8]
    w = b.init("fc.weight", _normal(rng, [10, 8], 1.0 / math.sqrt(8)))
    t = b.op("Gemm", [t, w, b.init("fc.bias", _normal(rng, [10], 0.1))], transB=1)
    b.op("Softmax", [t], axis=1)
    out = b.rename_last_output("probs")
    graph = b.graph(
        "small_cnn",
        [_value("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [_value(out, TensorProto.FLOAT, [1, 10])],
    )
    return _model(graph, 13)


# --------------------------------------------------------------------------------------
# 5. inception block
# --------------------------------------------------------------------------------------


def inception_block() -> onnx.ModelProto:
    """Four parallel branches (1x1; 1x1->3x3; 3x3; MaxPool->1x1), each with Relu, Concat on channels."""
    rng = np.random.default_rng(5)
    b = _Builder()
    x = "input"
    b1 = b.op("Relu", [_conv(b, rng, x, 16, 8, 1, "branch1x1")])
    b2 = b.op("Relu", [_conv(b, rng, x, 16, 8, 1, "branch3x3_reduce")])
    b2 = b.op("Relu", [_conv(b, rng, b2, 8, 12, 3, "branch3x3")])
    b3 = b.op("Relu", [_conv(b, rng, x, 16, 8, 3, "branch3x3_direct")])
    pool = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b4 = b.op("Relu", [_conv(b, rng, pool, 16, 8, 1, "branch_pool")])
    b.op("Concat", [b1, b2, b3, b4], axis=1)
    out = b.rename_last_output("output")
    graph = b.graph(
        "inception_block",
        [_value(x, TensorProto.FLOAT, [1, 16, 14, 14])],
        [_value(out, TensorProto.FLOAT, [1, 36, 14, 14])],
    )
    return _model(graph, 13)


# --------------------------------------------------------------------------------------
# 6. control flow
# --------------------------------------------------------------------------------------


def control_flow() -> onnx.ModelProto:
    """An If whose branches read the outer-scope tensors ``h`` and ``scale`` by name (captures)."""
    rng = np.random.default_rng(6)
    b = _Builder()
    b.op("Add", ["x", b.init("bias", _normal(rng, [3], 0.5))])
    h = b.rename_last_output("h")  # captured by both branches
    scale = b.init("scale", _normal(rng, [2, 3], 1.0))  # outer initializer, captured by then

    then_b = _Builder("then/")
    then_b.op("Mul", [h, scale])
    then_out = then_b.rename_last_output("then_out")
    then_g = then_b.graph("then_branch", [], [_value(then_out, TensorProto.FLOAT, [2, 3])])

    else_b = _Builder("else/")
    else_b.op("Add", [else_b.op("Tanh", [h]), else_b.const(1.0)])
    else_out = else_b.rename_last_output("else_out")
    else_g = else_b.graph("else_branch", [], [_value(else_out, TensorProto.FLOAT, [2, 3])])

    branch = b.op("If", ["cond"], then_branch=then_g, else_branch=else_g)
    b.op("Relu", [b.op("Add", [branch, "x"])])
    out = b.rename_last_output("y")
    graph = b.graph(
        "control_flow",
        [_value("x", TensorProto.FLOAT, [2, 3]), _value("cond", TensorProto.BOOL, [])],
        [_value(out, TensorProto.FLOAT, [2, 3])],
    )
    return _model(graph, 13)


# --------------------------------------------------------------------------------------

MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "transformer_block": transformer_block,
    "custom_op": custom_op,
    "layout_algebra": layout_algebra,
    "small_cnn": small_cnn,
    "inception_block": inception_block,
    "control_flow": control_flow,
    "spp_block": spp_block,  # separable pooling pays here (issue 6, PET partial rules)
    "decoder_block": decoder_block,  # ConvTranspose as sub-pixel convolution (issue 6, PET partial rules)
    "linear_bottleneck": linear_bottleneck,  # 1x1 + 3x3 Conv merged, border corrected (issue 6, PET partial rules)
}


def main(out_dir: Path) -> list[Path]:
    """Write every example model (and layout_algebra.expected.json) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in MODELS.items():
        model = build()
        onnx.checker.check_model(model, full_check=True)
        path = out_dir / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        written.append(path)
    expected = out_dir / "layout_algebra.expected.json"
    expected.write_text(json.dumps(LAYOUT_ALGEBRA_EXPECTED, indent=2, sort_keys=True) + "\n")
    written.append(expected)
    return written


if __name__ == "__main__":
    for p in main(Path(__file__).resolve().parent):
        print(f"{p.name}: {p.stat().st_size} bytes")
