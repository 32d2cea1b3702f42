"""One ONNX node run on its own: constant folding at compile time, fallbacks at run time.

onnx's reference evaluator runs them; it keeps implementations of some op versions only (at onnx
1.23 DequantizeLinear from opset 19 on, so a QDQ model exported at opset 17 has none), and for a
node it cannot run, onnxruntime (no graph optimizations, one thread) runs it instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

NodeRunner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def node_runner(model: onnx.ModelProto) -> NodeRunner:
    """A function from feeds to the outputs of ``model`` (one node with its inputs as graph inputs)."""
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(model)
    except RuntimeError as exc:
        if not str(exc).startswith("No implementation for operator"):
            raise
        return _onnxruntime_runner(model)
    return lambda feeds: [np.asarray(v) for v in evaluator.run(None, feeds)]


def _onnxruntime_runner(model: onnx.ModelProto) -> NodeRunner:
    import onnxruntime as ort

    typed = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # onnxruntime wants output types
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(typed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda feeds: [np.asarray(v) for v in session.run(None, feeds)]
