"""Reading and writing ONNX files: strict validation with one-line errors, atomic writes.

`load_model` turns every way an input file can be broken into a `BadInputError` whose message
is one line (the structural checks are in `input_checks`), so the CLI can fail fast and clearly
before any long work starts. The file itself is only ever opened for reading. `save_model_atomic` writes through a temporary file in the
target directory and `os.replace`, so a crash or error never leaves a half-written model, and
`check_output_path` lets callers reject an unusable output path before optimizing.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from onnxsat.base import disk_cache, external_data, lazy_weights, wire
from onnxsat.base.errors import BadInputError, OnnxsatError, one_line
from onnxsat.base.input_checks import (
    check_header,
    check_opsets,
    check_structure,
    check_tensor_sizes,
    expected_raw_bytes,
    free_names,
    node_label,
)

__all__ = [
    "MAX_PROTO_BYTES",
    "check_not_an_input",
    "check_output_path",
    "load_model",
    "load_model_and_sources",
    "model_shell",
    "save_model_atomic",
    "topological_nodes",
]

# Protobuf cannot serialize one message of 2 GiB or more; larger models need external data.
MAX_PROTO_BYTES = 2**31 - 1
# Initializers at least this large go to the sidecar file (onnx's own default threshold).
EXTERNAL_SIZE_THRESHOLD = 1024
# Sidecar offsets are aligned so that runtimes can mmap the weights.
_EXTERNAL_ALIGN = 4096


_TENSOR_DATA_FIELDS = frozenset(
    "raw_data float_data int32_data string_data int64_data double_data uint64_data "
    "data_location external_data".split()
)


# ---------------------------------------------------------------------------------------------
# loading


def load_model(path: str | Path, *, load_external_data: bool = True, lazy: bool = False) -> ModelProto:
    """Load and validate an ONNX model, raising `BadInputError` with a one-line message.

    With ``lazy``, large initializers are not read into memory but stay references into their file,
    the model file itself or an external-data file (see `onnxsat.base.lazy_weights`); everything
    in onnxsat that reads, checks, runs or saves a model follows them.

    Beyond `onnx.checker`, this rejects what the checker lets through or reports poorly
    (garbage that parses as protobuf, opsets newer than the installed onnx, cycles, dangling
    names, duplicate producers, initializer data that does not match its dims, external data
    outside the model's directory). A graph whose nodes are acyclic but not in topological order
    is reordered in memory; the file is never written.
    """
    return load_model_and_sources(path, load_external_data=load_external_data, lazy=lazy)[0]


def load_model_and_sources(
    path: str | Path, *, load_external_data: bool = True, lazy: bool = False
) -> tuple[ModelProto, frozenset[Path]]:
    """`load_model`, plus the real paths of every file the model was read from (the model file and
    each external-data file, whatever the tensor's size): what an output must never replace."""
    p = Path(path)
    _check_input_file(p)
    try:
        model = _parse_lazily(p) if lazy else None
        if model is None:
            model = onnx.load_model(str(p), load_external_data=False)
    except OSError as e:
        raise BadInputError(f"{p}: cannot read file ({e.strerror or e})") from e
    except Exception as e:
        raise BadInputError(f"{p}: not a valid ONNX protobuf file ({one_line(e)})") from e

    sources = {Path(os.path.realpath(p))}
    try:
        check_header(model)
        check_opsets(model)
        check_structure(model.graph, frozenset(), "")
        _sort_graphs_in_place(model.graph)
        if load_external_data and _has_external_refs(model):
            sources |= _load_external(model, p.parent, lazy=lazy)
        check_tensor_sizes(model)
        _run_checker(model, p)
    except BadInputError as e:
        raise BadInputError(f"{p}: {e}") from e
    return model, frozenset(sources)


def _parse_lazily(p: Path) -> ModelProto | None:
    """The model of file ``p`` with its large embedded initializers left in the file as lazy
    tensors (`onnxsat.base.wire`); None when it has none or an unusual layout."""
    real = Path(os.path.realpath(p))
    cut = wire.embedded_weights(real, lazy_weights.worth_leaving)
    if cut is None:
        return None
    shell, weights = cut
    model = ModelProto()
    model.ParseFromString(shell)
    for weight in weights:
        ref = external_data.ExternalRef(real, weight.offset, weight.length, real.name, real.parent)
        if not lazy_weights.mark_lazy(model.graph.initializer[weight.index], ref):
            return None  # the parsed tensor is not what the file's layout said: parse it whole
    return model


def _load_external(model: ModelProto, base_dir: Path, *, lazy: bool) -> set[Path]:
    """Read every external tensor through `external_data.resolve` (large main-graph initializers
    only marked when ``lazy``); returns the files read."""
    files: set[Path] = set()
    main = ((f"initializer '{t.name}'", t) for t in model.graph.initializer)
    for lazy_ok, tensors in ((lazy, main), (False, _all_tensors(model.graph))):
        for what, tensor in tensors:
            if not external_data.uses_external_data(tensor) or lazy_weights.is_lazy(tensor):
                continue
            if tensor.data_type == TensorProto.STRING:
                raise BadInputError(f"{what}: STRING tensors cannot be stored as external data")
            expected = expected_raw_bytes(tensor.data_type, math.prod(tensor.dims))
            ref = external_data.resolve(tensor, base_dir, what, expected)
            files.add(ref.path)
            if lazy_ok and lazy_weights.mark_lazy(tensor, ref):
                continue
            try:
                tensor.raw_data = external_data.read_bytes(ref)
            except OSError as e:
                raise BadInputError(f"{what}: cannot read external data ({e.strerror or e})") from e
            del tensor.external_data[:]
            tensor.ClearField("data_location")  # as an in-memory tensor has it
    return files


def _check_input_file(p: Path) -> None:
    if not p.exists():
        raise BadInputError(f"input model not found: {p}")
    if p.is_dir():
        raise BadInputError(f"{p}: is a directory, not an ONNX file")
    if not p.is_file():
        raise BadInputError(f"{p}: is not a regular file")
    try:
        size = p.stat().st_size
    except OSError as e:
        raise BadInputError(f"{p}: cannot read file ({e.strerror or e})") from e
    if size == 0:
        raise BadInputError(f"{p}: file is empty")


def _run_checker(model: ModelProto, p: Path) -> None:
    # full_check adds strict shape and type inference: a model whose declared types or shapes do not
    # fit its ops (Add of float and int64, a Transpose perm of the wrong rank) is bad input, not
    # something for the rewrite rules to trip over later.
    try:
        # Lazy weights point into a placeholder (their files were checked above); else the checker
        # resolves external data relative to the model file only when given a path, and a proto
        # over 2 GiB cannot be handed to its C++ side at all; otherwise check the (possibly
        # reordered) in-memory model.
        if lazy_weights.check_with_placeholders(model, MAX_PROTO_BYTES):
            return
        use_path = _has_external_refs(model) or serialized_size(model) > MAX_PROTO_BYTES
        onnx.checker.check_model(str(p) if use_path else model, full_check=True)
    except Exception as e:
        raise BadInputError(f"invalid ONNX model: {one_line(e)}") from e


# ---------------------------------------------------------------------------------------------
# topological order


def topological_nodes(graph: GraphProto) -> list[NodeProto]:
    """Nodes of `graph` in a topological order that keeps the original order where it can.

    Stable Kahn (ready nodes leave in original index order), so an already sorted graph comes
    back unchanged. Names a node's subgraphs read from the enclosing scope count as its inputs.
    Raises `BadInputError` naming a node on a cycle.
    """
    return [graph.node[i] for i in _topological_order(graph)]


def order_like(graph: GraphProto, reference: GraphProto) -> None:
    """Reorder `graph`'s nodes (in place) to a topological order that follows `reference` (the model
    it was rewritten from) wherever names survived.

    A runtime runs nodes in the order written, and that order decides which tensors are alive
    together (memory reuse, cache): an optimizer should not reshuffle branches it did not touch. A
    node producing a name the reference produces takes that node's position; a new node takes its
    earliest such consumer's (it runs just before it), else its latest producer's (it runs as soon
    as its inputs are there).
    """
    position = {name: i for i, node in enumerate(reference.node) for name in node.output if name}
    nodes = graph.node
    priority: list[float | None] = [
        min((float(position[o]) for o in node.output if o in position), default=None) for node in nodes
    ]
    readers: dict[str, list[int]] = {}
    for idx, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(idx)
    producer = {name: idx for idx, node in enumerate(nodes) for name in node.output if name}
    topological = _topological_order(graph)
    for idx in reversed(topological):  # consumers are settled first
        if priority[idx] is None:
            taken = [priority[r] for o in nodes[idx].output for r in readers.get(o, ())]
            priority[idx] = min((p for p in taken if p is not None), default=None)
    for idx in topological:  # producers are settled first
        if priority[idx] is None:
            taken = [priority[producer[i]] for i in nodes[idx].input if i in producer]
            priority[idx] = max((p for p in taken if p is not None), default=-1.0)
    _reorder_nodes(graph, _topological_order(graph, [p if p is not None else -1.0 for p in priority]))


def _topological_order(graph: GraphProto, priority: Sequence[float] | None = None) -> list[int]:
    """Stable Kahn: of the ready nodes the lowest ``priority`` (default: index) leaves first."""
    nodes = graph.node
    producer: dict[str, int] = {}
    for idx, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer.setdefault(name, idx)
    preds: list[set[int]] = []
    for node in nodes:
        reads = [name for name in node.input if name]
        for _attr, sub in _subgraphs(node):
            reads.extend(sorted(free_names(sub)))
        preds.append({producer[name] for name in reads if name in producer})
    succs: list[list[int]] = [[] for _ in nodes]
    for idx, ps in enumerate(preds):
        for q in ps:
            succs[q].append(idx)
    indegree = [len(ps) for ps in preds]
    key = (lambda i: (priority[i], i)) if priority is not None else (lambda i: (float(i), i))
    ready = [key(idx) for idx, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, idx = heapq.heappop(ready)
        order.append(idx)
        for s in succs[idx]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, key(s))
    if len(order) < len(nodes):
        remaining = set(range(len(nodes))) - set(order)
        # Every unsorted node still has an unsorted predecessor: walk back until a node repeats.
        seen: set[int] = set()
        cur = min(remaining)
        while cur not in seen:
            seen.add(cur)
            cur = min(q for q in preds[cur] if q in remaining)
        raise BadInputError(f"graph has a cycle through node {node_label(nodes[cur], cur)}")
    return order


def _reorder_nodes(graph: GraphProto, order: list[int]) -> None:
    if order != list(range(len(graph.node))):
        reordered = []
        for idx in order:
            copy = NodeProto()
            copy.CopyFrom(graph.node[idx])
            reordered.append(copy)
        del graph.node[:]
        graph.node.extend(reordered)


def _sort_graphs_in_place(graph: GraphProto) -> None:
    _reorder_nodes(graph, _topological_order(graph))
    for node in graph.node:
        for _attr, sub in _subgraphs(node):
            _sort_graphs_in_place(sub)


# ---------------------------------------------------------------------------------------------
# saving


def check_output_path(out: str | Path, inp: str | Path | None = None) -> Path:
    """Fail early (`BadInputError`) if `out` cannot be written or would overwrite the input.

    Meant to be called before long work, so a bad `-o` is reported in seconds. Writability is
    probed by creating and removing a temporary file, which also works when running as root.
    """
    o = Path(out)
    if str(out) == "":
        raise BadInputError("output path is empty")
    if o.is_dir():
        raise BadInputError(f"output path {o} is a directory")
    parent = o.parent
    if not parent.exists():
        raise BadInputError(f"output directory {parent} does not exist")
    if not parent.is_dir():
        raise BadInputError(f"output directory {parent} is not a directory")
    if o.exists() and not o.is_file():
        raise BadInputError(f"output path {o} exists and is not a regular file")
    if inp is not None and _same_file(o, Path(inp)):
        raise BadInputError(f"output path {o} is the input model; refusing to overwrite the input")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".onnxsat-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise BadInputError(f"output directory {parent} is not writable ({e.strerror or e})") from e
    return o


def check_weights_not_overwritten(model: ModelProto, out: Path, *, external_data: bool) -> None:
    """Refuse an output (or its ``.data`` sidecar) that is the file the lazy weights are read from.

    Called before optimizing too, so the refusal comes in seconds, not after the work.
    """
    sources = lazy_weights.source_files(model)
    if any(_same_file(out, src) for src in sources):
        raise BadInputError(f"output path {out} holds the input model's weights")
    sidecar = out.with_name(out.name + ".data")
    if external_data and any(_same_file(sidecar, src) for src in sources):
        raise BadInputError(f"external data path {sidecar} holds the input model's weights")


def check_not_an_input(out: Path, sources: Iterable[Path], *, what: str = "output path") -> None:
    """Refuse an output whose file, or its ``OUT.data`` sidecar, is one of the files the input was
    read from (`load_model_and_sources`: the model and every external-data file, any size).

    The sidecar is compared even without ``--external-data``: a model past 2 GiB gets one
    unasked. Symbolic and hard links are seen through (real paths, then device and inode).
    """
    sources = list(sources)
    sidecar = out.with_name(out.name + ".data")
    for path, label in ((out, what), (sidecar, f"external data path of {what}")):
        hit = next((src for src in sources if _same_file(path, src)), None)
        if hit is not None:
            raise BadInputError(f"{label} {path} is the input's file {hit}; refusing to overwrite the input")


def save_model_atomic(
    model: ModelProto,
    path: str | Path,
    *,
    external_data: bool = False,
    input_path: str | Path | None = None,
    durable: bool = True,
) -> None:
    """Write `model` to `path` atomically (temp file in the same directory, then `os.replace`),
    synced to disk unless not ``durable`` (a temporary copy for onnxruntime or the checker, which
    a crash loses with its directory anyway: syncing a large model's bytes costs seconds).

    With `external_data=True`, or automatically when the model would not fit in one protobuf
    (2 GiB), initializers of at least `EXTERNAL_SIZE_THRESHOLD` bytes go to the sidecar
    `<name>.data`, itself written atomically. `model` is not modified. On failure no temporary
    or partial file is left behind.
    """
    out = check_output_path(path, input_path)
    _reject_external_refs(model)
    use_external = external_data or serialized_size(model) > MAX_PROTO_BYTES
    sidecar = out.with_name(out.name + ".data")
    check_weights_not_overwritten(model, out, external_data=use_external)
    if use_external:
        if sidecar.is_dir():
            raise BadInputError(f"external data path {sidecar} is a directory")
        if input_path is not None and _same_file(sidecar, Path(input_path)):
            raise BadInputError(f"external data path {sidecar} is the input model")

    mode = _new_file_mode(out)
    temps: list[str] = []
    sidecar_existed = sidecar.exists()
    sidecar_replaced = False
    try:
        if use_external:
            data_tmp = _mkstemp_for(sidecar)
            temps.append(data_tmp)
            with open(data_tmp, "wb") as f:
                shell = _externalized_copy(model, f, sidecar.name)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.chmod(data_tmp, mode)
            payload = _serialize(shell)
        model_tmp = _mkstemp_for(out)
        temps.append(model_tmp)
        with open(model_tmp, "wb") as f:
            if use_external:
                f.write(payload)
            else:  # under 2 GiB in all: one file holds it
                _write_inline(model, f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(model_tmp, mode)
        if use_external:
            os.replace(data_tmp, sidecar)
            sidecar_replaced = True
        os.replace(model_tmp, out)
        temps.clear()
        if durable:
            disk_cache.fsync_dir(out.parent)
    except OSError as e:
        if sidecar_replaced and not sidecar_existed:
            with contextlib.suppress(OSError):
                os.unlink(sidecar)
        raise BadInputError(f"cannot write {out}: {e.strerror or one_line(e)}") from e
    finally:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


SHAPE_OPERAND_ELEMENTS = 16
"""Integer tensors up to this many elements are shape operands (shapes, axes, pads, slice bounds),
not weights: see `weight_bytes`."""


def weight_bytes(model: ModelProto) -> int:
    """Bytes of the weights a model carries: its initializers and Constant tensors (from their dims
    and types), less the small int32/int64 vectors (`SHAPE_OPERAND_ELEMENTS`) that are shape
    operands. Opsets before 13 carried those as attributes; a rewrite that turns a Transpose into a
    Reshape adds one, which is program, not weight."""
    tensors = list(model.graph.initializer)
    tensors += [
        a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
    ]
    total = 0
    for tensor in tensors:
        count = math.prod(int(d) for d in tensor.dims)
        if tensor.data_type in (TensorProto.INT64, TensorProto.INT32) and count <= SHAPE_OPERAND_ELEMENTS:
            continue
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            itemsize = 1
        total += count * itemsize
    return total


def serialized_size(model: ModelProto) -> int:
    """Serialized size in bytes, lazy weights inlined (what `save_model_atomic` writes in one file),
    or more than `MAX_PROTO_BYTES` when protobuf refuses to say."""
    try:
        return _encoded_size(model)
    except Exception:  # protobuf raises instead of returning sizes past its 2 GiB limit
        # Each tensor is below the limit on its own: the tensors plus the rest is close enough.
        rest = ModelProto()
        _copy_fields_except(model, rest, {"graph"})
        _copy_fields_except(model.graph, rest.graph, {"initializer"})
        tensors = sum(_inline_size(t) + 8 for t in model.graph.initializer)
        return max(MAX_PROTO_BYTES + 1, rest.ByteSize() + tensors)


def _serialize(model: ModelProto) -> bytes:
    try:
        return model.SerializeToString()
    except Exception as e:
        raise OnnxsatError(f"cannot serialize the model ({one_line(e)})") from e


def _reject_external_refs(model: ModelProto) -> None:
    for what, tensor in _all_tensors(model.graph):
        if external_data.uses_external_data(tensor) and not lazy_weights.is_lazy(tensor):
            raise OnnxsatError(
                f"{what} still refers to external data; load the model with "
                "load_external_data=True before saving it"
            )


def _externalized_copy(model: ModelProto, data_file, location: str) -> ModelProto:
    """A copy of `model` whose large main-graph initializers point into `data_file`.

    Built field by field so that the weights are never held twice and `model` stays untouched.
    """
    shell = ModelProto()
    _copy_fields_except(model, shell, {"graph"})
    _copy_fields_except(model.graph, shell.graph, {"initializer"})
    offset = 0
    for tensor in model.graph.initializer:
        lazy = lazy_weights.is_lazy(tensor)
        raw = b"" if lazy else _raw_bytes(tensor)
        if raw is None or (not lazy and len(raw) < EXTERNAL_SIZE_THRESHOLD):
            shell.graph.initializer.add().CopyFrom(tensor)
            continue
        pad = -offset % _EXTERNAL_ALIGN
        if pad:
            data_file.write(b"\0" * pad)
            offset += pad
        length = lazy_weights.copy_bytes(tensor, data_file) if lazy else len(raw)
        if not lazy:
            data_file.write(raw)
        ext = shell.graph.initializer.add()
        _copy_fields_except(tensor, ext, _TENSOR_DATA_FIELDS)
        ext.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = ext.external_data.add()
            entry.key = key
            entry.value = value
        offset += length
    return shell


def _write_inline(model: ModelProto, out: BinaryIO) -> None:
    """Write the bytes ``model.SerializeToString()`` would give, lazy weights with their bytes,
    one initializer at a time: the model's serialized weights are never all in memory at once (a
    lazy tensor's bytes are streamed from its file)."""
    if not model.HasField("graph"):
        out.write(_serialize(model))
        return
    graph = model.graph
    # Protobuf writes fields in number order: the model's before its graph (7), the graph's
    # before its initializers (5), the tensor's before raw_data (9); then the rest.
    head, tail, graph_head, graph_tail = ModelProto(), ModelProto(), GraphProto(), GraphProto()
    _copy_fields_where(model, head, lambda n: n < 7)
    _copy_fields_where(model, tail, lambda n: n > 7)
    _copy_fields_where(graph, graph_head, lambda n: n < 5)
    _copy_fields_where(graph, graph_tail, lambda n: n > 5)
    sizes = [_inline_size(t) for t in graph.initializer]
    graph_size = graph_head.ByteSize() + graph_tail.ByteSize()
    graph_size += sum(len(wire.len_prefix(5, size)) + size for size in sizes)
    out.write(_serialize(head) + wire.len_prefix(7, graph_size) + _serialize(graph_head))
    for tensor, size in zip(graph.initializer, sizes, strict=True):
        out.write(wire.len_prefix(5, size))
        if not lazy_weights.is_lazy(tensor):
            out.write(_serialize(tensor))
            continue
        before, after = _inline_parts(tensor)
        out.write(_serialize(before) + wire.len_prefix(9, lazy_weights.source(tensor)[2]))
        lazy_weights.copy_bytes(tensor, out)
        out.write(_serialize(after))
    out.write(_serialize(graph_tail) + _serialize(tail))


def _inline_size(tensor: TensorProto) -> int:
    """The serialized size of ``tensor`` with its bytes (a lazy one's read from nowhere)."""
    if not lazy_weights.is_lazy(tensor):
        return tensor.ByteSize()
    before, after = _inline_parts(tensor)
    length = lazy_weights.source(tensor)[2]
    return before.ByteSize() + len(wire.len_prefix(9, length)) + length + after.ByteSize()


def _inline_parts(tensor: TensorProto) -> tuple[TensorProto, TensorProto]:
    """A lazy tensor's fields before and after its raw data (field 9), without the external ones."""
    before, after = TensorProto(), TensorProto()
    external = {"external_data", "data_location"}
    _copy_fields_where(tensor, before, lambda n: n < 9, external)
    _copy_fields_where(tensor, after, lambda n: n > 9, external)
    return before, after


def _raw_bytes(tensor: TensorProto) -> bytes | None:
    """The tensor's little-endian raw bytes, or None for data that cannot be stored externally."""
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    try:
        return onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor)).raw_data
    except Exception:
        return None


def model_shell(model: ModelProto, skip_graph_fields: Iterable[str]) -> ModelProto:
    """A copy of `model` whose main graph lacks the named fields (e.g. node, initializer).

    Rebuilding a graph from a full copy would copy every weight once more (and protobuf keeps
    the replaced data until the whole message is freed); this copies only what is kept.
    """
    shell = ModelProto()
    _copy_fields_except(model, shell, {"graph"})
    _copy_fields_except(model.graph, shell.graph, skip_graph_fields)
    return shell


def _encoded_size(model: ModelProto) -> int:
    """``model.ByteSize()`` with lazy weights inlined, exactly, summed tensor by tensor: protobuf's upb
    backend sizes a message by encoding it, which on a whole model is a transient copy of every weight."""
    if not model.HasField("graph"):
        return model.ByteSize()
    rest = ModelProto()
    _copy_fields_except(model, rest, {"graph"})
    _copy_fields_except(model.graph, rest.graph, {"initializer"})
    tensors = 0
    for tensor in model.graph.initializer:  # field 5 of GraphProto: a one-byte tag, the length, the bytes
        size = _inline_size(tensor)
        tensors += 1 + _varint_size(size) + size
    if not tensors:
        return rest.ByteSize()
    graph = rest.graph.ByteSize() + tensors
    rest.ClearField("graph")
    return rest.ByteSize() + 1 + _varint_size(graph) + graph  # field 7 of ModelProto: a one-byte tag


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _copy_fields_except(src, dst, skip: Iterable[str]) -> None:
    _copy_fields_where(src, dst, lambda _: True, skip)


def _copy_fields_where(src, dst, keep: Callable[[int], bool], skip: Iterable[str] = ()) -> None:
    """Copy the fields of ``src`` whose number ``keep`` accepts and whose name is not in ``skip``."""
    skip = set(skip)
    for field, value in src.ListFields():
        if field.name in skip or not keep(field.number):
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _mkstemp_for(target: Path) -> str:
    """A temp file ``.NAME.PID.RANDOM.tmp`` next to ``target``; first removes such files of writers
    that are gone (a run killed mid-write), so they do not pile up next to the user's files."""
    disk_cache.sweep_temps(target.parent, target.name)
    fd, name = tempfile.mkstemp(
        dir=target.parent, prefix=disk_cache.temp_name_prefix(target.name), suffix=".tmp"
    )
    os.close(fd)
    return name


def _new_file_mode(target: Path) -> int:
    """Keep an existing file's mode; new files get the usual 0o666 minus umask (mkstemp uses 0o600)."""
    with contextlib.suppress(OSError):
        return target.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


# ---------------------------------------------------------------------------------------------
# graph walking

_subgraphs = external_data.subgraphs
_all_tensors = external_data.all_tensors
_has_external_refs = external_data.has_external_refs
