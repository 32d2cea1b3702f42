"""GPU forms of CPU-shaped kernels, as kernel IR rewrites (so the IR interpreter can check them).

The CPU lowering gives each thread a row: the parallel variable is the outer index and an inner
loop walks the last dimension. On a GPU that makes neighbouring threads touch addresses a row
apart. ``flatten_elementwise`` turns such a kernel (one loop of plain stores) into one parallel
unit per element, so consecutive threads touch consecutive elements; ``vectorize`` then gives
each thread ``width`` consecutive elements (an unrolled loop whose unit-stride loads and stores
LLVM merges into 128-bit accesses when the element count allows).
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass, replace

from onnxsat.lowering.kernel_ir import (
    Assign,
    Binary,
    Const,
    Decl,
    Expr,
    Kernel,
    Loop,
    Store,
    Var,
    add,
    floordiv,
    i64,
    mod,
    mul,
)

VECTOR_WIDTH = 4
"""Elements per thread in a vectorized elementwise kernel (4 x f32 = one 128-bit access)."""


def substitute(node: object, values: dict[str, Expr]) -> object:
    """A copy of an IR node with every ``Var(name)`` in ``values`` replaced by its expression."""
    if isinstance(node, Var):
        return values.get(node.name, node)
    if isinstance(node, tuple):
        return tuple(substitute(x, values) for x in node)
    if is_dataclass(node) and not isinstance(node, type):
        changes = {f.name: substitute(getattr(node, f.name), values) for f in fields(node)}
        return replace(node, **changes)  # type: ignore[type-var]
    return node


def replace_exprs(node: object, table: dict[Expr, Expr]) -> object:
    """A copy of an IR node with whole subexpressions found in ``table`` replaced."""
    if isinstance(node, (Const, Var, Binary)) and node in table:
        return table[node]
    if isinstance(node, tuple):
        return tuple(replace_exprs(x, table) for x in node)
    if is_dataclass(node) and not isinstance(node, type):
        changes = {f.name: replace_exprs(getattr(node, f.name), table) for f in fields(node)}
        return replace(node, **changes)  # type: ignore[type-var]
    return node


def _mentions(node: object, name: str) -> bool:
    if isinstance(node, Var):
        return node.name == name
    if isinstance(node, tuple):
        return any(_mentions(x, name) for x in node)
    if is_dataclass(node) and not isinstance(node, type):
        return any(_mentions(getattr(node, f.name), name) for f in fields(node))
    return False


def is_elementwise(kernel: Kernel) -> bool:
    """One loop over the last dimension whose body only stores (no locals, no inner loops)."""
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], Loop):
        return False
    return all(isinstance(s, Store) for s in kernel.body[0].body)


def flatten_elementwise(kernel: Kernel, var: str = "q") -> Kernel | None:
    """The kernel with one parallel unit per element, or None when its loop has another shape.

    Two loop shapes come from ``lowering.loops.nest``: ``for j in [0, n)`` (parallel over rows) and
    the blocked ``for j in [(p % B) * blk, min((p % B) * blk + blk, n))`` (few rows, each row cut
    into B blocks). Both become ``q in [0, rows * n)`` with ``row = q // n`` and ``j = q % n``.
    """
    if not is_elementwise(kernel):
        return None
    loop = kernel.body[0]
    assert isinstance(loop, Loop)
    p, q = kernel.parallel_var, Var(var)
    if _mentions(kernel.body, var):
        return None
    if isinstance(loop.start, Const) and loop.start.value == 0 and isinstance(loop.stop, Const):
        n = int(loop.stop.value)
        rows = kernel.parallel_extent
        row, j = (i64(0), q) if rows == 1 else (floordiv(q, n), mod(q, n))
        body = substitute(loop.body, {p: row, loop.var: j})
        return replace(kernel, parallel_var=var, parallel_extent=rows * n, body=body)  # type: ignore[arg-type]
    blocked = _blocked_shape(loop, p)
    if blocked is None:
        return None
    blocks, blk, n = blocked
    if kernel.parallel_extent % blocks:
        return None
    rows = kernel.parallel_extent // blocks
    row, j = (i64(0), q) if rows == 1 else (floordiv(q, n), mod(q, n))
    # p only appears as p // B (the row) and p % B (the block, in the loop bounds we drop)
    body = replace_exprs(loop.body, {Binary("div", Var(p), i64(blocks)): Var("__row")})
    if _mentions(body, p):
        body = substitute(body, {p: add(mul(row, i64(blocks)), floordiv(j, blk))})
    body = substitute(body, {"__row": row, loop.var: j})
    return replace(kernel, parallel_var=var, parallel_extent=rows * n, body=body)  # type: ignore[arg-type]


def _blocked_shape(loop: Loop, p: str) -> tuple[int, int, int] | None:
    """``(B, blk, n)`` when the loop is ``for j in [(p % B) * blk, min(start + blk, n))``."""
    start, stop = loop.start, loop.stop
    if not (isinstance(start, Binary) and start.op == "mul" and isinstance(start.b, Const)):
        return None
    inner = start.a
    if not (isinstance(inner, Binary) and inner.op == "mod" and inner.a == Var(p) and isinstance(inner.b, Const)):
        return None
    blk, blocks = int(start.b.value), int(inner.b.value)
    expected_hi = Binary("add", start, i64(blk))
    if not (isinstance(stop, Binary) and stop.op == "min" and stop.a == expected_hi and isinstance(stop.b, Const)):
        return None
    return blocks, blk, int(stop.b.value)


def vectorize(kernel: Kernel, width: int = VECTOR_WIDTH, var: str = "t") -> Kernel | None:
    """A flattened kernel with ``width`` consecutive elements per parallel unit (None when the
    element count is not a multiple of ``width``)."""
    if width <= 1 or kernel.parallel_extent % width or _mentions(kernel.body, var):
        return None
    lane = f"{var}_v"
    q = add(mul(Var(var), i64(width)), Var(lane))
    body = substitute(kernel.body, {kernel.parallel_var: q})
    loop = Loop(lane, i64(width), body)  # type: ignore[arg-type]
    return replace(kernel, parallel_var=var, parallel_extent=kernel.parallel_extent // width, body=(loop,))


def reduction_parts(kernel: Kernel) -> tuple[Decl, tuple[Loop, ...], Assign, Store] | None:
    """The pieces of a ``lowering.loops.reduction_kernel``: ``acc = init``; loops over the reduced
    axes whose innermost body is one ``acc = op(acc, value)``; one store of ``finish(acc)``."""
    if len(kernel.body) != 3:
        return None
    decl, loop, store = kernel.body
    if not (isinstance(decl, Decl) and isinstance(loop, Loop) and isinstance(store, Store)):
        return None
    loops: list[Loop] = []
    node: object = loop
    while isinstance(node, Loop):
        if not (isinstance(node.start, Const) and node.start.value == 0 and isinstance(node.stop, Const)):
            return None
        loops.append(node)
        if len(node.body) != 1:
            return None
        node = node.body[0]
    if not isinstance(node, Assign) or node.name != decl.name:
        return None
    value = node.value
    if not (isinstance(value, Binary) and value.op in ("add", "max", "min")):
        return None
    return decl, tuple(loops), node, store


def reduced_size(loops: tuple[Loop, ...]) -> int:
    return math.prod(int(lp.stop.value) for lp in loops)  # type: ignore[union-attr]
