"""The kernel IR: a small loop-nest language that every lowering produces and every backend reads.

A ``Kernel`` works on flat, contiguous buffers. Its body runs once per value of the parallel
variable in ``[begin, end)`` (the runtime splits ``[0, parallel_extent)`` across threads), and is a
list of statements: loops, scalar locals (accumulators of reductions), and stores. Expressions
are typed scalar trees: constants, loop variables, loads at computed flat indices, arithmetic,
comparisons, selects and casts. Index arithmetic is ordinary ``i64`` expressions, so layout ops
(transpose, slice, concat, pad, gather) become index math inside the kernel that consumes them.

Nodes are frozen dataclasses: hashable, so backends can share common subexpressions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

DType = Literal["f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool"]

NUMPY_DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
}
FROM_NUMPY = {v: k for k, v in NUMPY_DTYPES.items()}


def is_float(dtype: str) -> bool:
    return dtype.startswith("f")


def is_signed(dtype: str) -> bool:
    return dtype.startswith("i")


def dtype_of_numpy(dtype: np.dtype) -> str | None:
    """The IR dtype of a numpy dtype (None when the IR has no such type, e.g. strings)."""
    return FROM_NUMPY.get(np.dtype(dtype))


# ---------------------------------------------------------------- buffers
@dataclass(frozen=True)
class Buffer:
    """A flat contiguous array that kernels read or write; ``shape`` is for sizing and humans."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * NUMPY_DTYPES[self.dtype].itemsize


# ---------------------------------------------------------------- expressions
UNARY_OPS = frozenset(
    {"neg", "abs", "exp", "log", "sqrt", "recip", "erf", "tanh", "sigmoid", "floor", "ceil", "not", "round"}
)
BINARY_OPS = frozenset({"add", "sub", "mul", "div", "mod", "max", "min", "maxsel", "pow", "and", "or"})
"""``max``/``min`` propagate NaN (numpy's maximum/minimum); ``maxsel`` is ``a if a > b else b``, one
vector max instruction, for windows where speed matters more than which NaN wins (pools)."""
COMPARE_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: str = "f32"


@dataclass(frozen=True)
class Var:
    """A loop variable (or the parallel variable); always ``i64``."""

    name: str


@dataclass(frozen=True)
class Load:
    buffer: Buffer
    index: Expr


@dataclass(frozen=True)
class Unary:
    op: str
    a: Expr


@dataclass(frozen=True)
class Binary:
    """Arithmetic on equal dtypes; ``div``/``mod`` on integers round toward -inf (Python semantics)
    only where both operands are non-negative in practice: index math uses non-negative values."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Compare:
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Cast:
    a: Expr
    dtype: str


@dataclass(frozen=True)
class Local:
    """Reads a scalar local declared by ``Decl``."""

    name: str
    dtype: str


Expr = Const | Var | Load | Unary | Binary | Compare | Select | Cast | Local


# ---------------------------------------------------------------- statements
@dataclass(frozen=True)
class Loop:
    var: str
    stop: Expr
    body: tuple[Stmt, ...]
    start: Expr = field(default_factory=lambda: Const(0, "i64"))


@dataclass(frozen=True)
class Store:
    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Decl:
    """Declares a scalar local (an accumulator) with an initial value."""

    name: str
    dtype: str
    init: Expr


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr


Stmt = Loop | Store | Decl | Assign


@dataclass(frozen=True)
class Kernel:
    """One compiled function: ``body`` runs for each ``parallel_var`` in ``[begin, end)``.

    ``params`` are the buffers the kernel touches, in call order: inputs first, then outputs.
    ``cost`` is a rough count of scalar operations, used to decide whether threading pays.
    """

    name: str
    params: tuple[Buffer, ...]
    outputs: tuple[str, ...]
    parallel_var: str
    parallel_extent: int
    body: tuple[Stmt, ...]
    cost: float = 0.0


# ---------------------------------------------------------------- helpers
def dtype_of(e: Expr) -> str:
    """The scalar type of an expression."""
    if isinstance(e, Const):
        return e.dtype
    if isinstance(e, Var):
        return "i64"
    if isinstance(e, Load):
        return e.buffer.dtype
    if isinstance(e, (Unary, Binary)):
        return dtype_of(e.a)
    if isinstance(e, Compare):
        return "bool"
    if isinstance(e, Select):
        return dtype_of(e.a)
    if isinstance(e, Cast):
        return e.dtype
    if isinstance(e, Local):
        return e.dtype
    raise TypeError(f"not an expression: {e!r}")


def compute_dtype(dtype: str) -> str:
    """The type arithmetic on ``dtype`` values runs in: float16 in float32, rounded once when stored
    (as onnxruntime computes it and as the norms' ``stash_type`` asks; float16 sums lose digits
    at every step and its exp overflows above 11)."""
    return "f32" if dtype == "f16" else dtype


def as_dtype(e: Expr, dtype: str) -> Expr:
    """``e`` converted to ``dtype`` (itself when it already has it)."""
    return e if dtype_of(e) == dtype else Cast(e, dtype)


def i64(value: int) -> Const:
    return Const(int(value), "i64")


def add(a: Expr, b: Expr) -> Expr:
    """``a + b`` with constant folding (index math stays small)."""
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, a.dtype)  # type: ignore[operator]
    return Binary("add", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    """``a * b`` with constant folding."""
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, a.dtype)  # type: ignore[operator]
    if isinstance(b, Const) and dtype_of(a) == "i64":
        if b.value == 0:
            return i64(0)
        if b.value == 1:
            return a
    if isinstance(a, Const) and dtype_of(b) == "i64":
        return mul(b, a)
    return Binary("mul", a, b)


def floordiv(a: Expr, n: int) -> Expr:
    if n == 1:
        return a
    if isinstance(a, Const):
        return i64(int(a.value) // n)
    return Binary("div", a, i64(n))


def mod(a: Expr, n: int) -> Expr:
    if n == 1:
        return i64(0)
    if isinstance(a, Const):
        return i64(int(a.value) % n)
    return Binary("mod", a, i64(n))


def clamp_index(a: Expr, hi: int) -> Expr:
    """``min(max(a, 0), hi - 1)``: keeps a load in bounds on branches a select discards."""
    if isinstance(a, Const):
        return i64(min(max(int(a.value), 0), max(hi - 1, 0)))
    return Binary("min", Binary("max", a, i64(0)), i64(max(hi - 1, 0)))


def flat_index(idx: list[Expr], shape: tuple[int, ...]) -> Expr:
    """Row-major flat index of a multi-index into a contiguous array of ``shape``."""
    out: Expr = i64(0)
    stride = 1
    for i, d in zip(reversed(idx), reversed(shape), strict=True):
        out = add(out, mul(i, i64(stride)))
        stride *= d
    return out


def unflatten(flat: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """The multi-index of a row-major flat index (div/mod; only used outside inner loops)."""
    idx: list[Expr] = []
    rest = 1
    for d in shape:
        rest *= d
    for d in shape:
        rest //= d
        idx.append(mod(floordiv(flat, rest), d) if d != 1 else i64(0))
    return idx


def walk_exprs(stmts: tuple[Stmt, ...]) -> Iterator[Expr]:
    """Every expression root in a statement list (loop bounds, store indices and values...)."""
    for s in stmts:
        if isinstance(s, Loop):
            yield s.start
            yield s.stop
            yield from walk_exprs(s.body)
        elif isinstance(s, Store):
            yield s.index
            yield s.value
        elif isinstance(s, Decl):
            yield s.init
        elif isinstance(s, Assign):
            yield s.value


def loads_in(e: Expr) -> Iterator[Load]:
    return (x for x in subexpressions(e) if isinstance(x, Load))


def subexpressions(e: Expr) -> Iterator[Expr]:
    """``e`` and every expression under it (load indices included)."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, Load):
            stack.append(x.index)
        elif isinstance(x, (Unary, Cast)):
            stack.append(x.a)
        elif isinstance(x, (Binary, Compare)):
            stack.extend((x.a, x.b))
        elif isinstance(x, Select):
            stack.extend((x.cond, x.a, x.b))


def render(kernel: Kernel) -> str:
    """A readable text form of a kernel (for ``--dump-dir`` and debugging)."""
    lines = [f"kernel {kernel.name}({', '.join(f'{b.name}:{b.dtype}{list(b.shape)}' for b in kernel.params)})"]
    lines.append(f"  parallel {kernel.parallel_var} in [0, {kernel.parallel_extent})")

    def expr(e: Expr) -> str:
        if isinstance(e, Const):
            return repr(e.value)
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Local):
            return e.name
        if isinstance(e, Load):
            return f"{e.buffer.name}[{expr(e.index)}]"
        if isinstance(e, Unary):
            return f"{e.op}({expr(e.a)})"
        if isinstance(e, (Binary, Compare)):
            return f"{e.op}({expr(e.a)}, {expr(e.b)})"
        if isinstance(e, Select):
            return f"select({expr(e.cond)}, {expr(e.a)}, {expr(e.b)})"
        if isinstance(e, Cast):
            return f"{e.dtype}({expr(e.a)})"
        return "?"

    def stmts(body: tuple[Stmt, ...], indent: int) -> None:
        pad = "  " * indent
        for s in body:
            if isinstance(s, Loop):
                lines.append(f"{pad}for {s.var} in [{expr(s.start)}, {expr(s.stop)}):")
                stmts(s.body, indent + 1)
            elif isinstance(s, Store):
                lines.append(f"{pad}{s.buffer.name}[{expr(s.index)}] = {expr(s.value)}")
            elif isinstance(s, Decl):
                lines.append(f"{pad}{s.dtype} {s.name} = {expr(s.init)}")
            elif isinstance(s, Assign):
                lines.append(f"{pad}{s.name} = {expr(s.value)}")

    stmts(kernel.body, 2)
    return "\n".join(lines)


def _rename(node: object, mapping: dict[str, Buffer]) -> object:
    """A copy of an IR node with buffers replaced by ``mapping`` (by name)."""
    from dataclasses import fields, is_dataclass, replace

    if isinstance(node, Buffer):
        return mapping.get(node.name, node)
    if isinstance(node, tuple):
        return tuple(_rename(x, mapping) for x in node)
    if is_dataclass(node) and not isinstance(node, type):
        changes = {f.name: _rename(getattr(node, f.name), mapping) for f in fields(node)}
        return replace(node, **changes)  # type: ignore[type-var]
    return node


def canonical(kernel: Kernel) -> Kernel:
    """The kernel with its name and buffer names replaced by positional ones: two kernels that do
    the same work on different buffers have equal canonical forms (compiled once)."""
    mapping = {b.name: Buffer(f"a{i}", b.dtype, b.shape) for i, b in enumerate(kernel.params)}
    body = _rename(kernel.body, mapping)
    params = tuple(mapping[b.name] for b in kernel.params)
    outputs = tuple(mapping[n].name for n in kernel.outputs)
    return Kernel("k", params, outputs, kernel.parallel_var, kernel.parallel_extent, body, kernel.cost)  # type: ignore[arg-type]
