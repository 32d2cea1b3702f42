"""The inputs a model is verified on: generated from its declarations, or the user's own samples.

Random values suit data operands, not the operands ops read as sizes (a Reshape shape, Resize
scales, Slice bounds, reduction axes, split lengths, a divisor): random integers there make
onnxruntime refuse the original model itself. `make_inputs` derives valid values for inputs that
feed such operands directly, from the consumer and the shapes it sees; `load_samples` reads the
user's ``--verify-inputs`` files instead (onnx-simplifier's ``--test-input`` convention: one .npz
per sample, arrays named after the inputs). `check_verifiable` rejects in milliseconds what no
run could check: types that cannot be fed, and declared sizes no machine here can allocate.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto

from onnxsat.base import modelio
from onnxsat.base.errors import BadInputError, UnverifiableError, one_line
from onnxsat.base.options import Options
from onnxsat.base.weightless import infer_shapes

__all__ = [
    "check_verifiable",
    "dim_assignments",
    "load_samples",
    "make_inputs",
    "prepare_samples",
    "true_inputs",
]

_FLOAT_TYPES: dict[int, type] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
}
_INT_TYPES: dict[int, type] = {
    TensorProto.INT8: np.int8,
    TensorProto.INT16: np.int16,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
    TensorProto.UINT8: np.uint8,
    TensorProto.UINT16: np.uint16,
    TensorProto.UINT32: np.uint32,
    TensorProto.UINT64: np.uint64,
}
_GENERATED = {*_FLOAT_TYPES, *_INT_TYPES, TensorProto.BOOL, TensorProto.STRING}
# Integer inputs that index nothing we can see get values in [0, _DEFAULT_INT_HIGH).
_DEFAULT_INT_HIGH = 4
_MEMORY_SHARE = 4
"""Generated inputs (all seeds) and any one declared tensor may use at most 1/4 of physical memory."""


def _memory_budget() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // _MEMORY_SHARE
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _type_name(elem_type: int) -> str:
    return (
        TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    )


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except Exception:
        return 1


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):,.1f} GiB"


def true_inputs(model: ModelProto) -> list[ValueInfoProto]:
    """Graph inputs that are not initializers (those keep their default when not fed)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    return [vi for vi in graph.input if vi.name not in initializers]


# ---------------------------------------------------------------------------------------------
# up-front checks


def pinned_dims(model: ModelProto, options: Options) -> dict[str, int]:
    """Symbol name -> value from ``--input-shape`` pins, so verification uses the pinned sizes."""
    dims: dict[str, int] = {}
    for vi in model.graph.input:
        pinned = options.input_shapes.get(vi.name)
        if pinned is None:
            continue
        for d, value in zip(vi.type.tensor_type.shape.dim, pinned, strict=False):
            if d.dim_param:
                dims[d.dim_param] = int(value)
    return dims


def prepare_samples(model: ModelProto, options: Options) -> list[dict[str, Any]]:
    """The user's samples (``verify_inputs`` files, then ``verify_samples``), checked against the
    model, after `check_verifiable` (skipped where a region-wise check or ``allow_unverified`` may
    still let the model through). Cheap: called before any work, by the CLI and the pipeline."""
    samples = load_samples(model, options.verify_inputs)
    samples += [check_sample(model, s, "verify_samples") for s in options.verify_samples]
    has_custom = any(n.domain not in ("", "ai.onnx") for n in model.graph.node)
    if not (has_custom or options.allow_unverified):
        check_verifiable(
            model, pinned_dims(model, options), seeds=len(options.verify_seeds), samples_given=bool(samples)
        )
    return samples


def check_verifiable(
    model: ModelProto,
    dim_values: Mapping[str, int] | None = None,
    *,
    seeds: int = 2,
    samples_given: bool = False,
) -> None:
    """Raise `UnverifiableError` for what no verification run could check, before any work.

    Without samples: inputs that are not tensors, of types that cannot be generated, or whose
    generated values (``seeds`` of them) would not fit in memory. Always: a declared or inferred
    tensor (ConstantOfShape, Expand, any node output) too large to allocate, which the original
    model could not compute here either.
    """
    budget = _memory_budget()
    if not samples_given:
        symbols = dict(dim_values or {})
        total = 0
        for vi in true_inputs(model):
            kind = vi.type.WhichOneof("value")
            if kind != "tensor_type":
                raise UnverifiableError(
                    f"input '{vi.name}' is a {kind or 'value of unknown type'}, not a tensor"
                )
            elem_type = vi.type.tensor_type.elem_type
            if elem_type not in _GENERATED:
                raise UnverifiableError(
                    f"input '{vi.name}' has type {_type_name(elem_type)}, which cannot be generated"
                )
            shape = _concrete_shape(vi, symbols)
            nbytes = math.prod(shape) * _itemsize(elem_type) * max(seeds, 1)
            total += nbytes
            if total > budget:
                raise UnverifiableError(
                    f"input '{vi.name}' of shape {list(shape)} needs {_gib(nbytes)} of random values, more than"
                    f" {_gib(budget)} (pin smaller sizes with --input-shape)"
                )
    for name, op, nbytes in _oversized_tensors(model, budget):
        raise UnverifiableError(f"tensor '{name}' ({op}) would hold {_gib(nbytes)}, more than {_gib(budget)}")


def _oversized_tensors(model: ModelProto, budget: int) -> list[tuple[str, str, int]]:
    """(name, producing op, bytes) of tensors whose inferred static size exceeds ``budget``."""
    if modelio.serialized_size(model) > modelio.MAX_PROTO_BYTES:
        return []
    try:
        inferred = infer_shapes(model, data_prop=True)
    except Exception:
        return []
    producer = {out: node.op_type for node in model.graph.node for out in node.output if out}
    found = []
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape"):
            continue
        dims = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value")]
        if len(dims) == len(tt.shape.dim):
            nbytes = math.prod(dims) * _itemsize(tt.elem_type)
            if nbytes > budget:
                found.append((vi.name, producer.get(vi.name, "graph output"), nbytes))
    # Inference stops at an overflowing Expand/Tile; read those shapes from constants directly.
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("Expand", "ConstantOfShape") and node.domain in ("", "ai.onnx"):
            shape_name = node.input[1] if node.op_type == "Expand" else node.input[0]
            tensor = constants.get(shape_name)
            if tensor is not None and tensor.data_type == TensorProto.INT64 and len(tensor.dims) == 1:
                values = [int(v) for v in onnx.numpy_helper.to_array(tensor)]
                if values and all(v >= 0 for v in values) and math.prod(values) > budget:
                    found.append((node.output[0], node.op_type, math.prod(values)))
    return found


# ---------------------------------------------------------------------------------------------
# the user's samples


def load_samples(model: ModelProto, paths: Sequence[str | Path]) -> list[dict[str, np.ndarray]]:
    """The samples of ``--verify-inputs`` files, checked against the model's inputs (names,
    element types, ranks and fixed dims); `BadInputError` with one line otherwise."""
    samples = []
    for path in paths:
        p = Path(path)
        try:
            with np.load(p, allow_pickle=False) as data:
                sample = {name: data[name] for name in data.files}
        except FileNotFoundError as e:
            raise BadInputError(f"--verify-inputs {p}: file not found") from e
        except Exception as e:
            raise BadInputError(f"--verify-inputs {p}: not a readable .npz file ({one_line(e)})") from e
        samples.append(check_sample(model, sample, str(p)))
    return samples


def check_sample(model: ModelProto, sample: Mapping[str, Any], label: str) -> dict[str, np.ndarray]:
    inputs = {vi.name: vi for vi in true_inputs(model)}
    unknown = sorted(set(sample) - set(inputs))
    if unknown:
        raise BadInputError(
            f"{label}: {unknown[0]!r} is not an input of the model (inputs: {', '.join(inputs)})"
        )
    missing = sorted(set(inputs) - set(sample))
    if missing:
        raise BadInputError(f"{label}: no value for input {missing[0]!r}")
    checked = {}
    for name, vi in inputs.items():
        value = sample[name]
        if not isinstance(value, np.ndarray):
            checked[name] = value  # sequences and optionals from the API: onnxruntime checks them
            continue
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and tt.elem_type:
            want = _type_name(tt.elem_type)
            try:
                have = _type_name(onnx.helper.np_dtype_to_tensor_dtype(value.dtype))
            except Exception:
                have = str(value.dtype)
            if value.dtype.kind in "OUS" and tt.elem_type == TensorProto.STRING:
                value = value.astype(object)
            elif have != want:
                raise BadInputError(f"{label}: input {name!r} is {have}, the model declares {want}")
            if tt.HasField("shape"):
                dims = tt.shape.dim
                if len(dims) != value.ndim or any(
                    d.HasField("dim_value") and d.dim_value != s
                    for d, s in zip(dims, value.shape, strict=True)
                ):
                    declared = [
                        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims
                    ]
                    raise BadInputError(
                        f"{label}: input {name!r} has shape {list(value.shape)}, declared {declared}"
                    )
        checked[name] = value
    return checked


# ---------------------------------------------------------------------------------------------
# generated inputs


def make_inputs(
    model: ModelProto, seed: int, dim_values: Mapping[str, int] | None = None, *, derive: bool = True
) -> dict[str, np.ndarray]:
    """Seeded random feeds for the model's true graph inputs.

    Inputs that are also initializers are never fed: before IR 4 they are constants, from IR 4
    on they are overridable defaults, and keeping the default is what the model means. Symbolic
    dims take `dim_values[symbol]`, else 1 for names containing "batch" and 4 otherwise (the same
    symbol always gets the same size); dims with neither a value nor a name get 1. Integer inputs
    used directly as Gather indices stay within the gathered axis, other integers lie in [0, 4),
    floats are standard normal, bools fair coin flips, strings short random words. With
    ``derive``, inputs read directly as sizes, axes, scales, bounds or divisors get values their
    consumer accepts (`_derived_values`). Raises ValueError for input types it cannot generate
    (non-tensors, unknown rank, types without a numpy form onnxruntime takes).
    """
    inputs = true_inputs(model)
    symbols: dict[str, int] = dict(dim_values or {})
    shapes = {vi.name: _concrete_shape(vi, symbols) for vi in inputs}
    index_bounds = _gather_index_bounds(model, {vi.name for vi in inputs}, shapes)
    derived = _derived_values(model, inputs, shapes) if derive else {}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in inputs:
        elem_type = vi.type.tensor_type.elem_type
        value = _random_tensor(rng, vi.name, elem_type, shapes[vi.name], index_bounds.get(vi.name))
        if vi.name in derived:
            wanted = derived[vi.name]
            if wanted.size == value.size:
                value = wanted.reshape(value.shape).astype(value.dtype)
        feeds[vi.name] = value
    return feeds


_MAX_DIM_ASSIGNMENTS = 12
"""At most this many symbol assignments are tried after the default one."""


def dim_assignments(model: ModelProto, dim_values: Mapping[str, int] | None = None) -> list[dict[str, int]]:
    """Symbol values to generate inputs with, in the order they are tried: the pins and defaults
    first, then assignments where one symbol is another's default plus or minus one.

    Exporters name related sizes independently: a decode step's attention mask is ``[batch,
    s53]`` while its past keys are ``[batch, 2, past_sequence, 16]``, and the model only runs when
    ``s53 == past_sequence + 1`` (its positions index the mask). Equal defaults for both make
    onnxruntime refuse the original itself; the next assignments (capped at
    `_MAX_DIM_ASSIGNMENTS`) cover such off-by-one relations between two free symbols. Pinned
    symbols and batch-like ones (default 1) are never varied."""
    pinned = dict(dim_values or {})
    symbols: list[str] = []
    for vi in true_inputs(model):
        tt = vi.type.tensor_type
        for d in tt.shape.dim if tt.HasField("shape") else ():
            if d.dim_param and d.dim_param not in pinned and d.dim_param not in symbols:
                symbols.append(d.dim_param)
    free = [s for s in symbols if _default_dim(s) > 1]
    assignments = [pinned]
    for derived in free:
        for source in free:
            if derived == source:
                continue
            for offset in (1, -1):
                value = _default_dim(source) + offset
                assignments.append({**pinned, derived: value})
    return assignments[: 1 + _MAX_DIM_ASSIGNMENTS]


def _default_dim(symbol: str) -> int:
    return 1 if "batch" in symbol.lower() else 4


def _concrete_shape(vi: ValueInfoProto, symbols: dict[str, int]) -> tuple[int, ...]:
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ValueError(f"input '{vi.name}' is a {kind or 'value of unknown type'}, not a tensor")
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        raise ValueError(f"input '{vi.name}' has unknown rank; cannot choose a shape for it")
    dims: list[int] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param:
            dims.append(symbols.setdefault(d.dim_param, _default_dim(d.dim_param)))
        else:  # anonymous dynamic dim: 1 broadcasts against anything
            dims.append(1)
    return tuple(dims)


def _is_standard(node: NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _attr(node: NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _gather_index_bounds(
    model: ModelProto, input_names: set[str], shapes: dict[str, tuple[int, ...]]
) -> dict[str, int]:
    """Exclusive upper bound for integer inputs that feed the indices of a Gather, GatherElements
    or ScatterElements directly (the size of the indexed axis)."""
    graph = model.graph
    users = [
        n
        for n in graph.node
        if n.op_type in ("Gather", "GatherElements", "ScatterElements")
        and _is_standard(n)
        and len(n.input) >= 2
        and n.input[1] in input_names
    ]
    if not users:
        return {}
    known = _known_shapes(model, shapes)
    bounds: dict[str, int] = {}
    for node in users:
        data_shape = known.get(node.input[0])
        if not data_shape:
            continue
        axis = _attr(node, "axis", 0)
        if not -len(data_shape) <= axis < len(data_shape):
            continue
        size = data_shape[axis]
        if size is None:
            continue
        name = node.input[1]
        bounds[name] = min(bounds.get(name, size), size)
    return bounds


def _known_shapes(
    model: ModelProto, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int | None, ...]]:
    known: dict[str, tuple[int | None, ...]] = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for name, shape in _inferred_static_shapes(model).items():
        known.setdefault(name, shape)
    known.update(shapes)
    return known


def _inferred_static_shapes(model: ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Static shapes from onnx shape inference (of the model without its large weights: sizing a
    whole model costs as much as serializing it); dims it cannot pin down are None."""
    try:
        inferred = infer_shapes(model)
    except Exception:
        return {}
    shapes: dict[str, tuple[int | None, ...]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return shapes


# Operands read as sizes or axes: (op, operand index) -> how to fill them, given the data shape.
_SIZE_OPERANDS: dict[tuple[str, int], str] = {
    ("Reshape", 1): "shape",
    ("Expand", 1): "shape",
    ("Tile", 1): "ones",
    ("Resize", 1): "roi",
    ("Resize", 2): "scales",
    ("Resize", 3): "shape",
    ("Upsample", 1): "scales",
    ("Slice", 1): "zeros",
    ("Slice", 2): "shape",
    ("Slice", 3): "axes",
    ("Slice", 4): "ones",
    ("Unsqueeze", 1): "axes",
    ("Split", 1): "split",
    ("Pad", 1): "zeros",
    ("Pad", 3): "axes",
    ("OneHot", 1): "depth",
    ("TopK", 1): "one",
    ("CumSum", 1): "zeros",
    ("Trilu", 1): "zeros",
    ("Range", 0): "zeros",
    ("Range", 1): "depth",
    ("Range", 2): "one",
    ("ConstantOfShape", 0): "ones",
}
_REDUCE_OPS = frozenset(
    "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
    "ReduceSumSquare".split()
)


def _derived_values(
    model: ModelProto, inputs: list[ValueInfoProto], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Values for inputs read directly as a size-like operand, from their consumer: the data's own
    shape for Reshape/Expand/Slice ends/Resize sizes, ones for repeats and scales, 0..n-1 for axes,
    lengths that sum to the split axis, a nonzero divisor for integer Div/Mod."""
    names = {vi.name for vi in inputs}
    integers = {vi.name for vi in inputs if vi.type.tensor_type.elem_type in _INT_TYPES}
    known: dict[str, tuple[int | None, ...]] | None = None
    derived: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if not _is_standard(node):
            continue
        for index, name in enumerate(node.input):
            if name not in names or name in derived:
                continue
            count = math.prod(shapes[name])
            role = _SIZE_OPERANDS.get((node.op_type, index))
            if role is None and node.op_type in _REDUCE_OPS and index == 1:
                role = "axes"
            if role is None and node.op_type in ("Div", "Mod") and index == 1 and name in integers:
                derived[name] = np.ones(count)
                continue
            if role is None:
                continue
            if known is None:
                known = _known_shapes(model, shapes)
            data = known.get(node.input[0]) if node.input else None
            value = _fill(role, count, data, node)
            if value is not None:
                derived[name] = value
    return derived


def _fill(role: str, count: int, data: tuple[int | None, ...] | None, node: NodeProto) -> np.ndarray | None:
    full = data is not None and all(d is not None for d in data)
    dims = [int(d) for d in data if d is not None] if full and data is not None else None
    if role == "ones":
        return np.ones(count)
    if role == "zeros":
        return np.zeros(count)
    if role == "one":
        return np.ones(count)
    if role == "depth":
        return np.full(count, 4)
    if role == "roi":
        return np.concatenate([np.zeros(count // 2), np.ones(count - count // 2)])
    if role == "axes":
        return np.arange(count)
    if role == "scales":
        return np.ones(count)
    if role == "shape" and dims is not None:
        if node.op_type == "Slice":
            return np.array(dims[:count] + [1] * max(0, count - len(dims)))
        return np.array(dims) if len(dims) == count else None
    if role == "split" and dims is not None and count:
        size = dims[_attr(node, "axis", 0) % len(dims)] if dims else 0
        if size >= count:
            return np.array([1] * (count - 1) + [size - count + 1])
    return None


def _random_tensor(
    rng: np.random.Generator, name: str, elem_type: int, shape: tuple[int, ...], int_high: int | None
) -> np.ndarray:
    if elem_type in _FLOAT_TYPES:
        return np.asarray(rng.standard_normal(shape), dtype=_FLOAT_TYPES[elem_type])
    if elem_type in _INT_TYPES:
        high = _DEFAULT_INT_HIGH if int_high is None else max(int_high, 1)
        return np.asarray(rng.integers(0, high, size=shape), dtype=_INT_TYPES[elem_type])
    if elem_type == TensorProto.BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if elem_type == TensorProto.STRING:
        words = np.array(["a", "bc", "onnx", "Hello", " x ", ""], dtype=object)
        return words[rng.integers(0, len(words), size=shape)]
    raise ValueError(f"input '{name}' has type {_type_name(elem_type)}, which verification cannot generate")
