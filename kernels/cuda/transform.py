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
    Load,
    Local,
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


def _mentions(node: object, name: str, kind: type = Var) -> bool:
    """Whether ``node`` reads the variable (``Var``) or local (``Local``) called ``name``."""
    if isinstance(node, kind):
        return node.name == name  # type: ignore[attr-defined]
    if isinstance(node, tuple):
        return any(_mentions(x, name, kind) for x in node)
    if is_dataclass(node) and not isinstance(node, type):
        return any(_mentions(getattr(node, f.name), name, kind) for f in fields(node))
    return False


def _is_element_loop(stmt: object) -> bool:
    """A loop over the last dimension whose body only stores and declares scalars."""
    return isinstance(stmt, Loop) and all(isinstance(s, (Store, Decl)) for s in stmt.body)


def _element_loops(body: tuple[object, ...]) -> list[Loop] | None:
    """Every element loop of a body made of scalar declarations, element loops and outer loops
    around such bodies (a channel loop accumulating into the output); None for any other shape
    (a store or an assignment outside an element loop)."""
    found: list[Loop] = []
    for stmt in body:
        if _is_element_loop(stmt):
            found.append(stmt)  # type: ignore[arg-type]
        elif isinstance(stmt, Loop):
            inner = _element_loops(stmt.body)
            if inner is None or not inner:
                return None
            found += inner
        elif not isinstance(stmt, Decl):
            return None
    return found


def _constant(e: object) -> int | None:
    """The value of an integer expression without variables (``min(224, 222)``), else None."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Binary) and e.op in ("min", "max", "add", "mul"):
        a, b = _constant(e.a), _constant(e.b)
        if a is None or b is None:
            return None
        return min(a, b) if e.op == "min" else max(a, b) if e.op == "max" else a + b if e.op == "add" else a * b
    return None


def _terms(e: object) -> list[object]:
    """The terms of an index expression, products by a constant distributed over sums
    (``(x * 16 + 1) * 4356`` -> ``x * 16 * 4356``, ``4356``), so constant offsets come apart."""
    if isinstance(e, Binary) and e.op == "add":
        return _terms(e.a) + _terms(e.b)
    if isinstance(e, Binary) and e.op == "mul" and isinstance(e.b, Const) and e.b.dtype == "i64":
        k = int(e.b.value)
        return [Const(int(t.value) * k, "i64") if isinstance(t, Const) else Binary("mul", t, e.b) for t in _terms(e.a)]  # type: ignore[arg-type]
    return [e]


def _offset(index: object, j: str) -> tuple[tuple[str, ...], int] | None:
    """``(base, c)`` when ``index`` is ``base + c + j`` with ``j`` in no other term."""
    terms = _terms(index)
    rest = [t for t in terms if t != Var(j)]
    if len(terms) - len(rest) != 1 or any(_mentions(t, j) for t in rest):
        return None
    const = sum(int(t.value) for t in rest if isinstance(t, Const))
    return tuple(sorted(repr(t) for t in rest if not isinstance(t, Const))), const


def _loads(node: object) -> list[Load]:
    if isinstance(node, Load):
        return [node, *_loads(node.index)]
    if isinstance(node, tuple):
        return [x for item in node for x in _loads(item)]
    if is_dataclass(node) and not isinstance(node, type):
        return [x for f in fields(node) for x in _loads(getattr(node, f.name))]
    return []


def _elements_independent(loops: list[Loop], span: int) -> bool:
    """Iterations of the element loops touch disjoint elements, so they can run as threads: each
    store writes ``base + c + j`` (one base per buffer, constant offsets ``span`` or more apart or
    equal), and every load of a written buffer reads an element its own iteration stores."""
    stores: dict[str, dict[tuple[str, ...], set[int]]] = {}
    for loop in loops:
        for st in loop.body:
            if isinstance(st, Store):
                off = _offset(st.index, loop.var)
                if off is None:
                    return False
                stores.setdefault(st.buffer.name, {}).setdefault(off[0], set()).add(off[1])
    for by_base in stores.values():
        if len(by_base) != 1:
            return False
        consts = sorted(next(iter(by_base.values())))
        if any(b - a < span for a, b in zip(consts, consts[1:], strict=False)):
            return False
    for loop in loops:
        for ld in _loads(loop.body):
            if ld.buffer.name in stores:
                off = _offset(ld.index, loop.var)
                if off is None or off[1] not in stores[ld.buffer.name].get(off[0], set()):
                    return False
    return True


def _splice(body: tuple[object, ...], j: Var) -> tuple[object, ...]:
    """The body with every element loop replaced by its statements at element ``j``."""
    out: list[object] = []
    for stmt in body:
        if _is_element_loop(stmt):
            assert isinstance(stmt, Loop)
            out += substitute(stmt.body, {stmt.var: j})  # type: ignore[arg-type]
        elif isinstance(stmt, Loop):
            out.append(replace(stmt, body=_splice(stmt.body, j)))
        else:
            out.append(stmt)
    return tuple(out)


def is_elementwise(kernel: Kernel) -> bool:
    """One loop over the last dimension whose body only stores (no locals, no inner loops)."""
    return len(kernel.body) == 1 and _is_element_loop(kernel.body[0]) and all(isinstance(s, Store) for s in kernel.body[0].body)  # type: ignore[union-attr]


def flatten_elementwise(kernel: Kernel, var: str = "q") -> Kernel | None:
    """The kernel with one parallel unit per element, or None when its loops have another shape.

    Two loop shapes come from ``lowering.loops.nest``: ``for j in [0, n)`` (parallel over rows) and
    the blocked ``for j in [(p % B) * blk, min((p % B) * blk + blk, n))`` (few rows, each row cut
    into B blocks). Both become ``q in [0, rows * n)`` with ``row = q // n`` and ``j = q % n``.
    Beyond one loop of stores (``is_elementwise``), a body of scalar declarations and element
    loops with the same bounds, also inside outer loops (a direct convolution: weights held as
    scalars, a channel loop accumulating into the output), flattens the same way when the element
    loops' iterations are independent (``_elements_independent``); each thread then runs the
    declarations and outer loops for its own element.
    """
    loops = _element_loops(kernel.body)
    if not loops or _mentions(kernel.body, var) or _mentions(kernel.body, "__row"):
        return None
    first = loops[0]
    if any((lp.start, lp.stop) != (first.start, first.stop) for lp in loops):
        return None
    p, q = kernel.parallel_var, Var(var)
    n_plain = _constant(first.stop)
    if isinstance(first.start, Const) and first.start.value == 0 and n_plain is not None:
        n = n_plain
        if not is_elementwise(kernel) and not _elements_independent(loops, n):
            return None
        rows = kernel.parallel_extent
        row, j = (i64(0), q) if rows == 1 else (floordiv(q, n), mod(q, n))
        body = substitute(_splice(kernel.body, Var("__j")), {p: row, "__j": j})
        return replace(kernel, parallel_var=var, parallel_extent=rows * n, body=body)  # type: ignore[arg-type]
    blocked = _blocked_shape(first, p)
    if blocked is None:
        return None
    blocks, blk, n = blocked
    if kernel.parallel_extent % blocks or (not is_elementwise(kernel) and not _elements_independent(loops, n)):
        return None
    rows = kernel.parallel_extent // blocks
    row, j = (i64(0), q) if rows == 1 else (floordiv(q, n), mod(q, n))
    # p only appears as p // B (the row) and p % B (the block, in the loop bounds we drop)
    body = replace_exprs(_splice(kernel.body, Var("__j")), {Binary("div", Var(p), i64(blocks)): Var("__row")})
    if _mentions(body, p):
        body = substitute(body, {p: add(mul(row, i64(blocks)), floordiv(Var("__j"), blk))})
    body = substitute(body, {"__row": row, "__j": j})
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


IDENTITY = {"add": 0.0, "max": float("-inf"), "min": float("inf")}
"""Initial values that a warp can give every lane before combining lane partial results."""


def warp_row_passes(kernel: Kernel, min_row: int = 64) -> dict[int, tuple[str, ...]] | None:
    """For a row kernel (softmax, LayerNorm: scalar declarations and passes ``for r in [0, n)``
    over one row), the accumulators each pass reduces (``{pass position: names}``), when one warp
    can run the row: lanes take ``r = lane, lane + 32, ...`` in every pass, so the lane that writes
    an element of a buffer the kernel writes is the only one that touches that element in any
    pass, and each accumulator is updated only as ``acc = op(acc, value)`` (op add/max/min, its
    declared start the identity) so the lanes' partial results combine by a shuffle all-reduce
    after the pass. None when the kernel has another shape or the rows are shorter than ``min_row``.
    """
    written = {s.buffer.name for s in _stores(kernel.body)}
    declared: dict[str, Decl] = {}
    passes: dict[int, tuple[str, ...]] = {}
    n: int | None = None
    touched: dict[str, tuple[tuple[str, ...], int]] = {}
    for pos, stmt in enumerate(kernel.body):
        if isinstance(stmt, Decl):
            if any(ld.buffer.name in written for ld in _loads(stmt.init)):
                return None
            declared[stmt.name] = stmt
            continue
        if not isinstance(stmt, Loop) or not (isinstance(stmt.start, Const) and stmt.start.value == 0):
            return None
        stop = _constant(stmt.stop)
        if stop is None or (n is not None and stop != n):
            return None
        n = stop
        accumulators = []
        for inner in stmt.body:
            if isinstance(inner, Assign):
                acc = declared.get(inner.name)
                value = inner.value
                if acc is None or not (isinstance(value, Binary) and value.op in IDENTITY and value.a == Local(acc.name, acc.dtype)):
                    return None
                if not (isinstance(acc.init, Const) and float(acc.init.value) == IDENTITY[value.op]) or _mentions(value.b, acc.name, Local):
                    return None
                accumulators.append(acc.name)
            elif not isinstance(inner, (Store, Decl)):
                return None
        others = [s for s in stmt.body if not isinstance(s, Assign)]
        if any(_mentions(others, a, Local) for a in accumulators) or len(set(accumulators)) != len(accumulators):
            return None
        for access in [*_stores(stmt.body), *_loads(stmt.body)]:
            if access.buffer.name in written:
                off = _offset(access.index, stmt.var)
                if off is None or touched.setdefault(access.buffer.name, off) != off:
                    return None
        passes[pos] = tuple(accumulators)
    if n is None or n < min_row:
        return None
    return passes


def _stores(body: object) -> list[Store]:
    if isinstance(body, Store):
        return [body]
    if isinstance(body, Loop):
        return _stores(body.body)
    if isinstance(body, tuple):
        return [s for item in body for s in _stores(item)]
    return []

