"""``fuzz_models``: the hypothesis strategy drawing a random valid model (a ``FuzzCase``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import onnx
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from . import motifs, ops
from .builder import BATCH, MAX_DIM, OPSETS, Dims, FuzzCase, GraphBuilder

GENERATORS: dict[str, Callable[[GraphBuilder], None]] = {
    **{op: (lambda b, op=op: ops.gen_unary(b, op)) for op in ops.UNARY},
    **{op: (lambda b, op=op: ops.gen_binary(b, op)) for op in ops.BINARY},
    "Clip": ops.gen_clip,
    "MatMul": ops.gen_matmul,
    "Gemm": ops.gen_gemm,
    "Conv": ops.gen_conv,
    **{op: (lambda b, op=op: ops.gen_pool(b, op)) for op in ("MaxPool", "AveragePool", "GlobalAveragePool")},
    "LayerNormalization": ops.gen_layer_norm,
    "ConvTranspose": ops.gen_conv_transpose,
    "LRN": ops.gen_lrn,
    "Gelu": ops.gen_gelu,
    "Transpose": ops.gen_transpose,
    "Reshape": ops.gen_reshape,
    "Flatten": ops.gen_flatten,
    "Squeeze/Unsqueeze": ops.gen_squeeze_unsqueeze,
    "Concat": ops.gen_concat,
    "Split": ops.gen_split,
    "Slice": ops.gen_slice,
    "Gather": ops.gen_gather,
    "Expand": ops.gen_expand,
    "Pad": ops.gen_pad,
    **{op: (lambda b, op=op: ops.gen_reduce(b, op)) for op in ("ReduceSum", "ReduceMean")},
    "Cast": ops.gen_cast,
    "Where": ops.gen_where,
    "ShapeChain": ops.gen_shape_chain,
    "Repeat": ops.gen_repeat,
    "MotifAlgebra": motifs.motif_algebra,
    "MotifMatMul": motifs.motif_matmul,
    "MotifParallel": motifs.motif_parallel,
    "MotifConv": motifs.motif_conv,
    "MotifLayout": motifs.motif_layout,
    "MotifShapeArith": motifs.motif_shape_arith,
    "MotifFusion": motifs.motif_fusion,
}
"""Generator name -> generator; Relu first, so an op choice shrinks towards it."""


def _input_dims(b: GraphBuilder, like: Dims | None) -> Dims:
    """A new input's dims: often ``like``'s or a broadcasting partner of them."""
    if like is not None and b.flag():
        return tuple(like)[b.integer(0, len(like)) :] if b.flag() else tuple(like)
    dims: list[Any] = [b.integer(1, MAX_DIM) for _ in range(b.integer(0, 4))]
    if b.symbolic and dims and b.flag():
        dims[0] = BATCH
    return tuple(dims)


@st.composite
def fuzz_models(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    max_ops: int = 8,
    only: Sequence[str] | None = None,
    exclude: Collection[str] = (),
) -> FuzzCase:
    """A random valid model: 1..3 inputs, 2..``max_ops`` generator calls, 1..3 outputs.

    ``only``/``exclude`` choose generators by their ``GENERATORS`` name.
    """
    choices = [g for g in GENERATORS if (only is None or g in only) and g not in exclude]
    opset = draw(st.sampled_from(OPSETS))
    b = GraphBuilder(draw, opset, seed=draw(st.integers(0, 2**16)), symbolic=draw(st.booleans()))
    first = b.add_input(_input_dims(b, None), draw(st.sampled_from([TP.FLOAT] * 5 + [TP.DOUBLE, TP.INT64])))
    for _ in range(draw(st.integers(0, 2))):
        b.add_input(
            _input_dims(b, first.dims), draw(st.sampled_from([first.dtype] * 3 + [TP.BOOL, TP.INT64]))
        )
    for name in draw(st.lists(st.sampled_from(choices), min_size=2, max_size=max(2, max_ops))):
        emitted = len(b.nodes)
        GENERATORS[name](b)
        if len(b.nodes) == emitted:  # nothing fitted: one other generator instead
            GENERATORS[draw(st.sampled_from(choices))](b)
    computed = [t for t in b.pool if not t.const and t not in b.inputs]
    candidates = [t for t in b.pool if not t.const]
    outputs = [computed[-1] if computed else b.inputs[0]]
    for _ in range(draw(st.integers(0, 2))):  # intermediates or inputs too (each listed once)
        extra = candidates[draw(st.integers(0, len(candidates) - 1))]
        outputs += [extra] if extra not in outputs else []

    def info(t: Any) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(t.name, t.dtype, list(t.dims))

    graph = helper.make_graph(
        b.nodes, "fuzz", [info(t) for t in b.inputs], [info(t) for t in outputs], b.inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return FuzzCase(model, {t.name: (t.dims, t.dtype) for t in outputs})
