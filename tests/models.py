"""Real models for tests: the ONNX light models (with optional seeded random weights) and examples/."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(p.name for p in LIGHT_DIR.glob("*.onnx"))
HEAVY_LIGHT = frozenset({
    "light_bvlc_alexnet.onnx", "light_densenet121.onnx", "light_inception_v2.onnx", "light_resnet50.onnx",
    "light_vgg19.onnx", "light_zfnet512.onnx",
})  # fmt: skip
"""The largest light models: their random-weight, compiled and PTX runs are marked ``heavy`` (left out
of the README's test command to keep CI under its time limit; ``pytest -m heavy`` runs them). Each
still runs in ``test_light_model_optimizes_and_verifies``, and the smaller light models take the same
paths with random weights."""


def heavy_light(name: str) -> tuple:
    """The marks of a light model's parametrized case in the heavy tests."""
    return (pytest.mark.slow, pytest.mark.heavy) if name in HEAVY_LIGHT else (pytest.mark.slow,)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_light(name: str) -> onnx.ModelProto:
    return onnx.load(str(LIGHT_DIR / name))


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace every ConstantOfShape weight by seeded random values so numerics mean something.

    Fan-in-scaled normals for weights, small biases, BatchNormalization scale near 1 and
    variance positive (light models make every weight with ConstantOfShape of one value).
    """
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    bn_role: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "BatchNormalization":
            for role, name in zip(("scale", "bias", "mean", "var"), node.input[1:5], strict=False):
                bn_role[name] = role
    kept = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in consts:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in consts[node.input[0]])
        name = node.output[0]
        role = bn_role.get(name)
        if role == "var":
            value = rng.uniform(0.5, 1.5, shape)
        elif role == "scale":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif role in ("bias", "mean") or len(shape) <= 1:
            value = 0.05 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))
        if out.ir_version < 4:  # the IR 3 convention: every initializer is also listed as an input
            graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
    del graph.node[:]
    graph.node.extend(kept)
    return out


def expose_pre_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add the input of the final Softmax as an extra output (a saturated Softmax hides errors)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    softmaxes = [n for n in out.graph.node if n.op_type == "Softmax"]
    if softmaxes:
        name = softmaxes[-1].input[0]
        inferred = onnx.shape_inference.infer_shapes(out)
        info = next(vi for vi in inferred.graph.value_info if vi.name == name)
        out.graph.output.append(info)
    return out


def mlp(weight_mib: float, hidden: int = 1024) -> onnx.ModelProto:
    """MatMul -> Add -> Relu layers of seeded float32 weights, inline, of about ``weight_mib`` MiB
    (at least one layer): a model whose memory is all weights (tests/test_memory_peak.py,
    benchmarks/scale_out.py memory)."""
    rng = np.random.default_rng(0)
    layers = max(1, round(weight_mib * 2**20 / (4 * hidden * hidden)))
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((hidden, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden))
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(hidden, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, hidden])],
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [4, hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
