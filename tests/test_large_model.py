"""The large-model path at a small size: external-data input, CLI optimize, external-data output.

``benchmarks/large_model.py`` runs this with more than 2 GiB of weights; here its own builder
writes a small model, and the lazy-weight threshold and the protobuf limit are lowered so that
every branch a real >2 GiB model takes is taken: its weights stay in their file from load to save
(onnxruntime maps them, the checker sees a sparse placeholder), the optimized model is checked by
path and is written with a streamed sidecar without being asked to.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxsat import cli
from onnxsat.base import lazy_weights, modelio
from onnxsat.base.errors import BadInputError

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "large_model.py"


def _benchmark_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("large_model", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("past_limit", [False, True], ids=["inline-output", "past-proto-limit"])
def test_external_data_model_optimizes_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], past_limit: bool
) -> None:
    bench = _benchmark_module()
    src, dst = tmp_path / "large.onnx", tmp_path / "large.opt.onnx"
    weight_bytes = bench.build_large_model(src, hidden=64, layers=3)
    assert weight_bytes >= 3 * 64 * 64 * 4
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    shell = onnx.load(str(src), load_external_data=False)
    assert all(onnx.external_data_helper.uses_external_data(t) for t in shell.graph.initializer)

    # The 16 KiB weights count as large here, so they take the path of a real large model: never
    # read into a proto (the 256-byte biases are loaded), held by reference from load to save.
    monkeypatch.setattr(lazy_weights, "LAZY_MIN_BYTES", 4096)
    held: list[onnx.ModelProto] = []
    real_save = modelio.save_model_atomic
    monkeypatch.setattr(
        modelio, "save_model_atomic", lambda m, *a, **k: (held.append(m), real_save(m, *a, **k))[1]
    )
    argv = ["optimize", str(src), "-o", str(dst), "--json", "--max-iterations", "3"]
    if past_limit:
        checked: list[object] = []
        real_check = onnx.checker.check_model
        monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 10_000)
        monkeypatch.setattr(
            onnx.checker, "check_model", lambda m, *a, **k: (checked.append(m), real_check(m, *a, **k))[1]
        )
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verification"]["status"] == "passed"
    assert report["total_nodes_after"] < report["total_nodes_before"]  # MatMul + Add became Gemm
    if past_limit:
        assert checked and all(isinstance(m, str) for m in checked), "a large model was checked in memory"
    (optimized,) = held
    assert len(lazy_weights.lazy_initializers(optimized)) == 3, "weights were loaded into the optimized proto"
    assert optimized.ByteSize() < 3 * 64 * 64 * 4 // 2

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before
    assert (tmp_path / "large.opt.onnx.data").is_file() == past_limit
    onnx.checker.check_model(str(dst), full_check=True)
    out_shell = onnx.load(str(dst), load_external_data=False)
    external = any(onnx.external_data_helper.uses_external_data(t) for t in out_shell.graph.initializer)
    assert external == past_limit
    assert all(e.key != "basepath" for t in out_shell.graph.initializer for e in t.external_data)
    assert bench.compare_files(src, dst) <= 1e-4


def test_lazy_weights_read_like_onnx_and_are_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _benchmark_module()
    src = tmp_path / "large.onnx"
    bench.build_large_model(src, hidden=32, layers=2)
    monkeypatch.setattr(lazy_weights, "LAZY_MIN_BYTES", 1024)
    alias = tmp_path / "alias.onnx"  # the same model under another name, reading large.onnx.data
    alias.write_bytes(src.read_bytes())
    lazy = modelio.load_model(alias, lazy=True)
    eager = modelio.load_model(src)
    assert [t.name for t in lazy_weights.lazy_initializers(lazy)] == ["w0", "w1"]
    for a, b in zip(lazy.graph.initializer, eager.graph.initializer, strict=True):
        np.testing.assert_array_equal(lazy_weights.tensor_array(a), numpy_helper.to_array(b))
    assert modelio.serialized_size(lazy) >= 2 * 32 * 32 * 4
    files_before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # Writing large.onnx (+ large.onnx.data) would replace the weight file being streamed from.
    with pytest.raises(BadInputError, match="holds the input model's weights"):
        modelio.save_model_atomic(lazy, src, external_data=True, input_path=alias)
    with pytest.raises(BadInputError, match="holds the input model's weights"):
        modelio.save_model_atomic(lazy, tmp_path / "large.onnx.data", input_path=alias)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files_before
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    modelio.save_model_atomic(lazy, moved / "copy.onnx", external_data=True, input_path=alias)
    again = modelio.load_model(moved / "copy.onnx")
    for a, b in zip(again.graph.initializer, eager.graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_cli_refuses_an_output_on_the_weight_file_before_optimizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxsat.pipeline

    src = tmp_path / "large.onnx"
    _benchmark_module().build_large_model(src, hidden=32, layers=2)
    monkeypatch.setattr(lazy_weights, "LAZY_MIN_BYTES", 1024)
    alias = tmp_path / "alias.onnx"  # reads large.onnx.data
    alias.write_bytes(src.read_bytes())
    weights = tmp_path / "large.onnx.data"
    before = weights.read_bytes()
    monkeypatch.setattr(onnxsat.pipeline, "optimize", lambda *a, **k: pytest.fail("optimized before refusing"))
    assert cli.main(["optimize", str(alias), "-o", str(weights), "--quiet"]) == 2
    assert "is the input's file" in capsys.readouterr().err
    assert weights.read_bytes() == before


def test_latency_sessions_and_regionwise_check_keep_weights_in_their_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--measure``'s sessions (``onnxsat.latency``) run a model whose weights stay in their file
    (onnxruntime maps them from their folder) or that is past the protobuf limit (a temporary
    external-data copy), computing what the loaded model computes; a model with a custom-domain
    node is checked region by region with its weights in their file."""
    from onnxsat.latency import compare_models, ort_session
    from onnxsat.regions import compare_by_regions

    src = tmp_path / "large.onnx"
    _benchmark_module().build_large_model(src, hidden=64, layers=2)
    eager = modelio.load_model(src)
    monkeypatch.setattr(lazy_weights, "LAZY_MIN_BYTES", 4096)
    model = modelio.load_model(src, lazy=True)
    assert [t.name for t in lazy_weights.lazy_initializers(model)] == ["w0", "w1"]
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)}
    (want,) = ort_session(eager, level="disable").run(None, feeds)
    (got,) = ort_session(model).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 10_000)
    (got,) = ort_session(eager, prepacking=False).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    timed = compare_models(model, eager, feeds, rounds=2, calls_per_round=1)
    assert timed.baseline_ms > 0 and timed.candidate_ms > 0

    # A custom op between the layers: onnxruntime cannot run the model, so each region is checked.
    custom = onnx.ModelProto()
    custom.CopyFrom(model)
    nodes = list(custom.graph.node)
    for node in nodes:
        node.input[:] = ["h0c" if name == "h0" else name for name in node.input]
    at = 1 + next(i for i, n in enumerate(nodes) if "h0" in n.output)
    nodes.insert(at, onnx.helper.make_node("Opaque", ["h0"], ["h0c"], domain="test.custom"))
    del custom.graph.node[:]
    custom.graph.node.extend(nodes)
    custom.opset_import.append(onnx.helper.make_opsetid("test.custom", 1))
    custom.graph.value_info.append(onnx.helper.make_tensor_value_info("h0c", onnx.TensorProto.FLOAT, ["batch", 64]))
    wrong = onnx.ModelProto()
    wrong.CopyFrom(custom)
    wrong.graph.node[-1].op_type = "Sigmoid"  # the last Relu: the region after the custom op differs
    assert compare_by_regions(custom, custom).ok
    assert not compare_by_regions(custom, wrong).ok
