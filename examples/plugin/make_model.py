"""Write ``onnxsat_soft_activations/soft_activations.onnx``: a small MLP with decomposed activations.

``x -> MatMul -> Log(Exp(h) + 1) -> MatMul -> y / (Abs(y) + 1)``, as a TensorFlow-style exporter
writes Softplus and Softsign. Deterministic (seeded weights, pinned IR version and opset), so
regenerating gives the same bytes. Run ``python make_model.py`` in this folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL = Path(__file__).resolve().parent / "onnxsat_soft_activations" / "soft_activations.onnx"


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((16, 32)) / 4).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 8)) / 6).astype(np.float32), "w2")
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Exp", ["h"], ["h_exp"]),
        helper.make_node("Add", ["h_exp", "one"], ["h_exp1"]),
        helper.make_node("Log", ["h_exp1"], ["h_softplus"]),
        helper.make_node("MatMul", ["h_softplus", "w2"], ["y"]),
        helper.make_node("Abs", ["y"], ["y_abs"]),
        helper.make_node("Add", ["one", "y_abs"], ["y_abs1"]),
        helper.make_node("Div", ["y", "y_abs1"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "soft_activations",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8])],
        [w1, w2, one],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxsat-examples"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    onnx.save(build(), str(MODEL))
    print(f"wrote {MODEL}")
