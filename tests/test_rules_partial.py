"""PET partial rules: each family's site verified by PET's method, proved into the e-graph, and
numerically equal to the original on onnxruntime; wrong corrections are caught."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from egglog import eq, union
from onnx import TensorProto, helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.egraph.shapes import shape_rules
from onnxsat.extract.serialized import serialize
from onnxsat.rules import RULES
from onnxsat.rules.pet.partial import PARTIAL_RULES, apply_partial_rules, site_rules
from onnxsat.rules.pet.partial_families import RULE_NAMES, spatial_to_batch_site
from onnxsat.rules.pet.partial_models import all_sites_model, site_model
from onnxsat.rules.pet.verify_partial import composite_model, verify_partial_rule, verify_site
from onnxsat.rules.schedule import select_rules

from .prove import _egraph

F = TensorProto.FLOAT


def _ints(values: list[int]) -> L.Tensor:
    return L.Tensor.ints(L.ivec(values), 1)


def _sl(x: L.Tensor, axis: int, a: int, b: int) -> L.Tensor:
    return L.slice_(x, _ints([a]), _ints([b]), _ints([axis]), L.Tensor.none())


def _cat(items: list[L.Tensor], axis: int) -> L.Tensor:
    return L.concat(L.tlist(items), axis)


def _conv(x: L.Tensor, w: L.Tensor, pads: list[int], dil: int = 1) -> L.Tensor:
    return L.conv(x, w, L.Tensor.none(), L.ivec([1, 1]), L.ivec(pads), L.ivec([dil, dil]), 1)


# ---------------------------------------------------------------- rule table and verification
def test_partial_family_is_listed_and_off_by_default() -> None:
    """Rules with a correction are the opt-in ``partial`` family; exact site rules run by default."""
    corrected = {n for n in RULE_NAMES if not PARTIAL_RULES[n].exact}
    assert set(RULE_NAMES) == set(PARTIAL_RULES) and corrected == set(RULES.families["partial"])
    assert not corrected & set(select_rules())
    assert set(RULE_NAMES) <= set(select_rules(enable=("partial",)))
    exact = set(RULE_NAMES) - corrected
    assert exact == {"conv-transpose-subpixel"} and exact <= set(RULES.families["layout"]) & set(select_rules())


@pytest.mark.parametrize("name", RULE_NAMES)
def test_every_partial_rule_verifies_by_pet(name: str) -> None:
    result = verify_partial_rule(name)
    assert result.ok, result.detail
    assert result.instances_fired >= 5


def test_wrong_corrections_are_caught() -> None:
    call = PARTIAL_RULES["conv-spatial-to-batch"].samples()[0]
    good = spatial_to_batch_site("conv-spatial-to-batch", call)
    assert good is not None and verify_site(good).ok and verify_site(good).differing_boxes > 0
    # Corrections one row short on each side of the seam: differing boxes lie outside them.
    short = spatial_to_batch_site("conv-spatial-to-batch", call, trim=1)
    assert short is not None
    verdict = verify_site(short)
    assert not verdict.ok and "outside the corrected regions" in verdict.detail
    # Declared slabs right, but the composite drops the correction: mutant != original there.
    good.composites = list(good.mutants)
    verdict = verify_site(good)
    assert not verdict.ok and "mutant + correction != original" in verdict.detail


POOL_CASES = [
    ("MaxPool", (5, 1), (1, 1), (2, 0, 2, 0), {"dilations": (1, 1)}),
    ("MaxPool", (3, 3), (2, 2), (1, 1, 1, 1), {}),
    ("MaxPool", (3, 2), (1, 2), (2, 0, 1, 1), {"dilations": (2, 1)}),
    ("MaxPool", (13, 13), (1, 1), (6, 6, 6, 6), {}),
    ("AveragePool", (7, 1), (1, 1), (3, 0, 3, 0), {}),
    ("AveragePool", (5, 6), (2, 1), (2, 1, 1, 3), {}),
    ("AveragePool", (5, 6), (2, 1), (2, 1, 1, 3), {"count_include_pad": 1}),
]


@pytest.mark.parametrize(("op", "kernel", "strides", "pads", "extra"), POOL_CASES)
def test_numpy_pool_references_match_onnxruntime(op: str, kernel: tuple[int, int], strides: tuple[int, int], pads: tuple[int, ...], extra: dict[str, Any]) -> None:
    """The pooling PET's check evaluates with (onnx.reference's fails or is slow here) agrees with onnxruntime."""
    from onnxsat.rules.pet.verify_partial import average_pool_reference, max_pool_reference

    x = np.random.default_rng(0).standard_normal((1, 2, 11, 9)).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=kernel, strides=strides, pads=pads, **extra)
    model = site_model([node], {"x": [1, 2, 11, 9]}, {"y": None}, {})
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    if op == "MaxPool":
        got = max_pool_reference(x.astype(np.float64), kernel, strides, pads, extra.get("dilations"))
    else:
        got = average_pool_reference(x.astype(np.float64), kernel, strides, pads, extra.get("count_include_pad", 0))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-6, atol=1e-6)


def test_wrong_cuts_are_caught() -> None:
    """A box grid too coarse for the mutant (one box per output) is caught by the full random test."""
    call = PARTIAL_RULES["conv-spatial-to-batch"].samples()[0]
    site = spatial_to_batch_site("conv-spatial-to-batch", call)
    assert site is not None
    site.cuts = [[[0, d] for d in call.out_shape]]
    verdict = verify_site(site)
    assert not verdict.ok and "wrong cuts" in verdict.detail


# ---------------------------------------------------------------- prove: the composite joins the original's e-class
def _prove(start: L.Tensor, goal: L.Tensor, leaves: dict[str, tuple[int, ...]], consts: tuple[str, ...], rule: str) -> None:
    with _egraph([start], leaves, consts, {}) as eg:
        refs = [union(L.tensor_ref(i)).with_((L.Tensor.weight if n in consts else L.Tensor.input)(n)) for i, n in enumerate(leaves)]
        eg.register(*refs, union(L.tensor_ref(len(leaves))).with_(start))
        eg.run(shape_rules.saturate())
        records = apply_partial_rules(SimpleNamespace(egraph=eg), serialize(eg), [rule])
        assert [r.status for r in records] == ["emitted"], records
        eg.check(eq(start).to(goal))


def test_prove_conv_spatial_to_batch() -> None:
    x, w = L.Tensor.input("x"), L.Tensor.weight("w")
    start = _conv(x, w, [1, 1, 1, 1])
    stacked = _conv(_cat([_sl(x, 2, 0, 4), _sl(x, 2, 4, 8)], 0), w, [1, 1, 1, 1])
    mutant = _cat([_sl(stacked, 0, 0, 1), _sl(stacked, 0, 1, 2)], 2)
    halo = _conv(_sl(x, 2, 2, 6), w, [0, 1, 0, 1])  # rows 3, 4 from input rows 2..5
    goal = _cat([_sl(mutant, 2, 0, 3), halo, _sl(mutant, 2, 5, 8)], 2)
    _prove(start, goal, {"x": (1, 2, 8, 5), "w": (3, 2, 3, 3)}, ("w",), "conv-spatial-to-batch")


def test_prove_pool_spatial_to_batch() -> None:
    x = L.Tensor.input("x")

    def pool(t: L.Tensor, pads: list[int]) -> L.Tensor:
        return L.average_pool(t, L.ivec([3, 3]), L.ivec([1, 1]), L.ivec(pads), 0, 1)

    start = pool(x, [1, 1, 1, 1])
    stacked = pool(_cat([_sl(x, 2, 0, 4), _sl(x, 2, 4, 8)], 0), [1, 1, 1, 1])
    mutant = _cat([_sl(stacked, 0, 0, 1), _sl(stacked, 0, 1, 2)], 2)
    goal = _cat([_sl(mutant, 2, 0, 3), pool(_sl(x, 2, 2, 6), [0, 1, 0, 1]), _sl(mutant, 2, 5, 8)], 2)
    _prove(start, goal, {"x": (1, 2, 8, 6)}, (), "pool-spatial-to-batch")


def test_prove_conv_concat_width() -> None:
    x1, x2, w = L.Tensor.input("x1"), L.Tensor.input("x2"), L.Tensor.weight("w")
    pads = [1, 1, 1, 1]
    y1, y2 = _conv(x1, w, pads), _conv(x2, w, pads)
    with _egraph([y1, y2], {"x1": (1, 2, 4, 5), "x2": (1, 2, 4, 6), "w": (3, 2, 3, 3)}, ("w",), {}) as eg:
        names = ["x1", "x2", "w"]
        leaves = [L.Tensor.input("x1"), L.Tensor.input("x2"), L.Tensor.weight("w")]
        eg.register(*[union(L.tensor_ref(i)).with_(t) for i, t in enumerate(leaves)])
        eg.register(union(L.tensor_ref(len(names))).with_(y1), union(L.tensor_ref(len(names) + 1)).with_(y2))
        eg.run(shape_rules.saturate())
        records = apply_partial_rules(SimpleNamespace(egraph=eg), serialize(eg), ["conv-concat-width"])
        assert [r.status for r in records] == ["emitted"]
        both = _conv(_cat([x1, x2], 3), w, pads)  # width 11 -> 11 columns
        goal1 = _cat([_sl(_sl(both, 3, 0, 5), 3, 0, 4), _conv(_sl(x1, 3, 3, 5), w, [1, 0, 1, 1])], 3)
        goal2 = _cat([_conv(_sl(x2, 3, 0, 2), w, [1, 1, 1, 0]), _sl(_sl(both, 3, 5, 11), 3, 1, 6)], 3)
        eg.check(eq(y1).to(goal1))
        eg.check(eq(y2).to(goal2))


def test_prove_dilated_conv_to_batch() -> None:
    x, w = L.Tensor.input("x"), L.Tensor.weight("w")
    start = _conv(x, w, [2, 2, 2, 2], dil=2)
    phases = L.reshape(L.transpose(L.reshape(x, _ints([1, 2, 4, 2, 4, 2]), 0), L.ivec([3, 5, 0, 1, 2, 4])), _ints([4, 2, 4, 4]), 0)
    plain = _conv(phases, w, [1, 1, 1, 1])
    goal = L.reshape(L.transpose(L.reshape(plain, _ints([2, 2, 1, 3, 4, 4]), 0), L.ivec([2, 3, 4, 0, 5, 1])), _ints([1, 3, 8, 8]), 0)
    _prove(start, goal, {"x": (1, 2, 8, 8), "w": (3, 2, 3, 3)}, ("w",), "dilated-conv-to-batch")


def test_prove_matmul_batch_to_gemm() -> None:
    a, b = L.Tensor.input("a"), L.Tensor.weight("b")
    goal = L.reshape(L.matmul(L.reshape(a, _ints([6, 4]), 0), b), _ints([2, 3, 5]), 0)
    _prove(L.matmul(a, b), goal, {"a": (2, 3, 4), "b": (4, 5)}, ("b",), "matmul-batch-to-gemm")


# ---------------------------------------------------------------- numeric: models on onnxruntime
def test_numeric_every_site_on_onnxruntime() -> None:
    """Every site each rule finds in a model holding one site model per rule (one import for all),
    its composite exported as ONNX the way extraction would write it, matches the model on onnxruntime."""
    from onnxsat.egraph.importer import from_onnx
    from onnxsat.rules.pet.partial import find_sites

    model = all_sites_model("small")
    program = from_onnx(model)
    eg = serialize(program.egraph)
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    assert site_rules(select_rules(), eg) == ["conv-transpose-subpixel"]  # the default rules' only site rule
    for name in RULE_NAMES:
        sites = find_sites([name], eg)
        assert any(program.names[eg.origins[o]].startswith(f"{name}/") for s in sites for o in s.outputs), (name, sites)
        for site in sites:
            outputs = [program.names[eg.origins[o]] for o in site.outputs]
            original = onnx.ModelProto()
            original.CopyFrom(model)
            del original.graph.output[:]
            by_name = {o.name: o for o in model.graph.output}
            original.graph.output.extend(by_name[o] for o in outputs)
            composite = composite_model(site, original, {n: program.names[eg.origins[c]] for n, (c, _, _) in site.leaves.items()})
            onnx.checker.check_model(composite, full_check=True)
            op_nodes = [n for n in composite.graph.node if n.op_type not in ("Constant",)]
            assert len(op_nodes) > len(site.outputs), (name, outputs)  # the mutant form, not the original op
            run = ort.InferenceSession(composite.SerializeToString(), providers=["CPUExecutionProvider"])
            got = run.run(None, {i.name: feeds[i.name] for i in run.get_inputs()})
            for out, value in zip(outputs, got, strict=True):
                np.testing.assert_allclose(value, want[out], rtol=1e-4, atol=1e-4, err_msg=f"{name}: {out}")


def test_optimize_runs_the_partial_pass_and_reports_it() -> None:
    """With ``enable_rules=("partial",)`` every site is PET-verified and added, the result verifies, and
    the report says whether extraction used each. Separable pooling is an exact layout rule now, not
    a partial one: with the core rules only, the 13 x 13 MaxPool stays whole."""
    model = site_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["c", "wd"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2]),
            helper.make_node("MaxPool", ["q"], ["p"], kernel_shape=[13, 13], pads=[6, 6, 6, 6]),
            helper.make_node("MatMul", ["a", "m"], ["z"]),
        ],
        {"x": [1, 3, 8, 8], "q": [1, 4, 32, 32], "a": [2, 3, 4]},
        {"y": [1, 4, 8, 8], "p": [1, 4, 32, 32], "z": [2, 3, 5]},
        {"w": (4, 3, 3, 3), "b": (4,), "wd": (4, 4, 3, 3), "m": (4, 5)},
    )
    out, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("core",), enable_rules=("partial",)))
    assert report.verification.status == "passed"
    emitted = {p["rule"] for p in report.partial if p["status"] == "emitted"}
    assert {"conv-spatial-to-batch", "dilated-conv-to-batch", "matmul-batch-to-gemm"} <= emitted, report.partial
    assert all(isinstance(p["used"], bool) for p in report.partial), report.partial
    kernels = [tuple(a.ints) for n in out.graph.node if n.op_type == "MaxPool" for a in n.attribute if a.name == "kernel_shape"]
    assert kernels == [(13, 13)], kernels
    assert "site rules" in report.render()
    others = tuple(n for n in select_rules() if RULES.family_of(n) != "core" and n not in PARTIAL_RULES)
    _, plain = onnxsat.optimize(model, onnxsat.Options(disable_rules=others, verify=False))
    # by default only exact site rules run, and this model has no ConvTranspose: no per-site pass
    assert plain.partial == [] and "partial" not in plain.stage_seconds
