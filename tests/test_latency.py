"""The latency comparison: its verdict follows the interval, and it detects a real difference."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsat.latency import LatencyComparison, bootstrap_ratio_ci, compare_latency, compare_models


def test_verdict_follows_the_interval() -> None:
    assert LatencyComparison(1, 1, 1.1, 1.03, 1.2, 30).verdict == "win"
    assert LatencyComparison(1, 1, 0.9, 0.8, 0.97, 30).verdict == "loss"
    assert LatencyComparison(1, 1, 1.05, 1.01, 1.1, 30).verdict == "tie"


def test_bootstrap_interval_contains_the_true_ratio() -> None:
    rng = np.random.default_rng(1)
    a = 2.0 + 0.05 * rng.standard_normal(60)
    b = 1.0 + 0.05 * rng.standard_normal(60)
    low, high = bootstrap_ratio_ci(a, b)
    assert low < 2.0 < high and high - low < 0.3


def test_block_bootstrap_carries_a_shared_draw() -> None:
    """Rounds in runs of 3 that share a draw (one process timing them, its memory layout moving its
    times by a few percent) give an interval about that draw, not one as narrow as 30 independent
    rounds would; each run is kept whole, so a single run leaves a single ratio."""
    rng = np.random.default_rng(4)
    draws = np.repeat(1.0 + 0.03 * rng.standard_normal(10), 3)  # one layout draw per run of 3 rounds
    a = 1.0 + 0.002 * rng.standard_normal(30)
    b = draws * (1.0 + 0.002 * rng.standard_normal(30))
    by_round, by_run = bootstrap_ratio_ci(a, b), bootstrap_ratio_ci(a, b, block=3)
    assert by_run[1] - by_run[0] > 1.5 * (by_round[1] - by_round[0])
    whole = bootstrap_ratio_ci(a, b, block=30)
    assert whole[0] == whole[1] == pytest.approx(np.median(a) / np.median(b))


def test_a_slower_baseline_is_a_win() -> None:
    result = compare_latency(lambda: time.sleep(0.004), lambda: time.sleep(0.001), rounds=6, calls_per_round=2, warmup=1)
    assert result.verdict == "win" and result.ratio > 1.5, result


def test_settling_pause_and_call_are_not_timed() -> None:
    """With ``settle_s`` each block starts after an untimed pause and call: a side whose first call
    after a switch is slow (a runtime waking its threads) is timed on its later calls only."""
    calls = {"a": 0, "b": 0}
    last: list[str] = []

    def side(name: str, fast: float) -> None:
        calls[name] += 1
        time.sleep(0.02 if last[-1:] != [name] else fast)  # slow right after the other side ran
        last.append(name)

    def run(settle_s: float) -> object:
        return compare_latency(lambda: side("a", 0.002), lambda: side("b", 0.001), rounds=4, calls_per_round=1, warmup=1, settle_s=settle_s)

    unsettled = run(0.0)
    assert max(unsettled.baseline_ms, unsettled.candidate_ms) > 15, unsettled  # type: ignore[attr-defined]
    calls.update(a=0, b=0)
    settled = run(0.001)
    assert settled.baseline_ms < 5 and settled.candidate_ms < 5 and settled.ratio > 1.5, settled  # type: ignore[attr-defined]
    assert calls["a"] == calls["b"] == 1 + 4 * 2


def test_compare_models_times_both_sessions() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    model.opset_import[0].version = 18
    onnx.checker.check_model(model)
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    result = compare_models(model, model, feeds, rounds=4, calls_per_round=2, threads=1)
    assert result.rounds == 4 and result.baseline_ms > 0 and result.candidate_ms > 0 and result.ci_low <= result.ci_high


def test_measure_ships_the_cleaned_original_when_onnxruntime_cannot_run_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A custom-domain op onnxruntime lacks: nothing can be timed, so nothing is measurably faster."""
    from onnxsat import measure, pipeline
    from onnxsat.base.options import Options
    from onnxsat.base.report import Report

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    node = helper.make_node("MyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    cleaned = onnx.ModelProto()
    calls: list[Options] = []
    monkeypatch.setattr(pipeline, "optimize", lambda m, o: (calls.append(o), (cleaned, None))[1])
    report = Report(model_name="g")
    assert measure.keep_if_faster(model, onnx.ModelProto(), Options(measure=True), report) is cleaned
    assert [o.rules_only for o in calls] == [("core",)]
    assert report.measured is not None and report.measured["shipped"] == "cleaned-original"
    assert "MyOp" in report.measured["unmeasured"] and "cannot time" in report.measured["summary"]
    assert any("--measure" in w for w in report.warnings)


def test_a_session_gets_large_weights_as_arrays_and_computes_what_the_file_does() -> None:
    """A real export (weights of 4 KiB and more go to onnxruntime as arrays, not serialized): the
    same outputs as onnxruntime's own session of the model, which keeps them alive."""
    import onnxruntime as ort

    from onnxsat.base.weightless import stripped
    from onnxsat.latency import ort_session
    from onnxsat.verification_inputs import make_inputs

    model = onnx.load(str(Path(__file__).parent / "data" / "realmodels" / "llama-ts-static.onnx"))
    assert stripped(model)
    feeds = make_inputs(model, 0)
    session = ort_session(model, level="disable")
    assert len(session._onnxsat_weights) == len(stripped(model))
    names = {i.name for i in session.get_inputs()}
    got = session.run(None, {k: v for k, v in feeds.items() if k in names})
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {k: v for k, v in feeds.items() if k in names}
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
