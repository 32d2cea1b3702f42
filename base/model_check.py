"""onnx's full checker on a model onnxsat wrote: past protobuf's 2 GiB limit, and held to exactly
what the original passes (a result must not fail a check the input passed)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
from onnx import ModelProto

from . import lazy_weights
from .modelio import MAX_PROTO_BYTES, save_model_atomic, serialized_size
from .weightless import has_large_weights, weightless

_PLACEHOLDER = "weights.placeholder"


def check_model_full(model: ModelProto) -> None:
    """`onnx.checker` with full_check, also past protobuf's 2 GiB limit.

    The checker's C++ side cannot take such a proto in memory, so a large model is checked from a
    temporary external-data copy (written next to nothing the user owns). Lazy weights
    (`onnxsat.base.lazy_weights`) point into a sparse placeholder file instead: the checker reads no
    values, and the real file was checked when the model was loaded.
    """
    if lazy_weights.lazy_initializers(model):
        with tempfile.TemporaryDirectory(prefix="onnxsat-check-") as tmp:
            shell = lazy_weights.placeholder_copy(model, Path(tmp))
            if shell.ByteSize() <= MAX_PROTO_BYTES:
                (Path(tmp) / "model.onnx").write_bytes(shell.SerializeToString())
                onnx.checker.check_model(str(Path(tmp) / "model.onnx"), full_check=True)
                return
    elif serialized_size(model) <= MAX_PROTO_BYTES:
        if not has_large_weights(model):
            onnx.checker.check_model(model, full_check=True)
            return
        # The checker reads no weight values: large weights point into an empty placeholder file
        # instead of being serialized for its C++ side (three copies of every weight).
        with tempfile.TemporaryDirectory(prefix="onnxsat-check-") as tmp:
            (Path(tmp) / _PLACEHOLDER).touch()
            (Path(tmp) / "model.onnx").write_bytes(weightless(model, _PLACEHOLDER).SerializeToString())
            onnx.checker.check_model(str(Path(tmp) / "model.onnx"), full_check=True)
        return
    with tempfile.TemporaryDirectory(prefix="onnxsat-check-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_model_atomic(model, path, external_data=True, durable=False)
        onnx.checker.check_model(str(path), full_check=True)


def check_model_as_original(optimized: ModelProto, original: ModelProto) -> None:
    """`check_model_full` on ``optimized``, held to what ``original`` passes: where the original
    passes the plain checker but fails the full one (onnx's strict shape inference failing on the
    body of a function op it ships, as for MeanVarianceNormalization at opset 13), the result must
    pass the plain checker and fail the full one with the very same message, nothing new."""
    try:
        check_model_full(optimized)
        return
    except Exception as exc:
        failure = exc
    try:
        check_model_full(original)
    except Exception as original_exc:
        if str(original_exc) == str(failure):
            onnx.checker.check_model(original)  # a plain failure of the original is bad input
            onnx.checker.check_model(optimized)
            return
    raise failure
