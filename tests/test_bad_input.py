"""Bad input through the real command line: one clear line, exit 2, nothing written, input untouched.

Each corpus entry is built in a temporary directory and run through ``onnxsat.cli.main`` (a few
also as ``python -m onnxsat`` in a subprocess). Every one must fail before any optimization with
exit status 2 and a single ``onnxsat: error: ...`` line naming the problem, leave no output (or
temporary) file behind, and leave the input files byte-identical. Control-flow models are the
opposite case: unusual but valid, so they are optimized around their opaque subgraphs and verified.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat import cli

ROOT = Path(__file__).resolve().parent.parent
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"
CONTROL_FLOW = ROOT / "examples" / "control_flow.onnx"
FAST = ["--max-iterations", "3", "--time-limit", "20"]


def _vi(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(
    nodes: list[onnx.NodeProto],
    outputs: list[onnx.ValueInfoProto] | None = None,
    initializers: list[onnx.TensorProto] | None = None,
    opsets: list[onnx.OperatorSetIdProto] | None = None,
    ir_version: int = 8,
) -> onnx.ModelProto:
    """A small float model with input ``x`` of shape [2, 3]."""
    graph = helper.make_graph(
        nodes, "bad", [_vi("x", [2, 3])], outputs or [_vi("y", [2, 3])], initializer=initializers or []
    )
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def _write(path: Path, model: onnx.ModelProto | bytes) -> Path:
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


@dataclass
class Case:
    """A corpus entry: ``build(dir)`` writes the input and returns the CLI arguments after ``optimize``."""

    build: Callable[[Path], list[str]]
    message: str
    """A fragment the one-line error must contain (lower-cased comparison)."""


def _plain(data: Callable[[], onnx.ModelProto | bytes]) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        return [str(_write(d / "in.onnx", data())), "-o", str(d / "out.onnx")]

    return build


def _truncated() -> bytes:
    data = SMALL_CNN.read_bytes()
    return data[: len(data) // 2]


def _cycle() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Add", ["x", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Neg", ["b"], ["y"]),
        ]
    )


def _dangling() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "nowhere"], ["y"])])


def _two_producers() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])])


def _output_listed_twice() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], outputs=[_vi("y", [2, 3]), _vi("y", [2, 3])])


def _wrong_initializer_size() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    w.raw_data = w.raw_data[:-4]
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[w])


def _domain_without_opset() -> onnx.ModelProto:
    return _model([helper.make_node("Foo", ["x"], ["y"], domain="com.unknown")])


def _newer_opset() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], opsets=[helper.make_opsetid("", 10_000)])


def _newer_ir_version() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=onnx.IR_VERSION + 1)


def _unknown_op() -> onnx.ModelProto:
    return _model([helper.make_node("NotAnOnnxOp", ["x"], ["y"])])


def _type_mismatch() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 3), np.int64), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[w])


def _bad_attribute() -> onnx.ModelProto:
    return _model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 2])], outputs=[_vi("y", [3, 2])])


def _no_outputs() -> onnx.ModelProto:
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    del model.graph.output[:]
    return model


def _missing_external_data(d: Path) -> list[str]:
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        initializers=[numpy_helper.from_array(np.ones((2, 3), np.float32), "w")],
    )
    onnx.save_model(
        model, str(d / "in.onnx"), save_as_external_data=True, location="in.weights", size_threshold=0
    )
    (d / "in.weights").unlink()
    return [str(d / "in.onnx"), "-o", str(d / "out.onnx")]


def _missing_input(d: Path) -> list[str]:
    return [str(d / "absent.onnx"), "-o", str(d / "out.onnx")]


def _input_is_directory(d: Path) -> list[str]:
    (d / "model.onnx").mkdir()
    return [str(d / "model.onnx"), "-o", str(d / "out.onnx")]


def _output_in_missing_directory(d: Path) -> list[str]:
    return [str(_write(d / "in.onnx", SMALL_CNN.read_bytes())), "-o", str(d / "no" / "such" / "out.onnx")]


def _output_is_input(d: Path) -> list[str]:
    inp = _write(d / "in.onnx", SMALL_CNN.read_bytes())
    return [str(inp), "-o", str(inp)]


def _output_is_input_spelled_differently(d: Path) -> list[str]:
    inp = _write(d / "in.onnx", SMALL_CNN.read_bytes())
    (d / "sub").mkdir()
    return [str(inp), "-o", str(d / "sub" / ".." / "in.onnx")]


def _output_is_directory(d: Path) -> list[str]:
    (d / "out.onnx").mkdir()
    return [str(_write(d / "in.onnx", SMALL_CNN.read_bytes())), "-o", str(d / "out.onnx")]


CORPUS: dict[str, Case] = {
    "empty-file": Case(_plain(lambda: b""), "empty"),
    "random-bytes": Case(_plain(lambda: np.random.default_rng(7).bytes(4096)), "onnx"),
    "text-file": Case(_plain(lambda: b"this is not a model\n"), "onnx"),
    "truncated-protobuf": Case(_plain(_truncated), "not a valid onnx protobuf"),
    "cycle": Case(_plain(_cycle), "cycle"),
    "dangling-input-name": Case(_plain(_dangling), "'nowhere'"),
    "duplicate-output-name": Case(_plain(_two_producers), "produced by two nodes"),
    "graph-output-listed-twice": Case(_plain(_output_listed_twice), "listed twice"),
    "wrong-initializer-size": Case(_plain(_wrong_initializer_size), "need 24"),
    "unknown-opset-domain": Case(_plain(_domain_without_opset), "com.unknown"),
    "newer-opset": Case(_plain(_newer_opset), "opset 10000"),
    "unsupported-ir-version": Case(_plain(_newer_ir_version), "ir version"),
    "unknown-op": Case(_plain(_unknown_op), "notanonnxop"),
    "type-mismatch": Case(_plain(_type_mismatch), "inconsistent type"),
    "invalid-attribute": Case(_plain(_bad_attribute), "perm"),
    "no-graph-outputs": Case(_plain(_no_outputs), "no outputs"),
    "missing-external-data": Case(_missing_external_data, "external data"),
    "missing-input-file": Case(_missing_input, "not found"),
    "input-is-directory": Case(_input_is_directory, "directory"),
    "output-in-missing-directory": Case(_output_in_missing_directory, "does not exist"),
    "output-is-input": Case(_output_is_input, "is the input"),
    "output-is-input-other-spelling": Case(_output_is_input_spelled_differently, "is the input"),
    "output-is-directory": Case(_output_is_directory, "is a directory"),
}


def _snapshot(d: Path) -> dict[str, bytes | None]:
    """Every path under ``d`` with its bytes (None for directories)."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def _assert_one_line_error(stderr: str, fragment: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("onnxsat: error: "), stderr
    assert "Traceback" not in stderr
    assert fragment.lower() in lines[0].lower(), lines[0]


@pytest.mark.parametrize("name", list(CORPUS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CORPUS[name]
    argv = case.build(tmp_path)
    before = _snapshot(tmp_path)
    assert cli.main(["optimize", *argv, *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _assert_one_line_error(captured.err, case.message)
    # Nothing new (no output, no sidecar, no temporary file) and the inputs are byte-identical.
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["empty-file", "cycle", "output-is-input"])
def test_bad_input_in_a_fresh_process(name: str, tmp_path: Path) -> None:
    argv = CORPUS[name].build(tmp_path)
    before = _snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "onnxsat", "optimize", *argv, *FAST],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    _assert_one_line_error(proc.stderr, CORPUS[name].message)
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# control flow: valid input, optimized outside the subgraphs


def _subgraphs(model: onnx.ModelProto) -> list[bytes]:
    return [
        attr.g.SerializeToString()
        for node in model.graph.node
        for attr in node.attribute
        if attr.HasField("g")
    ]


def _loop_model() -> onnx.ModelProto:
    """A Loop whose body reads an outer tensor, between outer ops that the rules simplify."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "w"], ["sum"]),
            helper.make_node("Tanh", ["sum"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            _vi("acc_in", [2, 3]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _vi("acc_out", [2, 3])],
    )
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[1, 0]),
        helper.make_node("Mul", ["tt", "one"], ["w"]),
        helper.make_node("Loop", ["trips", "", "x"], ["acc"], body=body),
        helper.make_node("Relu", ["acc"], ["r"]),
        helper.make_node("Identity", ["r"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(3, np.int64), "trips"),
        numpy_helper.from_array(np.ones((1, 1), np.float32), "one"),
    ]
    return _model(nodes, initializers=inits, opsets=[helper.make_opsetid("", 17)])


def _optimize_via_cli(
    src: Path, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[onnx.ModelProto, dict]:
    before = src.read_bytes()
    assert cli.main(["optimize", str(src), "-o", str(out), "--json", *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    assert src.read_bytes() == before
    optimized = onnx.load(str(out))
    onnx.checker.check_model(optimized, full_check=True)
    return optimized, report


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_if_model_is_optimized_around_its_untouched_branches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = onnx.load(str(CONTROL_FLOW))
    optimized, report = _optimize_via_cli(CONTROL_FLOW, tmp_path / "out.onnx", capsys)
    assert report["verification"]["status"] == "passed"
    assert report["unknown_ops"] == {"If": 1}
    assert _subgraphs(optimized) == _subgraphs(original)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for cond in (True, False):  # both branches, whatever the verifier's random inputs chose
        feeds = {"x": x, "cond": np.array(cond)}
        np.testing.assert_allclose(_run(optimized, feeds)[0], _run(original, feeds)[0], rtol=1e-6, atol=1e-6)


def test_loop_model_is_optimized_outside_its_body(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = _loop_model()
    onnx.checker.check_model(original, full_check=True)
    src = _write(tmp_path / "loop.onnx", original)
    optimized, report = _optimize_via_cli(src, tmp_path / "out.onnx", capsys)
    assert report["verification"]["status"] == "passed"
    assert _subgraphs(optimized) == _subgraphs(original)
    ops = [n.op_type for n in optimized.graph.node]
    assert "Transpose" not in ops and "Mul" not in ops, ops  # the outer graph was rewritten
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        _run(optimized, {"x": x})[0], _run(original, {"x": x})[0], rtol=1e-6, atol=1e-6
    )
