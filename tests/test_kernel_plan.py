"""The fusion extraction chose is the fusion the lowering runs: ``extract.kernel_plan`` groups the
chosen program into kernels as the onnxsat-cpu cost model priced it, the exporter stamps the
groups onto the nodes (``KERNEL_STAMP``), and the lowering fuses no two nodes of different
stamps, on committed real-model exports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsat.base.options import Options
from onnxsat.compiler import optimize_options
from onnxsat.egraph.graph_types import KERNEL_STAMP
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.lowering.layout_marks import read_layout_marks
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep
from onnxsat.pipeline import optimize
from tests.realmodels_feeds import feeds_for

DATA = Path(__file__).parent / "data" / "realmodels"


def _stamp(node: onnx.NodeProto) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == KERNEL_STAMP), None)


@pytest.mark.parametrize("name", ["resnet18-ts-static", "mobilenet_v3_small-dynamo-static", "efficientnet_b0-ts-static", "bert-ts-dynamic", "shufflenet_v2_x1_0-ts-static"])
def test_compile_fuses_only_what_extraction_grouped(name: str) -> None:
    """Optimized as ``onnxsat.compile`` does (the onnxsat-cpu cost model), the nodes extraction has
    a price for carry their kernel (BERT's mask chain around an And it has none for does not); of
    the nodes the lowering computes together (a kernel, what it inlines, its epilogue), none come
    from two of extraction's kernels."""
    record = json.loads((DATA / "INDEX.json").read_text())[name]
    optimized, _ = optimize(onnx.load(DATA / record["file"]), optimize_options(Options(verify=False), CompileOptions()))
    model, _ = read_layout_marks(optimized)  # the nodes the lowering indexes: no layout marks
    stamps = [_stamp(n) if len(n.output) == 1 else None for n in model.graph.node]
    assert sum(s is not None for s in stamps) >= 0.75 * len(stamps)
    feeds = feeds_for(record["inputs"], seed=3)
    program = lower(model, {k: v.shape for k, v in feeds.items()}, gemm_epilogues=True)
    assert program.fused  # kernels do inline their producers
    for together in program.fused:
        kernels = {stamps[i] for i in together if stamps[i] is not None}
        assert len(kernels) <= 1, [(model.graph.node[i].op_type, stamps[i]) for i in sorted(together)]


def test_a_conv_and_its_relu_are_one_kernel_and_a_shared_sum_is_stored() -> None:
    """ResNet-18's stamps: a conv and the Relu that alone reads it share a kernel (the Relu is its
    epilogue); the residual Add, read only by its Relu, is computed in that Relu's kernel, which
    stores the sum for the next block's two readers (or, the last, is the global pool's prologue)."""
    record = json.loads((DATA / "INDEX.json").read_text())["resnet18-ts-static"]
    model, _ = optimize(onnx.load(DATA / record["file"]), optimize_options(Options(verify=False), CompileOptions()))
    nodes = list(model.graph.node)
    producer = {t: n for n in nodes for t in n.output}
    relus = [n for n in nodes if n.op_type == "Relu"]
    after_conv = [r for r in relus if producer[r.input[0]].op_type == "Conv"]
    after_add = [r for r in relus if producer[r.input[0]].op_type == "Add"]
    assert after_conv and after_add
    for relu in after_conv:
        assert _stamp(relu) == _stamp(producer[relu.input[0]]) == producer[relu.input[0]].output[0]
    for relu in after_add[:-1]:
        assert _stamp(producer[relu.input[0]]) == _stamp(relu) == relu.output[0]
    last = after_add[-1]
    assert _stamp(producer[last.input[0]]) == _stamp(last) != last.output[0]


def _chain(stamps: tuple[str | None, str | None]) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Exp", ["r"], ["y"])]
    for node, stamp in zip(nodes, stamps, strict=True):
        if stamp is not None:
            node.metadata_props.add(key=KERNEL_STAMP, value=stamp)
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("stamps", "kernels"), [((None, None), 1), (("y", "y"), 1), (("r", "y"), 2), (("r", None), 1)])
def test_lowering_stores_a_tensor_extraction_put_in_another_kernel(stamps: tuple[str | None, str | None], kernels: int) -> None:
    """A Relu read only by an Exp is computed inside the Exp's kernel, unless extraction put the two
    in different kernels: then the Relu's result is stored by a kernel of its own. An unstamped
    node is the lowering's to group."""
    model = _chain(stamps)
    program = lower(model, {"x": (4, 64)})
    assert sum(isinstance(s, KernelStep) for s in program.steps) == kernels
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    got = CompiledModel(model, CompileOptions(threads=1, cache=False))({"x": x})["y"]
    np.testing.assert_allclose(got, np.exp(np.maximum(x, 0)), rtol=1e-6)


def test_a_region_part_renamed_into_its_graph_renames_its_kernel_stamps() -> None:
    """A stamp names the tensor its kernel stores; stitching a region's optimized part into the
    graph renames the part's tensors, and its stamps with them (per output of a Split too), so
    two twin regions' kernels stay apart."""
    from onnxsat.egraph.graph_types import STAMP_SEPARATOR
    from onnxsat.egraph.regions import rename_part

    relu = helper.make_node("Relu", ["x"], ["r"])
    relu.metadata_props.add(key=KERNEL_STAMP, value="a")
    split = helper.make_node("Split", ["r"], ["a", "y"], axis=0, num_outputs=2)
    split.metadata_props.add(key=KERNEL_STAMP, value=STAMP_SEPARATOR.join(["a", "y"]))
    graph = helper.make_graph(
        [relu, split], "part", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "y")],
    )
    nodes, _ = rename_part(helper.make_model(graph), {"x": "x", "y": "out"}, "r7_", set())
    assert [_stamp(n) for n in nodes] == ["r7_a", STAMP_SEPARATOR.join(["r7_a", "out"])]
