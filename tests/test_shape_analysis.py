"""The shape/dtype analysis (the egglog rules of egraph/shapes.py) against ONNX shape inference.

Models are imported with ``trust_onnx_shapes=False``, so every shape below the graph inputs and
weights comes from the analysis alone. Three kinds of checks:

* agreement: on every ONNX backend node case of a modelled op, each tensor that both the
  analysis and ``onnx.shape_inference`` know fully has the same dims and dtype;
* coverage: where egraph/shapes.py has a rule for an op (and the instance is one the rule is
  written for), the analysis shapes the node's output;
* generated models for ranks 0..6 (broadcasting, transpose, unary), the NN ops and the layout
  ops, with symbolic dims (``dim_param``) that must flow through unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxsat.egraph.ops import OPS

from .helpers_onnx import (
    analysis_dtype,
    analysis_shape,
    case_params,
    case_result,
    expected_opaque_reason,
    fully_known,
    imported,
    main_op,
    make_model,
    node_cases,
    onnx_inferred,
    out_vi,
    symbolic_shape,
    vi,
)

CASES = node_cases()

# ---------------------------------------------------------------- backend cases: agreement


@pytest.mark.parametrize("case", case_params(CASES))
def test_agrees_with_onnx_shape_inference(case) -> None:
    result = case_result(case)
    inferred = onnx_inferred(case.model)
    problems = []
    for name, mine in result.shapes.items():
        onnx_dtype, onnx_dims = inferred.get(name, (None, None))
        if mine is not None and onnx_dims is not None and len(mine) != len(onnx_dims):
            problems.append(f"{name}: rank {len(mine)} (analysis) vs {len(onnx_dims)} (onnx)")
        elif fully_known(mine) and fully_known(onnx_dims) and tuple(mine) != tuple(onnx_dims):
            problems.append(f"{name}: shape {mine} (analysis) vs {onnx_dims} (onnx)")
        dtype = result.dtypes[name]
        if dtype is not None and onnx_dtype is not None and dtype != onnx_dtype:
            problems.append(f"{name}: dtype {dtype} (analysis) vs {onnx_dtype} (onnx)")
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("case", case_params(CASES))
def test_imports_modelled_or_expected_opaque(case) -> None:
    """A case stays opaque only for a real unsupported feature, with that reason recorded."""
    result = case_result(case)
    reason = expected_opaque_reason(case.name)
    assert not result.unknown_ops, result.unknown_ops
    if reason is None:
        assert not result.opaque, f"unexpectedly opaque: {result.opaque_reasons}"
    else:
        assert result.opaque, f"expected opaque ({reason}) but the op was modelled"
        assert any(reason in r for r in result.opaque_reasons), result.opaque_reasons


# ---------------------------------------------------------------- backend cases: coverage
SAME_SHAPE_OPS = {
    "Relu", "Sigmoid", "Tanh", "Erf", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Identity",
    "LeakyRelu", "Gelu", "Cast", "Clip", "Softmax", "BatchNormalization", "LayerNormalization", "LRN",
}  # fmt: skip
BINARY_OPS = {"Add", "Sub", "Mul", "Div", "Pow"}
COVERED_OPS = SAME_SHAPE_OPS | BINARY_OPS | {
    "Where", "MatMul", "Gemm", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
    "Transpose", "Reshape", "Flatten", "Concat", "Shape", "ConvTranspose",
}  # fmt: skip
"""Ops with shape rules in egraph/shapes.py (the others keep ONNX's shapes at import)."""


def _ranks(model: onnx.ModelProto) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for value in model.graph.input:
        tt = value.type.tensor_type
        out[value.name] = (
            len(tt.shape.dim) if value.type.HasField("tensor_type") and tt.HasField("shape") else None
        )
    return out


def _const_ints(model: onnx.ModelProto, name: str) -> list[int] | None:
    for init in model.graph.initializer:
        if init.name == name:
            return [int(v) for v in numpy_helper.to_array(init).reshape(-1)]
    return None


def rule_applies(model: onnx.ModelProto) -> bool:
    """Whether shapes.py has a rule for this (single-node) model's instance of its op."""
    node = model.graph.node[0]
    op = node.op_type
    ranks = [_ranks(model).get(i) for i in node.input]
    if op not in COVERED_OPS or any(r is None for r, i in zip(ranks, node.input, strict=True) if i):
        return False
    if op in SAME_SHAPE_OPS:
        return True
    if op in BINARY_OPS or op == "Where":
        return all(r <= 6 for r in ranks)
    if op == "MatMul":  # any ranks up to 6, vectors included
        return all(1 <= r <= 6 for r in ranks)
    if op in ("Gemm", "Conv", "GlobalAveragePool", "MaxPool", "AveragePool", "ConvTranspose"):
        return True
    if op == "Transpose":
        return ranks[0] <= 6
    if op == "Reshape":
        target = _const_ints(model, node.input[1])
        fixed = all(d.HasField("dim_value") for d in model.graph.input[0].type.tensor_type.shape.dim)
        return target is not None and all(d >= -1 for d in target) and (fixed or -1 not in target)
    if op == "Flatten":
        return all(d.HasField("dim_value") for d in model.graph.input[0].type.tensor_type.shape.dim)
    if op in ("Concat", "Shape"):
        return True
    return False


COVERAGE_CASES = [c for c in CASES if rule_applies(c.model) and expected_opaque_reason(c.name) is None]


@pytest.mark.parametrize("case", case_params(COVERAGE_CASES))
def test_rules_shape_covered_instances(case) -> None:
    result = case_result(case)
    node = case.model.graph.node[0]
    unshaped_inputs = [i for i in node.input if i and result.shapes.get(i) is None]
    assert not unshaped_inputs, f"graph inputs without a shape: {unshaped_inputs}"
    missing = [o for o in node.output if o and result.shapes.get(o) is None]
    assert not missing, f"{main_op(case)} has a shape rule but {missing} got no shape"


def test_coverage_cases_exist_for_each_covered_op() -> None:
    """Every op with a shape rule is exercised by a backend case, except Reshape (the cases' targets
    are graph inputs) and LayerNormalization (the cases use the extra outputs): generated below."""
    have = {main_op(c) for c in COVERAGE_CASES}
    assert COVERED_OPS <= set(OPS)
    assert COVERED_OPS - have == {"Reshape", "LayerNormalization"}, COVERED_OPS - have


@pytest.mark.slow
def test_node_case_modules_are_complete() -> None:
    """The fast case generation (modules named after the ops) finds every case collect_testcases does."""
    assert [c.name for c in node_cases(full=True)] == [c.name for c in CASES]


# ---------------------------------------------------------------- generated models
def _check(
    model: onnx.ModelProto, expected: dict[str, tuple[object, ...]], dtypes: dict[str, int] | None = None
) -> None:
    """Import without trusting ONNX shapes; each tensor has the expected shape (symbols by name),
    and every tensor known fully by both the analysis and ONNX agrees."""
    inferred = onnx_inferred(model)
    with imported(model) as program:
        got = {name: symbolic_shape(program, name) for name in expected}
        assert got == expected
        for name, want in (dtypes or {}).items():
            assert analysis_dtype(program, name) == want, name
        for name in program.terms:
            mine = analysis_shape(program, name)
            onnx_dtype, onnx_dims = inferred.get(name, (None, None))
            if fully_known(mine) and fully_known(onnx_dims):
                assert mine == onnx_dims, name
            dtype = analysis_dtype(program, name)
            if dtype is not None and onnx_dtype is not None:
                assert dtype == onnx_dtype, name


def _x_dim(k: int) -> int | str:
    """Dim ``k`` from the right of the left operand in the broadcasting models."""
    return [k + 2, 1, f"c{k}", f"d{k}"][k % 4]


def _y_dim(k: int) -> int | str:
    return [1, f"b{k}", f"c{k}", 3][k % 4]


def _bcast_dim(k: int) -> int | str:
    """known x 1 -> known; 1 x sym -> sym; same sym -> sym; sym x known -> known."""
    return [k + 2, f"b{k}", f"c{k}", 3][k % 4]


def _dims(rank: int, dim) -> list[int | str]:  # noqa: ANN001
    return [dim(k) for k in reversed(range(rank))]


def _bcast_expected(ra: int, rb: int) -> tuple[object, ...]:
    out = []
    for k in reversed(range(max(ra, rb))):
        if k < ra and k < rb:
            out.append(_bcast_dim(k))
        else:
            out.append(_x_dim(k) if k < ra else _y_dim(k))
    return tuple(out)


RANKS = list(range(7))


@pytest.mark.parametrize("ra", RANKS, ids=[f"rank{r}" for r in RANKS])
def test_broadcasting_ranks_with_symbolic_dims(ra: int) -> None:
    """Add/Mul and Where of a rank-``ra`` tensor with tensors of every rank 0..6."""
    nodes, inputs, outputs, expected = [], [vi("x", TP.FLOAT, _dims(ra, _x_dim))], [], {}
    for rb in RANKS:
        y_dims = _dims(rb, _y_dim)
        inputs += [vi(f"y{rb}", TP.FLOAT, y_dims), vi(f"c{rb}", TP.BOOL, y_dims)]
        rank = max(ra, rb)
        nodes += [
            helper.make_node("Add", ["x", f"y{rb}"], [f"add{rb}"]),
            helper.make_node("Mul", [f"y{rb}", "x"], [f"mul{rb}"]),
            helper.make_node("Where", [f"c{rb}", "x", f"y{rb}"], [f"where{rb}"]),
        ]
        outputs += [out_vi(f"{op}{rb}", TP.FLOAT, rank) for op in ("add", "mul", "where")]
        want = _bcast_expected(ra, rb)
        expected.update({f"add{rb}": want, f"mul{rb}": want, f"where{rb}": want})
    model = make_model(nodes, inputs, outputs, 17)
    _check(model, expected, {name: TP.FLOAT for name in expected})


def _mixed_dims(rank: int) -> list[int | str]:
    return [k + 2 if k % 2 == 0 else f"n{k}" for k in range(rank)]


def _transpose(inp: str, out: str, perm: list[int]) -> onnx.NodeProto:
    node = helper.make_node("Transpose", [inp], [out])
    node.attribute.append(helper.make_attribute("perm", perm, attr_type=onnx.AttributeProto.INTS))
    return node


@pytest.mark.parametrize("rank", RANKS, ids=[f"rank{r}" for r in RANKS])
def test_transpose_ranks_with_symbolic_dims(rank: int) -> None:
    dims = _mixed_dims(rank)
    rotate = [(i + 1) % rank for i in range(rank)]
    shuffled = [int(i) for i in np.random.default_rng(rank).permutation(rank)]
    nodes = [
        helper.make_node("Transpose", ["x"], ["default"]),  # no perm: reverse
        _transpose("x", "rotated", rotate),
        _transpose("x", "shuffled", shuffled),
        _transpose("shuffled", "back", [int(i) for i in np.argsort(shuffled)]),
    ]
    names = ["default", "rotated", "shuffled", "back"]
    model = make_model(nodes, [vi("x", TP.FLOAT, dims)], [out_vi(n, TP.FLOAT, rank) for n in names], 17)
    expected = {
        "default": tuple(dims[::-1]),
        "rotated": tuple(dims[p] for p in rotate),
        "shuffled": tuple(dims[p] for p in shuffled),
        "back": tuple(dims),
    }
    _check(model, expected)


@pytest.mark.parametrize("rank", RANKS, ids=[f"rank{r}" for r in RANKS])
def test_unary_ranks_with_symbolic_dims(rank: int) -> None:
    dims = _mixed_dims(rank)
    nodes = [
        helper.make_node("Relu", ["x"], ["relu"]),
        helper.make_node("Sigmoid", ["relu"], ["sigmoid"]),
        helper.make_node("Cast", ["sigmoid"], ["cast"], to=TP.INT64),
        helper.make_node("Shape", ["cast"], ["shape"]),
    ]
    outputs = [
        out_vi("sigmoid", TP.FLOAT, rank),
        out_vi("cast", TP.INT64, rank),
        out_vi("shape", TP.INT64, 1),
    ]
    model = make_model(nodes, [vi("x", TP.FLOAT, dims)], outputs, 17)
    same = tuple(dims)
    _check(
        model,
        {"relu": same, "sigmoid": same, "cast": same, "shape": (rank,)},
        {"relu": TP.FLOAT, "cast": TP.INT64, "shape": TP.INT64},
    )


@pytest.mark.parametrize("ra", range(2, 7), ids=[f"a-rank{r}" for r in range(2, 7)])
def test_matmul_batch_broadcasting(ra: int) -> None:
    """[batch.., M, K] x [batch.., K, N] (and x [K]) with symbolic M and broadcast batch dims."""
    a_dims = _dims(ra - 2, lambda k: _x_dim(k + 2)) + ["m", 4]
    nodes, inputs, outputs, expected = [], [vi("a", TP.FLOAT, a_dims)], [], {}
    for rb in range(1, 7):
        b_dims = [4] if rb == 1 else _dims(rb - 2, lambda k: _y_dim(k + 2)) + [4, 5]
        inputs.append(vi(f"b{rb}", TP.FLOAT, b_dims))
        nodes.append(helper.make_node("MatMul", ["a", f"b{rb}"], [f"mm{rb}"]))
        if rb == 1:
            want = tuple(a_dims[:-1])
        else:
            batch = []
            for k in reversed(range(max(ra, rb) - 2)):
                if k < ra - 2 and k < rb - 2:
                    batch.append(_bcast_dim(k + 2))
                else:
                    batch.append(_x_dim(k + 2) if k < ra - 2 else _y_dim(k + 2))
            want = (*batch, "m", 5)
        outputs.append(out_vi(f"mm{rb}", TP.FLOAT, len(want)))
        expected[f"mm{rb}"] = want
    _check(make_model(nodes, inputs, outputs, 17), expected, {n: TP.FLOAT for n in expected})


def test_gemm_transposes() -> None:
    nodes, outputs, expected = [], [], {}
    for ta in (0, 1):
        for tb in (0, 1):
            a, b = ("a_t" if ta else "a"), ("b_t" if tb else "b")
            name = f"gemm{ta}{tb}"
            nodes.append(helper.make_node("Gemm", [a, b, "c"], [name], transA=ta, transB=tb, alpha=0.5))
            outputs.append(out_vi(name, TP.FLOAT, 2))
            expected[name] = ("m", 5)
    inputs = [
        vi("a", TP.FLOAT, ["m", 4]),
        vi("a_t", TP.FLOAT, [4, "m"]),
        vi("b", TP.FLOAT, [4, 5]),
        vi("b_t", TP.FLOAT, [5, 4]),
        vi("c", TP.FLOAT, [5]),
    ]
    _check(make_model(nodes, inputs, outputs, 13), expected)


def _window(size: int, k: int, s: int, d: int, pads: int) -> int:
    return (size + pads - d * (k - 1) - 1) // s + 1


@pytest.mark.parametrize("n", [1, 2, 3], ids=["1d", "2d", "3d"])
def test_conv_and_pooling_windows(n: int) -> None:
    """Conv (strides, asymmetric pads, dilations, groups), MaxPool/AveragePool (ceil_mode 0),
    GlobalAveragePool, with a symbolic batch dim."""
    spatial = [9, 8, 7][:n]
    kernel, strides, dil = [3, 2, 3][:n], [2, 1, 3][:n], [1, 2, 1][:n]
    pads = [1, 0, 2][:n] + [0, 1, 1][:n]
    x = vi("x", TP.FLOAT, ["N", 4, *spatial])
    rng = np.random.default_rng(n)
    w = numpy_helper.from_array(rng.standard_normal([6, 2, *kernel]).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal([6]).astype(np.float32), "bias")
    conv_sp = [
        _window(s, k, st, d, pads[i] + pads[n + i])
        for i, (s, k, st, d) in enumerate(zip(spatial, kernel, strides, dil, strict=True))
    ]
    pool_sp = [
        _window(s, k, st, 1, pads[i] + pads[n + i])
        for i, (s, k, st) in enumerate(zip(spatial, kernel, strides, strict=True))
    ]
    dil_sp = [
        _window(s, k, st, d, pads[i] + pads[n + i])
        for i, (s, k, st, d) in enumerate(zip(spatial, kernel, strides, dil, strict=True))
    ]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "bias"], ["conv"], strides=strides, pads=pads, dilations=dil, group=2
        ),
        helper.make_node(
            "MaxPool", ["x"], ["maxpool"], kernel_shape=kernel, strides=strides, pads=pads, dilations=dil
        ),
        helper.make_node("AveragePool", ["x"], ["avgpool"], kernel_shape=kernel, strides=strides, pads=pads),
        helper.make_node("GlobalAveragePool", ["conv"], ["gap"]),
        helper.make_node("Relu", ["gap"], ["relu"]),
    ]
    names = ["conv", "maxpool", "avgpool", "relu"]
    model = make_model(nodes, [x], [out_vi(name, TP.FLOAT, n + 2) for name in names], 13, [w, bias])
    expected = {
        "conv": ("N", 6, *conv_sp),
        "maxpool": ("N", 4, *dil_sp),
        "avgpool": ("N", 4, *pool_sp),
        "gap": ("N", 6, *[1] * n),
        "relu": ("N", 6, *[1] * n),
    }
    _check(model, expected, {name: TP.FLOAT for name in expected})


def test_same_shape_ops_with_symbolic_dims() -> None:
    """Normalizations and activations keep their input's shape (symbols included) and dtype."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal([3]).astype(np.float32), name)
        for name in ("scale", "bias", "mean")
    ] + [numpy_helper.from_array(rng.random([3]).astype(np.float32) + 0.5, "var")]
    weights.append(numpy_helper.from_array(np.ones([5], np.float32), "ln_scale"))
    nodes = [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("LRN", ["bn"], ["lrn"], size=3),
        helper.make_node("LayerNormalization", ["lrn", "ln_scale"], ["ln"], axis=-1),
        helper.make_node("Softmax", ["ln"], ["softmax"], axis=1),
        helper.make_node("LeakyRelu", ["softmax"], ["leaky"], alpha=0.2),
        helper.make_node("Gelu", ["leaky"], ["gelu"], approximate="tanh"),
        helper.make_node("Erf", ["gelu"], ["erf"]),
        helper.make_node("Clip", ["erf", "", "hi"], ["clip"]),
        helper.make_node("Identity", ["clip"], ["ident"]),
    ]
    weights.append(numpy_helper.from_array(np.array(0.5, np.float32), "hi"))
    dims = ("N", 3, "H", 5)
    model = make_model(nodes, [vi("x", TP.FLOAT, dims)], [out_vi("ident", TP.FLOAT, 4)], 20, weights)
    names = ["bn", "lrn", "ln", "softmax", "leaky", "gelu", "erf", "clip", "ident"]
    _check(model, {n: dims for n in names}, {n: TP.FLOAT for n in names})


TARGETS = [[], [24], [4, 6], [2, 3, 4], [1, 2, 3, 4], [2, 1, 3, 1, 4], [1, 2, 1, 3, 1, 4]]


@pytest.mark.parametrize("target", TARGETS, ids=[f"rank{len(t)}" for t in TARGETS])
def test_reshape_to_positive_constant_target(target: list[int]) -> None:
    """The target as an initializer and as a Constant node; -1/0 targets are not covered (no shape)."""
    numel = int(np.prod(target, dtype=np.int64))
    x_dims = [numel] if numel != 24 else [2, 12]
    init = numpy_helper.from_array(np.array(target, dtype=np.int64), "target")
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["from_init"]),
        helper.make_node(
            "Constant", [], ["target_c"], value=numpy_helper.from_array(np.array(target, dtype=np.int64))
        ),
        helper.make_node("Reshape", ["x", "target_c"], ["from_const"]),
    ]
    outputs = [out_vi("from_init", TP.FLOAT, len(target)), out_vi("from_const", TP.FLOAT, len(target))]
    model = make_model(nodes, [vi("x", TP.FLOAT, x_dims)], outputs, 14, [init])
    _check(model, {"from_init": tuple(target), "from_const": tuple(target)})


def test_reshape_with_inferred_dim() -> None:
    """0 copies the input dim, -1 takes the rest of the element count."""
    init = numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "target")
    nodes = [helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vi("x", TP.FLOAT, [2, 3, 4])], [out_vi("y", TP.FLOAT, 2)], 14, [init])
    _check(model, {"y": (2, 12)})


def test_reshape_minus_one_with_symbolic_input_is_left_unshaped() -> None:
    """-1 needs the element count; with a symbolic dim the analysis must not guess one."""
    init = numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "target")
    nodes = [helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [vi("x", TP.FLOAT, ["n", 3, 4])], [out_vi("y", TP.FLOAT, 2)], 14, [init])
    _check(model, {"y": None})


@pytest.mark.parametrize("axis", range(-4, 5), ids=[f"axis{a}" for a in range(-4, 5)])
def test_flatten_axes(axis: int) -> None:
    dims = [2, 3, 4, 5]
    a = axis + 4 if axis < 0 else axis
    want = (int(np.prod(dims[:a])), int(np.prod(dims[a:])))
    nodes = [helper.make_node("Flatten", ["x"], ["y"], axis=axis)]
    model = make_model(nodes, [vi("x", TP.FLOAT, dims)], [out_vi("y", TP.FLOAT, 2)], 13)
    _check(model, {"y": want})


@pytest.mark.parametrize("rank", range(1, 7), ids=[f"rank{r}" for r in range(1, 7)])
def test_concat_two_inputs_every_axis(rank: int) -> None:
    """Every axis, positive and negative; symbolic dims off the axis flow through."""
    nodes, inputs, outputs, expected = [], [], [], {}
    for axis in range(-rank, rank):
        pos = axis % rank
        a = [f"s{k}" if k != pos else 2 for k in range(rank)]
        b = [f"s{k}" if k != pos else 3 for k in range(rank)]
        tag = f"{'m' if axis < 0 else 'p'}{abs(axis)}"
        inputs += [vi(f"a{tag}", TP.FLOAT, a), vi(f"b{tag}", TP.FLOAT, b)]
        nodes.append(helper.make_node("Concat", [f"a{tag}", f"b{tag}"], [f"cat{tag}"], axis=axis))
        outputs.append(out_vi(f"cat{tag}", TP.FLOAT, rank))
        expected[f"cat{tag}"] = tuple(5 if k == pos else f"s{k}" for k in range(rank))
    _check(make_model(nodes, inputs, outputs, 13), expected)


def test_warm_egraph_import_equals_fresh_import() -> None:
    """The tests import into a reused e-graph holding the model's analysis rules (push/pop); a fresh
    ``from_onnx`` with every analysis rule gives the same shapes."""
    init = numpy_helper.from_array(np.array([-1, 12], dtype=np.int64), "t")
    pos = numpy_helper.from_array(np.array([6, 8], dtype=np.int64), "p")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "x"], ["add"]),
        helper.make_node("Transpose", ["add"], ["tr"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["tr", "t"], ["rs"]),
        helper.make_node("Reshape", ["tr", "p"], ["rp"]),
        helper.make_node("Softmax", ["rp"], ["sm"], axis=-1),
    ]
    w = numpy_helper.from_array(np.ones([6, 6], np.float32), "w")
    model = make_model(nodes, [vi("x", TP.FLOAT, [4, 2, 6])], [out_vi("sm", TP.FLOAT, 2)], 13, [init, pos, w])
    with imported(model, fresh=True) as program:
        fresh = {n: (analysis_shape(program, n), analysis_dtype(program, n)) for n in program.terms}
    with imported(model) as program:
        warm = {n: (analysis_shape(program, n), analysis_dtype(program, n)) for n in program.terms}
    assert fresh == warm
    assert fresh["sm"] == ((6, 8), TP.FLOAT)


def test_broadcast_of_two_different_symbols_is_not_one_of_them() -> None:
    nodes = [helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Add", ["y", "x"], ["w"])]
    model = make_model(
        nodes,
        [vi("x", TP.FLOAT, ["a", 3]), vi("y", TP.FLOAT, ["b", 3])],
        [out_vi("z", TP.FLOAT, 2), out_vi("w", TP.FLOAT, 2)],
        17,
    )
    with imported(model) as program:
        z, w = symbolic_shape(program, "z"), symbolic_shape(program, "w")
    assert z is not None and z[0] not in ("a", "b")  # at run time a == 1 gives b, b == 1 gives a
    assert z == w  # the pair symbol does not depend on operand order
