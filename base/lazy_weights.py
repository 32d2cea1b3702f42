"""Weights that stay in their file while a model is optimized.

Loading a model's weights into the ModelProto and then copying protos (import, export, fold, the
optimized model next to the original) would hold them several times over, and protobuf's upb
backend even sizes a message by encoding it. Instead ``load_model(..., lazy=True)`` leaves each
large main-graph initializer, embedded in the model file (found by `onnxsat.base.wire`) or in an
external-data file, as an external reference marked with the real directory its location is
relative to, under a key that holds a random token of this process (`BASE_KEY`): a model file
cannot forge the marker, and `onnxsat.base.external_data` refuses any key outside ONNX's spec on load.
Such a *lazy* tensor costs a few bytes to copy; its values are read only where a value is needed
(`tensor_array`), onnxruntime reads it from the file (`ort_model`), and saving streams its bytes
from the source file (`copy_bytes`). The marker never reaches a written file, the checker or onnxruntime.
"""

from __future__ import annotations

import math
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from onnxsat.base.external_data import ExternalRef

BASE_KEY = f"onnxsat-lazy-{secrets.token_hex(16)}"
"""The lazy marker's key: unknown outside this process, so no file can carry it."""
LAZY_MIN_BYTES = 1 << 20
"""Smaller tensors are loaded: shape-like constants must be readable by shape inference."""
WEIGHT_LAZY_MIN_BYTES = 4096
"""Tensors of other types than `SIZE_TYPES` stay in their file from this size on: no op reads a float
(or int8, bool) tensor as a size, and a decoder's weights are many tensors below a MiB."""
SIZE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
"""Types whose tensors may be read as sizes (shapes, axes, indices)."""
_CHUNK = 64 << 20

_PACKED = {
    getattr(TensorProto, n)
    for n in "INT4 UINT4 FLOAT4E2M1 INT2 UINT2 FLOAT6E2M3 FLOAT6E3M2 STRING UNDEFINED".split()
    if hasattr(TensorProto, n)
}


def _info(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _plain_dtype(data_type: int) -> np.dtype | None:
    """Little-endian numpy dtype whose bytes are the tensor's raw bytes, or None."""
    if data_type in _PACKED:
        return None
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:
        return None
    return dt.newbyteorder("<") if dt.kind in "fiucb" else None


def worth_leaving(data_type: int, dims: tuple[int, ...], length: int) -> bool:
    """Whether a tensor of ``length`` raw bytes stays in its file: a plain dtype whose length is
    dims x itemsize, at least `LAZY_MIN_BYTES` for `SIZE_TYPES` and `WEIGHT_LAZY_MIN_BYTES` otherwise."""
    dt = _plain_dtype(data_type)
    if dt is None or length != math.prod(dims) * dt.itemsize:
        return False
    return length >= (LAZY_MIN_BYTES if data_type in SIZE_TYPES else WEIGHT_LAZY_MIN_BYTES)


def mark_lazy(tensor: TensorProto, ref: ExternalRef) -> bool:
    """Mark a tensor whose bytes are at ``ref`` as lazy if `worth_leaving`; False leaves it to be
    loaded.

    ``ref`` is its reference as `external_data.resolve` checked it (a regular file inside the
    model's directory, symbolic links followed; offset and length within the file), or the
    ``raw_data`` of an initializer embedded in the model file (``onnxsat.base.wire``).
    """
    if not worth_leaving(tensor.data_type, tuple(tensor.dims), ref.length):
        return False
    tensor.data_location = TensorProto.EXTERNAL
    _set_external(tensor, [("location", ref.location), ("offset", str(ref.offset)), ("length", str(ref.length))])
    entry = tensor.external_data.add()
    entry.key, entry.value = BASE_KEY, str(ref.root)
    return True


def adopt_key(key: str) -> None:
    """Use ``key`` (the parent's `BASE_KEY`, sent over the worker's own pipe) as this process's
    marker: a worker process (``onnxsat.jobs``) then reads the lazy tensors of the parts it is
    sent. A file still cannot carry it: the key is never written."""
    global BASE_KEY
    if not key.startswith("onnxsat-lazy-"):
        raise ValueError("not a lazy-weight marker key")
    BASE_KEY = key


def is_lazy(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL and any(
        e.key == BASE_KEY for e in tensor.external_data
    )


def lazy_initializers(model: ModelProto) -> list[TensorProto]:
    """The main graph's lazy initializers (only those are ever marked)."""
    return [t for t in model.graph.initializer if is_lazy(t)]


def lazy_bytes(model: ModelProto) -> int:
    return sum(source(t)[2] for t in lazy_initializers(model))


def source(tensor: TensorProto) -> tuple[Path, int, int]:
    """(file, offset, length) of a lazy tensor's bytes."""
    info = _info(tensor)
    return Path(info[BASE_KEY]) / info["location"], int(info.get("offset", "0")), int(info["length"])


def tensor_array(tensor: TensorProto) -> np.ndarray:
    """The tensor's values (read from its file when lazy; `numpy_helper.to_array` otherwise)."""
    if not is_lazy(tensor):
        return numpy_helper.to_array(tensor)
    path, offset, length = source(tensor)
    dt = _plain_dtype(tensor.data_type)
    assert dt is not None  # mark_lazy checked it
    array = np.fromfile(path, dtype=dt, count=length // dt.itemsize, offset=offset)
    return array.astype(dt.newbyteorder("="), copy=False).reshape(tuple(tensor.dims))


def read_bytes(tensor: TensorProto) -> bytes:
    path, offset, length = source(tensor)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def copy_bytes(tensor: TensorProto, out: BinaryIO) -> int:
    """Stream a lazy tensor's bytes into ``out`` in chunks; returns the byte count."""
    path, offset, length = source(tensor)
    left = length
    with open(path, "rb") as f:
        f.seek(offset)
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"{path} ended before the {length} bytes of {tensor.name!r}")
            out.write(chunk)
            left -= len(chunk)
    return length


def source_files(model: ModelProto) -> set[Path]:
    return {source(t)[0] for t in lazy_initializers(model)}


def unmarked_copy(model: ModelProto) -> ModelProto:
    """A copy without the lazy marker: lazy tensors stay external references relative to their
    file's directory (what onnxruntime is given next to the mapped bytes)."""
    shell = ModelProto()
    shell.CopyFrom(model)
    for tensor in lazy_initializers(shell):
        _set_external(tensor, [(e.key, e.value) for e in tensor.external_data if e.key != BASE_KEY])
    return shell


def check_with_placeholders(
    model: ModelProto,
    max_proto_bytes: int,
    strip: Callable[[ModelProto, Path], ModelProto] | None = None,
) -> bool:
    """``onnx.checker`` (full check) on a `placeholder_copy` of ``model``, its other large weights
    also left out by ``strip`` (given the copy and a directory for placeholder files); False,
    checking nothing, when neither leaves anything out or the copy is past ``max_proto_bytes``."""
    if not lazy_initializers(model) and strip is None:
        return False
    with tempfile.TemporaryDirectory(prefix="onnxsat-check-") as tmp:
        shell = placeholder_copy(model, Path(tmp))
        if strip is not None:
            shell = strip(shell, Path(tmp))
        if shell.ByteSize() > max_proto_bytes:
            return False
        (Path(tmp) / "model.onnx").write_bytes(shell.SerializeToString())
        onnx.checker.check_model(str(Path(tmp) / "model.onnx"), full_check=True)
    return True


def placeholder_copy(model: ModelProto, directory: Path) -> ModelProto:
    """A copy for the structural checker, to be saved in ``directory``: every lazy tensor points
    into one sparse file of zeros there (no disk used, no values read: the checker checks only
    that the data exists and fits the dims; the real file was checked when the model was loaded)."""
    shell = ModelProto()
    shell.CopyFrom(model)
    longest = 0
    for tensor in lazy_initializers(shell):
        length = source(tensor)[2]
        longest = max(longest, length)
        _set_external(tensor, [("location", _PLACEHOLDER), ("offset", "0"), ("length", str(length))])
    with open(directory / _PLACEHOLDER, "wb") as f:
        f.truncate(longest)
    return shell


_PLACEHOLDER = "lazy_weights.placeholder"


def _set_external(tensor: TensorProto, entries: list[tuple[str, str]]) -> None:
    del tensor.external_data[:]
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def ort_model(model: ModelProto) -> tuple[bytes, str]:
    """What onnxruntime needs to run a model with lazy weights without a copy of them: the
    serialized shell and the directory its external locations are relative to (for the session
    option ``session.model_external_initializers_file_folder_path``; onnxruntime then maps the
    file itself, which a memory map handed over with ``add_external_initializers`` does not
    avoid: it copies those)."""
    bases = {_info(t)[BASE_KEY] for t in lazy_initializers(model)}
    if len(bases) != 1:
        raise ValueError(f"lazy weights must come from one directory, not {sorted(bases)}")
    return unmarked_copy(model).SerializeToString(), bases.pop()


__all__ = [
    "LAZY_MIN_BYTES",
    "SIZE_TYPES",
    "WEIGHT_LAZY_MIN_BYTES",
    "check_with_placeholders",
    "copy_bytes",
    "is_lazy",
    "lazy_bytes",
    "lazy_initializers",
    "mark_lazy",
    "ort_model",
    "read_bytes",
    "source_files",
    "tensor_array",
    "placeholder_copy",
    "unmarked_copy",
    "worth_leaving",
]
