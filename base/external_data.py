"""Every external-data reference of a model, resolved and checked in one place before a byte is read.

A model file names the files its tensors live in; a hostile one names ``/etc/passwd``, ``../x``,
or ``sub/w.bin`` where ``sub`` is a symbolic link out of the model's directory. `resolve` turns a
reference into the real path of a regular file inside the model's directory (symbolic links of
every component followed), with an offset and length inside that file, or raises
`BadInputError`. Every loader (initializers, Constant attributes, subgraph initializers, sparse
tensors; small and lazy ones alike) goes through it, so there is no second, weaker path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from onnxsat.base.errors import BadInputError

__all__ = ["ALLOWED_KEYS", "ExternalRef", "all_tensors", "read_bytes", "resolve", "uses_external_data"]

ALLOWED_KEYS = frozenset({"location", "offset", "length", "checksum"})
"""The keys of ONNX's external-data spec that a model file may carry; any other (``basepath``
included, which onnx tools never need in a file) is refused, so no key can steer a read."""


@dataclass(frozen=True)
class ExternalRef:
    """A checked reference: ``length`` bytes at ``offset`` of the regular file ``path`` (a real path)."""

    path: Path
    offset: int
    length: int
    location: str
    """The reference as written in the model (relative to ``root``)."""
    root: Path
    """The model's directory (a real path)."""


def uses_external_data(tensor: TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def resolve(tensor: TensorProto, base_dir: Path, what: str, expected_length: int | None) -> ExternalRef:
    """The checked file, offset and length of ``tensor``'s external data, or `BadInputError`.

    ``expected_length`` is the byte count the tensor's dims and type need (None when unknown);
    a declared length must equal it and a missing one defaults to it.
    """
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in ALLOWED_KEYS:
            raise BadInputError(f"{what}: external data key {entry.key[:40]!r} is not allowed")
        if entry.key in info:
            raise BadInputError(f"{what}: external data key {entry.key!r} is given twice")
        info[entry.key] = entry.value
    location = info.get("location", "")
    if not location or "\0" in location:
        raise BadInputError(f"{what}: external data has no valid location")
    rel = Path(location)
    if rel.is_absolute() or ".." in rel.parts:
        raise BadInputError(
            f"{what}: external data location {location!r} must be a relative path inside the model's directory"
        )
    root = Path(os.path.realpath(base_dir))
    real = Path(os.path.realpath(root / rel))
    if real == root or not real.is_relative_to(root):
        raise BadInputError(
            f"{what}: external data location {location!r} resolves outside the model's directory"
        )
    try:
        st = os.stat(real)
    except OSError as e:
        raise BadInputError(
            f"{what}: external data file {location!r} cannot be read ({e.strerror or e})"
        ) from e
    if not stat.S_ISREG(st.st_mode):
        raise BadInputError(f"{what}: external data location {location!r} is not a regular file")
    offset = _count(info.get("offset", "0"), what, "offset")
    length = _count(info["length"], what, "length") if "length" in info else None
    if length is None:
        length = expected_length if expected_length is not None else st.st_size - offset
    if expected_length is not None and length != expected_length:
        raise BadInputError(
            f"{what}: external data declares {length} bytes but its dims and type need {expected_length}"
        )
    if offset + length > st.st_size:
        raise BadInputError(
            f"{what}: external data bytes {offset}..{offset + length} lie past the end of "
            f"{location!r} ({st.st_size} bytes)"
        )
    return ExternalRef(real, offset, length, location, root)


def _count(text: str, what: str, key: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise BadInputError(f"{what}: external data {key} {text[:40]!r} is not a non-negative integer")
    return int(text)


def read_bytes(ref: ExternalRef) -> bytes:
    with open(ref.path, "rb") as f:
        f.seek(ref.offset)
        data = f.read(ref.length)
    if len(data) != ref.length:
        raise BadInputError(f"external data file {ref.location!r} ended early")
    return data


# ---------------------------------------------------------------------------------------------
# where tensors occur


def subgraphs(node: NodeProto) -> Iterator[tuple[str, GraphProto]]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH or attr.HasField("g"):
            yield attr.name, attr.g
        for sub in attr.graphs:
            yield attr.name, sub


def all_tensors(graph: GraphProto) -> Iterator[tuple[str, TensorProto]]:
    """(label, tensor) for every tensor a graph holds: initializers, sparse initializers, tensor and
    sparse-tensor attributes, in the graph and all its subgraphs (If/Loop/Scan bodies)."""
    for tensor in graph.initializer:
        yield f"initializer '{tensor.name}'", tensor
    for sparse in graph.sparse_initializer:
        yield f"sparse initializer '{sparse.values.name}' (values)", sparse.values
        yield f"sparse initializer '{sparse.values.name}' (indices)", sparse.indices
    for idx, node in enumerate(graph.node):
        label_node = f"'{node.name}' ({node.op_type})" if node.name else f"#{idx} ({node.op_type})"
        for attr in node.attribute:
            label = f"tensor attribute '{attr.name}' of node {label_node}"
            if attr.HasField("t"):
                yield label, attr.t
            for tensor in attr.tensors:
                yield label, tensor
            if attr.HasField("sparse_tensor"):
                yield label + " (values)", attr.sparse_tensor.values
                yield label + " (indices)", attr.sparse_tensor.indices
            for sparse in attr.sparse_tensors:
                yield label + " (values)", sparse.values
                yield label + " (indices)", sparse.indices
        for _attr, sub in subgraphs(node):
            yield from all_tensors(sub)


def has_external_refs(model: ModelProto) -> bool:
    return any(uses_external_data(t) for _what, t in all_tensors(model.graph))
