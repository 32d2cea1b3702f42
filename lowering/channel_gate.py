"""A squeeze-excitation's gate found in a conv's input: ``x * f`` with ``f`` one value per channel,
so the product that reads ``x`` scales B's rows by ``f`` as it packs them instead of a pass that
multiplies the whole image first."""

from __future__ import annotations

from typing import Any

from .kernel_ir import Binary, Buffer, Const, Expr, Var, loads_in
from .values import Lazy, of_view, reshape


def channel_scaled(cx: Any, col: Lazy) -> tuple[Lazy, Buffer] | None:
    """``col`` (1 x 1 x K x N) as ``x * f``, with ``x`` a stored view whose rows are unit-stride (and
    at least N apart: a flat depthwise conv's planes of whole vectors) and ``f`` one value per row
    (a squeeze-excitation's gate, broadcast over the positions): the view ``x`` and a buffer holding
    ``f`` (K values, stored here); None for any other ``col``."""
    if col.leaves is None or col.combine is None or len(col.shape) != 4 or col.shape[:2] != (1, 1):
        return None
    n = col.shape[3]
    full = [i for i, v in enumerate(col.leaves) if v.strides[-1] == 1 and v.strides[-2] >= n]
    if len(full) != 1 or n < 2:
        return None
    gate = channel_gate(cx, col, full[0], 2)
    return None if gate is None else (of_view(col.leaves[full[0]], col.shape), gate)


def channel_gate(cx: Any, x: Lazy, image: int, axis: int) -> Buffer | None:
    """A buffer holding ``f`` (stored here, one value per index of ``axis``) when ``x`` is its leaf
    ``image`` times ``f``, read from the other leaves, which are constant along the axes after
    ``axis``; None otherwise."""
    assert x.leaves is not None and x.combine is not None
    others = [i for i in range(len(x.leaves)) if i != image]
    if not others or any(any(st != 0 for st in x.leaves[i].strides[axis + 1 :]) for i in others):
        return None
    loads = [v.load([Var(f"i{d}") for d in range(len(x.shape))]) for v in x.leaves]
    value = x.combine(loads)
    x_load = loads[image]
    if not (isinstance(value, Binary) and value.op == "mul" and (value.a is x_load or value.b is x_load)):
        return None
    x_first = value.a is x_load
    if any(ld == x_load for ld in loads_in(value.b if x_first else value.a)):
        return None
    combine = x.combine

    def factor(row_loads: list[Expr]) -> Expr:  # the gate alone: the other operand of the product
        every = list(row_loads)
        every.insert(image, Const(1.0, x.dtype))
        product = combine(every)
        assert isinstance(product, Binary)
        return product.b if x_first else product.a

    shape = x.shape[: axis + 1] + (1,) * (len(x.shape) - axis - 1)
    gate = Lazy(shape, x.dtype, tuple(x.leaves[i] for i in others), factor, None, x.size)
    return cx.materialize(reshape(gate, (x.shape[axis],)), "gate").view.buffer
