"""Tensors while lowering: strided views of buffers and lazily fused expressions over them.

A ``Lazy`` is a tensor that is not stored anywhere yet: a function from an output multi-index to
a scalar expression. Elementwise ops compose these functions (that is the fusion), layout ops
remap the index (that is "layout as index arithmetic"), and a kernel finally evaluates one at
every output index. When every load of a ``Lazy`` is an affine ``View`` of a buffer, it is kept
in that form (``leaves`` + ``combine``), so a kernel can coalesce dimensions and layout ops can
stay strided views (a transposed weight is a view, not a copy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .kernel_ir import Buffer, Const, Expr, Load, add, flat_index, floordiv, i64, mod, mul, unflatten

Index = list[Expr]


@dataclass(frozen=True)
class View:
    """``buffer`` seen with ``strides`` (in elements, 0 for broadcast dims) from ``offset``."""

    buffer: Buffer
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(buffer: Buffer) -> View:
        return View(buffer, contiguous_strides(buffer.shape), 0)

    def load(self, idx: Sequence[Expr]) -> Expr:
        flat: Expr = i64(self.offset)
        for i, s in zip(idx, self.strides, strict=True):
            if s:
                flat = add(flat, mul(i, i64(s)))
        return Load(self.buffer, flat)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


@dataclass
class Lazy:
    """A tensor as an index -> scalar-expression function.

    Affine form: ``leaves`` are views in this tensor's index space and ``combine`` maps their
    loads to the value. General form (``leaves is None``): ``general`` maps the index directly.
    ``size`` counts expression nodes, so fusion can stop before expressions blow up.
    """

    shape: tuple[int, ...]
    dtype: str
    leaves: tuple[View, ...] | None
    combine: Callable[[list[Expr]], Expr] | None = None
    general: Callable[[Index], Expr] | None = None
    size: int = 1
    fine: Lazy | None = None
    """The same values over a finer shape (each dim of ``shape`` split into consecutive dims of
    ``fine.shape``; equal row-major order) where no index needs div/mod, when this form needs
    them (a reshape that merges dims): a kernel that stores this tensor loops over ``fine``."""

    def gen(self, idx: Index) -> Expr:
        if self.leaves is not None:
            assert self.combine is not None
            return self.combine([v.load(idx) for v in self.leaves])
        assert self.general is not None
        return self.general(idx)

    @property
    def is_view(self) -> bool:
        """A plain view of one buffer (no arithmetic): free to duplicate into consumers."""
        return self.leaves is not None and len(self.leaves) == 1 and self.combine is _identity

    @property
    def view(self) -> View:
        assert self.is_view and self.leaves is not None
        return self.leaves[0]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _identity(loads: list[Expr]) -> Expr:
    return loads[0]


def of_view(view: View, shape: tuple[int, ...]) -> Lazy:
    return Lazy(tuple(shape), view.buffer.dtype, (view,), _identity, None, 1)


def of_buffer(buffer: Buffer) -> Lazy:
    return of_view(View.contiguous(buffer), buffer.shape)


def scalar(value: float | int | bool, dtype: str, shape: tuple[int, ...] = ()) -> Lazy:
    const = Const(value, dtype)
    return Lazy(tuple(shape), dtype, (), lambda loads: const, None, 1)


def reads_channels_last(x: Lazy) -> bool:
    """Whether ``x`` is a 4-D image of more than one channel and position with a full-size leaf
    stored channels last (strides decreasing over N, H, W, C): a Winograd or position-major
    conv's output, or an elementwise op of one."""
    if len(x.shape) != 4 or x.shape[1] < 2 or x.shape[2] * x.shape[3] < 2 or x.leaves is None:
        return False
    return any(0 not in v.strides and v.strides[0] >= v.strides[2] > v.strides[3] > v.strides[1] == 1 for v in x.leaves)


def nchw_view(buffer: Buffer, shape: tuple[int, ...]) -> Lazy:
    """The NCHW image ``shape`` [N, C, H, W] stored channels last in ``buffer`` ([N, H', W', C] or
    its flat [N * H' * W', C], H' >= H and W' >= W: a grid of whole tiles reads as its corner)."""
    n, c, h, w = shape
    width = buffer.shape[2] if len(buffer.shape) == 4 else w
    plane = buffer.numel // n
    return of_view(View(buffer, (plane, 1, width * c, c), 0), shape)


def general(shape: tuple[int, ...], dtype: str, fn: Callable[[Index], Expr], size: int) -> Lazy:
    return Lazy(tuple(shape), dtype, None, None, fn, size)


# ---------------------------------------------------------------- elementwise composition
def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(x: Lazy, shape: tuple[int, ...]) -> Lazy:
    """``x`` seen in ``shape`` (numpy broadcasting: leading dims added, size-1 dims repeated)."""
    if x.shape == shape:
        return x
    lead = len(shape) - len(x.shape)
    if lead < 0 or any(d != 1 and d != shape[lead + i] for i, d in enumerate(x.shape)):
        raise ValueError(f"cannot broadcast {x.shape} to {shape}")
    if x.leaves is not None:
        leaves = tuple(
            View(
                v.buffer,
                (0,) * lead + tuple(0 if x.shape[i] == 1 else s for i, s in enumerate(v.strides)),
                v.offset,
            )
            for v in x.leaves
        )
        return Lazy(shape, x.dtype, leaves, x.combine, None, x.size)
    src = x.shape
    zero = i64(0)

    def fn(idx: Index) -> Expr:
        return x.gen([zero if src[i] == 1 else idx[lead + i] for i in range(len(src))])

    return general(shape, x.dtype, fn, x.size)


def elementwise(fn: Callable[..., Expr], inputs: Sequence[Lazy], dtype: str, shape: tuple[int, ...] | None = None) -> Lazy:
    """``fn`` applied at every index of the broadcast of ``inputs`` (the fused composition)."""
    out_shape = shape if shape is not None else broadcast_shape(*(x.shape for x in inputs))
    xs = [broadcast_to(x, out_shape) for x in inputs]
    size = 1 + sum(x.size for x in xs)
    if all(x.leaves is not None for x in xs):
        counts = [len(x.leaves or ()) for x in xs]
        leaves = tuple(v for x in xs for v in (x.leaves or ()))

        def combine(loads: list[Expr]) -> Expr:
            parts, pos = [], 0
            for x, n in zip(xs, counts, strict=True):
                assert x.combine is not None
                parts.append(x.combine(loads[pos : pos + n]))
                pos += n
            return fn(*parts)

        return Lazy(out_shape, dtype, leaves, combine, None, size)
    return general(out_shape, dtype, lambda idx: fn(*(x.gen(idx) for x in xs)), size)


# ---------------------------------------------------------------- layout as index arithmetic
def _map_leaves(x: Lazy, shape: tuple[int, ...], fn: Callable[[View], View | None]) -> Lazy | None:
    if x.leaves is None:
        return None
    leaves = []
    for v in x.leaves:
        mapped = fn(v)
        if mapped is None:
            return None
        leaves.append(mapped)
    return Lazy(tuple(shape), x.dtype, tuple(leaves), x.combine, None, x.size)


def transpose(x: Lazy, perm: Sequence[int]) -> Lazy:
    shape = tuple(x.shape[p] for p in perm)
    mapped = _map_leaves(x, shape, lambda v: View(v.buffer, tuple(v.strides[p] for p in perm), v.offset))
    if mapped is not None:
        return mapped
    inverse = [0] * len(perm)
    for out_axis, in_axis in enumerate(perm):
        inverse[in_axis] = out_axis
    return general(shape, x.dtype, lambda idx: x.gen([idx[inverse[a]] for a in range(len(perm))]), x.size)


def slice_(x: Lazy, starts: Sequence[int], steps: Sequence[int], shape: tuple[int, ...]) -> Lazy:
    """Per-axis ``start + i * step`` (all axes given; an untouched axis has start 0, step 1)."""

    def view(v: View) -> View:
        offset = v.offset + sum(s * st for s, st in zip(v.strides, starts, strict=True))
        return View(v.buffer, tuple(s * step for s, step in zip(v.strides, steps, strict=True)), offset)

    mapped = _map_leaves(x, shape, view)
    if mapped is not None:
        return mapped

    def fn(idx: Index) -> Expr:
        return x.gen([add(i64(st), mul(i, i64(step))) for i, st, step in zip(idx, starts, steps, strict=True)])

    return general(shape, x.dtype, fn, x.size)


def _reshape_strides(old_shape: tuple[int, ...], old_strides: tuple[int, ...], new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides that show a strided array in ``new_shape`` without a copy (numpy's rule), or None."""
    old = [(d, s) for d, s in zip(old_shape, old_strides, strict=True) if d != 1]
    new = [d for d in new_shape]
    out: list[int] = []
    oi = 0
    ni = 0
    result = [0] * len(new)
    while ni < len(new):
        if new[ni] == 1:
            result[ni] = 0
            ni += 1
            continue
        if oi >= len(old):
            return None
        # gather old dims until their product matches a group of new dims
        o_prod, n_prod = old[oi][0], new[ni]
        o_end, n_end = oi + 1, ni + 1
        while o_prod != n_prod:
            if o_prod < n_prod:
                if o_end >= len(old):
                    return None
                o_prod *= old[o_end][0]
                o_end += 1
            else:
                while n_end < len(new) and new[n_end] == 1:
                    n_end += 1
                if n_end >= len(new):
                    return None
                n_prod *= new[n_end]
                n_end += 1
        for k in range(oi, o_end - 1):  # the old group must be contiguous within itself
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        stride = old[o_end - 1][1]
        for k in range(n_end - 1, ni - 1, -1):
            result[k] = 0 if new[k] == 1 else stride
            stride *= new[k] if new[k] != 1 else 1
        oi, ni = o_end, n_end
    del out
    return tuple(result) if oi == len(old) else None


def reshape(x: Lazy, shape: tuple[int, ...]) -> Lazy:
    """``x`` in a new shape with the same row-major order: views stay views when numpy's no-copy
    rule allows; else, when both shapes split into a common finer shape, only merged dims are
    split by div/mod (and kernels that store it loop over the finer shape); else the index goes
    through a flat position (div/mod)."""
    shape = tuple(shape)
    if shape == x.shape:
        return x
    if x.leaves is None and x.fine is not None:
        return reshape(x.fine, shape)
    mapped = _map_leaves(
        x,
        shape,
        lambda v: (lambda st: None if st is None else View(v.buffer, st, v.offset))(
            _reshape_strides(x.shape, v.strides, shape)
        ),
    )
    if mapped is not None:
        return mapped
    fine_shape = common_refinement(x.shape, shape)
    if fine_shape is not None:
        fine = _split(x, fine_shape)
        return fine if fine_shape == shape else _merged(fine, shape)
    src = x.shape

    def fn(idx: Index) -> Expr:
        return x.gen(unflatten(flat_index(idx, shape), src))

    return general(shape, x.dtype, fn, x.size + 4 * len(src))


def _split(x: Lazy, fine_shape: tuple[int, ...]) -> Lazy:
    """``x`` with each dim split into consecutive dims of ``fine_shape`` (size-1 dims dropped): its
    index is affine in the fine index, so views stay views and general forms need no div/mod."""
    if fine_shape == x.shape:
        return x

    def split_view(v: View) -> View | None:
        strides = _reshape_strides(x.shape, v.strides, fine_shape)
        return None if strides is None else View(v.buffer, strides, v.offset)

    mapped = _map_leaves(x, fine_shape, split_view)
    if mapped is not None:
        return mapped
    groups = _groups(fine_shape, x.shape)

    def fn(idx: Index) -> Expr:
        coarse, pos = [], 0
        for group in groups:
            coarse.append(flat_index(list(idx[pos : pos + len(group)]), group))
            pos += len(group)
        return x.gen(coarse)

    return general(fine_shape, x.dtype, fn, x.size + 2 * len(fine_shape))


def _groups(fine_shape: tuple[int, ...], shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The consecutive dims of ``fine_shape`` that make up each dim of ``shape`` (none for size 1)."""
    groups, pos = [], 0
    for d in shape:
        group: list[int] = []
        acc = 1
        while acc < d:
            group.append(fine_shape[pos])
            acc *= fine_shape[pos]
            pos += 1
        groups.append(tuple(group))
    return groups


def common_refinement(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The coarsest shape whose dims split both ``a`` and ``b`` into consecutive groups (row-major
    order kept), e.g. (512, 12, 64) for (512, 768) and (512, 12, 64); None when there is none."""
    if math.prod(a) != math.prod(b) or math.prod(a) == 0:
        return None
    cuts: set[int] = set()
    for shape in (a, b):
        acc = 1
        for d in shape:
            acc *= d
            cuts.add(acc)
    dims, prev = [], 1
    for c in sorted(cuts):
        if c % prev:
            return None
        if c != prev:
            dims.append(c // prev)
        prev = c
    return tuple(dims)


def _merged(fine: Lazy, shape: tuple[int, ...]) -> Lazy:
    """``fine`` seen in the coarser ``shape`` (dims merged): each merged dim's index is split by
    div/mod of its own group only; kernels that store the result loop over ``fine``."""
    groups = _groups(fine.shape, shape)

    def fn(idx: Index) -> Expr:
        fine_idx: list[Expr] = []
        for i, group in zip(idx, groups, strict=True):
            rest = math.prod(group)
            for k, g in enumerate(group):
                rest //= g
                part = floordiv(i, rest) if rest > 1 else i
                fine_idx.append(part if k == 0 else mod(part, g))
        return fine.gen(fine_idx)

    return Lazy(shape, fine.dtype, None, None, fn, fine.size + 2 * len(fine.shape), fine)
