"""Which innermost loops get explicit vector code with non-temporal (streaming) stores.

A large elementwise output (beyond what the caches keep) written with ordinary stores costs a
read of every line before it is written (write-allocate): one input and one output move three
lines for every two the program asks for. A non-temporal store (``vmovntps``) writes the line
without reading it, but LLVM's loop vectorizer keeps a ``!nontemporal`` store scalar unless the
scalar store itself is vector-aligned, which an element store never is. So codegen emits the
vector loop itself for the loops chosen here: a scalar head up to a 64-byte boundary of the
output, an aligned vector main part with streaming stores, and a scalar tail.

Chosen: a loop whose body is one float32 store at ``index = var + invariant`` of an output of at
least ``STREAM_MIN_BYTES``, whose value reads float32 buffers only at ``var + invariant`` (a
vector load) or at indices free of ``var`` (a broadcast), never a buffer the kernel writes, and
uses only operations that work lane by lane without a library call.
"""

from __future__ import annotations

from onnxsat.lowering.kernel_ir import (
    Binary,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Loop,
    Select,
    Store,
    Unary,
    Var,
)

LANES = 16
"""Floats per vector: one 64-byte cache line (one AVX-512 register; two AVX2 registers)."""
STREAM_MIN_BYTES = 8 << 20
"""Outputs from this size on are streamed. Smaller ones may still be in cache when the next kernel
reads them, and an ordinary store wins there (measured in benchmarks/results/kernels.md)."""
MIN_STREAM_ELEMENTS = 4 * LANES
"""A loop shorter than this at run time stays scalar (the head and tail would be most of it)."""

_VECTOR_UNARY = frozenset({"neg", "abs", "exp", "sigmoid", "erf", "tanh", "recip", "sqrt", "floor", "ceil", "round"})
_VECTOR_BINARY = frozenset({"add", "sub", "mul", "div", "max", "min", "maxsel"})


def stride_of(e: Expr, var: str) -> int | None:
    """The coefficient of ``var`` in the integer expression ``e`` when ``e`` is affine in it
    (0 when ``var`` does not occur), else None."""
    if isinstance(e, Var):
        return 1 if e.name == var else 0
    if isinstance(e, Const):
        return 0
    if not mentions(e, var):
        return 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = stride_of(e.a, var), stride_of(e.b, var)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, Binary) and e.op == "mul":
        a, b = stride_of(e.a, var), stride_of(e.b, var)
        if a == 0 and isinstance(e.a, Const) and b is not None:
            return int(e.a.value) * b
        if b == 0 and isinstance(e.b, Const) and a is not None:
            return int(e.b.value) * a
    return None


def mentions(e: Expr, var: str) -> bool:
    """Whether the loop variable ``var`` occurs anywhere in ``e``."""
    if isinstance(e, Var):
        return e.name == var
    if isinstance(e, Load):
        return mentions(e.index, var)
    if isinstance(e, (Unary, Cast)):
        return mentions(e.a, var)
    if isinstance(e, (Binary, Compare)):
        return mentions(e.a, var) or mentions(e.b, var)
    if isinstance(e, Select):
        return mentions(e.cond, var) or mentions(e.a, var) or mentions(e.b, var)
    return False


def _lane_wise(e: Expr, var: str, written: frozenset[str]) -> bool:
    """Whether ``e`` can be evaluated on LANES consecutive values of ``var`` at once."""
    if isinstance(e, Const):
        return e.dtype == "f32"
    if isinstance(e, Load):
        return e.buffer.dtype == "f32" and e.buffer.name not in written and stride_of(e.index, var) in (0, 1)
    if isinstance(e, Unary):
        return e.op in _VECTOR_UNARY and _lane_wise(e.a, var, written)
    if isinstance(e, Binary):
        return e.op in _VECTOR_BINARY and _lane_wise(e.a, var, written) and _lane_wise(e.b, var, written)
    if isinstance(e, Compare):
        return _lane_wise(e.a, var, written) and _lane_wise(e.b, var, written)
    if isinstance(e, Select):
        return isinstance(e.cond, Compare) and all(_lane_wise(x, var, written) for x in (e.cond, e.a, e.b))
    return False  # Var, Local, Cast: not lane-wise float32 values


def streamed_store(loop: Loop, written: frozenset[str]) -> Store | None:
    """The store of ``loop`` when the loop is to be emitted as a streaming vector loop, else None."""
    if len(loop.body) != 1 or not isinstance(loop.body[0], Store):
        return None
    store = loop.body[0]
    if store.buffer.dtype != "f32" or store.buffer.nbytes < STREAM_MIN_BYTES:
        return None
    if stride_of(store.index, loop.var) != 1:
        return None
    return store if _lane_wise(store.value, loop.var, written) else None

