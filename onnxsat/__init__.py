"""onnxsat: an equality-saturation optimizer for ONNX tensor graphs.

Public API: ``optimize(model, options) -> (model, report)``, ``compile(model, target) ->
CompiledModel``, ``Session(model, options)`` (the stages of ``optimize`` one by one),
``Options``/``Budgets``, ``CompileOptions`` and ``Report``. Everything else is internal.
"""

from __future__ import annotations

from .base import __version__
from .base.options import Budgets, Options
from .base.report import Report
from .kernels.compile_options import CompileOptions

__all__ = ["optimize", "compile", "Session", "Options", "Budgets", "CompileOptions", "Report", "__version__"]


def optimize(model, options=None):  # type: ignore[no-untyped-def]
    """Optimize an ONNX ModelProto; see ``onnxsat.pipeline.optimize``."""
    from .pipeline import optimize as _optimize

    return _optimize(model, options)


def compile(model, target="cpu", options=None, compile_options=None, *, optimize=True):  # type: ignore[no-untyped-def]  # noqa: A001
    """Optimize and compile an ONNX ModelProto to native kernels; see ``onnxsat.compiler``.

    ``options``: the optimizer's ``Options``; ``compile_options``: a ``CompileOptions`` (threads,
    optimization level, GEMM, epilogues, cache, cost target). Returns a ``CompiledModel``:
    ``cm(input_name=array, ...)`` gives a dict of output arrays. ``target="cuda"`` returns a
    ``CudaModel`` (needs cuda-python and a GPU: ``onnxsat[cuda]``).
    """
    if target == "cuda":
        from .compiler import compile_cuda

        return compile_cuda(model, options, optimize=optimize)
    from .compiler import compile_model

    return compile_model(model, target, options, compile_options, optimize=optimize)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``onnxsat.Session`` without importing the pipeline when ``onnxsat`` is imported."""
    if name == "Session":
        from .pipeline import Session

        return Session
    raise AttributeError(f"module 'onnxsat' has no attribute {name!r}")
