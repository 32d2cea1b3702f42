"""Guards that keep sound rules from doing harm: reassociating constant folds stay off float16 and
bfloat16, and multi-pattern merges never merge an op with itself after weight tying."""

from __future__ import annotations

import pytest
from egglog import EGraph, eq, i64, set_, union
from onnx import TensorProto

from onnxsat.egraph import lang as L

from .prove import _egraph, _run

F, F16, BF16, D, I64 = (
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.DOUBLE,
    TensorProto.INT64,
)
X = L.Tensor.input("x")
FOLDS = {
    "add-const-assoc": lambda x, a, b: (L.add(L.add(x, a), b), L.add(x, L.add(a, b))),
    "mul-const-assoc": lambda x, a, b: (L.mul(L.mul(x, a), b), L.mul(x, L.mul(a, b))),
    "sub-sub-const": lambda x, a, b: (L.sub(L.sub(x, a), b), L.sub(x, L.add(a, b))),
    "div-div-const": lambda x, a, b: (L.div(L.div(x, a), b), L.div(x, L.mul(a, b))),
    "mul-add-const-distribute": lambda x, a, b: (L.mul(L.add(x, a), b), L.add(L.mul(x, b), L.mul(a, b))),
}
FOLDS_ON = {F: set(FOLDS), D: set(FOLDS), I64: set(FOLDS) - {"div-div-const"}, F16: set(), BF16: set()}
"""Per input type, the folds that must fire (integer Add/Mul/Sub wrap exactly; integer Div truncates;
float16/bfloat16 round the folded form differently)."""


def test_constant_folds_reassociate_only_where_exact_enough() -> None:
    pairs, shapes, dtypes = {}, {}, {}
    for dtype in FOLDS_ON:
        x, a, b = L.Tensor.input(f"x{dtype}"), L.Tensor.weight(f"a{dtype}"), L.Tensor.weight(f"b{dtype}")
        shapes |= {f"x{dtype}": (2, 4), f"a{dtype}": (4,), f"b{dtype}": (4,)}
        dtypes |= {f"x{dtype}": dtype, f"a{dtype}": dtype, f"b{dtype}": dtype}
        pairs |= {(rule, dtype): fold(x, a, b) for rule, fold in FOLDS.items()}
    consts = tuple(name for name in shapes if not name.startswith("x"))
    with _egraph([term for pair in pairs.values() for term in pair], shapes, consts, dtypes) as egraph:
        _run(egraph, 1)
        folded = {key for key, (start, goal) in pairs.items() if _equal(egraph, start, goal)}
    assert folded == {(rule, dtype) for dtype, rules in FOLDS_ON.items() for rule in rules}


def _equal(egraph: EGraph, start: L.Tensor, goal: L.Tensor) -> bool:
    return _exists(egraph, eq(start).to(goal))


def _exists(egraph: EGraph, fact: object) -> bool:
    """Whether ``fact`` holds (a term: it was built) in the e-graph."""
    try:
        egraph.check(fact)  # type: ignore[arg-type]
        return True
    except Exception:  # egglog raises when the check fails
        return False


# ---------------------------------------------------------------- multi-pattern merges and tying
W, W2 = L.Tensor.weight("w"), L.Tensor.weight("w2")


def _siblings(op: str) -> tuple[L.Tensor, L.Tensor]:
    """Two ops reading x, with weights imported as tensor_ref(0) and tensor_ref(1)."""
    w_a, w_b = L.tensor_ref(0), L.tensor_ref(1)
    if op == "matmul":
        return L.matmul(X, w_a), L.matmul(X, w_b)
    if op == "gemm":
        return (L.gemm(X, w_a, L.Tensor.none(), 1.0, 1.0, 0, 0), L.gemm(X, w_b, L.Tensor.none(), 1.0, 1.0, 0, 0))
    conv = {"strides": L.ivec([1, 1]), "pads": L.ivec([0, 0, 0, 0]), "dil": L.ivec([1, 1])}
    x4 = L.Tensor.input("x4")
    return tuple(  # type: ignore[return-value]
        L.conv(x4, w, L.Tensor.none(), conv["strides"], conv["pads"], conv["dil"], 1) for w in (w_a, w_b)
    )


MERGED = {
    "matmul": lambda w_a, w_b: L.concat(L.tlist([w_a, w_b]), 1),
    "gemm": lambda w_a, w_b: L.concat(L.tlist([w_a, w_b]), 1),
    "conv": lambda w_a, w_b: L.concat(L.tlist([w_a, w_b]), 0),
}


def _merges(op: str, tied: bool) -> bool:
    """Whether the multi rules build the merged weight [w | w2] (or [w | w] when ``tied``)."""
    second = W if tied else W2
    shapes = {"x": (2, 4), "x4": (1, 4, 5, 5), "w": (4, 4) if op != "conv" else (3, 4, 1, 1)}
    shapes["w2"] = shapes["w"]
    t1, t2 = _siblings(op)
    with _egraph([t1, t2], shapes, ("w", "w2"), {}) as egraph:
        _bind_refs(egraph, W, second)
        _run(egraph, 2)
        return _exists(egraph, MERGED[op](W, second))


def _bind_refs(egraph: EGraph, first: L.Tensor, second: L.Tensor) -> None:
    """tensor_ref(0) and tensor_ref(1) name the two weights, as the importer binds them."""
    actions = [union(L.tensor_ref(0)).with_(first), union(L.tensor_ref(1)).with_(second)]
    for ref in (L.tensor_ref(0), L.tensor_ref(1)):
        actions.append(set_(L.dtype(ref)).to(i64(F)))
    egraph.register(*actions)


@pytest.mark.parametrize("op", list(MERGED))
def test_parallel_ops_merge_but_not_with_themselves_after_weight_tying(op: str) -> None:
    assert _merges(op, tied=False)
    assert not _merges(op, tied=True)
