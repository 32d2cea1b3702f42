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

PARALLEL_MIN_COST = 1_000_000.0
"""Kernels estimated below this many scalar operations (and below PARALLEL_MIN_BYTES) run on one
thread. With helper threads that persist for the model's lifetime, splitting paid for every
class from 64K floats on (benchmarks/results/parallel_threshold.md, load 1.8: x1.14-1.22 at
0.4-0.9M operations, x1.3-2.1 from 256K floats); the 20M used before (tuned for a Python pool
thread entering the worker per run) kept LayerNorm and the head splits serial at BERT sizes."""
PARALLEL_MIN_BYTES = float(1 << 20)
"""Kernels touching at least this many bytes (inputs and outputs) are split whatever their cost:
memory-bound stores (head splits and merges, bias adds) count few operations. At 1 MiB a relu
chain alone was a tie; every class at 2 MiB and more paid."""


def touched_bytes(kernel: Kernel) -> int:
    """Bytes of every buffer the kernel reads or writes (each counted once)."""
    return sum(b.nbytes for b in kernel.params)


def parallel_pays(kernel: Kernel) -> bool:
    """Whether ``kernel`` is worth splitting over several threads."""
    if kernel.parallel_extent <= 1:
        return False
    return kernel.cost >= PARALLEL_MIN_COST or touched_bytes(kernel) >= PARALLEL_MIN_BYTES
