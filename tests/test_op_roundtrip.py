"""Import -> export without rewrites keeps every modelled op valid and numerically identical.

* Every ONNX backend node case of a modelled op is imported, extracted and exported with no
  rewrite rule; the result passes ``onnx.checker`` (full check) and reproduces the case's
  expected outputs (onnxruntime where it runs the case, else ``onnx.reference``). Cases that
  stay opaque (a real unsupported feature, see helpers_onnx.EXPECTED_OPAQUE) must round-trip
  their node verbatim.
* Small generated models at opsets 9, 13, 17 and the newest onnx knows exercise the
  opset-dependent forms (axes/split/pads/bounds/starts as attributes or inputs, Split's
  num_outputs, Softmax's old axis meaning): the exported node must use the form valid at the
  model's opset and compute what onnxruntime computes on the original.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxsat
from onnxsat.base.options import Options
from onnxsat.rules import RULES

from .helpers_onnx import (
    NEWEST_OPSET,
    case_params,
    case_result,
    engine_for,
    feeds_for,
    imported,
    make_model,
    node_cases,
    out_vi,
    outputs_match,
    roundtrip,
    run_ort,
    run_reference,
    run_with,
    vi,
)

CASES = node_cases()


# ---------------------------------------------------------------- backend node cases
@pytest.mark.parametrize("case", case_params(CASES))
def test_backend_case_roundtrip(case) -> None:
    result = case_result(case)
    assert result.export_error is None, result.export_error
    exported = result.exported
    onnx.checker.check_model(exported, full_check=True)
    original = case.model
    assert [(o.domain, o.version) for o in exported.opset_import] == [
        (o.domain, o.version) for o in original.opset_import
    ]
    assert [i.name for i in exported.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in exported.graph.output] == [o.name for o in original.graph.output]
    if result.opaque:
        assert [n.SerializeToString() for n in exported.graph.node] == [
            n.SerializeToString() for n in original.graph.node
        ]
    else:
        assert Counter(n.op_type for n in exported.graph.node) == Counter(
            n.op_type for n in original.graph.node
        )
    engine = engine_for(case)
    inputs, expected = case.data_sets[0]
    got = run_with(engine, exported, feeds_for(original, inputs))
    why = outputs_match(got, expected, case.rtol, case.atol)
    assert why is None, f"{engine}: {why}"


# ---------------------------------------------------------------- generated opset forms
OPSETS = sorted({9, 13, 17, NEWEST_OPSET})


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _f32(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@dataclass
class Exported:
    """An exported model with lookups for the form checks."""

    model: onnx.ModelProto

    def node(self, output: str) -> onnx.NodeProto:
        """The node computing ``output``, through the Identity export adds when two original
        tensors became one e-class (e.g. Softmax axis=-1 and axis=2 on a rank-3 input)."""
        node = next(n for n in self.model.graph.node if output in n.output)
        while node.op_type == "Identity":
            node = next(n for n in self.model.graph.node if node.input[0] in n.output)
        return node

    def const(self, name: str) -> list[float] | None:
        """Values of an initializer or Constant output (None when it is computed)."""
        for init in self.model.graph.initializer:
            if init.name == name:
                return numpy_helper.to_array(init).reshape(-1).tolist()
        for n in self.model.graph.node:
            if n.op_type == "Constant" and name in n.output:
                return numpy_helper.to_array(n.attribute[0].t).reshape(-1).tolist()
        return None


@dataclass
class Form:
    """A model builder for one op family and a check of the exported node's form."""

    build: Callable[[int], onnx.ModelProto]
    check: Callable[[Exported, int], None]
    min_opset: int = 1


# ------------------------------------------------ Squeeze / Unsqueeze: axes attribute before 13
def _squeeze_model(opset: int) -> onnx.ModelProto:
    inits = []
    if opset < 13:
        nodes = [
            helper.make_node("Squeeze", ["x"], ["sq"], axes=[0, 2]),
            helper.make_node("Unsqueeze", ["sq"], ["y"], axes=[1, 3]),
        ]
    else:
        nodes = [
            helper.make_node("Squeeze", ["x", "sq_axes"], ["sq"]),
            helper.make_node("Unsqueeze", ["sq", "unsq_axes"], ["y"]),
        ]
        inits = [_ints("sq_axes", [0, 2]), _ints("unsq_axes", [1, 3])]
    return make_model(nodes, [vi("x", TP.FLOAT, [1, 3, 1, 4])], [out_vi("y", TP.FLOAT, 4)], opset, inits)


def _squeeze_check(ex: Exported, opset: int) -> None:
    for out, axes in (("sq", [0, 2]), ("y", [1, 3])):
        node = ex.node(out)
        if opset < 13:
            assert list(node.input) == [node.input[0]] and _attrs(node) == {"axes": axes}, node
        else:
            assert len(node.input) == 2 and "axes" not in _attrs(node), node
            assert ex.const(node.input[1]) == axes


# ------------------------------------------------ Split: split attribute before 13, num_outputs from 18
def _split_model(opset: int) -> onnx.ModelProto:
    inits = []
    if opset < 13:
        uneven = helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[2, 4])
    else:
        uneven = helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1)
        inits.append(_ints("sizes", [2, 4]))
    extra = {"num_outputs": 3} if opset >= 18 else {}
    equal = helper.make_node("Split", ["x"], ["c", "d", "e"], axis=1, **extra)
    outs = [out_vi(n, TP.FLOAT, 2) for n in "abcde"]
    return make_model([uneven, equal], [vi("x", TP.FLOAT, [2, 6])], outs, opset, inits)


def _split_check(ex: Exported, opset: int) -> None:
    uneven, equal = ex.node("a"), ex.node("c")
    assert list(uneven.output) == ["a", "b"] and list(equal.output) == ["c", "d", "e"]
    if opset < 13:
        assert len(uneven.input) == 1 and _attrs(uneven) == {"axis": 1, "split": [2, 4]}
    else:
        assert len(uneven.input) == 2 and ex.const(uneven.input[1]) == [2, 4]
        assert "split" not in _attrs(uneven) and "num_outputs" not in _attrs(uneven)
    assert len(equal.input) == 1
    assert _attrs(equal) == ({"axis": 1, "num_outputs": 3} if opset >= 18 else {"axis": 1})


def _split_dynamic_model(opset: int) -> onnx.ModelProto:
    """Sizes known only at run time (a graph input): the export must still write every output."""
    node = helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=0)
    inputs = [vi("x", TP.FLOAT, [6, 2]), vi("sizes", TP.INT64, [3])]
    return make_model([node], inputs, [out_vi(n, TP.FLOAT, 2) for n in "abc"], opset)


def _split_dynamic_check(ex: Exported, opset: int) -> None:
    node = ex.node("a")
    assert list(node.input) == ["x", "sizes"] and list(node.output) == ["a", "b", "c"]
    assert _attrs(node) == {}


# ------------------------------------------------ ReduceSum (axes input from 13), ReduceMean (from 18)
def _reduce_model(op: str, since: int) -> Callable[[int], onnx.ModelProto]:
    def build(opset: int) -> onnx.ModelProto:
        inits = []
        if opset < since:
            nodes = [
                helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=0),
                helper.make_node(op, ["x"], ["z"], axes=[0, -1]),
            ]
        else:
            nodes = [
                helper.make_node(op, ["x", "axes_y"], ["y"], keepdims=0),
                helper.make_node(op, ["x", "axes_z"], ["z"]),
            ]
            inits = [_ints("axes_y", [1]), _ints("axes_z", [0, -1])]
        nodes.append(helper.make_node(op, ["x"], ["all"], keepdims=0))  # no axes: reduce everything
        outs = [out_vi("y", TP.FLOAT, 2), out_vi("z", TP.FLOAT, 3), out_vi("all", TP.FLOAT, 0)]
        return make_model(nodes, [vi("x", TP.FLOAT, [2, 3, 4])], outs, opset, inits)

    return build


def _reduce_check(since: int) -> Callable[[Exported, int], None]:
    def check(ex: Exported, opset: int) -> None:
        for out, axes, keep in (("y", [1], 0), ("z", [0, -1], 1)):
            node = ex.node(out)
            attrs = _attrs(node)
            assert attrs.get("keepdims", 1) == keep
            if opset < since:
                assert len(node.input) == 1 and attrs["axes"] == axes, node
            else:
                assert len(node.input) == 2 and "axes" not in attrs and ex.const(node.input[1]) == axes, node
        node = ex.node("all")
        assert len(node.input) == 1 and "axes" not in _attrs(node)

    return check


# ------------------------------------------------ Clip: bounds as attributes before 11
def _clip_model(opset: int) -> onnx.ModelProto:
    inits = []
    if opset < 11:
        nodes = [
            helper.make_node("Clip", ["x"], ["both"], min=-0.5, max=0.5),
            helper.make_node("Clip", ["x"], ["upper"], max=0.25),
        ]
    else:
        nodes = [
            helper.make_node("Clip", ["x", "lo", "hi"], ["both"]),
            helper.make_node("Clip", ["x", "", "hi2"], ["upper"]),
        ]
        inits = [_f32("lo", -0.5), _f32("hi", 0.5), _f32("hi2", 0.25)]
    outs = [out_vi("both", TP.FLOAT, 2), out_vi("upper", TP.FLOAT, 2)]
    return make_model(nodes, [vi("x", TP.FLOAT, [3, 4])], outs, opset, inits)


def _clip_check(ex: Exported, opset: int) -> None:
    both, upper = ex.node("both"), ex.node("upper")
    if opset < 11:
        assert len(both.input) == 1 and _attrs(both) == pytest.approx({"min": -0.5, "max": 0.5})
        assert len(upper.input) == 1 and _attrs(upper)["max"] == pytest.approx(0.25)
        assert _attrs(upper).get("min", -np.inf) == -np.inf
    else:
        assert _attrs(both) == {} and _attrs(upper) == {}
        assert ex.const(both.input[1]) == [-0.5] and ex.const(both.input[2]) == [0.5]
        assert upper.input[1] == "" or ex.const(upper.input[1]) == [-np.inf]
        assert ex.const(upper.input[2]) == [0.25]


# ------------------------------------------------ Slice: starts/ends/axes as attributes before 10
def _slice_model(opset: int) -> onnx.ModelProto:
    inits = []
    if opset < 10:
        nodes = [helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[4, 5], axes=[0, 2])]
        outs = [out_vi("y", TP.FLOAT, 3)]
    else:
        nodes = [
            helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
            helper.make_node("Slice", ["x", "starts2", "ends2", "axes2", "steps2"], ["z"]),
        ]
        inits = [
            _ints("starts", [1, 0]), _ints("ends", [4, 5]), _ints("axes", [0, 2]),
            _ints("starts2", [0, -1]), _ints("ends2", [6, -100]), _ints("axes2", [1, 2]), _ints("steps2", [2, -2]),
        ]  # fmt: skip
        outs = [out_vi("y", TP.FLOAT, 3), out_vi("z", TP.FLOAT, 3)]
    return make_model(nodes, [vi("x", TP.FLOAT, [5, 6, 7])], outs, opset, inits)


def _slice_check(ex: Exported, opset: int) -> None:
    node = ex.node("y")
    if opset < 10:
        assert len(node.input) == 1 and _attrs(node) == {"starts": [1, 0], "ends": [4, 5], "axes": [0, 2]}
    else:
        assert _attrs(node) == {} and [ex.const(i) for i in node.input[1:]] == [[1, 0], [4, 5], [0, 2]]
        steps = ex.node("z")
        assert [ex.const(i) for i in steps.input[1:]] == [[0, -1], [6, -100], [1, 2], [2, -2]]


# ------------------------------------------------ Pad: pads/value as attributes before 11
def _pad_model(opset: int) -> onnx.ModelProto:
    inits = []
    if opset < 11:
        nodes = [
            helper.make_node("Pad", ["x"], ["const"], pads=[0, 1, 1, 0], value=1.5),
            helper.make_node("Pad", ["x"], ["reflect"], pads=[1, 2, 1, 0], mode="reflect"),
        ]
    else:
        nodes = [
            helper.make_node("Pad", ["x", "pads", "value"], ["const"]),
            helper.make_node("Pad", ["x", "pads2"], ["reflect"], mode="reflect"),
        ]
        inits = [_ints("pads", [0, 1, 1, 0]), _f32("value", 1.5), _ints("pads2", [1, 2, 1, 0])]
    outs = [out_vi("const", TP.FLOAT, 2), out_vi("reflect", TP.FLOAT, 2)]
    if opset >= 18:
        nodes.append(helper.make_node("Pad", ["x", "pads3", "", "axes3"], ["axes"]))
        inits += [_ints("pads3", [2, 1]), _ints("axes3", [-1])]
        outs.append(out_vi("axes", TP.FLOAT, 2))
    return make_model(nodes, [vi("x", TP.FLOAT, [3, 4])], outs, opset, inits)


def _pad_check(ex: Exported, opset: int) -> None:
    const, reflect = ex.node("const"), ex.node("reflect")
    if opset < 11:
        assert len(const.input) == 1 and _attrs(const)["pads"] == [0, 1, 1, 0]
        assert (
            _attrs(const)["value"] == pytest.approx(1.5)
            and _attrs(const).get("mode", b"constant") == b"constant"
        )
        assert len(reflect.input) == 1 and _attrs(reflect)["pads"] == [1, 2, 1, 0]
        assert _attrs(reflect)["mode"] == b"reflect"
    else:
        assert "pads" not in _attrs(const) and "value" not in _attrs(const)
        assert ex.const(const.input[1]) == [0, 1, 1, 0] and ex.const(const.input[2]) == [1.5]
        assert ex.const(reflect.input[1]) == [1, 2, 1, 0] and _attrs(reflect)["mode"] == b"reflect"
    if opset >= 18:
        axes = ex.node("axes")
        assert ex.const(axes.input[1]) == [2, 1] and ex.const(axes.input[3]) == [-1]


# ------------------------------------------------ Softmax: before 13 it flattened at `axis`
def _softmax_model(opset: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Softmax", ["x"], ["last"], axis=-1),
        helper.make_node("Softmax", ["x"], ["last_pos"], axis=2),
        helper.make_node("Softmax", ["x"], ["middle"], axis=1),  # old meaning: over axes 1 and 2
        helper.make_node("Softmax", ["x"], ["default"]),  # 1 before 13, -1 since
    ]
    outs = [out_vi(n, TP.FLOAT, 3) for n in ("last", "last_pos", "middle", "default")]
    return make_model(nodes, [vi("x", TP.FLOAT, [2, 3, 4])], outs, opset)


def _softmax_check(ex: Exported, opset: int) -> None:
    for out in ("last", "last_pos"):
        assert _attrs(ex.node(out)).get("axis", -1 if opset >= 13 else 1) % 3 == 2
    middle = _attrs(ex.node("middle")).get("axis", -1 if opset >= 13 else 1)
    assert middle == 1
    default = _attrs(ex.node("default")).get("axis", -1 if opset >= 13 else 1)
    assert default % 3 == (2 if opset >= 13 else 1)


FORMS: dict[str, Form] = {
    "Squeeze-Unsqueeze": Form(_squeeze_model, _squeeze_check),
    "Split": Form(_split_model, _split_check),
    "Split-dynamic-sizes": Form(_split_dynamic_model, _split_dynamic_check, min_opset=13),
    "ReduceSum": Form(_reduce_model("ReduceSum", 13), _reduce_check(13)),
    "ReduceMean": Form(_reduce_model("ReduceMean", 18), _reduce_check(18)),
    "Clip": Form(_clip_model, _clip_check),
    "Slice": Form(_slice_model, _slice_check),
    "Pad": Form(_pad_model, _pad_check),
    "Softmax": Form(_softmax_model, _softmax_check),
}

EXPECTED_OPAQUE_FORMS = {
    # Before opset 13 Softmax over a non-last axis normalizes over a flattened suffix: not the
    # modelled single-axis op, so those nodes stay opaque (and round-trip verbatim).
    ("Softmax", 9): {"Softmax: Softmax before opset 13 over more than the last axis": 2},
}


def _random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        tt = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        if tt.elem_type == TP.INT64:  # Split sizes: a partition of the split axis
            feeds[value.name] = np.array([1, 3, 2], dtype=np.int64)
        else:
            feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


FORM_PARAMS = [
    pytest.param(name, opset, id=f"{name}-opset{opset}")
    for name, form in FORMS.items()
    for opset in OPSETS
    if opset >= form.min_opset
]


@pytest.mark.parametrize(("name", "opset"), FORM_PARAMS)
def test_opset_form_roundtrip(name: str, opset: int) -> None:
    form = FORMS[name]
    model = form.build(opset)
    with imported(model, trust_onnx_shapes=True) as program:
        reasons = dict(program.opaque_reasons)
        assert not program.unknown_ops
        exported = roundtrip(program, model)
    assert reasons == EXPECTED_OPAQUE_FORMS.get((name.split("-")[0], opset), {})
    onnx.checker.check_model(exported, full_check=True)
    assert [(o.domain, o.version) for o in exported.opset_import] == [("", opset)]
    form.check(Exported(exported), opset)
    feeds = _random_feeds(model)
    want = run_ort(model, feeds)
    got = run_ort(exported, feeds)
    assert outputs_match(got, want, rtol=1e-5, atol=1e-6) is None


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
def test_legacy_broadcast_attribute_survives_export(op: str) -> None:
    """Before opset 7 a binary op broadcasts only with ``broadcast=1``; import drops it (the
    modelled op broadcasts numpy-style), so export at opset 6 must write it back. onnxruntime has
    no opset-6 kernels: the reference evaluator checks the numerics."""
    node = helper.make_node(op, ["x", "y"], ["z"], broadcast=1)
    inputs = [vi("x", TP.FLOAT, [2, 3]), vi("y", TP.FLOAT, [3])]
    graph = helper.make_graph([node], "g", inputs, [vi("z", TP.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)
    onnx.checker.check_model(model, full_check=True)
    with imported(model, trust_onnx_shapes=True) as program:
        assert not program.opaque
        exported = roundtrip(program, model)
    onnx.checker.check_model(exported, full_check=True)
    (out,) = exported.graph.node
    assert out.op_type == op and _attrs(out) == {"broadcast": 1}
    if op == "Pow":
        return  # onnx.reference has no Pow-1 (it rejects `broadcast` on the original model too)
    feeds = {
        "x": np.random.default_rng(0).random([2, 3], np.float32) + 0.5,
        "y": np.array([1.0, 2.0, 0.5], np.float32),
    }
    assert outputs_match(run_reference(exported, feeds), run_reference(model, feeds), 1e-6, 1e-7) is None


@pytest.mark.parametrize("opset", OPSETS, ids=[f"opset{o}" for o in OPSETS])
def test_optimize_with_rules_disabled_roundtrips(opset: int) -> None:
    """The public path with the only rule family disabled: verified against onnxruntime."""
    model = _chain_model(opset)
    optimized, report = onnxsat.optimize(model, Options(disable_rules=tuple(RULES.families)))
    assert report.saturation.stop_reason == "no rules enabled"
    assert report.verification.status == "passed"
    assert Counter(n.op_type for n in optimized.graph.node) == Counter(n.op_type for n in model.graph.node)
    feeds = _random_feeds(model)
    assert outputs_match(run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-5, atol=1e-6) is None


def _chain_model(opset: int) -> onnx.ModelProto:
    """Squeeze -> ReduceSum -> Clip -> Softmax -> Unsqueeze in the opset's own forms, symbolic batch."""
    inits = []
    if opset < 13:
        squeeze = helper.make_node("Squeeze", ["x"], ["sq"], axes=[1])
        reduce = helper.make_node("ReduceSum", ["sq"], ["rs"], axes=[2], keepdims=1)
        unsqueeze = helper.make_node("Unsqueeze", ["sm"], ["y"], axes=[1])
    else:
        squeeze = helper.make_node("Squeeze", ["x", "ax1"], ["sq"])
        reduce = helper.make_node("ReduceSum", ["sq", "ax2"], ["rs"], keepdims=1)
        unsqueeze = helper.make_node("Unsqueeze", ["sm", "ax1"], ["y"])
        inits += [_ints("ax1", [1]), _ints("ax2", [2])]
    if opset < 11:
        clip = helper.make_node("Clip", ["rs"], ["cl"], min=-1.0, max=1.0)
    else:
        clip = helper.make_node("Clip", ["rs", "lo", "hi"], ["cl"])
        inits += [_f32("lo", -1.0), _f32("hi", 1.0)]
    softmax = helper.make_node("Softmax", ["cl"], ["sm"], axis=-1 if opset >= 13 else 2)
    nodes = [squeeze, reduce, clip, softmax, unsqueeze]
    return make_model(
        nodes, [vi("x", TP.FLOAT, ["batch", 1, 3, 4])], [out_vi("y", TP.FLOAT, 4)], opset, inits
    )
