"""An ONNX file in protobuf's wire format: where each embedded weight's bytes lie in the file.

Parsing a model file holds every weight twice while it runs (the file's bytes and the parsed
tensors), and the parsed model once for the whole run; every later copy of the model (folded,
exported, checked) copies every weight again, and protobuf's upb backend sizes a message by
encoding it. `embedded_weights` reads only the file's structure: it walks the wire format of
the model's graph (a memory map: the weights' pages are never touched), and returns the file's
bytes with the large ``raw_data`` fields of main-graph initializers cut out, and where each one
lies. The caller marks those tensors as references into the file (``onnxsat.base.lazy_weights``).

Only the layout every writer produces is taken apart (one graph field, one ``raw_data`` per
tensor, no external-data fields); anything else returns None and the file is parsed whole.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EmbeddedWeight", "embedded_weights", "len_prefix"]

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_RAW_DATA = 1, 2, 9
_TENSOR_EXTERNAL = (13, 14)  # external_data, data_location
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


class _Unusual(Exception):
    """A layout this reader does not take apart (the file is then parsed whole)."""


@dataclass(frozen=True)
class EmbeddedWeight:
    """The raw bytes of the main graph's ``index``-th initializer: ``length`` bytes at ``offset``."""

    index: int
    offset: int
    length: int


Wanted = Callable[[int, tuple[int, ...], int], bool]
"""Whether to leave out a tensor's raw data, given its data type, dims and byte length."""


def embedded_weights(path: Path, wanted: Wanted) -> tuple[bytes, list[EmbeddedWeight]] | None:
    """The model file's bytes without the raw data of the initializers ``wanted`` picks, and where
    those bytes are; None when there are none, or the layout is unusual (then parse the file)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _cut(buf, wanted)
            except (_Unusual, IndexError):
                return None


def len_prefix(number: int, length: int) -> bytes:
    """The tag and length that open a length-delimited field ``number`` of ``length`` bytes."""
    return _varint(number << 3 | _LEN) + _varint(length)


def _cut(buf: mmap.mmap, wanted: Wanted) -> tuple[bytes, list[EmbeddedWeight]] | None:
    graphs = [f for f in _fields(buf, 0, len(buf)) if f[0] == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0][1] != _LEN:
        raise _Unusual
    _, _, field_start, graph_start, graph_end = graphs[0]
    pieces: list[bytes] = []  # the graph's bytes, rebuilt
    found: list[EmbeddedWeight] = []
    index, copied_to = 0, graph_start
    for number, wire, start, value_start, value_end in _fields(buf, graph_start, graph_end):
        if number != _GRAPH_INITIALIZER:
            continue
        if wire != _LEN:
            raise _Unusual
        raw = _raw_data(buf, value_start, value_end, wanted)
        if raw is not None:
            raw_start, raw_value_start, raw_end = raw
            found.append(EmbeddedWeight(index, raw_value_start, raw_end - raw_value_start))
            tensor = buf[value_start:raw_start] + buf[raw_end:value_end]
            pieces += [buf[copied_to:start], len_prefix(_GRAPH_INITIALIZER, len(tensor)), tensor]
            copied_to = value_end
        index += 1
    if not found:
        return None
    pieces.append(buf[copied_to:graph_end])
    graph = b"".join(pieces)
    shell = buf[:field_start] + len_prefix(_MODEL_GRAPH, len(graph)) + graph + buf[graph_end:]
    return shell, found


def _raw_data(buf: mmap.mmap, start: int, end: int, wanted: Wanted) -> tuple[int, int, int] | None:
    """(field start, value start, end) of a tensor's raw data if ``wanted`` picks it, else None."""
    dims: list[int] = []
    data_type = 0
    raw: list[tuple[int, int, int]] = []
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if number in _TENSOR_EXTERNAL:
            return None
        if number == _TENSOR_RAW_DATA and wire == _LEN:
            raw.append((field_start, value_start, value_end))
        elif number == _TENSOR_DATA_TYPE and wire == _VARINT:
            data_type = _read_varint(buf, value_start)[0]
        elif number == _TENSOR_DIMS and wire == _VARINT:
            dims.append(_signed(_read_varint(buf, value_start)[0]))
        elif number == _TENSOR_DIMS and wire == _LEN:  # packed
            pos = value_start
            while pos < value_end:
                value, pos = _read_varint(buf, pos)
                dims.append(_signed(value))
    if len(raw) != 1 or any(d < 0 for d in dims):
        return None
    field_start, value_start, value_end = raw[0]
    return raw[0] if wanted(data_type, tuple(dims), value_end - value_start) else None


def _fields(buf: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, value end) of each field in a message."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value_start = pos
            _, pos = _read_varint(buf, pos)
        elif wire == _LEN:
            length, value_start = _read_varint(buf, pos)
            pos = value_start + length
        elif wire in (_FIXED64, _FIXED32):
            value_start = pos
            pos += 8 if wire == _FIXED64 else 4
        else:  # groups: not in ONNX
            raise _Unusual
        if number == 0 or pos > end:
            raise _Unusual
        yield number, wire, field_start, value_start, pos


def _read_varint(buf: mmap.mmap, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Unusual


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
