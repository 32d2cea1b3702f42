"""``CompileOptions``: every setting of compiling a model to native CPU kernels, in one place.

``onnxsat.compile``, ``CompiledModel`` and ``onnxsat compile`` take one of these instead of loose
keyword arguments, so a setting added here reaches every entry point, and the fields that change
the generated code are the ones the compiled-artefact cache keys on (``code_key``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from onnxsat.base.options import TARGET_NAMES as COST_TARGETS

GEMM_CHOICES = ("llvm", "blas")
MAX_DEFAULT_JOBS = 8
"""Compile processes used by default at most: past this, process start-up outweighs the kernels
left to each."""


def default_cache_dir() -> Path:
    """``~/.cache/onnxsat/kernels``: compiled objects and artefacts (a private 0700 directory)."""
    return Path(os.path.expanduser("~")) / ".cache" / "onnxsat" / "kernels"


@dataclass(frozen=True)
class CompileOptions:
    """How a model is compiled to native CPU kernels and run."""

    threads: int | None = None
    """Threads a run uses (None: every core)."""
    opt_level: int = 3
    """LLVM optimization level, 0-3 (0 compiles much faster and runs slower)."""
    gemm: str = "llvm"
    """``llvm``: products with constant weights run on onnxsat's packed micro-kernel; ``blas``: every
    product goes to OpenBLAS."""
    epilogues: bool = True
    """The micro-kernel adds a MatMul's bias (+ ReLU) while it stores C (False: separate kernels,
    for comparison; only with ``gemm="llvm"``)."""
    cache: bool = True
    """Keep compiled objects and whole compiled artefacts on disk (False: compile everything)."""
    cache_dir: str | None = None
    """Where the disk cache lives (None: ``default_cache_dir()``); it must be this user's 0700."""
    jobs: int | None = None
    """Processes that compile kernels in parallel (None: the cores, at most ``MAX_DEFAULT_JOBS``;
    1: all in this process). LLVM calls through llvmlite hold one process-wide lock, so threads
    would compile one kernel at a time."""
    cost_target: str | None = None
    """Cost model the optimizer extracts under before compiling (None: onnxsat-cpu, the compiled
    kernels' own, unless the optimize options name another target)."""

    def __post_init__(self) -> None:
        if self.gemm not in GEMM_CHOICES:
            raise ValueError(f"gemm must be one of {', '.join(GEMM_CHOICES)}, not {self.gemm!r}")
        if self.opt_level not in (0, 1, 2, 3):
            raise ValueError(f"opt_level must be 0, 1, 2 or 3, not {self.opt_level!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, not {self.threads}")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        if self.cost_target is not None and self.cost_target not in COST_TARGETS:
            raise ValueError(
                f"cost_target must be one of {', '.join(COST_TARGETS)}, not {self.cost_target!r}"
            )

    @property
    def run_threads(self) -> int:
        """``threads``, or every core."""
        return max(1, self.threads if self.threads is not None else (os.cpu_count() or 1))

    @property
    def compile_jobs(self) -> int:
        """``jobs``, or the cores up to ``MAX_DEFAULT_JOBS``."""
        return self.jobs if self.jobs is not None else max(1, min(os.cpu_count() or 1, MAX_DEFAULT_JOBS))

    @property
    def gemm_epilogues(self) -> bool:
        """Whether lowering may put bias (+ ReLU) epilogues into products (the micro-kernel's)."""
        return self.epilogues and self.gemm == "llvm"

    def cache_path(self) -> Path | None:
        """The cache directory to use, or None when caching is off."""
        if not self.cache:
            return None
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()

    def code_key(self) -> str:
        """The settings that change generated code or its task tables (part of the artefact key):
        the cache location, compile processes and cost target do not."""
        return f"opt{self.opt_level}|gemm={self.gemm}|epilogues={self.gemm_epilogues}"
