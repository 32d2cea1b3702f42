"""One native entry point that runs a whole compiled program: a task table walked by LLVM code.

Every step of a program becomes a few *tasks* (a kernel over a ``[begin, end)`` range, a packed
GEMM over a range of column panels, a BLAS call), each a row of ``TASK_WORDS`` int64 words:
``[kind, function address, arguments...]``. ``onnxsat_run_graph`` walks the steps in order; the
tasks of one step are shared between the calling thread and the helper threads through an
atomic task counter, and a step ends when the completed-task counter reaches its last task. So a
whole inference is one ctypes call (GIL released), with no Python hop per kernel.

Helper threads enter ``onnxsat_worker`` (also through ctypes, GIL released) for the duration of
one run only, spin between steps (``pause``, then ``sched_yield``) and leave when the run ends,
so nothing spins while the model is idle. Task indices grow monotonically over a run, so a
helper that looks late can never run a task of the wrong step: it only takes an index below the
published limit, with a compare-and-swap.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from .jit import CompiledModule

TASK_WORDS = 16
KIND_KERNEL, KIND_PACKED_GEMM, KIND_SGEMM, KIND_DGEMM = 0, 1, 2, 3
CTX_WORDS = 32
"""Run state, one counter per 64-byte line: next task, done tasks, step limit, stop flag."""
NEXT, DONE, LIMIT, STOP = 0, 8, 16, 24
SPINS_BEFORE_YIELD = 64
IDLE_SLEEP_US = 20

I32, I64 = ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
P64 = I64.as_pointer()
I8P = ir.IntType(8).as_pointer()


class _Gen:
    def __init__(self, module: ir.Module):
        self.module = module
        self.pause = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        self.exec_fn = self._exec_task()

    def _word(self, b: ir.IRBuilder, task: ir.Value, i: int) -> ir.Value:
        return b.load(b.gep(task, [ir.Constant(I64, i)]))

    def _exec_task(self) -> ir.Function:
        """``exec_task(task)``: call what one task row describes."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64]), "onnxsat_exec_task")
        fn.linkage = "internal"
        task = fn.args[0]
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        kind = self._word(b, task, 0)
        target = self._word(b, task, 1)
        done = fn.append_basic_block("done")
        switch = b.switch(kind, done)

        def case(k: int, arg_types: list[ir.Type], convert) -> None:  # type: ignore[no-untyped-def]
            block = fn.append_basic_block(f"kind{k}")
            switch.add_case(ir.Constant(I64, k), block)
            b.position_at_end(block)
            fty = ir.FunctionType(ir.VoidType(), arg_types)
            callee = b.inttoptr(target, fty.as_pointer())
            args = [convert(b, ty, self._word(b, task, 2 + i)) for i, ty in enumerate(arg_types)]
            b.call(callee, args)
            b.branch(done)

        def plain(b: ir.IRBuilder, ty: ir.Type, word: ir.Value) -> ir.Value:
            if ty == I64:
                return word
            if ty == I32:
                return b.trunc(word, I32)
            if ty == F32:
                return b.bitcast(b.trunc(word, I32), F32)
            if ty == F64:
                return b.bitcast(word, F64)
            return b.inttoptr(word, ty)

        case(KIND_KERNEL, [I8P.as_pointer(), I64, I64], plain)
        case(KIND_PACKED_GEMM, [I64] * 10, plain)
        blas = [I32, I32, I32, I64, I64, I64, None, I64, I64, I64, I64, None, I64, I64]
        case(KIND_SGEMM, [F32 if t is None else t for t in blas], plain)
        case(KIND_DGEMM, [F64 if t is None else t for t in blas], plain)
        b.position_at_end(done)
        b.ret_void()
        return fn

    def _drain(self, b: ir.IRBuilder, fn: ir.Function, ctx: ir.Value, tasks: ir.Value) -> None:
        """Take and run tasks below the published limit until none is left."""
        head = fn.append_basic_block("drain.head")
        take = fn.append_basic_block("drain.take")
        run = fn.append_basic_block("drain.run")
        out = fn.append_basic_block("drain.out")
        b.branch(head)
        b.position_at_end(head)
        cur = b.load_atomic(b.gep(ctx, [ir.Constant(I64, NEXT)]), "seq_cst", 8)
        limit = b.load_atomic(b.gep(ctx, [ir.Constant(I64, LIMIT)]), "seq_cst", 8)
        b.cbranch(b.icmp_signed("<", cur, limit), take, out)
        b.position_at_end(take)
        pair = b.cmpxchg(b.gep(ctx, [ir.Constant(I64, NEXT)]), cur, b.add(cur, ir.Constant(I64, 1)), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(pair, 1), run, head)
        b.position_at_end(run)
        b.call(self.exec_fn, [b.gep(tasks, [b.mul(cur, ir.Constant(I64, TASK_WORDS))])])
        b.atomic_rmw("add", b.gep(ctx, [ir.Constant(I64, DONE)]), ir.Constant(I64, 1), "seq_cst")
        b.branch(head)
        b.position_at_end(out)

    def _backoff(self, b: ir.IRBuilder, spins_slot: ir.Value, yield_fn: ir.Value, sleep_us: int = 0) -> None:
        """``pause`` for a while, then ``yield_fn()`` (``sched_yield``: a descheduled peer needs
        the core), or ``yield_fn(sleep_us)`` (``usleep``) when ``sleep_us`` is given."""
        fn = b.function
        spins = b.add(b.load(spins_slot), ir.Constant(I64, 1))
        b.store(spins, spins_slot)
        yield_block = fn.append_basic_block("backoff.yield")
        pause_block = fn.append_basic_block("backoff.pause")
        after = fn.append_basic_block("backoff.after")
        b.cbranch(b.icmp_signed(">", spins, ir.Constant(I64, SPINS_BEFORE_YIELD)), yield_block, pause_block)
        b.position_at_end(yield_block)
        if sleep_us:
            b.call(b.inttoptr(yield_fn, ir.FunctionType(I32, [I32]).as_pointer()), [ir.Constant(I32, sleep_us)])
        else:
            b.call(b.inttoptr(yield_fn, ir.FunctionType(I32, []).as_pointer()), [])
        b.branch(after)
        b.position_at_end(pause_block)
        b.call(self.pause, [])
        b.branch(after)
        b.position_at_end(after)

    def run_graph(self) -> None:
        """``run_graph(ctx, tasks, step_ends, steps, yield_fn)``: every step in order, then stop."""
        fty = ir.FunctionType(ir.VoidType(), [P64, P64, P64, I64, I64])
        fn = ir.Function(self.module, fty, "onnxsat_run_graph")
        ctx, tasks, step_ends, steps, yield_fn = fn.args
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        step_slot = b.alloca(I64)
        spins_slot = b.alloca(I64)
        b.store(ir.Constant(I64, 0), step_slot)
        head = fn.append_basic_block("step.head")
        body = fn.append_basic_block("step.body")
        finish = fn.append_basic_block("finish")
        b.branch(head)
        b.position_at_end(head)
        s = b.load(step_slot)
        b.cbranch(b.icmp_signed("<", s, steps), body, finish)
        b.position_at_end(body)
        end = b.load(b.gep(step_ends, [s]))
        b.store_atomic(end, b.gep(ctx, [ir.Constant(I64, LIMIT)]), "seq_cst", 8)
        self._drain(b, fn, ctx, tasks)
        # wait for tasks a helper took and is still running
        b.store(ir.Constant(I64, 0), spins_slot)
        wait = fn.append_basic_block("wait")
        spin = fn.append_basic_block("spin")
        next_step = fn.append_basic_block("step.next")
        b.branch(wait)
        b.position_at_end(wait)
        done = b.load_atomic(b.gep(ctx, [ir.Constant(I64, DONE)]), "seq_cst", 8)
        b.cbranch(b.icmp_signed("<", done, end), spin, next_step)
        b.position_at_end(spin)
        self._backoff(b, spins_slot, yield_fn)
        b.branch(wait)
        b.position_at_end(next_step)
        b.store(b.add(s, ir.Constant(I64, 1)), step_slot)
        b.branch(head)
        b.position_at_end(finish)
        b.store_atomic(ir.Constant(I64, 1), b.gep(ctx, [ir.Constant(I64, STOP)]), "seq_cst", 8)
        b.ret_void()

    def worker(self) -> None:
        """``worker(ctx, tasks, sleep_fn)``: help with tasks until the run sets the stop flag. An idle
        helper sleeps (``usleep``) after a short spin: a thread that spins through a long serial
        step burns its scheduler share and is then preempted while holding a task, which the
        whole step waits for on a loaded machine."""
        fty = ir.FunctionType(ir.VoidType(), [P64, P64, I64])
        fn = ir.Function(self.module, fty, "onnxsat_worker")
        ctx, tasks, sleep_fn = fn.args
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        spins_slot = b.alloca(I64)
        b.store(ir.Constant(I64, 0), spins_slot)
        head = fn.append_basic_block("worker.head")
        work = fn.append_basic_block("worker.work")
        leave = fn.append_basic_block("worker.leave")
        b.branch(head)
        b.position_at_end(head)
        stop = b.load_atomic(b.gep(ctx, [ir.Constant(I64, STOP)]), "seq_cst", 8)
        b.cbranch(b.icmp_signed("!=", stop, ir.Constant(I64, 0)), leave, work)
        b.position_at_end(work)
        before = b.load_atomic(b.gep(ctx, [ir.Constant(I64, DONE)]), "seq_cst", 8)
        self._drain(b, fn, ctx, tasks)
        after = b.load_atomic(b.gep(ctx, [ir.Constant(I64, DONE)]), "seq_cst", 8)
        idle = fn.append_basic_block("worker.idle")
        busy = fn.append_basic_block("worker.busy")
        b.cbranch(b.icmp_signed("==", before, after), idle, busy)
        b.position_at_end(busy)
        b.store(ir.Constant(I64, 0), spins_slot)
        b.branch(head)
        b.position_at_end(idle)
        self._backoff(b, spins_slot, sleep_fn, IDLE_SLEEP_US)
        b.branch(head)
        b.position_at_end(leave)
        b.ret_void()


@functools.cache
def _runtime() -> tuple[CompiledModule, int, int]:
    from .jit import default_cache_dir

    module = ir.Module(name="onnxsat_runner")
    gen = _Gen(module)
    gen.run_graph()
    gen.worker()
    compiled = CompiledModule(module, default_cache_dir())
    return compiled, compiled.address("onnxsat_run_graph"), compiled.address("onnxsat_worker")


@functools.cache
def _libc_address(name: str) -> int:
    return int(ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0)


def function_address(fn: object) -> int:
    """Entry address of a ctypes function (CFUNCTYPE object or a library function)."""
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)  # type: ignore[arg-type]


def float_word(value: float, dtype: str) -> int:
    """A float argument as the int64 word a task row stores (float32 bits, or float64 bits)."""
    if dtype == "f32":
        return int(np.array(value, np.float32).view(np.int32))
    return int(np.array(value, np.float64).view(np.int64))


class TaskTable:
    """Steps as rows of ``TASK_WORDS`` words, and one call that runs them all natively."""

    def __init__(self, steps: Sequence[Sequence[Sequence[int]]]):
        rows = [list(task) for step in steps for task in step]
        if any(len(r) > TASK_WORDS for r in rows):
            raise ValueError("task row too long")
        self.tasks = np.zeros((max(len(rows), 1), TASK_WORDS), np.int64)
        for i, row in enumerate(rows):
            self.tasks[i, : len(row)] = row
        self.step_ends = np.cumsum([len(step) for step in steps if len(step)], dtype=np.int64)
        self.widest = max((len(step) for step in steps), default=0)
        self.ctx = np.zeros(CTX_WORDS + 8, np.int64)
        _, run_address, worker_address = _runtime()
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._run = ctypes.CFUNCTYPE(None, ptr, ptr, ptr, i64, i64)(run_address)
        self._worker = ctypes.CFUNCTYPE(None, ptr, ptr, i64)(worker_address)

    def _ctx_address(self) -> int:
        base = self.ctx.ctypes.data
        return base + (-base) % 64

    def run(self, pool: object, helpers: int) -> None:
        """All steps, on this thread and up to ``helpers`` threads of ``pool`` (a ThreadPoolExecutor)."""
        from .blas import restore_blas_threads, single_threaded_blas

        start = self._ctx_address()
        ctypes.memset(start, 0, CTX_WORDS * 8)
        tasks = self.tasks.ctypes.data
        yield_fn, sleep_fn = _libc_address("sched_yield"), _libc_address("usleep")
        # before any helper starts: this OpenBLAS build keeps the "thread-local" count process-wide
        previous = single_threaded_blas()
        futures = []
        if pool is not None and self.widest > 1:

            def help_out() -> None:
                single_threaded_blas()
                self._worker(start, tasks, sleep_fn)

            futures = [pool.submit(help_out) for _ in range(min(helpers, self.widest - 1))]  # type: ignore[attr-defined]
        try:
            self._run(start, tasks, self.step_ends.ctypes.data, len(self.step_ends), yield_fn)
        finally:
            ctypes.c_int64.from_address(start + STOP * 8).value = 1
            for future in futures:
                if not future.cancel():
                    future.result()
            restore_blas_threads(previous)
