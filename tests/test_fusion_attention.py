"""Attention fusion: prove tests under fixed budgets, refutations where a guard must hold, the op
rows' exported forms (Attention / RotaryEmbedding at opset 23 and the chains below it) against
numpy on onnxruntime, SDPA blocks as torch's exporters write them and the committed transformer
exports, optimized and run on onnxruntime."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from egglog import EGraph, eq, i64, set_
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.base.options import Options
from onnxsat.egraph import lang as L
from onnxsat.egraph.ops import OPS
from onnxsat.egraph.ops.fused import (
    ATTENTION_3D_PROBE,
    ATTENTION_PROBE,
    CONTRIB_ROTARY_PROBE,
    LONG_SCORES,
    MHA_3D_PROBE,
    MHA_PROBE,
    ROTARY_PROBE,
)
from onnxsat.egraph.ops.ort_probe import ort_runs
from onnxsat.egraph.ops.registry import ExportNode
from onnxsat.egraph.shapes import shape_rules
from onnxsat.rules import RULES
from onnxsat.rules.families import attention

from .helpers_onnx import outputs_match, run_ort
from .prove import _load, _warm
from .test_realmodels import assert_exact_with_left_padding

F, F16, D = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
Q, K, V, M = (L.Tensor.input(n) for n in ("q", "k", "v", "m"))
SHAPES = {"q": (1, 2, 3, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 6), "m": (1, 1, 3, 5), "mq": (1, 1, 1, 5), "keep": (1, 1, 3, 5)}
KEEP = L.Tensor.input("keep")
BOOL_INPUTS = {"keep": TensorProto.BOOL}
PERM = L.ivec([0, 1, 3, 2])


def c(value: float, dt: int = F) -> L.Tensor:
    return L.Tensor.splat(value, L.ivec([]), dt)


def ints(*values: int) -> L.Tensor:
    return L.Tensor.ints(L.ivec(list(values)), 1)


@contextmanager
def _loaded(terms: list[L.Tensor], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, int] | None = None) -> Iterator[EGraph]:
    egraph = _warm()
    egraph.push()
    try:
        _load(egraph, terms, shapes, TABLES, dtypes or {})
        egraph.register(set_(L.model_opset()).to(i64(17)))
        rules = RULES.ruleset_for([*RULES.families["attention"], *RULES.families["core"]])
        for _ in range(3):
            egraph.run(shape_rules.saturate())
            egraph.run(rules)
        egraph.run(shape_rules.saturate())
        yield egraph
    finally:
        egraph.pop()


# ---------------------------------------------------------------- start terms, as exporters write them
def sdpa(q: L.Tensor = Q, mask: L.Tensor | None = None, guard: bool = True, axis: int = 3, dt: int = F) -> L.Tensor:
    """torch's SDPA decomposition: (q * s) @ (k^T * s), + mask, softmax, Where(IsNaN(p), 0, p), @ v."""
    s = c(0.5, dt)
    scores = L.matmul(L.mul(q, s), L.mul(L.transpose(K, PERM), s))
    if mask is not None:
        scores = L.add(scores, mask)
    p = L.softmax(scores, axis)
    if guard:
        p = L.where(L.isnan(p), c(0.0, dt), p)
    return L.matmul(p, V)


def fused(mask: L.Tensor = L.Tensor.none(), scale: float = 0.25, dt: int = F) -> L.Tensor:
    return L.fused_attention(Q, K, V, mask, scale, dt)


def bool_mask(masked: float, kept: float = 0.0) -> L.Tensor:
    """A boolean mask made float as the exporters write it: Where(keep, 0, -inf or finfo.min)."""
    return L.where(KEEP, c(kept), c(masked))


KQ = L.Tensor.input("kq")
TABLES = ("tbl",)
"""Leaves loaded as weights of small values (as import marks T5's position bias table)."""
TABLE_SHAPES = {**SHAPES, "tbl": (1, 2, 3, 5), "tbl_in": (1, 2, 3, 5)}


def table_mask(masked: float, table: str = "tbl") -> L.Tensor:
    """T5's mask: its position bias table where kept, finfo.min elsewhere."""
    leaf = L.Tensor.weight(table) if table in TABLES else L.Tensor.input(table)
    return L.where(KEEP, leaf, c(masked))


KEYS_ONLY = {**SHAPES, "kq": (1, 1, 1, 5)}


def over_queries(mask: L.Tensor) -> L.Tensor:
    """A keys-only [.., 1, S] mask expanded to q's query dim (3), as onnxruntime's Attention needs it."""
    return L.expand(mask, ints(SHAPES["q"][2], 1))


X, COS, SIN = (L.Tensor.input(n) for n in ("x", "cos", "sin"))
ROPE_SHAPES = {"x": (1, 2, 3, 4), "cos": (1, 1, 3, 4), "sin": (1, 1, 3, 4)}


def rope(axis: int = 3, middle: int = 2, neg_first: bool = True, cos: L.Tensor = COS) -> L.Tensor:
    """x * cos + concat(-x[..., h:], x[..., :h]) * sin as the exporters write it (two Slices)."""
    upper = L.slice_(X, ints(middle), ints(2**63 - 1), ints(axis), L.Tensor.none())
    lower = L.slice_(X, ints(0), ints(middle), ints(axis), L.Tensor.none())
    halves = [L.neg(upper), lower] if neg_first else [upper, L.neg(lower)]
    return L.add(L.mul(X, cos), L.mul(L.concat(L.tlist(halves), 3), SIN))


Q3, K3, V3 = (L.Tensor.input(n) for n in ("q3", "k3", "v3"))
PACKED = {"q3": (1, 3, 8), "k3": (1, 5, 8), "v3": (1, 5, 12), "m": (1, 1, 3, 5)}
HEADS_FIRST = L.ivec([0, 2, 1, 3])


def heads_split(x: L.Tensor, seq: int, size: int, perm: list[int] | None = None) -> L.Tensor:
    """[1, seq, 2 * size] -> [1, 2, seq, size] as the exporters write it (Reshape, Transpose)."""
    return L.transpose(L.reshape(x, ints(1, seq, 2, size), 0), L.ivec(perm or [0, 2, 1, 3]))


def heads_merged(q: L.Tensor | None = None, key: L.Tensor | None = None, target: L.Tensor = ints(1, 3, 12)) -> L.Tensor:
    """Attention over the split heads (q and k: as the exporters split them, unless given), merged
    back to [1, 3, 12] (Transpose, Reshape)."""
    q = heads_split(Q3, 3, 4) if q is None else q
    key = heads_split(K3, 5, 4) if key is None else key
    o4 = L.fused_attention(q, key, heads_split(V3, 5, 6), M, 0.5, F)
    return L.reshape(L.transpose(o4, HEADS_FIRST), target, 0)


PACKED_GOAL = L.fused_attention_3d(Q3, K3, V3, M, 0.5, 2, F)

PROOFS: dict[str, tuple[L.Tensor, L.Tensor, dict[str, tuple[int, ...]]]] = {
    "attention-packed-heads": (heads_merged(), PACKED_GOAL, PACKED),
    # GPT-2 (dynamo) merges the heads straight into rows for its Conv1D: [B * T, H * Dv].
    "attention-packed-heads/rows": (heads_merged(target=ints(-1, 12)), L.reshape(PACKED_GOAL, ints(-1, 12), 0), PACKED),
    "attention-packed-heads/key-transposed": (
        heads_merged(key=L.transpose(heads_split(K3, 5, 4, [0, 2, 3, 1]), PERM)),
        PACKED_GOAL,
        PACKED,
    ),
    "attention-fusion": (sdpa(guard=False), fused(), SHAPES),
    "attention-fusion/nan-guard": (sdpa(), fused(), SHAPES),
    # onnxruntime runs float16 Attention (its products in float32).
    "attention-fusion/float16": (sdpa(dt=F16), fused(dt=F16), SHAPES),
    "attention-fusion/div": (L.matmul(L.softmax(L.div(L.matmul(Q, L.transpose(K, PERM)), c(2.0)), 3), V), fused(scale=0.5), SHAPES),
    "attention-mask-fusion": (sdpa(mask=bool_mask(-np.inf)), fused(bool_mask(-np.inf)), SHAPES),
    # finfo.min (dynamo's masks) would zero a fully masked row in onnxruntime: the next float up.
    "attention-mask-fusion/lowest": (
        sdpa(mask=bool_mask(attention.F32_LOWEST)),
        fused(bool_mask(attention.F32_NEXT)),
        SHAPES,
    ),
    "attention-mask-fusion/lowest-first": (
        sdpa(mask=bool_mask(0.0, attention.F32_LOWEST)),
        fused(bool_mask(0.0, attention.F32_NEXT)),
        SHAPES,
    ),
    # TorchScript's decode steps: a mask over the keys only, expanded to the scores' query dim.
    "attention-mask-fusion/keys-only": (
        sdpa(mask=L.where(KQ, c(0.0), c(-np.inf))),
        fused(over_queries(L.where(KQ, c(0.0), c(-np.inf)))),
        KEYS_ONLY,
    ),
    "attention-mask-fusion/keys-only-lowest": (
        sdpa(mask=L.where(KQ, c(0.0), c(attention.F32_LOWEST))),
        fused(over_queries(L.where(KQ, c(0.0), c(attention.F32_NEXT)))),
        KEYS_ONLY,
    ),
    # T5: a constant table of small values where kept, with no NaN guard (no score is -inf).
    "attention-mask-fusion/table": (sdpa(mask=table_mask(-1e4), guard=False), fused(table_mask(-1e4)), TABLE_SHAPES),
    "attention-mask-fusion/table-lowest": (
        sdpa(mask=table_mask(attention.F32_LOWEST), guard=False),
        fused(table_mask(attention.F32_NEXT)),
        TABLE_SHAPES,
    ),
    "attention-key-transpose-cancel": (
        L.fused_attention(Q, L.transpose(L.transpose(K, PERM), PERM), V, M, 0.5, F),
        L.fused_attention(Q, K, V, M, 0.5, F),
        SHAPES,
    ),
    "rotary-fusion": (rope(), L.fused_rotary(X, COS, SIN, F), ROPE_SHAPES),
    "rotary-fusion/axis-1": (rope(axis=-1), L.fused_rotary(X, COS, SIN, F), ROPE_SHAPES),
}


@pytest.mark.parametrize("case", list(PROOFS))
def test_prove(case: str) -> None:
    start, goal, shapes = PROOFS[case]
    floats = {n: F16 for n in ("q", "k", "v")} if case.endswith("float16") else {}
    with _loaded([start, goal], shapes, {**BOOL_INPUTS, "kq": TensorProto.BOOL, **floats}) as egraph:
        egraph.check(eq(start).to(goal))


def test_every_attention_rule_has_a_prove_test() -> None:
    assert {case.split("/")[0] for case in PROOFS} == set(attention.RULE_NAMES) == set(RULES.families["attention"])


REFUTATIONS: dict[str, tuple[L.Tensor, L.Tensor, dict[str, tuple[int, ...]], dict[str, int] | None]] = {
    # Attention's softmax runs over the keys (the last axis) only.
    "softmax-axis-2": (sdpa(axis=2, guard=False), fused(), SHAPES, None),
    # A plain softmax makes a fully masked (-inf) row NaN; Attention makes it zero: no guard, no fusion.
    "mask-without-nan-guard": (sdpa(mask=bool_mask(-np.inf), guard=False), fused(bool_mask(-np.inf)), SHAPES, BOOL_INPUTS),
    # onnxruntime zeroes a row whose mask entries all equal the float's lowest value; a softmax
    # makes it uniform: a float mask input (it may hold finfo.min) is not taken, nor finfo.min kept.
    "float-mask-input": (sdpa(mask=M), fused(M), SHAPES, None),
    "mask-lowest-kept": (
        sdpa(mask=bool_mask(attention.F32_LOWEST)),
        fused(bool_mask(attention.F32_LOWEST)),
        SHAPES,
        BOOL_INPUTS,
    ),
    # onnxruntime broadcasts only the mask's leading dims: a mask over keys only ([1, 1, 1, S]) is
    # not taken as it is (it is expanded to the queries), and a float one (it may hold finfo.min) not at all.
    "mask-broadcast-over-queries": (
        sdpa(mask=L.where(KQ, c(0.0), c(-np.inf))),
        fused(L.where(KQ, c(0.0), c(-np.inf))),
        KEYS_ONLY,
        {"kq": TensorProto.BOOL},
    ),
    "keys-only-float-mask-input": (sdpa(mask=L.Tensor.input("mq")), fused(over_queries(L.Tensor.input("mq"))), SHAPES, None),
    "keys-only-mask-lowest-kept": (
        sdpa(mask=L.where(KQ, c(0.0), c(attention.F32_LOWEST))),
        fused(over_queries(L.where(KQ, c(0.0), c(attention.F32_LOWEST)))),
        KEYS_ONLY,
        {"kq": TensorProto.BOOL},
    ),
    # Without the guard a -inf elsewhere makes a fully masked row NaN (Attention: zero), and a table
    # that is no constant of small values may hold -inf or finfo.min itself.
    "table-mask-minus-inf": (
        sdpa(mask=table_mask(-np.inf), guard=False),
        fused(table_mask(-np.inf)),
        TABLE_SHAPES,
        BOOL_INPUTS,
    ),
    "table-mask-input": (
        sdpa(mask=table_mask(-1e4, "tbl_in"), guard=False),
        fused(table_mask(-1e4, "tbl_in")),
        TABLE_SHAPES,
        BOOL_INPUTS,
    ),
    # q reshaped straight to [B, H, T, D] (no Transpose) does not hold q's heads along its last dim.
    "packed-heads-without-transpose": (heads_merged(q=L.reshape(Q3, ints(1, 2, 3, 4), 0)), PACKED_GOAL, PACKED, None),
    # rotate_half negates the upper half and puts it first; the other rotation is not RotaryEmbedding.
    "rotary-other-direction": (rope(neg_first=False), L.fused_rotary(X, COS, SIN, F), ROPE_SHAPES, None),
    "rotary-off-centre": (rope(middle=1), L.fused_rotary(X, COS, SIN, F), ROPE_SHAPES, None),
    # cos over the heads too ([1, H, S, D]) is not a rotary table RotaryEmbedding could hold.
    "rotary-cos-per-head": (
        rope(cos=L.Tensor.input("cosh")),
        L.fused_rotary(X, L.Tensor.input("cosh"), SIN, F),
        {**ROPE_SHAPES, "cosh": (1, 2, 3, 4)},
        None,
    ),
    "rotary-float16": (rope(), L.fused_rotary(X, COS, SIN, F16), ROPE_SHAPES, {n: F16 for n in ("x", "cos", "sin")}),
}


@pytest.mark.parametrize("case", list(REFUTATIONS))
def test_refute(case: str) -> None:
    start, goal, shapes, dtypes = REFUTATIONS[case]
    with _loaded([start, goal], shapes, dtypes) as egraph:
        egraph.check_fail(eq(start).to(goal))


# ---------------------------------------------------------------- the op rows against numpy
def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float) -> np.ndarray:
    scores = q @ np.swapaxes(k, -1, -2) * scale + (0 if mask is None else mask)
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
    return np.nan_to_num(p, nan=0.0) @ v  # a fully masked row is zero


def _exported(
    op_type: str,
    inputs: list[str],
    attrs: dict[str, Any],
    opset: int,
    values: dict[int, np.ndarray] | None = None,
    shapes: list[tuple[int, ...]] | None = None,
    contrib: bool = False,
) -> ExportNode:
    counter = itertools.count()
    node = ExportNode(
        op_type, inputs, dict(attrs), opset, const_value=lambda i: None, outputs=["y"],
        folded_value=lambda i: (values or {}).get(i), fresh=lambda hint: f"{hint}_{next(counter)}",
        in_shape=lambda i: shapes[i] if shapes and i < len(shapes) else None, allow_contrib=contrib,
    )  # fmt: skip
    spec = OPS[op_type]
    assert spec.export is not None
    spec.export(node)
    return node


def _model(
    node: ExportNode, feeds: dict[str, np.ndarray], opset: int, out: tuple[int | str, ...], dims: dict[str, list[int | str]] | None = None
) -> onnx.ModelProto:
    """The exported nodes as a model; ``dims`` gives inputs symbolic dims (names) in place of sizes."""
    elem = helper.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)
    graph = helper.make_graph(
        node.expansion,
        "row",
        [helper.make_tensor_value_info(n, elem, (dims or {}).get(n, a.shape)) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", elem, out)],
    )
    imports = [helper.make_opsetid("", opset)]
    imports += [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in node.expansion if n.domain})]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_row_matches_numpy(opset: int, masked: bool, dtype: type) -> None:
    """Attention at opset 23 (onnxruntime runs float32 and float64), else the chain; a fully masked
    row (all -inf) is zero in both."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)))
    feeds = {"q": q, "k": k, "v": v}
    if masked:
        mask = np.where(rng.random((2, 1, 4, 6)) < 0.3, -np.inf, 0.0).astype(dtype)
        mask[0, 0, 1, :] = -np.inf
        feeds["m"] = mask
    node = _exported("onnxsat.FusedAttention", list(feeds), {"scale": 0.3, "dtype": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}, opset)
    model = _model(node, feeds, opset, (2, 3, 4, 5))
    onnx.checker.check_model(model, full_check=True)
    assert (_ops(model)["Attention"] == 1) == (opset >= 23), _ops(model)
    (got,) = run_ort(model, feeds)
    expected = attention_reference(q, k, v, feeds.get("m"), 0.3)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if masked:
        assert np.all(got[0, :, 1] == 0)


def _contrib_feeds(rng: np.random.Generator, batch: int, seq: int, dtype: type = np.float32) -> dict[str, np.ndarray]:
    """q, k, v [batch, 3, seq, 8] and a float mask [batch, 1, seq, seq]: causal, random holes, one
    fully masked query row (every entry -inf) and, in the last batch entry, left padding."""
    q, k, v = (rng.standard_normal((batch, 3, seq, 8)).astype(dtype) for _ in range(3))
    keep = np.tril(np.ones((seq, seq), bool))[None, None] & (rng.random((batch, 1, seq, seq)) < 0.8)
    keep[..., np.arange(seq), np.arange(seq)] = True
    keep[0, 0, 1, :] = False
    keep[-1, 0, :, :2] = False
    return {"q": q, "k": k, "v": v, "m": np.where(keep, 0.0, -np.inf).astype(dtype)}


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_row_with_contrib_ops(opset: int, dtype: type, masked: bool) -> None:
    """With contrib ops, MultiHeadAttention only where Attention cannot be written (opset 17) and
    onnxruntime runs it (float32, not float64: the chain there); exact against numpy, masks with
    causal rows, holes, left padding and a fully masked row (zero, as in the fused node), batch and
    sequence kept symbolic (the written model runs at two sizes)."""
    shapes: list[tuple[int | str, ...]] = [("b", 3, "t", 8)] * 3 + [("b", 1, "t", "t")]
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["q", "k", "v", "m"] if masked else ["q", "k", "v"]
    node = _exported("onnxsat.FusedAttention", names, {"scale": 0.3, "dtype": code}, opset, shapes=[(-1, 3, -2, 8)] * 3, contrib=True)
    rng = np.random.default_rng(4)
    model = None
    for batch, seq in ((2, 6), (3, 9)):
        feeds = {n: a for n, a in _contrib_feeds(rng, batch, seq, dtype).items() if n in names}
        if model is None:
            dims = {n: list(s) for n, s in zip(names, shapes, strict=False)}
            model = _model(node, feeds, max(opset, 17), ("b", 3, "t", 8), dims)
            onnx.checker.check_model(model, full_check=True)
        expected_mha = opset < 23 and dtype == np.float32
        assert (_ops(model)["MultiHeadAttention"] == 1) == expected_mha, _ops(model)
        assert (_ops(model)["Attention"] == 1) == (opset >= 23), _ops(model)
        (got,) = run_ort(model, feeds)
        expected = attention_reference(feeds["q"], feeds["k"], feeds["v"], feeds.get("m"), 0.3)
        bound = 1e-4 * float(np.max(np.abs(expected))) + 1e-6
        assert float(np.max(np.abs(got - expected))) <= bound
        if masked:
            assert np.all(got[0, :, 1] == 0)


def _packed(x: np.ndarray, heads: int) -> np.ndarray:
    """[B, H, T, D] -> [B, T, H * D]."""
    return np.ascontiguousarray(np.swapaxes(x, 1, 2).reshape(x.shape[0], x.shape[2], heads * x.shape[3]))


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("contrib", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_packed_attention_row_matches_numpy(opset: int, contrib: bool, dtype: type, masked: bool) -> None:
    """The heads-packed row: Attention with q_num_heads at opset 23; else with contrib ops
    MultiHeadAttention on the same 3-D tensors where onnxruntime runs it (float32); else the split,
    the chain and the merge. Exact against numpy on the split heads (causal rows, holes, left padding,
    a fully masked row that is zero), batch and sequence symbolic (two sizes through one model)."""
    heads, code = 3, helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["q", "k", "v", "m"] if masked else ["q", "k", "v"]
    shapes: list[tuple[int | str, ...]] = [("b", "t", 24)] * 3 + [("b", 1, "t", "t")]
    node = _exported(
        "onnxsat.FusedAttention3D", names, {"scale": 0.3, "heads": heads, "dtype": code}, opset,
        shapes=[(-1, -2, 24)] * 3 + [(-1, 1, -2, -2)], contrib=contrib,
    )  # fmt: skip
    rng = np.random.default_rng(7)
    model = None
    for batch, seq in ((2, 6), (3, 9)):
        split = _contrib_feeds(rng, batch, seq, dtype)
        feeds = {n: (_packed(split[n], heads) if n != "m" else split[n]) for n in names}
        if model is None:
            model = _model(node, feeds, max(opset, 17), ("b", "t", 24), {n: list(s) for n, s in zip(names, shapes, strict=False)})
            onnx.checker.check_model(model, full_check=True)
        ops = _ops(model)
        assert ops["Attention"] == (opset >= 23), ops
        assert ops["MultiHeadAttention"] == (opset < 23 and contrib and dtype == np.float32), ops
        (got,) = run_ort(model, feeds)
        expected = _packed(attention_reference(split["q"], split["k"], split["v"], split.get("m") if masked else None, 0.3), heads)
        bound = 1e-4 * float(np.max(np.abs(expected))) + 1e-6
        assert float(np.max(np.abs(got - expected))) <= bound
        if masked:
            assert np.all(got[0, 1] == 0)


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("contrib", [False, True])
def test_long_packed_attention_row(opset: int, contrib: bool) -> None:
    """Query x key lengths of at least LONG_SCORES, no mask: with contrib ops MultiHeadAttention
    (onnxruntime's flash attention), else the chain, not Attention; exact against numpy. With a mask,
    or on 4-D heads, the chain (MultiHeadAttention runs flash attention on 3-D k, v without a mask
    only); lengths not known keep the short rows' Attention."""
    heads, seq = 2, 1024
    assert seq * seq >= LONG_SCORES
    node = _exported(
        "onnxsat.FusedAttention3D", ["q", "k", "v"], {"scale": 0.3, "heads": heads, "dtype": F}, opset,
        shapes=[(1, seq, 8)] * 3, contrib=contrib,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    split = {n: rng.standard_normal((1, heads, seq, 4)).astype(np.float32) for n in "qkv"}
    feeds = {n: _packed(a, heads) for n, a in split.items()}
    model = _model(node, feeds, max(opset, 17), (1, seq, 8))
    onnx.checker.check_model(model, full_check=True)
    ops = _ops(model)
    assert ops["Attention"] == 0 and ops["MultiHeadAttention"] == contrib, ops
    (got,) = run_ort(model, feeds)
    expected = _packed(attention_reference(split["q"], split["k"], split["v"], None, 0.3), heads)
    assert float(np.max(np.abs(got - expected))) <= 1e-4 * float(np.max(np.abs(expected))) + 1e-6
    for names, shapes, kernels in (
        (["q", "k", "v", "m"], [(1, seq, 8)] * 3 + [(1, 1, seq, seq)], set()),
        (["q", "k", "v"], [(1, -1, 8)] * 3, {"Attention"}),
    ):
        other = _exported(
            "onnxsat.FusedAttention3D", names, {"scale": 0.3, "heads": heads, "dtype": F}, 23, shapes=shapes, contrib=contrib
        )
        assert {n.op_type for n in other.expansion} & {"Attention", "MultiHeadAttention"} == kernels
    four_d = _exported("onnxsat.FusedAttention", ["q", "k", "v"], {"scale": 0.3, "dtype": F}, 23, shapes=[(1, heads, seq, 4)] * 3, contrib=contrib)
    assert not {n.op_type for n in four_d.expansion} & {"Attention", "MultiHeadAttention"}


def test_mha_needs_known_equal_heads() -> None:
    """No head count known, or k with fewer heads than q: the chain, not MultiHeadAttention."""
    for shapes in ([(1, -1, 4, 8)] * 3, [(1, 4, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)]):
        node = _exported("onnxsat.FusedAttention", ["q", "k", "v"], {"scale": 0.3, "dtype": F}, 17, shapes=shapes, contrib=True)
        assert not any(n.op_type == "MultiHeadAttention" for n in node.expansion)


def _rope_caches(rng: np.random.Generator, seq: int, dim: int, equal_halves: bool = True) -> tuple[np.ndarray, np.ndarray]:
    freqs = np.outer(np.arange(seq), rng.uniform(0.01, 1.0, dim // 2))
    emb = np.concatenate([freqs, freqs if equal_halves else freqs * 1.5], -1)[None, None]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def rotary_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


@pytest.mark.parametrize("opset", [17, 18, 23])
@pytest.mark.parametrize("equal_halves", [True, False])
def test_rotary_row_matches_numpy(opset: int, equal_halves: bool) -> None:
    """The rotary row: RotaryEmbedding at opset 23 where the caches' halves
    are equal, else the chain (Split's two forms at opsets 17 and 18)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 5, 8)).astype(np.float32)
    cos, sin = _rope_caches(rng, 5, 8, equal_halves)
    node = _exported("onnxsat.FusedRotary", ["x", "cos", "sin"], {"dtype": F}, opset, {1: cos, 2: sin})
    feeds = {"x": x, "cos": cos, "sin": sin}
    model = _model(node, feeds, opset, x.shape)
    onnx.checker.check_model(model, full_check=True)
    assert (_ops(model)["RotaryEmbedding"] == 1) == (opset >= 23 and equal_halves), _ops(model)
    (got,) = run_ort(model, {n: a for n, a in feeds.items() if n in {i.name for i in model.graph.input}})
    np.testing.assert_allclose(got, rotary_reference(x, cos, sin), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 23])
def test_rotary_row_with_contrib_ops(opset: int) -> None:
    """With contrib ops, com.microsoft RotaryEmbedding (position offset 0) where the standard op
    cannot be written, the standard one where it can."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 5, 8)).astype(np.float32)
    cos, sin = _rope_caches(rng, 5, 8)
    node = _exported("onnxsat.FusedRotary", ["x", "cos", "sin"], {"dtype": F}, opset, {1: cos, 2: sin}, contrib=True)
    feeds = {"x": x, "cos": cos, "sin": sin}
    model = _model(node, feeds, opset, x.shape)
    onnx.checker.check_model(model, full_check=True)
    contrib = [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
    assert contrib == ([] if opset >= 23 else ["RotaryEmbedding"]), _ops(model)
    (got,) = run_ort(model, feeds)
    np.testing.assert_allclose(got, rotary_reference(x, cos, sin), rtol=1e-5, atol=1e-6)


def test_contrib_probes_find_the_kernels_onnxruntime_has() -> None:
    """onnxruntime 1.32's CPU MultiHeadAttention (with and without an attention bias) and contrib
    RotaryEmbedding run float32 and float16, not float64."""
    without_mask = type(MHA_PROBE)(MHA_PROBE.op_type, MHA_PROBE.domain, 17, MHA_PROBE.inputs[:3], MHA_PROBE.attrs)
    for probe in (MHA_PROBE, without_mask, MHA_3D_PROBE, CONTRIB_ROTARY_PROBE):
        assert [ort_runs(probe, t) for t in (F, D, F16)] == [True, False, True], probe


def test_probes_find_the_kernels_onnxruntime_has() -> None:
    """onnxruntime 1.32's CPU provider runs Attention (with a mask of q's type) for float32, float64
    and float16, RotaryEmbedding for float32 and float16 but not float64 (a float64 rotary is
    written as its chain); an op at an opset that lacks it is found not to run."""
    assert [ort_runs(ATTENTION_PROBE, t) for t in (F, D, F16)] == [True, True, True]
    assert [ort_runs(ATTENTION_3D_PROBE, t) for t in (F, D, F16)] == [True, True, True]
    assert [ort_runs(ROTARY_PROBE, t) for t in (F, D, F16)] == [True, False, True]
    assert not ort_runs(type(ROTARY_PROBE)("RotaryEmbedding", "", 22, ROTARY_PROBE.inputs), F)  # not at opset 22


# ---------------------------------------------------------------- SDPA blocks as exporters write them
def _sdpa_model(
    mode: str, opset: int = 17, heads: int = 4, kv_heads: int = 4, expand_batch: int = -1
) -> onnx.ModelProto:
    """q, k, v [1, heads, 8, 16] inputs (k, v repeated from kv_heads as Llama's repeat_kv does),
    torch's SDPA decomposition with the given mask form: none, a boolean mask made float (mask:
    masked entries -inf, as TorchScript writes it; min-mask: float32's lowest, as dynamo does),
    keys-mask: one over the keys only, [1, 1, 1, 8]; keys-float-mask: a float [1, 1, 1, 8] input; or a [1, 1, 1, 8] boolean mask expanded as TorchScript writes ``m.expand(expand_batch, -1, 8, 8)``
    (ts-mask: the target is ``Where(Equal(c, -1 * ones), ones, c)``, which only the import evaluates)."""
    b, t, d = 1, 8, 16
    consts = (("s", d**-0.25), ("zero", 0.0), ("ninf", -np.inf), ("fmin", np.finfo(np.float32).min))
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in consts]
    nodes = []
    k, v = "k", "v"
    if kv_heads != heads:
        inits += [
            numpy_helper.from_array(np.array([2], np.int64), "ax2"),
            numpy_helper.from_array(np.array([b, kv_heads, heads // kv_heads, t, d], np.int64), "e5"),
            numpy_helper.from_array(np.array([b, heads, t, d], np.int64), "r4"),
        ]
        for name in ("k", "v"):
            nodes += [
                helper.make_node("Unsqueeze", [name, "ax2"], [f"{name}5"]),
                helper.make_node("Expand", [f"{name}5", "e5"], [f"{name}e"]),
                helper.make_node("Reshape", [f"{name}e", "r4"], [f"{name}r"]),
            ]
        k, v = "kr", "vr"
    nodes += [
        helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["q", "s"], ["qs"]),
        helper.make_node("Mul", ["kt", "s"], ["ks"]),
        helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
    ]
    inputs = [helper.make_tensor_value_info("q", F, [b, heads, t, d])]
    inputs += [helper.make_tensor_value_info(n, F, [b, kv_heads, t, d]) for n in ("k", "v")]
    logits = "scores"
    if mode in ("mask", "min-mask", "keys-mask"):
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [b, 1, 1 if mode == "keys-mask" else t, t]))
        fill = "ninf" if mode == "mask" else "fmin"
        nodes += [helper.make_node("Where", ["keep", "zero", fill], ["bias"]), helper.make_node("Add", ["scores", "bias"], ["masked"])]
        logits = "masked"
    if mode == "keys-float-mask":  # a float mask input over the keys (it may hold finfo.min)
        inputs.append(helper.make_tensor_value_info("bias", F, [b, 1, 1, t]))
        nodes.append(helper.make_node("Add", ["scores", "bias"], ["masked"]))
        logits = "masked"
    if mode == "ts-mask":
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [b, 1, 1, t]))
        inits += [
            numpy_helper.from_array(np.array([expand_batch, -1, t, t], np.int64), "c"),
            numpy_helper.from_array(np.array([4], np.int64), "n4"),
            numpy_helper.from_array(np.array(-1, np.int64), "minus"),
        ]
        one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
        nodes += [
            helper.make_node("ConstantOfShape", ["n4"], ["ones"], value=one),
            helper.make_node("Mul", ["ones", "minus"], ["neg"]),
            helper.make_node("Equal", ["c", "neg"], ["eq"]),
            helper.make_node("Where", ["eq", "ones", "c"], ["target"]),
            helper.make_node("Expand", ["keep", "target"], ["keepx"]),
            helper.make_node("Where", ["keepx", "zero", "ninf"], ["bias"]),
            helper.make_node("Add", ["scores", "bias"], ["masked"]),
        ]
        logits = "masked"
    nodes += [
        helper.make_node("Softmax", [logits], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["pz"]),
        helper.make_node("MatMul", ["pz", v], ["y"]),
    ]
    out_batch = max(b, expand_batch) if mode == "ts-mask" else b
    graph = helper.make_graph(nodes, "sdpa", inputs, [helper.make_tensor_value_info("y", F, [out_batch, heads, t, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TensorProto.BOOL:
            keep = rng.random(shape) < 0.7
            keep[..., min(2, shape[-2] - 1), :] = False  # a fully masked query row
            feeds[vi.name] = keep
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _optimize(model: onnx.ModelProto, **options: Any) -> onnx.ModelProto:
    optimized, report = onnxsat.optimize(model, Options(**options))
    assert report.verification.status == "passed", report.verification
    onnx.checker.check_model(optimized, full_check=True)
    feeds = _feeds(model)
    why = outputs_match(run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-5)
    assert why is None, why
    return optimized


@pytest.mark.parametrize("mode", ["none", "mask", "min-mask"])
def test_sdpa_becomes_one_attention(mode: str) -> None:
    ops = _ops(_optimize(_sdpa_model(mode)))
    assert ops["Attention"] == 1, ops
    for gone in ("Softmax", "MatMul", "IsNaN", "Transpose", "Mul"):
        assert ops[gone] == 0, (gone, ops)


def test_keys_only_mask_is_expanded_to_the_queries() -> None:
    """A [1, 1, 1, S] mask over 8 queries (every row fully masked where a key row is): one Attention
    whose mask is expanded to [1, 1, 8, S], matching the chain on onnxruntime."""
    ops = _ops(_optimize(_sdpa_model("keys-mask")))
    assert ops["Attention"] == 1 and ops["Expand"] == 1 and ops["Softmax"] == 0, ops


def test_keys_only_float_mask_is_not_fused() -> None:
    """A float [1, 1, 1, S] mask input may hold finfo.min (onnxruntime would zero such a row, the
    softmax makes it uniform): the chain stays, and matches, also on a row of finfo.min."""
    model = _sdpa_model("keys-float-mask")
    optimized = _optimize(model)
    ops = _ops(optimized)
    assert ops["Attention"] == 0 and ops["Softmax"] == 1, ops
    feeds = _feeds(model)
    feeds["bias"][...] = np.finfo(np.float32).min
    why = outputs_match(run_ort(optimized, feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-5)
    assert why is None, why


def test_grouped_query_attention_takes_the_repeated_heads() -> None:
    """k and v repeated from 2 heads to 4 (Unsqueeze, Expand, Reshape): one Attention over them."""
    ops = _ops(_optimize(_sdpa_model("mask", kv_heads=2)))
    assert ops["Attention"] == 1 and ops["Softmax"] == 0, ops


def test_torchscript_expanded_mask_fuses() -> None:
    """TorchScript's ``mask.expand(-1, ...)`` target is computed by Equal and Where on constants:
    the import evaluates it, so the mask's shape is known and the fusion fires."""
    ops = _ops(_optimize(_sdpa_model("ts-mask")))
    assert ops["Attention"] == 1 and ops["Softmax"] == 0 and ops["Equal"] == 0, ops


def test_torchscript_mask_that_grows_the_scores_is_not_fused() -> None:
    """The same form expanding the mask to batch 2 over batch-1 scores grows them: Attention (whose
    output has q's batch) must not take it; the chain stays and still matches."""
    model = _sdpa_model("ts-mask", expand_batch=2)
    optimized = _optimize(model)
    ops = _ops(optimized)
    assert ops["Attention"] == 0 and ops["Softmax"] == 1, ops
    dims = [d.dim_value for d in optimized.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 4, 8, 16]


def test_keep_opset_writes_the_chain() -> None:
    ops = _ops(_optimize(_sdpa_model("mask"), upgrade_opset=None))
    assert ops["Attention"] == 0 and ops["Softmax"] == 1, ops


@pytest.mark.parametrize("upgrade", [None, 23])
def test_contrib_ops_write_mha_only_where_attention_cannot_be(upgrade: int | None) -> None:
    """With contrib ops: MultiHeadAttention at the model's opset 17 (--keep-opset), Attention where
    the model is converted to opset 23 (MultiHeadAttention is slower there); the min-mask's fully
    masked row matches the chain (_optimize compares on onnxruntime)."""
    ops = _ops(_optimize(_sdpa_model("min-mask"), upgrade_opset=upgrade, allow_contrib_ops=True))
    assert ops["MultiHeadAttention"] == (upgrade is None) and ops["Attention"] == (upgrade is not None), ops
    assert ops["Softmax"] == 0, ops


# ---------------------------------------------------------------- the committed transformer exports
REALMODELS = Path(__file__).parent / "data" / "realmodels"

CONTRIB_EXPORTS = ("gpt2-dynamo-dynamic", "llama-decode-ts-static", "qwen2-decode-dynamo-static")
"""Exports checked with contrib ops at their own opset (MultiHeadAttention): dynamic batch and
sequence with a causal finfo.min mask, a keys-only mask expanded over grouped queries, a KV cache.
With standard ops, test_realmodels checks one Attention per layer on the same exports (its
``FUSED_ATTENTION``) from the run it checks for exactness."""


@pytest.mark.slow
@pytest.mark.parametrize("name", CONTRIB_EXPORTS)
def test_transformer_exports_get_one_mha_per_layer_with_contrib_ops(name: str) -> None:
    """One MultiHeadAttention per layer at the model's own opset, exact against the original with
    and without left padding, symbolic dims kept."""
    record = json.loads((REALMODELS / "INDEX.json").read_text())[name]
    original = onnx.load(REALMODELS / record["file"])
    optimized, report = onnxsat.optimize(original, Options(allow_contrib_ops=True, upgrade_opset=None))
    assert report.verification.status == "passed", report.verification
    ops = _ops(optimized)
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0, ops
    assert_exact_with_left_padding(original, optimized, record["inputs"])


def _with_rotary_tables(model: onnx.ModelProto) -> int:
    """Give the export the rotary tables a trained model has, cos and sin of concat(f, f) for the
    frequencies 10000^(-2i/d) (the corpus redraws every float initializer, the tables included, so
    their halves differ and RotaryEmbedding cannot hold them); returns the tables replaced."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    replaced: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "Mul":
            continue
        for data, table in (node.input, node.input[::-1]):
            if table in inits and list(inits[table].dims[:2]) == [1, 1] and len(inits[table].dims) == 4:
                seq, dim = inits[table].dims[2:]
                freqs = np.outer(np.arange(seq), 10000.0 ** (-np.arange(0, dim, 2) / dim))
                angles = np.concatenate([freqs, freqs], -1)[None, None]
                wave = np.sin if producers.get(data) == "Concat" else np.cos  # rotate_half(x) * sin
                inits[table].CopyFrom(numpy_helper.from_array(wave(angles).astype(np.float32), table))
                replaced.add(table)
    return len(replaced)


@pytest.mark.parametrize("name", ["qwen2-dynamo-static", "llama-decode-ts-static"])
def test_rotary_chains_become_rotary_embedding(name: str) -> None:
    """One RotaryEmbedding for q and one for k per layer (2 layers), exact against the original with
    and without left padding: the Qwen2-style dynamo export given a trained model's rotary tables,
    and the TorchScript decode step as exported (its tables are computed as cos and sin of
    concat(f, f) at the static position, so they fold to constants with equal halves)."""
    record = json.loads((REALMODELS / "INDEX.json").read_text())[name]
    original = onnx.load(REALMODELS / record["file"])
    if name == "qwen2-dynamo-static":
        assert _with_rotary_tables(original) == 4  # cos and sin of each layer
    optimized, report = onnxsat.optimize(original)
    assert report.verification.status == "passed", report.verification
    ops = _ops(optimized)
    assert ops["RotaryEmbedding"] == 4 and ops["Neg"] == 0 and ops["Slice"] == 0, ops
    assert_exact_with_left_padding(original, optimized, record["inputs"])
