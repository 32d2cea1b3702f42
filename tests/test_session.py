"""``onnxsat.Session``: the public stages of ``optimize``, ``--dump-dir`` and stop reasons.

A two-Transpose + Relu model keeps every run below a second: the stages must give exactly what
``optimize`` writes, and every dumped artefact must agree with what the run returned.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxsat
from onnxsat import cli, dump
from onnxsat.base.errors import UnverifiableError, VerificationError
from onnxsat.base.report import SaturationReport, StopReason, VerificationSummary
from onnxsat.egraph.graph_types import ExtractedGraph
from onnxsat.egraph.program import Program

BUDGETS = onnxsat.Budgets(iterations=4, seconds=1e9)


def transposes_then_relu() -> onnx.ModelProto:
    """x -> Transpose -> Transpose (cancel) -> Relu -> y."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
        helper.make_node("Relu", ["u"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "transposes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_stages_return_their_artefacts_and_give_what_optimize_writes() -> None:
    model = transposes_then_relu()
    options = onnxsat.Options(budgets=BUDGETS)
    with onnxsat.Session(model, options) as session:
        assert isinstance(session.load(), Program)
        saturation = session.saturate()
        assert isinstance(saturation, SaturationReport) and saturation.phases
        graph = session.extract()
        assert isinstance(graph, ExtractedGraph) and graph.cost <= session.report.cost_before
        optimized = session.export(graph)
    summary = session.verify(optimized)
    assert isinstance(summary, VerificationSummary) and summary.status == "passed"
    assert [n.op_type for n in optimized.graph.node] == ["Relu"]
    assert list(session.report.stage_seconds) == [
        "rules",
        "shapes",
        "fold",
        "declare",
        "import",
        "cost-before",
        "saturate",
        "extract",
        "export",
        "check",
        "verify",
    ]
    expected, report = onnxsat.optimize(model, options)
    assert optimized.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert session.report.cost_after == report.cost_after


def test_a_later_stage_runs_the_earlier_ones() -> None:
    with onnxsat.Session(transposes_then_relu(), onnxsat.Options(budgets=BUDGETS)) as session:
        optimized = session.export()
    assert [n.op_type for n in optimized.graph.node] == ["Relu"]
    assert {"import", "saturate", "extract", "export"} <= set(session.report.stage_seconds)


def test_verify_raises_on_a_model_that_differs() -> None:
    model = transposes_then_relu()
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    wrong.graph.node[2].op_type = "Neg"
    with pytest.raises(VerificationError):
        onnxsat.Session(model, onnxsat.Options(budgets=BUDGETS)).verify(wrong, name_culprits=False)


def test_the_original_runs_beside_the_rewrite(monkeypatch: pytest.MonkeyPatch) -> None:
    """optimize runs the original's verification run on a thread of its own while it rewrites, and
    the report keeps that run's time apart from the stages (which sum to the run's wall time)."""
    from onnxsat import verification

    threads: list[str] = []
    real = verification.inference_session
    monkeypatch.setattr(
        verification,
        "inference_session",
        lambda m, level: (threads.append(threading.current_thread().name), real(m, level))[1],
    )
    _, report = onnxsat.optimize(transposes_then_relu(), onnxsat.Options(budgets=BUDGETS))
    assert report.verification.status == "passed"
    assert len(threads) == 2 and threads[0].startswith("onnxsat-reference") and threads[1] == "MainThread", threads
    assert report.background_seconds["reference"] > 0
    assert report.verification.background_seconds == report.background_seconds["reference"]
    assert "beside the rewrite" in report.render()


def test_an_original_onnxruntime_cannot_run_fails_before_saturation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference run's failure is raised at the first stage after it ends, not after saturation."""
    from onnxsat import pipeline, reference

    def refuse(*args: object, **kwargs: object) -> None:
        raise UnverifiableError("onnxruntime cannot run the original model (refused by the test)")

    def import_after_the_reference(*args: object, **kwargs: object) -> Program:
        for thread in threading.enumerate():
            if thread.name.startswith("onnxsat-reference"):
                thread.join()  # the run has ended: saturate must see it
        return real_import(*args, **kwargs)

    saturations: list[object] = []
    real_import, real_saturate = pipeline.from_onnx, pipeline.saturate
    monkeypatch.setattr(reference, "reference_run", refuse)
    monkeypatch.setattr(pipeline, "from_onnx", import_after_the_reference)
    monkeypatch.setattr(pipeline, "saturate", lambda *a, **k: (saturations.append(a), real_saturate(*a, **k))[1])
    with pytest.raises(UnverifiableError, match="refused by the test"):
        onnxsat.optimize(transposes_then_relu(), onnxsat.Options(budgets=BUDGETS))
    assert saturations == []


def test_dump_dir_writes_each_stage_artefact(tmp_path: Path) -> None:
    source, out, folder = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "dump"
    onnx.save(transposes_then_relu(), source)
    report_path = tmp_path / "report.json"
    argv = ["optimize", str(source), "-o", str(out), "--quiet", "--max-iterations", "4"]
    assert cli.main([*argv, "--dump-dir", str(folder), "--report-json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())

    saturation = json.loads((folder / dump.SATURATION).read_text())
    assert saturation["enodes"] > 0 and saturation["eclasses"] > 0
    assert saturation["saturation"]["stop_reason"] == report["saturation"]["stop_reason"]
    assert "transpose-compose" in saturation["rules"]
    first = saturation["saturation"]["iterations"][0]
    assert first["matches"].get("transpose-compose", 0) >= 1

    extracted = json.loads((folder / dump.EXTRACTED).read_text())
    assert extracted["cost"] == pytest.approx(report["cost_after"])
    assert [n["op"] for n in extracted["nodes"]] == ["Tensor.input", "relu"]
    leaf, relu = extracted["nodes"]
    assert relu["args"] == [{"eclass": leaf["eclass"]}] and relu["shape"] == [3, 5]
    assert extracted["roots"] == [relu["eclass"]]

    assert (folder / dump.OPTIMIZED).read_bytes() == out.read_bytes()

    arrays = np.load(folder / dump.VERIFICATION)
    assert sorted(arrays.files) == ["input/x", "optimized/y", "original/y"]
    x = arrays["input/x"]
    np.testing.assert_array_equal(arrays["original/y"], np.maximum(x, 0))
    np.testing.assert_array_equal(arrays["optimized/y"], arrays["original/y"])


def test_without_dump_dir_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    onnxsat.optimize(transposes_then_relu(), onnxsat.Options(budgets=BUDGETS))
    assert list(tmp_path.iterdir()) == []


def test_stop_reasons_are_an_enum_whose_values_reports_store() -> None:
    assert [r.value for r in StopReason] == [
        "saturated", "iterations", "enodes", "seconds", "replayed", "no iterations", "no rules enabled"
    ]
    _, report = onnxsat.optimize(transposes_then_relu(), onnxsat.Options(budgets=BUDGETS))
    assert report.saturation is not None
    assert all(isinstance(p.stop_reason, StopReason) for p in report.saturation.phases)
    stored = json.loads(report.to_json())["saturation"]
    assert stored["stop_reason"] == str(report.saturation.stop_reason)
    assert f"stopped by: {report.saturation.stop_reason.value}" in report.render()
