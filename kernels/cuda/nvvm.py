"""Kernel IR -> NVVM-flavoured LLVM IR (triple nvptx64-nvidia-cuda), built with IRBuilder.

Expressions and statements are built by the CPU code generator (``kernels.codegen``), so both
backends share one meaning of the IR; this module changes what differs on a GPU:

* the signature: ``void k(T* noalias align 16 buf0, ...)``, one global pointer per buffer
  (each buffer is its own device allocation, so pointers never alias and are 256-byte aligned);
* the parallel loop: a grid-stride loop over ``parallel_var`` from the global thread id;
* math: exp/log/erf/tanh/pow call libdevice's ``__nv_*`` functions (linked in by ``ptx``);
* reductions (``transform.reduction_parts``): one warp per output, lanes stride over the reduced
  elements, then a butterfly of ``llvm.nvvm.shfl.sync.bfly.i32`` and lane 0 stores;
* row kernels (``transform.warp_row_passes``): one warp per row, lanes stride over each pass and
  the pass's accumulators are all-reduced by the same butterfly before the next statement.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from onnxsat.kernels.codegen import LL_TYPES, FunctionBuilder, storage_type
from onnxsat.kernels.llvm_loops import for_range
from onnxsat.lowering.kernel_ir import Assign, Binary, Decl, Kernel, Local, Loop, Var, is_float, unflatten

from .transform import reduced_size, reduction_parts, substitute, warp_row_passes

TRIPLE = "nvptx64-nvidia-cuda"
WARP = 32
I32, I64 = ir.IntType(32), ir.IntType(64)
FULL_MASK = 0xFFFFFFFF

_LIBDEVICE_UNARY = {"exp": "exp", "log": "log", "erf": "erf", "tanh": "tanh"}
"""Kernel IR unary ops that call libdevice (``__nv_expf`` for f32, ``__nv_exp`` for f64)."""


def libdevice_name(op: str, dtype: str) -> str:
    return f"__nv_{op}{'f' if dtype == 'f32' else ''}"


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The function ``name`` in ``module``, declared on first use."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def sreg(b: ir.IRBuilder, name: str) -> ir.Value:
    """A PTX special register (``tid.x``, ``ntid.x``, ``ctaid.x``, ``nctaid.x``...) as i64."""
    fn = declare(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", I32, [])
    return b.zext(b.call(fn, [], name=name.replace(".", "_")), I64)


def mark_kernel(module: ir.Module, fn: ir.Function) -> None:
    """Tag ``fn`` as a kernel entry point in ``nvvm.annotations``."""
    md = module.add_named_metadata("nvvm.annotations")  # the existing node when there is one
    md.add(module.add_metadata([fn, "kernel", ir.Constant(I32, 1)]))


class NvvmBuilder(FunctionBuilder):
    """Builds one kernel as a CUDA entry point (see the module docstring for the differences)."""

    stream_stores = False

    def declare_function(self) -> ir.Function:
        """A CUDA entry point taking one typed, non-aliasing, 16-byte aligned pointer per buffer."""
        kernel = self.kernel
        arg_types = [storage_type(b.dtype).as_pointer() for b in kernel.params]
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), arg_types), name=kernel.name)
        for arg, buf in zip(fn.args, kernel.params, strict=True):
            arg.name = f"p.{buf.name}"
            arg.attributes.add("noalias")
            arg.attributes.align = 16
        mark_kernel(self.module, fn)
        return fn

    def parameter_pointers(self) -> dict[str, ir.Value]:
        return {buf.name: arg for buf, arg in zip(self.kernel.params, self.fn.args, strict=True)}

    # ------------------------------------------------------------ math through libdevice
    def _unary(self, op: str, a: ir.Value, dt: str) -> ir.Value:
        b = self.b
        if dt == "f16" and op in (*_LIBDEVICE_UNARY, "sigmoid"):
            wide = self._unary(op, b.fpext(a, LL_TYPES["f32"]), "f32")
            return b.fptrunc(wide, LL_TYPES["f16"])
        if dt in ("f32", "f64") and op in _LIBDEVICE_UNARY:
            ty = LL_TYPES[dt]
            return b.call(declare(self.module, libdevice_name(_LIBDEVICE_UNARY[op], dt), ty, [ty]), [a])
        return super()._unary(op, a, dt)

    def _binary(self, op: str, a: ir.Value, c: ir.Value, dt: str) -> ir.Value:
        b = self.b
        if op == "pow" and dt == "f16":
            f32 = LL_TYPES["f32"]
            return b.fptrunc(self._binary(op, b.fpext(a, f32), b.fpext(c, f32), "f32"), LL_TYPES["f16"])
        if op == "pow" and dt in ("f32", "f64"):
            ty = LL_TYPES[dt]
            return b.call(declare(self.module, libdevice_name("pow", dt), ty, [ty, ty]), [a, c])
        return super()._binary(op, a, c, dt)

    # ------------------------------------------------------------ control flow
    def stride_loop(self, var: str, start: ir.Value, stop: ir.Value, step: ir.Value, body: Callable[[], None]) -> None:
        """``for var = start; var < stop; var += step: body()`` (var is an i64 slot)."""
        slot = self.slot(var, I64)

        def scoped(_: ir.Value) -> None:
            self.scopes.append({})
            body()
            self.scopes.pop()

        for_range(self.b, slot, start, stop, step, scoped, blocks=(f"{var}.header", f"{var}.body", f"{var}.exit"))

    def when(self, cond: ir.Value, body: Callable[[], None], name: str) -> None:
        b = self.b
        then = self.fn.append_basic_block(f"{name}.then")
        done = self.fn.append_basic_block(f"{name}.done")
        b.cbranch(cond, then, done)
        b.position_at_end(then)
        self.scopes.append({})
        body()
        self.scopes.pop()
        b.branch(done)
        b.position_at_end(done)

    # ------------------------------------------------------------ kernels
    def build(self) -> None:
        """Grid-stride loop: every thread runs the body for its parallel values."""
        b = self.b
        ntid = sreg(b, "ntid.x")
        tid = b.add(b.mul(sreg(b, "ctaid.x"), ntid), sreg(b, "tid.x"))
        stride = b.mul(sreg(b, "nctaid.x"), ntid)
        extent = ir.Constant(I64, self.kernel.parallel_extent)
        self.stride_loop(self.kernel.parallel_var, tid, extent, stride, lambda: self.stmts(self.kernel.body))
        b.ret_void()

    def warp_ids(self) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(this thread's warp in the grid, its lane, the grid's number of warps)."""
        b = self.b
        ntid = sreg(b, "ntid.x")
        thread = b.add(b.mul(sreg(b, "ctaid.x"), ntid), sreg(b, "tid.x"))
        warps = b.udiv(b.mul(sreg(b, "nctaid.x"), ntid), ir.Constant(I64, WARP))
        return b.udiv(thread, ir.Constant(I64, WARP)), b.urem(thread, ir.Constant(I64, WARP)), warps

    def build_warp_reduction(self) -> None:
        """One warp per output value: lane partial results, then a shuffle butterfly."""
        parts = reduction_parts(self.kernel)
        assert parts is not None, "not a reduction kernel"
        decl, loops, assign, store = parts
        b = self.b
        warp, lane, warps = self.warp_ids()
        shape = tuple(int(lp.stop.value) for lp in loops)  # type: ignore[union-attr]
        red_index = unflatten(Var("__r"), shape)
        step = substitute(assign, {lp.var: ix for lp, ix in zip(loops, red_index, strict=True)})
        assert isinstance(assign.value, Binary)
        op = assign.value.op

        def one_output() -> None:
            self.stmts((decl,))
            total = ir.Constant(I64, reduced_size(loops))
            self.stride_loop("__r", lane, total, ir.Constant(I64, WARP), lambda: self.stmts((step,)))  # type: ignore[arg-type]
            acc_slot = self.slots[decl.name]
            for offset in (16, 8, 4, 2, 1):
                acc = b.load(acc_slot, typ=LL_TYPES[decl.dtype])
                other = self.shuffle_xor(acc, decl.dtype, offset)
                b.store(self._binary(op, acc, other, decl.dtype), acc_slot)
            self.when(b.icmp_unsigned("==", lane, ir.Constant(I64, 0)), lambda: self.stmts((store,)), "lane0")

        self.stride_loop(self.kernel.parallel_var, warp, ir.Constant(I64, self.kernel.parallel_extent), warps, one_output)
        b.ret_void()

    def build_warp_rows(self) -> None:
        """One warp per row of a multi-pass row kernel (``transform.warp_row_passes``): lanes stride
        over each pass, and each accumulator the pass reduces is all-reduced by shuffles after it, so
        every lane continues with the row's total (softmax's max and sum, LayerNorm's moments)."""
        passes = warp_row_passes(self.kernel)
        assert passes is not None, "not a warp-row kernel"
        b = self.b
        warp, lane, warps = self.warp_ids()
        declared = {s.name: s for s in self.kernel.body if isinstance(s, Decl)}

        def one_row() -> None:
            for pos, stmt in enumerate(self.kernel.body):
                if pos not in passes:
                    self.stmts((stmt,))
                    continue
                assert isinstance(stmt, Loop)
                body = stmt.body
                self.stride_loop(stmt.var, lane, self.expr(stmt.stop), ir.Constant(I64, WARP), lambda: self.stmts(body))  # noqa: B023 - runs now
                for name in passes[pos]:
                    op = next(a.value.op for a in stmt.body if isinstance(a, Assign) and a.name == name)  # type: ignore[union-attr]
                    dtype = declared[name].dtype
                    for offset in (16, 8, 4, 2, 1):
                        acc = b.load(self.slots[name], typ=LL_TYPES[dtype])
                        b.store(self._binary(op, acc, self.shuffle_xor(acc, dtype, offset), dtype), self.slots[name])

        self.stride_loop(self.kernel.parallel_var, warp, ir.Constant(I64, self.kernel.parallel_extent), warps, one_row)
        b.ret_void()

    def shuffle_xor(self, value: ir.Value, dtype: str, offset: int) -> ir.Value:
        """The ``value`` of lane ``lane ^ offset`` (any scalar type, moved as 32-bit words)."""
        b = self.b
        shfl = declare(self.module, "llvm.nvvm.shfl.sync.bfly.i32", I32, [I32, I32, I32, I32])
        ty = LL_TYPES[dtype]
        bits = {"f16": 16, "f32": 32, "f64": 64}.get(dtype) or ty.width
        as_int = b.bitcast(value, ir.IntType(bits)) if is_float(dtype) else value
        wide = b.zext(as_int, I64) if bits < 64 else as_int
        mask, clamp = ir.Constant(I32, FULL_MASK), ir.Constant(I32, 0x1F)
        lo = b.call(shfl, [mask, b.trunc(wide, I32), ir.Constant(I32, offset), clamp])
        result = b.zext(lo, I64)
        if bits > 32:
            hi = b.call(shfl, [mask, b.trunc(b.lshr(wide, ir.Constant(I64, 32)), I32), ir.Constant(I32, offset), clamp])
            result = b.or_(result, b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
        narrow = b.trunc(result, ir.IntType(bits)) if bits < 64 else result
        return b.bitcast(narrow, ty) if is_float(dtype) else narrow


def uses_warp_reduction(kernel: Kernel, min_reduced: int = 64) -> bool:
    """Reductions over at least ``min_reduced`` elements per output get a warp each."""
    parts = reduction_parts(kernel)
    if parts is None:
        return False
    decl, loops, assign, _ = parts
    value = assign.value
    if not (isinstance(value, Binary) and value.a == Local(decl.name, decl.dtype)):
        return False
    return reduced_size(loops) >= min_reduced


def add_kernel(module: ir.Module, kernel: Kernel, form: str) -> None:
    """Build ``kernel`` into ``module`` as an entry point of the given form."""
    builder = NvvmBuilder(module, kernel)
    if form == "warp-reduction":
        builder.build_warp_reduction()
    elif form == "warp-rows":
        builder.build_warp_rows()
    else:
        builder.build()
