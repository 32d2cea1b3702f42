"""Matrix-product operands stored in the memory order of what they are computed from.

A product operand that is an elementwise result seen through a transpose (BERT's K^T: the key
projection plus its bias, split into heads and transposed) would be stored by a transposing
kernel (strided reads or writes on every element) in the operand's own row-major order. Stored
in the order its largest input is laid out in, the same kernel is a plain unit-stride pass, and
the product reads the buffer through strides (a transpose flag for BLAS).
"""

from __future__ import annotations

from typing import Any

from .program import StridedOperand
from .values import Lazy, contiguous_strides, transpose


def blas_strides(strides: tuple[int, ...]) -> bool:
    """Whether matrices with these strides are BLAS operands (unit stride in one of the last two dims)."""
    return len(strides) >= 2 and (strides[-1] == 1 or strides[-2] == 1) and all(s >= 0 for s in strides)


def leaf_order(x: Lazy) -> tuple[int, ...] | None:
    """The permutation of ``x``'s dims that reads its largest leaf in memory order (size-1 dims
    first, then by decreasing stride), or None when ``x`` has no leaves, already reads that leaf
    along unit-stride rows (the default store copies whole runs), or reads it in no single order
    (broadcast or overlapping dims)."""
    if not x.leaves or len(x.shape) < 2:
        return None
    leaf = max(x.leaves, key=lambda v: v.buffer.nbytes)
    strides = [s for s, d in zip(leaf.strides, x.shape, strict=True) if d > 1]
    if any(s <= 0 for s in strides) or len(set(strides)) != len(strides):
        return None
    if x.shape[-1] > 1 and leaf.strides[-1] == 1:
        return None
    perm = tuple(sorted(range(len(x.shape)), key=lambda a: (x.shape[a] > 1, -leaf.strides[a] if x.shape[a] > 1 else a)))
    return None if perm == tuple(range(len(x.shape))) else perm


def stored_in_source_order(cx: Any, x: Lazy) -> StridedOperand | None:
    """``x`` stored in its largest leaf's memory order and seen back through strides, when that
    order differs from ``x``'s and the strided view is still a BLAS operand; else None (nothing
    emitted)."""
    perm = leaf_order(x)
    if perm is None:
        return None
    inverse = [perm.index(a) for a in range(len(perm))]
    stored_strides = contiguous_strides([x.shape[p] for p in perm])
    strides = tuple(stored_strides[i] for i in inverse)
    if not blas_strides(strides):
        return None
    stored = cx.materialize(transpose(x, perm), "operand")
    return StridedOperand(stored.view.buffer, x.shape, strides, 0)
