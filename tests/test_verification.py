"""compare_models catches a changed weight, passes an identical model, and feeds valid inputs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.base import modelio
from onnxsat.base.errors import VerificationError
from onnxsat.base.modelio import load_model, save_model_atomic
from onnxsat.verification import compare_models, compare_values, make_inputs, run_ort, tolerance

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
OPSET = [helper.make_opsetid("", 17)]


def _vi(name: str, shape, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=(), opsets=OPSET, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    return helper.make_model(graph, opset_imports=list(opsets), ir_version=ir_version)


def _mlp(seed: int = 0) -> onnx.ModelProto:
    """Two-layer MLP with a symbolic batch dim: x[batch,16] -> y[batch,8]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["y"]),
    ]
    return _model(nodes, [_vi("x", ["batch", 16])], [_vi("y", ["batch", 8])], inits)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _set_weight(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, name))
            return
    raise KeyError(name)


def _embedding(vocab: int, ids_type: int = TensorProto.INT64) -> onnx.ModelProto:
    """token ids [batch, seq] -> Gather(embedding[vocab, 8]) -> ReduceSum over seq."""
    table = np.random.default_rng(3).standard_normal((vocab, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["vecs"], axis=0),
        helper.make_node("ReduceSum", ["vecs", "axes"], ["y"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(table, "emb"), numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, [_vi("ids", ["batch", "seq"], ids_type)], [_vi("y", ["batch", 8])], inits)


# ---------------------------------------------------------------------------------------------
# make_inputs


def test_make_inputs_dtypes_and_determinism() -> None:
    types = {
        "f32": (TensorProto.FLOAT, np.float32),
        "f16": (TensorProto.FLOAT16, np.float16),
        "f64": (TensorProto.DOUBLE, np.float64),
        "i32": (TensorProto.INT32, np.int32),
        "i64": (TensorProto.INT64, np.int64),
        "b": (TensorProto.BOOL, np.bool_),
        "u8": (TensorProto.UINT8, np.uint8),
    }
    inputs = [_vi(name, [3, 5], elem) for name, (elem, _) in types.items()]
    nodes = [helper.make_node("Identity", [name], [name + "_out"]) for name in types]
    outputs = [_vi(name + "_out", [3, 5], elem) for name, (elem, _) in types.items()]
    model = _model(nodes, inputs, outputs)
    feeds = make_inputs(model, seed=0)
    assert list(feeds) == list(types)
    for name, (_, dtype) in types.items():
        assert feeds[name].dtype == dtype and feeds[name].shape == (3, 5), name
    for name in ("i32", "i64", "u8"):
        assert feeds[name].min() >= 0 and feeds[name].max() < 4
    assert feeds["f32"].std() > 0.3  # standard normal, not a constant
    again = make_inputs(model, seed=0)
    other = make_inputs(model, seed=1)
    for name in types:
        np.testing.assert_array_equal(feeds[name], again[name])
    assert not np.array_equal(feeds["f32"], other["f32"])
    outs = run_ort(model, feeds)
    for name in types:
        np.testing.assert_array_equal(outs[name + "_out"], feeds[name])


def test_make_inputs_symbolic_dims() -> None:
    inputs = [
        _vi("a", ["batch_size", "seq", 3]),
        _vi("b", ["seq", "hidden"]),
        _vi("c", [None, 2]),
    ]
    nodes = [helper.make_node("Identity", [n], [n + "_o"]) for n in "abc"]
    model = _model(nodes, inputs, [_vi(n + "_o", None) for n in "abc"])
    feeds = make_inputs(model, 0)
    assert feeds["a"].shape == (1, 4, 3)
    assert feeds["b"].shape == (4, 4)
    assert feeds["c"].shape == (1, 2)
    feeds = make_inputs(model, 0, dim_values={"seq": 7, "batch_size": 2})
    assert feeds["a"].shape == (2, 7, 3)
    assert feeds["b"].shape == (7, 4)


def test_make_inputs_skips_initializers_ir3() -> None:
    """Before IR 4 an initializer listed as an input is a constant: never fed."""
    w = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    model = _model(
        nodes,
        [_vi("x", [4]), _vi("w", [4])],
        [_vi("y", [4])],
        [w],
        opsets=[helper.make_opsetid("", 9)],
        ir_version=3,
    )
    feeds = make_inputs(model, 0)
    assert list(feeds) == ["x"]
    np.testing.assert_allclose(run_ort(model, feeds)["y"], feeds["x"] * 2.0)


def test_make_inputs_keeps_overridable_initializer_default_ir4() -> None:
    """From IR 4 an initializer that is also an input may be overridden; we keep its default."""
    w = numpy_helper.from_array(np.full((4,), 3.0, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    model = _model(nodes, [_vi("x", [4]), _vi("w", [4])], [_vi("y", [4])], [w], ir_version=8)
    feeds = make_inputs(model, 0)
    assert list(feeds) == ["x"]
    np.testing.assert_allclose(run_ort(model, feeds)["y"], feeds["x"] * 3.0)


def test_light_model_feeds_only_the_data_input() -> None:
    model = load_model(LIGHT_DIR / "light_squeezenet.onnx")
    feeds = make_inputs(model, 0)
    assert list(feeds) == ["data_0"]
    assert feeds["data_0"].shape == (1, 3, 224, 224)


@pytest.mark.parametrize("vocab", [3, 10, 1000])
@pytest.mark.parametrize("ids_type", [TensorProto.INT64, TensorProto.INT32])
def test_gather_indices_stay_in_range(vocab: int, ids_type: int) -> None:
    model = _embedding(vocab, ids_type)
    for seed in range(5):
        ids = make_inputs(model, seed, dim_values={"seq": 64})["ids"]
        assert ids.min() >= 0 and ids.max() < vocab
    if vocab == 1000:  # uses the whole table, not just [0, 4)
        assert ids.max() >= 4
    assert compare_models(model, _copy(model)).ok


def test_gather_on_axis_of_a_graph_input_with_symbolic_dim() -> None:
    nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], axis=1)]
    inputs = [_vi("data", [2, "cols"]), _vi("idx", [6], TensorProto.INT64)]
    model = _model(nodes, inputs, [_vi("y", [2, 6])])
    feeds = make_inputs(model, 0, dim_values={"cols": 3})
    assert feeds["data"].shape == (2, 3)
    assert feeds["idx"].max() < 3
    run_ort(model, feeds)


def test_gather_data_shape_from_shape_inference() -> None:
    """The table comes out of a node, so its size is only known from shape inference."""
    table = numpy_helper.from_array(np.ones((2, 4), np.float32), "half")
    nodes = [
        helper.make_node("Concat", ["half", "half", "half"], ["emb"], axis=0),  # 6 rows
        helper.make_node("Gather", ["emb", "ids"], ["y"]),
    ]
    model = _model(nodes, [_vi("ids", [50], TensorProto.INT64)], [_vi("y", [50, 4])], [table])
    ids = make_inputs(model, 0)["ids"]
    assert ids.max() < 6 and ids.max() >= 4


def test_make_inputs_strings_and_types_it_cannot_generate() -> None:
    nodes = [helper.make_node("Identity", ["s"], ["t"])]
    model = _model(nodes, [_vi("s", [2], TensorProto.STRING)], [_vi("t", [2], TensorProto.STRING)])
    feeds = make_inputs(model, 0)
    assert feeds["s"].dtype == object and all(isinstance(v, str) for v in feeds["s"])
    assert compare_models(model, model).ok
    bf16 = _model(nodes, [_vi("s", [2], TensorProto.BFLOAT16)], [_vi("t", [2], TensorProto.BFLOAT16)])
    with pytest.raises(ValueError, match="cannot generate"):
        make_inputs(bf16, 0)
    result = compare_models(bf16, bf16)
    assert not result.ok and "cannot generate" in result.skipped_reason


# ---------------------------------------------------------------------------------------------
# run_ort, tolerance


@pytest.mark.parametrize("level", ["disable_all", "basic", "extended", "all"])
def test_run_ort_levels(level: str) -> None:
    model = _mlp()
    feeds = make_inputs(model, 0, dim_values={"batch": 3})
    out = run_ort(model, feeds, optimization_level=level)
    assert out["y"].shape == (3, 8)
    np.testing.assert_allclose(out["y"], run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_run_ort_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="optimization_level"):
        run_ort(_mlp(), {}, optimization_level="max")


def test_run_ort_large_model_goes_through_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _mlp()
    feeds = make_inputs(model, 0)
    expected = run_ort(model, feeds)["y"]
    saved: list[Path] = []
    real_save = modelio.save_model_atomic

    def spy(m, path, **kwargs):
        saved.append(Path(path))
        return real_save(m, path, **kwargs)

    monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 1000)
    monkeypatch.setattr(modelio, "save_model_atomic", spy)
    np.testing.assert_array_equal(run_ort(model, feeds)["y"], expected)
    assert len(saved) == 1 and not saved[0].parent.exists()  # temp dir cleaned up


def test_run_ort_ignores_feeds_the_model_does_not_declare() -> None:
    feeds = make_inputs(_mlp(), 0)
    feeds["unused"] = np.zeros(3, np.float32)
    assert run_ort(_mlp(), feeds)["y"].shape == (1, 8)


def test_tolerance_table() -> None:
    assert tolerance(np.float32) == (1e-3, 1e-5)
    assert tolerance("float16") == (1e-2, 1e-4)
    assert tolerance(np.dtype("float64")) == (1e-7, 1e-10)
    for exact in (np.int64, np.int32, np.uint8, np.bool_):
        assert tolerance(exact) == (0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# compare_models


def test_identical_model_passes() -> None:
    result = compare_models(_mlp(), _copy(_mlp()), seeds=(0, 1, 2))
    assert result.ok and result.skipped_reason is None
    assert [c.name for c in result.outputs] == ["y"]
    assert result.outputs[0].max_abs_err == 0.0
    assert result.to_error() is None


def test_reassociated_model_passes() -> None:
    """A real rewrite (distribute MatMul over the split of W1) stays within float32 tolerance."""
    original = _mlp()
    w1 = numpy_helper.to_array(original.graph.initializer[0])
    rewritten = _copy(original)
    nodes = [
        helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["xa"]),
        helper.make_node("Slice", ["x", "s1", "s2", "ax"], ["xb"]),
        helper.make_node("MatMul", ["xa", "W1a"], ["pa"]),
        helper.make_node("MatMul", ["xb", "W1b"], ["pb"]),
        helper.make_node("Add", ["pa", "pb"], ["h0"]),
        *list(original.graph.node)[1:],
    ]
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    rewritten.graph.initializer.extend(
        [
            numpy_helper.from_array(w1[:7], "W1a"),
            numpy_helper.from_array(w1[7:], "W1b"),
            numpy_helper.from_array(np.array([0], np.int64), "s0"),
            numpy_helper.from_array(np.array([7], np.int64), "s1"),
            numpy_helper.from_array(np.array([16], np.int64), "s2"),
            numpy_helper.from_array(np.array([1], np.int64), "ax"),
        ]
    )
    onnx.checker.check_model(rewritten)
    result = compare_models(original, rewritten, dim_values={"batch": 5})
    assert result.ok, result


def test_perturbed_weight_fails() -> None:
    original = _mlp()
    perturbed = _copy(original)
    w2 = numpy_helper.to_array(original.graph.initializer[2]).copy()
    w2[3, 5] += 0.5
    _set_weight(perturbed, "W2", w2)
    result = compare_models(original, perturbed)
    assert not result.ok and result.skipped_reason is None
    check = result.outputs[0]
    assert check.name == "y" and not check.ok and check.max_abs_err > check.tolerance > 0
    err = result.to_error(culprit_rules=["matmul-assoc"])
    assert isinstance(err, VerificationError) and err.exit_code == 3
    assert err.output_name == "y" and err.max_abs_err == check.max_abs_err
    assert "matmul-assoc" in str(err) and "\n" not in str(err)


def _with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The light models' weights are ConstantOfShape fills; swap them for seeded He-style
    random initializers so activations neither vanish nor explode."""
    rng = np.random.default_rng(seed)
    shapes = {
        t.name: tuple(numpy_helper.to_array(t)) for t in model.graph.initializer if t.name.endswith("__SHAPE")
    }
    out = _copy(model)
    keep, weights = [], []
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = shapes[node.input[0]]
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            std = math.sqrt(2.0 / fan_in) if fan_in else 0.01
            weights.append(
                numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), node.output[0])
            )
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.graph.initializer.extend(weights)
    # IR 3: every initializer is also a graph input (make_inputs must still not feed them)
    out.graph.input.extend(_vi(w.name, list(w.dims)) for w in weights)
    return out


def test_perturbed_light_model_fails() -> None:
    original = _with_random_weights(load_model(LIGHT_DIR / "light_squeezenet.onnx"))
    assert original.ir_version == 3
    onnx.checker.check_model(original)
    assert list(make_inputs(original, 0)) == ["data_0"]
    assert compare_models(original, _copy(original), seeds=(0,)).ok
    perturbed = _copy(original)
    weight = numpy_helper.to_array(
        next(t for t in original.graph.initializer if t.name == "conv10_w_0")
    ).copy()
    weight[7, 0, 0, 0] += 1.0  # one weight of the classifier
    _set_weight(perturbed, "conv10_w_0", weight)
    result = compare_models(original, perturbed, seeds=(0,))
    check = result.outputs[0]
    assert not result.ok and check.max_abs_err > check.tolerance > 0


def test_round_trip_through_external_data_passes(tmp_path: Path) -> None:
    original = load_model(LIGHT_DIR / "light_squeezenet.onnx")
    out = tmp_path / "sq.onnx"
    save_model_atomic(original, out, external_data=True)
    assert compare_models(original, load_model(out), seeds=(0,)).ok


def _sqrt_model(pre: str | None) -> onnx.ModelProto:
    nodes = [helper.make_node("Sqrt", ["x"], ["y"])]
    if pre:
        nodes = [helper.make_node(pre, ["x"], ["x2"]), helper.make_node("Sqrt", ["x2"], ["y"])]
    return _model(nodes, [_vi("x", [64])], [_vi("y", [64])])


def test_nan_positions_must_agree() -> None:
    original = _sqrt_model(None)  # NaN wherever x < 0
    assert compare_models(original, _sqrt_model(None)).ok
    result = compare_models(original, _sqrt_model("Abs"))
    assert not result.ok and "NaN positions differ" in result.outputs[0].detail


def test_output_names_must_match() -> None:
    renamed = _mlp()
    renamed.graph.node[-1].output[0] = "z"
    renamed.graph.output[0].name = "z"
    result = compare_models(_mlp(), renamed)
    assert not result.ok
    assert {(c.name, c.detail) for c in result.outputs} == {
        ("y", "missing from the optimized model"),
        ("z", "not an output of the original model"),
    }
    assert math.isinf(result.outputs[0].max_abs_err)


def test_output_dtype_must_match() -> None:
    widened = _mlp()
    widened.graph.node[-1].output[0] = "y32"
    widened.graph.node.append(helper.make_node("Cast", ["y32"], ["y"], to=TensorProto.DOUBLE))
    widened.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    result = compare_models(_mlp(), widened)
    assert not result.ok and "dtype" in result.outputs[0].detail
    # undeclared output types: the runtime dtype still has to match
    widened.graph.output[0].ClearField("type")
    result = compare_models(_mlp(), widened)
    assert not result.ok and "dtype float64 differs" in result.outputs[0].detail


def test_output_shape_must_match() -> None:
    reshaped = _mlp()
    reshaped.graph.node[-1].output[0] = "y2d"
    reshaped.graph.node.append(helper.make_node("Reshape", ["y2d", "flat"], ["y"]))
    reshaped.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "flat"))
    result = compare_models(_mlp(), reshaped)
    assert not result.ok and "shape" in result.outputs[0].detail


def test_integer_outputs_are_exact() -> None:
    def argmax(offset: int) -> onnx.ModelProto:
        nodes = [helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=0)]
        if offset:
            nodes = [
                helper.make_node("ArgMax", ["x"], ["a0"], axis=1, keepdims=0),
                helper.make_node("Add", ["a0", "one"], ["a"]),
            ]
        inits = [numpy_helper.from_array(np.array(offset, np.int64), "one")] if offset else []
        return _model(nodes, [_vi("x", [4, 6])], [_vi("a", [4], TensorProto.INT64)], inits)

    assert compare_models(argmax(0), argmax(0)).ok
    result = compare_models(argmax(0), argmax(1))
    assert not result.ok and result.outputs[0].max_abs_err == 1.0 and result.outputs[0].tolerance == 0.0


def test_original_that_onnxruntime_cannot_run_is_skipped() -> None:
    nodes = [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")]
    model = _model(
        nodes, [_vi("x", [3])], [_vi("y", [3])], opsets=[*OPSET, helper.make_opsetid("com.example", 1)]
    )
    result = compare_models(model, _copy(model))
    assert not result.ok
    assert result.skipped_reason and "cannot run the original" in result.skipped_reason
    assert "\n" not in result.skipped_reason
    assert result.to_error() is None  # the caller decides what to do


def test_optimized_that_onnxruntime_cannot_run_fails() -> None:
    broken = _mlp()
    broken.graph.node[-1].op_type = "FancyMatMul"
    result = compare_models(_mlp(), broken)
    assert not result.ok and result.skipped_reason is None
    assert "cannot run the optimized model" in result.outputs[0].detail
    assert isinstance(result.to_error(), VerificationError)


def test_float32_bound_scales_with_output_magnitude() -> None:
    """Bound: 1e-3 * max|ref| + 1e-5, so small outputs (softmax over many classes) stay checked."""

    def scaled(scale: float, noise: float) -> onnx.ModelProto:
        nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "n"], ["y"])]
        inits = [
            numpy_helper.from_array(np.array(scale, np.float32), "s"),
            numpy_helper.from_array(np.array(noise, np.float32), "n"),
        ]
        return _model(nodes, [_vi("x", [256])], [_vi("y", [256])], inits)

    big = scaled(1000.0, 0.0)
    assert compare_models(big, scaled(1000.0, 0.5)).ok  # 0.5 against max|ref| ~ 3000
    assert not compare_models(big, scaled(1000.0, 50.0)).ok
    small = scaled(1e-3, 0.0)
    assert compare_models(small, scaled(1e-3, 5e-6)).ok  # within atol
    result = compare_models(small, scaled(1e-3, 5e-4))  # 5e-4 is a real change at a scale of ~3e-3
    assert not result.ok and result.outputs[0].tolerance < 2e-5


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_outputs_are_compared_as_in_float64(dtype: type) -> None:
    """All-finite outputs are compared in their own precision (no float64 copies of large logits):
    the error, the bound and the verdict are float64's, and a NaN or an infinity on either side still
    takes the path that compares their positions."""
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal(4096) * 50).astype(dtype)
    for noise in (1e-4, 1e-1, 10.0):
        got = (ref.astype(np.float64) + rng.standard_normal(4096) * noise).astype(dtype)
        check = compare_values("y", ref, got)
        wide = np.abs(ref.astype(np.float64) - got.astype(np.float64)).max()
        assert check.max_abs_err == pytest.approx(wide, rel=1e-6)
        rtol, atol = tolerance(dtype)
        bound = atol + rtol * np.abs(ref.astype(np.float64)).max()
        assert check.tolerance == pytest.approx(bound, rel=1e-6) and check.ok == (wide <= bound)
    for bad in (np.nan, np.inf):
        got = ref.copy()
        got[7] = bad
        check = compare_values("y", ref, got)
        assert not check.ok and ("NaN" in check.detail or "infinities" in check.detail)


def test_error_classes_carry_exit_codes_and_one_line_messages() -> None:
    import pickle

    from onnxsat.base.errors import BadInputError, OnnxsatError

    assert (OnnxsatError.exit_code, BadInputError.exit_code, VerificationError.exit_code) == (1, 2, 3)
    err = VerificationError("y", 0.25, "exceeds tolerance 0.001", ["fold-bn", "merge-matmul"])
    assert str(err) == (
        "optimized model does not match the original on output 'y': max abs error 0.25; "
        "exceeds tolerance 0.001; rules involved: fold-bn, merge-matmul"
    )
    unsound = VerificationError("", float("nan"), "rule x is unsound", ["x"])
    assert str(unsound) == "optimized model does not match the original: rule x is unsound; rules involved: x"
    again = pickle.loads(pickle.dumps(err))
    assert (again.output_name, again.max_abs_err, again.culprit_rules, str(again)) == (
        "y",
        0.25,
        ["fold-bn", "merge-matmul"],
        str(err),
    )


def _decode_mask_model() -> onnx.ModelProto:
    """A decode step's mask lookup: positions 0..past_sequence index a mask named [batch, s53],
    so the model only runs when s53 == past_sequence + 1 (the exporter named both sizes apart)."""
    i64 = TensorProto.INT64
    nodes = [
        helper.make_node("Shape", ["past"], ["past_len"], start=1, end=2),
        helper.make_node("Squeeze", ["past_len"], ["past_scalar"]),
        helper.make_node("Add", ["past_scalar", "one"], ["total"]),
        helper.make_node("Range", ["zero", "total", "one"], ["positions"]),
        helper.make_node("Gather", ["mask", "positions"], ["picked"], axis=1),
        helper.make_node("Cast", ["picked"], ["weights"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["weights", "weights"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decode_mask",
        [
            helper.make_tensor_value_info("mask", i64, ["batch", "s53"]),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past_sequence", 4]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_related_symbols_get_consistent_sizes() -> None:
    """The default sizes (s53 == past_sequence == 4) make onnxruntime refuse the original; the
    reference run then tries an off-by-one assignment and checks the model on inputs it accepts."""
    from onnxsat.verification import reference_run

    model = _decode_mask_model()
    with pytest.raises(Exception, match="out of data bounds"):
        run_ort(model, make_inputs(model, seed=0))
    reference = reference_run(model)
    assert reference.origin == "seeds [0, 1], s53=5"
    assert all(f["mask"].shape == (1, 5) and f["past"].shape == (1, 4, 4) for f in reference.feeds)
    result = compare_models(model, model)
    assert result.ok, result
