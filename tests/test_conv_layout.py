"""The layout a depthwise conv runs in is extraction's choice: the e-graph holds the conv over its
input and over ``reorder_nchwc`` of it, the onnxsat-cpu cost model prices the flat kernel's wasted
lanes and each layout's copies, the exporter writes the choice as a stamped Identity, and the
lowering runs channel-blocked exactly the convs extraction chose so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.base.options import Options
from onnxsat.compiler import optimize_options
from onnxsat.egraph.graph_types import KERNEL_STAMP, ENode, Ref
from onnxsat.egraph.ops.layout import LAYOUT_STAMP, NCHWC
from onnxsat.extract.conv_layout import can_run_blocked, flat_lane_waste, prefers_blocked
from onnxsat.extract.cost import FUSED_NODE_US, NodeCtx, RooflineCost
from onnxsat.extract.profile import builtin_profile
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.latency import ort_session
from onnxsat.lowering.layout_marks import read_layout_marks
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep
from onnxsat.pipeline import optimize
from tests.realmodels_feeds import feeds_for

DATA = Path(__file__).parent / "data" / "realmodels"


def _depthwise(size: int, stride: int, mark: bool, stamp: bool, channels: int = 32) -> onnx.ModelProto:
    """Add(x, x) (a producer that stores nothing blocked), then a 3x3 depthwise conv; ``mark``: its
    input goes through the stamped Identity a ``reorder_nchwc`` is written as; ``stamp``: the
    nodes carry kernel stamps (the model came from extraction)."""
    rng = np.random.default_rng(size + stride)
    conv_in = "xb" if mark else "s"
    nodes = [helper.make_node("Add", ["x", "x"], ["s"])]
    if mark:
        nodes.append(helper.make_node("Identity", ["s"], ["xb"]))
        nodes[-1].metadata_props.add(key=LAYOUT_STAMP, value=NCHWC)
    nodes.append(helper.make_node("Conv", [conv_in, "w", "b"], ["y"], group=channels, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]))
    if stamp:
        for node in nodes:
            node.metadata_props.add(key=KERNEL_STAMP, value=node.output[0])
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 1, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _blocked_kernels(compiled: CompiledModel, feeds: dict[str, np.ndarray]) -> int:
    steps = compiled.executable_for(feeds).program.steps
    return sum(isinstance(s, KernelStep) and s.kernel.name.startswith("bdconv_") for s in steps)


@pytest.mark.parametrize(
    ("size", "stride", "mark", "stamp", "blocked"),
    [
        (28, 1, True, True, True),  # chosen blocked where the shape rule runs it flat
        (7, 1, False, True, False),  # chosen flat where the shape rule runs it blocked
        (20, 2, False, True, False),
        (7, 1, False, False, True),  # no choice made: the shape rule
        (28, 1, False, False, False),
        (20, 2, False, False, True),
    ],
)
def test_the_lowering_runs_a_depthwise_conv_in_the_layout_extraction_chose(size: int, stride: int, mark: bool, stamp: bool, blocked: bool) -> None:
    model = _depthwise(size, stride, mark, stamp)
    feeds = {"x": np.random.default_rng(size).standard_normal((1, 32, size, size)).astype(np.float32)}
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)["y"]
    want = ort_session(model, threads=1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert _blocked_kernels(compiled, feeds) == int(blocked)
    compiled.close()


def test_layout_marks_are_dropped_and_name_the_convs_that_read_them() -> None:
    stripped, chosen = read_layout_marks(_depthwise(14, 1, mark=True, stamp=True))
    assert chosen == frozenset({"y"})
    assert [n.op_type for n in stripped.graph.node] == ["Add", "Conv"] and stripped.graph.node[1].input[0] == "s"
    assert read_layout_marks(_depthwise(14, 1, mark=False, stamp=True))[1] == frozenset()
    assert read_layout_marks(_depthwise(14, 1, mark=False, stamp=False))[1] is None


def _conv_ctx(x_ops: frozenset[str], size: int = 14, stride: int = 1, blocked_input: bool = False) -> NodeCtx:
    node = ENode("conv", (Ref("x"), Ref("w"), Ref("b"), (stride, stride), (1, 1, 1, 1), (1, 1), 96))
    out = -(-size // stride)
    in_ops = (frozenset({"reorder_nchwc"}) if blocked_input else x_ops, frozenset({"Tensor.weight"}), frozenset({"Tensor.weight"}))
    return NodeCtx(node, (1, 96, out, out), 1, [(1, 96, size, size), (96, 1, 3, 3), (96,)], [1, 1, 1], False, in_ops, (False, True, True))


def _reorder_ctx(x_ops: frozenset[str]) -> NodeCtx:
    return NodeCtx(ENode("reorder_nchwc", (Ref("x"),)), (1, 96, 14, 14), 1, [(1, 96, 14, 14)], [1], False, (x_ops,), (False,))


def test_the_cost_model_prices_each_layout_and_its_copies() -> None:
    """onnxsat-cpu: the flat kernel's wasted lanes, its padded copy unless a product stored its
    planes; the reorder free after a 1x1 conv (or its activation), a copy after an Add. onnxruntime's
    target prices the reorder as a copy and the conv alike in both layouts."""
    cost = builtin_profile("onnxsat-cpu")
    assert isinstance(cost, RooflineCost)
    fed, unfed = frozenset({"conv"}), frozenset({"add"})
    flat_fed, blocked = cost.node_cost(_conv_ctx(fed)), cost.node_cost(_conv_ctx(fed, blocked_input=True))
    assert flat_fed > blocked  # 16 of every 14 columns computed
    assert cost.node_cost(_conv_ctx(unfed)) > flat_fed  # the padded copy
    assert cost.node_cost(_reorder_ctx(fed)) == FUSED_NODE_US
    assert cost.node_cost(_reorder_ctx(unfed)) > 10 * FUSED_NODE_US
    ort = builtin_profile("ort-cpu")
    assert ort.node_cost(_conv_ctx(fed)) == ort.node_cost(_conv_ctx(fed, blocked_input=True))
    assert ort.node_cost(_reorder_ctx(fed)) > 10 * FUSED_NODE_US


def test_flat_lane_waste() -> None:
    assert flat_lane_waste([3, 3], [1, 1], [1, 1], [14, 14]) == pytest.approx(16 / 14)
    assert flat_lane_waste([5, 5], [1, 1], [1, 1], [7, 7]) == pytest.approx(11 / 7)
    assert flat_lane_waste([3, 3], [2, 2], [1, 1], [7, 7]) == pytest.approx(16 / 7)
    assert flat_lane_waste([3, 3], [2, 2], [1, 1], [32, 32]) == 1.0
    assert can_run_blocked((1, 24, 9, 9), (24, 1, 3, 3), 24) and not can_run_blocked((1, 20, 9, 9), (20, 1, 3, 3), 20)
    assert not can_run_blocked((1, 24, 9, 9), (48, 1, 3, 3), 24)  # two outputs per channel
    assert prefers_blocked((1, 24, 9, 9), (24, 1, 3, 3), 24, [2, 2], [5, 5]) and not prefers_blocked((1, 24, 28, 28), (24, 1, 3, 3), 24, [1, 1], [28, 28])


@pytest.mark.parametrize("name", ["mobilenet_v3_small-dynamo-static", "efficientnet_b0-ts-static"])
def test_compile_runs_blocked_exactly_the_depthwise_convs_extraction_chose(name: str) -> None:
    """Optimized as ``onnxsat.compile`` does, every blocked kernel of the compiled program is a conv
    that reads a layout mark and every marked conv runs blocked; onnxruntime's cost target writes
    no mark."""
    record = json.loads((DATA / "INDEX.json").read_text())[name]
    source = onnx.load(DATA / record["file"])
    model, _ = optimize(source, optimize_options(Options(verify=False), CompileOptions()))
    _, chosen = read_layout_marks(model)
    assert chosen  # the expansions' products store blocked: every fed depthwise conv takes it
    feeds = feeds_for(record["inputs"], seed=3)
    program = lower(model, {k: v.shape for k, v in feeds.items()}, gemm_epilogues=True)
    ran_blocked = {s.kernel.outputs[0] for s in program.steps if isinstance(s, KernelStep) and s.kernel.name.startswith("bdconv_")}
    assert len(ran_blocked) == len(chosen)
    plain, _ = optimize(source, Options(verify=False))
    assert not any(p.key == LAYOUT_STAMP for n in plain.graph.node for p in n.metadata_props)
