"""A tiled shared-memory GEMM kernel for the GPU, built with IRBuilder.

``C[z] = alpha * A[z] @ B[z] + beta * C[z]`` for every batch index ``z`` (``blockIdx.z``): a block
of 16 x 16 threads computes a 64 x 64 tile of C, each thread a 4 x 4 grid of it (rows ``ty + 16i``,
columns ``tx + 16j``, so stores are coalesced and shared-memory reads conflict-free). K advances
in steps of 16 through two shared-memory tiles (``addrspace(3)``), loaded with bounds checks,
between ``barrier0`` calls. A and B are strided (any transpose or view); batch offsets come from
two i64 tables, so broadcasting over batch dimensions costs nothing.

Arguments: ``A, B, C, a_offsets, b_offsets, M, N, K, a_row, a_col, b_row, b_col, alpha, beta``.
"""

from __future__ import annotations

from llvmlite import ir

from onnxsat.kernels.codegen import LL_TYPES

from .nvvm import I64, declare, mark_kernel, sreg

TILE_M = TILE_N = 64
TILE_K = 16
THREADS = 16
"""Threads per block side (16 x 16 = 256 threads); each thread computes TILE/THREADS = 4 per side."""
PER_THREAD = TILE_M // THREADS
GEMM_DTYPES = ("f32", "f64")


def gemm_kernel_name(dtype: str) -> str:
    return f"gemm_{dtype}"


def add_gemm_kernel(module: ir.Module, dtype: str) -> ir.Function:
    """Build the GEMM entry point for ``dtype`` into ``module`` (once)."""
    name = gemm_kernel_name(dtype)
    if name in module.globals:
        return module.globals[name]
    ty = LL_TYPES[dtype]
    ptr, iptr = ty.as_pointer(), I64.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, iptr, iptr, *([I64] * 7), ty, ty])
    fn = ir.Function(module, fnty, name=name)
    names = ["A", "B", "C", "a_offsets", "b_offsets", "M", "N", "K", "a_row", "a_col", "b_row", "b_col", "alpha", "beta"]
    for arg, n in zip(fn.args, names, strict=True):
        arg.name = n
    for arg in fn.args[:5]:
        arg.attributes.add("noalias")
    mark_kernel(module, fn)
    A, B, C, a_offs, b_offs, M, N, K, a_row, a_col, b_row, b_col, alpha, beta = fn.args
    tile_ty = ir.ArrayType(ty, TILE_K * TILE_M)
    shared = []
    for which in ("As", "Bs"):
        gv = ir.GlobalVariable(module, tile_ty, f"{name}.{which}", addrspace=3)
        gv.linkage = "internal"
        gv.initializer = ir.Constant(tile_ty, ir.Undefined)
        gv.align = 16
        shared.append(gv)
    a_tile, b_tile = shared
    barrier = declare(module, "llvm.nvvm.barrier0", ir.VoidType(), [])

    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)

    def c64(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    zero = ir.Constant(ty, 0.0)
    tx, ty_ = sreg(b, "tid.x"), sreg(b, "tid.y")
    tid = b.add(b.mul(ty_, c64(THREADS)), tx, name="tid")
    m0 = b.mul(sreg(b, "ctaid.y"), c64(TILE_M), name="m0")
    n0 = b.mul(sreg(b, "ctaid.x"), c64(TILE_N), name="n0")
    z = sreg(b, "ctaid.z")
    a_base = b.load(b.gep(a_offs, [z], source_etype=I64), typ=I64, name="a_base")
    b_base = b.load(b.gep(b_offs, [z], source_etype=I64), typ=I64, name="b_base")
    c_base = b.mul(z, b.mul(M, N), name="c_base")
    acc = [[b.alloca(ty, name=f"acc{i}{j}") for j in range(PER_THREAD)] for i in range(PER_THREAD)]
    for row in acc:
        for slot in row:
            b.store(zero, slot)
    k0_slot = b.alloca(I64, name="k0")
    b.store(c64(0), k0_slot)

    header = fn.append_basic_block("k.header")
    body = fn.append_basic_block("k.body")
    done = fn.append_basic_block("k.exit")
    b.branch(header)
    b.position_at_end(header)
    k0 = b.load(k0_slot, typ=I64, name="k0v")
    b.cbranch(b.icmp_signed("<", k0, K), body, done)
    b.position_at_end(body)

    def guarded_load(base_ptr: ir.Value, inside: ir.Value, index: ir.Value) -> ir.Value:
        safe = b.select(inside, index, c64(0))
        value = b.load(b.gep(base_ptr, [safe], source_etype=ty), typ=ty)
        return b.select(inside, value, zero)

    per_thread_loads = TILE_K * TILE_M // (THREADS * THREADS)
    for step in range(per_thread_loads):
        e = b.add(tid, c64(step * THREADS * THREADS))
        # A tile element (r, k): r = e // TILE_K, k = e % TILE_K (consecutive threads walk k)
        r, k = b.udiv(e, c64(TILE_K)), b.urem(e, c64(TILE_K))
        row, col = b.add(m0, r), b.add(k0, k)
        inside = b.and_(b.icmp_signed("<", row, M), b.icmp_signed("<", col, K))
        index = b.add(a_base, b.add(b.mul(row, a_row), b.mul(col, a_col)))
        dst = b.gep(a_tile, [c64(0), b.add(b.mul(k, c64(TILE_M)), r)])
        b.store(guarded_load(A, inside, index), dst)
        # B tile element (k, c): k = e // TILE_N, c = e % TILE_N (consecutive threads walk columns)
        kb, cb = b.udiv(e, c64(TILE_N)), b.urem(e, c64(TILE_N))
        row, col = b.add(k0, kb), b.add(n0, cb)
        inside = b.and_(b.icmp_signed("<", row, K), b.icmp_signed("<", col, N))
        index = b.add(b_base, b.add(b.mul(row, b_row), b.mul(col, b_col)))
        dst = b.gep(b_tile, [c64(0), b.add(b.mul(kb, c64(TILE_N)), cb)])
        b.store(guarded_load(B, inside, index), dst)
    b.call(barrier, [])
    for kk in range(TILE_K):
        a_vals = [b.load(b.gep(a_tile, [c64(0), b.add(c64(kk * TILE_M + i * THREADS), ty_)]), typ=ty) for i in range(PER_THREAD)]
        b_vals = [b.load(b.gep(b_tile, [c64(0), b.add(c64(kk * TILE_N + j * THREADS), tx)]), typ=ty) for j in range(PER_THREAD)]
        for i in range(PER_THREAD):
            for j in range(PER_THREAD):
                slot = acc[i][j]
                b.store(b.fadd(b.load(slot, typ=ty), b.fmul(a_vals[i], b_vals[j], flags=("contract",)), flags=("contract",)), slot)
    b.call(barrier, [])
    b.store(b.add(k0, c64(TILE_K)), k0_slot)
    b.branch(header)

    b.position_at_end(done)
    has_beta = b.fcmp_unordered("!=", beta, zero)
    for i in range(PER_THREAD):
        for j in range(PER_THREAD):
            row = b.add(m0, b.add(ty_, c64(i * THREADS)))
            col = b.add(n0, b.add(tx, c64(j * THREADS)))
            inside = b.and_(b.icmp_signed("<", row, M), b.icmp_signed("<", col, N))
            then = fn.append_basic_block(f"store{i}{j}")
            after = fn.append_basic_block(f"after{i}{j}")
            b.cbranch(inside, then, after)
            b.position_at_end(then)
            ptr = b.gep(C, [b.add(c_base, b.add(b.mul(row, N), col))], source_etype=ty)
            value = b.fmul(alpha, b.load(acc[i][j], typ=ty))
            old = b.load(b.gep(C, [b.select(has_beta, b.add(c_base, b.add(b.mul(row, N), col)), c64(0))], source_etype=ty), typ=ty)
            value = b.select(has_beta, b.fadd(value, b.fmul(beta, old)), value)
            b.store(value, ptr)
            b.branch(after)
            b.position_at_end(after)
    b.ret_void()
    return fn
