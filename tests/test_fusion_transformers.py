"""Transformer fusions (RMSNorm, residual RMSNorm): prove tests under fixed budgets, refutations where
a guard must hold, the op rows' exported forms against a numpy reference on onnxruntime, the
whole-model opset conversion they may need, and decoder-style models as both torch exporters write
them, optimized and run on onnxruntime."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import pytest
from egglog import EGraph, eq, i64, set_
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.base.options import Options
from onnxsat.egraph import exporter
from onnxsat.egraph import lang as L
from onnxsat.egraph.ops import OPS
from onnxsat.egraph.ops.fused import RMS_NORM_PROBE, SKIP_RMS_NORM_PROBE
from onnxsat.egraph.ops.ort_probe import KernelProbe, ort_runs
from onnxsat.egraph.ops.registry import ExportNode, ctor_name
from onnxsat.egraph.opset_upgrade import UPGRADE_DOMAIN, UpgradeError, convert_whole_model
from onnxsat.egraph.shapes import shape_rules
from onnxsat.rules import RULES

from .helpers_onnx import outputs_match, run_ort
from .prove import _load, _warm

F, F16, D, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16
X, Y, G = L.Tensor.input("x"), L.Tensor.input("y"), L.Tensor.weight("g")
SHAPES = {"x": (2, 3, 4), "y": (2, 3, 4), "g": (4,), "g2": (3, 4), "bias": (4,)}
LAST = L.Tensor.ints(L.ivec([-1]), 1)
EPS = 1e-6
UNIT = L.Tensor.splat(1.0, L.ivec([4]), F)
RMS_RULES = ("rms-norm-fusion", "rms-norm-absorb-scale", "rms-norm-skip-fusion", "rms-norm-shape-of")


def c(value: float, dt: int = F) -> L.Tensor:
    return L.Tensor.splat(value, L.ivec([]), dt)


@contextmanager
def _loaded(terms: list[L.Tensor], dtypes: dict[str, int] | None = None) -> Iterator[EGraph]:
    """The warm e-graph of ``tests/prove.py`` holding ``terms`` (g, g2 are weights) at opset 17."""
    egraph = _warm()
    egraph.push()
    try:
        _load(egraph, terms, SHAPES, ("g", "g2", "bias"), dtypes or {})
        egraph.register(set_(L.model_opset()).to(i64(17)))
        rules = RULES.ruleset_for([*RULES.families["fusion"], *RULES.families["core"], *RULES.families["layout"]])
        for _ in range(3):
            egraph.run(shape_rules.saturate())
            egraph.run(rules)
        egraph.run(shape_rules.saturate())
        yield egraph
    finally:
        egraph.pop()


def prove(start: L.Tensor, goal: L.Tensor, dtypes: dict[str, int] | None = None) -> None:
    with _loaded([start, goal], dtypes) as egraph:
        egraph.check(eq(start).to(goal))


def refute(start: L.Tensor, goal: L.Tensor, dtypes: dict[str, int] | None = None) -> None:
    with _loaded([start, goal], dtypes) as egraph:
        egraph.check_fail(eq(start).to(goal))


# ---------------------------------------------------------------- start terms, as exporters write them
def rms_chain(x: L.Tensor = X, form: str = "dynamo", axes: L.Tensor = LAST, dt: int = F) -> L.Tensor:
    """x * rsqrt(mean(x^2) + eps): dynamo writes Reciprocal(Sqrt), TorchScript 1 / Sqrt."""
    squared = L.pow_(x, c(2.0, dt)) if form != "mul" else L.mul(x, x)
    rms = L.sqrt(L.add(L.reduce_mean(squared, axes, 1, 0), c(EPS, dt)))
    if form == "torchscript":
        return L.mul(x, L.div(c(1.0, dt), rms))
    return L.mul(x, L.reciprocal(rms)) if form == "dynamo" else L.div(x, rms)


def rms(x: L.Tensor, scale: L.Tensor = UNIT) -> L.Tensor:
    return L.fused_rms_norm(x, scale, EPS, F)


def skip(index: int) -> L.Tensor:
    return L.fused_skip_rms_norm(X, Y, G, EPS, F, index)


PROOFS = {
    "rms-norm-fusion": (rms_chain(), rms(X)),
    "rms-norm-fusion/torchscript": (rms_chain(form="torchscript"), rms(X)),
    "rms-norm-fusion/div-of-mul": (rms_chain(form="mul"), rms(X)),
    "rms-norm-absorb-scale": (L.mul(G, rms_chain()), rms(X, G)),
    "rms-norm-absorb-scale/torchscript-cast": (L.mul(G, L.cast(rms_chain(form="torchscript"), F)), rms(X, G)),
    "rms-norm-skip-fusion": (L.mul(rms_chain(L.add(X, Y)), G), skip(0)),
    "rms-norm-skip-fusion/sum": (L.add(X, Y), skip(1)),
    "rms-norm-shape-of": (L.shape_of(L.mul(G, rms_chain()), 0, 2**63 - 1), L.shape_of(X, 0, 2**63 - 1)),
}


@pytest.mark.parametrize("case", list(PROOFS))
def test_prove(case: str) -> None:
    start, goal = PROOFS[case]
    if case == "rms-norm-skip-fusion/sum":  # the sum gets the second output when the norm of it is fused
        with _loaded([L.mul(rms_chain(start), G), start, goal]) as egraph:
            egraph.check(eq(start).to(goal))
        return
    prove(start, goal)


def test_every_rms_rule_has_a_prove_test() -> None:
    assert {case.split("/")[0] for case in PROOFS} == set(RMS_RULES) <= set(RULES.families["fusion"])


REFUTATIONS = {
    # RMSNormalization(axis=-1) normalizes the last axis only.
    "middle-axis": (rms_chain(axes=L.Tensor.ints(L.ivec([1]), 1)), rms(X), None),
    # mean(x^2) + eps without the square root is not an RMS.
    "no-sqrt": (
        L.mul(X, L.reciprocal(L.add(L.reduce_mean(L.mul(X, X), LAST, 1, 0), c(EPS)))),
        rms(X),
        None,
    ),
    # A scale over more than the normalized axis is not RMSNormalization's scale.
    "scale-not-last-axis": (L.mul(L.Tensor.weight("g2"), rms_chain()), rms(X, L.Tensor.weight("g2")), None),
    # A skip that broadcasts (a bias, not a residual) is not SkipSimplifiedLayerNormalization's skip.
    "skip-broadcasts": (
        L.mul(rms_chain(L.add(X, L.Tensor.weight("bias"))), G),
        L.fused_skip_rms_norm(X, L.Tensor.weight("bias"), G, EPS, F, 0),
        None,
    ),
    # float16 chains are left alone (their constants are float16-rounded; fused ops compute wider).
    "float16": (rms_chain(dt=F16), L.fused_rms_norm(X, L.Tensor.splat(1.0, L.ivec([4]), F16), EPS, F16), {"x": F16}),
}


@pytest.mark.parametrize("case", list(REFUTATIONS))
def test_refute(case: str) -> None:
    start, goal, dtypes = REFUTATIONS[case]
    refute(start, goal, dtypes)


# ---------------------------------------------------------------- the op rows against numpy
def rms_reference(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _exported(op_type: str, inputs: list[str], outputs: list[str], attrs: dict[str, Any], **kw: Any) -> ExportNode:
    counter = itertools.count()
    node = ExportNode(
        op_type, inputs, dict(attrs), const_value=lambda i: None, outputs=outputs,
        fresh=lambda hint: f"{hint}_{next(counter)}", **kw,
    )  # fmt: skip
    spec = OPS[op_type]
    assert spec.export is not None
    spec.export(node)
    return node


def _one_node_model(node: ExportNode, inputs: dict[str, np.ndarray], outputs: list[str], opset: int) -> onnx.ModelProto:
    protos = node.expansion or [
        helper.make_node(node.op_type, node.inputs, node.outputs, domain=node.domain or None, **node.attrs)
    ]
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    graph = helper.make_graph(
        protos,
        "row",
        [helper.make_tensor_value_info(n, elem, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(o, elem, next(iter(inputs.values())).shape) for o in outputs],
    )
    domains = {p.domain for p in protos if p.domain}
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in sorted(domains)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)


@pytest.mark.parametrize("opset", [17, 18, 23])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_row_matches_numpy(opset: int, dtype: type) -> None:
    """The chain at opsets 17/18 (ReduceMean's axes attribute, then input) and RMSNormalization at 23."""
    rng = np.random.default_rng(0)
    x, scale = rng.standard_normal((2, 5, 8)).astype(dtype), rng.standard_normal(8).astype(dtype)
    node = _exported(
        "onnxsat.FusedRMSNorm", ["x", "g"], ["y"], {"epsilon": EPS, "dtype": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}, opset=opset
    )
    model = _one_node_model(node, {"x": x, "g": scale}, ["y"], opset)
    onnx.checker.check_model(model, full_check=True)
    assert ("RMSNormalization" in _ops(model)) == (opset >= 23)
    (got,) = run_ort(model, {"x": x, "g": scale})
    np.testing.assert_allclose(got, rms_reference(x, scale, EPS), rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("contrib", [False, True])
def test_skip_rms_norm_row_matches_numpy(contrib: bool) -> None:
    """Both outputs: onnxruntime's SkipSimplifiedLayerNormalization (output 3 is the sum) and Add + chain."""
    rng = np.random.default_rng(1)
    x, r, scale = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 8), (2, 5, 8), (8,)))
    node = _exported(
        "onnxsat.FusedSkipRMSNorm", ["x", "r", "g"], ["y", "sum"], {"epsilon": EPS, "dtype": F}, opset=17, allow_contrib=contrib
    )
    model = _one_node_model(node, {"x": x, "r": r, "g": scale}, ["y", "sum"], 17)
    assert _ops(model)["com.microsoft.SkipSimplifiedLayerNormalization"] == int(contrib)
    normed, total = run_ort(model, {"x": x, "r": r, "g": scale})
    np.testing.assert_allclose(total, x + r, rtol=1e-6)
    np.testing.assert_allclose(normed, rms_reference(x + r, scale, EPS), rtol=1e-5, atol=1e-6)


def test_rms_norm_row_writes_a_placeholder_for_an_opset_upgrade() -> None:
    node = _exported("onnxsat.FusedRMSNorm", ["x", "g"], ["y"], {"epsilon": EPS, "dtype": F}, opset=17, upgrade_opset=23)
    assert [(n.domain, n.op_type) for n in node.expansion] == [(UPGRADE_DOMAIN, "RMSNormalization")]
    below = _exported("onnxsat.FusedRMSNorm", ["x", "g"], ["y"], {"epsilon": EPS, "dtype": F}, opset=17, upgrade_opset=22)
    assert "RMSNormalization" not in [n.op_type for n in below.expansion]


# ---------------------------------------------------------------- what onnxruntime runs, probed
def test_probes_find_the_kernels_onnxruntime_has() -> None:
    """onnxruntime 1.32's CPU provider: RMSNormalization for float32/float64/float16, not bfloat16;
    SkipSimplifiedLayerNormalization for float32/float16 only; an op no one defined never runs."""
    assert [ort_runs(RMS_NORM_PROBE, t) for t in (F, D, F16, BF16)] == [True, True, True, False]
    assert [ort_runs(SKIP_RMS_NORM_PROBE, t) for t in (F, D, F16)] == [True, False, True]
    assert not ort_runs(KernelProbe("NoSuchOp", "com.microsoft", 17, (((2,), None),)), F)


def test_float64_skip_norm_is_written_as_add_and_rms_norm() -> None:
    """No float64 SkipSimplifiedLayerNormalization kernel: even with contrib ops the row writes the Add."""
    node = _exported("onnxsat.FusedSkipRMSNorm", ["x", "r", "g"], ["y", "s"], {"epsilon": EPS, "dtype": D}, opset=23, allow_contrib=True)
    assert [n.op_type for n in node.expansion] == ["Add", "RMSNormalization"]


# ---------------------------------------------------------------- the whole-model conversion
def test_convert_whole_model_moves_placeholders_to_the_default_domain() -> None:
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("RMSNormalization", ["x", "g"], ["n"], domain=UPGRADE_DOMAIN, epsilon=EPS),
        helper.make_node("Add", ["n", "m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, ["batch", 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 8])],
        [numpy_helper.from_array(np.ones(8, np.float32), "g")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(UPGRADE_DOMAIN, 1)])
    converted = convert_whole_model(model, 23)
    onnx.checker.check_model(converted, full_check=True)
    assert [(o.domain, o.version) for o in converted.opset_import] == [("", 23)]
    assert converted.ir_version >= 11
    reduce = next(n for n in converted.graph.node if n.op_type == "ReduceMean")
    assert len(reduce.input) == 2 and not reduce.attribute[0].name == "axes"  # axes became an input at 18
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    expected = rms_reference(x, np.ones(8, np.float32), EPS) + x.mean(-1, keepdims=True)
    np.testing.assert_allclose(run_ort(converted, {"x": x})[0], expected, rtol=1e-5)


# ---------------------------------------------------------------- decoder blocks as exporters write them
class _Decoder:
    """Two residual steps of a Llama-style block: h = x + r; n1 = RMSNorm(h) * w1 (the dynamo form);
    h2 = h + n1 @ W; n2 = w2 * Cast(h2 * (1 / sqrt(mean(h2^2) + eps))) (the TorchScript form)."""

    def __init__(self, opset: int, hidden: int = 8):
        self.opset, self.hidden = opset, hidden
        self.rng = np.random.default_rng(0)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def init(self, array: np.ndarray) -> str:
        self.n += 1
        self.inits.append(numpy_helper.from_array(array, f"w_{self.n}"))
        return f"w_{self.n}"

    def rms(self, x: str, torchscript: bool) -> str:
        squared = self.op("Pow", x, self.init(np.array(2.0, np.float32)))
        if self.opset >= 18:
            mean = self.op("ReduceMean", squared, self.init(np.array([-1], np.int64)), keepdims=1)
        else:
            mean = self.op("ReduceMean", squared, axes=[-1], keepdims=1)
        root = self.op("Sqrt", self.op("Add", mean, self.init(np.array(EPS, np.float32))))
        weight = self.init(self.rng.uniform(0.5, 1.5, self.hidden).astype(np.float32))
        if torchscript:
            normed = self.op("Mul", x, self.op("Div", self.init(np.array(1.0, np.float32)), root))
            return self.op("Mul", weight, self.op("Cast", normed, to=F))
        return self.op("Mul", weight, self.op("Mul", x, self.op("Reciprocal", root)))

    def model(self) -> onnx.ModelProto:
        h = self.op("Add", "x", "r")
        n1 = self.rms(h, torchscript=False)
        proj = self.init(self.rng.standard_normal((self.hidden, self.hidden)).astype(np.float32) * 0.3)
        h2 = self.op("Add", h, self.op("MatMul", n1, proj))
        n2 = self.rms(h2, torchscript=True)
        dims: list[int | str] = ["batch", "seq", self.hidden]
        graph = helper.make_graph(
            self.nodes,
            "decoder",
            [helper.make_tensor_value_info(n, F, dims) for n in ("x", "r")],
            [helper.make_tensor_value_info(o, F, dims) for o in (n2, h2)],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)


def _optimize(model: onnx.ModelProto, **options: Any) -> tuple[onnx.ModelProto, onnxsat.Report]:
    optimized, report = onnxsat.optimize(model, Options(rules_only=("fusion", "core", "layout"), **options))
    assert report.verification.status == "passed", report.verification
    onnx.checker.check_model(optimized, full_check=True)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 5, 8)).astype(np.float32) for n in ("x", "r")}
    why = outputs_match(run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-5)
    assert why is None, why
    dims = [[d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in optimized.graph.input]
    assert dims == [["batch", "seq", 8]] * 2  # dynamic dims stay symbolic
    return optimized, report


@pytest.mark.parametrize("opset", [17, 18])
def test_decoder_norms_become_rms_normalization_at_opset_23(opset: int) -> None:
    optimized, report = _optimize(_Decoder(opset).model())
    ops = _ops(optimized)
    assert ops["RMSNormalization"] == 2, ops
    for gone in ("Pow", "ReduceMean", "Sqrt", "Reciprocal", "Div", "Cast"):
        assert ops[gone] == 0, (gone, ops)
    assert (report.opset, report.opset_after) == (opset, 23)
    assert [(o.domain, o.version) for o in optimized.opset_import] == [("", 23)]


def test_keep_opset_writes_the_chains() -> None:
    optimized, report = _optimize(_Decoder(17).model(), upgrade_opset=None)
    ops = _ops(optimized)
    assert ops["RMSNormalization"] == 0 and ops["Sqrt"] == 2 and report.opset_after == 17, ops


@pytest.mark.parametrize("extractor", ["greedy-dag", "ilp"])
def test_contrib_ops_fuse_the_residual_adds_where_the_opset_is_kept(extractor: str) -> None:
    """Both residual sums are also read after the norm (a graph output, the next residual): each
    SkipSimplifiedLayerNormalization writes its sum as output 3, and no Add is left (whichever
    extractor chose the kernel for one of its outputs, the other output's class takes it too)."""
    optimized, _ = _optimize(_Decoder(17).model(), allow_contrib_ops=True, upgrade_opset=None, extractor=extractor)
    ops = _ops(optimized)
    assert ops["com.microsoft.SkipSimplifiedLayerNormalization"] == 2 and ops["Add"] == 0, ops
    skips = [n for n in optimized.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert all(len(n.output) == 4 and n.output[3] for n in skips)


def test_contrib_ops_prefer_rms_normalization() -> None:
    """Where RMSNormalization can be written, Add + RMSNormalization is (faster on onnxruntime's CPU
    provider than its SkipSimplifiedLayerNormalization, see ``fused._skip_rms_norm_export``)."""
    optimized, _ = _optimize(_Decoder(17).model(), allow_contrib_ops=True)
    ops = _ops(optimized)
    assert ops["RMSNormalization"] == 2 and ops["Add"] == 2 and ops["com.microsoft.SkipSimplifiedLayerNormalization"] == 0, ops


def test_failed_conversion_keeps_the_opset_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
        raise UpgradeError("onnx.version_converter to opset 23 failed: no adapter")

    monkeypatch.setattr(exporter, "convert_whole_model", refuse)
    optimized, report = _optimize(_Decoder(17).model())
    assert _ops(optimized)["RMSNormalization"] == 0 and report.opset_after == 17
    assert any("opset kept at 17" in w and "no adapter" in w for w in report.warnings), report.warnings


def test_model_at_opset_23_needs_no_conversion() -> None:
    optimized, report = _optimize(_Decoder(23).model())
    assert _ops(optimized)["RMSNormalization"] == 2 and (report.opset, report.opset_after) == (23, 23)


def test_conversion_that_does_not_verify_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A converted model whose outputs differ (here: a converter that breaks every norm's epsilon) is
    not blamed on a rule: the model is written again at its own opset, with a warning."""
    convert = exporter.convert_whole_model

    def broken(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
        converted = convert(model, opset)
        for node in converted.graph.node:
            if node.op_type == "RMSNormalization":
                node.attribute[0].f = 10.0
        return converted

    monkeypatch.setattr(exporter, "convert_whole_model", broken)
    optimized, report = _optimize(_Decoder(17).model())
    assert _ops(optimized)["RMSNormalization"] == 0 and report.opset_after == 17
    assert any("did not verify" in w for w in report.warnings), report.warnings


def test_a_chosen_kernel_gives_its_other_output_to_that_class() -> None:
    """The norm's class chose the residual kernel, the sum's class its plain Add: the sum's class
    takes the kernel's second output, so the export writes one kernel and no second Add."""
    from onnxsat.egraph.graph_types import ENode, Ref, SerializedEGraph
    from onnxsat.extract.greedy import complete_kernels

    op = ctor_name(L.fused_skip_rms_norm)
    leaves = {c: [ENode("Tensor.input", (c,))] for c in ("x", "y", "g")}
    kernel = [Ref("x"), Ref("y"), Ref("g"), EPS, F]
    add, first, second = ENode("add", (Ref("x"), Ref("y"))), ENode(op, (*kernel, 0)), ENode(op, (*kernel, 1))
    eg = SerializedEGraph(classes={**leaves, "sum": [add, second], "norm": [first]})
    chosen = [("x", leaves["x"][0]), ("y", leaves["y"][0]), ("g", leaves["g"][0]), ("sum", add), ("norm", first)]
    completed = dict(complete_kernels(eg, chosen, ["norm", "sum"]))
    assert completed["sum"] is second and completed["norm"] is first
    assert complete_kernels(eg, chosen[:3] + [("sum", add)], ["sum"]) == chosen[:3] + [("sum", add)]
