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

    The checker reads no weight values, and serializing them for its C++ side would be three
    copies of every weight: lazy weights (`onnxsat.base.lazy_weights`, whose file was checked when
    the model was loaded) and large in-memory ones point into placeholder files instead. A model
    still too large for one proto is checked from a temporary external-data copy (written next to
    nothing the user owns).
    """
    if lazy_weights.lazy_initializers(model) or has_large_weights(model):
        if lazy_weights.check_with_placeholders(model, MAX_PROTO_BYTES, _strip_large):
            return
    elif serialized_size(model) <= MAX_PROTO_BYTES:
        onnx.checker.check_model(model, full_check=True)
        return
    with tempfile.TemporaryDirectory(prefix="onnxsat-check-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_model_atomic(model, path, external_data=True, durable=False)
        onnx.checker.check_model(str(path), full_check=True)


def _strip_large(model: ModelProto, directory: Path) -> ModelProto:
    (directory / _PLACEHOLDER).touch()
    return weightless(model, _PLACEHOLDER)


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
