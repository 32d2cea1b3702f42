"""Guards that keep sound rules from doing harm: reassociating constant folds (and distributivity,
checked here on mul-factor) stay off float16 and
bfloat16, and multi-pattern merges never merge an op with itself after weight tying."""

from __future__ import annotations

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
    "mul-factor": lambda x, a, b: (L.add(L.mul(x, a), L.mul(x, b)), L.mul(x, L.add(a, b))),
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
OPS = ("matmul", "gemm", "conv")
MERGED_AXIS = {"matmul": 1, "gemm": 1, "conv": 0}


def _siblings(op: str, first: int, second: int) -> tuple[L.Tensor, L.Tensor]:
    """Two ops reading the same input, with the weights imported as tensor_ref(first), tensor_ref(second)."""
    x, w_a, w_b = L.Tensor.input(f"x-{op}"), L.tensor_ref(first), L.tensor_ref(second)
    if op == "matmul":
        return L.matmul(x, w_a), L.matmul(x, w_b)
    if op == "gemm":
        return (
            L.gemm(x, w_a, L.Tensor.none(), 1.0, 1.0, 0, 0),
            L.gemm(x, w_b, L.Tensor.none(), 1.0, 1.0, 0, 0),
        )
    unit, pads = L.ivec([1, 1]), L.ivec([0, 0, 0, 0])
    return (
        L.conv(x, w_a, L.Tensor.none(), unit, pads, unit, 1),
        L.conv(x, w_b, L.Tensor.none(), unit, pads, unit, 1),
    )


def test_parallel_ops_merge_but_not_with_themselves_after_weight_tying() -> None:
    """Per op: a pair over two weights merges into [w | w2]; a pair over two names of one tied weight
    is one op, and [w | w] is never built (one e-graph, one round, all ops)."""
    terms, shapes, refs, merged = [], {}, [], {}
    for k, op in enumerate(OPS):
        w, w2 = L.Tensor.weight(f"w-{op}"), L.Tensor.weight(f"w2-{op}")
        shapes |= {f"x-{op}": (1, 4, 5, 5) if op == "conv" else (2, 4), f"x2-{op}": (2, 4)}
        shapes |= {name: (3, 4, 1, 1) if op == "conv" else (4, 4) for name in (f"w-{op}", f"w2-{op}")}
        terms += [*_siblings(op, 4 * k, 4 * k + 1), *_siblings(op, 4 * k + 2, 4 * k + 3)]
        refs += [(4 * k, w), (4 * k + 1, w2), (4 * k + 2, w), (4 * k + 3, w)]  # refs 2, 3: one tied weight
        merged |= {(op, "apart"): (w, w2), (op, "tied"): (w, w)}
    consts = tuple(name for name in shapes if name.startswith("w"))
    with _egraph(terms, shapes, consts, {}) as egraph:
        egraph.register(*_bind(refs))
        _run(egraph, 1)
        built = {
            key
            for key, (a, b) in merged.items()
            if _exists(egraph, L.concat(L.tlist([a, b]), MERGED_AXIS[key[0]]))
        }
    assert built == {(op, "apart") for op in OPS}


def _bind(refs: list[tuple[int, L.Tensor]]) -> list[object]:
    """tensor_ref(i) names its weight, as the importer binds them (tied names share one leaf)."""
    return [
        a
        for i, w in refs
        for a in (union(L.tensor_ref(i)).with_(w), set_(L.dtype(L.tensor_ref(i))).to(i64(F)))
    ]
