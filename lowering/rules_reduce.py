"""Lowering rules of reductions: ReduceSum/Mean/Max, Softmax, LayerNorm, global pools, LRN.

Each emits one kernel, parallel over the kept (outer) positions; its input is a ``Lazy`` tensor,
so the elementwise chain that produces it (the prologue) is computed inside the same kernel.
Softmax and LayerNorm keep their statistics in scalar locals: one pass per statistic, no
temporaries in memory.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .kernel_ir import (
    NUMPY_DTYPES,
    Assign,
    Binary,
    Buffer,
    Compare,
    Const,
    Decl,
    Expr,
    Kernel,
    Load,
    Local,
    Loop,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    add,
    as_dtype,
    compute_dtype,
    flat_index,
    floordiv,
    i64,
    is_float,
    mod,
    mul,
)
from .loops import buffers_of, for_nest, outer_kernel, reduction_kernel
from .table import NotLowered, lowering
from .values import Index, Lazy, View, broadcast_to, elementwise, general, of_buffer, reshape


def lowest_value(dtype: str) -> Const:
    if is_float(dtype):
        return Const(-math.inf, dtype)
    return Const(int(np.iinfo(NUMPY_DTYPES[dtype]).min), dtype)


def _merge(outer_axes: list[int], red_axes: list[int], o: Index, r: Index, rank: int) -> Index:
    idx: list[Expr] = [i64(0)] * rank
    for a, v in zip(outer_axes, o, strict=True):
        idx[a] = v
    for a, v in zip(red_axes, r, strict=True):
        idx[a] = v
    return idx


@lowering("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", kind="reduce")
def _reduce(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    rank = len(x.shape)
    axes = nv.const_ints(1) if nv.has(1) else nv.attr("axes")
    if nv.has(1) and axes is None:
        raise NotLowered("reduction axes known only at run time")
    keepdims = int(nv.attr("keepdims", 1))
    if not axes:
        if nv.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(rank))
    red = sorted({int(a) % rank for a in axes}) if rank else []
    kept = [a for a in range(rank) if a not in red]
    out_shape = tuple(1 if a in red else d for a, d in enumerate(x.shape)) if keepdims else tuple(x.shape[a] for a in kept)
    outer_shape = tuple(x.shape[a] for a in kept)
    red_shape = tuple(x.shape[a] for a in red)
    n = math.prod(red_shape)
    op = {"ReduceSum": "add", "ReduceMean": "add", "ReduceMax": "max", "ReduceMin": "min"}[nv.op_type]
    dt = compute_dtype(x.dtype)
    if op == "add":
        init = Const(0, dt)
    elif op == "max":
        init = lowest_value(dt)
    else:
        init = Const(math.inf, dt) if is_float(dt) else Const(int(np.iinfo(NUMPY_DTYPES[dt]).max), dt)
    if nv.op_type == "ReduceMean" and not is_float(dt):
        raise NotLowered("ReduceMean on integers")
    scale = 1.0 / n if nv.op_type == "ReduceMean" and n else None

    def finish(acc: Expr, o: Index) -> Expr:
        return acc if scale is None else Binary("mul", acc, Const(scale, dt))

    out = cx.out_buffer(nv.outputs[0], out_shape, x.dtype)
    if math.prod(out_shape) == 0:
        return [of_buffer(out)]
    one_loop = _one_loop_plane(x, Const(init.value, x.dtype)) if red == list(range(2, rank)) else None
    if one_loop is not None:  # a squeeze-excitation's mean over the plane
        x, rank, red, kept, red_shape = one_loop, 3, [2], [0, 1], one_loop.shape[2:]
    kernel = reduction_kernel(
        f"reduce_{out.name}",
        out,
        outer_shape,
        red_shape,
        lambda o, r: as_dtype(x.gen(_merge(kept, red, o, r, rank)), dt),
        op,
        init,
        finish,
        buffers_of(x),
        x.size,
    )
    cx.emit_kernel(kernel)
    return [of_buffer(out)]


def _row_split(x: Lazy, axes: list[int]) -> tuple[list[int], list[int], tuple[int, ...], tuple[int, ...]]:
    rank = len(x.shape)
    outer = [a for a in range(rank) if a not in axes]
    return outer, axes, tuple(x.shape[a] for a in outer), tuple(x.shape[a] for a in axes)


@lowering("Softmax", kind="reduce")
def _softmax(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    if not is_float(x.dtype):
        raise NotLowered("Softmax on integers")
    rank = len(x.shape)
    default = 1 if nv.opset < 13 else -1
    axis = int(nv.attr("axis", default)) % max(rank, 1)
    axes = list(range(axis, rank)) if nv.opset < 13 else [axis]
    outer_axes, red_axes, outer_shape, red_shape = _row_split(x, axes)
    # each row is read whole (max) before any of it is written, and every later read is at the
    # index just written: a dead input buffer can take the result (the attention scores at
    # sequence 512 are 12 MB: no second buffer, no write-allocate traffic)
    in_place = cx.overwritable(x) if nv.outputs[0] not in cx.output_names else None
    out = in_place or cx.out_buffer(nv.outputs[0], x.shape, x.dtype)
    if x.numel == 0:
        return [of_buffer(out)]
    dt = compute_dtype(x.dtype)
    names = [f"r{i}" for i in range(len(red_axes))]
    r: list[Expr] = [Var(n) for n in names]

    def body(o: Index, p: Expr) -> tuple[Stmt, ...]:
        idx = _merge(outer_axes, red_axes, o, r, rank)
        at = flat_index(idx, x.shape)
        m, s = Local("m", dt), Local("s", dt)
        e = Unary("exp", Binary("sub", as_dtype(x.gen(idx), dt), m))
        if dt == x.dtype:  # the exponentials go to the output, which the last pass scales
            sum_pass: tuple[Stmt, ...] = (Decl("e", dt, e), Store(out, at, Local("e", dt)), Assign("s", Binary("add", s, Local("e", dt))))
            scaled: Expr = Binary("mul", of_buffer(out).gen(idx), Local("inv", dt))
        else:  # stored rounded, they would be rounded twice: the last pass computes them again
            sum_pass, scaled = (Assign("s", Binary("add", s, e)),), Binary("mul", e, Local("inv", dt))
        return (
            Decl("m", dt, lowest_value(dt)),
            *for_nest(names, red_shape, (Assign("m", Binary("max", m, as_dtype(x.gen(idx), dt))),)),
            Decl("s", dt, Const(0.0, dt)),
            *for_nest(names, red_shape, sum_pass),
            Decl("inv", dt, Unary("recip", s)),
            *for_nest(names, red_shape, (Store(out, at, as_dtype(scaled, x.dtype)),)),
        )

    cx.emit_kernel(outer_kernel(f"softmax_{out.name}", buffers_of(x), [out], outer_shape, body, float(x.numel * (x.size + 12))))
    return [of_buffer(out)]


@lowering("LayerNormalization", kind="reduce")
def _layer_norm(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x, scale = xs[0], xs[1]
    assert x is not None and scale is not None
    bias = xs[2] if len(xs) > 2 else None
    if not is_float(x.dtype):
        raise NotLowered("LayerNormalization on integers")
    rank = len(x.shape)
    axis = int(nv.attr("axis", -1)) % rank
    eps = float(nv.attr("epsilon", 1e-5))
    axes = list(range(axis, rank))
    outer_axes, red_axes, outer_shape, red_shape = _row_split(x, axes)
    if int(nv.attr("stash_type", 1)) != 1:
        raise NotLowered("LayerNormalization with a stash type other than float32")
    dt = compute_dtype(x.dtype)
    scale_b = broadcast_to(scale, red_shape) if scale.shape != red_shape else scale
    bias_b = (broadcast_to(bias, red_shape) if bias.shape != red_shape else bias) if bias is not None else None
    # rows are read whole (twice) before the last pass writes them at the index it reads
    in_place = cx.overwritable(x) if nv.outputs[0] not in cx.output_names else None
    out = in_place or cx.out_buffer(nv.outputs[0], x.shape, x.dtype)
    stat_shape = tuple(x.shape[:axis]) + (1,) * (rank - axis)
    want_mean = len(nv.outputs) > 1 and nv.outputs[1]
    want_inv = len(nv.outputs) > 2 and nv.outputs[2]
    mean_buf = cx.out_buffer(nv.outputs[1], stat_shape, dt) if want_mean else None
    inv_buf = cx.out_buffer(nv.outputs[2], stat_shape, dt) if want_inv else None
    n = math.prod(red_shape)
    names = [f"r{i}" for i in range(len(red_axes))]
    r: list[Expr] = [Var(v) for v in names]

    def body(o: Index, p: Expr) -> tuple[Stmt, ...]:
        idx = _merge(outer_axes, red_axes, o, r, rank)
        at = flat_index(idx, x.shape)
        mean, inv = Local("mean", dt), Local("inv", dt)
        value = as_dtype(x.gen(idx), dt)
        centered = Binary("sub", value, mean)
        y = Binary("mul", Binary("mul", centered, inv), as_dtype(scale_b.gen(list(r)), dt))
        if bias_b is not None:
            y = Binary("add", y, as_dtype(bias_b.gen(list(r)), dt))
        stmts: list[Stmt] = [
            Decl("sum", dt, Const(0.0, dt)),
            *for_nest(names, red_shape, (Assign("sum", Binary("add", Local("sum", dt), value)),)),
            Decl("mean", dt, Binary("mul", Local("sum", dt), Const(1.0 / n, dt))),
            Decl("sq", dt, Const(0.0, dt)),
            *for_nest(names, red_shape, (Decl("d", dt, centered), Assign("sq", Binary("add", Local("sq", dt), Binary("mul", Local("d", dt), Local("d", dt)))))),
            Decl("inv", dt, Unary("recip", Unary("sqrt", Binary("add", Binary("mul", Local("sq", dt), Const(1.0 / n, dt)), Const(eps, dt))))),
            *for_nest(names, red_shape, (Store(out, at, as_dtype(y, x.dtype)),)),
        ]
        if mean_buf is not None:
            stmts.append(Store(mean_buf, p, mean))
        if inv_buf is not None:
            stmts.append(Store(inv_buf, p, inv))
        return tuple(stmts)

    outs = [b for b in (out, mean_buf, inv_buf) if b is not None]
    inputs = buffers_of(x) + buffers_of(scale_b) + (buffers_of(bias_b) if bias_b is not None else [])
    if x.numel:
        cx.emit_kernel(outer_kernel(f"layernorm_{out.name}", inputs, outs, outer_shape, body, float(x.numel * (3 * x.size + 8))))
    return [of_buffer(b) for b in outs]


def _one_loop_plane(x: Lazy, fill: Const) -> Lazy | None:
    """``x`` (N, C, spatial...) with its spatial dims as one axis, for a reduction over them: over
    rows, LLVM fully unrolls a short row (56 wide) and then vectorizes the row loop with gathers
    (a ReduceMean over 96 x 56 x 56 ran at 5 GB/s, 3.5x its one-loop time). Rows stored apart (a
    conv's output on its padded width) are one loop over the rows and the gaps between them, the
    gaps read as ``fill`` (the reduction's identity). None when neither form applies."""
    if len(x.shape) < 4:
        return None
    flat = reshape(x, (*x.shape[:2], math.prod(x.shape[2:])))
    return flat if flat.is_view else _pitched_plane(x, fill)


def _pitched_plane(x: Lazy, fill: Const) -> Lazy | None:
    """A 2-D plane whose rows lie ``pitch`` apart in a view, as one axis over its rows and the
    gaps between them, the gaps read as ``fill``; None for any other ``x``."""
    if len(x.shape) != 4 or not x.is_view or x.view.strides[-1] != 1:
        return None
    v, (h, w) = x.view, x.shape[2:]
    pitch = v.strides[-2]
    if h < 2 or pitch <= w or pitch > 2 * w:
        return None
    span = (h - 1) * pitch + w
    rows = View(v.buffer, (*v.strides[:2], 1), v.offset)

    def gen(idx: Index) -> Expr:
        inside = Compare("lt", mod(idx[2], pitch), i64(w))
        return Select(inside, rows.load(idx), fill)

    return general((*x.shape[:2], span), x.dtype, gen, x.size + 2)


@lowering("GlobalAveragePool", "GlobalMaxPool", kind="reduce")
def _global_pool(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    if not is_float(x.dtype):
        raise NotLowered(f"{nv.op_type} on integers")
    rank = len(x.shape)
    red = list(range(2, rank))
    red_shape = x.shape[2:]
    out_shape = x.shape[:2] + (1,) * (rank - 2)
    out = cx.out_buffer(nv.outputs[0], out_shape, x.dtype)
    is_max = nv.op_type == "GlobalMaxPool"
    n = math.prod(red_shape)
    if _channels_last(x) and x.numel:
        cx.emit_kernel(_channels_last_pool(f"gpool_{out.name}", x, out, is_max))
        return [of_buffer(out)]
    one_loop = _one_loop_plane(x, lowest_value(x.dtype) if is_max else Const(0.0, x.dtype))
    if one_loop is not None:
        x, rank, red, red_shape = one_loop, 3, [2], one_loop.shape[2:]

    dt = compute_dtype(x.dtype)

    def finish(acc: Expr, o: Index) -> Expr:
        return acc if is_max else Binary("mul", acc, Const(1.0 / max(n, 1), dt))

    if math.prod(out_shape):
        cx.emit_kernel(
            reduction_kernel(
                f"gpool_{out.name}",
                out,
                x.shape[:2],
                red_shape,
                lambda o, r: as_dtype(x.gen(_merge([0, 1], red, o, r, rank)), dt),
                "max" if is_max else "add",
                lowest_value(dt) if is_max else Const(0.0, dt),
                finish,
                buffers_of(x),
                x.size,
            )
        )
    return [of_buffer(out)]


CHANNELS_PER_POOL_UNIT = 64
"""Channels one task of a channels-last global pool reduces (four vectors)."""


def _channels_last(x: Lazy) -> bool:
    """Whether ``x`` (one float32 image, [1, C, H, W]) reads views laid out channels last (a
    position-major product's [H * W, C] result): its channels one apart, positions C apart."""
    if len(x.shape) != 4 or x.shape[0] != 1 or x.dtype != "f32" or not x.leaves:
        return False
    chans, h, w = x.shape[1:]
    return all(v.strides[1] == 1 and v.strides[3] == chans and v.strides[2] == w * chans for v in x.leaves if v.buffer.shape != (chans,))


def _channels_last_pool(name: str, x: Lazy, out: Buffer, is_max: bool) -> Kernel:
    """GlobalAveragePool / GlobalMaxPool of a channels-last image: position by position, each
    adding a contiguous run of channels into the output (vector loads and stores), where the
    per-channel form would read every value ``C`` apart (EfficientNet-B0's last 1280 x 7 x 7 SiLU and
    pool: 88 us at two threads)."""
    chans, h, w = x.shape[1:]
    chunk = math.gcd(chans, CHANNELS_PER_POOL_UNIT)
    c, p = Var("c"), Var("q")  # "p" is the kernel's unit
    op = "max" if is_max else "add"
    start = lowest_value("f32") if is_max else Const(0.0, "f32")

    def body(o: list[Expr], unit: Expr) -> tuple[Stmt, ...]:
        channel = add(mul(unit, i64(chunk)), c)
        value = x.gen([i64(0), channel, floordiv(p, w), mod(p, w)])
        accumulate = Store(out, channel, Binary(op, Load(out, channel), value))
        stmts: list[Stmt] = [Loop(c.name, i64(chunk), (Store(out, channel, start),)), Loop(p.name, i64(h * w), (Loop(c.name, i64(chunk), (accumulate,)),))]
        if not is_max:
            stmts.append(Loop(c.name, i64(chunk), (Store(out, channel, Binary("mul", Load(out, channel), Const(1.0 / (h * w), "f32"))),)))
        return tuple(stmts)

    return outer_kernel(name, buffers_of(x), [out], (chans // chunk,), body, float(x.numel * (x.size + 1)))


@lowering("LRN", kind="reduce")
def _lrn(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    if not is_float(x.dtype):
        raise NotLowered("LRN on integers")
    size = int(nv.attr("size"))
    alpha, beta, bias = float(nv.attr("alpha", 1e-4)), float(nv.attr("beta", 0.75)), float(nv.attr("bias", 1.0))
    lo = (size - 1) // 2
    channels = x.shape[1]
    dt = x.dtype
    out = cx.out_buffer(nv.outputs[0], x.shape, dt)

    def value(o: Index, r: Index) -> Expr:
        ch = add(o[1], add(r[0], i64(-lo)))
        ok = Binary("and", Compare("ge", ch, i64(0)), Compare("lt", ch, i64(channels)))
        safe = Binary("min", Binary("max", ch, i64(0)), i64(channels - 1))
        v = x.gen([o[0], safe, *o[2:]])
        return Select(ok, Binary("mul", v, v), Const(0.0, dt))

    def finish(acc: Expr, o: Index) -> Expr:
        base = Binary("add", Const(bias, dt), Binary("mul", acc, Const(alpha / size, dt)))
        return Binary("div", x.gen(list(o)), Binary("pow", base, Const(beta, dt)))

    if x.numel:
        cx.emit_kernel(reduction_kernel(f"lrn_{out.name}", out, x.shape, (size,), value, "add", Const(0.0, dt), finish, buffers_of(x), x.size))
    return [of_buffer(out)]



@lowering("RMSNormalization", "onnxsat.FusedRMSNorm", "onnxsat.FusedSkipRMSNorm", kind="reduce")
def _rms_norm(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """x / sqrt(mean(x * x) + epsilon) * scale over the trailing axes, one pass for the statistic and
    one for the result; the residual form normalizes x + skip and also stores that sum (output 1)."""
    with_skip = nv.op_type == "onnxsat.FusedSkipRMSNorm"
    x, scale = xs[0], xs[2 if with_skip else 1]
    assert x is not None and scale is not None
    if not is_float(x.dtype):
        raise NotLowered(f"{nv.op_type} on integers")
    if nv.op_type == "RMSNormalization" and int(nv.attr("stash_type", 1)) != 1:
        raise NotLowered("RMSNormalization with a stash type other than float32")
    if with_skip:
        skip = xs[1]
        assert skip is not None
        x = elementwise(lambda a, b: Binary("add", a, b), [x, skip], x.dtype)
    rank = len(x.shape)
    axis = int(nv.attr("axis", -1)) % rank
    eps = float(nv.attr("epsilon", 1e-5))
    outer_axes, red_axes, outer_shape, red_shape = _row_split(x, list(range(axis, rank)))
    dt = compute_dtype(x.dtype)
    scale_b = broadcast_to(scale, red_shape) if scale.shape != red_shape else scale
    out = cx.out_buffer(nv.outputs[0], x.shape, x.dtype)
    total = cx.out_buffer(nv.outputs[1], x.shape, x.dtype) if with_skip and len(nv.outputs) > 1 and nv.outputs[1] else None
    names = [f"r{i}" for i in range(len(red_axes))]
    r: list[Expr] = [Var(v) for v in names]
    n = math.prod(red_shape)

    def body(o: Index, p: Expr) -> tuple[Stmt, ...]:
        idx = _merge(outer_axes, red_axes, o, r, rank)
        at = flat_index(idx, x.shape)
        y = Binary("mul", Binary("mul", Local("v", dt), Local("inv", dt)), as_dtype(scale_b.gen(list(r)), dt))
        stores: tuple[Stmt, ...] = (Decl("v", dt, as_dtype(x.gen(idx), dt)), Store(out, at, as_dtype(y, x.dtype)))
        if total is not None:  # the sum in the input's type (a float16 sum rounded once)
            stores += (Store(total, at, Local("v", dt) if dt == x.dtype else x.gen(idx)),)
        return (
            Decl("sq", dt, Const(0.0, dt)),
            *for_nest(names, red_shape, (Decl("v", dt, as_dtype(x.gen(idx), dt)), Assign("sq", Binary("add", Local("sq", dt), Binary("mul", Local("v", dt), Local("v", dt)))))),
            Decl("inv", dt, Unary("recip", Unary("sqrt", Binary("add", Binary("mul", Local("sq", dt), Const(1.0 / max(n, 1), dt)), Const(eps, dt))))),
            *for_nest(names, red_shape, stores),
        )

    outs = [b for b in (out, total) if b is not None]
    if x.numel:
        cx.emit_kernel(outer_kernel(f"rmsnorm_{out.name}", buffers_of(x) + buffers_of(scale_b), outs, outer_shape, body, float(x.numel * (2 * x.size + 6))))
    return [of_buffer(b) for b in outs]
