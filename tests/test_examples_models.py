"""The example models in examples/: valid, runnable, and exactly what make_examples.py writes."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MODEL_NAMES = [
    "transformer_block",
    "custom_op",
    "layout_algebra",
    "small_cnn",
    "inception_block",
    "control_flow",
    "spp_block",
    "decoder_block",
    "linear_bottleneck",
]
RUNNABLE = [n for n in MODEL_NAMES if n != "custom_op"]
SYMBOLIC_DIMS = {"batch": 2, "seq": 7, "height": 5, "width": 6}
VOCAB = 100


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(str(EXAMPLES / f"{name}.onnx"))


def _random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs: floats ~ N(0, 1), int64 token ids in [0, VOCAB), 0/1 masks, bool scalars."""
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tensor_type = inp.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else SYMBOLIC_DIMS[d.dim_param]
            for d in tensor_type.shape.dim
        ]
        if tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
        elif tensor_type.elem_type == onnx.TensorProto.INT64:
            high = 2 if "mask" in inp.name else VOCAB
            feeds[inp.name] = rng.integers(0, high, shape, dtype=np.int64)
        elif tensor_type.elem_type == onnx.TensorProto.BOOL:
            feeds[inp.name] = np.array(rng.random(shape) < 0.5)
        else:
            raise AssertionError(f"unexpected input type for {inp.name}")
    return feeds


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_passes_full_check_and_is_small(name: str) -> None:
    onnx.checker.check_model(_load(name), full_check=True)
    assert (EXAMPLES / f"{name}.onnx").stat().st_size < 300_000


@pytest.mark.parametrize("name", RUNNABLE)
def test_model_runs_in_onnxruntime(name: str) -> None:
    model = _load(name)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for _ in range(3):  # several draws, so control_flow takes both branches with high probability
        feeds = _random_feeds(model, rng)
        for out in session.run(None, feeds):
            assert np.all(np.isfinite(out)), name


def test_control_flow_both_branches_run() -> None:
    model = _load("control_flow")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    outs = [session.run(None, {"x": x, "cond": np.array(c)})[0] for c in (True, False)]
    assert all(np.all(np.isfinite(o)) for o in outs)
    assert not np.allclose(outs[0], outs[1])


def test_custom_op_is_not_runnable_in_onnxruntime() -> None:
    model = _load("custom_op")
    assert [(n.domain, n.op_type) for n in model.graph.node] == [
        ("", "Relu"),
        ("com.example", "MyOp"),
        ("", "Add"),
    ]
    with pytest.raises(Exception):  # noqa: B017 - ORT raises its own exception types
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_transformer_block_structure() -> None:
    model = _load("transformer_block")
    assert model.ir_version == 8
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Shape"] >= 1
    assert ops["LayerNormalization"] == 1 and ops["Erf"] == 1
    consumers = Counter(n.input[0] for n in model.graph.node if n.op_type == "MatMul")
    assert max(consumers.values()) == 3, "Q, K and V MatMuls must share one input"
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]


def test_layout_algebra_expected_json() -> None:
    expected = json.loads((EXAMPLES / "layout_algebra.expected.json").read_text())
    assert expected["min_ops"] == sum(expected["remaining_op_types"].values())
    ops = Counter(n.op_type for n in _load("layout_algebra").graph.node)
    assert len(_load("layout_algebra").graph.node) > expected["min_ops"]
    for op in ("Identity", "Dropout", "Transpose", "Reshape", "Neg", "Relu", "MatMul", "BatchNormalization"):
        assert ops[op] >= 1, op


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    written = _load_generator().main(tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted([f"{n}.onnx" for n in MODEL_NAMES] + ["layout_algebra.expected.json"])
    for path in written:
        assert path.read_bytes() == (EXAMPLES / path.name).read_bytes(), path.name
