"""A numpy interpreter of the kernel IR: the executable meaning of a kernel, used by tests.

It runs a kernel scalar by scalar with numpy scalar types (so float32 arithmetic rounds like the
compiled code), which is slow: meant for small shapes only. The LLVM backend must agree with it.
"""

from __future__ import annotations

import math
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


def _unary(op: str, a: Any) -> Any:
    t = type(a)
    with np.errstate(all="ignore"):
        if op == "neg":
            return -a
        if op == "abs":
            return abs(a)
        if op == "exp":
            return np.exp(a)
        if op == "log":
            return np.log(a)
        if op == "sqrt":
            return np.sqrt(a)
        if op == "recip":
            return t(1) / a
        if op == "erf":
            return _erf(a)
        if op == "tanh":
            return np.tanh(a)
        if op == "sigmoid":
            return t(1) / (t(1) + np.exp(-a))
        if op == "floor":
            return np.floor(a)
        if op == "ceil":
            return np.ceil(a)
        if op == "round":
            return np.round(a)
        if op == "not":
            return not a
    raise ValueError(f"unknown unary op {op}")


def _binary(op: str, a: Any, b: Any, dtype: str) -> Any:
    with np.errstate(all="ignore"):
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "div":
            if is_float(dtype):
                return a / b
            return NUMPY_DTYPES[dtype].type(int(a) // int(b) if (int(a) >= 0) == (int(b) > 0) else -(-int(a) // int(b)))
        if op == "mod":
            return NUMPY_DTYPES[dtype].type(math.fmod(int(a), int(b)) if not is_float(dtype) else math.fmod(a, b))
        if op == "max":
            return a if (a >= b or a != a) else b
        if op == "min":
            return a if (a <= b or a != a) else b
        if op == "maxsel":
            return a if a > b else b
        if op == "pow":
            return np.power(a, b) if is_float(dtype) else NUMPY_DTYPES[dtype].type(int(a) ** int(b))
        if op == "and":
            return a and b
        if op == "or":
            return a or b
    raise ValueError(f"unknown binary op {op}")


_COMPARE = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


class _Interp:
    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.env: dict[str, Any] = {}

    def expr(self, e: Expr) -> Any:
        if isinstance(e, Const):
            return NUMPY_DTYPES[e.dtype].type(e.value)
        if isinstance(e, Var):
            return self.env[e.name]
        if isinstance(e, Local):
            return self.env[e.name]
        if isinstance(e, Load):
            index = int(self.expr(e.index))
            flat = self.arrays[e.buffer.name].reshape(-1)
            if not 0 <= index < flat.size:
                raise IndexError(f"load {e.buffer.name}[{index}] out of bounds ({flat.size})")
            return flat[index]
        if isinstance(e, Unary):
            return _unary(e.op, self.expr(e.a))
        if isinstance(e, Binary):
            return _binary(e.op, self.expr(e.a), self.expr(e.b), dtype_of(e.a))
        if isinstance(e, Compare):
            return np.bool_(_COMPARE[e.op](self.expr(e.a), self.expr(e.b)))
        if isinstance(e, Select):
            return self.expr(e.a) if self.expr(e.cond) else self.expr(e.b)
        if isinstance(e, Cast):
            value = self.expr(e.a)
            with np.errstate(all="ignore"):
                return np.array(value).astype(NUMPY_DTYPES[e.dtype])[()]
        raise TypeError(f"not an expression: {e!r}")

    def run(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            if isinstance(s, Loop):
                start, stop = int(self.expr(s.start)), int(self.expr(s.stop))
                for i in range(start, stop):
                    self.env[s.var] = np.int64(i)
                    self.run(s.body)
            elif isinstance(s, Store):
                index = int(self.expr(s.index))
                flat = self.arrays[s.buffer.name].reshape(-1)
                if not 0 <= index < flat.size:
                    raise IndexError(f"store {s.buffer.name}[{index}] out of bounds ({flat.size})")
                flat[index] = self.expr(s.value)
            elif isinstance(s, (Decl, Assign)):
                value = self.expr(s.init if isinstance(s, Decl) else s.value)
                self.env[s.name] = value


def interpret(kernel: Kernel, arrays: dict[str, np.ndarray], begin: int = 0, end: int | None = None) -> None:
    """Run ``kernel`` on ``arrays`` (buffer name -> contiguous array; outputs are written in place)."""
    interp = _Interp(arrays)
    stop = kernel.parallel_extent if end is None else end
    for p in range(begin, stop):
        interp.env[kernel.parallel_var] = np.int64(p)
        interp.run(kernel.body)
