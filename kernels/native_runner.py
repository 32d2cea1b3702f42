"""One native entry point that runs a whole compiled program: a task table walked by LLVM code.

Every step of a program becomes a few *tasks* (a kernel over a ``[begin, end)`` range, a packed
GEMM over a range of column panels, a BLAS call), each a row of ``TASK_WORDS`` int64 words:
``[kind, function address, arguments...]``. ``onnxsat_run_graph`` walks the steps in order; the
tasks of one step are shared between the calling thread and the helper threads through an
atomic task counter, and a step ends when the completed-task counter reaches its last task. So a
whole inference is one ctypes call (GIL released), with no Python hop per kernel.

Helper threads (``NativeWorkers``) are started once per compiled model and stay in
``onnxsat_worker`` for its lifetime: a run opens itself by publishing a new generation in the
entry word, parked helpers join it with a compare-and-swap (counted in the same word), spin
between steps (``pause``, then ``sched_yield``) and leave when the run stops; the run closes the entry
word when it ends, and the next run waits for the joined count to reach zero before it starts. Between runs a helper spins
for about two milliseconds, then parks on a futex. Task indices grow monotonically over a run, so a helper that
looks late can never run a task of the wrong step: it only takes an index below the published
limit, with a compare-and-swap.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from llvmlite import ir

from .jit import LoadedObjects, support_code
from .llvm_loops import for_range, spin_while

TASK_WORDS = 16
KIND_KERNEL, KIND_PACKED_GEMM, KIND_SGEMM, KIND_DGEMM, KIND_ROWS_GEMM, KIND_BLOCKED_GEMM = 0, 1, 2, 3, 4, 5
CTX_WORDS = 80
"""Run state, one word per 64-byte line: next task, done tasks, step limit, stop flag; the entry
word (open run's generation << GEN_SHIFT | helpers joined), the futex word, parked helpers, the
shutdown flag, the open run's task table, the parked helpers' futex timeout, and how long an idle
helper spins."""
NEXT, DONE, LIMIT, STOP, ENTRY, SEQ, SLEEPERS, SHUTDOWN, TASKS = 0, 8, 16, 24, 32, 40, 48, 56, 64
TIMESPEC = 72
IDLE_SPINS = 74
"""Word holding the ``pause`` rounds an idle helper spins before it parks (``SPINS_BEFORE_PARK``;
a benchmark sets it per model to compare values in one process)."""
STAMPS, CLOCK = 76, 77
"""A profiled run's words: where the calling thread writes ``CLOCK_MONOTONIC`` nanoseconds when
the run opens and as each step ends (0: not profiled), and the address of ``clock_gettime``."""
CLOCK_MONOTONIC = 1
GEN_SHIFT = 16
SPINS_BEFORE_YIELD = 64
HELPER_SPINS_BEFORE_YIELD = 1000
"""``pause`` rounds (~50-70 us) an idle helper spins inside a run before it calls ``sched_yield``
between polls: it stays awake through serial steps, yet gives way at once to any thread that
needs its core. (It used to sleep in ``usleep(20)`` steps: on this 2-vCPU VM each sleep idles
the vCPU, which wakes late; MobileNetV3-small, the run after a settled onnxruntime block, three
alternating processes each: 6.1-6.6 ms with the sleep, 4.1-4.4 ms with the yield.)"""
SPINS_BEFORE_PARK = 100_000
"""``pause`` rounds (~2 ms here: ~20 ns each) a helper spins after a run before it parks on the
futex; an idle model then costs nothing. A helper that parked answers the next runs late on this
VM (its vCPU idles): in ``benchmarks/helper_idle_ab.py``'s pattern (0.2 s pause, one untimed call,
five timed), one process, 20 interleaved rounds, 2,000 rounds (~40 us) against 50,000 / 100,000 /
200,000: MobileNetV3-small 3.86 -> 2.54 / 2.53 / 2.38 ms, ShuffleNetV2 5.05 -> 3.02 / 3.19 /
2.99 ms (onnxruntime 2.64 and 3.62 ms in the same rounds). Polling with ``sched_yield`` instead
helped less (10 ms of it: 2.48 ms; 4 ms of pausing: 2.09 ms). onnxruntime's workers spin too."""
PARK_TIMEOUT_NS = 100_000_000
"""A parked helper re-checks at least this often (a lost wake-up cannot hang a run or a close)."""
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129

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
        case(KIND_ROWS_GEMM, [I64] * 14, plain)
        case(KIND_BLOCKED_GEMM, [I64] * 13, plain)
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

    def _backoff(self, b: ir.IRBuilder, spins_slot: ir.Value, yield_fn: ir.Value, spins_first: int = SPINS_BEFORE_YIELD) -> None:
        """``pause`` for ``spins_first`` rounds, then ``yield_fn()`` (``sched_yield``: a descheduled
        peer may need the core) each round."""
        fn = b.function
        spins = b.add(b.load(spins_slot), ir.Constant(I64, 1))
        b.store(spins, spins_slot)
        yield_block = fn.append_basic_block("backoff.yield")
        pause_block = fn.append_basic_block("backoff.pause")
        after = fn.append_basic_block("backoff.after")
        b.cbranch(b.icmp_signed(">", spins, ir.Constant(I64, spins_first)), yield_block, pause_block)
        b.position_at_end(yield_block)
        b.call(b.inttoptr(yield_fn, ir.FunctionType(I32, []).as_pointer()), [])
        b.branch(after)
        b.position_at_end(pause_block)
        b.call(self.pause, [])
        b.branch(after)
        b.position_at_end(after)

    def _steps(
        self, b: ir.IRBuilder, fn: ir.Function, ctx: ir.Value, tasks: ir.Value, step_ends: ir.Value, steps: ir.Value, yield_fn: ir.Value, stamps: tuple[ir.Value, ir.Value]
    ) -> None:
        """Every step in order: publish its last task, take tasks, wait for those helpers took
        (and, in a profiled run, note the time it ended)."""
        step_slot = b.alloca(I64)
        spins_slot = b.alloca(I64)

        def step(s: ir.Value) -> None:
            end = b.load(b.gep(step_ends, [s]))
            b.store_atomic(end, self._at(b, ctx, LIMIT), "seq_cst", 8)
            self._drain(b, fn, ctx, tasks)
            # wait for tasks a helper took and is still running
            b.store(ir.Constant(I64, 0), spins_slot)
            spin_while(
                b,
                lambda: b.icmp_signed("<", b.load_atomic(self._at(b, ctx, DONE), "seq_cst", 8), end),
                lambda: self._backoff(b, spins_slot, yield_fn),
                blocks=("wait", "spin", "step.next"),
            )
            self._stamp(b, ctx, *stamps, b.add(s, ir.Constant(I64, 1)))

        blocks = ("step.head", "step.body", "finish")
        for_range(b, step_slot, ir.Constant(I64, 0), steps, ir.Constant(I64, 1), step, blocks=blocks, nsw=False)

    def _stamp(self, b: ir.IRBuilder, ctx: ir.Value, stamps: ir.Value, spec: ir.Value, index: ir.Value) -> None:
        """``stamps[index] = clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (``spec``: a two-word
        timespec slot), when ``stamps`` is set."""
        with b.if_then(b.icmp_unsigned("!=", stamps, ir.Constant(I64, 0))):
            clock = b.inttoptr(b.load(self._at(b, ctx, CLOCK)), ir.FunctionType(I32, [I32, P64]).as_pointer())
            b.call(clock, [ir.Constant(I32, CLOCK_MONOTONIC), b.bitcast(spec, P64)])
            seconds = b.load(b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
            nanos = b.load(b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
            total = b.add(b.mul(seconds, ir.Constant(I64, 1_000_000_000)), nanos)
            b.store(total, b.gep(b.inttoptr(stamps, P64), [index]))

    @staticmethod
    def _at(b: ir.IRBuilder, ctx: ir.Value, word: int) -> ir.Value:
        return b.gep(ctx, [ir.Constant(I64, word)])

    def _futex(self, b: ir.IRBuilder, syscall_fn: ir.Value, ctx: ir.Value, op: int, value: ir.Value, timeout: ir.Value) -> None:
        """``syscall(SYS_futex, &ctx[SEQ], op, value, timeout)`` on the low 32 bits of the SEQ word."""
        fty = ir.FunctionType(I64, [I64], var_arg=True)
        callee = b.inttoptr(syscall_fn, fty.as_pointer())
        address = b.ptrtoint(self._at(b, ctx, SEQ), I64)
        b.call(callee, [ir.Constant(I64, SYS_FUTEX), address, ir.Constant(I64, op), value, timeout])

    def _wake_all(self, b: ir.IRBuilder, ctx: ir.Value, syscall_fn: ir.Value, always: bool) -> None:
        """Bump the futex word; wake the helpers parked on it (when some are, unless ``always``)."""
        b.atomic_rmw("add", self._at(b, ctx, SEQ), ir.Constant(I64, 1), "seq_cst")
        wake = ir.Constant(I64, 0x7FFFFFFF)
        if always:
            self._futex(b, syscall_fn, ctx, FUTEX_WAKE_PRIVATE, wake, ir.Constant(I64, 0))
            return
        sleepers = b.load_atomic(self._at(b, ctx, SLEEPERS), "seq_cst", 8)
        with b.if_then(b.icmp_signed(">", sleepers, ir.Constant(I64, 0))):
            self._futex(b, syscall_fn, ctx, FUTEX_WAKE_PRIVATE, wake, ir.Constant(I64, 0))

    def run_graph(self) -> None:
        """``run_graph(ctx, tasks, step_ends, steps, yield_fn, syscall_fn, generation)``: wait until
        every helper that joined the previous run has left it (so the counters may be reset; a
        helper leaves within one sleep of that run's end, so this rarely waits), open run
        ``generation`` to the parked helpers, every step in order, then stop and close the run.
        A helper still inside the closed run takes no task: every index is then taken."""
        fty = ir.FunctionType(ir.VoidType(), [P64, P64, P64, I64, I64, I64, I64])
        fn = ir.Function(self.module, fty, "onnxsat_run_graph")
        ctx, tasks, step_ends, steps, yield_fn, syscall_fn, generation = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        spins_slot = b.alloca(I64)
        spec = b.alloca(ir.ArrayType(I64, 2))
        b.store(ir.Constant(I64, 0), spins_slot)
        spin_while(  # helpers that joined the previous run have not all left it yet
            b,
            lambda: b.icmp_signed("!=", b.load_atomic(self._at(b, ctx, ENTRY), "seq_cst", 8), ir.Constant(I64, 0)),
            lambda: self._backoff(b, spins_slot, yield_fn),
            blocks=("enter.wait", "enter.spin", "enter.ready"),
        )
        for word in (NEXT, DONE, LIMIT, STOP):
            b.store_atomic(ir.Constant(I64, 0), self._at(b, ctx, word), "seq_cst", 8)
        b.store_atomic(b.ptrtoint(tasks, I64), self._at(b, ctx, TASKS), "seq_cst", 8)
        b.store_atomic(b.shl(generation, ir.Constant(I64, GEN_SHIFT)), self._at(b, ctx, ENTRY), "seq_cst", 8)
        self._wake_all(b, ctx, syscall_fn, always=False)
        stamps = b.load(self._at(b, ctx, STAMPS))
        self._stamp(b, ctx, stamps, spec, ir.Constant(I64, 0))
        self._steps(b, fn, ctx, tasks, step_ends, steps, yield_fn, (stamps, spec))
        b.store_atomic(ir.Constant(I64, 1), self._at(b, ctx, STOP), "seq_cst", 8)
        b.atomic_rmw("and", self._at(b, ctx, ENTRY), ir.Constant(I64, (1 << GEN_SHIFT) - 1), "seq_cst")
        b.ret_void()

    def helper(self) -> ir.Function:
        """``help(ctx, tasks, yield_fn)``: help with one run's tasks until it sets the stop flag. An
        idle helper yields (``sched_yield``) between polls after a short spin: a thread that only
        spins through a long serial step would keep a core from other work on a loaded machine and
        be preempted while holding a task, which the whole step then waits for."""
        fty = ir.FunctionType(ir.VoidType(), [P64, P64, I64])
        fn = ir.Function(self.module, fty, "onnxsat_help")
        fn.linkage = "internal"
        ctx, tasks, yield_fn = fn.args
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        spins_slot = b.alloca(I64)
        b.store(ir.Constant(I64, 0), spins_slot)
        head = fn.append_basic_block("help.head")
        work = fn.append_basic_block("help.work")
        leave = fn.append_basic_block("help.leave")
        b.branch(head)
        b.position_at_end(head)
        stop = b.load_atomic(self._at(b, ctx, STOP), "seq_cst", 8)
        b.cbranch(b.icmp_signed("!=", stop, ir.Constant(I64, 0)), leave, work)
        b.position_at_end(work)
        before = b.load_atomic(self._at(b, ctx, DONE), "seq_cst", 8)
        self._drain(b, fn, ctx, tasks)
        after = b.load_atomic(self._at(b, ctx, DONE), "seq_cst", 8)
        idle = fn.append_basic_block("help.idle")
        busy = fn.append_basic_block("help.busy")
        b.cbranch(b.icmp_signed("==", before, after), idle, busy)
        b.position_at_end(busy)
        b.store(ir.Constant(I64, 0), spins_slot)
        b.branch(head)
        b.position_at_end(idle)
        self._backoff(b, spins_slot, yield_fn, spins_first=HELPER_SPINS_BEFORE_YIELD)
        b.branch(head)
        b.position_at_end(leave)
        b.ret_void()
        return fn

    def worker(self) -> None:
        """``worker(ctx, yield_fn, syscall_fn)``: a helper thread's whole life. It joins each newly
        opened run (a compare-and-swap on the entry word, which the run closes before it waits
        for the joined count to drop to zero), helps until the run stops, and between runs spins
        ``ctx[IDLE_SPINS]`` rounds, then parks on a futex (bounded wait) until the next run or shutdown;
        a wait that times out with no run parks again without spinning."""
        help_fn = self.helper()
        fty = ir.FunctionType(ir.VoidType(), [P64, I64, I64])
        fn = ir.Function(self.module, fty, "onnxsat_worker")
        ctx, yield_fn, syscall_fn = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        seen_slot = b.alloca(I64)
        spins_slot = b.alloca(I64)
        b.store(ir.Constant(I64, 0), seen_slot)
        b.store(ir.Constant(I64, 0), spins_slot)
        head = fn.append_basic_block("worker.head")
        check = fn.append_basic_block("worker.check")
        join = fn.append_basic_block("worker.join")
        joined = fn.append_basic_block("worker.joined")
        idle = fn.append_basic_block("worker.idle")
        leave = fn.append_basic_block("worker.leave")
        b.branch(head)
        b.position_at_end(head)
        shutdown = b.load_atomic(self._at(b, ctx, SHUTDOWN), "seq_cst", 8)
        b.cbranch(b.icmp_signed("!=", shutdown, ir.Constant(I64, 0)), leave, check)
        b.position_at_end(check)
        entry_word = b.load_atomic(self._at(b, ctx, ENTRY), "seq_cst", 8)
        gen = b.lshr(entry_word, ir.Constant(I64, GEN_SHIFT))
        fresh = b.and_(b.icmp_signed("!=", gen, ir.Constant(I64, 0)), b.icmp_signed("!=", gen, b.load(seen_slot)))
        b.cbranch(fresh, join, idle)
        b.position_at_end(join)
        pair = b.cmpxchg(self._at(b, ctx, ENTRY), entry_word, b.add(entry_word, ir.Constant(I64, 1)), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(pair, 1), joined, head)
        b.position_at_end(joined)
        b.store(gen, seen_slot)
        tasks = b.inttoptr(b.load_atomic(self._at(b, ctx, TASKS), "seq_cst", 8), P64)
        b.call(help_fn, [ctx, tasks, yield_fn])
        b.atomic_rmw("sub", self._at(b, ctx, ENTRY), ir.Constant(I64, 1), "seq_cst")
        b.store(ir.Constant(I64, 0), spins_slot)
        b.branch(head)
        b.position_at_end(idle)
        spins = b.add(b.load(spins_slot), ir.Constant(I64, 1))
        b.store(spins, spins_slot)
        pause = fn.append_basic_block("worker.pause")
        park = fn.append_basic_block("worker.park")
        limit = b.load_atomic(self._at(b, ctx, IDLE_SPINS), "monotonic", 8)
        b.cbranch(b.icmp_signed("<", spins, limit), pause, park)
        b.position_at_end(pause)
        b.call(self.pause, [])
        b.branch(head)
        b.position_at_end(park)
        # announce the sleeper, then re-check: a run opened after this check bumps SEQ, so the
        # futex wait returns at once or is woken (the opener reads SLEEPERS after its bump)
        b.atomic_rmw("add", self._at(b, ctx, SLEEPERS), ir.Constant(I64, 1), "seq_cst")
        seq = b.load_atomic(b.bitcast(self._at(b, ctx, SEQ), I32.as_pointer()), "seq_cst", 4)
        again = b.load_atomic(self._at(b, ctx, ENTRY), "seq_cst", 8)
        again_gen = b.lshr(again, ir.Constant(I64, GEN_SHIFT))
        stale = b.or_(b.icmp_signed("==", again_gen, ir.Constant(I64, 0)), b.icmp_signed("==", again_gen, b.load(seen_slot)))
        quiet = b.icmp_signed("==", b.load_atomic(self._at(b, ctx, SHUTDOWN), "seq_cst", 8), ir.Constant(I64, 0))
        with b.if_then(b.and_(stale, quiet)):
            timeout = b.ptrtoint(self._at(b, ctx, TIMESPEC), I64)
            self._futex(b, syscall_fn, ctx, FUTEX_WAIT_PRIVATE, b.zext(seq, I64), timeout)
        b.atomic_rmw("sub", self._at(b, ctx, SLEEPERS), ir.Constant(I64, 1), "seq_cst")
        # the spin count is not reset: woken by a run, the helper joins it (and spins again after
        # it); woken by the timeout, it parks again at once. (Spinning again after every timeout
        # kept each idle model's helpers busy for the idle spin in every PARK_TIMEOUT_NS: ~5% of
        # a core per helper, 130 idle calibration models slowing a run four times.)
        b.branch(head)
        b.position_at_end(leave)
        b.ret_void()

    def shutdown(self) -> None:
        """``shutdown(ctx, syscall_fn)``: tell every helper to leave and wake the parked ones."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64, I64]), "onnxsat_shutdown")
        ctx, syscall_fn = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store_atomic(ir.Constant(I64, 1), self._at(b, ctx, SHUTDOWN), "seq_cst", 8)
        self._wake_all(b, ctx, syscall_fn, always=True)
        b.ret_void()


@functools.cache
def runtime(cache_dir: Path | None) -> tuple[LoadedObjects, dict[str, int]]:
    """The runner's functions (loaded once per process and cache directory; the object cached on
    disk under the sources' fingerprint)."""

    def build() -> ir.Module:
        module = ir.Module(name="onnxsat_runner")
        gen = _Gen(module)
        gen.run_graph()
        gen.worker()
        gen.shutdown()
        return module

    compiled = support_code("runner", build, cache_dir)
    names = ("onnxsat_run_graph", "onnxsat_worker", "onnxsat_shutdown")
    return compiled, {name: compiled.address(name) for name in names}


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


def _aligned_ctx() -> tuple[np.ndarray, int]:
    """A zeroed run-state block and its 64-byte aligned address."""
    ctx = np.zeros(CTX_WORDS + 8, np.int64)
    base = ctx.ctypes.data
    start = base + (-base) % 64
    ctypes.c_int64.from_address(start + (TIMESPEC + 1) * 8).value = PARK_TIMEOUT_NS
    ctypes.c_int64.from_address(start + IDLE_SPINS * 8).value = SPINS_BEFORE_PARK
    return ctx, start


def _serve(worker: Callable[[int, int, int], None], start: int) -> None:
    """A helper thread's body: native code until shutdown. (BLAS is made single-threaded by each
    run on the calling thread: numpy's OpenBLAS keeps that "thread-local" count process-wide, so a
    setting made here would outlive the run.)"""
    worker(start, _libc_address("sched_yield"), _libc_address("syscall"))


def _shutdown(stop: Callable[[int, int], None], start: int, threads: list[threading.Thread], ctx: np.ndarray) -> None:
    stop(start, _libc_address("syscall"))
    for thread in threads:
        thread.join()
    del ctx  # kept alive until every helper has left


class NativeWorkers:
    """Helper threads that live as long as their owner (a compiled model): started once, parked
    in native code between runs, and joined by ``close`` (or when the owner is collected)."""

    def __init__(self, helpers: int, cache_dir: Path | None):
        """``cache_dir``: the object cache the runner's own code is compiled through (None: none)."""
        _, addresses = runtime(cache_dir)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        worker = ctypes.CFUNCTYPE(None, ptr, i64, i64)(addresses["onnxsat_worker"])
        stop = ctypes.CFUNCTYPE(None, ptr, i64)(addresses["onnxsat_shutdown"])
        self.ctx, self.start = _aligned_ctx()
        self.generation = 0
        self.threads = [
            threading.Thread(target=_serve, args=(worker, self.start), name=f"onnxsat-native-{i}", daemon=True)
            for i in range(helpers)
        ]
        for thread in self.threads:
            thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, stop, self.start, self.threads, self.ctx)

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation

    def close(self) -> None:
        """Stop and join the helper threads (idempotent)."""
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive


class TaskTable:
    """Steps as rows of ``TASK_WORDS`` words, and one call that runs them all natively."""

    def __init__(self, steps: Sequence[Sequence[Sequence[int]]], cache_dir: Path | None):
        rows = [list(task) for step in steps for task in step]
        if any(len(r) > TASK_WORDS for r in rows):
            raise ValueError("task row too long")
        self.tasks = np.zeros((max(len(rows), 1), TASK_WORDS), np.int64)
        for i, row in enumerate(rows):
            self.tasks[i, : len(row)] = row
        self.step_ends = np.cumsum([len(step) for step in steps if len(step)], dtype=np.int64)
        self.widest = max((len(step) for step in steps), default=0)
        self.ctx, self._ctx_start = _aligned_ctx()
        """Run state for runs without helpers."""
        _, addresses = runtime(cache_dir)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._run = ctypes.CFUNCTYPE(None, ptr, ptr, ptr, i64, i64, i64, i64)(addresses["onnxsat_run_graph"])

    def run(self, workers: NativeWorkers | None, stamps: np.ndarray | None = None) -> None:
        """All steps, on this thread and the parked helper threads of ``workers`` (one run at a
        time per ``workers``: the caller serializes). ``stamps`` (int64, one more than the steps):
        receives the monotonic clock in nanoseconds as the run opens and as each step ends."""
        from .blas import restore_blas_threads, single_threaded_blas

        if workers is not None and workers.alive and self.widest > 1:
            start, generation = workers.start, workers.next_generation()
        else:
            start, generation = self._ctx_start, 1
        if stamps is not None:
            if stamps.dtype != np.int64 or stamps.size < len(self.step_ends) + 1 or not stamps.flags.c_contiguous:
                raise ValueError("stamps must be a contiguous int64 array of one more than the steps")
            ctypes.c_int64.from_address(start + CLOCK * 8).value = _libc_address("clock_gettime")
            ctypes.c_int64.from_address(start + STAMPS * 8).value = stamps.ctypes.data
        previous = single_threaded_blas()
        try:
            self._run(
                start, self.tasks.ctypes.data, self.step_ends.ctypes.data, len(self.step_ends),
                _libc_address("sched_yield"), _libc_address("syscall"), generation,
            )
        finally:
            restore_blas_threads(previous)
            if stamps is not None:
                ctypes.c_int64.from_address(start + STAMPS * 8).value = 0
