"""Kernel IR -> LLVM IR, built with ``llvmlite.ir.IRBuilder`` (never from strings).

Every kernel becomes ``void name(i8** args, i64 begin, i64 end)``: ``args`` holds the buffer
pointers in ``Kernel.params`` order; the body runs for the parallel variable in ``[begin, end)``.
Loop variables and scalar locals are stack slots that ``mem2reg`` promotes, so O3 sees plain
SSA loops it can vectorize. Float adds/multiplies carry ``reassoc contract`` so reductions vectorize.
Large elementwise outputs get explicit vector loops with non-temporal stores (kernels/streaming.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import binding, ir

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
    walk_exprs,
)

from . import mathlib, streaming
from .llvm_loops import for_range

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
_EXACT_IN_F16 = frozenset({"neg", "abs", "floor", "ceil", "round"})
"""Float16 unary ops whose float16 result is exact; the others are computed in float32."""


def storage_type(dtype: str) -> ir.Type:
    """How a dtype is stored in memory (bool as a byte)."""
    return I8 if dtype == "bool" else LL_TYPES[dtype]


class FunctionBuilder:
    """Builds one kernel's LLVM function with IRBuilder.

    A builder for another target (kernels/cuda/nvvm.py) subclasses it and overrides the hooks:
    ``declare_function`` (the function's signature and attributes), ``parameter_pointers`` (the
    buffer pointers known at entry), ``stream_stores`` and the expression/loop methods it emits
    differently.
    """

    stream_stores = True
    """Whether large elementwise loops become streaming vector loops (CPU only)."""
    lanes: int | None = None
    """Set while emitting a streaming vector loop: expressions then yield ``<lanes x float>``."""
    vector_var = ""
    streamed = False

    def __init__(self, module: ir.Module, kernel: Kernel):
        self.module = module
        self.kernel = kernel
        self.fn = self.declare_function()
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.slots: dict[str, ir.Value] = {}
        self.ptrs: dict[str, ir.Value] = self.parameter_pointers()
        self.scopes: list[dict[Expr, ir.Value]] = [{}]
        self.written = set(kernel.outputs)
        self.alias: dict[str, tuple[ir.MDValue, ir.MDValue]] = {}
        """Buffer name -> (its alias scope list, the other buffers' scopes); empty: no metadata."""
        self.storing: tuple[str, Expr] | None = None
        """(buffer, index) of the store whose value is being built (see ``_select_operand``)."""

    def declare_function(self) -> ir.Function:
        """The kernel's function: ``void name(i8** args, i64 begin, i64 end)`` on the CPU."""
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64])
        fn = ir.Function(self.module, fnty, name=self.kernel.name)
        fn.args[0].name, fn.args[1].name, fn.args[2].name = "args", "begin", "end"
        return fn

    def parameter_pointers(self) -> dict[str, ir.Value]:
        """Buffer name -> typed pointer known at entry (none on the CPU: ``build`` loads them from ``args``)."""
        return {}

    # ------------------------------------------------------------ helpers
    def intrinsic(self, name: str, ty: ir.Type, nargs: int = 1) -> ir.Function:
        full = f"llvm.{name}.{mathlib.intrinsic_suffix(ty)}"
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

    def declare_alias_scopes(self) -> None:
        """One alias scope per buffer parameter: the buffers of one kernel never overlap (the arena
        keeps every buffer a step touches apart; a buffer written in place is one parameter), so
        LLVM needs no run-time overlap checks, which it does not emit for short loops (a blocked
        conv's 8 channel lanes would stay scalar)."""
        md, text = self.module.add_metadata, ir.MetaDataString
        domain = md([text(self.module, f"onnxsat.{self.kernel.name}")])
        scopes = {buf.name: md([text(self.module, f"{self.kernel.name}.{buf.name}"), domain]) for buf in self.kernel.params}
        for name, scope in scopes.items():
            self.alias[name] = (md([scope]), md([other for n, other in scopes.items() if n != name]))

    def mark(self, instr: ir.Instruction, buf: Buffer) -> ir.Instruction:
        """``instr`` (a load or store of ``buf``) tagged with ``buf``'s alias scope."""
        if buf.name in self.alias:
            scope, others = self.alias[buf.name]
            instr.set_metadata("alias.scope", scope)
            instr.set_metadata("noalias", others)
        return instr

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
            if self.lanes is not None:  # streaming.py admits float32 constants only
                return mathlib.splat(ir.VectorType(ty, self.lanes), float(e.value))
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
        if isinstance(e, Load) and self.lanes is not None:
            return self._vector_load(e)
        if isinstance(e, Load):
            st = storage_type(e.buffer.dtype)
            ptr = b.gep(self.pointer(e.buffer), [self.expr(e.index)], inbounds=True, source_etype=st)
            value = self.mark(b.load(ptr, typ=st), e.buffer)
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
            return b.select(self.expr(e.cond), self._select_operand(e.a), self._select_operand(e.b))
        if isinstance(e, Cast):
            return self._cast(self.expr(e.a), dtype_of(e.a), e.dtype)
        raise TypeError(f"not an expression: {e!r}")

    def _unary(self, op: str, a: ir.Value, dt: str) -> ir.Value:
        b = self.b
        if dt == "f16" and op not in _EXACT_IN_F16:  # in float32, rounded once (onnxruntime's way)
            return self._cast(self._unary(op, self._cast(a, dt, "f32"), "f32"), "f32", dt)
        if is_float(dt):
            ty = LL_TYPES[dt]
            if op == "neg":
                return b.fneg(a)
            if op == "recip":
                return b.fdiv(mathlib.splat(a.type, 1.0), a)
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
            if op == "tanh":  # sign(x) (1 - e) / (1 + e), e = exp(-2|x|) <= 1: no inf / inf
                magnitude = b.call(self.intrinsic("fabs", a.type), [a])
                e = self._unary("exp", b.fmul(magnitude, ir.Constant(ty, -2.0)), dt)
                one = ir.Constant(ty, 1.0)
                return b.call(self.intrinsic("copysign", a.type, 2), [b.fdiv(b.fsub(one, e), b.fadd(one, e)), a])
            name = {"exp": "exp", "log": "log", "sqrt": "sqrt", "abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "roundeven"}[op]
            return b.call(self.intrinsic(name, a.type), [a])
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
                return b.call(self.intrinsic("maximum" if op == "max" else "minimum", a.type, 2), [a, c])
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
                store = streaming.streamed_store(s, frozenset(self.written)) if self.stream_stores else None
                if store is not None:
                    self.streaming_loop(s, store)
                else:
                    self.loop(s)
            elif isinstance(s, Store):
                st = storage_type(s.buffer.dtype)
                self.storing = (s.buffer.name, s.index)
                value = self.expr(s.value)
                self.storing = None
                if s.buffer.dtype == "bool":
                    value = self.b.zext(value, I8)
                ptr = self.b.gep(self.pointer(s.buffer), [self.expr(s.index)], inbounds=True, source_etype=st)
                self.mark(self.b.store(value, ptr), s.buffer)
            elif isinstance(s, Decl):
                value = self.expr(s.init)
                self.b.store(value, self.slot(s.name, LL_TYPES[s.dtype]))
            elif isinstance(s, Assign):
                value = self.expr(s.value)
                self.b.store(value, self.slots[s.name])

    def loop(self, s: Loop) -> None:
        var = self.slot(s.var, I64)
        start, stop = self.expr(s.start), self.expr(s.stop)
        for part in invariant_parts(s, self._cacheable):
            self.expr(part)  # computed once here; the body finds it in this scope's cache

        def body(_: ir.Value) -> None:
            self.scopes.append({})
            self.stmts(s.body)
            self.scopes.pop()

        blocks = (f"{s.var}.header", f"{s.var}.body", f"{s.var}.exit")
        for_range(self.b, var, start, stop, ir.Constant(I64, 1), body, blocks=blocks)

    def _select_operand(self, e: Expr) -> ir.Value:
        """A select's operand; frozen where it loads the element being stored. LLVM's code generator
        turns ``a[i] = c ? a[i] : x`` (an in-place ReLU after a conv's channel loop) into a masked
        store, which AVX2 runs microcoded (``vmaskmovps``: RegNet's grouped convs spent most of
        their time in it); a ``freeze`` of the load costs nothing and keeps a blend and a store."""
        value = self.expr(e)
        if not (isinstance(e, Load) and self.storing == (e.buffer.name, e.index)):
            return value
        frozen = ir.Instruction(self.b.block, value.type, "freeze", [value])
        self.b._insert(frozen)  # llvmlite's builder has no freeze
        return frozen

    def _vector_load(self, e: Load) -> ir.Value:
        """``lanes`` floats of ``e`` from the current chunk start: consecutive, or one broadcast."""
        assert self.lanes is not None
        b, vty = self.b, ir.VectorType(LL_TYPES["f32"], self.lanes)
        lanes, self.lanes = self.lanes, None  # the index is scalar i64 arithmetic
        ptr = b.gep(self.pointer(e.buffer), [self.expr(e.index)], inbounds=True, source_etype=LL_TYPES["f32"])
        self.lanes = lanes
        if streaming.stride_of(e.index, self.vector_var) == 1:
            return self.mark(b.load(b.bitcast(ptr, vty.as_pointer()), typ=vty, align=4), e.buffer)
        scalar = self.mark(b.load(ptr, typ=LL_TYPES["f32"]), e.buffer)
        one = b.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
        return b.shuffle_vector(one, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

    def streaming_loop(self, s: Loop, store: Store) -> None:
        """``s`` as a scalar head up to a 64-byte boundary of the output, a vector loop of
        non-temporal stores, and a scalar tail (the whole range stays scalar when it is short or
        the output is not float-aligned)."""
        b, lanes = self.b, streaming.LANES
        start, stop = self.expr(s.start), self.expr(s.stop)
        self.scopes.append({})  # the index at the loop start must not be reused inside the loops
        b.store(start, self.slot(s.var, I64))
        first = b.gep(self.pointer(store.buffer), [self.expr(store.index)], inbounds=True, source_etype=LL_TYPES["f32"])
        self.scopes.pop()
        addr = b.ptrtoint(first, I64)
        count = b.sub(stop, start)
        to_line = b.and_(b.lshr(b.sub(ir.Constant(I64, 0), addr), ir.Constant(I64, 2)), ir.Constant(I64, lanes - 1))
        scalar_only = b.or_(
            b.icmp_signed("<", count, ir.Constant(I64, streaming.MIN_STREAM_ELEMENTS)),
            b.icmp_unsigned("!=", b.and_(addr, ir.Constant(I64, 3)), ir.Constant(I64, 0)),
        )
        head_end = b.select(scalar_only, stop, b.add(start, to_line))
        vector_end = b.add(head_end, b.and_(b.sub(stop, head_end), ir.Constant(I64, -lanes)))
        # fresh names: a loaded Var is cached in its scope, and sibling loops may share ``s.var``
        head_var, vector_var = f"{s.var}.head_end{len(self.slots)}", f"{s.var}.vector_end{len(self.slots)}"
        b.store(head_end, self.slot(head_var, I64))
        b.store(vector_end, self.slot(vector_var, I64))
        self.loop(Loop(s.var, Var(head_var), s.body, s.start))
        self._vector_loop(s.var, Var(head_var), Var(vector_var), store)
        self.loop(Loop(s.var, s.stop, s.body, Var(vector_var)))
        self.streamed = True

    def _vector_loop(self, var: str, start: Var, stop: Var, store: Store) -> None:
        b, lanes = self.b, streaming.LANES
        slot = self.slot(var, I64)
        b.store(self.expr(start), slot)
        end = self.expr(stop)
        header = self.fn.append_basic_block(f"{var}.vheader")
        body = self.fn.append_basic_block(f"{var}.vbody")
        exit_ = self.fn.append_basic_block(f"{var}.vexit")
        b.branch(header)
        b.position_at_end(header)
        b.cbranch(b.icmp_signed("<", b.load(slot, typ=I64), end), body, exit_)
        b.position_at_end(body)
        saved, self.scopes = self.scopes, [{}]  # values of the scalar code are not vectors
        self.lanes, self.vector_var = lanes, var
        value = self.expr(store.value)
        self.lanes = None
        ptr = b.gep(self.pointer(store.buffer), [self.expr(store.index)], inbounds=True, source_etype=LL_TYPES["f32"])
        vty = ir.VectorType(LL_TYPES["f32"], lanes)
        instr = self.mark(b.store(value, b.bitcast(ptr, vty.as_pointer()), align=4 * lanes), store.buffer)
        instr.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        self.scopes = saved
        b.store(b.add(b.load(slot, typ=I64), ir.Constant(I64, lanes), flags=["nsw"]), slot)
        b.branch(header)
        b.position_at_end(exit_)

    def store_fence(self) -> None:
        """Orders the non-temporal stores before anything the caller does next (``sfence`` on x86;
        a full fence elsewhere)."""
        if binding.get_process_triple().startswith(("x86_64", "i386", "i686")):
            name = "llvm.x86.sse.sfence"
            fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(ir.VoidType(), []), name=name)
            self.b.call(fn, [])
        else:
            self.b.fence("seq_cst")

    def build(self) -> None:
        b = self.b
        for k, buf in enumerate(self.kernel.params):
            raw = b.load(b.gep(self.fn.args[0], [ir.Constant(I64, k)], source_etype=I8.as_pointer()), typ=I8.as_pointer())
            self.ptrs[buf.name] = b.bitcast(raw, storage_type(buf.dtype).as_pointer(), name=f"p.{buf.name}")
        self.declare_alias_scopes()
        outer = Loop(self.kernel.parallel_var, Var("__end"), self.kernel.body, Var("__begin"))
        b.store(self.fn.args[1], self.slot("__begin", I64))
        b.store(self.fn.args[2], self.slot("__end", I64))
        self.stmts((outer,))
        if self.streamed:
            self.store_fence()
        b.ret_void()


_COSTLY_BINARY = frozenset({"div", "pow"})


def invariant_parts(loop: Loop, cacheable: Callable[[Expr], bool]) -> list[Expr]:
    """The largest costly subexpressions (transcendental and other unary math, division, power)
    of ``loop``'s body that nothing bound inside the loop changes: a per-channel ``sigmoid`` of a
    squeeze-excitation scale is then computed once per channel, not once per pixel (LLVM does
    not hoist it: the kernel's output might alias its input as far as it knows). Only loops that
    surely run (constant bounds, at least one iteration), so a hoisted load is one the loop does;
    ``cacheable`` (the builder's) refuses loads of buffers the kernel writes."""
    if not _surely_runs(loop):
        return []
    bound = {loop.var} | {stmt.var for stmt in _statements(loop.body) if isinstance(stmt, Loop)}
    found: dict[Expr, None] = {}

    def visit(e: Expr) -> None:
        if isinstance(e, (Const, Var, Local)):
            return
        costly = isinstance(e, Unary) or (isinstance(e, Binary) and e.op in _COSTLY_BINARY)
        if costly and not any(streaming.mentions(e, name) for name in bound) and cacheable(e):
            found[e] = None
            return
        for child in _children(e):
            visit(child)

    for stmt in _statements(loop.body, _surely_runs):
        if isinstance(stmt, Loop):
            visit(stmt.start)
            visit(stmt.stop)
        else:
            for root in walk_exprs((stmt,)):
                visit(root)
    return list(found)


def _surely_runs(loop: Loop) -> bool:
    return isinstance(loop.start, Const) and isinstance(loop.stop, Const) and loop.stop.value > loop.start.value


def _statements(body: tuple[Stmt, ...], enter: Callable[[Loop], bool] | None = None) -> list[Stmt]:
    """Every statement of ``body``, nested ones included (only inside loops ``enter`` accepts)."""
    out: list[Stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, Loop) and (enter is None or enter(stmt)):
            out.extend(_statements(stmt.body, enter))
    return out


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, (Unary, Cast)):
        return (e.a,)
    if isinstance(e, (Binary, Compare)):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def build_module(kernels: list[Kernel], name: str = "onnxsat") -> ir.Module:
    """One LLVM module holding a function per kernel."""
    module = ir.Module(name=name)
    for kernel in kernels:
        FunctionBuilder(module, kernel).build()
    return module


def kernel_signature() -> Any:
    """The ctypes prototype of every kernel function."""
    import ctypes

    return ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64)
