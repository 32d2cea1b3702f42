"""Shapes ONNX inference cannot compute, observed on onnxruntime where they cannot depend on the data.

Exporters compute sizes with the ops they have: TorchScript writes Swin's window padding as
``Pad(x, Reshape(Transpose(Slice(Concat(.., Mod(Sub(4, Mod(Gather(Shape(x), 1), 4)), 4))))))``,
ONNX shape inference gives up at the first such chain (``unk__N`` for every later tensor), and the
e-graph's analysis only knows the sizes after rewrites fold the chain, too late for the rules that
need them. onnx-simplifier and onnxslim get them by running the model. So does this module, and
it proves each observed shape valid for every input:

- With every graph input's shape fixed (declared or pinned), a tensor's shape depends on the
  input *values* only through an op whose output size is read from a tensor it is given (a
  Reshape target, Slice bounds, a Range's limits: `SIZE_OPERANDS`) or an op whose output size is
  data-dependent by nature (NonZero, control flow, any op of another domain: `_dynamic`).
- `data_free_shapes` follows both dependences through the graph: values derived from graph
  inputs or random ops are data; a Shape or Size of a tensor with a data-free shape is not.
- `observe` runs the model once on the verification inputs with a Shape node on each tensor that
  is data-free but not fully inferred, and returns those sizes (an error, or a model that cannot
  run, gives none: nothing is guessed). It needs every graph input's shape fixed.

`static_sizes` gathers these with every size inference does know (numbers, or a graph input's
symbol by name). `fold_sizes` writes each Shape of a fully known tensor, and each Gather of known
sizes from a partly symbolic Shape, as a constant, reads each graph-input symbol from one Shape
of that input, and folds the size arithmetic over them before the import (what onnx-simplifier
does); the importer seeds the analysis with the sizes of the tensors left
(``from_onnx(static_shapes=..)``), as it does for a model whose sizes ONNX inference computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxsat.base.modelio import model_shell, topological_nodes
from onnxsat.base.weightless import infer_types
from onnxsat.egraph.fold import fold_constants

__all__ = ["SIZE_OPERANDS", "Dims", "data_free_shapes", "fold_sizes", "fully_known", "observe", "static_sizes"]

_REDUCTIONS = (
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSum", "ReduceSumSquare",
)  # fmt: skip

SIZE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "CenterCropPad": (1, 2),
    "MaxUnpool": (2,), "DFT": (1, 2), "STFT": (1, 2, 3), "Col2Im": (1, 2), "AffineGrid": (1,),
    "MelWeightMatrix": (0, 1, 2), "BlackmanWindow": (0,), "HannWindow": (0,), "HammingWindow": (0,),
    **{op: (1,) for op in _REDUCTIONS},
}  # fmt: skip
"""Standard ops whose output size is read from the values of these operands."""

_DATA_SHAPED = frozenset({
    "NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit", "StringNormalizer",
    "If", "Loop", "Scan", "ImageDecoder", "Optional", "OptionalGetElement", "OptionalHasElement",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence",
})  # fmt: skip
"""Standard ops whose output size depends on the data (or on a subgraph) by nature."""

_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"})
"""Ops whose values are data (drawn at run time) whatever their inputs."""


def _dynamic(node: onnx.NodeProto) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in _DATA_SHAPED:
        return True
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return True
    return not onnx.defs.has(node.op_type)


def data_free_shapes(model: onnx.ModelProto) -> set[str]:
    """Names of the main graph's node outputs whose shape is the same for every input value, given
    the graph inputs' shapes (see the module docstring)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    fed = {i.name for i in graph.input if i.name not in initializers or model.ir_version >= 4}
    data = set(fed)  # values that depend on the inputs' values
    shaped_by_data: set[str] = set()  # shapes that do
    for node in topological_nodes(graph):  # an input's status is settled before its consumers'
        inputs = [i for i in node.input if i]
        if _dynamic(node) or any(i in shaped_by_data for i in inputs):
            moved = True
        else:
            sizes = SIZE_OPERANDS.get(node.op_type, ())
            moved = any(k < len(node.input) and node.input[k] in data for k in sizes)
        if node.op_type in ("Shape", "Size"):
            value_is_data = moved
        else:
            value_is_data = moved or node.op_type in _RANDOM or any(i in data for i in inputs)
        for out in node.output:
            if not out:
                continue
            if moved:
                shaped_by_data.add(out)
            if value_is_data:
                data.add(out)
    return {o for n in graph.node for o in n.output if o and o not in shaped_by_data}


def _fixed_inputs(model: onnx.ModelProto, pins: Mapping[str, list[int]]) -> bool:
    from onnxsat.verification_inputs import true_inputs

    for vi in true_inputs(model):
        if vi.name in pins:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            return False
        if not all(d.HasField("dim_value") for d in tt.shape.dim):
            return False
    return True


Dims = tuple[int | str | None, ...]
"""A tensor's sizes: a number, the name of a graph input's symbolic size it equals (ONNX
inference's ``dim_param``: a batch, a sequence), or None (not known)."""


def static_sizes(
    model: onnx.ModelProto, pins: Mapping[str, list[int]], dim_values: Mapping[str, int], *, observed: bool = True
) -> dict[str, Dims]:
    """The sizes that cannot depend on the input values, per tensor of known rank: the
    initializers', the graph inputs' (declared), ONNX inference's for data-free tensors (a size
    it names after a graph input's symbol keeps that name, as the importer trusts it; any other
    unknown size is None), and what `observe` sees of the data-free ones inference leaves open
    (``pins``: the ``--input-shape`` pins, ``dim_values`` the sizes they give symbols; without
    ``observed``, inference's alone)."""
    try:
        inferred = infer_types(model)
    except Exception:
        inferred = model
    graph = model.graph
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output, *graph.input]}
    free = data_free_shapes(model)
    inputs = {i.name for i in graph.input}  # an initializer that is also an input may be fed: its declared shape holds
    known: dict[str, Dims] = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer if t.name not in inputs}
    symbols = {d.dim_param for i in graph.input if i.name not in pins for d in _dims(i.type) if d.dim_param}
    for name in [i.name for i in graph.input] + sorted(free):
        if name in pins:
            known[name] = tuple(pins[name])
        elif name in types and types[name].tensor_type.HasField("shape"):
            known[name] = tuple(
                d.dim_value if d.HasField("dim_value") else d.dim_param if d.dim_param in symbols else None
                for d in _dims(types[name])
            )
    wanted = [o for n in graph.node for o in n.output if o in free and not _all_numbers(known.get(o))]
    if observed and wanted and _fixed_inputs(model, pins):
        known.update(observe(model, wanted, dim_values))
    return known


def reads_new_sizes(model: onnx.ModelProto, before: Mapping[str, Dims], after: Mapping[str, Dims]) -> bool:
    """Whether a Shape or Size node of ``model`` reads a tensor with more sizes known in ``after``
    than in ``before`` (so `fold_sizes` with ``after`` has more to fold)."""

    def numbers(dims: Dims | None) -> int:
        return sum(isinstance(d, int) for d in dims or ())

    for node in model.graph.node:
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") and node.input:
            if numbers(after.get(node.input[0])) > numbers(before.get(node.input[0])):
                return True
    return False


def fully_known(sizes: Mapping[str, Dims]) -> dict[str, tuple[int, ...]]:
    """The tensors of ``sizes`` whose every size is a number."""
    return {name: dims for name, dims in sizes.items() if _all_numbers(dims)}  # type: ignore[misc]


def _all_numbers(dims: Dims | None) -> bool:
    return dims is not None and all(isinstance(d, int) for d in dims)


def _dims(tp: onnx.TypeProto) -> list[onnx.TensorShapeProto.Dimension]:
    return list(tp.tensor_type.shape.dim) if tp.HasField("tensor_type") else []


def observe(model: onnx.ModelProto, names: list[str], dim_values: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The sizes of tensors ``names`` in one onnxruntime run of ``model`` on seed 0's
    verification inputs (``dim_values``: the sizes pins give symbols); empty when the model
    cannot be run. Only a tensor `data_free_shapes` names has the same size for every input."""
    from onnxsat.verification import inference_session, run_session
    from onnxsat.verification_inputs import make_inputs

    graph = model.graph
    probes = [helper.make_node("Shape", [name], [f"{name}__onnxsat_shape"]) for name in names]
    n_nodes, n_outputs = len(graph.node), len(graph.output)
    try:  # the probes are appended to the caller's graph for the session's copy, then removed
        graph.node.extend(probes)
        graph.output.extend(helper.make_tensor_value_info(p.output[0], onnx.TensorProto.INT64, [None]) for p in probes)
        session = inference_session(model, "disable_all")
    except Exception:
        return {}
    finally:
        del graph.node[n_nodes:]
        del graph.output[n_outputs:]
    try:
        feeds = make_inputs(model, 0, dim_values)
        got = run_session(session, feeds)
    except Exception:
        return {}
    return {name: tuple(int(d) for d in got[p.output[0]]) for name, p in zip(names, probes, strict=True)}


def fold_sizes(
    model: onnx.ModelProto, sizes: Mapping[str, Dims], max_weight_bytes: float, max_elements: int | None = None
) -> onnx.ModelProto:
    """``model`` with each Shape and Size of a tensor whose ``sizes`` (`static_sizes`) are all
    numbers written as a constant, each Gather of sizes from a Shape of a partly symbolic one
    written as a constant where they are numbers (the heads of a dynamic-axes attention) and read
    from the graph input where it is that input's symbol (the batch: every layer's Gathers of it
    are then one), and the weight-only subgraphs that leaves folded within ``max_weight_bytes``
    and ``max_elements`` (``egraph.fold``): what onnx-simplifier does before it looks at a graph. TorchScript's Swin
    export goes from 6,261 nodes to 581 before the e-graph sees it, where importing it whole took
    most of the run."""
    graph = model.graph
    constants: list[onnx.TensorProto] = []
    kept: list[onnx.NodeProto] = []
    values = {t.name: t for t in graph.initializer}
    partial: dict[str, Dims] = {}  # Shape outputs with some sizes not numbers
    symbols = _SymbolReader(model, sizes)
    for node in graph.node:
        value = None
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = node.attribute[0].t  # TorchScript's Gather indices
        if standard and node.op_type in ("Shape", "Size") and node.input[0] in sizes:
            dims = sizes[node.input[0]]
            if node.op_type == "Shape":
                sliced = tuple(_shape_slice(dims, node))
                if _all_numbers(sliced):
                    value = np.array(sliced, dtype=np.int64)
                else:
                    partial[node.output[0]] = sliced
                    if len(sliced) == 1 and isinstance(sliced[0], str):  # x.shape[1:2] of a sequence
                        node = symbols.read(sliced[0], (1,), node.output[0], node.name)
            elif _all_numbers(dims):
                value = np.array(math.prod(dims), dtype=np.int64)  # type: ignore[arg-type]
        elif standard and node.op_type in ("Gather", "Slice") and node.input[0] in partial:
            if node.op_type == "Gather":
                picked = _gathered(partial[node.input[0]], values.get(node.input[1]), node)
            else:  # dynamo's x.shape[-2:-1]: Slice of a Shape
                picked = _sliced(partial[node.input[0]], node, values)
            if picked is not None and _all_numbers(picked[0]):
                value = np.array(picked[0], dtype=np.int64).reshape(picked[1])
            elif picked is not None and len(picked[0]) == 1 and isinstance(picked[0][0], str):
                node = symbols.read(picked[0][0], picked[1], node.output[0], node.name)
            elif picked is not None and node.op_type == "Slice":
                partial[node.output[0]] = picked[0]
                if all(d is not None for d in picked[0]):  # x.shape[:-2], [batch, heads]: one Concat all layers share
                    node = symbols.vector(picked[0], node)
        if value is None:
            kept.append(node)
            continue
        constants.append(numpy_helper.from_array(value, node.output[0]))
    if not constants and not symbols.nodes:
        return fold_constants(model, max_weight_bytes=max_weight_bytes, max_elements=max_elements)[0]
    shell = model_shell(model, {"node", "initializer"})
    shell.graph.node.extend(symbols.nodes + kept)
    shell.graph.initializer.extend([*graph.initializer, *constants, *symbols.indices])
    return fold_constants(shell, max_weight_bytes=max_weight_bytes, max_elements=max_elements)[0]


class _SymbolReader:
    """Gathers of a graph input's symbolic size rewired to one Shape of the first input that has it."""

    def __init__(self, model: onnx.ModelProto, sizes: Mapping[str, Dims]):
        self.first: dict[str, tuple[str, int]] = {}
        for vi in model.graph.input:
            for axis, dim in enumerate(sizes.get(vi.name, ())):
                if isinstance(dim, str):
                    self.first.setdefault(dim, (vi.name, axis))
        self.taken = {o for n in model.graph.node for o in n.output} | {t.name for t in model.graph.initializer}
        self.nodes: list[onnx.NodeProto] = []
        self.indices: list[onnx.TensorProto] = []
        self.shapes: dict[str, str] = {}
        self.reads: dict[str, str] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)

    def read(self, symbol: str, index_shape: tuple[int, ...], output: str, name: str = "") -> onnx.NodeProto:
        """A node writing ``symbol`` read from its input's shape into ``output`` (a Gather of
        indices of ``index_shape``): a Shape of the one size where the output is a vector and the
        opset has Shape's ``start`` (15), so a read of an input's own size stays one node."""
        source, axis = self.first[symbol]
        if index_shape == (1,) and self.opset >= 15:
            return helper.make_node("Shape", [source], [output], name=name, start=axis, end=axis + 1)
        shape = self.shapes.get(source)
        if shape is None:
            shape = self.shapes[source] = self._fresh(f"{source}__onnxsat_shape")
            self.nodes.append(helper.make_node("Shape", [source], [shape]))
        index = self._fresh(f"{output}__onnxsat_axis")
        self.indices.append(numpy_helper.from_array(np.array(axis, np.int64).reshape(index_shape), index))
        return helper.make_node("Gather", [shape, index], [output], name=name, axis=0)

    def vector(self, dims: Dims, node: onnx.NodeProto) -> onnx.NodeProto:
        """A Concat computing ``node``'s output, the sizes ``dims`` (numbers and graph-input
        symbols): runs of numbers as constants, each symbol from one shared read of its input."""
        pieces: list[str] = []
        numbers: list[int] = []
        for dim in [*dims, None]:
            if isinstance(dim, int):
                numbers.append(dim)
                continue
            if numbers:
                pieces.append(self._fresh(f"{node.output[0]}__onnxsat_sizes"))
                self.indices.append(numpy_helper.from_array(np.array(numbers, np.int64), pieces[-1]))
                numbers = []
            if isinstance(dim, str):
                if dim not in self.reads:
                    self.reads[dim] = self._fresh(f"{dim}__onnxsat_size")
                    self.nodes.append(self.read(dim, (1,), self.reads[dim]))
                pieces.append(self.reads[dim])
        return helper.make_node("Concat", pieces, list(node.output), name=node.name, axis=0)

    def _fresh(self, name: str) -> str:
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name


def _gathered(dims: Dims, indices: onnx.TensorProto | None, node: onnx.NodeProto) -> tuple[Dims, tuple[int, ...]] | None:
    """What Gather picks from a shape vector of sizes ``dims`` with constant ``indices``, and the
    indices' shape; None when the indices are not a constant in range."""
    if indices is None or any(a.name == "axis" and helper.get_attribute_value(a) not in (0, -1) for a in node.attribute):
        return None
    at = numpy_helper.to_array(indices)
    if at.dtype.kind not in "iu" or at.ndim > 1 or not all(-len(dims) <= int(i) < len(dims) for i in at.reshape(-1)):
        return None
    return tuple(dims[int(i)] for i in at.reshape(-1)), tuple(at.shape)


def _sliced(dims: Dims, node: onnx.NodeProto, values: Mapping[str, onnx.TensorProto]) -> tuple[Dims, tuple[int, ...]] | None:
    """What Slice ``node`` keeps of a shape vector of sizes ``dims``, and its shape; None unless its
    starts, ends and (where given) axes and steps are constants of one int."""
    names = [*node.input[1:5], "", ""][:4]
    if not names[0] or not names[1] or any(n and n not in values for n in names):
        return None
    read: list[int | None] = []
    for name in names:
        value = numpy_helper.to_array(values[name]).reshape(-1) if name else None
        if value is not None and (value.dtype.kind not in "iu" or value.size != 1):
            return None
        read.append(None if value is None else int(value[0]))
    start, end, axis, step = read
    if axis not in (None, 0, -1) or step == 0:
        return None
    kept = tuple(dims[slice(start, end, 1 if step is None else step)])  # Python's slice clamps as ONNX's does
    return kept, (len(kept),)


def _shape_slice(dims: Dims, node: onnx.NodeProto) -> list[int | str | None]:
    """What Shape's ``start`` and ``end`` (opset 15) keep of ``dims``: negatives count from the end, clamped."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = len(dims)

    def clamp(i: int) -> int:
        return min(rank, max(0, i + rank if i < 0 else i))

    return list(dims[clamp(attrs.get("start", 0)) : clamp(attrs.get("end", rank))])
