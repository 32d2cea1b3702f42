"""``onnxsat.compile``: optimize a model (verified), then compile it for the CPU or a GPU.

The compile entry points live in the top package because they run the whole pipeline first;
the kernels layer below only compiles and runs an already optimized model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import onnx

from onnxsat.base.errors import BadInputError, OnnxsatError
from onnxsat.base.options import Options
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel


class UnsupportedTargetError(OnnxsatError):
    exit_code = 2


def compile_model(
    model: onnx.ModelProto,
    target: str = "cpu",
    options: Options | None = None,
    compile_options: CompileOptions | None = None,
    *,
    optimize: bool = True,
) -> CompiledModel:
    """Optimize ``model`` (unless ``optimize=False``) and compile it to native kernels.

    The optimized model is verified against the original by ``onnxsat.optimize`` before it is
    lowered; ``CompiledModel.optimize_report`` keeps that report. ``compile_options`` holds every
    compile setting (threads, optimization level, GEMM, epilogues, cache, cost target).
    """
    if target != "cpu":
        raise UnsupportedTargetError(f"target {target!r} is not available (only 'cpu' is built)")
    compile_options = compile_options if compile_options is not None else CompileOptions()
    report = None
    if optimize:
        from onnxsat.pipeline import optimize as run_optimize

        model, report = run_optimize(model, optimize_options(options, compile_options))
    compiled = CompiledModel(model, compile_options)
    compiled.optimize_report = report
    return compiled


CPU_COST_TARGET = "onnxsat-cpu"
"""The cost model ``compile(target="cpu")`` extracts under by default: that of onnxsat's own kernels
(the lowering's fusions priced), not onnxruntime's. On the 19 static corpus models the compiled
latency tied the ort-cpu extraction's (x0.98-x1.02, 20 interleaved rounds, two threads)."""


def optimize_options(options: Options | None, compile_options: CompileOptions) -> Options:
    """``options`` for the optimize run before lowering: the cost target of ``compile_options``, or by
    default the CPU kernels' own (``CPU_COST_TARGET``) unless ``options`` names another target than
    the default (a different target set in both is an error rather than a silent choice); and the
    model's own opset kept. The standard ops an opset upgrade would write fused kinds as (Attention,
    RotaryEmbedding) have no native kernel and would run on the fallback; as their chains of
    standard ops they lower to native kernels."""
    options = replace(options if options is not None else Options(), upgrade_opset=None)
    default_target = Options().target
    wanted = compile_options.cost_target
    if wanted is None:
        wanted = CPU_COST_TARGET if options.target == default_target else options.target
    if wanted == options.target:
        return options
    if options.target != default_target:
        raise BadInputError(f"cost target {wanted!r} (compile options) differs from {options.target!r} (optimize options)")
    return replace(options, target=wanted)


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
