"""The whole compiled artefact of one model signature on disk: every kernel's object code and which
function each kernel runs, found again without building or compiling any LLVM IR.

The key covers what decides the code: the model's content (``model_digest``), the input shapes
and shape-deciding values, the code-changing compile options, the host CPU and LLVM/llvmlite/
onnxsat versions (``HostTarget.fingerprint``) and the source of the lowering and kernels packages
(an edited checkout never replays code built by other sources under the same version). Entries go
through ``onnxsat.base.disk_cache`` (checksummed, private, atomic); a damaged one is removed with a
warning and the model is compiled again. The payload is a JSON manifest line and the objects:
bytes, never a pickle.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxsat.base import disk_cache

from .compile_options import CompileOptions
from .jit import code_fingerprint, host_target

FORMAT = 1
SUFFIX = ".artefact"


@dataclass(frozen=True)
class Artefact:
    symbols: dict[str, str]
    """Kernel name -> the function (in ``objects``) that runs it."""
    objects: list[bytes]


def model_digest(model: onnx.ModelProto) -> str:
    """sha256 of the model's content, field by field (a model past protobuf's 2 GiB cannot be
    serialized whole); weights are hashed from their bytes, not serialized again (3x faster)."""
    h = hashlib.sha256()
    _digest_fields(h, model, "", skip="graph")
    _digest_fields(h, model.graph, "graph.", skip="initializer")
    for tensor in model.graph.initializer:
        _digest_tensor(h, tensor)
    return h.hexdigest()


def _digest_tensor(h: Any, tensor: onnx.TensorProto) -> None:
    """A weight by name, type, dims and values, whatever field holds them (raw bytes or number
    lists; a model saved with external data and loaded back has the same digest)."""
    h.update(f"initializer|{tensor.name}|{tensor.data_type}|{list(tensor.dims)}|".encode())
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        data = b"".join(e.SerializeToString(deterministic=True) for e in tensor.external_data)
    elif tensor.HasField("raw_data"):
        data = tensor.raw_data
    elif tensor.data_type == onnx.TensorProto.STRING:
        data = b"\0".join(tensor.string_data)
    else:
        data = np.ascontiguousarray(numpy_helper.to_array(tensor)).tobytes()
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _digest_fields(h: Any, message: Any, prefix: str, skip: str = "") -> None:
    for fd, value in message.ListFields():
        if fd.name == skip:
            continue
        h.update((prefix + fd.name).encode())
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if repeated and fd.message_type is None and len(value) and isinstance(value[0], (int, float)):
            data = np.asarray(value, dtype=np.float64 if isinstance(value[0], float) else np.int64).tobytes()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)  # float_data, int64_data, dims...: one array, not one repr per number
            continue
        for item in value if repeated else [value]:
            if isinstance(item, bytes):
                data = item
            elif hasattr(item, "SerializeToString"):
                data = item.SerializeToString(deterministic=True)
            else:
                data = repr(item).encode()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)


def signature_digest(shapes: Mapping[str, tuple[int, ...]], known: Mapping[str, np.ndarray]) -> str:
    """The input shapes and shape-deciding input values one executable is specialized on."""
    h = hashlib.sha256(repr(sorted(shapes.items())).encode())
    for name, value in sorted(known.items()):
        arr = np.ascontiguousarray(value)
        h.update(f"{name}|{arr.dtype}|{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def artefact_key(model_hash: str, signature: str, options: CompileOptions) -> str:
    parts = (
        f"artefact-v{FORMAT}",
        model_hash,
        signature,
        options.code_key(),
        host_target().fingerprint,
        code_fingerprint(),
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def exists(directory: Path | None, key: str) -> bool:
    """Whether an entry for ``key`` is on disk (it may still turn out damaged when read)."""
    return directory is not None and (directory / f"{key}{SUFFIX}").is_file()


def load(directory: Path, key: str) -> Artefact | None:
    """The artefact stored under ``key``, or None (missing, or damaged: removed, with a warning)."""
    path = directory / f"{key}{SUFFIX}"
    payload = disk_cache.read(path, warn=True)
    if payload is None:
        return None
    try:
        head, _, rest = payload.partition(b"\n")
        manifest = json.loads(head)
        sizes = [int(n) for n in manifest["sizes"]]
        symbols = {str(k): str(v) for k, v in manifest["symbols"].items()}
        if manifest.get("format") != FORMAT or sum(sizes) != len(rest):
            raise ValueError("manifest does not match the objects")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"cache entry {path} is unreadable ({exc}): removed, rebuilding it", stacklevel=2)
        path.unlink(missing_ok=True)
        return None
    objects, at = [], 0
    for n in sizes:
        objects.append(rest[at : at + n])
        at += n
    return Artefact(symbols, objects)


def store(directory: Path, key: str, artefact: Artefact) -> bool:
    """Write ``artefact`` under ``key`` (False when it could not be written: a later compile rebuilds it)."""
    manifest = {"format": FORMAT, "symbols": artefact.symbols, "sizes": [len(o) for o in artefact.objects]}
    return disk_cache.write(
        directory / f"{key}{SUFFIX}", json.dumps(manifest).encode() + b"\n" + b"".join(artefact.objects)
    )
