"""``onnxsat.compile``: optimize a model (verified), then compile it for the CPU or a GPU.

The compile entry points live in the top package because they run the whole pipeline first;
the kernels layer below only compiles and runs an already optimized model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from onnxsat.base.errors import OnnxsatError
from onnxsat.base.options import Options
from onnxsat.kernels.compiled import CompiledModel


class UnsupportedTargetError(OnnxsatError):
    exit_code = 2


def compile_model(
    model: onnx.ModelProto,
    target: str = "cpu",
    options: Options | None = None,
    *,
    optimize: bool = True,
    threads: int | None = None,
    cache_dir: Path | str | None = "default",
) -> CompiledModel:
    """Optimize ``model`` (unless ``optimize=False``) and compile it to native kernels.

    The optimized model is verified against the original by ``onnxsat.optimize`` before it is
    lowered; ``CompiledModel.optimize_report`` keeps that report.
    """
    if target != "cpu":
        raise UnsupportedTargetError(f"target {target!r} is not available (only 'cpu' is built)")
    report = None
    if optimize:
        from onnxsat.pipeline import optimize as run_optimize

        model, report = run_optimize(model, options)
    compiled = CompiledModel(model, threads=threads, cache_dir=cache_dir)
    compiled.optimize_report = report
    return compiled


def compile_cuda(model: onnx.ModelProto, options: Any = None, *, optimize: bool = True) -> Any:
    """``onnxsat.compile(model, target="cuda")``: open the GPU first (a clear error without one),
    then optimize (verified on onnxruntime) and return the ``CudaModel``."""
    from onnxsat.kernels.cuda.runtime import CudaModel, open_device

    device = open_device()
    report = None
    if optimize:
        from onnxsat.pipeline import optimize as run_optimize

        model, report = run_optimize(model, options)
    cm = CudaModel(model, device)
    cm.optimize_report = report
    return cm
