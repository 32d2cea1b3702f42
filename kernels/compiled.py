"""``CompiledModel``: an ONNX model compiled to native CPU kernels, callable on numpy arrays.

Compilation is specialized on input shapes (and on the values of inputs that decide shapes, such
as a Reshape target fed from the graph input): the first call with a new signature lowers and
compiles, later calls reuse the executable. Static shapes given at compile time are compiled
eagerly.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxsat.lowering.lower import LoweringError, lower, value_inputs

from .executable import Executable, ExecutableStats
from .jit import default_cache_dir
from .native_runner import NativeWorkers


class CompiledModel:
    """Call with keyword arrays (``cm(x=...)``) or a dict (``cm({'x': ...})``); returns a dict."""

    def __init__(
        self,
        model: onnx.ModelProto,
        threads: int | None = None,
        cache_dir: Path | str | None = "default",
        opt_level: int = 3,
        gemm: str = "llvm",
        gemm_epilogues: bool = True,
    ):
        """``opt_level`` 0 skips LLVM's optimizations (much faster to compile, slower to run);
        ``gemm``: ``llvm`` runs products with constant weights on onnxsat's packed micro-kernel,
        ``blas`` sends every product to OpenBLAS; ``gemm_epilogues``: the micro-kernel adds a
        MatMul's bias (+ ReLU) as it stores C (False: separate kernels, for comparison)."""
        if gemm not in ("llvm", "blas"):
            raise ValueError(f"gemm must be 'llvm' or 'blas', not {gemm!r}")
        self.gemm = gemm
        self.gemm_epilogues = gemm_epilogues and gemm == "llvm"
        self.model = model
        self.opt_level = opt_level
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.value_inputs = value_inputs(model)
        self.threads = max(1, threads if threads is not None else (os.cpu_count() or 1))
        self.pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        """Threads for programs that run step by step from Python (those with numpy fallbacks)."""
        self.workers = NativeWorkers(self.threads - 1) if self.threads > 1 else None
        """Helper threads for native runs, parked between calls; joined by ``close``."""
        self.cache_dir = default_cache_dir() if cache_dir == "default" else (Path(cache_dir) if cache_dir else None)
        self._executables: dict[Any, Executable] = {}
        self.optimize_report: Any = None
        """The ``onnxsat.optimize`` report when the model was optimized before compiling."""
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        static = self._static_shapes()
        if static is not None and not self.value_inputs:
            self._executable(static, {})

    def _static_shapes(self) -> dict[str, tuple[int, ...]] | None:
        shapes: dict[str, tuple[int, ...]] = {}
        for vi in self.model.graph.input:
            if vi.name not in self.input_names:
                continue
            dims = vi.type.tensor_type.shape.dim
            if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
                return None
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
        return shapes

    def _executable(self, shapes: dict[str, tuple[int, ...]], known: dict[str, np.ndarray]) -> Executable:
        key = (tuple(sorted(shapes.items())), tuple((k, v.tobytes(), v.shape) for k, v in sorted(known.items())))
        with self._lock:
            exe = self._executables.get(key)
            if exe is None:
                program = lower(self.model, shapes, known, gemm_epilogues=self.gemm_epilogues)
                exe = Executable(program, self.pool, self.threads, self.cache_dir, opt_level=self.opt_level, gemm=self.gemm, workers=self.workers)
                self._executables[key] = exe
        return exe

    def executable_for(self, inputs: dict[str, np.ndarray]) -> Executable:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise LoweringError(f"missing input(s) {', '.join(missing)}")
        shapes = {n: tuple(np.shape(inputs[n])) for n in self.input_names}
        known = {n: np.asarray(inputs[n]) for n in self.value_inputs}
        return self._executable(shapes, known)

    def __call__(self, feeds: dict[str, np.ndarray] | None = None, **kwargs: np.ndarray) -> dict[str, np.ndarray]:
        inputs = dict(feeds or {}, **kwargs)
        exe = self.executable_for(inputs)
        with self._run_lock:  # one arena per executable: calls from several threads take turns
            return exe.run(inputs)

    def stats(self, inputs: dict[str, np.ndarray] | None = None) -> ExecutableStats:
        """What the compiler did (kernels, BLAS calls, fallbacks by op, arena size) for one signature."""
        if inputs is not None:
            return self.executable_for(inputs).stats
        if not self._executables:
            raise LoweringError("nothing compiled yet: pass example inputs")
        return next(iter(self._executables.values())).stats

    def close(self) -> None:
        """Stop and join the helper threads (also done when the model is garbage-collected)."""
        if self.workers is not None:
            self.workers.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False)
