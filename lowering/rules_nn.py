"""Lowering rules of MatMul, Gemm and Conv (ConvTranspose: ``rules_conv_transpose``).

Matrix products become BLAS calls on strided views (a transposed weight is passed as a transpose
flag, not copied). A 3x3 stride-1 Conv of one group with enough channels and tiles runs as
Winograd (``winograd``; ``extract.conv_algorithm`` decides, as the cost model prices it), its
output stored channels last. Another 2-D Conv of one group whose taps overlap is an implicit GEMM:
the product reads shifted windows of its padded input (or of the input's stride phases) as B's
rows, with the bias and activation in its epilogue (``_implicit_conv``). A Conv of one group with
a small output image (a 7 x 7 last stage; 1x1 convs too), or reading a channels-last image, runs
position-major instead: one row per output position against the weight laid out [taps x C, M], so
the vector lanes run over output channels (``_position_major_conv``). A squeeze-excitation's
channel scale is applied as a 1x1 conv's product packs its input. Other convs are im2col (a kernel
that gathers windows, skipped for 1x1 convolutions) plus one batched GEMM whose output already has
the NCHW layout. A 1x1 Conv of a 1x1 image is a dot product per output channel, few output
channels per group a direct kernel, and a strided or narrow depthwise Conv a channel-blocked kernel
with its weight packed at compile time (conv_kernels); the 1x1 conv feeding such a conv stores its
product straight into that kernel's blocked, zero-padded input (``_blocked_pointwise``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsat.extract.conv_algorithm import winograd_tile
from onnxsat.extract.conv_layout import channel_block

from .channel_gate import channel_gate, channel_scaled
from .conv_kernels import (
    blocked_depthwise_conv,
    channels_last_padded,
    direct_conv,
    fits_direct,
    flat_slack,
    pack_depthwise_weight,
    phase_flat_geometry,
    phase_planes,
    phased_direct_conv,
    row_padded_depthwise,
    row_padded_geometry,
)
from .kernel_ir import (
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    add,
    i64,
    mul,
)
from .loops import buffers_of, reduction_kernel
from .operands import stored_in_source_order
from .program import (
    MIN_GAPPED_WIDTH,
    PACKED_GEMM_MAX_ROWS,
    BlockedImage,
    MatMulStep,
    ShiftedRows,
    StridedOperand,
)
from .rules_elementwise import hard_sigmoid, relu, sigmoid
from .rules_pool import padded_input, pool_geometry
from .table import NotLowered, lowering
from .values import (
    Index,
    Lazy,
    View,
    broadcast_shape,
    contiguous_strides,
    elementwise,
    general,
    nchw_view,
    of_buffer,
    of_view,
    reads_channels_last,
    reshape,
    transpose,
)
from .winograd import transform_weight, winograd_conv

GEMM_DTYPES = ("f32", "f64")
"""Element types of the products (and so of Conv and ConvTranspose, direct kernels included)."""


def _operand(cx: Any, x: Lazy) -> StridedOperand:
    """``x`` as a BLAS operand: a view whose matrices have a unit stride in one of the last two dims."""
    if x.is_view:
        v: View = x.view
        s = v.strides
        if len(s) >= 2 and (s[-1] == 1 or s[-2] == 1) and min(s[-2:]) >= 0 and all(st >= 0 for st in s):
            return StridedOperand(v.buffer, x.shape, s, v.offset)
    in_source_order = stored_in_source_order(cx, x)
    if in_source_order is not None:
        return in_source_order
    stored = cx.materialize(x, "operand")
    return StridedOperand(stored.view.buffer, x.shape, stored.view.strides, 0)


def matmul(
    cx: Any,
    a: Lazy,
    b: Lazy,
    out_tensor: str,
    alpha: float = 1.0,
    beta: float = 0.0,
    init: Lazy | None = None,
    epilogue: Epilogue | None = None,
    b_scale: Buffer | None = None,
    rows_in: tuple[Buffer, int, int] | None = None,
) -> Lazy:
    """``alpha * a @ (b_scale * b) (+ beta * init)`` with numpy matmul shapes (then the
    ``epilogue``'s bias and ReLU; ``b_scale``: one value per row of a 2-D ``b``); returns the
    stored result. ``rows_in``: C's rows are stored ``pitch`` apart from ``offset`` of that
    (buffer, pitch, offset) instead of packed (a flat depthwise conv's row-padded planes). A
    float16 product is computed in float32 and rounded once (onnxruntime's CPU MatMul on hardware
    without float16 arithmetic does the same)."""
    if a.dtype == b.dtype == "f16" and epilogue is None:
        def wide(x: Lazy) -> Lazy:
            return elementwise(lambda v: Cast(v, "f32"), [x], "f32")

        product = matmul(cx, wide(a), wide(b), f"{out_tensor}_f32", alpha, beta, None if init is None else wide(init))
        return elementwise(lambda v: Cast(v, "f16"), [product], "f16")
    if a.dtype != b.dtype or a.dtype not in GEMM_DTYPES:
        raise NotLowered(f"MatMul on {a.dtype}/{b.dtype}")
    a2 = reshape(a, (1, a.shape[0])) if len(a.shape) == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if len(b.shape) == 1 else b
    batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if b2.shape[-2] != k:
        raise NotLowered(f"MatMul shapes {a.shape} @ {b.shape}")
    full = (*batch, m, n)
    final = full
    if len(a.shape) == 1:
        final = final[:-2] + final[-1:]
    if len(b.shape) == 1:
        final = final[:-1]
    if rows_in is not None:
        assert init is None and k and final == full
        out, pitch, first = rows_in
        c_rows = StridedOperand(out, full, (*(st * m * pitch for st in contiguous_strides(batch)), pitch, 1), first)
        cx.emit(MatMulStep(_operand(cx, a2), _operand(cx, b2), out, alpha, beta, *_epilogue_fields(cx, epilogue), b_scale=b_scale, c_rows=c_rows))
        return of_view(View(out, c_rows.strides, first), full)
    out = cx.out_buffer(out_tensor, full, a.dtype) if final == full else cx.buffer(out_tensor, full, a.dtype)
    if init is not None:
        cx.emit_kernel(_fill(cx, init, out))
    if math.prod(full):
        if k == 0:
            if init is None:
                cx.emit_kernel(_fill(cx, general(full, a.dtype, lambda idx: Const(0.0, a.dtype), 1), out))
        else:
            a_op, b_op, step_out = batch_as_rows(_operand(cx, a2), _operand(cx, b2), out)
            cx.emit(MatMulStep(a_op, b_op, step_out, alpha, beta, *_epilogue_fields(cx, epilogue), b_scale=b_scale))
    result = of_buffer(out)
    return reshape(result, final) if final != full else result


def _epilogue_fields(cx: Any, epilogue: Epilogue | None) -> tuple[Buffer | None, bool, bool, str]:
    """``MatMulStep``'s bias, relu, bias_rows and activation for ``epilogue``."""
    if epilogue is None:
        return None, False, False, ""
    return cx.const_lazy(epilogue.bias).view.buffer, epilogue.relu, epilogue.rows, epilogue.activation


def batch_as_rows(a: StridedOperand, b: StridedOperand, out: Buffer) -> tuple[StridedOperand, StridedOperand, Buffer]:
    """A batch of products with one shared B as a single product: A's batch and row dims merged
    into rows of one stride, the (contiguous) output seen as 2-D. A sequence-first attention's
    projections (17 x 1 x 64 @ 64 x 192, A transposed) become one 17 x 64 GEMM instead of 17
    GEMVs, which also keeps the bias epilogue in the packed GEMM. Unchanged when the rows of A
    are not evenly spaced or B has batch dims."""
    if len(a.shape) <= 2 or len(b.shape) != 2:
        return a, b, out
    sizes, strides = a.shape[:-1], a.strides[:-1]
    kept = [(d, st) for d, st in zip(sizes, strides, strict=True) if d != 1]
    row_stride = kept[-1][1] if kept else a.shape[-1]
    expected = row_stride
    for d, st in reversed(kept):
        if st != expected:
            return a, b, out
        expected = st * d
    rows = math.prod(sizes)
    return (
        StridedOperand(a.buffer, (rows, a.shape[-1]), (row_stride, a.strides[-1]), a.offset),
        b,
        Buffer(out.name, out.dtype, (rows, out.shape[-1])),
    )


def _fill(cx: Any, x: Lazy, out: Any) -> Any:
    from .loops import materialize_kernel

    return materialize_kernel(f"fill_{out.name}", x, out)


@dataclass(frozen=True)
class Epilogue:
    """A bias row (N values) and whether ReLU follows, applied as a product's C tiles are stored."""

    bias: np.ndarray
    relu: bool
    tensor: str
    """The graph tensor the epilogue's result is (the Add's or the Relu's output)."""
    skipped: tuple[str, ...]
    """Tensors produced on the way (the product's own, the Add's), read by nothing else."""
    rows: bool = False
    """The bias is per row of the product (a Conv's ``W @ col``: one value per output channel)."""
    activation: str = ""
    """With ``rows``: ``silu`` or ``hardswish`` after the bias."""


def _sole_reader(cx: Any, tensor: str, same_kernel: bool = True) -> Any:
    """The one node that reads ``tensor`` (None: several, none, a subgraph, a graph output, or,
    with ``same_kernel``, a reader extraction put in another kernel than ``tensor``)."""
    if tensor in cx.output_names:
        return None
    readers = [i for i, node in enumerate(cx.graph.node) if tensor in node.input]
    if len(readers) != 1 or cx.last_use.get(tensor) != readers[0]:
        return None
    node = cx.graph.node[readers[0]]
    return node if node.domain in ("", "ai.onnx") and (not same_kernel or cx.same_kernel(tensor, node)) else None


def _packable(cx: Any, a: Lazy, b: Lazy) -> bool:
    """Whether the CPU backend will run ``a @ b`` on its packed GEMM, which applies epilogues (a
    product it cannot pack after all still gets its epilogue, from numpy, in a Python step)."""
    if not cx.gemm_epilogues or a.dtype != "f32" or b.dtype != "f32" or len(a.shape) < 2 or len(b.shape) != 2 or not b.is_view:
        return False
    if b.view.buffer.name not in cx.constants or math.prod(a.shape[:-1]) > PACKED_GEMM_MAX_ROWS:
        return False
    return not (a.is_view and any(s != c for s, c, d in zip(a.view.strides, contiguous_strides(a.shape), a.shape, strict=True) if d != 1))


def _epilogue(cx: Any, a: Lazy, b: Lazy, tensor: str) -> Epilogue | None:
    """The Add of a constant row (+ the Relu) that alone consume product ``tensor``, when the
    product will run on the packed GEMM (float32, 2-D constant weights, A's rows contiguous, few
    rows); None otherwise (the Add stays an elementwise node fused with what follows)."""
    if not _packable(cx, a, b):
        return None
    add = _sole_reader(cx, tensor)
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    other = add.input[1] if add.input[0] == tensor else add.input[0]
    n = b.shape[-1]
    row = cx.consts.get(other)
    if row is None or other == tensor or row.dtype != np.float32 or row.ndim > len(a.shape) or row.size != n or (row.ndim and row.shape[-1] != n):
        return None
    return _bias_row(cx, row.reshape(n), add.output[0], (tensor,))


def _bias_row(cx: Any, row: np.ndarray, tensor: str, skipped: tuple[str, ...]) -> Epilogue:
    """The bias ``row`` giving ``tensor``, with the Relu that alone reads it."""
    relu = _sole_reader(cx, tensor)
    if relu is not None and relu.op_type == "Relu":
        return Epilogue(row, True, relu.output[0], (*skipped, tensor))
    return Epilogue(row, False, tensor, skipped)


def _with_epilogue(cx: Any, nv: Any, a: Lazy, b: Lazy, epilogue: Epilogue) -> list[Any]:
    """``a @ b`` with the epilogue applied as it is stored: the nodes it covers are skipped, and
    values on the way, read by nothing else, are never stored."""
    y = matmul(cx, a, b, epilogue.tensor, epilogue=epilogue)
    if epilogue.tensor == nv.outputs[0]:
        return [y]
    cx.lazies[epilogue.tensor] = y
    cx.fuse(t for t in (*epilogue.skipped, epilogue.tensor) if t != nv.outputs[0])
    return [None]


@lowering("MatMul", kind="extern")
def _matmul(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    epilogue = _epilogue(cx, a, b, nv.outputs[0]) if a.dtype in GEMM_DTYPES else None
    if epilogue is None:
        return [matmul(cx, a, b, nv.outputs[0])]
    return _with_epilogue(cx, nv, a, b, epilogue)


@lowering("Gemm", kind="extern")
def _gemm(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    a, b = xs[0], xs[1]
    assert a is not None and b is not None
    c = xs[2] if len(xs) > 2 else None
    if nv.attr("transA", 0):
        a = transpose(a, [1, 0])
    if nv.attr("transB", 0):
        b = transpose(b, [1, 0])
    alpha, beta = float(nv.attr("alpha", 1.0)), float(nv.attr("beta", 1.0))
    n = b.shape[-1]
    row = cx.consts.get(nv.inputs[2]) if c is not None and len(nv.inputs) > 2 else None
    if row is not None and alpha == 1.0 and row.dtype == np.float32 and row.size == n and (row.ndim == 0 or row.shape[-1] == n) and _packable(cx, a, b):
        # a classifier's constant bias row is the packed GEMM's epilogue (a Linear layer's
        # 1 x K @ K x N streams its weights once instead of going through OpenBLAS's transposed path)
        return _with_epilogue(cx, nv, a, b, _bias_row(cx, (np.float32(beta) * row).reshape(n).astype(np.float32), nv.outputs[0], ()))
    init = None
    if c is not None and beta != 0.0:
        shape = (a.shape[0], b.shape[1])
        init = elementwise(lambda v: Binary("mul", v, Const(beta, a.dtype)) if beta != 1.0 else v, [c], a.dtype, shape=shape)
        init = elementwise(lambda v: v, [init], a.dtype, shape=shape)
    return [matmul(cx, a, b, nv.outputs[0], alpha, 1.0 if init is not None else 0.0, init)]


@lowering("Conv", kind="extern")
def _conv(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x, w = xs[0], xs[1]
    assert x is not None and w is not None
    bias = xs[2] if len(xs) > 2 else None
    if x.dtype not in GEMM_DTYPES or w.dtype != x.dtype:
        raise NotLowered(f"Conv on {x.dtype}/{w.dtype}")  # before any kernel is emitted
    n_sp = len(x.shape) - 2
    kernel, strides, dilations, out_sp, begin = _conv_attributes(nv, x.shape, w.shape)
    group = int(nv.attr("group", 1))
    in_sp = x.shape[2:]
    batch, cin = x.shape[:2]
    cout = w.shape[0]
    cg, mg = cin // group, cout // group
    ck = cg * math.prod(kernel)
    ohw = math.prod(out_sp)
    dt = x.dtype
    pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin) and tuple(out_sp) == tuple(in_sp)
    if pointwise and ohw == 1 and group == 1:
        return [_matvec(cx, nv.outputs[0], x, w, bias)]
    weight = nv.const(1)
    if pointwise and group == 1 and n_sp == 2 and weight is not None:
        into_blocked = _blocked_pointwise(cx, nv, x, w, np.asarray(weight), bias)
        if into_blocked is not None:
            return into_blocked
        most = PACKED_GEMM_MAX_ROWS if reads_channels_last(x) else POSITION_MAJOR_MAX_POSITIONS
        small = _position_major_conv(cx, nv, x, w, np.asarray(weight), bias, kernel, strides, dilations, begin, [0, 0], tuple(out_sp), most)
        gapped = small if small is not None else _gapped_pointwise(cx, nv, x, w, bias)
        if gapped is not None:
            return gapped
    if pointwise:
        col = reshape(x, (batch, group, ck, ohw))
    else:
        # Zero-pad once (input-sized), then gather windows laid out as [N, G, Cg, *kernel, *out]:
        # every index is affine in the loop variables with no bounds checks, so the innermost
        # loop (output width) is a unit- or constant-stride copy the vectorizer handles.
        need = [max(0, (o - 1) * s + (k - 1) * dil + 1 - b - d) for o, s, k, dil, b, d in zip(out_sp, strides, kernel, dilations, begin, in_sp, strict=True)]
        geometry = _blocked_geometry(cx, nv, x.shape, w.shape) if weight is not None and dt == "f32" else None
        if geometry is not None:
            padded_sp = geometry[1]
            packed = cx.const_lazy(pack_depthwise_weight(np.asarray(weight, np.float32)))
            stored = cx.blocked_images.get(nv.inputs[0])

            def blocked(tensor: str, activation: Callable[[Expr], Expr] | None) -> Lazy:
                into = stored[0] if stored is not None and stored[1:] == geometry else None
                # a small image's readers run position-major: stored channels last for them
                last = batch == 1 and math.prod(out_sp) <= POSITION_MAJOR_MAX_POSITIONS and tensor not in cx.output_names
                return blocked_depthwise_conv(cx, tensor, x, packed, bias, kernel, strides, dilations, begin, padded_sp, tuple(out_sp), activation, into, last)

            return _with_activation(cx, nv, blocked)
        planes = cx.row_planes.get(nv.inputs[0])
        if planes is not None and weight is not None and planes[1] == row_padded_geometry(x.shape, w.shape, group, kernel, strides, dilations, begin, tuple(out_sp)):
            # a 1x1 conv's product stored the image into planes padded with zero rows only
            return _with_activation(cx, nv, lambda tensor, act: row_padded_depthwise(cx, tensor, planes[0], planes[1], w, bias, kernel, dilations, tuple(out_sp), act))
        tile = winograd_tile(x.shape, w.shape, group, kernel, strides, dilations, tuple(out_sp)) if weight is not None and dt == "f32" and cx.gemm_epilogues else None
        if tile is not None:  # the output transform applies the activation
            u = transform_weight(np.asarray(weight), tile)
            return _with_activation(cx, nv, lambda tensor, act: winograd_conv(cx, tensor, x, begin, u, bias, tile, tuple(out_sp), act))
        direct = fits_direct(mg, kernel) and math.prod(out_sp) > 0
        # implicit when the taps overlap: its phase planes (the input, s*s times over) are then
        # smaller than im2col (the input, once per tap); a 1x1 stride-2 conv's im2col is a quarter.
        # It also beats the direct kernel from 16 output channels, or 8 with a stride (one
        # thread, MobileNetV3's 3->16 3x3/2 stem: 392 -> 237 us; with 4 the direct kernel won)
        prefer_gemm = mg >= 16 or (mg >= 8 and any(s > 1 for s in strides))
        if weight is not None and group == 1 and n_sp == 2 and reads_channels_last(x):
            # stored channels last (a Winograd conv's block output): windows are runs of channels
            rows = _position_major_conv(cx, nv, x, w, np.asarray(weight), bias, kernel, strides, dilations, begin, need, tuple(out_sp), PACKED_GEMM_MAX_ROWS)
            if rows is not None:
                return rows
        if (prefer_gemm or not direct) and weight is not None and group == 1 and n_sp == 2 and math.prod(kernel) > math.prod(strides):
            small = _position_major_conv(cx, nv, x, w, np.asarray(weight), bias, kernel, strides, dilations, begin, need, tuple(out_sp))
            if small is not None:
                return small
            implicit = _implicit_conv(cx, nv, x, w, bias, kernel, strides, dilations, begin, need, tuple(out_sp))
            if implicit is not None:
                return implicit
        if direct and n_sp == 2 and cg > 1 and any(s > 1 for s in strides):
            # a strided grouped conv (RegNet's first block of each stage) runs flat over the phase
            # planes of its input: the row form's stride-2 loads ran at 12-37 GFLOP/s
            flat = phase_flat_geometry(tuple(out_sp), strides, dilations, kernel)
            phases, hph, wph = phase_planes(cx, x, begin, need, strides, flat)
            return _with_activation(
                cx, nv, lambda tensor, act: phased_direct_conv(cx, tensor, phases, (hph, wph), w, bias, group, kernel, strides, dilations, tuple(out_sp), act)
            )
        if direct and all(s == 1 for s in strides):
            need = [e + more for e, more in zip(need, flat_slack([b + d + e for b, d, e in zip(begin, in_sp, need, strict=True)]), strict=True)]
        src = padded_input(cx, x, begin, need, Const(0.0, x.dtype)) if any(begin) or any(need) else x
        if direct:

            def direct_kernel(tensor: str, activation: Callable[[Expr], Expr] | None) -> Lazy:
                return direct_conv(cx, tensor, src, w, bias, group, kernel, strides, dilations, tuple(out_sp), activation)

            return _with_activation(cx, nv, direct_kernel)

        def im2col(idx: Index) -> Expr:
            n, g, c_in = idx[0], idx[1], idx[2]
            ks, os_ = idx[3 : 3 + n_sp], idx[3 + n_sp :]
            pos = [add(mul(o, i64(s)), mul(k, i64(dil))) for o, k, s, dil in zip(os_, ks, strides, dilations, strict=True)]
            return src.gen([n, add(mul(g, i64(cg)), c_in), *pos])

        windows = general((batch, group, cg, *kernel, *out_sp), dt, im2col, src.size + 8)
        col = reshape(cx.materialize(windows, "im2col"), (batch, group, ck, ohw))
    wm = reshape(w, (1, group, mg, ck))
    scale = None
    if cx.gemm_epilogues and dt == "f32" and batch == 1 and group == 1 and not col.is_view:
        scaled = channel_scaled(cx, col)
        if scaled is not None:  # a squeeze-excitation's Mul: the product scales B's rows as it packs them
            col, scale = scaled
        else:
            # stored here rather than by the product (a residual Add feeding a 1x1 conv), so the
            # epilogue check below sees its rows
            col = cx.materialize(col, "operand")
    epilogue = _conv_epilogue(cx, nv, wm, col, bias)
    if epilogue is not None:
        # bias (+ Relu) applied as the micro-kernel stores C: the Relu node is skipped
        rows_in = _row_padded_planes(cx, epilogue.tensor, (batch, cout, *out_sp)) if pointwise else None
        y = matmul(cx, wm, col, epilogue.tensor, epilogue=epilogue, b_scale=scale, rows_in=rows_in)
        return _epilogue_result(cx, nv, epilogue, reshape(y, (batch, cout, *out_sp)))
    y = matmul(cx, wm, col, nv.outputs[0] if bias is None else f"{nv.outputs[0]}_nobias", b_scale=scale)
    y = reshape(y, (batch, cout, *out_sp))
    if bias is not None:
        b = reshape(bias, (cout,) + (1,) * n_sp)
        y = elementwise(lambda p, q: Binary("add", p, q), [y, b], dt)
    return [y]


def _implicit_conv(
    cx: Any, nv: Any, x: Lazy, w: Lazy, bias: Lazy | None, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int], need: list[int], out_sp: tuple[int, ...]
) -> list[Any] | None:
    """A 2-D Conv as one product over shifted windows of its padded input (implicit GEMM,
    ``program.ShiftedRows``), so the GEMM packs B straight from the input, with no im2col copy (K
    times the input: 7 MB for a 64-channel 56x56 3x3 conv). Stride 1: every tap's window is
    ``Hout`` runs of ``Wout`` values, ``Wp`` (the padded width) apart; the product packs only
    those, so C is the NCHW output. Below ``MIN_GAPPED_WIDTH`` columns each output row is computed
    on the padded width instead (one run of ``Hout * Wp`` values; the extra columns are left
    unread: the result is a strided view), and so is it where the padding is under
    ``GAPPED_MIN_SHARE`` of the row. Stride s: the padded input is stored as its s x s
    phases (rows and columns ``i * s + phase``), each tap reads one phase with a stride-1 window,
    and rows run on the phase width. One more zero row per phase keeps the last tap's run inside
    the buffer. None where the micro-kernel's row epilogue does not apply."""
    epilogue = _row_epilogue(cx, nv, reshape(w, (1, 1, *w.shape[:1], math.prod(w.shape[1:]))), bias)
    if not cx.gemm_epilogues or x.dtype != "f32" or (epilogue is None and bias is not None):
        return None
    if epilogue is not None and epilogue.bias.size == 1:  # one output channel: a scalar, not a row
        return None
    (sh, sw), (dh, dw) = strides, dilations
    source, hph, wph = phase_planes(cx, x, begin, need, strides, lambda wph: wph)
    phase = hph * wph
    taps = tuple(
        ((kh * dh) % sh * sw + (kw * dw) % sw) * phase + (kh * dh) // sh * wph + (kw * dw) // sw
        for kh in range(kernel[0])
        for kw in range(kernel[1])
    )
    width = out_sp[1] if out_sp[1] >= MIN_GAPPED_WIDTH and wph - out_sp[1] >= GAPPED_MIN_SHARE * wph else wph
    rows = ShiftedRows(sh * sw * phase, taps, width, wph)
    return _shifted_product(cx, nv, w, epilogue, source, rows, x.shape[0], tuple(out_sp), None)


def _shifted_product(
    cx: Any, nv: Any, w: Lazy, epilogue: Epilogue | None, source: Buffer, rows: ShiftedRows, batch: int, out_sp: tuple[int, ...], scale: Buffer | None
) -> list[Any]:
    """``W @ B`` with B's rows read from ``source`` where ``rows`` says (each scaled by ``scale``,
    one value per row, when given), the bias and activation of ``epilogue`` applied by the
    micro-kernel, and C stored ``rows.width`` columns per output row: the Conv's outputs."""
    cout, ck = w.shape[0], math.prod(w.shape[1:])
    n = out_sp[0] * rows.width
    tensor = nv.outputs[0] if epilogue is None else epilogue.tensor
    grid = cx.buffer(f"{tensor}_grid", (batch, cout, n), w.dtype)
    a_op = _operand(cx, reshape(w, (cout, ck)))
    channels = ck // len(rows.taps)
    b_op = StridedOperand(source, (batch, ck, n), (channels * rows.plane, 0, 1), 0)
    relu, activation = (False, "") if epilogue is None else (epilogue.relu, epilogue.activation)
    bias = None if epilogue is None else cx.const_lazy(epilogue.bias).view.buffer
    cx.emit(MatMulStep(a_op, b_op, grid, bias=bias, relu=relu, bias_rows=True, activation=activation, b_rows=rows, b_scale=scale))
    y = of_view(View(grid, (cout * n, n, rows.width, 1), 0), (batch, cout, *out_sp))
    return [y] if epilogue is None else _epilogue_result(cx, nv, epilogue, y)


def _conv_attributes(nv: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Kernel, strides, dilations, output size and padding before the image of Conv ``nv``."""
    n_sp = len(x_shape) - 2
    kernel = [int(k) for k in (nv.attr("kernel_shape") or w_shape[2:])]
    strides = [int(s) for s in (nv.attr("strides") or [1] * n_sp)]
    dilations = [int(d) for d in (nv.attr("dilations") or [1] * n_sp)]
    out_sp, begin, _ = pool_geometry(_NoCeil(nv), x_shape[2:], kernel, strides, dilations)
    return kernel, strides, dilations, list(out_sp), list(begin)


def _row_padded_planes(cx: Any, tensor: str, shape: tuple[int, ...]) -> tuple[Buffer, int, int] | None:
    """(buffer, pitch, offset) for a 1x1 conv's product ``tensor`` of ``shape`` when only a flat
    depthwise conv reads it: that conv's planes padded with zero rows only (``RowPadded``; pinned,
    so the padding, zeroed once, stays zero), where the product stores C's rows as they are instead
    of the image being copied into a padded plane (EfficientNet-B0: seven copies, ~230 us of 5 ms)."""
    reader = _sole_reader(cx, tensor, same_kernel=False)  # the layout it is stored in, not a fusion
    if len(shape) != 4 or shape[0] != 1 or reader is None or reader.op_type != "Conv" or reader.input[0] != tensor:
        return None
    depthwise = cx.view_of(reader)
    weight = depthwise.const(1)
    if weight is None or np.asarray(weight).dtype != np.float32:
        return None
    kernel, strides, dilations, out_sp, begin = _conv_attributes(depthwise, shape, weight.shape)
    if cx.runs_blocked(depthwise, shape, weight.shape, strides, out_sp):
        return None
    geometry = row_padded_geometry(shape, weight.shape, int(depthwise.attr("group", 1)), kernel, strides, dilations, begin, tuple(out_sp))
    if geometry is None:
        return None
    planes = cx.buffer("rowpad", (shape[0], shape[1], geometry.pitch), "f32")
    cx.row_planes[tensor] = (planes, geometry)
    return planes, geometry.pitch, geometry.offset


def _blocked_geometry(cx: Any, nv: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The padding before the image and the padded size of the blocked input of the depthwise
    Conv ``nv`` over an input of ``x_shape`` (None: it does not run as the blocked kernel)."""
    kernel, strides, dilations, out_sp, begin = _conv_attributes(nv, x_shape, w_shape)
    in_sp = x_shape[2:]
    if not cx.runs_blocked(nv, x_shape, w_shape, strides, out_sp) or not math.prod(out_sp):
        return None
    need = [max(0, (o - 1) * s + (k - 1) * dil + 1 - b - d) for o, s, k, dil, b, d in zip(out_sp, strides, kernel, dilations, begin, in_sp, strict=True)]
    return tuple(begin), tuple(d + b + e for d, b, e in zip(in_sp, begin, need, strict=True))


def _blocked_pointwise(cx: Any, nv: Any, x: Lazy, w: Lazy, weight: np.ndarray, bias: Lazy | None) -> list[Any] | None:
    """A 1x1 conv whose result (after its activation) only a blocked depthwise conv reads: the
    product runs position-major (a row per position of the input, lanes over output channels)
    and stores each row straight into the depthwise conv's zero-padded NCHWc input
    (``MatMulStep.blocked``; the buffer is pinned, so its padding, zeroed once, stays zero), so
    the image is not stored NCHW first and copied blocked after (EfficientNet-B0's 96 x 112 x 112
    expansion: a 4.8 MB copy). None for any other 1x1 conv."""
    batch, cin, h, wd = x.shape
    cout = weight.shape[0]
    if not cx.gemm_epilogues or x.dtype != "f32" or weight.dtype != np.float32 or batch != 1:
        return None
    epilogue = _row_epilogue(cx, nv, reshape(w, (1, 1, cout, cin)), bias)
    if epilogue is None and bias is not None:
        return None
    tensor = nv.outputs[0] if epilogue is None else epilogue.tensor
    reader = _sole_reader(cx, tensor, same_kernel=False)  # the layout it is stored in, not a fusion
    if reader is None or reader.op_type != "Conv" or reader.input[0] != tensor:
        return None
    depthwise = cx.view_of(reader)
    depthwise_weight = depthwise.const(1)
    geometry = None if depthwise_weight is None else _blocked_geometry(cx, depthwise, (batch, cout, h, wd), depthwise_weight.shape)
    if geometry is None:
        return None
    begin, padded_sp = geometry
    block = channel_block(cout)
    blocked = cx.buffer("nchwc", (batch, cout // block, *padded_sp, block), "f32")  # pinned: its padding stays zero
    rows = transpose(reshape(x, (cin, h * wd)), [1, 0])  # positions x channels: read in place from a stored image
    columns = cx.const_lazy(np.ascontiguousarray(weight.reshape(cout, cin).T))
    bias_buffer = None if epilogue is None else cx.const_lazy(epilogue.bias).view.buffer
    relu, activation = (False, "") if epilogue is None else (epilogue.relu, epilogue.activation)
    image = BlockedImage(h, wd, begin[0], begin[1])
    cx.emit(MatMulStep(_operand(cx, rows), _operand(cx, columns), blocked, bias=bias_buffer, relu=relu, activation=activation, blocked=image))
    cx.blocked_images[tensor] = (blocked, begin, padded_sp)
    plane = padded_sp[0] * padded_sp[1] * block
    fine = View(blocked, (0, plane, 1, padded_sp[1] * block, block), (begin[0] * padded_sp[1] + begin[1]) * block)
    y = reshape(of_view(fine, (batch, cout // block, block, h, wd)), (batch, cout, h, wd))
    return [y] if epilogue is None else _epilogue_result(cx, nv, epilogue, y)


def _gapped_pointwise(cx: Any, nv: Any, x: Lazy, w: Lazy, bias: Lazy | None) -> list[Any] | None:
    """A 1x1 conv of a stored image whose rows are apart by more than their width (a flat
    depthwise conv's output, a view of its padded plane), or of that image times one value per
    channel (a squeeze-excitation's gate): B's rows are read from the image as they lie, skipping
    the padding (``ShiftedRows``), and scaled by the gate as they are packed, instead of storing a
    contiguous copy of the (scaled) image first. None for any other input."""
    batch, cin, h, wd = x.shape
    if not cx.gemm_epilogues or x.dtype != "f32" or batch != 1 or x.leaves is None or not 1 <= len(x.leaves) <= 2 or wd < MIN_GAPPED_WIDTH:
        return None
    image = [i for i, v in enumerate(x.leaves) if v.strides[-1] == 1 and v.strides[-2] > wd and v.strides[-3] >= h * v.strides[-2]]
    if len(image) != 1 or x.leaves[image[0]].buffer.name in cx.constants:
        return None
    view = x.leaves[image[0]]
    epilogue = _row_epilogue(cx, nv, reshape(w, (1, 1, *w.shape[:1], math.prod(w.shape[1:]))), bias)
    if (epilogue is None and bias is not None) or (epilogue is not None and epilogue.bias.size == 1):
        return None
    scale = None
    if len(x.leaves) == 2:
        scale = channel_gate(cx, x, image[0], 1)
        if scale is None:
            return None
    elif not x.is_view:
        return None
    rows = ShiftedRows(view.strides[-3], (view.offset,), wd, view.strides[-2])
    return _shifted_product(cx, nv, w, epilogue, view.buffer, rows, batch, (h, wd), scale)


GAPPED_MIN_SHARE = 0.05
"""The share of a padded row from which an implicit conv skips its padding columns (ResNet's 28 x 28
and 14 x 14 3x3 convs: 2 of 30 and of 16; one thread, 128 and 256 channels: 2.31 -> 2.16 and
2.42 -> 2.34 ms); the skipping costs two or three masked loads per vector of B as it is packed
(one otherwise), so 56 x 56 (2 of 58) gained 1-2% at one thread and lost 3% at two, and a
112-wide stem (1 of 113) lost 1%."""


def _epilogue_result(cx: Any, nv: Any, epilogue: Epilogue, y: Lazy) -> list[Any]:
    """A conv's outputs when ``y`` is its epilogue's tensor (the activation's output): the nodes the
    epilogue absorbed are skipped."""
    cx.lazies[epilogue.tensor] = y
    cx.fuse(t for t in (*epilogue.skipped, epilogue.tensor) if t != nv.outputs[0])
    return [None] if epilogue.tensor != nv.outputs[0] else [y]


POSITION_MAJOR_MAX_POSITIONS = 64
"""Output positions per image up to which a dense conv runs position-major (``_position_major_conv``)."""
POSITION_MAJOR_MIN_CHANNELS = 48
"""Output channels from which it does: one panel of the packed micro-kernel (three vectors)."""


def _position_major_conv(
    cx: Any, nv: Any, x: Lazy, w: Lazy, weight: np.ndarray, bias: Lazy | None, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int], need: list[int],
    out_sp: tuple[int, ...], max_positions: int = POSITION_MAJOR_MAX_POSITIONS,
) -> list[Any] | None:
    """A 2-D Conv with a small output image (the 7 x 7 last stage of ResNet, MobileNet, EfficientNet)
    as ``windows @ W^T``: one row per output position (the padded input, channels last, copied tap
    by tap: runs of C values; a 1x1 conv's rows are that copy) times the constant weight laid out
    [taps x C, M], so the micro-kernel's vector lanes run over output channels. With lanes over
    positions, 49 positions took 64 lanes (a 3x3 conv's implicit grid, 7 x 9, too): ResNet-18's
    512-channel 3x3 convs took 2.8 ms each against 2.2 ms here, EfficientNet's 320 -> 1280 1x1 conv
    0.53 against 0.45 ms (one thread). Bias and ReLU are the packed micro-kernel's epilogue (SiLU
    and HardSwish follow as elementwise ops); the result is a strided NCHW view of the [positions, M]
    product. ``max_positions``: the largest image taken (any size up to the row limit for an input
    stored channels last, which the windows read as runs of channels, with no padded copy when the
    conv pads nothing). None where the product would not be the packed micro-kernel (its row limit)
    or the row epilogue does not apply."""
    positions = math.prod(out_sp)
    batch, cin = x.shape[:2]
    cout = weight.shape[0]
    if positions > max_positions or cout < POSITION_MAJOR_MIN_CHANNELS or batch * positions > PACKED_GEMM_MAX_ROWS:
        return None
    epilogue = _row_epilogue(cx, nv, reshape(w, (1, 1, cout, weight[0].size)), bias)
    if not cx.gemm_epilogues or x.dtype != "f32" or weight.dtype != np.float32 or (epilogue is None and bias is not None):
        return None
    (sh, sw), (dh, dw) = strides, dilations
    size = [d + b + e for d, b, e in zip(x.shape[2:], begin, need, strict=True)]

    if x.is_view and not any(begin) and not any(need) and reads_channels_last(x):
        last = transpose(x, (0, 2, 3, 1))  # stored channels last, no padding: read in place
    else:
        last = of_buffer(channels_last_padded(cx, x, begin, (size[0], size[1])))
    if math.prod(kernel) == 1 and all(s == 1 for s in strides) and tuple(size) == tuple(out_sp):
        rows = reshape(last, (batch * positions, cin))  # a 1x1 conv's rows are the image itself
    else:

        def window(idx: Index) -> Expr:
            n, oh, ow, kh, kw, c = idx
            return last.gen([n, add(mul(oh, i64(sh)), mul(kh, i64(dh))), add(mul(ow, i64(sw)), mul(kw, i64(dw))), c])

        windows = cx.materialize(general((batch, *out_sp, *kernel, cin), x.dtype, window, last.size + 8), "windows")
        rows = reshape(windows, (batch * positions, math.prod(kernel) * cin))
    tensor = nv.outputs[0] if epilogue is None else epilogue.tensor
    columns = cx.const_lazy(np.ascontiguousarray(weight.transpose(2, 3, 1, 0).reshape(-1, cout)))
    by_column = None if epilogue is None else Epilogue(epilogue.bias, epilogue.relu, tensor, ())
    product = matmul(cx, rows, columns, f"{tensor}_pm", epilogue=by_column)
    assert product.is_view
    y = nchw_view(product.view.buffer, (batch, cout, *out_sp))
    if epilogue is None:
        return [y]
    if epilogue.activation:  # the packed micro-kernel's epilogues end at ReLU
        y = elementwise(ACTIVATIONS[epilogue.activation], [y], x.dtype)
    return _epilogue_result(cx, nv, epilogue, y)


def _with_activation(cx: Any, nv: Any, conv: Callable[[str, Callable[[Expr], Expr] | None], Lazy]) -> list[Any]:
    """The outputs of a direct conv kernel ``conv(tensor, activation)``; when a Relu, HardSwish or
    SiLU alone reads the conv, the kernel applies it as it stores and those nodes are skipped."""
    act = _activation_of(cx, nv.outputs[0])
    if act is None:
        return [conv(nv.outputs[0], None)]
    kind, tensor, skipped = act
    cx.lazies[tensor] = conv(tensor, ACTIVATIONS[kind])
    cx.fuse(t for t in (*skipped, tensor) if t != nv.outputs[0])
    return [None]


def _matvec(cx: Any, tensor: str, x: Lazy, w: Lazy, bias: Lazy | None) -> Lazy:
    """A 1x1 Conv of a 1x1 image (a squeeze-excitation's fully connected layers): one dot product
    per output channel, vectorized along the input channels. As a GEMM it would be a single
    column, most of every micro-kernel tile wasted. Its activation stays an elementwise node."""
    batch, cin = x.shape[:2]
    cout = w.shape[0]
    stored = cx.materialize(x, "matvec_in")  # read once per output channel: not recomputed
    out = cx.out_buffer(tensor, (batch, cout, *x.shape[2:]), x.dtype)
    zeros = [i64(0)] * (len(x.shape) - 2)

    def product(o: Index, r: Index) -> Expr:
        return Binary("mul", w.gen([o[1], r[0], *zeros]), stored.gen([o[0], r[0], *zeros]))

    def finish(acc: Expr, o: Index) -> Expr:
        return acc if bias is None else Binary("add", acc, bias.gen([o[1]]))

    inputs = [*buffers_of(w), *buffers_of(stored), *(buffers_of(bias) if bias is not None else [])]
    cx.emit_kernel(reduction_kernel(f"matvec_{out.name}", out, (batch, cout), (cin,), product, "add", Const(0.0, x.dtype), finish, inputs, 2.0))
    return of_buffer(out)


def _conv_epilogue(cx: Any, nv: Any, wm: Lazy, col: Lazy, bias: Lazy | None) -> Epilogue | None:
    """The Conv's constant bias (+ the Relu, HardSwish or SiLU that alone reads the Conv) as a
    per-row epilogue of ``W @ col``, when the CPU backend's micro-kernel will run it: float32, one
    product (batch 1, one group), constant weights, and ``col`` stored with unit-stride rows (at
    least their length apart). A Conv without a bias gets a zero one when an activation follows (MobileNet's dynamo export)."""
    if col.shape[:2] != (1, 1) or not col.is_view:
        return None
    if col.view.buffer.name in cx.constants or col.view.strides[-2] < col.shape[-1] or (col.view.strides[-1] != 1 and col.shape[-1] > 1):
        return None
    return _row_epilogue(cx, nv, wm, bias)


def _row_epilogue(cx: Any, nv: Any, wm: Lazy, bias: Lazy | None) -> Epilogue | None:
    """The Conv's bias and activation as a per-row epilogue of ``W @ B`` (see ``_conv_epilogue``),
    whatever B is."""
    if not cx.gemm_epilogues or wm.dtype != "f32" or wm.shape[:2] != (1, 1):
        return None
    row = cx.consts.get(nv.inputs[2]) if bias is not None else np.zeros(wm.shape[2], np.float32)
    if row is None or row.dtype != np.float32 or row.size != wm.shape[2]:
        return None
    if not wm.is_view or wm.view.buffer.name not in cx.constants:
        return None
    tensor = nv.outputs[0]
    act = _activation_of(cx, tensor)
    if act is None:
        return Epilogue(row.reshape(-1), False, tensor, (), rows=True) if bias is not None else None
    kind, out, skipped = act
    return Epilogue(row.reshape(-1), kind == "relu", out, skipped, rows=True, activation="" if kind == "relu" else kind)


ACTIVATIONS: dict[str, Callable[[Expr], Expr]] = {
    "relu": relu,
    "hardswish": lambda a: Binary("mul", a, hard_sigmoid(a, 1.0 / 6.0, 0.5)),
    "silu": lambda a: Binary("mul", a, sigmoid(a)),
}
"""The activations a conv applies as it stores (the same formulas as their elementwise rules)."""


def _activation_of(cx: Any, tensor: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``(kind, result, skipped)`` when ``tensor`` alone feeds a Relu, a HardSwish or a SiLU
    (``Sigmoid`` + ``Mul``): the activation's name, its output, and the tensors on the way."""
    node = _sole_reader(cx, tensor)
    if node is not None and node.op_type == "Relu":
        return "relu", node.output[0], (tensor,)
    if node is not None and node.op_type == "HardSwish":
        return "hardswish", node.output[0], (tensor,)
    silu = _silu_of(cx, tensor)
    if silu is not None:
        return "silu", silu[1], (tensor, silu[0])
    return None


def _silu_of(cx: Any, tensor: str) -> tuple[str, str] | None:
    """``(sigmoid, product)`` when ``tensor`` is read only by ``s = Sigmoid(tensor)`` and a later
    ``Mul(tensor, s)``, and ``s`` only by that Mul (SiLU as TorchScript exports it)."""
    if tensor in cx.output_names:
        return None
    nodes = cx.graph.node
    readers = [i for i, node in enumerate(nodes) if tensor in node.input]
    if len(readers) != 2 or cx.last_use.get(tensor) != readers[1]:
        return None
    sig, mul = nodes[readers[0]], nodes[readers[1]]
    if sig.op_type != "Sigmoid" or mul.op_type != "Mul" or any(n.domain not in ("", "ai.onnx") for n in (sig, mul)):
        return None
    if not (cx.same_kernel(tensor, sig) and cx.same_kernel(tensor, mul)):
        return None
    s = sig.output[0]
    if sorted(mul.input) != sorted([tensor, s]) or s == tensor:
        return None
    after = _sole_reader(cx, s)
    if after is None or after.op_type != "Mul" or list(after.output) != list(mul.output):
        return None
    return s, mul.output[0]


class _NoCeil:
    """A node view without ``ceil_mode`` (Conv has none) for ``pool_geometry``."""

    def __init__(self, nv: Any):
        self.nv = nv

    def attr(self, name: str, default: Any = None) -> Any:
        return default if name == "ceil_mode" else self.nv.attr(name, default)


@lowering("onnxsat.FusedAttention", "onnxsat.FusedAttention3D", "onnxsat.FusedRotary", kind="extern")
def _not_native(cx: Any, nv: Any, xs: list[Any]) -> list[Any]:
    """No native kernel yet: the node runs in the fallback (its exported form on onnxruntime)."""
    raise NotLowered(f"{nv.op_type} has no native kernel")
