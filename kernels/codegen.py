"""Kernel IR -> LLVM IR, built with ``llvmlite.ir.IRBuilder`` (never from strings).

Every kernel becomes ``void name(i8** args, i64 begin, i64 end)``: ``args`` holds the buffer
pointers in ``Kernel.params`` order; the body runs for the parallel variable in ``[begin, end)``.
Loop variables and scalar locals are stack slots that ``mem2reg`` promotes, so O3 sees plain
SSA loops it can vectorize. Float adds/multiplies carry ``reassoc contract`` so reductions vectorize.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from onnxsat.lowering.kernel_ir import (
    Assign,
    Binary,
    Buffer,
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
    is_signed,
)

from . import mathlib

I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
LL_TYPES: dict[str, ir.Type] = {
    "f16": ir.HalfType(),
    "f32": ir.FloatType(),
    "f64": ir.DoubleType(),
    "i8": I8,
    "i16": ir.IntType(16),
    "i32": ir.IntType(32),
    "i64": I64,
    "u8": I8,
    "u16": ir.IntType(16),
    "u32": ir.IntType(32),
    "u64": I64,
    "bool": I1,
}
FAST = ("reassoc", "contract")
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_BITS = {"i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64, "bool": 1}
_FBITS = {"f16": 16, "f32": 32, "f64": 64}


def storage_type(dtype: str) -> ir.Type:
    """How a dtype is stored in memory (bool as a byte)."""
    return I8 if dtype == "bool" else LL_TYPES[dtype]


class _FunctionBuilder:
    def __init__(self, module: ir.Module, kernel: Kernel):
        self.module = module
        self.kernel = kernel
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64])
        self.fn = ir.Function(module, fnty, name=kernel.name)
        self.fn.args[0].name, self.fn.args[1].name, self.fn.args[2].name = "args", "begin", "end"
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.slots: dict[str, ir.Value] = {}
        self.ptrs: dict[str, ir.Value] = {}
        self.scopes: list[dict[Expr, ir.Value]] = [{}]
        self.written = set(kernel.outputs)

    # ------------------------------------------------------------ helpers
    def intrinsic(self, name: str, ty: ir.Type, nargs: int = 1) -> ir.Function:
        suffix = {"float": "f32", "double": "f64", "half": "f16"}[str(ty)]
        full = f"llvm.{name}.{suffix}"
        existing = self.module.globals.get(full)
        if existing is not None:
            return existing
        return ir.Function(self.module, ir.FunctionType(ty, [ty] * nargs), name=full)

    def slot(self, name: str, ty: ir.Type) -> ir.Value:
        if name not in self.slots:
            with self.b.goto_block(self.entry):
                self.b.position_at_start(self.entry)
                self.slots[name] = self.b.alloca(ty, name=name)
        return self.slots[name]

    def pointer(self, buf: Buffer) -> ir.Value:
        return self.ptrs[buf.name]

    # ------------------------------------------------------------ expressions
    def expr(self, e: Expr) -> ir.Value:
        cacheable = self._cacheable(e)
        if cacheable:
            for scope in reversed(self.scopes):
                if e in scope:
                    return scope[e]
        value = self._expr(e)
        if cacheable:
            self.scopes[-1][e] = value
        return value

    def _cacheable(self, e: Expr) -> bool:
        if isinstance(e, (Local, Const)):
            return False
        if isinstance(e, Load):
            return e.buffer.name not in self.written and self._cacheable_sub(e.index)
        return self._cacheable_sub(e)

    def _cacheable_sub(self, e: Expr) -> bool:
        if isinstance(e, Local):
            return False
        if isinstance(e, Load):
            return e.buffer.name not in self.written and self._cacheable_sub(e.index)
        if isinstance(e, (Unary, Cast)):
            return self._cacheable_sub(e.a)
        if isinstance(e, (Binary, Compare)):
            return self._cacheable_sub(e.a) and self._cacheable_sub(e.b)
        if isinstance(e, Select):
            return self._cacheable_sub(e.cond) and self._cacheable_sub(e.a) and self._cacheable_sub(e.b)
        return True

    def _expr(self, e: Expr) -> ir.Value:
        b = self.b
        if isinstance(e, Const):
            ty = LL_TYPES[e.dtype]
            if e.dtype == "bool":
                return ir.Constant(I1, int(bool(e.value)))
            if is_float(e.dtype):
                return ir.Constant(ty, float(e.value))
            value = int(e.value)
            bits = _BITS[e.dtype]
            return ir.Constant(ty, value & ((1 << bits) - 1) if value < 0 else value)
        if isinstance(e, Var):
            return b.load(self.slots[e.name], typ=I64)
        if isinstance(e, Local):
            return b.load(self.slots[e.name], typ=LL_TYPES[e.dtype])
        if isinstance(e, Load):
            st = storage_type(e.buffer.dtype)
            ptr = b.gep(self.pointer(e.buffer), [self.expr(e.index)], inbounds=True, source_etype=st)
            value = b.load(ptr, typ=st)
            return b.icmp_unsigned("!=", value, ir.Constant(I8, 0)) if e.buffer.dtype == "bool" else value
        if isinstance(e, Unary):
            return self._unary(e.op, self.expr(e.a), dtype_of(e.a))
        if isinstance(e, Binary):
            return self._binary(e.op, self.expr(e.a), self.expr(e.b), dtype_of(e.a))
        if isinstance(e, Compare):
            a, c = self.expr(e.a), self.expr(e.b)
            dt = dtype_of(e.a)
            if is_float(dt):
                if e.op == "ne":
                    return b.fcmp_unordered("!=", a, c)
                return b.fcmp_ordered(_FCMP[e.op], a, c)
            if is_signed(dt):
                return b.icmp_signed(_FCMP[e.op], a, c)
            return b.icmp_unsigned(_FCMP[e.op], a, c)
        if isinstance(e, Select):
            return b.select(self.expr(e.cond), self.expr(e.a), self.expr(e.b))
        if isinstance(e, Cast):
            return self._cast(self.expr(e.a), dtype_of(e.a), e.dtype)
        raise TypeError(f"not an expression: {e!r}")

    def _unary(self, op: str, a: ir.Value, dt: str) -> ir.Value:
        b = self.b
        if is_float(dt):
            ty = LL_TYPES[dt]
            if op == "neg":
                return b.fneg(a)
            if op == "recip":
                return b.fdiv(ir.Constant(ty, 1.0), a)
            if op == "exp" and dt == "f32":
                return mathlib.exp_f32(b, a)
            if op == "sigmoid" and dt == "f32":
                return mathlib.sigmoid_f32(b, a)
            if op == "erf" and dt == "f32":
                return mathlib.erf_f32(b, a)
            if op == "erf":
                return self._cast(mathlib.erf_f32(b, self._cast(a, dt, "f32")), "f32", dt)
            if op == "tanh" and dt == "f32":
                return mathlib.tanh_f32(b, a)
            if op == "sigmoid":
                e = self._unary("exp", b.fneg(a), dt)
                return b.fdiv(ir.Constant(ty, 1.0), b.fadd(ir.Constant(ty, 1.0), e))
            if op == "tanh":
                e = self._unary("exp", b.fmul(a, ir.Constant(ty, -2.0)), dt)
                one = ir.Constant(ty, 1.0)
                return b.fdiv(b.fsub(one, e), b.fadd(one, e))
            name = {"exp": "exp", "log": "log", "sqrt": "sqrt", "abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "roundeven"}[op]
            return b.call(self.intrinsic(name, ty), [a])
        if op == "neg":
            return b.neg(a)
        if op == "abs":
            return b.select(b.icmp_signed("<", a, ir.Constant(a.type, 0)), b.neg(a), a) if is_signed(dt) else a
        if op == "not":
            return b.not_(a)
        raise NotImplementedError(f"{op} on {dt}")

    def _binary(self, op: str, a: ir.Value, c: ir.Value, dt: str) -> ir.Value:
        b = self.b
        if is_float(dt):
            if op == "add":
                return b.fadd(a, c, flags=FAST)
            if op == "sub":
                return b.fsub(a, c, flags=FAST)
            if op == "mul":
                return b.fmul(a, c, flags=FAST)
            if op == "div":
                return b.fdiv(a, c)
            if op in ("max", "min"):
                # NaN-propagating (numpy's maximum/minimum), and a form the loop vectorizer
                # turns into vector reductions (a select on fcmp stays scalar without nnan)
                return b.call(self.intrinsic("maximum" if op == "max" else "minimum", LL_TYPES[dt], 2), [a, c])
            if op == "maxsel":
                return b.select(b.fcmp_ordered(">", a, c), a, c)
            if op == "pow":
                return b.call(self.intrinsic("pow", LL_TYPES[dt], 2), [a, c])
            if op == "mod":
                return b.frem(a, c)
            raise NotImplementedError(f"{op} on {dt}")
        signed = is_signed(dt)
        if op == "add":
            return b.add(a, c)
        if op == "sub":
            return b.sub(a, c)
        if op == "mul":
            return b.mul(a, c)
        if op == "div":
            return b.sdiv(a, c) if signed else b.udiv(a, c)
        if op == "mod":
            return b.srem(a, c) if signed else b.urem(a, c)
        if op in ("max", "min", "maxsel"):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", a, c), a, c)
        if op == "and":
            return b.and_(a, c)
        if op == "or":
            return b.or_(a, c)
        raise NotImplementedError(f"{op} on {dt}")

    def _cast(self, a: ir.Value, src: str, dst: str) -> ir.Value:
        b = self.b
        if src == dst:
            return a
        ty = LL_TYPES[dst]
        if dst == "bool":
            return b.fcmp_unordered("!=", a, ir.Constant(a.type, 0.0)) if is_float(src) else b.icmp_unsigned("!=", a, ir.Constant(a.type, 0))
        if is_float(src) and is_float(dst):
            return b.fpext(a, ty) if _FBITS[dst] > _FBITS[src] else b.fptrunc(a, ty)
        if is_float(src):
            return b.fptosi(a, ty) if is_signed(dst) else b.fptoui(a, ty)
        if is_float(dst):
            return b.sitofp(a, ty) if is_signed(src) else b.uitofp(a, ty)
        sb, db = _BITS[src], _BITS[dst]
        if db < sb:
            return b.trunc(a, ty)
        if db == sb:
            return a
        return b.sext(a, ty) if is_signed(src) else b.zext(a, ty)

    # ------------------------------------------------------------ statements
    def stmts(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            if isinstance(s, Loop):
                self.loop(s)
            elif isinstance(s, Store):
                st = storage_type(s.buffer.dtype)
                value = self.expr(s.value)
                if s.buffer.dtype == "bool":
                    value = self.b.zext(value, I8)
                ptr = self.b.gep(self.pointer(s.buffer), [self.expr(s.index)], inbounds=True, source_etype=st)
                self.b.store(value, ptr)
            elif isinstance(s, Decl):
                value = self.expr(s.init)
                self.b.store(value, self.slot(s.name, LL_TYPES[s.dtype]))
            elif isinstance(s, Assign):
                value = self.expr(s.value)
                self.b.store(value, self.slots[s.name])

    def loop(self, s: Loop) -> None:
        b = self.b
        var = self.slot(s.var, I64)
        start, stop = self.expr(s.start), self.expr(s.stop)
        b.store(start, var)
        header = self.fn.append_basic_block(f"{s.var}.header")
        body = self.fn.append_basic_block(f"{s.var}.body")
        exit_ = self.fn.append_basic_block(f"{s.var}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.load(var, typ=I64)
        b.cbranch(b.icmp_signed("<", i, stop), body, exit_)
        b.position_at_end(body)
        self.scopes.append({})
        self.stmts(s.body)
        self.scopes.pop()
        b.store(b.add(b.load(var, typ=I64), ir.Constant(I64, 1), flags=["nsw"]), var)
        b.branch(header)
        b.position_at_end(exit_)

    def build(self) -> None:
        b = self.b
        for k, buf in enumerate(self.kernel.params):
            raw = b.load(b.gep(self.fn.args[0], [ir.Constant(I64, k)], source_etype=I8.as_pointer()), typ=I8.as_pointer())
            self.ptrs[buf.name] = b.bitcast(raw, storage_type(buf.dtype).as_pointer(), name=f"p.{buf.name}")
        outer = Loop(self.kernel.parallel_var, Var("__end"), self.kernel.body, Var("__begin"))
        b.store(self.fn.args[1], self.slot("__begin", I64))
        b.store(self.fn.args[2], self.slot("__end", I64))
        self.loop(outer)
        b.ret_void()


def build_module(kernels: list[Kernel], name: str = "onnxsat") -> ir.Module:
    """One LLVM module holding a function per kernel."""
    module = ir.Module(name=name)
    for kernel in kernels:
        _FunctionBuilder(module, kernel).build()
    return module


def kernel_signature() -> Any:
    """The ctypes prototype of every kernel function."""
    import ctypes

    return ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64)
