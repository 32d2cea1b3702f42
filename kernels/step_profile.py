"""Where a compiled model's run spends its time, step by step, as it really runs.

A native run is one call over the task table, so timing steps one by one from Python would time
something else (one thread, cold caches, no overlap). Instead the runner notes the monotonic clock
as each phase of the table ends (``TaskTable.run``'s ``stamps``), on every thread count, and the
profile is the median of each phase's time over several runs. A program with numpy fallbacks
runs step by step from Python anyway, so there each step is timed around its call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxsat.lowering.kernel_ir import NUMPY_DTYPES
from onnxsat.lowering.program import FallbackStep, KernelStep, MatMulStep

from .executable import Executable


@dataclass(frozen=True)
class PhaseTime:
    """One phase of a run: the steps it runs together (one wait at its end), its tasks, and its
    median time."""

    steps: tuple[str, ...]
    tasks: int
    median_us: float
    flops: float
    """Multiply-adds x 2 of its products (0 for other steps)."""

    @property
    def gflops(self) -> float:
        return self.flops / self.median_us / 1e3 if self.flops and self.median_us > 0 else 0.0


def step_label(step: object) -> str:
    """A short name for a program step: the kernel's name, a product's shape and form, or the op a
    numpy fallback runs."""
    if isinstance(step, KernelStep):
        return step.kernel.name
    if isinstance(step, MatMulStep):
        m, k, n = step.a.shape[-2], step.a.shape[-1], step.b.shape[-1]
        batch = _batch(step)
        form = "implicit conv" if step.b_rows is not None else "blocked matmul" if step.blocked is not None else "matmul"
        epilogue = step.activation or ("relu" if step.relu else "")
        return f"{form} {f'{batch}x' if batch > 1 else ''}{m}x{k}x{n}{f' +{epilogue}' if epilogue else ''}"
    if isinstance(step, FallbackStep):
        return f"numpy {step.node.op_type}"
    return type(step).__name__


def _batch(step: MatMulStep) -> int:
    return 1 if step.blocked is not None else math.prod(step.out.shape[:-2])


def _flops(step: object) -> float:
    if not isinstance(step, MatMulStep):
        return 0.0
    return 2.0 * _batch(step) * step.a.shape[-2] * step.a.shape[-1] * step.b.shape[-1]


def profile_executable(exe: Executable, inputs: Mapping[str, np.ndarray], runs: int = 20) -> list[PhaseTime]:
    """Each phase's median time over ``runs`` runs of ``exe`` on ``inputs`` (after one untimed run)."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    steps = exe.program.steps
    if exe.native is not None:
        phases = exe.phase_steps
        tasks = np.diff(np.concatenate([[0], exe.native.step_ends]))
        stamps = np.zeros(len(phases) + 1, np.int64)
        exe.run(inputs)
        times = np.zeros((runs, len(phases)))
        for r in range(runs):
            exe.run(inputs, stamps)
            times[r] = np.diff(stamps) / 1e3
    else:
        phases = [[i] for i in range(len(steps))]
        tasks = np.ones(len(steps), np.int64)
        times = np.zeros((runs, len(steps)))
        for r in range(runs + 1):
            arrays = dict(exe.fixed)
            arrays.update((buf.name, np.ascontiguousarray(inputs[name])) for name, buf in exe.program.inputs)
            arrays.update((buf.name, np.empty(buf.shape, NUMPY_DTYPES[buf.dtype])) for _, buf in exe.program.outputs)
            for i, runner in enumerate(exe.runners):
                start = time.perf_counter()
                runner(arrays)
                if r:
                    times[r - 1, i] = (time.perf_counter() - start) * 1e6
    medians = np.median(times, axis=0)
    return [
        PhaseTime(tuple(step_label(steps[i]) for i in members), int(count), float(us), sum(_flops(steps[i]) for i in members))
        for members, count, us in zip(phases, tasks, medians, strict=True)
    ]


def format_profile(phases: list[PhaseTime], top: int | None = None) -> str:
    """The phases as a table, slowest first (``top``: only that many), with each one's share."""
    total = sum(p.median_us for p in phases) or 1.0
    rows = sorted(phases, key=lambda p: -p.median_us)[:top]
    lines = [f"{'us':>9} {'share':>6} {'tasks':>5} {'GFLOP/s':>8}  steps", *(
        f"{p.median_us:9.1f} {p.median_us / total:6.1%} {p.tasks:5d} {f'{p.gflops:.1f}' if p.flops else '-':>8}  {' + '.join(p.steps)}" for p in rows
    )]
    lines.append(f"{total:9.1f} total over {len(phases)} phases (medians; they need not add up to a run's median)")
    return "\n".join(lines)
