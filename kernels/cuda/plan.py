"""A lowered ``KernelProgram`` planned for the GPU: each step's kernel form and launch shape.

Kernel steps take one of five forms (``transform`` and ``nvvm``): ``vectorized`` or ``elementwise``
(one thread per element, or per 4 consecutive elements; direct convolutions too), ``warp-reduction``
(one warp per output of a long reduction), ``warp-rows`` (one warp per row of a kernel with several
passes over a row, such as softmax or LayerNorm), ``thread-per-unit`` (the CPU kernel unchanged:
one thread per parallel unit). Matrix products become
launches of the tiled GEMM (``gemm``). Steps the GPU cannot run (numpy fallbacks, integer matrix
products) stay on the host. Kernels that differ only in their buffers share one entry point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from onnxsat.lowering.kernel_ir import Buffer, Kernel, canonical, render
from onnxsat.lowering.program import FallbackStep, KernelProgram, KernelStep, MatMulStep, StridedOperand

from .gemm import GEMM_DTYPES, THREADS, TILE_M, TILE_N, gemm_kernel_name
from .nvvm import WARP, uses_warp_reduction
from .transform import flatten_elementwise, is_elementwise, vectorize, warp_row_passes

BLOCK = 256
"""Threads per block for one-dimensional launches."""
MAX_BLOCKS = 8192
"""Grid cap for grid-stride kernels (enough to fill an H200's 132 SMs many times over)."""
VECTORIZE_MIN = 4 * BLOCK
"""Elementwise kernels with fewer elements than this keep one element per thread."""


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a buffer (by name) or a scalar of ``dtype`` (``i64``, ``f32``, ``f64``)."""

    kind: str
    value: str | int | float
    dtype: str = ""


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``function`` in the PTX of ``kernel_file``, with its grid and arguments."""

    step: str
    function: str
    form: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    writes: tuple[str, ...]
    shared_bytes: int = 0
    elements: int = 0
    """Parallel units the kernel covers (elements for elementwise forms)."""


@dataclass(frozen=True)
class HostStep:
    """A step run on the host (numpy): its buffers are copied down and back."""

    step: FallbackStep | MatMulStep
    reason: str


@dataclass
class CudaProgram:
    program: KernelProgram
    steps: list[Launch | HostStep] = field(default_factory=list)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    """Entry-point name -> the GPU form of the kernel (unique kernels only)."""
    forms: dict[str, str] = field(default_factory=dict)
    gemm_dtypes: set[str] = field(default_factory=set)
    tables: dict[str, np.ndarray] = field(default_factory=dict)
    """Extra constant buffers the launches read (GEMM batch offsets)."""

    def buffers(self) -> dict[str, Buffer]:
        found = self.program.buffers()
        for name, value in self.tables.items():
            found[name] = Buffer(name, "i64", value.shape)
        return found

    @property
    def functions(self) -> list[str]:
        return [*self.kernels, *(gemm_kernel_name(d) for d in sorted(self.gemm_dtypes))]


def grid_for(units: int, per_block: int) -> int:
    return max(1, min(math.ceil(units / per_block), MAX_BLOCKS))


def gpu_form(kernel: Kernel) -> tuple[Kernel, str]:
    """The kernel rewritten for the GPU and the name of its form."""
    flat = flatten_elementwise(kernel)
    if flat is not None:
        # only plain chains are vectorized: a direct convolution's weight loads would repeat per lane
        wide = vectorize(flat) if is_elementwise(kernel) and flat.parallel_extent >= VECTORIZE_MIN else None
        return (wide, "vectorized") if wide is not None else (flat, "elementwise")
    if uses_warp_reduction(kernel):
        return kernel, "warp-reduction"
    if warp_row_passes(kernel) is not None:
        return kernel, "warp-rows"
    return kernel, "thread-per-unit"


def plan(program: KernelProgram) -> CudaProgram:
    """Choose forms, entry points and launch shapes for every step of ``program``."""
    cp = CudaProgram(program)
    by_text: dict[str, str] = {}
    for step in program.steps:
        if isinstance(step, KernelStep):
            cp.steps.append(_kernel_launch(cp, by_text, step.kernel))
        elif isinstance(step, MatMulStep) and (step.bias is not None or step.relu or step.b_rows is not None or step.b_scale is not None or step.blocked is not None or step.c_rows is not None):
            cp.steps.append(HostStep(step, "no GPU GEMM epilogue, implicit conv or row scale (lower without gemm_epilogues for the GPU)"))
        elif isinstance(step, MatMulStep) and step.out.dtype in GEMM_DTYPES and step.a.buffer.dtype == step.out.dtype:
            cp.steps.append(_gemm_launch(cp, step))
        elif isinstance(step, MatMulStep):
            cp.steps.append(HostStep(step, f"no GPU GEMM for {step.out.dtype}"))
        else:
            cp.steps.append(HostStep(step, step.reason))
    return cp


def _kernel_launch(cp: CudaProgram, by_text: dict[str, str], kernel: Kernel) -> Launch:
    form_kernel, form = gpu_form(kernel)
    canon = canonical(form_kernel)
    text = f"{form}\n{render(canon)}"
    symbol = by_text.get(text)
    if symbol is None:
        symbol = by_text[text] = f"k{len(by_text)}"
        cp.kernels[symbol] = replace(canon, name=symbol)
        cp.forms[symbol] = form
    units = form_kernel.parallel_extent
    per_block = BLOCK // WARP if form in ("warp-reduction", "warp-rows") else BLOCK
    args = tuple(Arg("buffer", b.name) for b in kernel.params)
    elements = units * (4 if form == "vectorized" else 1)
    return Launch(kernel.name, symbol, form, (grid_for(units, per_block), 1, 1), (BLOCK, 1, 1), args, kernel.outputs, 0, elements)


def batch_offsets(op: StridedOperand, batch: tuple[int, ...]) -> np.ndarray:
    """Element offset of ``op``'s matrix for each batch index of the output (row-major), with
    numpy broadcasting (size-1 and missing leading dims repeat)."""
    lead = len(batch) - (len(op.shape) - 2)
    strides = (0,) * lead + tuple(op.strides[:-2])
    shape = (1,) * lead + tuple(op.shape[:-2])
    offsets = [
        op.offset + sum(i * s for i, d, s in zip(idx, shape, strides, strict=True) if d != 1)
        for idx in (np.ndindex(*batch) if batch else [()])
    ]
    return np.asarray(offsets, dtype=np.int64)


def _gemm_launch(cp: CudaProgram, step: MatMulStep) -> Launch:
    dtype = step.out.dtype
    cp.gemm_dtypes.add(dtype)
    batch = step.out.shape[:-2]
    m, n = step.out.shape[-2:]
    k = step.a.shape[-1]
    a_tab, b_tab = f"{step.out.name}.a_offsets", f"{step.out.name}.b_offsets"
    cp.tables[a_tab] = batch_offsets(step.a, batch)
    cp.tables[b_tab] = batch_offsets(step.b, batch)
    count = len(cp.tables[a_tab])
    args = (
        Arg("buffer", step.a.buffer.name),
        Arg("buffer", step.b.buffer.name),
        Arg("buffer", step.out.name),
        Arg("buffer", a_tab),
        Arg("buffer", b_tab),
        *(Arg("i64", int(v)) for v in (m, n, k, step.a.strides[-2], step.a.strides[-1], step.b.strides[-2], step.b.strides[-1])),
        Arg("float", float(step.alpha), dtype),
        Arg("float", float(step.beta), dtype),
    )
    grid = (math.ceil(n / TILE_N), math.ceil(m / TILE_M), count)
    return Launch(step.out.name, gemm_kernel_name(dtype), "gemm", grid, (THREADS, THREADS, 1), args, (step.out.name,), 0, m * n * count)
