"""Sizes ONNX inference leaves open, observed on onnxruntime only where no input value can change them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxsat
from onnxsat.static_shapes import data_free_shapes, fold_sizes, fully_known, static_sizes
from onnxsat.verification import run_ort

from .helpers_onnx import analysis_shape, int64s, make_model, out_vi, vi

REALMODELS = Path(__file__).parent / "data" / "realmodels"


def _window_pad(dims: list[int | str]) -> onnx.ModelProto:
    """Swin's padding to a multiple of the window (4) on axis 1, sizes computed as TorchScript does:
    Pad(x, Concat(0, 0, 0, 0, Mod(Sub(4, Mod(Shape(x)[1], 4)), 4), 0)); ONNX infers the
    padded tensor as [unk, unk, unk] and the Reshape by windows after it the same."""
    nodes = [
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Gather", ["dims", "one"], ["h"], axis=0),
        helper.make_node("Mod", ["h", "four"], ["rem"]),
        helper.make_node("Sub", ["four", "rem"], ["short"]),
        helper.make_node("Mod", ["short", "four"], ["pad"]),
        helper.make_node("Unsqueeze", ["pad", "zero"], ["pad1"]),
        helper.make_node("Concat", ["zeros4", "pad1", "zero"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),
        helper.make_node("Shape", ["padded"], ["pdims"]),
        helper.make_node("Gather", ["pdims", "one"], ["ph"], axis=0),
        helper.make_node("Div", ["ph", "four"], ["nwin"]),
        helper.make_node("Unsqueeze", ["nwin", "zero"], ["nwin1"]),
        helper.make_node("Concat", ["minus1", "nwin1", "four1", "last"], ["target"], axis=0),
        helper.make_node("Reshape", ["padded", "target"], ["windows"]),
        helper.make_node("Relu", ["windows"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(4, np.int64), "four"),
        int64s("zeros4", [0, 0, 0, 0]),
        int64s("zero", [0]), int64s("minus1", [-1]), int64s("four1", [4]), int64s("last", [3]),
    ]  # fmt: skip
    return make_model(nodes, [vi("x", TP.FLOAT, dims)], [out_vi("y", TP.FLOAT, 4)], 17, inits)


def test_sizes_computed_from_shapes_are_data_free_and_sizes_read_from_data_are_not() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Reshape", ["x", "dims"], ["same"]),  # target from a shape: data-free
        helper.make_node("Cast", ["t"], ["target"], to=TP.INT64),
        helper.make_node("Reshape", ["x", "target"], ["by_data"]),  # target is an input's value
        helper.make_node("Relu", ["by_data"], ["after"]),  # shaped by data through its input
        helper.make_node("Shape", ["by_data"], ["its_dims"]),  # a size the data decides: data
        helper.make_node("Expand", ["x", "its_dims"], ["expanded"]),
        helper.make_node("NonZero", ["x"], ["where"]),  # data-dependent by nature
        helper.make_node("Shape", ["where"], ["nz_dims"]),
        helper.make_node("Add", ["x", "x"], ["doubled"]),  # data values, data-free shape
        helper.make_node("RandomNormalLike", ["t"], ["noise"]),
        helper.make_node("Cast", ["noise"], ["noise_ints"], to=TP.INT64),
        helper.make_node("Reshape", ["x", "noise_ints"], ["by_noise"]),  # random values are data
    ]
    model = make_model(
        nodes,
        [vi("x", TP.FLOAT, [2, 3]), vi("t", TP.FLOAT, [2])],
        [out_vi(n, TP.FLOAT, 2) for n in ("same", "after", "expanded", "doubled", "by_noise")],
        17,
    )
    free = data_free_shapes(model)
    assert {"dims", "same", "doubled", "target", "noise", "noise_ints"} <= free
    assert not {"by_data", "after", "its_dims", "expanded", "where", "nz_dims", "by_noise"} & free


def test_observed_sizes_are_the_run_time_ones() -> None:
    model = _window_pad([1, 6, 3])
    shapes = static_sizes(model, {}, {})
    assert shapes["padded"] == (1, 8, 3) and shapes["windows"] == (1, 2, 4, 3)
    assert len(model.graph.node) == 15 and [o.name for o in model.graph.output] == ["y"]  # probes removed


def test_nothing_is_observed_with_an_open_input_size() -> None:
    open_size = static_sizes(_window_pad(["n", 6, 3]), {}, {})
    assert open_size["x"] == ("n", 6, 3)
    assert None in open_size.get("padded", (None,)) and None in open_size.get("windows", (None,))
    pinned = static_sizes(_window_pad(["n", 6, 3]), {"x": [2, 6, 3]}, {"n": 2})
    assert pinned["x"] == (2, 6, 3) and pinned["windows"] == (2, 2, 4, 3)


def test_known_sizes_are_written_as_constants_before_the_import() -> None:
    """Every Shape of a tensor whose size is known for every input becomes a constant, and the
    size arithmetic over it folds away: only the Pad (by constant amounts), the Reshape and the Relu are left."""
    model = _window_pad([1, 6, 3])
    before = onnx.ModelProto()
    before.CopyFrom(model)
    folded = fold_sizes(model, static_sizes(model, {}, {}), max_weight_bytes=1e9)
    assert [n.op_type for n in folded.graph.node] == ["Pad", "Reshape", "Relu"]
    pads = next(t for t in folded.graph.initializer if t.name == folded.graph.node[0].input[1])
    assert numpy_helper.to_array(pads).tolist() == [0, 0, 0, 0, 2, 0]
    assert model == before  # the caller's model is not changed
    unknown = fold_sizes(model, {}, max_weight_bytes=1e9)
    assert [n.op_type for n in unknown.graph.node] == [n.op_type for n in model.graph.node]


def test_known_sizes_of_a_symbolic_shape_are_gathered_as_constants() -> None:
    """A dynamic-axes attention reads its head count from Shape(x)[1] where x is [batch, 4, seq,
    16]: that Gather is the constant 4, the batch's stays a Gather."""
    nodes = [
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Gather", ["dims", "one"], ["heads"], axis=0),
        helper.make_node("Gather", ["dims", "zero_scalar"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["heads", "zero"], ["heads1"]),
        helper.make_node("Unsqueeze", ["batch", "zero"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "heads1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
        int64s("zero", [0]), int64s("minus1", [-1]),
    ]  # fmt: skip
    model = make_model(nodes, [vi("x", TP.FLOAT, ["b", 4, "s", 16])], [out_vi("y", TP.FLOAT, 3)], 17, inits)
    folded = fold_sizes(model, static_sizes(model, {}, {}), max_weight_bytes=1e9)
    assert [n.op_type for n in folded.graph.node] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    assert len(out.graph.node) <= len(folded.graph.node)


def test_slices_of_a_layers_shape_read_the_inputs_size() -> None:
    """dynamo writes ``x.view(-1, x.size(-2), x.size(-1))`` and ``x.view(x.shape[:-2] + ...)`` of
    a layer's [batch, 4, seq, 16] activation as Slices of its Shape: the sequence and the batch
    are read from the graph input's own Shape (nodes every layer shares), known sizes are
    constants, and a Shape slice of the input itself stays one Shape node."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Shape", ["h"], ["dims"]),
        helper.make_node("Slice", ["dims", "minus2", "minus1"], ["seq"]),
        helper.make_node("Slice", ["dims", "minus1", "end"], ["last"]),
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "minus1", "seq", "last"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["y"]),
        helper.make_node("Slice", ["dims", "zero", "minus2"], ["lead"]),
        helper.make_node("Concat", ["lead", "minus1"], ["target2"], axis=0),
        helper.make_node("Reshape", ["h", "target2"], ["z"]),
    ]
    inits = [int64s("minus2", [-2]), int64s("minus1", [-1]), int64s("end", [2**63 - 1]), int64s("zero", [0])]
    outputs = [out_vi("y", TP.FLOAT, 4), out_vi("z", TP.FLOAT, 3)]
    model = make_model(nodes, [vi("x", TP.FLOAT, ["b", 4, "s", 16])], outputs, 17, inits)
    folded = fold_sizes(model, static_sizes(model, {}, {}), max_weight_bytes=1e9)
    reads = [(n.op_type, list(n.input), {a.name: a.i for a in n.attribute}) for n in folded.graph.node]
    assert ("Shape", ["x"], {"start": 2, "end": 3}) in reads and ("Shape", ["x"], {"start": 0, "end": 1}) in reads
    assert [op for op, _, _ in reads].count("Shape") == 3  # the batch read for x.shape[:-2], and the two above
    assert "Slice" not in [op for op, _, _ in reads]
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    for b, s in ((1, 3), (2, 7)):
        x = np.random.default_rng(b).normal(size=(b, 4, s, 16)).astype(np.float32)
        got, want = run_ort(out, {"x": x}), run_ort(model, {"x": x})
        for name in ("y", "z"):
            np.testing.assert_array_equal(got[name], want[name])


def test_observed_sizes_seed_the_analysis_and_fold_the_size_arithmetic() -> None:
    model = _window_pad([1, 6, 3])
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed" and report.dropped_rules == {}
    ops = [n.op_type for n in out.graph.node]
    assert "Shape" not in ops and "Mod" not in ops and ops.count("Reshape") <= 1
    _, unobserved = onnxsat.optimize(model, onnxsat.Options(observe_shapes=False))
    assert sum(unobserved.nodes_after.values()) > len(ops)


def test_the_importer_seeds_observed_sizes() -> None:
    from onnxsat.egraph.importer import from_onnx

    model = _window_pad([1, 6, 3])
    assert analysis_shape(from_onnx(model, seed_invented=False), "windows") is None
    seeded = from_onnx(model, seed_invented=False, static_shapes=fully_known(static_sizes(model, {}, {})))
    assert analysis_shape(seeded, "windows") == (1, 2, 4, 3)


def test_swin_windows_fold_as_the_peers_fold_them() -> None:
    """torchvision's swin_t (TorchScript, small configuration): its window padding and shift masks
    are size arithmetic ONNX inference leaves open; observed, they fold before the import (205
    nodes; onnxslim gets 189, this module's absence left 845), the masks within the growth limit."""
    model = onnx.load(REALMODELS / "swin_t-ts-static.onnx")
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed" and report.dropped_rules == {}
    assert len(out.graph.node) <= 220, len(out.graph.node)
    assert not {"ScatterND", "Range", "ConstantOfShape", "Shape"} & {n.op_type for n in out.graph.node}
    assert report.stage_seconds["shapes"] < 5
