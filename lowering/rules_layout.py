"""Lowering rules of layout ops: index arithmetic on ``Lazy`` tensors (no copies of their own).

Transpose, Reshape, Slice, Expand, Squeeze and Unsqueeze keep strided views strided; Concat, Pad
and Gather become selects and computed indices inside the consuming kernel. Shape-deciding inputs
(shapes, axes, starts...) must be compile-time constants; the compiled model specializes on them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import numpy_helper

from .kernel_ir import Binary, Cast, Compare, Const, Expr, Select, add, clamp_index, i64, mod
from .table import NotLowered, lowering
from .values import Index, Lazy, broadcast_shape, broadcast_to, general, reshape, slice_, transpose


def _ints(nv: Any, i: int, attr: str | None = None) -> list[int] | None:
    """Shape-deciding ints from input ``i`` (constant) or, for old opsets, attribute ``attr``."""
    if nv.has(i):
        values = nv.const_ints(i)
        if values is None:
            raise NotLowered(f"{nv.op_type} input {i} is only known at run time")
        return values
    if attr is not None and attr in nv.attrs:
        return [int(v) for v in nv.attrs[attr]]
    return None


@lowering("Transpose", kind="layout")
def _transpose(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    perm = nv.attr("perm") or list(range(len(x.shape)))[::-1]
    return [transpose(x, [int(p) for p in perm])]


def reshape_target(in_shape: tuple[int, ...], spec: list[int], allowzero: bool) -> tuple[int, ...]:
    out = [in_shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@lowering("Reshape", kind="layout")
def _reshape(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    spec = _ints(nv, 1, "shape")
    assert spec is not None
    return [reshape(x, reshape_target(x.shape, spec, bool(nv.attr("allowzero", 0))))]


@lowering("Flatten", kind="layout")
def _flatten(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    axis = int(nv.attr("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    return [reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


@lowering("Squeeze", kind="layout")
def _squeeze(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    axes = _ints(nv, 1, "axes")
    rank = len(x.shape)
    drop = {a % rank for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
    return [reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in drop))]


@lowering("Unsqueeze", kind="layout")
def _unsqueeze(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    axes = _ints(nv, 1, "axes") or []
    rank = len(x.shape) + len(axes)
    new = sorted(a % rank for a in axes)
    dims = iter(x.shape)
    return [reshape(x, tuple(1 if i in new else next(dims) for i in range(rank)))]


@lowering("Expand", kind="layout")
def _expand(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    shape = _ints(nv, 1)
    assert shape is not None
    return [broadcast_to(x, broadcast_shape(x.shape, tuple(shape)))]


def slice_params(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None):  # type: ignore[no-untyped-def]
    """Per-axis start/step/length after ONNX clamping rules."""
    rank = len(shape)
    axes = [a % rank for a in (axes if axes is not None else range(len(starts)))]
    steps = steps if steps is not None else [1] * len(starts)
    st, sp, out = [0] * rank, [1] * rank, list(shape)
    for a, s, e, step in zip(axes, starts, ends, steps, strict=True):
        d = shape[a]
        if step == 0:
            raise NotLowered("Slice step 0")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            n = max(0, math.ceil((e - s) / step))
        else:
            s, e = min(max(s, -1), d - 1), min(max(e, -1), d - 1)
            n = max(0, math.ceil((s - e) / -step))
        st[a], sp[a], out[a] = s if n else 0, step if n else 1, n
    return st, sp, tuple(out)


@lowering("Slice", kind="layout")
def _slice(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    starts, ends = _ints(nv, 1, "starts"), _ints(nv, 2, "ends")
    assert starts is not None and ends is not None
    axes, steps = _ints(nv, 3, "axes"), _ints(nv, 4)
    st, sp, shape = slice_params(x.shape, starts, ends, axes, steps)
    return [slice_(x, st, sp, shape)]


@lowering("Split", kind="layout")
def _split(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    axis = int(nv.attr("axis", 0)) % len(x.shape)
    sizes = _ints(nv, 1, "split")
    n_out = len(nv.outputs)
    d = x.shape[axis]
    if not sizes:
        n = int(nv.attr("num_outputs", n_out))
        chunk = math.ceil(d / n)
        sizes = [min(chunk, d - k * chunk) for k in range(n)]
    outs, start = [], 0
    for size in sizes[:n_out]:
        st = [0] * len(x.shape)
        st[axis] = start
        shape = list(x.shape)
        shape[axis] = size
        outs.append(slice_(x, st, [1] * len(x.shape), tuple(shape)))
        start += size
    return outs


@lowering("Concat", kind="layout")
def _concat(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    parts = [x for x in xs if x is not None and x.numel > 0]
    first = next(x for x in xs if x is not None)
    rank = len(first.shape)
    axis = int(nv.attr("axis")) % rank
    if not parts:
        shape = list(first.shape)
        shape[axis] = 0
        return [general(tuple(shape), first.dtype, lambda idx: Const(0, first.dtype), 1)]
    offsets, total = [], 0
    for x in parts:
        offsets.append(total)
        total += x.shape[axis]
    shape = list(parts[0].shape)
    shape[axis] = total

    def fn(idx: Index) -> Expr:
        out: Expr | None = None
        for x, off in reversed(list(zip(parts, offsets, strict=True))):
            local = list(idx)
            local[axis] = clamp_index(add(idx[axis], i64(-off)), x.shape[axis]) if len(parts) > 1 else add(idx[axis], i64(-off))
            value = x.gen(local)
            out = value if out is None else Select(Compare("lt", idx[axis], i64(off + x.shape[axis])), value, out)
        assert out is not None
        return out

    return [general(tuple(shape), parts[0].dtype, fn, sum(x.size for x in parts) + 2 * len(parts))]


@lowering("Gather", kind="layout")
def _gather(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    data, indices = xs[0], xs[1]
    assert data is not None and indices is not None
    axis = int(nv.attr("axis", 0)) % len(data.shape)
    q = len(indices.shape)
    d = data.shape[axis]
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1 :]

    def fn(idx: Index) -> Expr:
        raw = indices.gen(idx[axis : axis + q])
        i = raw if indices.dtype == "i64" else Cast(raw, "i64")
        i = Select(Compare("lt", i, i64(0)), add(i, i64(d)), i)
        return data.gen([*idx[:axis], clamp_index(i, d), *idx[axis + q :]])

    return [general(shape, data.dtype, fn, data.size + indices.size + 4)]


@lowering("GatherND", kind="layout")
def _gather_nd(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """out[b..., i..., rest...] = data[b..., indices[b..., i..., :], rest...]: the last axis of
    ``indices`` (length k) addresses the k data axes after the ``batch_dims`` shared ones."""
    data, indices = xs[0], xs[1]
    assert data is not None and indices is not None
    b = int(nv.attr("batch_dims", 0))
    k = indices.shape[-1]
    if b + k > len(data.shape) or data.shape[:b] != indices.shape[:b]:
        raise NotLowered("GatherND with batch dims that differ from the data's")
    lead = indices.shape[:-1]
    shape = lead + data.shape[b + k :]

    def fn(idx: Index) -> Expr:
        at: list[Expr] = list(idx[:b])
        for j in range(k):
            d = data.shape[b + j]
            raw = indices.gen([*idx[: len(lead)], i64(j)])
            i = raw if indices.dtype == "i64" else Cast(raw, "i64")
            at.append(clamp_index(Select(Compare("lt", i, i64(0)), add(i, i64(d)), i), d))
        return data.gen([*at, *idx[len(lead) :]])

    return [general(shape, data.dtype, fn, data.size + k * (indices.size + 4))]


@lowering("Pad", kind="layout")
def _pad(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    rank = len(x.shape)
    pads = _ints(nv, 1, "pads") or [0] * (2 * rank)
    axes = _ints(nv, 3)
    mode = nv.attr("mode", "constant")
    if nv.opset < 11:
        pads = [int(p) for p in (nv.attr("pads") or nv.attr("paddings") or pads)]
    axes = [a % rank for a in axes] if axes else list(range(rank))
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    shape = tuple(d + b + e for d, b, e in zip(x.shape, begin, end, strict=True))
    value = xs[2] if len(xs) > 2 and xs[2] is not None else None
    if nv.opset < 11:
        cval: Expr = Const(float(nv.attr("value", 0.0)), x.dtype)
    elif value is not None:
        cval = value.gen([i64(0)] * len(value.shape))
    else:
        cval = Const(0, x.dtype)
    if any(d == 0 for d in x.shape) and mode != "constant":
        raise NotLowered(f"Pad {mode} of an empty tensor")

    def fn(idx: Index) -> Expr:
        src: list[Expr] = []
        inside: Expr | None = None
        for i, d, b in zip(idx, x.shape, begin, strict=True):
            j = add(i, i64(-b))
            if mode == "constant":
                ok = Binary("and", Compare("ge", j, i64(0)), Compare("lt", j, i64(d)))
                inside = ok if inside is None else Binary("and", inside, ok)
                src.append(clamp_index(j, d))
            elif mode == "edge":
                src.append(clamp_index(j, d))
            elif mode == "reflect":
                if d == 1:
                    src.append(i64(0))
                    continue
                period = 2 * (d - 1)
                m = mod(add(mod(j, period), i64(period)), period)
                src.append(Select(Compare("lt", m, i64(d)), m, add(i64(period), Binary("mul", m, i64(-1)))))
            elif mode == "wrap":
                src.append(mod(add(mod(j, d), i64(d)), d))
            else:
                raise NotLowered(f"Pad mode {mode}")
        v = x.gen(src)
        return v if inside is None else Select(inside, v, cval)

    return [general(shape, x.dtype, fn, x.size + 3 * rank)]


@lowering("Shape", kind="static")
def _shape(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    x = xs[0]
    assert x is not None
    rank = len(x.shape)
    start, end = int(nv.attr("start", 0)), nv.attr("end", None)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end), 0), rank)
    return [np.array(x.shape[start:stop], dtype=np.int64)]


@lowering("ConstantOfShape", kind="static")
def _constant_of_shape(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    shape = _ints(nv, 0)
    assert shape is not None
    tensor = nv.attr("value")
    value = numpy_helper.to_array(tensor) if tensor is not None else np.zeros(1, np.float32)
    return [np.full(shape, value.reshape(-1)[0], dtype=value.dtype)]

