"""Saturation by regions (``onnxsat.by_regions``, ``egraph.regions``): cuts, keys, replay, windows, CSE.

The models are small residual stacks (LayerNorm -> MatMul -> Relu -> MatMul -> Add per layer, five
nodes) cut into one region per layer, so each case runs in seconds; every optimized model is
verified against the original on onnxruntime by ``optimize`` itself.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.by_regions import price
from onnxsat.egraph.regions import (
    cut_widths,
    eliminate_common_subexpressions,
    part_key,
    part_model,
    partition,
    value_types,
)

from .helpers_onnx import make_model, vi

HIDDEN = 72
"""Above ``SMALL_CONSTANT``: gamma and beta are keyed by role, not value."""
LAYER = 5
"""Nodes per layer of ``residual_stack``."""


def residual_stack(gammas: list[np.ndarray], seed: int = 0) -> onnx.ModelProto:
    """x -> per gamma: h + MatMul(Relu(MatMul(LayerNorm(h, gamma, beta), W1)), W2) -> y."""
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    h = "x"
    for k, gamma in enumerate(gammas):
        tensors = {
            f"gamma{k}": gamma.astype(np.float32),
            f"beta{k}": rng.normal(0, 0.1, HIDDEN).astype(np.float32),
            f"w1_{k}": rng.normal(0, 0.3, (HIDDEN, 2 * HIDDEN)).astype(np.float32),
            f"w2_{k}": rng.normal(0, 0.3, (2 * HIDDEN, HIDDEN)).astype(np.float32),
        }
        weights += [numpy_helper.from_array(v, n) for n, v in tensors.items()]
        out = "y" if k == len(gammas) - 1 else f"h{k + 1}"
        nodes += [
            helper.make_node("LayerNormalization", [h, f"gamma{k}", f"beta{k}"], [f"n{k}"], axis=-1),
            helper.make_node("MatMul", [f"n{k}", f"w1_{k}"], [f"a{k}"]),
            helper.make_node("Relu", [f"a{k}"], [f"r{k}"]),
            helper.make_node("MatMul", [f"r{k}", f"w2_{k}"], [f"b{k}"]),
            helper.make_node("Add", [h, f"b{k}"], [out]),
        ]
        h = out
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, HIDDEN])],
        initializer=weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def random_gammas(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(1, 0.2, HIDDEN) for _ in range(count)]


def by_regions(size: int = LAYER, hops: int = 3) -> onnxsat.Options:
    return onnxsat.Options(region_nodes=1, region_size=size, region_window_hops=hops)


WHOLE = onnxsat.Options(region_nodes=0)


def test_partition_cuts_between_layers_where_one_tensor_crosses() -> None:
    model = residual_stack(random_gammas(4))
    widths = cut_widths(model)
    assert [widths[p] for p in range(0, 21, LAYER)] == [0, 1, 1, 1, 1]  # the last: the graph output
    assert all(w >= 2 for p, w in enumerate(widths) if p % LAYER and p > LAYER)  # x is a graph input
    assert partition(model, LAYER) == [range(k, k + LAYER) for k in range(0, 20, LAYER)]
    assert partition(model, 100) == [range(0, 20)]


def test_keys_equal_for_twin_layers_and_differ_for_a_gamma_of_ones() -> None:
    gammas = random_gammas(4)
    gammas[2] = np.ones(HIDDEN)
    gammas[3] = np.ones(HIDDEN)
    model = residual_stack(gammas)
    types = value_types(model)
    keys = [part_key(part_model(model, r, types)) for r in partition(model, LAYER)]
    assert keys[0][0] == keys[1][0]
    assert keys[1][0] != keys[2][0]  # gamma all ones: a rule may read it, so never replayed from random
    assert keys[2][0] == keys[3][0]
    assert len(keys[0][1]) == len(keys[3][1])  # the name lists correspond position by position


def test_region_wise_equals_whole_graph_on_two_layers() -> None:
    model = residual_stack(random_gammas(2))
    whole, whole_report = onnxsat.optimize(model, WHOLE)
    regions, report = onnxsat.optimize(model, by_regions())
    assert report.regions is not None and report.regions.regions == 2
    assert whole_report.regions is None
    assert report.verification.status == "passed"
    assert len(regions.graph.node) <= len(whole.graph.node)
    with onnxsat.Session(model, WHOLE) as session:
        assert price(session, regions) <= price(session, whole) * (1 + 1e-9)
    assert set(report.stage_seconds) >= {"regions-partition", "regions-saturate", "regions-windows", "regions-cse"}


def test_identical_layers_are_saturated_once_and_replayed() -> None:
    model = residual_stack(random_gammas(4))
    optimized, report = onnxsat.optimize(model, by_regions())
    summary = report.regions
    assert summary is not None
    assert (summary.regions, summary.distinct, summary.replayed) == (4, 1, 3)
    assert summary.windows == 3 and summary.windows_distinct + summary.windows_replayed == 3
    assert report.verification.status == "passed"
    assert "replayed" in report.render()


def test_a_layer_with_gamma_of_ones_is_not_replayed_from_a_random_one() -> None:
    gammas = random_gammas(4)
    gammas[2] = np.ones(HIDDEN)
    model = residual_stack(gammas)
    optimized, report = onnxsat.optimize(model, by_regions())
    summary = report.regions
    assert summary is not None
    assert (summary.distinct, summary.replayed) == (2, 2)
    assert report.verification.status == "passed"
    assert not report.kept_original


def transposes_across_a_cut() -> onnx.ModelProto:
    """x -> 5 Tanh -> Transpose | Transpose -> 5 Tanh -> y: the two Transposes cancel, but they
    fall into two regions of six nodes."""
    nodes = [helper.make_node("Tanh", ["x"], ["t0"])]
    nodes += [helper.make_node("Tanh", [f"t{i}"], [f"t{i + 1}"]) for i in range(4)]
    nodes += [
        helper.make_node("Transpose", ["t4"], ["p"], perm=[1, 0]),
        helper.make_node("Transpose", ["p"], ["q0"], perm=[1, 0]),
    ]
    nodes += [helper.make_node("Tanh", [f"q{i}"], [f"q{i + 1}" if i < 4 else "y"]) for i in range(5)]
    graph = helper.make_graph(
        nodes,
        "cut",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_window_around_a_cut_finds_a_rewrite_that_spans_it() -> None:
    model = transposes_across_a_cut()
    assert partition(model, 6) == [range(0, 6), range(6, 12)]

    def transposes(out: onnx.ModelProto) -> int:
        return sum(n.op_type == "Transpose" for n in out.graph.node)

    without, _ = onnxsat.optimize(model, by_regions(6, hops=0))
    assert transposes(without) == 2  # each region keeps its lone Transpose
    with_windows, report = onnxsat.optimize(model, by_regions(6, hops=3))
    whole, _ = onnxsat.optimize(model, WHOLE)
    assert transposes(with_windows) == transposes(whole) == 0
    assert report.regions is not None and report.regions.windows == 1
    assert report.verification.status == "passed"


def test_common_subexpressions_are_merged_once() -> None:
    shape = numpy_helper.from_array(np.array([5, 3], dtype=np.int64), "s1")
    again = numpy_helper.from_array(np.array([5, 3], dtype=np.int64), "s2")
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Reshape", ["x", "s2"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])],
        initializer=[shape, again],
    )
    model, merged = eliminate_common_subexpressions(helper.make_model(graph))
    assert merged == 1
    assert [n.op_type for n in model.graph.node] == ["Reshape", "Add"]
    assert list(model.graph.node[1].input) == ["a", "a"]
    assert [t.name for t in model.graph.initializer] == ["s1"]
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("size", [0, 100])
def test_small_graphs_stay_whole(size: int) -> None:
    model = residual_stack(random_gammas(2))
    _, report = onnxsat.optimize(model, onnxsat.Options(region_nodes=size, region_size=LAYER))
    assert report.regions is None


def test_a_shape_computation_crossing_a_cut_is_computed_again_inside() -> None:
    """Reshape(h, Concat(Shape(x)[0:1], [-1])) in a later region than the Shape: the region gets
    the Shape and Concat too (so rules read the size) and its program names them afresh."""
    minus_one = numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], end=1),
        helper.make_node("Concat", ["s", "minus_one"], ["target"], axis=0),
        helper.make_node("Tanh", ["x"], ["h"]),
        helper.make_node("Reshape", ["h", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "shapes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        initializer=[minus_one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    part = part_model(model, [2, 3], value_types(model))
    assert part.copies == ("s", "target")
    assert [n.op_type for n in part.model.graph.node] == ["Shape", "Concat", "Tanh", "Reshape"]
    assert part.inputs == ("x",) and part.outputs == ("y",)


def _masked_stack(layers: int) -> onnx.ModelProto:
    """x -> per layer: h + Relu(h @ W) + mask, where mask = Where(keep, 0, -1e4) is built once from
    the bool graph input ``keep`` before the first layer (as exporters build attention masks)."""
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "low"),
    ]
    nodes = [helper.make_node("Where", ["keep", "zero", "low"], ["mask"])]
    h = "x"
    for k in range(layers):
        weights.append(numpy_helper.from_array(rng.normal(0, 0.3, (HIDDEN, HIDDEN)).astype(np.float32), f"w{k}"))
        out = "y" if k == layers - 1 else f"h{k + 1}"
        nodes += [
            helper.make_node("MatMul", [h, f"w{k}"], [f"a{k}"]),
            helper.make_node("Relu", [f"a{k}"], [f"r{k}"]),
            helper.make_node("Add", [h, f"r{k}"], [f"s{k}"]),
            helper.make_node("Add", [f"s{k}", "mask"], [out]),
        ]
        h = out
    graph = helper.make_graph(
        nodes,
        "masked",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, HIDDEN]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [4, HIDDEN]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, HIDDEN])],
        initializer=weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_mask_built_from_the_inputs_is_computed_again_inside_each_part() -> None:
    """A mask computed once from graph inputs and read by every layer is copied into each later part
    (so an attention fusion there sees what the mask is, not an opaque float input); a layer's own
    activations are not."""
    model = _masked_stack(3)
    types = value_types(model)
    first, second = (part_model(model, nodes, types) for nodes in ([0, 1, 2, 3, 4], [5, 6, 7, 8]))
    assert first.copies == ()
    assert second.copies == ("mask",) and second.inputs == ("keep", "h1")
    assert [n.op_type for n in second.model.graph.node] == ["Where", "MatMul", "Relu", "Add", "Add"]
    optimized, report = onnxsat.optimize(model, by_regions(size=4))
    assert report.regions is not None and report.regions.regions >= 3
    assert report.verification.status == "passed"
    assert [n.op_type for n in optimized.graph.node].count("Where") == 1  # CSE merged the copies


def test_identities_between_parts_are_dropped() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Identity", ["b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "identities",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model, merged = eliminate_common_subexpressions(helper.make_model(graph))
    assert merged == 1
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [("Relu", ["x"]), ("Identity", ["b"])]


def test_symbols_shape_inference_invented_key_by_their_place_not_their_number() -> None:
    """Twin layers of a TorchScript export get fresh ``unk__N`` symbols from ONNX inference in every
    layer: they key alike, while which dims are one symbol still counts."""
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "invented",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def key(a: str, y: str) -> str:
        types = {
            "x": helper.make_tensor_type_proto(TensorProto.FLOAT, [a, 4]),
            "a": helper.make_tensor_type_proto(TensorProto.FLOAT, [a, 4]),
            "y": helper.make_tensor_type_proto(TensorProto.FLOAT, [y, 4]),
        }
        return part_key(part_model(model, [0, 1], types))[0]

    assert key("unk__1", "unk__1") == key("unk__9", "unk__9")
    assert key("unk__1", "unk__1") != key("unk__1", "unk__2")  # one symbol or two: other keys
    assert key("batch", "batch") != key("rows", "rows")  # named symbols still by name


def test_a_mask_read_by_every_layer_does_not_widen_the_cuts_between_layers() -> None:
    """The copied mask crosses every cut between layers; counted, it made cuts after its last read
    (inside the last layer) look narrower than those between layers, and a cut there split the
    last attention of a Llama export (260 nodes whole, 267 by regions)."""
    model = _masked_stack(3)
    plain, typed = cut_widths(model), cut_widths(model, value_types(model))
    between = [5, 9]  # before each later layer's MatMul
    assert [plain[p] for p in between] == [2, 2]  # h and the mask
    assert [typed[p] for p in between] == [1, 1]  # h alone: the parts compute the mask again
    assert all(t <= p for t, p in zip(typed, plain, strict=True))


def test_commuted_copies_of_one_computation_merge() -> None:
    """Two parts may extract ``a + 1`` and ``1 + a`` for one copied size computation: both are one."""
    nodes = [
        helper.make_node("Add", ["x", "one"], ["a"]),
        helper.make_node("Add", ["one", "x"], ["b"]),
        helper.make_node("Mul", ["a", "b"], ["y"]),
    ]
    one = numpy_helper.from_array(np.ones(3, np.float32), "one")
    model = make_model(nodes, [vi("x", TensorProto.FLOAT, [3])], [vi("y", TensorProto.FLOAT, [3])], 17, [one])
    model, merged = eliminate_common_subexpressions(model)
    assert merged == 1
    assert [list(n.input) for n in model.graph.node] == [["x", "one"], ["a", "a"]]
