"""``CompiledModel``: an ONNX model compiled to native CPU kernels, callable on numpy arrays.

Compilation is specialized on input shapes (and on the values of inputs that decide shapes, such
as a Reshape target fed from the graph input): the first call with a new signature lowers and
compiles, later calls reuse the executable. Static shapes given at compile time are compiled
eagerly.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx

from onnxsat.lowering.lower import LoweringError, lower, value_inputs

from . import artefact_cache
from .build import cache_directory, prestart_helpers
from .compile_options import CompileOptions
from .executable import Executable, ExecutableStats
from .native_runner import NativeWorkers
from .step_profile import PhaseTime, profile_executable


class CompiledModel:
    """Call with keyword arrays (``cm(x=...)``) or a dict (``cm({'x': ...})``); returns a dict."""

    def __init__(self, model: onnx.ModelProto, options: CompileOptions | None = None):
        """``options``: threads, optimization level, GEMM choice, epilogues, cache (defaults: all
        cores, O3, the packed micro-kernel with epilogues, ``~/.cache/onnxsat/kernels``)."""
        self.options = options if options is not None else CompileOptions()
        self.model = model
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.value_inputs = value_inputs(model)
        self.threads = self.options.run_threads
        self.cache_dir = cache_directory(self.options)
        self._model_hash: str | None = None
        self.pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        """Threads for programs that run step by step from Python (those with numpy fallbacks)."""
        self.workers = NativeWorkers(self.threads - 1, self.cache_dir) if self.threads > 1 else None
        """Helper threads for native runs, parked between calls; joined by ``close``."""
        self._executables: dict[Any, Executable] = {}
        self.optimize_report: Any = None
        """The ``onnxsat.optimize`` report when the model was optimized before compiling."""
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        static = self._static_shapes()
        if static is not None and not self.value_inputs:
            self._executable(static, {})

    def artefact_key(self, shapes: dict[str, tuple[int, ...]], known: dict[str, np.ndarray]) -> str:
        """The artefact-cache key of this model compiled for one signature."""
        if self._model_hash is None:
            self._model_hash = artefact_cache.model_digest(self.model)
        return artefact_cache.artefact_key(self._model_hash, artefact_cache.signature_digest(shapes, known), self.options)

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
                start = time.perf_counter()
                artefact = self.artefact_key(shapes, known) if self.cache_dir is not None else None
                if artefact is None or not artefact_cache.exists(self.cache_dir, artefact):
                    prestart_helpers(self.options)  # they boot while the model is lowered
                hashed = time.perf_counter()
                program = lower(
                    self.model, shapes, known, gemm_epilogues=self.options.gemm_epilogues, output_views=True
                )
                lowered = time.perf_counter()
                exe = Executable(program, self.pool, self.options, workers=self.workers, artefact_key=artefact)
                exe.stats.stage_seconds = {"hash": hashed - start, "lower": lowered - hashed, **exe.stats.stage_seconds}
                exe.stats.compile_seconds += lowered - start
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

    def profile(self, feeds: dict[str, np.ndarray], runs: int = 20) -> list[PhaseTime]:
        """Each phase's median time over ``runs`` runs on ``feeds``, as it runs (see ``step_profile``)."""
        exe = self.executable_for(feeds)
        with self._run_lock:
            return profile_executable(exe, feeds, runs)

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
