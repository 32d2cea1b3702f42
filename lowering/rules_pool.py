"""Lowering rules of MaxPool and AveragePool, and the window geometry that Conv shares.

A pool is computed as one pass per windowed spatial axis (separable: a k x k max is a k x 1 max
of a 1 x k max, and a window sum is a sum of sums), over an input padded once with the pool's
neutral value (-inf or the dtype's lowest for max, 0 for average). Each pass is a fused kernel
whose value is the window unrolled into one expression, so its innermost loop runs along the
output width with unit-stride (or constant-stride) loads that the LLVM vectorizer turns into
vector code, and it is parallel over rows (batch x channels x output rows). A 13x13 max costs 26
loads per output instead of 169 guarded scalar loads. Average divides by the per-axis window
counts (their product), which depend only on the output position. MaxPool with an Indices output
keeps a direct window loop (the argmax needs the whole window in one place).

The window max is ``maxsel`` (one vector max instruction; a NaN tap may or may not win, as with
onnxruntime's MLAS kernels): ``max``'s NaN-propagating form expands to several instructions per
tap and made the 13x13 pass 5x slower.
"""

from __future__ import annotations

import math
from typing import Any

from .kernel_ir import (
    Assign,
    Binary,
    Cast,
    Compare,
    Const,
    Decl,
    Expr,
    Local,
    Loop,
    Select,
    Stmt,
    Store,
    Var,
    add,
    flat_index,
    i64,
    is_float,
    mul,
)
from .loops import buffers_of, for_nest, outer_kernel
from .rules_reduce import lowest_value
from .table import NotLowered, lowering
from .values import Index, Lazy, general, of_buffer

MAX_UNROLLED_WINDOW = 64
"""Taps of one pass beyond which the window stays a loop (an expression that large costs more
to compile than it saves)."""


INLINE_PROLOGUE = 8
"""Expression size up to which a pool's producer (a conv's bias + ReLU) is recomputed per tap
inside the first pass instead of stored first: a few adds per tap cost less than writing and
re-reading the whole tensor (squeezenet's first MaxPool read a 3 MiB stored copy)."""


def pool_geometry(nv: Any, in_spatial: tuple[int, ...], kernel: list[int], strides: list[int], dilations: list[int]):  # type: ignore[no-untyped-def]
    """Output sizes and begin pads of a pool/conv window (auto_pad, pads and ceil_mode applied)."""
    n = len(kernel)
    auto_pad = nv.attr("auto_pad", "NOTSET") or "NOTSET"
    pads = list(nv.attr("pads") or [0] * (2 * n))
    ceil_mode = int(nv.attr("ceil_mode", 0))
    out, begin = [], []
    for i in range(n):
        d, k, s, dil = in_spatial[i], kernel[i], strides[i], dilations[i]
        ext = (k - 1) * dil + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-d // s)
            total = max(0, (o - 1) * s + ext - d)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            o = (d - ext) // s + 1 if not ceil_mode else -(-(d - ext) // s) + 1
            b = 0
        else:
            b, e = pads[i], pads[i + n]
            span = d + b + e - ext
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= d + b:
                o -= 1
        out.append(max(o, 0))
        begin.append(b)
    return out, begin, pads


def padded_input(cx: Any, x: Lazy, begin: list[int], end: list[int], fill: Const) -> Lazy:
    """``x`` stored with ``begin``/``end`` cells of ``fill`` around its spatial dims, so windows over
    it need no bounds checks (one kernel; the producer of ``x`` fuses into it)."""
    spatial = x.shape[2:]

    def row(o: Index, w: Expr) -> Expr:
        src: list[Expr] = list(o[:2])
        ok: Expr | None = None
        for i, b, d in zip(o[2:], begin[:-1], spatial[:-1], strict=True):
            j = add(i, i64(-b))
            valid = Binary("and", Compare("ge", j, i64(0)), Compare("lt", j, i64(d)))
            ok = valid if ok is None else Binary("and", ok, valid)
            src.append(Binary("min", Binary("max", j, i64(0)), i64(d - 1)))
        value = x.gen([*src, w])
        return value if ok is None else Select(ok, value, fill)

    outer = x.shape[:2] + tuple(d + b + e for d, b, e in zip(spatial[:-1], begin[:-1], end[:-1], strict=True))
    return _padded_rows(cx, x, outer, (begin[-1], spatial[-1], end[-1]), fill, row, x.size + 2)


def _padded_rows(cx: Any, x: Lazy, outer: tuple[int, ...], columns: tuple[int, int, int], fill: Const, row: Any, size: int) -> Lazy:
    """A stored tensor of shape ``outer`` + (lead + width + trail,): per row a fill loop, a
    unit-stride loop of ``row(outer_index, column)`` and a fill loop, parallel over rows (a
    clamped column index instead would make every load a gather)."""
    lead, inner, trail = columns
    width = lead + inner + trail
    out = cx.buffer("padded", (*outer, width), x.dtype)
    if not math.prod(out.shape):
        return of_buffer(out)
    w = Var("w")

    def body(o: Index, p: Expr) -> tuple[Stmt, ...]:
        start = mul(p, i64(width))
        stmts: list[Stmt] = []
        if lead:
            stmts.append(Loop(w.name, i64(lead), (Store(out, add(start, w), fill),)))
        stmts.append(Loop(w.name, i64(inner), (Store(out, add(add(start, i64(lead)), w), row(o, w)),)))
        if trail:
            stmts.append(Loop(w.name, i64(width), (Store(out, add(start, w), fill),), i64(lead + inner)))
        return tuple(stmts)

    cx.emit_kernel(outer_kernel(f"pad_{out.name}", buffers_of(x), [out], outer, body, float(math.prod(out.shape) * size)))
    return of_buffer(out)


def _padded_first_pass(cx: Any, x: Lazy, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int], end: list[int], out_h: int, fill: Const, op: str) -> Lazy:
    """The column pass of a 2-D window fused with the padding: rows ``o * stride + t * dilation``
    of ``x`` (outside the input: ``fill``, a select that is invariant along the row), combined
    by ``op``, stored with the padded width the row pass reads."""
    height = x.shape[2]

    def row(o: Index, w: Expr) -> Expr:
        acc: Expr | None = None
        for t in range(kernel[0]):
            r = add(mul(o[2], i64(strides[0])), i64(t * dilations[0] - begin[0]))
            value = x.gen([o[0], o[1], Binary("min", Binary("max", r, i64(0)), i64(height - 1)), w])
            if begin[0] or end[0]:
                value = Select(Binary("and", Compare("ge", r, i64(0)), Compare("lt", r, i64(height))), value, fill)
            acc = value if acc is None else Binary(op, value, acc)
        assert acc is not None
        return acc

    return _padded_rows(cx, x, (*x.shape[:2], out_h), (begin[1], x.shape[3], end[1]), fill, row, kernel[0] * (x.size + 4))


def _window_count(o: Expr, stride: int, taps: int, dilation: int, lo: int, hi: int) -> Expr:
    """How many of the window's positions ``o * stride + t * dilation`` lie in ``[lo, hi)``."""
    q = mul(o, i64(stride))
    if dilation == 1:
        first = Binary("max", q, i64(lo))
        last = Binary("min", add(q, i64(taps)), i64(hi))
        return Binary("max", Binary("sub", last, first), i64(0))
    count: Expr = i64(0)
    for t in range(taps):
        p = add(q, i64(t * dilation))
        inside = Binary("and", Compare("ge", p, i64(lo)), Compare("lt", p, i64(hi)))
        count = add(count, Select(inside, i64(1), i64(0)))
    return count


@lowering("MaxPool", "AveragePool", kind="reduce")
def _pool(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    kernel = [int(k) for k in nv.attr("kernel_shape")]
    n = len(kernel)
    strides = [int(s) for s in (nv.attr("strides") or [1] * n)]
    dilations = [int(d) for d in (nv.attr("dilations") or [1] * n)]
    in_sp = x.shape[2:]
    out_sp, begin, pads = pool_geometry(nv, in_sp, kernel, strides, dilations)
    out_shape = x.shape[:2] + tuple(out_sp)
    is_max = nv.op_type == "MaxPool"
    if not is_max and not is_float(x.dtype):
        raise NotLowered("AveragePool on integers")
    if is_max and len(nv.outputs) > 1 and nv.outputs[1]:
        return _pool_with_indices(cx, nv, x, kernel, strides, dilations, out_sp, begin)
    if not math.prod(out_shape):
        return [of_buffer(cx.out_buffer(nv.outputs[0], out_shape, x.dtype))]
    if max(kernel) > MAX_UNROLLED_WINDOW:
        raise NotLowered(f"pool window {kernel} wider than {MAX_UNROLLED_WINDOW}")
    # pad once: every window position read below lies inside the padded tensor
    end = [max(0, (o - 1) * s + (k - 1) * dil + 1 - b - d) for o, s, k, dil, b, d in zip(out_sp, strides, kernel, dilations, begin, in_sp, strict=True)]
    fill = lowest_value(x.dtype) if is_max else Const(0.0, x.dtype)
    op = "maxsel" if is_max else "add"
    windowed = [i for i, k in enumerate(kernel) if k > 1] or [n - 1]
    if n == 2 and windowed == [0, 1] and (strides[0] > 1 or not (begin[0] or end[0])):
        # 2-D window: the padding kernel computes the column pass too, where that saves work: a
        # strided column pass pads only the rows it keeps, and without row padding it needs no
        # selects (a select per tap made a 13x13 stride-1 pass 10-20% slower than pad + pass;
        # 3x3 stride 2 AveragePool on 64x112x112 went 1.5 -> 0.6 ms)
        base = x if x.is_view or x.size <= INLINE_PROLOGUE else cx.materialize(x, "pool_in")
        src = _padded_first_pass(cx, base, kernel, strides, dilations, begin, end, out_sp[0], fill, op)
        windowed = [1]
    elif any(begin) or any(end):
        src = padded_input(cx, x, begin, end, fill)
    elif not x.is_view and x.size > INLINE_PROLOGUE:
        src = cx.materialize(x, "pool_in")  # read k times per output: compute the prologue once
    else:
        src = x
    shape = list(src.shape)
    for step, axis in enumerate(windowed):
        last = step == len(windowed) - 1
        before = src
        # the first pass also applies the stride of every single-tap axis (a plain subsampling)
        mapped = {axis} | ({i for i, k in enumerate(kernel) if k == 1} if step == 0 else set())

        def value(idx: Index, before: Lazy = before, axis: int = axis, mapped: set[int] = mapped) -> Expr:
            taps: list[Expr] = []
            for t in range(kernel[axis]):
                pos = list(idx)
                for a in mapped:
                    pos[2 + a] = add(mul(idx[2 + a], i64(strides[a])), i64(t * dilations[a] if a == axis else 0))
                taps.append(before.gen(pos))
            acc = taps[0]
            for v in taps[1:]:
                acc = Binary(op, v, acc)
            return acc

        for a in mapped:
            shape[2 + a] = out_sp[a]
        fn = value
        if last and not is_max:
            fn = _averaged(value, nv, x.dtype, kernel, strides, dilations, begin, pads, in_sp, out_sp)
        lazy = general(tuple(shape), x.dtype, fn, kernel[axis] * (before.size + 1))
        src = cx.materialize(lazy, "pool_pass", tensor=nv.outputs[0] if last else None)
    return [src]


def _averaged(value, nv: Any, dt: str, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int], pads: list[int], in_sp: tuple[int, ...], out_sp: list[int]):  # type: ignore[no-untyped-def]
    """``value`` (the window sum) divided by the number of positions that count: the whole
    window with count_include_pad, else those inside the input (a product over the axes)."""
    n = len(kernel)
    include_pad = int(nv.attr("count_include_pad", 0))
    explicit = (nv.attr("auto_pad", "NOTSET") or "NOTSET") == "NOTSET"
    bounds = []
    for i in range(n):
        if include_pad:
            # padded extent: explicit pads, or the SAME padding; ceil_mode overhang does not count
            ext = (kernel[i] - 1) * dilations[i] + 1
            end_pad = pads[i + n] if explicit else max(0, (out_sp[i] - 1) * strides[i] + ext - in_sp[i]) - begin[i]
            bounds.append((0, begin[i] + in_sp[i] + end_pad))
        else:
            bounds.append((begin[i], begin[i] + in_sp[i]))

    def fn(idx: Index) -> Expr:
        count: Expr | None = None
        for i in range(n):
            c = _window_count(idx[2 + i], strides[i], kernel[i], dilations[i], *bounds[i])
            count = c if count is None else mul(count, c)
        assert count is not None
        return Binary("div", value(idx), Cast(count, dt))

    return fn


def _pool_with_indices(cx: Any, nv: Any, x: Lazy, kernel: list[int], strides: list[int], dilations: list[int], out_sp: list[int], begin: list[int]) -> list[Any]:
    """MaxPool with its Indices output: a window loop per output position keeping the argmax
    (flat index into the input, in row-major or, with storage_order=1, column-major order)."""
    n = len(kernel)
    in_sp = x.shape[2:]
    dt = x.dtype
    out_shape = x.shape[:2] + tuple(out_sp)
    out = cx.out_buffer(nv.outputs[0], out_shape, dt)
    idx_buf = cx.out_buffer(nv.outputs[1], out_shape, "i64")
    storage_order = int(nv.attr("storage_order", 0))
    names = [f"k{i}" for i in range(n)]

    def body(o: Index, p: Expr) -> tuple[Stmt, ...]:
        pos, ok = [], None
        for oi, name, s, dil, b, d in zip(o[2:], names, strides, dilations, begin, in_sp, strict=True):
            q = add(add(mul(oi, i64(s)), i64(-b)), mul(Var(name), i64(dil)))
            valid = Binary("and", Compare("ge", q, i64(0)), Compare("lt", q, i64(d)))
            ok = valid if ok is None else Binary("and", ok, valid)
            pos.append(Binary("min", Binary("max", q, i64(0)), i64(d - 1)))
        value = x.gen([o[0], o[1], *pos])
        acc = Local("acc", dt)
        better = Binary("and", ok, Compare("gt", value, acc)) if ok is not None else Compare("gt", value, acc)
        if storage_order:
            flat: Expr = i64(0)
            mult = 1
            for q, d in zip(pos, in_sp, strict=True):
                flat = add(flat, mul(q, i64(mult)))
                mult *= d
            flat = add(flat, mul(add(mul(o[0], i64(x.shape[1])), o[1]), i64(mult)))
        else:
            flat = flat_index([o[0], o[1], *pos], x.shape)
        inner: tuple[Stmt, ...] = (
            Assign("arg", Select(better, flat, Local("arg", "i64"))),
            Assign("acc", Select(better, value, acc)),
        )
        return (
            Decl("acc", dt, lowest_value(dt)),
            Decl("arg", "i64", i64(0)),
            *for_nest(names, tuple(kernel), inner),
            Store(out, p, acc),
            Store(idx_buf, p, Local("arg", "i64")),
        )

    if math.prod(out_shape):
        cost = float(math.prod(out_shape) * math.prod(kernel) * (x.size + 4))
        cx.emit_kernel(outer_kernel(f"pool_{out.name}", buffers_of(x), [out, idx_buf], out_shape, body, cost))
    return [of_buffer(out), of_buffer(idx_buf)]
