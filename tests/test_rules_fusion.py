"""Fusion rules: prove tests (decomposition => fused node under fixed budgets, at the opsets that
have the standard op and below), refutations where a guard must hold, and numeric checks of
models holding each decomposition as exporters write it, optimized and run on onnxruntime."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from egglog import EGraph, eq, i64, set_
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat import cli
from onnxsat.base.options import Options
from onnxsat.egraph import lang as L
from onnxsat.egraph.shapes import shape_rules
from onnxsat.rules import RULES
from onnxsat.rules.families import fusion

from .helpers_onnx import ort_ran_ops, outputs_match, run_ort
from .prove import _load, _warm

F, F16, D = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
X, G, B = L.Tensor.input("x"), L.Tensor.weight("g"), L.Tensor.weight("b")
NONE = L.Tensor.none()
SHAPES = {"x": (2, 3, 4), "g": (4,), "b": (4,)}
LAST = L.Tensor.ints(L.ivec([-1]), 1)


def c(value: float, dt: int = F) -> L.Tensor:
    return L.Tensor.splat(value, L.ivec([]), dt)


@contextmanager
def _at_opset(opset: int, terms: list[L.Tensor], dtypes: dict[str, int] | None) -> Iterator[EGraph]:
    """The warm e-graph of ``tests/prove.py`` holding ``terms`` and the model opset fact."""
    egraph = _warm()
    egraph.push()
    try:
        _load(egraph, terms, SHAPES, ("g", "b"), dtypes or {})
        egraph.register(set_(L.model_opset()).to(i64(opset)))
        yield egraph
    finally:
        egraph.pop()


def _run(egraph: EGraph, rounds: int = 3) -> None:
    """Rounds of the fusion and core rules (the other families cannot create or block a fusion)."""
    rules = RULES.ruleset_for([*RULES.families["fusion"], *RULES.families["core"]])
    for _ in range(rounds):
        egraph.run(shape_rules.saturate())
        egraph.run(rules)
    egraph.run(shape_rules.saturate())


def prove_at(opset: int, start: L.Tensor, goal: L.Tensor, dtypes: dict[str, int] | None = None) -> None:
    with _at_opset(opset, [start, goal], dtypes) as egraph:
        _run(egraph)
        egraph.check(eq(start).to(goal))


def refute_at(opset: int, start: L.Tensor, goal: L.Tensor, dtypes: dict[str, int] | None = None) -> None:
    with _at_opset(opset, [start, goal], dtypes) as egraph:
        _run(egraph)
        egraph.check_fail(eq(start).to(goal))


# ---------------------------------------------------------------- start terms, as exporters write them
def layer_norm_chain(
    x: L.Tensor = X, axes: L.Tensor = LAST, rsqrt: bool = False, eps: float = 1e-5
) -> L.Tensor:
    centered = L.sub(x, L.reduce_mean(x, axes, 1, 0))
    squared = L.mul(centered, centered) if rsqrt else L.pow_(centered, c(2.0))
    std = L.sqrt(L.add(L.reduce_mean(squared, axes, 1, 0), c(eps)))
    return L.mul(centered, L.reciprocal(std)) if rsqrt else L.div(centered, std)


def gelu_erf_chain(x: L.Tensor = X, sqrt2: float = math.sqrt(2.0), dt: int = F) -> L.Tensor:
    """PyTorch's export: x * (erf(x / sqrt2) + 1) * 0.5."""
    return L.mul(L.mul(x, L.add(L.erf(L.div(x, c(sqrt2, dt))), c(1.0, dt))), c(0.5, dt))


def gelu_tanh_chain(x: L.Tensor = X) -> L.Tensor:
    """Hugging Face's NewGELU: x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cubic = L.add(x, L.mul(L.pow_(x, c(3.0)), c(0.044715)))
    return L.mul(L.mul(x, c(0.5)), L.add(L.tanh(L.mul(cubic, c(math.sqrt(2.0 / math.pi)))), c(1.0)))


def relu6_plus3(x: L.Tensor = X) -> L.Tensor:
    return L.clip(L.add(x, c(3.0)), c(0.0), c(6.0))


def softmax_chain(x: L.Tensor = X, axis: int = 1) -> L.Tensor:
    axes = L.Tensor.ints(L.ivec([axis]), 1)
    shifted = L.exp(L.sub(x, L.reduce_max(x, axes, 1, 0)))
    return L.div(shifted, L.reduce_sum(shifted, axes, 1, 0))


UNIT = L.Tensor.splat(1.0, L.ivec([4]), F)

PROOFS = {
    "layer-norm-fusion": (17, layer_norm_chain(), L.layer_norm(X, UNIT, NONE, -1, 1e-5)),
    "layer-norm-fusion/rsqrt": (18, layer_norm_chain(rsqrt=True), L.layer_norm(X, UNIT, NONE, -1, 1e-5)),
    "layer-norm-absorb-scale": (17, L.mul(layer_norm_chain(), G), L.layer_norm(X, G, NONE, -1, 1e-5)),
    "layer-norm-absorb-bias": (17, L.add(L.mul(layer_norm_chain(), G), B), L.layer_norm(X, G, B, -1, 1e-5)),
    "gelu-erf-fusion": (20, gelu_erf_chain(), L.gelu(X, "none")),
    "gelu-erf-fusion/fused": (17, gelu_erf_chain(), L.fused_gelu(X, "none", F)),
    "gelu-erf-fusion/folded-float32": (
        17,
        L.mul(L.mul(X, c(0.5)), L.add(L.erf(L.mul(X, c(float(np.float32(1 / math.sqrt(2)))))), c(1.0))),
        L.fused_gelu(X, "none", F),
    ),
    "gelu-tanh-fusion": (20, gelu_tanh_chain(), L.gelu(X, "tanh")),
    "gelu-tanh-fusion/fused": (13, gelu_tanh_chain(), L.fused_gelu(X, "tanh", F)),
    "silu-fusion": (24, L.mul(L.sigmoid(X), X), L.swish(X, 1.0)),
    "silu-fusion/fused": (17, L.mul(X, L.sigmoid(X)), L.fused_silu(X)),
    "hard-sigmoid-fusion": (13, L.div(relu6_plus3(), c(6.0)), L.hard_sigmoid(X, 1 / 6, 0.5)),
    "hard-swish-fusion": (14, L.div(L.mul(X, relu6_plus3()), c(6.0)), L.hard_swish(X)),
    "hard-swish-fusion/hard-sigmoid": (
        14,
        L.mul(X, L.hard_sigmoid(X, float(np.float32(1 / 6)), 0.5)),
        L.hard_swish(X),
    ),
    "softmax-fusion": (13, softmax_chain(axis=1), L.softmax(X, 1)),
    "softmax-fusion/last-axis": (18, softmax_chain(axis=-1), L.softmax(X, 2)),
    "bias-gelu-fusion": (20, L.gelu(L.add(X, B), "none"), L.fused_bias_gelu(X, B, "none", F)),
    "bias-gelu-fusion/fused": (17, gelu_erf_chain(L.add(X, B)), L.fused_bias_gelu(X, B, "none", F)),
}


@pytest.mark.parametrize("case", list(PROOFS))
def test_prove(case: str) -> None:
    opset, start, goal = PROOFS[case]
    prove_at(opset, start, goal)


def test_every_fusion_rule_has_a_prove_test() -> None:
    """The transformer fusions (RMSNorm) have theirs in test_fusion_transformers.py."""
    from .test_fusion_transformers import PROOFS as TRANSFORMER_PROOFS

    proved = {case.split("/")[0] for case in [*PROOFS, *TRANSFORMER_PROOFS]}
    assert proved == set(fusion.RULE_NAMES) == set(RULES.families["fusion"])


REFUTATIONS = {
    # The standard op does not exist at the model's opset: no Gelu before 20, no LayerNormalization before 17.
    "gelu-needs-opset-20": (19, gelu_erf_chain(), L.gelu(X, "none"), None),
    "fused-gelu-only-below-20": (20, gelu_erf_chain(), L.fused_gelu(X, "none", F), None),
    "layer-norm-needs-opset-17": (16, layer_norm_chain(), L.layer_norm(X, UNIT, NONE, -1, 1e-5), None),
    "hard-swish-needs-opset-14": (13, L.div(L.mul(X, relu6_plus3()), c(6.0)), L.hard_swish(X), None),
    # A constant that is not sqrt(2) (beyond float32 rounding) is not GELU.
    "gelu-wrong-constant": (17, gelu_erf_chain(sqrt2=1.4142), L.fused_gelu(X, "none", F), None),
    # LayerNorm over a middle axis is not LayerNormalization(axis=-1).
    "layer-norm-middle-axis": (
        17,
        layer_norm_chain(axes=L.Tensor.ints(L.ivec([1]), 1)),
        L.layer_norm(X, UNIT, NONE, -1, 1e-5),
        None,
    ),
    # float16 chains are left alone (their constants are float16-rounded; fused ops compute wider).
    "gelu-float16": (17, gelu_erf_chain(dt=F16), L.fused_gelu(X, "none", F16), {"x": F16}),
}


@pytest.mark.parametrize("case", list(REFUTATIONS))
def test_refute(case: str) -> None:
    opset, start, goal, dtypes = REFUTATIONS[case]
    refute_at(opset, start, goal, dtypes)


# ---------------------------------------------------------------- models, as exporters write them
class _Builder:
    def __init__(self, opset: int, rng: np.random.Generator, dtype: type = np.float32):
        self.opset, self.rng, self.dtype = opset, rng, dtype
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    def const(self, value: float) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.array(value, self.dtype), name))
        return name

    def weight(self, shape: tuple[int, ...]) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(self.rng.standard_normal(shape).astype(self.dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def reduce(self, op_type: str, x: str, axis: int) -> str:
        since = {"ReduceSum": 13}.get(op_type, 18)
        if self.opset >= since:
            axes = self.name("axes")
            self.inits.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
            return self.op(op_type, x, axes, keepdims=1)
        return self.op(op_type, x, axes=[axis], keepdims=1)

    def gelu_erf(self, x: str) -> str:
        erf = self.op("Erf", self.op("Div", x, self.const(math.sqrt(2.0))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", erf, self.const(1.0))), self.const(0.5))


def fusion_model(opset: int, elem_type: int = F, erf: bool = True) -> onnx.ModelProto:
    """One output per decomposition: LayerNorm (Pow/Div and Mul/rsqrt forms), GELU (erf and tanh),
    SiLU, HardSwish and HardSigmoid as relu6 arithmetic, Softmax over axis 1, MatMul + bias + GELU.
    ``erf=False`` leaves out the two erf GELUs (onnxruntime has no float64 Erf)."""
    b = _Builder(opset, np.random.default_rng(0), helper.tensor_dtype_to_np_dtype(elem_type).type)
    x = "x"
    outs = []
    centered = b.op("Sub", x, b.reduce("ReduceMean", x, -1))
    var = b.reduce("ReduceMean", b.op("Pow", centered, b.const(2.0)), -1)
    normed = b.op("Div", centered, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    outs.append(b.op("Add", b.op("Mul", normed, b.weight((8,))), b.weight((8,))))
    centered2 = b.op("Sub", x, b.reduce("ReduceMean", x, 2))
    var2 = b.reduce("ReduceMean", b.op("Mul", centered2, centered2), 2)
    rstd = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var2, b.const(1e-6))))
    outs.append(b.op("Mul", b.op("Mul", centered2, rstd), b.weight((8,))))
    if erf:
        outs.append(b.gelu_erf(x))
    cubic = b.op("Add", x, b.op("Mul", b.op("Pow", x, b.const(3.0)), b.const(0.044715)))
    tanh = b.op("Tanh", b.op("Mul", cubic, b.const(math.sqrt(2.0 / math.pi))))
    outs.append(b.op("Mul", b.op("Mul", x, b.const(0.5)), b.op("Add", tanh, b.const(1.0))))
    outs.append(b.op("Mul", x, b.op("Sigmoid", x)))
    relu6 = b.op("Clip", b.op("Add", "y", b.const(3.0)), b.const(0.0), b.const(6.0))
    outs.append(b.op("Div", b.op("Mul", "y", relu6), b.const(6.0)))
    outs.append(
        b.op("Div", b.op("Clip", b.op("Add", x, b.const(3.0)), b.const(0.0), b.const(6.0)), b.const(6.0))
    )
    shifted = b.op("Exp", b.op("Sub", x, b.reduce("ReduceMax", x, 1)))
    outs.append(b.op("Div", shifted, b.reduce("ReduceSum", shifted, 1)))
    if erf:
        outs.append(b.gelu_erf(b.op("Add", b.op("MatMul", x, b.weight((8, 8))), b.weight((8,)))))
    inputs = [helper.make_tensor_value_info(n, elem_type, ["batch", 3, 8]) for n in ("x", "y")]
    outputs = [helper.make_tensor_value_info(o, elem_type, ["batch", 3, 8]) for o in outs]
    graph = helper.make_graph(b.nodes, "fusions", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _optimize(model: onnx.ModelProto, **options: object) -> onnx.ModelProto:
    optimized, report = onnxsat.optimize(model, Options(rules_only=("fusion", "core"), **options))  # type: ignore[arg-type]
    assert report.verification.status == "passed", report.verification
    onnx.checker.check_model(optimized, full_check=True)
    np_type = helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    feeds = {n: np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np_type) for n in ("x", "y")}
    why = outputs_match(run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-5)
    assert why is None, why
    return optimized


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node
    )


def test_fusions_at_opset_17_standard_ops_and_chains() -> None:
    """LayerNormalization, HardSwish, HardSigmoid, Softmax exist at 17; GELU and SiLU do not, so
    their fused kinds are written back as the chains (never as ops onnxruntime lacks)."""
    optimized = _optimize(fusion_model(17))
    ops = _ops(optimized)
    assert ops["LayerNormalization"] == 2 and ops["HardSwish"] == 1 and ops["HardSigmoid"] == 1
    assert ops["Softmax"] == 1
    for gone in ("ReduceMean", "ReduceMax", "ReduceSum", "Sqrt", "Reciprocal", "Clip", "Exp"):
        assert ops[gone] == 0, (gone, ops)
    assert ops["Erf"] == 2 and ops["Tanh"] == 1 and ops["Sigmoid"] == 1
    assert "Gelu" not in ops and [o.domain for o in optimized.opset_import] == [""]


def test_fusions_at_opset_20_write_gelu() -> None:
    ops = _ops(_optimize(fusion_model(20)))
    assert ops["Gelu"] == 3 and ops["Erf"] == 0 and ops["Tanh"] == 0, ops
    assert ops["LayerNormalization"] == 2


def test_allow_contrib_ops_writes_onnxruntime_fused_ops() -> None:
    optimized = _optimize(fusion_model(17), allow_contrib_ops=True)
    ops = _ops(optimized)
    assert ops["com.microsoft.Gelu"] == 2 and ops["com.microsoft.FastGelu"] == 1, ops
    # the biased erf GELU as Add + Gelu: onnxruntime's BiasGelu is slower than its Gemm's free bias
    assert ops["com.microsoft.BiasGelu"] == 0 and ops["com.microsoft.QuickGelu"] == 1, ops
    assert ops["Erf"] == 0 and ops["Sigmoid"] == 0
    assert ("com.microsoft", 1) in [(o.domain, o.version) for o in optimized.opset_import]


# ---------------------------------------------------------------- types onnxruntime runs
def test_float64_model_fuses_only_into_ops_onnxruntime_runs(tmp_path: Path) -> None:
    """onnxruntime 1.32 has no float64 HardSigmoid or HardSwish kernel: the CLI writes a verified
    float64 model that keeps those chains and fuses the rest (LayerNormalization, Gelu(tanh), Swish,
    Softmax). (Before the type guards, the HardSwish fusion made verification fail: no file.)"""
    src, out = tmp_path / "f64.onnx", tmp_path / "f64.opt.onnx"
    onnx.save(fusion_model(24, D, erf=False), src)
    code = cli.main(["optimize", str(src), "-o", str(out), "--quiet", "--rules-only", "fusion,core"])
    assert code == 0 and out.exists()
    optimized = onnx.load(out)
    ops = _ops(optimized)
    assert ops["HardSwish"] == 0 and ops["HardSigmoid"] == 0 and ops["Clip"] == 2, ops
    assert ops["Gelu"] == 1 and ops["Swish"] == 1 and ops["Tanh"] == 0 and ops["Sigmoid"] == 0, ops
    assert ops["LayerNormalization"] == 2 and ops["Softmax"] == 1, ops
    model = onnx.load(src)
    feeds = {n: np.random.default_rng(2).standard_normal((2, 3, 8)) for n in ("x", "y")}
    why = outputs_match(
        run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-6, atol=1e-8
    )  # Gelu: float32 constants
    assert why is None, why


def test_float64_with_contrib_ops_writes_erf_gelu_as_its_chain() -> None:
    """com.microsoft Gelu/BiasGelu have no float64 kernel (nor has Erf: onnxruntime cannot verify
    this model, so only the written ops are checked); QuickGelu has one."""
    b = _Builder(17, np.random.default_rng(0), np.float64)
    outs = [
        b.gelu_erf("x"),
        b.op("Mul", "x", b.op("Sigmoid", "x")),
        b.gelu_erf(b.op("Add", "x", b.weight((8,)))),
    ]
    graph = helper.make_graph(
        b.nodes,
        "f64",
        [helper.make_tensor_value_info("x", D, [2, 8])],
        [helper.make_tensor_value_info(o, D, [2, 8]) for o in outs],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    optimized, _ = onnxsat.optimize(
        model, Options(rules_only=("fusion", "core"), allow_contrib_ops=True, verify=False)
    )
    ops = _ops(optimized)
    assert ops["com.microsoft.Gelu"] == 0 and ops["com.microsoft.BiasGelu"] == 0 and ops["Erf"] == 2, ops
    assert ops["com.microsoft.QuickGelu"] == 1, ops


_TARGET_MODELS = {
    "LayerNormalization": (17, "LayerNormalization", {"axis": -1}, 1),
    "Gelu": (20, "Gelu", {}, 0),
    "Gelu-tanh": (20, "Gelu", {"approximate": "tanh"}, 0),
    "Swish": (24, "Swish", {}, 0),
    "HardSigmoid": (13, "HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 0),
    "HardSwish": (14, "HardSwish", {}, 0),
    "Softmax": (13, "Softmax", {"axis": -1}, 0),
}


@pytest.mark.parametrize("target", list(_TARGET_MODELS))
def test_fusion_type_table_matches_onnxruntime(target: str) -> None:
    """``fusion.ORT_TYPES`` lists exactly the float32/float64 types onnxruntime runs each target on."""
    opset, op_type, attrs, extra = _TARGET_MODELS[target]
    runs = []
    for elem_type in (F, D):
        np_type = helper.tensor_dtype_to_np_dtype(elem_type)
        names = ["x", "scale"][: 1 + extra]
        graph = helper.make_graph(
            [helper.make_node(op_type, names, ["y"], **attrs)],
            "one",
            [helper.make_tensor_value_info("x", elem_type, [2, 4])],
            [helper.make_tensor_value_info("y", elem_type, [2, 4])],
            [numpy_helper.from_array(np.ones(4, np_type), "scale")][:extra],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
        try:
            run_ort(model, {"x": np.ones((2, 4), np_type)})
            runs.append(elem_type)
        except Exception:  # onnxruntime has no kernel for this type
            pass
    assert tuple(runs) == fusion.ORT_TYPES[target]


def test_the_tanh_gelu_chain_is_one_onnxruntime_can_fuse(tmp_path: Path) -> None:
    """At opset 17 the tanh GELU is written as torch writes it (Pow(x, 3)), the chain onnxruntime's
    FastGeluFusion matches (it does not match x * x * x): ORT_ENABLE_ALL runs one FastGelu where the
    input's chain, fused by onnxsat and written back, ran as eight kernels. (The fusion skips a
    chain whose last product is a graph output, so a Relu follows.)"""
    c = {name: numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
         (("three", 3.0), ("cubic", 0.044715), ("scale", math.sqrt(2.0 / math.pi)), ("one", 1.0), ("half", 0.5))}
    nodes = [
        helper.make_node("Pow", ["x", "three"], ["cube"]),
        helper.make_node("Mul", ["cube", "cubic"], ["c3"]),
        helper.make_node("Add", ["x", "c3"], ["inner"]),
        helper.make_node("Mul", ["inner", "scale"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["x", "half"], ["hx"]),
        helper.make_node("Mul", ["hx", "t1"], ["gelu"]),
        helper.make_node("Relu", ["gelu"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "gelu_tanh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 8])], list(c.values()),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized, report = onnxsat.optimize(model, Options(rules_only=("fusion", "core")))
    assert report.verification.status == "passed"
    ran = ort_ran_ops(optimized, tmp_path)
    assert ran["FastGelu"] == 1 and ran["Tanh"] == 0, ran
