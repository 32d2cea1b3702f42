"""Pinned extraction (extract/pinning.py, onnxsat/forced.py) and the multi-pattern merges of the examples.

The examples are saturated once per module at default budgets: the Q/K/V MatMuls of the
transformer block and the parallel convs of the inception block must be merged in the e-graph,
and extraction with a merge pinned must give a verified model that really uses it.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import onnx
import pytest

from onnxsat.egraph.graph_types import ENode, Ref, SerializedEGraph
from onnxsat.extract.pinning import find_merges, pin, reachable
from onnxsat.forced import Saturated

from .models import EXAMPLES


def _toy() -> SerializedEGraph:
    """t1 = x@w1 or Split part 0 of x@concat(w1, w2); t2 likewise part 1; an unreachable merge."""
    x, w1, w2, wc, lst, m, sizes = (Ref(n) for n in ("x", "w1", "w2", "wc", "lst", "m", "sizes"))
    return SerializedEGraph(
        classes={
            "x": [ENode("Tensor.input", ("x",))],
            "w1": [ENode("Tensor.weight", ("w1",))],
            "w2": [ENode("Tensor.weight", ("w2",))],
            "lst": [ENode("TList.cons", (w1, Ref("tail")))],
            "tail": [ENode("TList.cons", (w2, Ref("nil")))],
            "nil": [ENode("TList.nil", ())],
            "wc": [ENode("concat", (lst, 1))],
            "sizes": [ENode("Tensor.ints", ((3, 6), 1))],
            "m": [ENode("matmul", (x, wc))],
            "t1": [ENode("matmul", (x, w1)), ENode("split", (m, sizes, 1, 0, 0))],
            "t2": [ENode("matmul", (x, w2)), ENode("split", (m, sizes, 1, 0, 1))],
            "out": [ENode("add", (Ref("t1"), Ref("t2")))],
            "dead": [ENode("split", (Ref("dead_m"), sizes, 1, 0, 0)), ENode("split", (Ref("dead_m"), sizes, 1, 0, 1))],
            "dead_m": [ENode("matmul", (x, wc))],
        },
        roots={0: "out"},
    )


def test_find_merges_lists_reachable_merges_with_their_parts() -> None:
    eg = _toy()
    assert "dead" not in reachable(eg, ["out"]) and {"t1", "t2", "m", "wc"} <= reachable(eg, ["out"])
    (merge,) = find_merges(eg, ["out"])
    assert merge.merged_class == "m" and merge.op == "matmul"
    assert [eclass for eclass, _ in merge.parts] == ["t1", "t2"]
    assert [node.args[-1] for _, node in merge.parts] == [0, 1]
    # A MatMul whose weight is no Concat is not a merge.
    eg.classes["wc"] = [ENode("Tensor.weight", ("wc",))]
    assert find_merges(eg, ["out"]) == []


def test_pin_keeps_only_the_chosen_nodes_and_leaves_the_original_alone() -> None:
    eg = _toy()
    (merge,) = find_merges(eg, ["out"])
    pinned = pin(eg, merge.choices())
    assert [n.op for n in pinned.classes["t1"]] == ["split"] and [n.op for n in pinned.classes["t2"]] == ["split"]
    assert len(eg.classes["t1"]) == 2, "the input e-graph is not modified"
    with pytest.raises(ValueError, match="no e-node"):
        pin(eg, {"t1": ENode("relu", (Ref("x"),))})


# ------------------------------------------------------------------ the examples, saturated once


@pytest.fixture(scope="module")
def transformer() -> Saturated:
    return Saturated.of(onnx.load(str(EXAMPLES / "transformer_block.onnx")))


@pytest.fixture(scope="module")
def inception() -> Saturated:
    return Saturated.of(onnx.load(str(EXAMPLES / "inception_block.onnx")))


def _siblings(sat: Saturated, op_type: str) -> set[str]:
    """E-classes of the ``op_type`` nodes that read the input most of them share (Q/K/V, branches)."""
    nodes = [n for n in sat.model.graph.node if n.op_type == op_type]
    shared, _ = Counter(n.input[0] for n in nodes).most_common(1)[0]
    index = {name: i for i, name in enumerate(sat.program.names)}
    by_origin = {origin: eclass for eclass, origin in sat.egraph.origins.items()}
    return {by_origin[index[n.output[0]]] for n in nodes if n.input[0] == shared}


def _merged_pairs(sat: Saturated, op: str) -> set[frozenset[str]]:
    return {frozenset(e for e, _ in m.parts) for m in sat.merges() if m.op == op}


def test_qkv_matmuls_are_merged_in_the_egraph(transformer: Saturated) -> None:
    qkv = _siblings(transformer, "MatMul")
    assert len(qkv) == 3
    # k_multi = 1 and the ordering guard (imported weights only) give every pair, no triple.
    assert {frozenset(p) for p in combinations(qkv, 2)} <= _merged_pairs(transformer, "matmul")


def test_parallel_convs_of_the_inception_block_are_merged_in_the_egraph(inception: Saturated) -> None:
    branches = _siblings(inception, "Conv")  # 1x1, 1x1 reduce, 3x3: the pool branch reads the MaxPool
    assert len(branches) == 3
    # The two 1x1 convs (merge-parallel-conv) and each 1x1 enlarged to 3x3 with the 3x3 conv.
    assert {frozenset(p) for p in combinations(branches, 2)} <= _merged_pairs(inception, "conv")


@pytest.mark.parametrize(("example", "op_type"), [("transformer", "MatMul"), ("inception", "Conv")])
def test_a_pinned_merge_is_exported_and_verifies(example: str, op_type: str, request: pytest.FixtureRequest) -> None:
    sat: Saturated = request.getfixturevalue(example)
    free, free_graph = sat.extract()
    merge = sat.merges()[0]
    merged, graph = sat.extract(merge.choices())  # raises unless it matches the original on onnxruntime
    assert merge.merged_class in {eclass for eclass, _ in graph.nodes}
    before, after = Counter(n.op_type for n in free.graph.node), Counter(n.op_type for n in merged.graph.node)
    assert after["Split"] == before["Split"] + 1
    assert after[op_type] == before[op_type] - 1


# ------------------------------------------------------------------ the calibrated cost model and the merges

PROFILE = EXAMPLES.parent / "profiles" / "ort-cpu-dev-2core.json"

MEASURED: dict[frozenset[str], tuple[float, float]] = {
    frozenset({"attention.self.query.weight_t", "attention.self.key.weight_t"}): (0.908, 1.045),
    frozenset({"attention.self.query.weight_t", "attention.self.value.weight_t"}): (0.953, 1.047),
    frozenset({"attention.self.key.weight_t", "attention.self.value.weight_t"}): (0.959, 1.049),
    frozenset({"branch1x1.weight", "branch3x3_direct.weight"}): (0.985, 1.017),
    frozenset({"branch3x3_reduce.weight", "branch3x3_direct.weight"}): (0.964, 0.998),
    frozenset({"branch1x1.weight", "branch3x3_reduce.weight"}): (0.976, 1.016),
}
"""95% interval of the speed ratio merged / unmerged (above 1: the merge is faster), measured by
benchmarks/rule_latency.py (benchmarks/results/rule_latency.md, forced merges, 100 rounds, load ~10),
keyed by the merged siblings' weights."""


@pytest.mark.parametrize("example", ["transformer", "inception"])
def test_calibrated_cost_model_follows_the_measured_merges(example: str, request: pytest.FixtureRequest) -> None:
    """A merge measured slower (interval below 1) is priced above the unmerged program and exact
    extraction under the calibrated profile does not choose it; one measured faster (interval
    above 1) is priced below and chosen. Ties constrain nothing. Greedy-DAG never chooses a merge,
    so ILP is the extractor that could go wrong here."""
    from onnxsat.extract.ilp import extract_ilp
    from onnxsat.extract.profile import load_profile

    sat: Saturated = request.getfixturevalue(example)
    calibrated = load_profile(PROFILE)
    chosen = {eclass for eclass, _ in extract_ilp(sat.egraph, calibrated, sat.roots, time_limit=10.0).nodes}
    unmerged = sat.extract(cost=calibrated)[1].cost
    merges = {frozenset(sat.merged_weights(m)): m for m in sat.merges()}
    assert set(merges) <= set(MEASURED), "a merge nobody measured: rerun benchmarks/rule_latency.py"
    judged = 0
    for weights, merge in merges.items():
        low, high = MEASURED[weights]
        if low <= 1.0 <= high:
            continue
        judged += 1
        merged = sat.extract(merge.choices(), cost=calibrated)[1].cost
        faster = low > 1.0
        assert (merged < unmerged) == faster, (sat.label(merge), merged, unmerged)
        assert (merge.merged_class in chosen) == faster, sat.label(merge)
    if example == "inception":
        assert judged >= 1, "the measured-slower enlarge merge must be judged"
