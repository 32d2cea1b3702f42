"""Symbolic batch/sequence dims: optimized without pinning, valid at every size; pins are reported.

A rule that baked one concrete size into the graph (a folded Shape, a Reshape target) would pass
verification at the verifier's sizes and fail at others, so the optimized models are run against
the originals on onnxruntime at several sizes that differ from the verifier's defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat import cli
from onnxsat.base.report import Report
from onnxsat.base.weightless import infer_types
from onnxsat.verification import make_inputs, run_ort

from .helpers_onnx import out_vi, vi

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FAST = onnxsat.Budgets(iterations=4, seconds=20.0)


def dynamic_cnn() -> onnx.ModelProto:
    """Conv+BN+Relu on [N, 3, H, W], a transpose pair, and a Shape->Gather->Concat->Reshape that
    keeps N symbolic: rules fold the BN and the transposes, and must keep the Reshape general."""
    rng = np.random.default_rng(0)

    def init(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(array.astype(array.dtype), name)

    inits = [
        init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3),
        init("scale", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
        init("bias", rng.standard_normal(4).astype(np.float32) * 0.1),
        init("mean", rng.standard_normal(4).astype(np.float32) * 0.1),
        init("var", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
        init("zero", np.array([0], np.int64)),
        init("minus_one", np.array([-1], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
        helper.make_node("Shape", ["t2"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["t2", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


# Sizes deliberately different from the verifier's defaults (batch 1, other symbols 4).
SIZES = {
    "transformer_block": [{"batch": 1, "seq": 3}, {"batch": 2, "seq": 7}, {"batch": 3, "seq": 16}],
    "dynamic_cnn": [{"N": 1, "H": 5, "W": 9}, {"N": 3, "H": 8, "W": 8}, {"N": 2, "H": 16, "W": 6}],
    "bert-ts-dynamic": [{"batch": 1, "sequence": 3}, {"batch": 2, "sequence": 7}, {"batch": 3, "sequence": 16}],
    "bert-dynamo-dynamic": [{"batch": 1, "sequence": 3}, {"batch": 2, "sequence": 7}, {"batch": 3, "sequence": 16}],
}
REALMODELS = Path(__file__).resolve().parent / "data" / "realmodels"


def _load(name: str) -> onnx.ModelProto:
    if name == "dynamic_cnn":
        return dynamic_cnn()
    path = EXAMPLES / f"{name}.onnx"
    return onnx.load(str(path if path.exists() else REALMODELS / f"{name}.onnx"))


def _input_dims(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    return {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in model.graph.input
    }


@pytest.mark.parametrize("name", list(SIZES))
def test_symbolic_dims_optimize_without_pinning_and_run_at_every_size(name: str) -> None:
    original = _load(name)
    optimized, report = onnxsat.optimize(original, onnxsat.Options(budgets=FAST))
    assert report.verification.status == "passed"
    assert report.total_after < report.total_before, "the model was not optimized at all"
    assert report.pinned_dims == {}
    # The interface stays symbolic: nothing was specialized to the verifier's sizes.
    assert _input_dims(optimized) == _input_dims(original)
    for i, dims in enumerate(SIZES[name]):
        feeds = make_inputs(original, seed=i, dim_values=dims)
        ref, got = run_ort(original, feeds), run_ort(optimized, feeds)
        assert set(got) == set(ref)
        for key, value in ref.items():
            assert got[key].shape == value.shape, (dims, key)
            np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5, err_msg=f"{dims} {key}")


def test_a_torchscript_bert_reads_no_layer_sizes_at_run_time() -> None:
    """ONNX inference names the sizes of a TorchScript BERT with dynamic batch and sequence afresh
    after its first Add (``unk__2``...), so no rule could tell a layer's ``x.view(x.size(0),
    x.size(1), heads, -1)`` reads the sizes of the tensor it reshapes; onnxruntime's symbolic
    inference (``infer_types``) keeps ``batch`` and ``sequence`` throughout, and every per-layer
    Shape chain becomes a Reshape that copies the dims (0) or a read of the inputs' Shape."""
    original = _load("bert-ts-dynamic")
    names = {
        d.dim_param for vi in infer_types(original).graph.value_info for d in vi.type.tensor_type.shape.dim
    }
    assert {"batch", "sequence"} <= names and not any(n.startswith("unk__") for n in names), names
    optimized, report = onnxsat.optimize(original)
    assert report.verification.status == "passed"
    inputs = {i.name for i in original.graph.input}
    reads = [n.input[0] for n in optimized.graph.node if n.op_type == "Shape" and n.input[0] not in inputs]
    assert len(reads) <= 1, reads  # the mask's expand to its scores' shape; was 2 a layer and more
    assert len(optimized.graph.node) <= 100, len(optimized.graph.node)  # 141 with ONNX inference's sizes


def test_dynamic_cnn_keeps_the_reshape_general() -> None:
    """The optimized CNN still reads its batch size at run time (or reshapes with 0), never a literal."""
    optimized, _ = onnxsat.optimize(dynamic_cnn(), onnxsat.Options(budgets=FAST))
    ops = [n.op_type for n in optimized.graph.node]
    assert "BatchNormalization" not in ops and "Transpose" not in ops, ops
    reshape = next(n for n in optimized.graph.node if n.op_type == "Reshape")
    consts = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    target = consts.get(reshape.input[1])
    assert target is None or int(target[0]) in (0, -1), target


def test_input_shape_pins_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "dyn.onnx", tmp_path / "dyn.opt.onnx"
    onnx.save(dynamic_cnn(), str(src))
    argv = ["optimize", str(src), "-o", str(out), "--input-shape", "x:2,3,8,6", "--json"]
    assert cli.main(argv + ["--max-iterations", "4", "--time-limit", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pinned_dims"] == {"x": {"N": 2, "H": 8, "W": 6}}
    assert report["verification"]["status"] == "passed"
    optimized = onnx.load(str(out))
    assert _input_dims(optimized) == {"x": [2, 3, 8, 6]}
    feeds = make_inputs(dynamic_cnn(), seed=5, dim_values={"N": 2, "H": 8, "W": 6})
    np.testing.assert_allclose(
        run_ort(optimized, feeds)["y"], run_ort(dynamic_cnn(), feeds)["y"], rtol=1e-4, atol=1e-5
    )


def test_pinned_dims_appear_in_the_table() -> None:
    report = Report(model_name="m", pinned_dims={"x": {"N": 1, "H": 5, "dim 3": 5}})
    line = next(ln for ln in report.render().splitlines() if "pinned" in ln)
    assert "x: N=1, H=5, dim 3=5" in line
    assert not any("pinned" in ln for ln in Report(model_name="m").render().splitlines())


def test_symbolic_inference_that_cannot_finish_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime's ``SymbolicShapeInference.infer_shapes`` saves the model into the working
    directory when an op stops it; ``infer_types`` runs its steps without that write, and falls
    back to ONNX inference."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Unknown", ["a"], ["b"], domain="example.custom"),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "custom", [vi("x", TensorProto.FLOAT, ["batch", 4])], [out_vi("y", TensorProto.FLOAT, 2)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)],
    )
    monkeypatch.chdir(tmp_path)
    inferred = infer_types(model)
    assert {v.name for v in inferred.graph.value_info} >= {"a"}
    assert list(tmp_path.iterdir()) == []
