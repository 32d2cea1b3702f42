"""Structural checks of an input model before any work: header, opsets, graph structure (names
defined before use, no duplicate outputs), and tensor data sizes; each failure is a one-line
`BadInputError` (``modelio.load_model`` runs them)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from onnxsat.base import external_data
from onnxsat.base.errors import BadInputError, one_line

_subgraphs = external_data.subgraphs
_all_tensors = external_data.all_tensors


_DEFAULT_DOMAINS = ("", "ai.onnx")

# Types whose raw data is bit-packed: bits per element.
_PACKED_BITS: dict[int, int] = {
    getattr(TensorProto, name): bits
    for name, bits in (
        ("INT4", 4),
        ("UINT4", 4),
        ("FLOAT4E2M1", 4),
        ("INT2", 2),
        ("UINT2", 2),
        ("FLOAT6E2M3", 6),
        ("FLOAT6E3M2", 6),
    )
    if hasattr(TensorProto, name)
}

# Typed (non-raw) storage: data type -> (field, values per element).
_TYPED_FIELD: dict[int, tuple[str, int]] = {
    TensorProto.FLOAT: ("float_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1),
    TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    TensorProto.STRING: ("string_data", 1),
    **{
        getattr(TensorProto, name): ("int32_data", 1)
        for name in (
            "INT32 INT16 INT8 UINT16 UINT8 BOOL FLOAT16 BFLOAT16 "
            "FLOAT8E4M3FN FLOAT8E4M3FNUZ FLOAT8E5M2 FLOAT8E5M2FNUZ FLOAT8E8M0"
        ).split()
        if hasattr(TensorProto, name)
    },
}


def check_header(model: ModelProto) -> None:
    """A graph with outputs and an IR version the installed onnx reads: what parsed bytes need to be a model."""
    # Arbitrary bytes can parse as a protobuf with only unknown fields; a real model has these.
    if not model.HasField("graph"):
        raise BadInputError("not an ONNX model (no graph)")
    if model.ir_version <= 0:
        raise BadInputError("not an ONNX model (no ir_version)")
    if model.ir_version > onnx.IR_VERSION:
        raise BadInputError(
            f"model IR version {model.ir_version} is newer than the installed onnx "
            f"{onnx.__version__} supports (up to {onnx.IR_VERSION})"
        )
    if len(model.graph.output) == 0:
        raise BadInputError("graph has no outputs")


def _norm_domain(domain: str) -> str:
    return "" if domain in _DEFAULT_DOMAINS else domain


def _known_domain_versions() -> dict[str, int]:
    """Newest opset the installed onnx knows per domain it defines (default domain always)."""
    known: dict[str, int] = {}
    version_map = getattr(onnx.defs, "C", None)
    if version_map is not None and hasattr(version_map, "schema_version_map"):
        known = {_norm_domain(d): hi for d, (_lo, hi) in version_map.schema_version_map().items()}
    known[""] = onnx.defs.onnx_opset_version()
    return known


def check_opsets(model: ModelProto) -> None:
    """No opset newer than the installed onnx knows, and every node's domain imported."""
    known = _known_domain_versions()
    imported: set[str] = set()
    for opset in model.opset_import:
        domain = _norm_domain(opset.domain)
        imported.add(domain)
        newest = known.get(domain)
        if newest is not None and opset.version > newest:
            label = "the default ONNX domain" if domain == "" else f"domain '{domain}'"
            raise BadInputError(
                f"model uses opset {opset.version} of {label}; the installed onnx {onnx.__version__} "
                f"knows opsets up to {newest}"
            )
    for graph in _all_graphs(model.graph):
        for idx, node in enumerate(graph.node):
            domain = _norm_domain(node.domain)
            if domain not in imported:
                shown = "ai.onnx" if domain == "" else domain
                raise BadInputError(
                    f"node {node_label(node, idx)} uses op domain '{shown}', which has no opset_import entry"
                )


def check_structure(graph: GraphProto, outer: frozenset[str], where: str) -> None:
    """Every name read is defined exactly once: in scope, as an input/initializer or by one node."""
    defined = _graph_defined_names(graph)
    producers: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for name in node.output:
            if not name:  # an omitted optional output
                continue
            if name in producers:
                first = graph.node[producers[name]]
                raise BadInputError(
                    f"{where}tensor '{name}' is produced by two nodes: "
                    f"{node_label(first, producers[name])} and {node_label(node, idx)}"
                )
            if name in defined:
                raise BadInputError(
                    f"{where}tensor '{name}' is produced by node {node_label(node, idx)} but is "
                    "also a graph input or initializer"
                )
            producers[name] = idx
    available = outer | defined | producers.keys()
    for idx, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in available:  # "" marks an omitted optional input
                raise BadInputError(
                    f"{where}node {node_label(node, idx)} reads '{name}', which is not a graph "
                    "input, initializer or node output"
                )
        for attr_name, sub in _subgraphs(node):
            check_structure(
                sub, available, f"{where}in subgraph '{attr_name}' of node {node_label(node, idx)}: "
            )
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
            if any(d < 0 for d in dims):
                raise BadInputError(f"{where}'{vi.name}' is declared with a negative dim: {dims}")
    listed: set[str] = set()
    for out in graph.output:
        if out.name in listed:
            raise BadInputError(f"{where}graph output '{out.name}' is listed twice")
        listed.add(out.name)
        if out.name not in available:
            raise BadInputError(
                f"{where}graph output '{out.name}' is not produced by any node, input or initializer"
            )


def check_tensor_sizes(model: ModelProto) -> None:
    """Every tensor's data (raw or typed, in every graph) as large as its dims and type say."""
    for what, tensor in _all_tensors(model.graph):
        _check_tensor_data(tensor, what)


def _check_tensor_data(t: TensorProto, what: str) -> None:
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise BadInputError(f"{what} has negative dims {dims}")
    count = math.prod(dims)
    type_name = _type_name(t.data_type)
    if external_data.uses_external_data(t):
        info = {e.key: e.value for e in t.external_data}
        expected = expected_raw_bytes(t.data_type, count)
        length = info.get("length")
        if length is not None and expected is not None and length.isdigit() and int(length) != expected:
            raise BadInputError(
                f"{what} declares {length} bytes of external data but dims {dims} of "
                f"type {type_name} need {expected}"
            )
        return
    if t.HasField("raw_data"):
        expected = expected_raw_bytes(t.data_type, count)
        if expected is not None and len(t.raw_data) != expected:
            raise BadInputError(
                f"{what} holds {len(t.raw_data)} bytes of data but dims {dims} of "
                f"type {type_name} need {expected}"
            )
        return
    field = _TYPED_FIELD.get(t.data_type)
    if field is not None:
        name, per_element = field
        have = len(getattr(t, name))
        if have != count * per_element:
            raise BadInputError(
                f"{what} holds {have} values in {name} but dims {dims} of type "
                f"{type_name} need {count * per_element}"
            )
        return
    try:  # rare packed types stored in typed fields: let numpy_helper decode them
        size = onnx.numpy_helper.to_array(t).size
    except Exception as e:
        raise BadInputError(f"{what} has data that does not match dims {dims}: {one_line(e)}") from e
    if size != count:
        raise BadInputError(f"{what} holds {size} values but dims {dims} need {count}")


def expected_raw_bytes(data_type: int, count: int) -> int | None:
    """Bytes of raw data for `count` elements, or None when the type has no raw form we know."""
    bits = _PACKED_BITS.get(data_type)
    if bits is not None:
        return math.ceil(count * bits / 8)
    if data_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except Exception:
        return None
    return count * itemsize


def _type_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def _all_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    yield graph
    for node in graph.node:
        for _attr, sub in _subgraphs(node):
            yield from _all_graphs(sub)


def _graph_defined_names(graph: GraphProto) -> set[str]:
    names = {vi.name for vi in graph.input}
    names.update(t.name for t in graph.initializer)
    names.update(s.values.name for s in graph.sparse_initializer)
    return names


def free_names(graph: GraphProto) -> set[str]:
    """Names a (sub)graph reads from its enclosing scopes."""
    defined = _graph_defined_names(graph)
    used: set[str] = set()
    for node in graph.node:
        defined.update(name for name in node.output if name)
        used.update(name for name in node.input if name)
        for _attr, sub in _subgraphs(node):
            used.update(free_names(sub))
    used.update(out.name for out in graph.output)
    return used - defined


def node_label(node: NodeProto, idx: int) -> str:
    """A node as an error message names it: its name, else its index, with its op."""
    return f"'{node.name}' ({node.op_type})" if node.name else f"#{idx} ({node.op_type})"
