"""Loop nests for kernels: evaluate a ``Lazy`` everywhere, or reduce over some axes.

Every kernel is parallel over a flat outer range; the innermost loop runs over the last
(coalesced) dimension so the LLVM vectorizer sees unit-stride loads. When the outer range is too
small to feed the threads, the innermost dimension is cut into blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .kernel_ir import (
    Assign,
    Binary,
    Buffer,
    Const,
    Decl,
    Expr,
    Kernel,
    Local,
    Loop,
    Stmt,
    Store,
    Var,
    add,
    as_dtype,
    floordiv,
    i64,
    mod,
    mul,
    unflatten,
)
from .values import Index, Lazy, View, contiguous_strides

MIN_PARALLEL_UNITS = 16
"""Outer units below this make the innermost dimension split into blocks."""
MIN_BLOCK = 2048


def coalesce(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dims that every stride set walks contiguously; drop size-1 dims."""
    dims = [(d, [s[i] for s in strides]) for i, d in enumerate(shape) if d != 1]
    merged: list[tuple[int, list[int]]] = []
    for d, st in dims:
        if merged:
            pd, pst = merged[-1]
            if all(ps == s * d for ps, s in zip(pst, st, strict=True)):
                merged[-1] = (pd * d, st)
                continue
        merged.append((d, st))
    new_shape = tuple(d for d, _ in merged)
    new_strides = [tuple(st[k] for _, st in merged) for k in range(len(strides))]
    return new_shape, new_strides


@dataclass
class Nest:
    """A parallel loop nest over ``shape``: ``parallel_extent`` units, and a builder that wraps a
    per-index body into the statements of one unit."""

    parallel_extent: int
    build: Callable[[Callable[[Index], list[Stmt]]], tuple[Stmt, ...]]


def nest(shape: tuple[int, ...], pvar: str = "p", split_inner: bool = True) -> Nest:
    """Loops over ``shape``; outer dims flattened into the parallel variable ``pvar``."""
    p = Var(pvar)
    if not shape:
        return Nest(1, lambda body: tuple(body([])))
    outer, inner = shape[:-1], shape[-1]
    rows = math.prod(outer)
    j = Var(f"{pvar}_j")
    blocks = 1
    if split_inner and rows < MIN_PARALLEL_UNITS and inner >= 2 * MIN_BLOCK:
        blocks = min(math.ceil(inner / MIN_BLOCK), math.ceil(MIN_PARALLEL_UNITS / max(rows, 1)) * 4)
    block = math.ceil(inner / blocks)
    blocks = math.ceil(inner / block)

    def build(body: Callable[[Index], list[Stmt]]) -> tuple[Stmt, ...]:
        row: Expr = floordiv(p, blocks) if blocks > 1 else p
        idx = unflatten(row, outer) if outer else []
        if blocks > 1:
            start = mul(mod(p, blocks), i64(block))
            stop: Expr = Binary("min", add(start, i64(block)), i64(inner))
            return (Loop(j.name, stop, tuple(body([*idx, j])), start),)
        return (Loop(j.name, i64(inner), tuple(body([*idx, j]))),)

    return Nest(rows * blocks, build)


def materialize_kernel(name: str, x: Lazy, out: Buffer) -> Kernel:
    """A kernel that stores ``x`` into the contiguous buffer ``out``."""
    if x.fine is not None:  # same row-major order, affine: no div/mod per element
        x = x.fine
    shape = x.shape
    out_strides = contiguous_strides(shape)
    if x.leaves is not None:
        cshape, cstrides = coalesce(shape, [out_strides, *(v.strides for v in x.leaves)])
        out_view = View(out, cstrides[0], 0)
        leaves = [View(v.buffer, st, v.offset) for v, st in zip(x.leaves, cstrides[1:], strict=True)]
        combine = x.combine
        assert combine is not None

        def value(idx: Index) -> Expr:
            return combine([v.load(idx) for v in leaves])

        loop_shape = cshape
    else:
        out_view = View(out, out_strides, 0)
        value = x.gen
        loop_shape = shape
    n = nest(loop_shape)

    def body(idx: Index) -> list[Stmt]:
        store_index = out_view.load(idx).index  # type: ignore[union-attr]
        return [Store(out, store_index, value(idx))]

    params = _params_of(x, out)
    return Kernel(name, params, (out.name,), "p", n.parallel_extent, n.build(body), float(x.numel * x.size))


def reduction_kernel(
    name: str,
    out: Buffer,
    outer_shape: tuple[int, ...],
    red_shape: tuple[int, ...],
    value: Callable[[Index, Index], Expr],
    op: str,
    init: Const,
    finish: Callable[[Expr, Index], Expr],
    inputs: list[Buffer],
    cost_per_item: float = 1.0,
) -> Kernel:
    """``out[o] = finish(op-reduce over r of value(o, r), o)`` for every outer index ``o``.

    ``op`` is ``add``, ``max`` or ``min``; the innermost loop is the last reduced axis. The
    accumulator has ``init``'s type (``value`` gives it that type); the result is stored as ``out``'s.
    """
    p = Var("p")
    acc = Local("acc", init.dtype)
    red_vars = [Var(f"r{i}") for i in range(len(red_shape))]
    units = math.prod(outer_shape) if outer_shape else 1

    def build() -> tuple[Stmt, ...]:
        o_idx = unflatten(p, outer_shape) if outer_shape else []
        inner: tuple[Stmt, ...] = (Assign("acc", Binary(op, acc, value(o_idx, list(red_vars)))),)
        for v, d in reversed(list(zip(red_vars, red_shape, strict=True))):
            inner = (Loop(v.name, i64(d), inner),)
        return (Decl("acc", init.dtype, init), *inner, Store(out, p, as_dtype(finish(acc, o_idx), out.dtype)))

    cost = float(units * max(math.prod(red_shape), 1) * cost_per_item)
    return Kernel(name, tuple(_unique([*inputs, out])), (out.name,), "p", units, build(), cost)


def buffers_of(x: Lazy) -> list[Buffer]:
    """Buffers a lazy tensor reads (probing its expression at a symbolic index)."""
    from .kernel_ir import loads_in

    if x.leaves is not None:
        return _unique([v.buffer for v in x.leaves])
    probe = x.gen([Var(f"probe{i}") for i in range(len(x.shape))])
    return _unique([ld.buffer for ld in loads_in(probe)])


def _params_of(x: Lazy, out: Buffer) -> tuple[Buffer, ...]:
    return tuple(_unique([*buffers_of(x), out]))


def _unique(buffers: list[Buffer]) -> list[Buffer]:
    seen: dict[str, Buffer] = {}
    for b in buffers:
        seen.setdefault(b.name, b)
    return list(seen.values())


def for_nest(names: list[str], extents: tuple[int, ...], body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """Nested loops ``for names[0] in [0, extents[0]): for names[1] ...: body``."""
    for name, d in reversed(list(zip(names, extents, strict=True))):
        body = (Loop(name, i64(d), body),)
    return body


def outer_kernel(
    name: str,
    inputs: list[Buffer],
    outputs: list[Buffer],
    outer_shape: tuple[int, ...],
    body: Callable[[Index, Expr], tuple[Stmt, ...]],
    cost: float,
) -> Kernel:
    """A kernel parallel over the flat ``outer_shape``; ``body(outer_index, flat_outer)`` gives the
    statements of one outer position (its own inner loops, locals and stores)."""
    p = Var("p")
    units = math.prod(outer_shape) if outer_shape else 1
    o_idx = unflatten(p, outer_shape) if outer_shape else []
    params = tuple(_unique([*inputs, *outputs]))
    return Kernel(name, params, tuple(b.name for b in outputs), "p", units, body(o_idx, p), cost)
