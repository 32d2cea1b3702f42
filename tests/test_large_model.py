"""The large-model path at a small size: external-data input, CLI optimize, external-data output.

``benchmarks/large_model.py`` runs this with more than 2 GiB of weights; here its own builder
writes a small model, and the protobuf limit is lowered so that every branch a real >2 GiB model
takes is taken: the checker reads the file by path, verification runs onnxruntime from a
temporary external-data copy, the optimized model is checked by path and is written with a
sidecar without being asked to.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import onnx
import pytest

from onnxsat import cli, modelio

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "large_model.py"


def _benchmark_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("large_model", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("past_limit", [False, True], ids=["external-data-flag", "past-proto-limit"])
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

    argv = ["optimize", str(src), "-o", str(dst), "--json", "--max-iterations", "3"]
    if past_limit:
        checked: list[object] = []
        real_check = onnx.checker.check_model
        monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 10_000)
        monkeypatch.setattr(
            onnx.checker, "check_model", lambda m, *a, **k: (checked.append(m), real_check(m, *a, **k))[1]
        )
    else:
        argv.append("--external-data")
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verification"]["status"] == "passed"
    assert report["total_nodes_after"] < report["total_nodes_before"]  # MatMul + Add became Gemm
    if past_limit:
        assert checked and all(isinstance(m, str) for m in checked), "a large model was checked in memory"

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before
    assert (tmp_path / "large.opt.onnx.data").is_file()
    onnx.checker.check_model(str(dst), full_check=True)
    out_shell = onnx.load(str(dst), load_external_data=False)
    assert any(onnx.external_data_helper.uses_external_data(t) for t in out_shell.graph.initializer)
    assert bench.compare_files(src, dst) <= 1e-4
