"""How a model is written for onnxruntime where its own graph optimizer would make it slower.

onnxruntime (ORT_ENABLE_EXTENDED and above) fuses a residual ``Add`` that feeds a
``LayerNormalization`` into com.microsoft ``SkipLayerNormalization``. onnxruntime 1.32's CPU kernel
for it ran 5-8x slower than the two ops it replaces ([1, 128, 768] float32, one thread: 564 us
against 71 us for Add + LayerNormalization), so a BERT-style export got slower exactly where
onnxsat's rewrite made its shapes clear enough for the fusion to match (BERT-base with dynamic axes:
24 fused blocks, 23.5 ms of 278 ms). ``Sum`` of two tensors is the same function, and the fusion
matches ``Add`` only, so where the fusion is slower the residual add is written as ``Sum``.

Whether it is slower is measured once per process on the installed onnxruntime
(``skip_norm_fusion_slower``), as the fused ops it can run are probed (``ops.ort_probe``), not
assumed: a later onnxruntime with a faster kernel keeps the ``Add``.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

SLOWER_BY = 1.25
"""The fused form must take this many times the unfused one's time before it is avoided: far from
the 5-8x measured, far above the probe's noise."""
PROBE_SHAPE = (1, 128, 768)
"""The probe's activations: one BERT-base sequence of 128 tokens."""
PROBE_ROUNDS = 15


def residual_norm_adds(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The default-domain ``Add`` nodes whose output is the input ``X`` of a float32
    ``LayerNormalization`` (the dtype the probe measures; its scale tells it): what onnxruntime's
    SkipLayerNormFusion fuses."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    declared = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    declared.update((t.name, t.data_type) for t in graph.initializer)
    found: dict[int, onnx.NodeProto] = {}
    for node in graph.node:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        if _dtype(declared, producer, node.input[1]) != TensorProto.FLOAT:
            continue
        add = producer.get(node.input[0])
        if add is not None and add.op_type == "Add" and add.domain in ("", "ai.onnx") and len(add.input) == 2:
            found[id(add)] = add
    return list(found.values())


def _dtype(declared: dict[str, int], producer: dict[str, onnx.NodeProto], name: str) -> int | None:
    """The element type of ``name`` where the graph states it (``declared``: initializers and typed
    values; a Constant; through Identity); None where it does not."""
    for _ in range(8):  # a short Identity chain (TorchScript exports share weights through them)
        if declared.get(name):
            return declared[name]
        node = producer.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return value.data_type if value is not None else None
        if node.op_type != "Identity":
            return None
        name = node.input[0]
    return None


def avoid_slow_ort_fusions(model: onnx.ModelProto) -> int:
    """Write each residual ``Add`` before a ``LayerNormalization`` as ``Sum`` (in place) when the
    installed onnxruntime runs its SkipLayerNormalization fusion slower than the ops it fuses.
    Returns how many were rewritten."""
    adds = residual_norm_adds(model)
    if not adds or not skip_norm_fusion_slower():
        return 0
    for node in adds:
        node.op_type = "Sum"
    return len(adds)


@functools.cache
def skip_norm_fusion_slower() -> bool:
    """True when onnxruntime at ORT_ENABLE_ALL runs ``Add -> LayerNormalization`` (which it fuses)
    more than ``SLOWER_BY`` times slower than ``Sum -> LayerNormalization`` (which it does not),
    both on one thread, timed in interleaved rounds (minimum of each side)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(PROBE_SHAPE).astype(np.float32) for name in ("x", "skip")}
    sessions = []
    for op in ("Add", "Sum"):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 4
        try:
            sessions.append(ort.InferenceSession(skip_norm_probe(op).SerializeToString(), options, providers=["CPUExecutionProvider"]))
        except Exception:  # an onnxruntime without the op at this opset: nothing to avoid
            return False
    best = [float("inf"), float("inf")]
    for _ in range(PROBE_ROUNDS):
        for i, session in enumerate(sessions):
            start = time.perf_counter()
            session.run(None, feeds)
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0] > SLOWER_BY * best[1]


def skip_norm_probe(add_op: str) -> onnx.ModelProto:
    """The probe: ``add_op`` (Add or Sum) of two [batch, sequence, 768] tensors, then LayerNormalization."""
    hidden = PROBE_SHAPE[-1]
    rng = np.random.default_rng(1)
    weights = [
        helper.make_tensor(name, TensorProto.FLOAT, [hidden], rng.uniform(0.5, 1.5, hidden).astype(np.float32).tolist())
        for name in ("scale", "shift")
    ]
    nodes = [
        helper.make_node(add_op, ["x", "skip"], ["total"]),
        helper.make_node("LayerNormalization", ["total", "scale", "shift"], ["y"], axis=-1, epsilon=1e-12),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "sequence", hidden]) for name in ("x", "skip")]
    graph = helper.make_graph(nodes, "skip_norm_probe", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
