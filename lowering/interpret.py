"""A numpy interpreter of the kernel IR: the executable meaning of a kernel, used by tests.

It runs a kernel scalar by scalar with numpy scalar types (so float32 arithmetic rounds like the
compiled code), which is slow: meant for small shapes only. The LLVM backend must agree with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .kernel_ir import (
    NUMPY_DTYPES,
    Assign,
    Binary,
    Cast,
    Compare,
    Const,
    Decl,
    Expr,
    Kernel,
    Load,
    Local,
    Loop,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    dtype_of,
    is_float,
)


def _erf(x: Any) -> Any:
    return type(x)(math.erf(float(x)))


Fn = Callable[[], Any]
"""A compiled expression: evaluates it in the interpreter's current environment."""

_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": lambda a: -a,
    "abs": abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "recip": lambda a: type(a)(1) / a,
    "erf": _erf,
    "tanh": np.tanh,
    "sigmoid": lambda a: type(a)(1) / (type(a)(1) + np.exp(-a)),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "not": lambda a: not a,
}


def _int_div(scalar: Any) -> Callable[[Any, Any], Any]:
    return lambda a, b: scalar(int(a) // int(b) if (int(a) >= 0) == (int(b) > 0) else -(-int(a) // int(b)))


def _unknown(dtype: str) -> Callable[[Any], Any]:
    def fail(value: Any) -> Any:
        raise KeyError(dtype)

    return fail


def _binary_fn(op: str, dtype: str) -> Callable[[Any, Any], Any] | None:
    """The scalar function of ``op`` on operands of ``dtype`` (None for an unknown op)."""
    floating = is_float(dtype)
    scalar: Any = NUMPY_DTYPES[dtype].type if dtype in NUMPY_DTYPES else _unknown(dtype)
    if op == "add":
        return lambda a, b: a + b
    if op == "sub":
        return lambda a, b: a - b
    if op == "mul":
        return lambda a, b: a * b
    if op == "div":
        return (lambda a, b: a / b) if floating else _int_div(scalar)
    if op == "mod":
        return (lambda a, b: scalar(math.fmod(a, b))) if floating else (lambda a, b: scalar(math.fmod(int(a), int(b))))
    if op == "max":
        return lambda a, b: a if (a >= b or a != a) else b
    if op == "min":
        return lambda a, b: a if (a <= b or a != a) else b
    if op == "maxsel":
        return lambda a, b: a if a > b else b
    if op == "pow":
        return np.power if floating else (lambda a, b: scalar(int(a) ** int(b)))
    if op == "and":
        return lambda a, b: a and b
    if op == "or":
        return lambda a, b: a or b
    return None


_COMPARE = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _raises(exc: Exception) -> Fn:
    """An expression that fails when evaluated (as the tree walk did), not when compiled."""

    def fail() -> Any:
        raise exc

    return fail


class _Interp:
    """Compiles a kernel's body once into Python closures (the dispatch on node types, dtypes and
    ops done once, not per scalar: ~4x faster than walking the tree), then runs it."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.env: dict[str, Any] = {}
        self._flats: dict[str, Callable[[], np.ndarray]] = {}

    def flat(self, name: str) -> Callable[[], np.ndarray]:
        """The buffer as a flat view (one for the run; a non-contiguous array is reshaped per access)."""
        if name not in self._flats:
            array = self.arrays[name]
            flat = array.reshape(-1)
            self._flats[name] = (lambda: flat) if np.shares_memory(flat, array) else (lambda: array.reshape(-1))
        return self._flats[name]

    def expr(self, e: Expr) -> Fn:  # noqa: C901, PLR0911
        env = self.env
        if isinstance(e, Const):
            value = NUMPY_DTYPES[e.dtype].type(e.value)
            return lambda: value
        if isinstance(e, Var | Local):
            name = e.name
            return lambda: env[name]
        if isinstance(e, Load):
            return self._load(e)
        if isinstance(e, Unary):
            unary, a = _UNARY.get(e.op), self.expr(e.a)
            if unary is None:
                return _raises(ValueError(f"unknown unary op {e.op}"))
            return lambda: unary(a())
        if isinstance(e, Binary):
            try:
                fn = _binary_fn(e.op, dtype_of(e.a))
            except TypeError as exc:
                return _raises(exc)
            if fn is None:
                return _raises(ValueError(f"unknown binary op {e.op}"))
            a, b = self.expr(e.a), self.expr(e.b)
            return lambda: fn(a(), b())
        if isinstance(e, Compare):
            compare, a, b = _COMPARE[e.op], self.expr(e.a), self.expr(e.b)
            return lambda: np.bool_(compare(a(), b()))
        if isinstance(e, Select):
            cond, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
            return lambda: a() if cond() else b()
        if isinstance(e, Cast):
            a, dtype = self.expr(e.a), NUMPY_DTYPES[e.dtype]
            return lambda: np.array(a()).astype(dtype)[()]
        return _raises(TypeError(f"not an expression: {e!r}"))

    def _load(self, e: Load) -> Fn:
        index, flat, name = self.expr(e.index), self.flat(e.buffer.name), e.buffer.name

        def load() -> Any:
            i, values = int(index()), flat()
            if not 0 <= i < values.size:
                raise IndexError(f"load {name}[{i}] out of bounds ({values.size})")
            return values[i]

        return load

    def body(self, body: tuple[Stmt, ...]) -> Callable[[], None]:
        steps = [step for s in body if (step := self.stmt(s)) is not None]

        def run() -> None:
            for step in steps:
                step()

        return run

    def stmt(self, s: Stmt) -> Callable[[], None] | None:
        env = self.env
        if isinstance(s, Loop):
            start, stop, var, inner = self.expr(s.start), self.expr(s.stop), s.var, self.body(s.body)

            def loop() -> None:
                for i in range(int(start()), int(stop())):
                    env[var] = np.int64(i)
                    inner()

            return loop
        if isinstance(s, Store):
            index, value, flat, name = self.expr(s.index), self.expr(s.value), self.flat(s.buffer.name), s.buffer.name

            def store() -> None:
                i, values = int(index()), flat()
                if not 0 <= i < values.size:
                    raise IndexError(f"store {name}[{i}] out of bounds ({values.size})")
                values[i] = value()

            return store
        if isinstance(s, Decl | Assign):
            target, value = s.name, self.expr(s.init if isinstance(s, Decl) else s.value)

            def assign() -> None:
                env[target] = value()

            return assign
        return None


def interpret(kernel: Kernel, arrays: dict[str, np.ndarray], begin: int = 0, end: int | None = None) -> None:
    """Run ``kernel`` on ``arrays`` (buffer name -> contiguous array; outputs are written in place).
    Floating-point errors are ignored (inf and NaN propagate, as in the compiled code)."""
    interp = _Interp(arrays)
    run = interp.body(kernel.body)
    stop = kernel.parallel_extent if end is None else end
    with np.errstate(all="ignore"):
        for p in range(begin, stop):
            interp.env[kernel.parallel_var] = np.int64(p)
            run()
