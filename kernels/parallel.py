"""Whether one kernel is split over the threads: enough work to repay sharing it.

A split costs the hand-off to the helper threads and a wait for the slowest part; it pays once
the kernel runs longer than that. The estimate of how long a kernel runs takes the larger of two
measures, since either can dominate: ``Kernel.cost`` (scalar operations: exp-heavy chains,
softmax) and the bytes of the buffers it touches (memory-bound stores: bias adds, head
splits and merges, whose cost in operations is small). Both thresholds come from
``benchmarks/parallel_threshold.py`` (serial against split, per kernel class and size).
"""

from __future__ import annotations

from onnxsat.lowering.kernel_ir import Kernel

PARALLEL_MIN_COST = 20_000_000.0
"""Kernels estimated below this many scalar operations (and below PARALLEL_MIN_BYTES) run on one
thread. Tuned for a Python pool thread entering the native worker per run; see
benchmarks/parallel_threshold.py for the current runtime."""
PARALLEL_MIN_BYTES = float("inf")
"""Kernels touching at least this many bytes (inputs and outputs) are split whatever their cost."""


def touched_bytes(kernel: Kernel) -> int:
    """Bytes of every buffer the kernel reads or writes (each counted once)."""
    return sum(b.nbytes for b in kernel.params)


def parallel_pays(kernel: Kernel) -> bool:
    """Whether ``kernel`` is worth splitting over several threads."""
    if kernel.parallel_extent <= 1:
        return False
    return kernel.cost >= PARALLEL_MIN_COST or touched_bytes(kernel) >= PARALLEL_MIN_BYTES
