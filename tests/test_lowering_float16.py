"""Compiled float16 kernels are native and as accurate as onnxruntime's: reductions, norms, softmax
and products accumulate in float32 and transcendental functions are evaluated in float32, each
rounded once to float16 when stored; tanh neither overflows to NaN in float16 nor in float64.

Accuracy is measured against the float64 evaluation of the same op (onnx's reference evaluator on
a float64 copy) at sizes where float16 sums visibly lose digits (rows of 256), and the compiled
result must be about as close as onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxsat

RNG = np.random.default_rng(0)
X = (RNG.normal(size=(1, 64, 256)) * 2).astype(np.float16)
SCALE = RNG.normal(size=256).astype(np.float16)
BIAS = RNG.normal(size=256).astype(np.float16)


def _model(op: str, elem: int, attrs: dict, weights: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", *weights], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, None)],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float64_twin(op: str, attrs: dict, weights: dict[str, np.ndarray], opset: int) -> ReferenceEvaluator:
    wide = {k: v.astype(np.float64) if v.dtype == np.float16 else v for k, v in weights.items()}
    return ReferenceEvaluator(_model(op, TensorProto.DOUBLE, attrs, wide, opset))


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _compiled(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    compiled = onnxsat.compile(model, optimize=False)
    (out,) = compiled({"x": x}).values()
    assert not compiled.stats({"x": x}).fallbacks  # every op has a native float16 kernel
    return out


CASES = {
    "LayerNormalization": ({"axis": -1, "epsilon": 1e-5}, {"scale": SCALE, "bias": BIAS}, 17),
    "Softmax": ({"axis": -1}, {}, 17),
    "ReduceMean": ({"axes": [-1]}, {}, 17),
    "ReduceSum": ({}, {"axes": np.array([-1], np.int64)}, 17),
    "RMSNormalization": ({"axis": -1, "epsilon": 1e-5}, {"scale": SCALE}, 23),
    "Tanh": ({}, {}, 17),
    "Erf": ({}, {}, 17),
    "Sigmoid": ({}, {}, 17),
    "MatMul": ({}, {"w": (RNG.normal(size=(256, 96)) * 0.2).astype(np.float16)}, 17),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_float16_op_is_as_accurate_as_onnxruntime(op: str) -> None:
    attrs, weights, opset = CASES[op]
    model = _model(op, TensorProto.FLOAT16, attrs, weights, opset)
    (truth,) = _float64_twin(op, attrs, weights, opset).run(None, {"x": X.astype(np.float64)})
    got = _compiled(model, X)
    assert got.dtype == np.float16 and got.shape == truth.shape
    ours = float(np.max(np.abs(got.astype(np.float64) - truth)))
    if opset <= 22:  # onnxruntime 1.32 has no float16 RMSNormalization kernel to compare with
        theirs = float(np.max(np.abs(_ort(model, X).astype(np.float64) - truth)))
    else:
        theirs = float(np.max(np.abs(truth.astype(np.float16).astype(np.float64) - truth)))  # one rounding
    assert ours <= 1.25 * theirs + 1e-7, f"{op}: {ours:.3g} from float64, onnxruntime {theirs:.3g}"


@pytest.mark.parametrize(("elem", "dtype"), [(TensorProto.FLOAT16, np.float16), (TensorProto.DOUBLE, np.float64)])
def test_tanh_saturates_instead_of_overflowing(elem: int, dtype: type) -> None:
    """tanh as (1 - e) / (1 + e) with e = exp(-2x) is inf / inf for x below -5.5 in float16 and
    below -354 in float64."""
    x = np.array([-1000.0, -400.0, -20.0, -6.0, -1.0, 0.0, 1.0, 6.0, 20.0, 400.0, 1000.0], dtype)
    got = _compiled(_model("Tanh", elem, {}, {}), x)
    np.testing.assert_allclose(got.astype(np.float64), np.tanh(x.astype(np.float64)), rtol=2e-3 if dtype == np.float16 else 1e-12, atol=0)



def test_cli_checks_a_float16_model_at_float16_precision(capsys) -> None:  # type: ignore[no-untyped-def]
    """``onnxsat compile`` compares with onnxruntime at the tolerance optimize's verification uses for
    the output: a float16 BERT differs from onnxruntime by float16 roundings, not float32's."""
    from pathlib import Path

    from onnxsat import cli

    model = Path(__file__).parent / "data" / "realmodels" / "bert-ts-static-fp16.onnx"
    assert cli.main(["compile", str(model), "--no-optimize", "--no-cache"]) == 0
    assert "matches onnxruntime" in capsys.readouterr().out


def test_output_check_holds_each_output_to_its_precision() -> None:
    from onnxsat.base.errors import VerificationError
    from onnxsat.compile_command import check_outputs

    ref = np.linspace(-4, 4, 64, dtype=np.float32)
    off = ref + np.float32(4e-3)  # 1e-3 of max|ref|: ten float16 ulps, thousands of float32 ones
    half = _model("Tanh", TensorProto.FLOAT16, {}, {})
    single = _model("Tanh", TensorProto.FLOAT, {}, {})
    assert check_outputs(half, {"y": ref.astype(np.float16)}, {"y": off.astype(np.float16)}, "compiled")["y"] > 0
    assert check_outputs(single, {"y": ref}, {"y": ref + np.float32(1e-6)}, "compiled")["y"] > 0
    with pytest.raises(VerificationError):
        check_outputs(single, {"y": ref}, {"y": off * 10}, "compiled")
