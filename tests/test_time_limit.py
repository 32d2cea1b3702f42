"""``--time-limit S`` bounds the whole run, not saturation alone: from the end of loading to the
written file at most 2 S plus verification, on a graph too large to import in S (a long unary
chain, as ``benchmarks/time_limit.py`` runs at 50,000 nodes). The input then comes back
unchanged, with a warning that says why; a graph that fits is still optimized."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import onnx

import onnxsat
from onnxsat.base.options import Budgets, Options

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "time_limit.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("time_limit_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_chain_too_long_to_import_in_the_limit_comes_back_in_time(tmp_path: Path) -> None:
    bench, limit = _bench(), 2.0
    path = tmp_path / "chain.onnx"
    onnx.save(bench.unary_chain(10000), str(path))  # ~7 s to import whole here
    run = bench.run_one(path, "unary", 10000, limit, ["--region-nodes", "0"])  # by regions it is done in time
    assert run.exit_code == 0, run.stderr
    assert run.after_load - run.fixed <= 2.5 * limit, run.stages  # the limit, then checking and writing the input (4.1 s on a loaded 2-core Zen 3)
    assert "time limit ran out after importing" in run.stderr  # --quiet still says what was written
    written = onnx.load(str(path.with_suffix(".2.opt.onnx")))
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in onnx.load(str(path)).graph.node]
    report = json.loads(path.with_suffix(".2.json").read_text())
    assert "time limit" in report["kept_original"]


def test_a_small_graph_within_the_limit_is_still_optimized() -> None:
    model = _bench().unary_chain(6)  # Relu, Neg, Identity twice: the Identities go
    out, report = onnxsat.optimize(model, Options(budgets=Budgets(seconds=60.0, whole_run=True)))
    assert report.verification.status == "passed"
    assert not report.kept_original
    assert len(out.graph.node) < len(model.graph.node)


def test_the_api_limit_is_on_saturation_alone_by_default() -> None:
    """Without ``whole_run`` (the API default) an import longer than ``seconds`` is not cut."""
    model = _bench().unary_chain(40)
    _, report = onnxsat.optimize(model, Options(budgets=Budgets(seconds=1e-6)))
    assert not report.kept_original and report.verification.status == "passed"


def test_the_cli_flag_sets_a_whole_run_limit() -> None:
    from onnxsat.cli import build_parser, options_from_args

    args = build_parser().parse_args(["optimize", "m.onnx", "-o", "o.onnx", "--time-limit", "5"])
    assert options_from_args(args).budgets.whole_run
    args = build_parser().parse_args(["optimize", "m.onnx", "-o", "o.onnx"])
    assert not options_from_args(args).budgets.whole_run
