"""The committed real-model corpus (small configurations) through `onnxsat.optimize`.

Each model in tests/data/realmodels (torchvision and transformers exports with random weights,
both torch exporters, static and dynamic shapes, a KV-cache decode step, int8 QDQ and float16;
written by benchmarks/realmodels/export.py, listed in INDEX.json) is optimized with the default
options (verification on). The result is then checked here independently of onnxsat's own
verification: on onnxruntime with seeded inputs of valid ranges, every output within
1e-4 * max|ref| + 1e-6 of the original's, no more nodes than the input, no more weight bytes
unless the report says why (then at most 1% more: folded size arithmetic), and
an estimated cost no higher than the input's. The decoder exports whose attention is fused
(``FUSED_ATTENTION``) must have one Attention per layer and stay exact under left padding. A refusal (exit-3
VerificationError or any other onnxsat error) fails the test with its message.

A model that computes in float16 is held to float16's precision instead (`FLOAT16_RTOL`), and
must be at least as close as the original to the same model evaluated in float32.

Models that fail today are listed in KNOWN_OPEN with the reason; they run as strict xfails, so the
fix that makes one pass must delete its entry.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import onnxsat
from onnxsat import Options
from onnxsat.errors import OnnxsatError
from tests.realmodels_feeds import feeds_for

DATA = Path(__file__).parent / "data" / "realmodels"
INDEX: dict[str, dict[str, Any]] = json.loads((DATA / "INDEX.json").read_text())

KNOWN_OPEN: dict[str, str] = {}
"""Corpus models onnxsat fails on today: name -> what goes wrong. Delete an entry when fixed."""

SLOW = {
    "swin_t-ts-static",
    "shufflenet_v2_x1_0-ts-static",
    "bert-dynamo-dynamic",
    "bert-ts-static-fp16",
}
"""The heaviest cases (22-47 s each at -n 2 under load 10-14; the others 2-17 s): marked slow."""

OPTIONS = Options(minimize_seconds=10.0)
"""Default options (verification on) except a shorter search for the minimal failing rule set on a
refusal: a refusal fails the test either way, and the CLI names the rules with its defaults."""

CHECK_SEED = 20261201  # not one of onnxsat's verification seeds (0, 1)

FUSED_ATTENTION = {
    "qwen2-dynamo-static": 2,
    "qwen2-decode-dynamo-static": 2,  # a KV-cache step: k and v are Concat(past, new)
    "llama-decode-dynamo-dynamic": 2,  # dynamic batch and sequence
    "llama-ts-static": 2,  # TorchScript: the mask's Expand target is Where(Equal(...)) on constants
    "llama-decode-ts-static": 2,  # a [1, 1, 1, S] mask over q folded to [B, Hkv, n_rep * T, D]: expanded
    "gpt2-dynamo-dynamic": 2,  # a finfo.min mask: its constant becomes the next float up
    "bert-ts-dynamic": 2,
    "distilbert-dynamo-static": 2,
    "whisper_tiny_encoder-dynamo-static": 2,
    "t5_encoder-ts-static": 2,  # its position bias table where kept, finfo.min elsewhere, no NaN guard
    "bert-ts-static-fp16": 2,  # float16 (onnxruntime's Attention computes the products in float32)
}
"""Exports whose attention the default options fuse: name -> Attention nodes (one per layer, no
Softmax left), exact also with left padding and with the symbolic dims kept."""

PACKED_HEADS = {
    "bert-ts-dynamic",
    "distilbert-dynamo-static",
    "gpt2-dynamo-dynamic",
    "whisper_tiny_encoder-dynamo-static",
    "t5_encoder-ts-static",
    "bert-ts-static-fp16",
}
"""Exports whose Attention takes q, k, v with the heads packed in the last dim (3-D, q_num_heads):
the heads' Reshape and Transpose are gone (TorchScript's permuted k^T; dynamo's flattened one)."""

FLOAT16_RTOL = 1e-2
"""The relative bound for outputs computed in float16. float16 carries 11 significant bits (unit
roundoff 4.9e-4), so one rounding that differs at the largest element already exceeds the float32
bound 1e-4 * max|ref|; a fused LayerNorm or a reassociated reduction changes several roundings in a
row. 1e-2 is ~10 float16 ulps at max|ref| (onnxsat's own verification allows the same); the
comparison with the float32 evaluation checks that the difference is rounding, not lost accuracy."""


def _cases() -> list[Any]:
    cases = []
    for name, record in sorted(INDEX.items()):
        if "error" in record:
            continue  # the export itself failed; the index keeps the exporter's reason
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_OPEN[name])] if name in KNOWN_OPEN else []
        marks += [pytest.mark.slow] if name in SLOW else []
        cases.append(pytest.param(name, marks=marks, id=name))
    return cases


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def test_index_lists_every_committed_file() -> None:
    files = {p.name for p in DATA.glob("*.onnx")}
    listed = {r["file"] for r in INDEX.values() if "error" not in r}
    assert files == listed
    assert set(KNOWN_OPEN) | SLOW <= set(INDEX), "KNOWN_OPEN or SLOW names a model that is not in the corpus"


@pytest.mark.parametrize("name", _cases())
def test_realmodel_optimizes_exactly(name: str) -> None:
    record = INDEX[name]
    data = (DATA / record["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == record["sha256"], "file differs from its INDEX.json entry"
    original = onnx.load_from_string(data)
    try:
        optimized, report = onnxsat.optimize(original, OPTIONS)
    except OnnxsatError as err:  # exit-3 refusals and every other reported failure
        pytest.fail(f"onnxsat refused {name} (exit {err.exit_code}): {err}")
    assert report.verification is not None and report.verification.status in ("passed", "regionwise"), (
        report.verification
    )
    onnx.checker.check_model(optimized, full_check=True)

    feeds = feeds_for(record["inputs"], seed=CHECK_SEED)
    expected, actual = _run(original, feeds), _run(optimized, feeds)
    assert set(actual) == set(expected)
    half = _computes_in_float16(original)
    rtol, atol = (FLOAT16_RTOL, 1e-4) if half else (1e-4, 1e-6)
    for output, ref in expected.items():
        got = actual[output]
        assert got.shape == ref.shape and got.dtype == ref.dtype, output
        error = _max_error(got, ref)
        bound = rtol * float(np.max(np.abs(ref.astype(np.float64)))) + atol if ref.size else 0.0
        assert error <= bound, f"{output}: max |a-b| {error:.3g} > {bound:.3g}"
    if half:  # float16 rounding differs; accuracy must not be lost
        exact = _run(_float32_twin(original), feeds)
        for output, ref in exact.items():
            before, after = _max_error(expected[output], ref), _max_error(actual[output], ref)
            assert after <= 2 * before + 1e-6, f"{output}: {after:.3g} from float32, the original {before:.3g}"
    nodes_before, nodes_after = len(original.graph.node), len(optimized.graph.node)
    assert nodes_after <= nodes_before, f"{nodes_before} -> {nodes_after} nodes"
    weights_before, weights_after = _weight_bytes(original), _weight_bytes(optimized)
    if weights_after > weights_before:  # allowed only where the report says why, and only a little
        assert any(w.startswith("weight bytes ") for w in report.warnings), "weights grew unexplained"
        assert weights_after <= weights_before * 1.01 + 4096, f"weights {weights_before} -> {weights_after}"
    assert report.cost_after <= report.cost_before, (
        f"estimated cost {report.cost_before} -> {report.cost_after}"
    )
    kept = _kept_positions(original, optimized)
    assert kept == sorted(kept), "nodes that kept their names run in another order than in the input"
    if name in FUSED_ATTENTION:
        ops = Counter(n.op_type for n in optimized.graph.node)
        assert ops["Attention"] == FUSED_ATTENTION[name] and ops["Softmax"] == 0, ops
        packed = [
            n for n in optimized.graph.node if n.op_type == "Attention" and any(a.name == "q_num_heads" for a in n.attribute)
        ]
        assert len(packed) == (ops["Attention"] if name in PACKED_HEADS else 0), name
        assert_exact_with_left_padding(original, optimized, record["inputs"])


def assert_exact_with_left_padding(original: onnx.ModelProto, optimized: onnx.ModelProto, inputs: list[Any]) -> None:
    """Outputs within 1e-4 * max|ref| + 1e-6 of the original's (float16 models: FLOAT16_RTOL, 1e-4)
    on seeded inputs and on the same inputs left-padded (the first queries' rows fully masked), and
    the inputs' symbolic dims kept."""
    rtol, atol = (FLOAT16_RTOL, 1e-4) if _computes_in_float16(original) else (1e-4, 1e-6)
    feeds = feeds_for(inputs, seed=7)
    padded = {n: a.copy() for n, a in feeds.items()}
    if "attention_mask" in padded:
        padded["attention_mask"][...] = 1
        padded["attention_mask"][:, :3] = 0
    for inputs_ in (feeds, padded):
        expected, actual = _run(original, inputs_), _run(optimized, inputs_)
        for output, ref in expected.items():
            bound = rtol * float(np.max(np.abs(ref.astype(np.float64)))) + atol
            assert _max_error(actual[output], ref) <= bound, output

    def dims(model: onnx.ModelProto) -> list[list[str]]:
        return [[d.dim_param for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input]

    assert dims(optimized) == dims(original)


def _kept_positions(original: onnx.ModelProto, optimized: onnx.ModelProto) -> list[int]:
    """For each optimized node that writes a name the original writes, in order: that original
    node's position (a runtime runs nodes as written: the order decides memory reuse)."""
    position = {name: i for i, node in enumerate(original.graph.node) for name in node.output if name}
    return [
        min(position[o] for o in node.output if o in position)
        for node in optimized.graph.node
        if any(o in position for o in node.output)
    ]


def _weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers and Constant tensors (the weights a model file carries), less the
    int32/int64 vectors of at most 16 elements: shape, axes, pads and slice operands, which opsets
    before 13 carried as attributes (a Transpose rewritten to a Reshape adds one)."""
    tensors = list(model.graph.initializer)
    tensors += [
        a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    ]
    arrays = [numpy_helper.to_array(t) for t in tensors]
    return sum(a.nbytes for a in arrays if not (a.dtype in (np.int32, np.int64) and a.size <= 16))


def _max_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0


def _float16_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    tensors = list(model.graph.initializer)
    return tensors + [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]


def _computes_in_float16(model: onnx.ModelProto) -> bool:
    """float16 weights or a Cast to float16: the outputs carry float16 rounding (float32 I/O or not)."""
    casts = any(
        n.op_type == "Cast" and a.name == "to" and a.i == onnx.TensorProto.FLOAT16
        for n in model.graph.node
        for a in n.attribute
    )
    return casts or any(t.data_type == onnx.TensorProto.FLOAT16 for t in _float16_tensors(model))


def _float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model computed in float32: float16 weights, Cast targets and declared types widened."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    for tensor in _float16_tensors(twin):
        if tensor.data_type == onnx.TensorProto.FLOAT16:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    for node in twin.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == onnx.TensorProto.FLOAT16:
                attr.i = onnx.TensorProto.FLOAT
    for info in [*twin.graph.value_info, *twin.graph.input, *twin.graph.output]:
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return twin
