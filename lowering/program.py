"""What lowering produces: a ``KernelProgram``, a list of steps over named buffers.

Steps are native kernels (kernel IR), BLAS calls on strided views (``MatMulStep``), or numpy
reference fallbacks for ops that are not lowered (``FallbackStep``, listed in the report).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .kernel_ir import Buffer, Kernel, render


@dataclass(frozen=True)
class StridedOperand:
    """A matrix operand for BLAS: ``buffer`` seen with ``shape``/``strides`` (elements) from ``offset``."""

    buffer: Buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0


MIN_GAPPED_WIDTH = 8
"""The narrowest output row a ``ShiftedRows`` may skip the padding after (``width < pitch``): the
GEMM reads a vector of 16 columns as one masked load per input row it spans, three at most."""


@dataclass(frozen=True)
class ShiftedRows:
    """B of an implicit-GEMM convolution: row ``c * len(taps) + t`` is read from the padded input
    (for a stride, its stride phases) at ``c * plane + taps[t]`` (tap ``t``'s window shifted over
    whole rows). Its columns are the output positions, ``width`` per output row, read from input
    rows ``pitch`` apart: column ``q`` at ``(q // width) * pitch + q % width`` (``width == pitch``:
    contiguous columns; otherwise ``width >= MIN_GAPPED_WIDTH``). The product reads
    its input where it lies instead of an im2col copy of it (K x N values, 7 MB for a 64-channel
    56x56 3x3 conv)."""

    plane: int
    taps: tuple[int, ...]
    width: int
    pitch: int

    def offsets(self, k: int) -> np.ndarray:
        """Where each of the K rows starts (elements from the operand's offset), as int64."""
        channels = k // len(self.taps)
        return (np.arange(channels, dtype=np.int64)[:, None] * self.plane + np.asarray(self.taps, np.int64)).reshape(-1)

    def columns(self, n: int) -> np.ndarray:
        """Where each of the N columns lies from its row's start, as int64."""
        q = np.arange(n, dtype=np.int64)
        return q // self.width * self.pitch + q % self.width

    def matrix(self, flat: np.ndarray, k: int, n: int) -> np.ndarray:
        """B as a K x N array read from ``flat`` (the operand's buffer from its offset)."""
        return flat[self.offsets(k)[:, None] + self.columns(n)]


@dataclass(frozen=True)
class KernelStep:
    kernel: Kernel


PACKED_GEMM_MAX_ROWS = 4096
"""Above this many rows of A, products with a constant B run on OpenBLAS instead of the CPU
backend's packed micro-kernel. Once 512 (when the micro-kernel had no K and row blocking, OpenBLAS
won at 1024^3); against OpenBLAS now, in-process A/B: Whisper-tiny's encoder (1,500 rows) x1.035
at one thread, x1.02 at two; swin_t and convnext_tiny (3,136 rows) x1.03 / x1.01-1.04 at two;
2048 x 1024 x 1024 x1.07 / x0.98, 4096 x 256 x 256 x0.97 / x0.93 (N = 256 leaves a third of the
last 48-column panel empty). Lowering gives epilogues only to products the micro-kernel will run."""


@dataclass(frozen=True)
class BlockedImage:
    """Where a product's rows land in a channel-blocked padded buffer: row ``i`` is the image
    position ``(i // width, i % width)``, stored at ``(top, left)`` from the padded corner."""

    height: int
    width: int
    top: int
    left: int

    def row_offsets(self, padded_width: int, block: int) -> np.ndarray:
        """Each row's element offset within a channel block's plane."""
        i = np.arange(self.height * self.width, dtype=np.int64)
        return ((i // self.width + self.top) * padded_width + i % self.width + self.left) * block


@dataclass(frozen=True)
class MatMulStep:
    """``out = alpha * (a @ b) + beta * out`` with numpy broadcasting over leading dims, then
    ``+ bias`` (a constant row of N values) and ReLU when asked: a MatMul's Add (+ Relu) done in
    the packed GEMM's store instead of a pass of its own."""

    a: StridedOperand
    b: StridedOperand
    out: Buffer
    alpha: float = 1.0
    beta: float = 0.0
    bias: Buffer | None = None
    relu: bool = False
    bias_rows: bool = False
    """The bias is per row of C (M values: a Conv's ``W @ col``, one per output channel) instead
    of per column."""
    activation: str = ""
    """With a row bias: ``silu`` or ``hardswish`` after it (ReLU is ``relu``)."""
    b_rows: ShiftedRows | None = None
    """B's rows are shifted windows of ``b.buffer`` (``b`` then has shape [batch..., K, N] and
    strides [batch strides..., 0, 1]: the windows are offsets from each image's plane)."""
    b_scale: Buffer | None = None
    """K values that multiply B's rows (a squeeze-excitation's channel scale of a 1x1 conv's input)."""
    blocked: BlockedImage | None = None
    """C's rows are the positions of an image and its columns channels, stored channel-blocked
    into ``out`` ([N, C/B, Hp, Wp, B], a blocked depthwise conv's zero-padded input) instead of
    as an M x N matrix."""
    c_rows: StridedOperand | None = None
    """Where C (M x N, its rows ``strides[-2]`` apart from ``offset``) lies in ``out`` when not packed
    M x N: a flat depthwise conv's row-padded planes (``conv_kernels.RowPadded``)."""

    def operands(self) -> list[Buffer]:
        """The buffers the product reads besides ``out`` (which it also reads when ``beta``)."""
        return [self.a.buffer, self.b.buffer, *(b for b in (self.bias, self.b_scale) if b is not None)]


@dataclass(frozen=True)
class FallbackStep:
    """One ONNX node run with the numpy reference (onnx.reference) at run time."""

    node: Any  # onnx.NodeProto
    opset: int
    inputs: tuple[Buffer | None, ...]
    outputs: tuple[Buffer, ...]
    reason: str
    captures: tuple[tuple[str, Buffer], ...] = ()
    """Outer-scope tensors its subgraphs (If/Loop bodies) read, by name."""


Step = KernelStep | MatMulStep | FallbackStep


@dataclass(frozen=True)
class OutputView:
    """A graph output read from its buffer with ``strides`` (elements) from ``offset``."""

    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...]

    def of(self, flat: np.ndarray) -> np.ndarray:
        """The output's elements in ``flat`` (its buffer's array, any shape), not copied."""
        flat = flat.reshape(-1)
        size = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[self.offset :], self.shape, tuple(s * size for s in self.strides))


@dataclass
class KernelProgram:
    """Lowered model: ``steps`` in execution order over ``buffers``.

    ``inputs``/``outputs`` pair graph tensor names with their buffers; ``constants`` holds the
    values of weight buffers (computed at compile time, folded where weight-only).
    """

    inputs: list[tuple[str, Buffer]]
    outputs: list[tuple[str, Buffer]]
    steps: list[Step] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    fallbacks: Counter[str] = field(default_factory=Counter)
    """Op type -> number of nodes run by the numpy reference instead of a native kernel."""
    native_ops: Counter[str] = field(default_factory=Counter)
    """Op type -> number of nodes lowered to kernels, BLAS calls or compile-time values."""
    fused: list[frozenset[int]] = field(default_factory=list)
    """Graph nodes (by index, in the graph without its layout marks: ``layout_marks``) whose work one kernel, or one kernel and the kernels it feeds within
    its group, computes together: what ``KERNEL_STAMP`` allowed, each set within one stamp."""
    output_views: dict[str, OutputView] = field(default_factory=dict)
    """Graph outputs (by name) that are views of their buffer, not the whole of it."""
    pinned: set[str] = field(default_factory=set)
    """Buffers that keep their memory for the whole run (no other buffer shares it): their zero
    padding, written once when the memory is allocated zeroed, is never overwritten (the blocked
    input of a depthwise conv, whose producer writes only the image)."""

    def buffers(self) -> dict[str, Buffer]:
        found: dict[str, Buffer] = {}
        for _, b in self.inputs + self.outputs:
            found[b.name] = b
        for step in self.steps:
            for b in step_buffers(step):
                found[b.name] = b
        return found

    def render(self) -> str:
        parts = []
        for step in self.steps:
            if isinstance(step, KernelStep):
                parts.append(render(step.kernel))
            elif isinstance(step, MatMulStep):
                epilogue = (f" + {step.bias.name}{' per row' if step.bias_rows else ''}" if step.bias else "") + (", relu" if step.relu else "") + (f", {step.activation}" if step.activation else "")
                epilogue += (f", B's rows from {step.b_rows}" if step.b_rows else "") + (f", B's rows times {step.b_scale.name}" if step.b_scale else "")
                parts.append(f"matmul {step.out.name} = {step.alpha} * {step.a} @ {step.b} + {step.beta} * out{epilogue}")
            else:
                parts.append(f"fallback {step.node.op_type} ({step.reason})")
        return "\n\n".join(parts)


def step_buffers(step: Step) -> list[Buffer]:
    """Every buffer a step reads or writes (inputs first)."""
    if isinstance(step, KernelStep):
        return list(step.kernel.params)
    if isinstance(step, MatMulStep):
        return [*step.operands(), step.out]
    return [b for b in step.inputs if b is not None] + [b for _, b in step.captures] + list(step.outputs)


def step_writes(step: Step) -> list[Buffer]:
    if isinstance(step, KernelStep):
        return [b for b in step.kernel.params if b.name in step.kernel.outputs]
    if isinstance(step, MatMulStep):
        return [step.out]
    return list(step.outputs)
