"""A model's structure without its large weight bytes, for passes that read no weight values.

ONNX shape inference takes a ModelProto, serializes it for its C++ side and parses the result
back: on a whole model that is three transient copies of every weight (a 436 MB BERT peaked
1.3 GB above its own size in shape inference alone). Shape inference reads initializers' types
and dims, and values only of shape-like inputs (Reshape's shape, Slice's starts, ...), which are
small. So `infer_shapes` runs it on a shell whose large main-graph initializers are external
references to a file that does not exist: the same dims and dtype, no bytes. Large means what
stays in its file when a model is loaded lazily (`onnxsat.base.lazy_weights.worth_leaving`: a MiB
for a type that may be a size, 4 KiB for others). A pass that did read such a value fails on that
node as it does for weights kept in their file, never on invented values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from .lazy_weights import worth_leaving
from .modelio import model_shell

_MISSING = "onnxsat-weightless.absent"


def weightless(model: ModelProto, location: str = _MISSING) -> ModelProto:
    """A copy of ``model`` whose large main-graph initializers carry dims and dtype but no bytes
    (copied one tensor at a time: the peak is one tensor, not the model); their external data is
    at ``location`` (by default a file that does not exist)."""
    shell = model_shell(model, {"initializer"})
    for tensor in model.graph.initializer:
        copy = shell.graph.initializer.add()
        if not _large(tensor):
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type, copy.doc_string = tensor.name, tensor.data_type, tensor.doc_string
        copy.dims.extend(tensor.dims)
        copy.data_location = TensorProto.EXTERNAL
        entry = copy.external_data.add()
        entry.key, entry.value = "location", location
    return shell


def stripped(model: ModelProto) -> list[TensorProto]:
    """The initializers `weightless` leaves without bytes, in order."""
    return [t for t in model.graph.initializer if _large(t)]


def has_large_weights(model: ModelProto) -> bool:
    """Whether `weightless` leaves out any bytes of ``model``."""
    return any(_large(t) for t in model.graph.initializer)


def _large(tensor: TensorProto) -> bool:
    """Raw bytes of a plain dtype that `worth_leaving` out, judged from dims (reading ``raw_data``
    or its size would copy it); strings in raw_data are left for the checker to refuse."""
    if not tensor.HasField("raw_data") or tensor.data_type == TensorProto.STRING:
        return False
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # packed and unknown types: kept whole
        return False
    dims = tuple(tensor.dims)
    return worth_leaving(tensor.data_type, dims, math.prod(dims) * itemsize)


def restore_weights(shell: ModelProto, model: ModelProto) -> bool:
    """Put ``model``'s bytes back into the initializers a pass kept from `weightless` ``model``
    (matched by name, dtype and dims); False, and ``shell`` half restored, when one is unmatched."""
    originals = {t.name: t for t in model.graph.initializer if _large(t)}
    for tensor in shell.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL or not any(e.value == _MISSING for e in tensor.external_data):
            continue
        original = originals.get(tensor.name)
        if original is None or original.data_type != tensor.data_type or list(original.dims) != list(tensor.dims):
            return False
        tensor.CopyFrom(original)
    return True


def infer_shapes(model: ModelProto, **kwargs: Any) -> ModelProto:
    """``onnx.shape_inference.infer_shapes(model, **kwargs)`` on `weightless` ``model``: the same
    value infos, inputs and outputs; its large initializers have no bytes (read only its types)."""
    return onnx.shape_inference.infer_shapes(weightless(model), **kwargs)
