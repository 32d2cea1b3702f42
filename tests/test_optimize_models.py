"""End to end: real models optimize, verify on onnxruntime, and shrink where they should."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest

import onnxsat
from onnxsat.verification import compare_models, make_inputs, run_ort

from .models import EXAMPLES, LIGHT_MODELS, expose_pre_softmax, heavy_light, load_light, randomize_weights


def _optimize(model: onnx.ModelProto, **kw) -> tuple[onnx.ModelProto, onnxsat.Report]:
    out, report = onnxsat.optimize(model, onnxsat.Options(**kw))
    onnx.checker.check_model(out, full_check=True)
    return out, report


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_optimizes_and_verifies(name: str) -> None:
    model = load_light(name)
    out, report = _optimize(model)
    assert report.verification.status == "passed"
    assert report.total_after <= report.total_before
    assert report.cost_after <= report.cost_before + 1e-6
    # Folding ConstantOfShape weights must never materialize them.
    assert out.ByteSize() <= max(model.ByteSize() + (1 << 20), int(model.ByteSize() * 1.1))


@pytest.mark.parametrize("name", [pytest.param(n, marks=heavy_light(n)) for n in LIGHT_MODELS])
def test_light_model_with_random_weights(name: str) -> None:
    model = expose_pre_softmax(randomize_weights(load_light(name), seed=1))
    out, report = _optimize(model)
    assert report.verification.status == "passed"
    feeds = make_inputs(model, seed=3)
    ref = run_ort(model, feeds)
    got = run_ort(out, feeds)
    for key, value in ref.items():
        assert np.all(np.isfinite(value)), key
        assert float(np.std(value)) > 0, f"{key} is degenerate"
        np.testing.assert_allclose(got[key], value, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(value).max())))
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    after_conv = sum(producers.get(n.input[0]) == "Conv" for n in bns)
    # Every BatchNormalization right after a Conv folds into it; the others (pre-activation) stay.
    assert report.nodes_after.get("BatchNormalization", 0) == len(bns) - after_conv


def test_layout_algebra_reaches_hand_derived_minimum() -> None:
    expected = json.loads((EXAMPLES / "layout_algebra.expected.json").read_text())
    out, report = _optimize(onnx.load(str(EXAMPLES / "layout_algebra.onnx")))
    counts = Counter(n.op_type for n in out.graph.node)
    assert sum(counts.values()) == expected["min_ops"]
    assert dict(counts) == expected["remaining_op_types"]
    assert report.verification.status == "passed"


def test_transformer_example_optimizes_and_verifies() -> None:
    model = onnx.load(str(EXAMPLES / "transformer_block.onnx"))
    out, report = _optimize(model)
    assert report.verification.status == "passed"
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    # Symbolic batch/sequence dims stay symbolic: the model runs at other sizes too.
    result = compare_models(model, out, seeds=(5,), dim_values={"batch": 3, "seq": 11})
    assert result.ok, result


def test_custom_domain_op_round_trips_intact() -> None:
    model = onnx.load(str(EXAMPLES / "custom_op.onnx"))
    out, report = _optimize(model)
    original = next(n for n in model.graph.node if n.domain == "com.example")
    kept = [n for n in out.graph.node if n.domain == "com.example"]
    assert len(kept) == 1
    assert kept[0].op_type == original.op_type
    assert list(kept[0].attribute) == list(original.attribute)
    assert report.unknown_ops == {"com.example.MyOp": 1}
    # onnxruntime cannot run MyOp: the regions around it are verified on their own.
    assert report.verification.status == "regionwise"
    assert {o.domain: o.version for o in out.opset_import} == {o.domain: o.version for o in model.opset_import}


def test_control_flow_bodies_are_untouched_and_verified() -> None:
    model = onnx.load(str(EXAMPLES / "control_flow.onnx"))
    out, report = _optimize(model)
    assert report.verification.status == "passed"
    before = next(n for n in model.graph.node if n.op_type == "If")
    after = next(n for n in out.graph.node if n.op_type == "If")
    assert list(after.attribute) == list(before.attribute)
    for cond in (True, False):
        feeds = make_inputs(model, seed=0)
        cond_name = next(i.name for i in model.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL)
        feeds[cond_name] = np.array(cond)
        ref, got = run_ort(model, feeds), run_ort(out, feeds)
        for key in ref:
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-6)


def test_small_cnn_folds_batchnorm() -> None:
    out, report = _optimize(onnx.load(str(EXAMPLES / "small_cnn.onnx")))
    assert "BatchNormalization" not in report.nodes_after
    assert report.verification.status == "passed"
    assert report.saturation.rule_matches().get("conv-batchnorm-fold", 0) > 0
