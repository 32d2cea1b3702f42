"""Whether one kernel is split over the threads: enough work to repay sharing it.

A split costs the hand-off to the helper threads and a wait for the slowest part; it pays once
the kernel runs longer than that. The estimate of how long a kernel runs takes the larger of two
measures, since either can dominate: ``Kernel.cost`` (scalar operations: exp-heavy chains,
softmax) and the bytes of the buffers it touches (memory-bound stores: bias adds, head
splits and merges, whose cost in operations is small). ``benchmarks/parallel_threshold.py``
measures serial against split per kernel class and size; ``benchmarks/split_thresholds_ab.py``
sets the thresholds on whole models.
"""

from __future__ import annotations

from onnxsat.lowering.kernel_ir import Kernel

PARALLEL_MIN_COST = 100_000.0
"""Kernels estimated below this many scalar operations (and below PARALLEL_MIN_BYTES) run on one
thread. Helper threads stay awake through a run (they yield rather than sleep), so a split costs
a few microseconds: against 1M operations and 1 MiB (the values measured when helpers slept
between steps, benchmarks/results/parallel_threshold.md), 100K and 128 KiB (with GEMMs split
from 200K FLOPs) ran MobileNetV3-small x1.28, ShuffleNetV2 x1.13 and EfficientNet-B0 x1.08 faster
at 2 threads, resnet18 and whisper-tiny unchanged (x1.00): three programs built in one process,
12 interleaved rounds (``benchmarks/split_thresholds_ab.py``); 40K and 64 KiB gained 1% more."""
PARALLEL_MIN_BYTES = float(1 << 17)
"""Kernels touching at least this many bytes (inputs and outputs) are split whatever their cost:
memory-bound stores (head splits and merges, bias adds) count few operations."""


def touched_bytes(kernel: Kernel) -> int:
    """Bytes of every buffer the kernel reads or writes (each counted once)."""
    return sum(b.nbytes for b in kernel.params)


def parallel_pays(kernel: Kernel) -> bool:
    """Whether ``kernel`` is worth splitting over several threads."""
    if kernel.parallel_extent <= 1:
        return False
    return kernel.cost >= PARALLEL_MIN_COST or touched_bytes(kernel) >= PARALLEL_MIN_BYTES
