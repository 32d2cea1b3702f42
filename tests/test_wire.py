"""Embedded weights left in the model file (``onnxsat.base.wire``): a lazily loaded model is the
model onnx parses, its large weights read from the file, and saving it writes the very bytes
onnx would; layouts the reader does not take apart are parsed whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.base import lazy_weights, modelio, wire
from onnxsat.base.errors import BadInputError

REALMODELS = Path(__file__).parent / "data" / "realmodels"
COMMITTED = sorted(REALMODELS.glob("*.onnx"))


def _model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x + each weight in turn (all of shape [64, 64] or broadcastable)."""
    nodes, last = [], "x"
    for i, name in enumerate(weights):
        nodes.append(helper.make_node("Add", [last, name], [f"y{i}"]))
        last = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "big": rng.standard_normal((64, 64)).astype(np.float32),  # 16 KiB: lazy
        "small": rng.standard_normal((64,)).astype(np.float32),  # 256 bytes: read
        "half": rng.standard_normal((64, 64)).astype(np.float32),
    }


def test_large_embedded_weights_stay_in_the_file(tmp_path: Path) -> None:
    model = _model(_weights())
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded, sources = modelio.load_model_and_sources(path, lazy=True)
    lazy = {t.name for t in lazy_weights.lazy_initializers(loaded)}
    assert lazy == {"big", "half"}
    assert sources == {path.resolve()}
    for tensor in loaded.graph.initializer:
        assert np.array_equal(lazy_weights.tensor_array(tensor), _weights()[tensor.name])
    assert modelio.serialized_size(loaded) == path.stat().st_size
    out = tmp_path / "out.onnx"
    modelio.save_model_atomic(loaded, out)
    assert out.read_bytes() == path.read_bytes()  # the bytes onnx writes, weights streamed in


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_exports_round_trip_byte_for_byte(path: Path, tmp_path: Path) -> None:
    """Every committed real export (both torch exporters) loads lazily and saves to its own bytes."""
    loaded = modelio.load_model(path, lazy=True)
    assert lazy_weights.lazy_initializers(loaded)
    out = tmp_path / "out.onnx"
    modelio.save_model_atomic(loaded, out, durable=False)
    assert out.read_bytes() == onnx.load(str(path)).SerializeToString()


def _model_bytes(model: onnx.ModelProto, initializer: bytes) -> bytes:
    """``model``'s bytes with one more initializer, given as its encoded bytes."""
    graph = model.graph.SerializeToString() + wire.len_prefix(5, len(initializer)) + initializer
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.ClearField("graph")
    return rest.SerializeToString() + wire.len_prefix(7, len(graph)) + graph


def test_packed_dims_are_read(tmp_path: Path) -> None:
    """dims written packed (a proto3-style writer) name the same shape."""
    values = _weights()["big"]
    model = _model({"big": values})
    del model.graph.initializer[:]
    dims = b"".join(bytes([d]) for d in values.shape)  # both below 128: one byte each
    tensor = (
        wire.len_prefix(1, len(dims)) + dims
        + bytes([2 << 3, TensorProto.FLOAT])
        + wire.len_prefix(8, 3) + b"big"
        + wire.len_prefix(9, values.nbytes) + values.tobytes()
    )
    path = tmp_path / "packed.onnx"
    path.write_bytes(_model_bytes(model, tensor))
    loaded = modelio.load_model(path, lazy=True)
    (weight,) = loaded.graph.initializer
    assert lazy_weights.is_lazy(weight) and list(weight.dims) == [64, 64]
    assert np.array_equal(lazy_weights.tensor_array(weight), values)


def test_a_second_graph_field_is_parsed_whole(tmp_path: Path) -> None:
    """Protobuf merges a repeated message field; the reader leaves such a file to protobuf."""
    model = _model(_weights())
    extra = onnx.GraphProto(doc_string="merged")
    data = model.SerializeToString() + wire.len_prefix(7, extra.ByteSize()) + extra.SerializeToString()
    path = tmp_path / "two-graphs.onnx"
    path.write_bytes(data)
    assert wire.embedded_weights(path, lazy_weights.worth_leaving) is None
    loaded = modelio.load_model(path, lazy=True)
    assert not lazy_weights.lazy_initializers(loaded)
    assert loaded.graph.doc_string == "merged" and len(loaded.graph.initializer) == 3


def test_raw_data_that_does_not_fit_its_dims_is_refused_as_before(tmp_path: Path) -> None:
    model = _model({"big": _weights()["big"]})
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    path = tmp_path / "short.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(BadInputError, match="holds 16380 bytes of data but dims"):
        modelio.load_model(path, lazy=True)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.onnx"
    path.write_bytes(_model(_weights()).SerializeToString()[:-5000])
    assert wire.embedded_weights(path, lazy_weights.worth_leaving) is None
    with pytest.raises(BadInputError, match="not a valid ONNX protobuf file"):
        modelio.load_model(path, lazy=True)
