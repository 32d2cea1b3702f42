"""One compiled ``KernelProgram``: native kernels, BLAS calls and fallbacks over a planned arena.

A program whose steps are all native (kernels, packed GEMMs, BLAS calls) runs as one native call
over a task table (``native_runner``): inputs are copied into buffers the table points at, and
outputs copied out. Programs with numpy fallbacks run step by step from a Python loop (one
native call per kernel, GIL released, parallel ranges shared over the thread pool).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxsat.lowering.kernel_ir import NUMPY_DTYPES, Buffer
from onnxsat.lowering.program import (
    PACKED_GEMM_MAX_ROWS,
    FallbackStep,
    KernelProgram,
    KernelStep,
    MatMulStep,
    StridedOperand,
)

from .arena import ArenaPlan, plan_arena
from .blas import NO_TRANS, gemm_function, matrix_layout, restore_blas_threads, single_threaded_blas
from .build import BuildStats, cache_directory, compile_kernels
from .codegen import kernel_signature
from .compile_options import CompileOptions
from .jit import LoadedObjects
from .native_runner import (
    KIND_BLOCKED_GEMM,
    KIND_DGEMM,
    KIND_KERNEL,
    KIND_PACKED_GEMM,
    KIND_ROWS_GEMM,
    KIND_SGEMM,
    NativeWorkers,
    TaskTable,
    float_word,
    function_address,
)
from .parallel import parallel_pays

GEMM_SPLIT_FLOPS = 200_000.0
"""GEMM steps below this many FLOPs run on one thread (see ``parallel.PARALLEL_MIN_COST``)."""
CHUNKS_PER_THREAD = 1
"""Parallel work is cut into this many chunks per thread, taken from a shared queue. Each task
costs a few cache-line transfers between the cores (the task counter, the done counter): four
chunks per thread against one, two threads, in-process A/B, 20 interleaved rounds: one was faster
on all eleven corpus models tried (MobileNetV3-small x1.05-1.07, Whisper-tiny x1.04, ResNet-18
x1.02; 4.4 tasks per step on MobileNet, half of them on a few microseconds of work)."""
ROWS_CHUNKS_PER_THREAD = 8
"""At most this many chunks per thread for an implicit conv's or a 1x1 conv's product
(``_rows_runner``): its tasks are whole 48-column panels of equal cost, so finer chunks even out
the threads' shares of a large product (ResNet's 28 x 28 3x3 conv, 17 panels: 9 / 8 per thread
in chunks of 3; two threads 1.23 -> 1.15 ms, 56 x 56 x1.04)."""
ROWS_FLOPS_PER_CHUNK = 5e6
"""Below ``ROWS_CHUNKS_PER_THREAD``, a product gets one chunk per thread per this many FLOPs
(about 25 us of work). Against always eight, two threads, in-process A/B: MobileNetV3-small
x1.06 (its products of a few MFLOPs as two tasks, not sixteen), ResNet-18, RegNet, EfficientNet
and ShuffleNet ties; 10 MFLOPs cost RegNet 4%, 3 MFLOPs ShuffleNet 3%."""
L2_RESIDENT_A_BYTES = 1 << 20
"""A split packed GEMM whose A fits in this much of L2 (2 MiB per core here) runs one column panel
per task: every panel reads the same A (from L2) and its own weights once, so a task's cost does
not depend on its width and single panels only shrink the step's tail (the last task one thread
runs while the other has nothing left). A larger A is reread from L3 by each task, so it keeps
``CHUNKS_PER_THREAD`` wider tasks per thread (or, where A outweighs the weights, row strips)."""


def _chunks(extent: int, parts: int) -> list[tuple[int, int]]:
    """``[0, extent)`` in about ``parts`` ranges (as many as ceil-sized chunks make: no more tasks,
    which small kernels feel) whose sizes differ by at most one, the larger first, so threads
    taking them from a queue end together. Ceil-sized chunks left a short last one (ResNet's
    56 x 56 conv, 66 panels in chunks of 5: 35 / 31 panels per thread, now 33 / 33)."""
    parts = -(-extent // max(1, -(-extent // max(parts, 1))))
    size, extra = divmod(extent, max(parts, 1))
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [(b, e) for b, e in itertools.pairwise(bounds) if e > b]


def _tail_split_by_rows(units: list[tuple[int, int, int, int]], threads: int, mr: int) -> list[tuple[int, int, int, int]]:
    """One-panel GEMM tasks ``(row0, rows, p0, p1)`` with the panels that do not divide evenly over
    ``threads`` cut by rows into ``threads`` parts each, queued last: ResNet's 7 x 7 convs have 11
    panels of 512 output channels, which two threads ran as 6 / 5 panels; now 5.5 / 5.5 (each part
    reads its panel's weights again, once per part). Parts are whole ``mr``-row strips."""
    left = len(units) % threads
    rows = units[0][1]
    if not left or len(units) < threads or rows < 2 * mr:
        return units
    strips = -(-rows // mr)
    tail: list[tuple[int, int, int, int]] = []
    for _, _, p0, p1 in units[len(units) - left :]:
        for s0, s1 in _chunks(strips, threads):
            r0 = s0 * mr
            tail.append((r0, min(rows, s1 * mr) - r0, p0, p1))
    return units[: len(units) - left] + tail


def share_work(pool: ThreadPoolExecutor, threads: int, tasks: list[Callable[[], None]]) -> None:
    """Run ``tasks`` on this thread and up to ``threads - 1`` pool threads, taking them from a
    shared queue. The caller never waits for a pool thread that has not started: once the queue
    is empty, helpers still pending are cancelled, so a descheduled helper costs nothing."""
    lock = threading.Lock()
    queue = iter(tasks)

    def drain() -> None:
        while True:
            with lock:
                task = next(queue, None)
            if task is None:
                return
            task()

    helpers = [pool.submit(drain) for _ in range(min(threads - 1, len(tasks) - 1))]
    drain()
    for helper in helpers:
        if not helper.cancel():
            helper.result()


@dataclass
class ExecutableStats:
    kernels: int = 0
    blas_calls: int = 0
    fallback_steps: int = 0
    arena_bytes: int = 0
    arena_naive_bytes: int = 0
    compile_seconds: float = 0.0
    cache_hit: bool = False
    fallbacks: dict[str, int] = field(default_factory=dict)
    native_ops: dict[str, int] = field(default_factory=dict)
    one_native_call: bool = False
    """Whether a run is a single native call over the task table (no Python step loop)."""
    artefact_hit: bool = False
    """Whether the whole compiled code came from the artefact cache (no LLVM IR built)."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Compile time by stage: hash (artefact key), lower, llvm_ir, llvm_compile, load, support (the
    shared runner and GEMM code: compiled on a cold cache only), setup (task tables, packing)."""


class Executable:
    """Runs one lowered program for fixed input shapes."""

    def __init__(
        self,
        program: KernelProgram,
        pool: ThreadPoolExecutor | None,
        options: CompileOptions,
        module: LoadedObjects | None = None,
        symbols: dict[str, str] | None = None,
        workers: NativeWorkers | None = None,
        artefact_key: str | None = None,
    ):
        """``options``: threads, GEMM choice, optimization level and cache. ``workers``: the owner's
        persistent helper threads for native runs (None: this thread only). ``module``/``symbols``:
        already compiled code holding this program's kernels and each kernel's function name in it
        (programs can share one, see ``compile_together``); by default the kernels are compiled
        here, found under ``artefact_key`` in the artefact cache when given."""
        start = time.perf_counter()
        self.options = options
        self.cache_dir = cache_directory(options)
        self.gemm = options.gemm
        """``llvm``: the packed micro-kernel for products with constant weights; ``blas``: OpenBLAS only."""
        self._keep: list[Any] = []
        self._tasks: list[list[list[int]] | None] = []
        """Per step, its native task rows (None: the step needs Python)."""
        self.program = program
        self.pool = pool
        self.threads = options.run_threads
        self.workers = workers
        kernels = [s.kernel for s in program.steps if isinstance(s, KernelStep)]
        self.build = BuildStats()
        variants = _gemm_variants(program, options)
        if module is None and kernels:
            from .gemm import support_modules

            # the micro-kernel variants are compiled with the kernels on a cold cache (the native
            # runner, 0.1 s, is loaded before, as the model's helper threads start)
            module, symbols, self.build = compile_kernels(kernels, options, artefact_key, support_modules(variants))
        self.module = module
        mark = time.perf_counter()
        _support_code(variants, self.cache_dir)
        self.build.seconds["support"] = time.perf_counter() - mark
        self.symbols = symbols if symbols is not None else {k.name: k.name for k in kernels}
        proto = kernel_signature()
        addresses = {sym: module.address(sym) for sym in set(self.symbols.values())} if module else {}
        self.functions = {k.name: proto(addresses[self.symbols[k.name]]) for k in kernels}
        io = {b.name for _, b in program.inputs} | {b.name for _, b in program.outputs} | set(program.constants)
        self.plan: ArenaPlan = plan_arena(program.steps, io, program.pinned)
        self.arena = np.zeros(self.plan.size + 64, dtype=np.uint8)  # zeroed: the pinned buffers' padding
        base = self.arena.ctypes.data
        shift = (-base) % 64
        self.fixed: dict[str, np.ndarray] = {}
        for name, value in program.constants.items():
            self.fixed[name] = np.ascontiguousarray(value)
        for buf in program.buffers().values():
            if buf.name in self.plan.offsets:
                off = shift + self.plan.offsets[buf.name]
                view = self.arena[off : off + buf.nbytes].view(NUMPY_DTYPES[buf.dtype])
                self.fixed[buf.name] = view.reshape(buf.shape)
        self.io: dict[str, np.ndarray] = {}
        """Graph inputs and outputs at fixed addresses, for the native task table."""
        for _, buf in program.inputs + program.outputs:
            if buf.name not in self.fixed and buf.name not in self.io:
                self.io[buf.name] = _aligned_empty(buf.shape, NUMPY_DTYPES[buf.dtype])
        self.output_views = {
            name: program.output_views[name].of(self.io[buf.name])
            for name, buf in program.outputs
            if name in program.output_views
        }
        """The graph outputs that are views of their buffers, made once (a strided view costs
        microseconds to build)."""
        self.runners: list[Callable[[dict[str, np.ndarray]], None]] = [self._runner(s) for s in program.steps]
        self.native: TaskTable | None = None
        self.phase_steps: list[list[int]] = []
        if self._tasks and all(t is not None for t in self._tasks):
            self.native = TaskTable(self._phases([t for t in self._tasks if t is not None]), self.cache_dir)
        self.stats = ExecutableStats(
            kernels=len(kernels),
            blas_calls=sum(isinstance(s, MatMulStep) for s in program.steps),
            fallback_steps=sum(isinstance(s, FallbackStep) for s in program.steps),
            arena_bytes=self.plan.size,
            arena_naive_bytes=self.plan.naive_size,
            compile_seconds=0.0,
            cache_hit=bool(self.module and self.module.cache_hit),
            artefact_hit=self.build.artefact_hit,
            fallbacks=dict(program.fallbacks),
            native_ops=dict(program.native_ops),
            one_native_call=self.native is not None,
        )
        self.stats.compile_seconds = time.perf_counter() - start
        self.stats.stage_seconds = dict(self.build.seconds)
        self.stats.stage_seconds["setup"] = self.stats.compile_seconds - sum(self.build.seconds.values())

    # ------------------------------------------------------------ per-step runners
    def _runner(self, step: Any) -> Callable[[dict[str, np.ndarray]], None]:
        self._tasks.append(None)
        if isinstance(step, KernelStep):
            return self._kernel_runner(step)
        if isinstance(step, MatMulStep):
            return self._matmul_runner(step)
        return self._fallback_runner(step)

    def _phases(self, tasks: list[list[list[int]]]) -> list[list[list[int]]]:
        """Consecutive steps that touch disjoint memory (no step reads or writes what another
        writes; arena reuse makes names unreliable, so byte ranges decide) share one phase: one
        wait instead of one per step, and threads take the next step's tasks while a slow task of
        the previous one finishes (BERT's Q, K and V products become one phase)."""
        phases: list[list[list[int]]] = []
        members: list[list[int]] = []
        reads: list[tuple[int, int]] = []
        writes: list[tuple[int, int]] = []
        for index, (step, step_tasks) in enumerate(zip(self.program.steps, tasks, strict=True)):
            r, w = self._ranges(step)
            if phases and not _overlap(w, reads + writes) and not _overlap(r, writes):
                phases[-1].extend(step_tasks)
                members[-1].append(index)
            else:
                phases.append(list(step_tasks))
                members.append([index])
                reads, writes = [], []
            reads += r
            writes += w
        self.phase_steps = [m for m, p in zip(members, phases, strict=True) if p]
        """The program steps of each phase the task table runs (phases without tasks dropped)."""
        return phases

    def _ranges(self, step: Any) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Byte ranges a native step reads and writes."""
        def span(buf: Buffer) -> tuple[int, int]:
            start = self._address(buf.name)
            return start, start + buf.nbytes

        if isinstance(step, KernelStep):
            outs = set(step.kernel.outputs)
            return [span(b) for b in step.kernel.params if b.name not in outs], [span(b) for b in step.kernel.params if b.name in outs]
        read = [span(b) for b in step.operands()] + ([span(step.out)] if step.beta else [])
        return read, [span(step.out)]

    def _address(self, name: str) -> int:
        """Where buffer ``name`` lives during a native run."""
        return int((self.io[name] if name in self.io else self.fixed[name]).ctypes.data)

    def _kernel_runner(self, step: KernelStep) -> Callable[[dict[str, np.ndarray]], None]:
        kernel = step.kernel
        fn = self.functions[kernel.name]
        names = [b.name for b in kernel.params]
        n = len(names)
        extent = kernel.parallel_extent
        parallel = self.pool is not None and self.threads > 1 and parallel_pays(kernel)
        chunks = _chunks(extent, CHUNKS_PER_THREAD * self.threads) if parallel else [(0, extent)]
        pool = self.pool
        fixed_args = (ctypes.c_void_p * n)(*[self._address(name) for name in names])
        self._keep.append(fixed_args)
        address = function_address(fn)
        self._tasks[-1] = [[KIND_KERNEL, address, ctypes.addressof(fixed_args), b, e] for b, e in chunks]

        def run(arrays: dict[str, np.ndarray]) -> None:
            args = (ctypes.c_void_p * n)(*[arrays[name].ctypes.data for name in names])
            if len(chunks) == 1:
                fn(args, 0, extent)
                return
            assert pool is not None
            share_work(pool, self.threads, [functools.partial(fn, args, b, e) for b, e in chunks])

        return run

    def _matmul_runner(self, step: MatMulStep) -> Callable[[dict[str, np.ndarray]], None]:
        if step.blocked is not None:
            return self._blocked_runner(step)
        gemm = gemm_function(step.out.dtype)
        out_shape = step.out.shape if step.c_rows is None else step.c_rows.shape
        batch = out_shape[:-2]
        m, n = out_shape[-2:]
        k = step.a.shape[-1]
        itemsize = NUMPY_DTYPES[step.out.dtype].itemsize

        def batch_offsets(op: StridedOperand) -> list[int]:
            lead = len(batch) - (len(op.shape) - 2)
            strides = (0,) * lead + op.strides[:-2]
            shape = (1,) * lead + op.shape[:-2]
            offs = []
            for idx in np.ndindex(*batch) if batch else [()]:
                offs.append(op.offset + sum((i if d != 1 else 0) * s for i, d, s in zip(idx, shape, strides, strict=True)))
            return offs

        a_offs, b_offs = batch_offsets(step.a), batch_offsets(step.b)
        a_layout, b_layout = _blas_layouts(step)
        alpha, beta = step.alpha, step.beta
        a_name, b_name, out_name = step.a.buffer.name, step.b.buffer.name, step.out.name
        a_buf, b_buf = step.a.buffer, step.b.buffer
        rows_of_c = step.c_rows is not None  # only the unpacked-B kernel and numpy store C's rows apart
        packed = self._packed_runner(step, a_offs, m, n, k, a_layout) if self.gemm == "llvm" and a_layout and b_layout and not rows_of_c else None
        if packed is None and self.gemm == "llvm":
            packed = self._rows_runner(step, a_offs, b_offs, m, n, k)
        if packed is not None:
            return packed
        if gemm is None or a_layout is None or b_layout is None or step.bias is not None or rows_of_c:
            # also an epilogue the packed GEMM could not take: numpy applies it (a Python step)
            bias_name, relu = (step.bias.name if step.bias else None), step.relu

            def run_numpy(arrays: dict[str, np.ndarray]) -> None:
                a = _strided(arrays[a_name], a_buf, step.a)
                if step.b_rows is not None:
                    flat = arrays[b_name].reshape(-1)
                    b = np.stack([step.b_rows.matrix(flat[off:], k, n) for off in b_offs]).reshape(*batch, k, n)
                else:
                    b = _strided(arrays[b_name], b_buf, step.b)
                if step.b_scale is not None:
                    b = b * arrays[step.b_scale.name].reshape(-1)[:, None]
                # a view: a batch may run as rows, C's rows may lie apart
                out = arrays[out_name].reshape(step.out.shape) if step.c_rows is None else _strided(arrays[out_name], step.out, step.c_rows)
                prod = np.matmul(a, b)
                if beta:
                    out *= beta
                    out += alpha * prod
                else:
                    np.multiply(prod, alpha, out=out) if alpha != 1.0 else np.copyto(out, np.broadcast_to(prod, out.shape))
                if bias_name is not None:
                    out += arrays[bias_name].reshape((-1, 1) if step.bias_rows else -1)
                if relu:
                    np.maximum(out, 0, out=out, where=~np.isnan(out))
                if step.activation == "silu":
                    out *= 1.0 / (1.0 + np.exp(-out))
                elif step.activation == "hardswish":
                    out *= np.clip(out / 6.0 + 0.5, 0.0, 1.0)

            return run_numpy
        (ta, lda), (tb, ldb) = a_layout, b_layout
        a_row, b_col = step.a.strides[-2], step.b.strides[-1]
        units = [(ao, bo, co, m, n) for ao, bo, co in zip(a_offs, b_offs, range(0, len(a_offs) * m * n, m * n), strict=True)]
        if len(units) < self.threads and 2.0 * m * n * k >= GEMM_SPLIT_FLOPS:
            # Too few matrices to feed the threads: cut each into row blocks, or into column blocks
            # when A has few rows (a 3-channel Conv's 3 x 144 @ 144 x 12544: one OpenBLAS call
            # took 11.7 ms single-threaded, eight column blocks 6.6 ms in all)
            split = []
            if m >= 2 * self.threads:
                rows = math.ceil(m / self.threads)
                for ao, bo, co, _, _ in units:
                    split += [(ao + r0 * a_row, bo, co + r0 * n, min(rows, m - r0), n) for r0 in range(0, m, rows)]
            else:
                cols = max(1, math.ceil(n / (CHUNKS_PER_THREAD * self.threads)))
                for ao, bo, co, _, _ in units:
                    split += [(ao, bo + c0 * b_col, co + c0, m, min(cols, n - c0)) for c0 in range(0, n, cols)]
            units = split
        parallel = self.pool is not None and self.threads > 1 and len(units) > 1 and 2.0 * m * n * k * len(a_offs) >= GEMM_SPLIT_FLOPS
        parts = [units[i :: CHUNKS_PER_THREAD * self.threads] for i in range(CHUNKS_PER_THREAD * self.threads)] if parallel else [units]
        parts = [p for p in parts if p]
        pool = self.pool
        kind = KIND_SGEMM if step.out.dtype == "f32" else KIND_DGEMM
        a_ptr, b_ptr, c_ptr = self._address(a_name), self._address(b_name), self._address(out_name)
        alpha_w, beta_w = float_word(alpha, step.out.dtype), float_word(beta, step.out.dtype)
        self._tasks[-1] = [
            [kind, function_address(gemm), 101, ta, tb, mm, nn, k, alpha_w, a_ptr + ao * itemsize, lda, b_ptr + bo * itemsize, ldb, beta_w, c_ptr + co * itemsize, n]
            for part in parts
            for ao, bo, co, mm, nn in part
        ]

        def work(arrays: dict[str, np.ndarray], part: list[tuple[int, int, int, int, int]]) -> None:
            single_threaded_blas()  # the caller's setting comes back at the end of ``run``
            pa, pb, pc = arrays[a_name].ctypes.data, arrays[b_name].ctypes.data, arrays[out_name].ctypes.data
            for ao, bo, co, mm, nn in part:
                gemm(101, ta, tb, mm, nn, k, alpha, pa + ao * itemsize, lda, pb + bo * itemsize, ldb, beta, pc + co * itemsize, n)

        def run(arrays: dict[str, np.ndarray]) -> None:
            if len(parts) == 1:
                work(arrays, parts[0])
                return
            assert pool is not None
            share_work(pool, self.threads, [functools.partial(work, arrays, part) for part in parts])

        return run

    def _packed_runner(
        self, step: MatMulStep, a_offs: list[int], m: int, n: int, k: int, a_layout: tuple[int, int]
    ) -> Callable[[dict[str, np.ndarray]], None] | None:
        """The LLVM micro-kernel for ``A @ W`` with a constant float32 weight W (packed here, once,
        with the epilogue's bias), split over threads by column panels; None when the step does not
        fit that form."""
        from .gemm import MR, pack_b, sgemm_function

        b_value = self.program.constants.get(step.b.buffer.name)
        a = step.a
        if b_value is None or step.out.dtype != "f32" or step.alpha != 1.0 or step.beta != 0.0 or len(step.b.shape) != 2:
            return None
        transposed, lda = a_layout  # a one-row A has lda k whatever its row stride (often 0, a broadcast)
        if transposed != NO_TRANS:
            return None
        # every leading (batch) index of A must continue its rows contiguously, so A is one M x K matrix
        rows = m * max(len(a_offs), 1)
        if any(off != a.offset + i * m * lda for i, off in enumerate(a_offs)):
            return None
        if rows > PACKED_GEMM_MAX_ROWS:
            return None
        b_matrix = _strided(np.asarray(b_value).reshape(-1), step.b.buffer, step.b).astype(np.float32)
        bias = None if step.bias is None else self.program.constants.get(step.bias.name)
        if step.bias is not None and bias is None:
            return None
        bp = pack_b(b_matrix, bias)
        panels = bp.shape[0]
        fn = sgemm_function(_packed_epilogue(step), self.cache_dir)
        itemsize = 4
        a_name, out_name = a.buffer.name, step.out.name
        a_offset = a.offset
        parallel = self.pool is not None and self.threads > 1 and panels > 1 and 2.0 * rows * n * k >= GEMM_SPLIT_FLOPS
        one_panel_tasks = rows * k * 4 <= L2_RESIDENT_A_BYTES
        ranges = _chunks(panels, panels if one_panel_tasks else CHUNKS_PER_THREAD * self.threads) if parallel else [(0, panels)]
        units = [(0, rows, p0, p1) for p0, p1 in ranges]
        if parallel and one_panel_tasks:
            units = _tail_split_by_rows(units, self.threads, MR)
        elif parallel and (panels % self.threads or rows > n) and rows >= 2 * MR * self.threads:
            # rows instead, every part all the panels: where the panels do not divide over the
            # threads (3 of 128 channels: 2 / 1; ResNet-18's 784 x 576 x 128 strided conv, channels
            # last), and where A outweighs the weights (rows > N), so each thread reads its rows of
            # A once as every panel passes instead of all of A (ConvNeXt's 3136 x 384 @ 384 x 96
            # Linear: 1.1 ms as two panel ranges; ConvNeXt x1.05-1.06, Swin x1.05, in-process A/B)
            strips = -(-rows // MR)
            units = [(s0 * MR, min(rows, s1 * MR) - s0 * MR, 0, panels) for s0, s1 in _chunks(strips, self.threads)]
        pool = self.pool
        self._keep.append(bp)
        bp_ptr = bp.ctypes.data
        pa0, pc0 = self._address(a_name) + a_offset * itemsize, self._address(out_name)
        self._tasks[-1] = [
            [KIND_PACKED_GEMM, function_address(fn), pa0 + r0 * lda * itemsize, lda, bp_ptr, k, pc0 + r0 * n * itemsize, n, count, n, p0, p1]
            for r0, count, p0, p1 in units
        ]

        def run(arrays: dict[str, np.ndarray]) -> None:
            pa = arrays[a_name].ctypes.data + a_offset * itemsize
            pc = arrays[out_name].ctypes.data
            if len(units) == 1:
                fn(pa, lda, bp_ptr, k, pc, n, rows, n, 0, panels)
                return
            assert pool is not None
            share_work(
                pool,
                self.threads,
                [functools.partial(fn, pa + r0 * lda * itemsize, lda, bp_ptr, k, pc + r0 * n * itemsize, n, count, n, p0, p1) for r0, count, p0, p1 in units],
            )

        return run

    def _blocked_runner(self, step: MatMulStep) -> Callable[[dict[str, np.ndarray]], None]:
        """The packed micro-kernel for a product stored channel-blocked (``MatMulStep.blocked``):
        rows of A (image positions; A read in place with its two strides) times the constant
        weight, split over threads by row strips (a large image: many rows, few weight panels) or
        by column panels (a small image's wide product)."""
        from .gemm import MR, pack_b, sgemm_function

        assert step.blocked is not None and step.alpha == 1.0 and step.beta == 0.0 and len(step.a.shape) == 2
        m, k, n = step.a.shape[-2], step.a.shape[-1], step.b.shape[-1]
        b_matrix = _strided(np.asarray(self.program.constants[step.b.buffer.name]).reshape(-1), step.b.buffer, step.b).astype(np.float32)
        bias = None if step.bias is None else self.program.constants[step.bias.name]
        bp = pack_b(b_matrix, bias)
        fn = sgemm_function(_row_epilogue(step), self.cache_dir, blocked=True)
        _, _, _, padded_width, block = step.out.shape
        rows = step.blocked.row_offsets(padded_width, block)
        self._keep += [bp, rows]
        (lda, a_step), plane, panels = step.a.strides, math.prod(step.out.shape[2:]), bp.shape[0]
        parallel = self.pool is not None and self.threads > 1 and 2.0 * m * n * k >= GEMM_SPLIT_FLOPS
        strips = -(-m // MR)
        if parallel and panels >= 2 * self.threads:  # a small image's wide product: by column panels, as ``_packed_runner``
            units = [(0, m, p0, p1) for p0, p1 in _chunks(panels, panels if m * k * 4 <= L2_RESIDENT_A_BYTES else CHUNKS_PER_THREAD * self.threads)]
        else:  # a large image: by row strips, each over the few panels of the weight
            parts = min(strips, ROWS_CHUNKS_PER_THREAD * self.threads) if parallel else 1
            bounds = [min(MR * (strips * i // parts), m) for i in range(parts + 1)]
            units = [(r0, r1 - r0, 0, panels) for r0, r1 in itertools.pairwise(bounds) if r1 > r0]
        a_name, out_name, itemsize = step.a.buffer.name, step.out.name, 4
        a_offset = step.a.offset

        def args(pa: int, pc: int, r0: int, count: int, p0: int, p1: int) -> list[int]:
            return [pa + (a_offset + r0 * lda) * itemsize, lda, bp.ctypes.data, k, pc, plane, count, n, p0, p1, rows.ctypes.data + r0 * 8, block, a_step]

        pa0, pc0 = self._address(a_name), self._address(out_name)
        self._tasks[-1] = [[KIND_BLOCKED_GEMM, function_address(fn), *args(pa0, pc0, *unit)] for unit in units]

        def run(arrays: dict[str, np.ndarray]) -> None:
            pa, pc = arrays[a_name].ctypes.data, arrays[out_name].ctypes.data
            calls: list[Callable[[], None]] = [functools.partial(fn, *args(pa, pc, *unit)) for unit in units]
            if len(calls) == 1:
                calls[0]()
                return
            assert self.pool is not None
            share_work(self.pool, self.threads, calls)

        return run

    def _rows_runner(
        self, step: MatMulStep, a_offs: list[int], b_offs: list[int], m: int, n: int, k: int
    ) -> Callable[[dict[str, np.ndarray]], None] | None:
        """The LLVM micro-kernel for ``W @ B`` with a constant float32 W (a Conv's weights against
        its im2col or input, NCHW out) and B unpacked (each K block of a panel is copied once per
        row block inside the kernel), with a per-row bias (+ ReLU) epilogue; split over threads by
        column panels and, when there are few panels, row blocks. None when the step does not fit."""
        from .gemm import MR, NR, rows_a, sgemm_function

        a, bop = step.a, step.b
        w_value = self.program.constants.get(a.buffer.name)
        if w_value is None or bop.buffer.name in self.program.constants or step.out.dtype != "f32" or a.buffer.dtype != "f32":
            return None
        if step.alpha != 1.0 or step.beta != 0.0 or bop.buffer.dtype != "f32" or not k or not m or not n:
            return None
        if (bop.strides[-1] != 1 and n > 1 and step.b_rows is None) or a.strides[-1] != 1 or a.strides[-2] < k:
            return None
        if step.bias is not None and (not step.bias_rows or len(set(a_offs)) != 1):  # one weight: a batch of images
            return None
        bias = None if step.bias is None else self.program.constants.get(step.bias.name)
        if step.bias is not None and bias is None:
            return None
        flat_w = np.asarray(w_value, np.float32).reshape(-1)
        lda_w = a.strides[-2]
        mats = np.stack([rows_a(_rows_of(flat_w, off, m, k, lda_w), bias) for off in dict.fromkeys(a_offs)])
        where = {off: i for i, off in enumerate(dict.fromkeys(a_offs))}
        lda = mats.shape[-1]
        if step.activation and (step.relu or bias is None):
            return None
        fn = sgemm_function(_row_epilogue(step), self.cache_dir, packed=False)
        panels = -(-n // NR)
        flops = 2.0 * m * n * k * len(a_offs)
        target = min(ROWS_CHUNKS_PER_THREAD, max(1, int(flops / ROWS_FLOPS_PER_CHUNK))) * self.threads
        parallel = self.pool is not None and self.threads > 1 and flops >= GEMM_SPLIT_FLOPS
        per_product = max(1, -(-target // len(a_offs))) if parallel else 1
        panel_parts = min(panels, per_product)
        strips = -(-m // MR)
        # few panels (N = 49, 196): rows are split too, but only once per thread, since every
        # row block copies its panels of B again (four row blocks per panel cost more than the
        # balance they bought on MobileNet's 7x7 products)
        row_parts = max(1, min(strips, self.threads)) if parallel and panel_parts < per_product else 1
        rows_per = -(-strips // row_parts) * MR
        b_rows = step.b_rows.offsets(k) if step.b_rows is not None else np.arange(k, dtype=np.int64) * bop.strides[-2]
        width, pitch = (step.b_rows.width, step.b_rows.pitch) if step.b_rows is not None else (n, n)
        self._keep += [mats, b_rows]
        rows_at = b_rows.ctypes.data
        scale_name = None if step.b_scale is None else step.b_scale.name
        scale_at = 0 if scale_name is None else self._address(scale_name)
        a_base, b_base, c_base = mats.ctypes.data, self._address(bop.buffer.name), self._address(step.out.name)
        ldc, c_first = (n, 0) if step.c_rows is None else (step.c_rows.strides[-2], step.c_rows.offset)
        units: list[tuple[int, int, int, int, int, int]] = []
        for i, (ao, bo) in enumerate(zip(a_offs, b_offs, strict=True)):
            for r0 in range(0, m, rows_per):
                for p0, p1 in _chunks(panels, panel_parts):
                    a_at = (where[ao] * m + r0) * lda * 4
                    units.append((a_at, bo * 4, (c_first + (i * m + r0) * ldc) * 4, min(rows_per, m - r0), p0, p1))
        self._tasks[-1] = [[KIND_ROWS_GEMM, function_address(fn), a_base + ao, lda, b_base + bo, rows_at, scale_at, k, c_base + co, ldc, rows, n, p0, p1, width, pitch] for ao, bo, co, rows, p0, p1 in units]
        pool = self.pool
        b_name, out_name = bop.buffer.name, step.out.name

        def run(arrays: dict[str, np.ndarray]) -> None:
            pb, pc = arrays[b_name].ctypes.data, arrays[out_name].ctypes.data
            ps = 0 if scale_name is None else arrays[scale_name].ctypes.data
            calls: list[Callable[[], None]] = [functools.partial(fn, a_base + ao, lda, pb + bo, rows_at, ps, k, pc + co, ldc, rows, n, p0, p1, width, pitch) for ao, bo, co, rows, p0, p1 in units]
            if len(calls) == 1 or pool is None:
                for call in calls:
                    call()
                return
            share_work(pool, self.threads, calls)

        return run

    def _fallback_runner(self, step: FallbackStep) -> Callable[[dict[str, np.ndarray]], None]:
        """The node alone in a model (original tensor names, so subgraphs find what they read),
        run by onnx's reference evaluator (``lowering.node_runner``)."""
        from onnx import helper

        from onnxsat.lowering.node_runner import node_runner

        feeds = [(t, b) for t, b in zip(step.node.input, step.inputs, strict=True) if t and b is not None]
        feeds += [(t, b) for t, b in step.captures if t not in {n for n, _ in feeds}]
        vis = [
            helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(NUMPY_DTYPES[b.dtype]), b.shape)
            for t, b in feeds
        ]
        outs = [o for o in step.node.output if o]
        graph = helper.make_graph([step.node], "fallback", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(step.node.domain, step.opset)])
        evaluate = node_runner(model)
        out_names = [b.name for b in step.outputs]

        def run(arrays: dict[str, np.ndarray]) -> None:
            results = evaluate({t: arrays[b.name] for t, b in feeds})
            for bn, value in zip(out_names, results, strict=True):
                np.copyto(arrays[bn], np.asarray(value).reshape(arrays[bn].shape), casting="unsafe")

        return run

    # ------------------------------------------------------------ running
    def run(self, inputs: Mapping[str, np.ndarray], stamps: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The outputs for ``inputs``; ``stamps``: a native run's clock readings (``TaskTable.run``)."""
        given: dict[str, np.ndarray] = {}
        for name, buf in self.program.inputs:
            value = np.asarray(inputs[name])
            if value.dtype != NUMPY_DTYPES[buf.dtype]:
                from onnxsat.base.errors import BadInputError

                raise BadInputError(f"input {name!r} has dtype {value.dtype}, the model wants {NUMPY_DTYPES[buf.dtype]}")
            given[buf.name] = value
        if self.native is not None:
            return self._run_native(given, stamps)
        arrays = dict(self.fixed)
        arrays.update((key, np.ascontiguousarray(value)) for key, value in given.items())
        previous = single_threaded_blas()  # process-wide in numpy's OpenBLAS: restored below
        try:
            return self.run_steps(arrays)
        finally:
            restore_blas_threads(previous)

    def run_steps(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every step in order on ``arrays`` (the fixed buffers and the inputs, by buffer name),
        the outputs allocated into it: ``run`` without the native call, and what per-step
        profiles prime before timing ``runners`` one by one."""
        for _, buf in self.program.outputs:
            arrays[buf.name] = np.empty(buf.shape, dtype=NUMPY_DTYPES[buf.dtype])
        for runner in self.runners:
            runner(arrays)
        views = self.program.output_views
        return {
            name: views[name].of(arrays[buf.name]).copy() if name in views else arrays[buf.name]
            for name, buf in self.program.outputs
        }

    def _run_native(self, given: dict[str, np.ndarray], stamps: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Inputs copied into the buffers the task table points at (``copyto`` takes any layout),
        one native call, and each output copied once into a fresh array (the buffers are reused by
        the next call)."""
        assert self.native is not None
        for _, buf in self.program.inputs:
            if buf.name in self.io:
                np.copyto(self.io[buf.name], given[buf.name].reshape(buf.shape))
        self.native.run(self.workers, stamps)
        outputs: dict[str, np.ndarray] = {}
        for name, buf in self.program.outputs:
            view = self.output_views.get(name)
            if view is not None:
                outputs[name] = np.array(view, copy=True, order="C")
                continue
            source = self.io.get(buf.name)
            if source is None:
                source = given[buf.name] if buf.name in given else self.fixed[buf.name]
            outputs[name] = np.array(source, copy=True).reshape(buf.shape)
        return outputs


def _gemm_variants(program: KernelProgram, options: CompileOptions) -> set[tuple[str, bool, bool]]:
    """The micro-kernel variants (epilogue, packed, blocked) the program's products may run on."""
    variants: set[tuple[str, bool, bool]] = set()
    if options.gemm != "llvm":
        return variants
    for s in program.steps:
        if not isinstance(s, MatMulStep):
            continue
        if s.blocked is not None:
            variants.add((_row_epilogue(s), True, True))
        elif program.constants.get(s.a.buffer.name) is not None:
            variants.add((_row_epilogue(s), False, False))
        elif program.constants.get(s.b.buffer.name) is not None:
            variants.add((_packed_epilogue(s), True, False))
    return variants


def _support_code(variants: set[tuple[str, bool, bool]], cache_dir: Path | None) -> None:
    """Load (compile where the build left them out, once per process) the code every program
    shares: the native runner and the micro-kernel ``variants``; timed apart from setup."""
    from .gemm import sgemm_address
    from .native_runner import runtime

    runtime(cache_dir)
    for epilogue, packed, blocked in sorted(variants):
        sgemm_address(epilogue, cache_dir, packed, blocked)


def _packed_epilogue(step: MatMulStep) -> str:
    """The packed kernel variant a product with a constant B runs on (its bias, ReLU)."""
    return "none" if step.bias is None else "bias_relu" if step.relu else "bias"


def _row_epilogue(step: MatMulStep) -> str:
    """The unpacked-B (or channel-blocked) kernel variant a product would run on."""
    if step.bias is None:
        return "none"
    return "bias_relu" if step.relu else f"bias_{step.activation}" if step.activation else "bias"


def _rows_of(flat: np.ndarray, offset: int, m: int, k: int, ld: int) -> np.ndarray:
    """The M x K matrix at ``offset`` in ``flat`` with row stride ``ld``."""
    return np.lib.stride_tricks.as_strided(flat[offset:], (m, k), (ld * flat.itemsize, flat.itemsize))


def _overlap(ranges: list[tuple[int, int]], others: list[tuple[int, int]]) -> bool:
    return any(a < d and c < b for a, b in ranges for c, d in others)


def _blas_layouts(step: MatMulStep) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """BLAS (transpose flag, leading dimension) of a product's two operands (None: not expressible)."""
    m, n = (step.out if step.c_rows is None else step.c_rows).shape[-2:]
    k = step.a.shape[-1]
    b_layout = None if step.b_rows is not None or step.b_scale is not None else matrix_layout((k, n), step.b.strides[-2:])  # type: ignore[arg-type]
    return matrix_layout((m, k), step.a.strides[-2:]), b_layout  # type: ignore[arg-type]


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array starting on a 64-byte boundary."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _strided(base: np.ndarray, buf: Buffer, op: StridedOperand) -> np.ndarray:
    item = base.itemsize
    flat = base.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[op.offset :], shape=op.shape, strides=tuple(s * item for s in op.strides))


def compile_together(programs: list[KernelProgram], pool: ThreadPoolExecutor | None, options: CompileOptions) -> list[Executable]:
    """Executables for several programs from one build (their kernels compiled together)."""
    renamed = [rename_kernels(p, f"m{i}_") for i, p in enumerate(programs)]
    kernels = [s.kernel for p in renamed for s in p.steps if isinstance(s, KernelStep)]
    if not kernels:
        return [Executable(p, pool, options) for p in renamed]
    module, symbols, _ = compile_kernels(kernels, options)
    return [Executable(p, pool, options, module, symbols) for p in renamed]


def rename_kernels(program: KernelProgram, prefix: str) -> KernelProgram:
    """The same program with every kernel name prefixed (so programs can share one module)."""
    steps = [KernelStep(replace(s.kernel, name=prefix + s.kernel.name)) if isinstance(s, KernelStep) else s for s in program.steps]
    return replace(program, steps=steps)
