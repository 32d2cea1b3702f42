"""Writing for onnxruntime: residual adds before LayerNormalization kept out of its slow
SkipLayerNormalization fusion (``egraph.ort_forms``), on a committed BERT export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxsat
from onnxsat.base.options import Options
from onnxsat.egraph import ort_forms
from onnxsat.egraph.ort_forms import avoid_slow_ort_fusions, residual_norm_adds

from .helpers_onnx import ort_ran_ops
from .realmodels_feeds import feeds_for

DATA = Path(__file__).parent / "data" / "realmodels"


def _bert() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    entry = json.loads((DATA / "INDEX.json").read_text())["bert-ts-dynamic"]
    return onnx.load(DATA / entry["file"]), feeds_for(entry["inputs"], entry["seed"])


def _run_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs at ORT_ENABLE_ALL: the original's residual adds fused, the rewrite's not."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_onnxruntime_fuses_the_residual_add_but_not_the_sum(tmp_path: Path) -> None:
    """The mechanism the rewrite relies on: ORT_ENABLE_ALL turns Add -> LayerNormalization into
    SkipLayerNormalization, and leaves Sum -> LayerNormalization alone."""
    fused = ort_ran_ops(ort_forms.skip_norm_probe("Add"), tmp_path)
    kept = ort_ran_ops(ort_forms.skip_norm_probe("Sum"), tmp_path)
    assert fused["SkipLayerNormalization"] == 1 and fused["LayerNormalization"] == 0
    assert kept["SkipLayerNormalization"] == 0 and kept["LayerNormalization"] == 1 and kept["Sum"] == 1


def test_the_residual_adds_of_a_bert_export_become_sums_with_the_same_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model, feeds = _bert()
    adds = residual_norm_adds(model)
    layer_norms = sum(node.op_type == "LayerNormalization" for node in model.graph.node)
    assert len(adds) == layer_norms == 5  # embeddings, and two per layer of the two-layer export
    monkeypatch.setattr(ort_forms, "skip_norm_fusion_slower", lambda: True)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert avoid_slow_ort_fusions(rewritten) == 5
    assert residual_norm_adds(rewritten) == []
    ops = ort_ran_ops(rewritten, tmp_path)
    assert ops["SkipLayerNormalization"] == 0 and ops["Sum"] == 5
    for before, after in zip(_run_all(model, feeds), _run_all(rewritten, feeds), strict=True):
        np.testing.assert_array_equal(before, after)


def test_nothing_is_rewritten_where_the_fusion_is_not_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _bert()
    monkeypatch.setattr(ort_forms, "skip_norm_fusion_slower", lambda: False)
    assert avoid_slow_ort_fusions(model) == 0
    assert not any(node.op_type == "Sum" for node in model.graph.node)


def test_optimize_writes_sums_for_onnxruntime_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``ort-cpu`` target's output carries the Sums and says so; the compile target's does not."""
    model, _ = _bert()
    monkeypatch.setattr(ort_forms, "skip_norm_fusion_slower", lambda: True)
    for target, sums in (("ort-cpu", 5), ("onnxsat-cpu", 0)):
        optimized, report = onnxsat.optimize(model, Options(target=target))
        assert sum(node.op_type == "Sum" for node in optimized.graph.node) == sums
        assert any("written as Sum" in w for w in report.warnings) == bool(sums)
        assert report.verification.status == "passed"



def test_float16_norms_keep_their_adds() -> None:
    """The probe measures float32 kernels: a float16 export's residual adds are left as they are."""
    model = onnx.load(DATA / "bert-ts-static-fp16.onnx")
    assert any(node.op_type == "LayerNormalization" for node in model.graph.node)
    assert residual_norm_adds(model) == []
