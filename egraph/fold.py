"""Fold weight-only subgraphs of an exported model with ``onnx.reference`` (numpy).

Uniform values stay uniform: an elementwise op over uniform inputs is computed on one
element and written back as ConstantOfShape, so folding a ConstantOfShape-weighted model
never materializes its weights. A fold that would make the weights larger than the caller's
limit (by default: than they are) is left unfolded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxsat.base.lazy_weights import tensor_array
from onnxsat.base.modelio import model_shell, weight_bytes

ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Exp", "Log", "Relu", "Sigmoid", "Tanh", "Erf",
    "Reciprocal", "Abs", "Identity", "Cast", "Clip", "LeakyRelu", "Where", "Gelu",
}  # fmt: skip
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
QUANTIZATION = {"QuantizeLinear", "DequantizeLinear"}
"""Never folded: a DequantizeLinear over an int8 weight is how onnxruntime finds the QDQ groups it
runs as int8 kernels (folded, the weight would be float32, 4x the bytes, and the kernel float)."""


_T = onnx.TensorProto
_NUMPY_NATIVE = {
    _T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BOOL, _T.INT8, _T.INT16, _T.INT32, _T.INT64,
    _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64,
}  # fmt: skip


@dataclass
class _Uniform:
    value: np.ndarray  # one element, with the dtype
    dims: tuple[int, ...]


def evaluate_node(
    node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: list[onnx.OperatorSetIdProto]
) -> list:
    """``node``'s outputs on ``inputs`` (None: an absent optional input) by onnx.reference; raises
    what onnx.reference raises. A Constant with a tensor value and an Identity are read directly
    (an exporter writes hundreds; onnx.reference builds a model for each)."""
    if node.domain in ("", "ai.onnx"):
        if node.op_type == "Identity" and len(inputs) == 1 and inputs[0] is not None:
            return [inputs[0]]
        attrs = node.attribute
        if node.op_type == "Constant" and len(attrs) == 1 and attrs[0].name == "value":
            value = attrs[0].t
            if value.data_location == onnx.TensorProto.DEFAULT and value.data_type in _NUMPY_NATIVE:
                return [numpy_helper.to_array(value)]  # external data and exotic types: as onnx.reference reads them
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    del proto.input[:]
    proto.input.extend(names)
    outs = [f"out{i}" for i in range(len(node.output))]
    del proto.output[:]
    proto.output.extend(outs)
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if n and a is not None}
    graph = helper.make_graph(
        [proto],
        "fold",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=list(opset))
    # onnx.reference takes ~0.1 s to import: only a model with a node to fold pays it.
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds))


def fold_constants(
    model: onnx.ModelProto, *, max_weight_bytes: float | None = None, max_elements: int | None = None
) -> tuple[onnx.ModelProto, int]:
    """Fold nodes whose inputs are all constant; returns the model and how many nodes were folded.

    The folded model's weights (`weight_bytes`) stay within ``max_weight_bytes`` (default: the
    model's own, so folding never makes them larger; ``math.inf``: no limit). A fold whose result
    is larger than the weights it frees (a transposed copy of a weight that other nodes still
    read, as a tied embedding's; an Expand of a small weight) costs bytes: everything is folded
    first; while the weights are over the limit, the largest such folds are kept as nodes (over
    the original weight, which onnxruntime folds when it loads the model) and the model is folded
    again, so small ones (a window mask, a Range of positions) fit in what the limit leaves.
    ``max_elements``: a node whose result is a tensor of more elements, not all equal, stays a node
    (a region's program replayed on twins must not hold values computed from its own weights).
    """
    limit = weight_bytes(model) if max_weight_bytes is None else max_weight_bytes
    sizes = {t.name: _nbytes(t) for t in model.graph.initializer}
    keep: set[str] = set()
    memo: dict[int, list | None] = {}  # node index -> its folded outputs, the same in every round
    while True:
        folded, count, made = _fold(model, keep, memo, max_elements)
        excess = weight_bytes(folded) - limit
        if excess <= 0:
            return folded, count
        growers = [m for m in _growers(folded, made, sizes) if m.node not in keep]
        if not growers:
            return folded, count  # nothing folded is left to unfold: the growth is not folding's
        for grower in growers:  # the largest first, until what they add covers the excess
            keep.add(grower.node)
            excess -= grower.nbytes
            if excess <= 0:
                break


@dataclass
class _Made:
    """A dense tensor folding made: the node that made it (by its first output), the input's
    initializers it derives from, and its size."""

    node: str
    sources: frozenset[str]
    nbytes: int


def _growers(folded: onnx.ModelProto, made: dict[str, _Made], sizes: dict[str, int]) -> list[_Made]:
    """Folds that grow the weights, the largest first: each live made tensor larger than its
    source weights that died (``sizes``: the input's initializers); if none is, the largest live
    made tensor (two copies of one dead weight each look free on their own)."""
    live = {t.name for t in folded.graph.initializer}
    alive = sorted((m for name, m in made.items() if name in live), key=lambda m: -m.nbytes)
    growers = [m for m in alive if m.nbytes > sum(sizes.get(s, 0) for s in m.sources if s not in live)]
    return growers or alive[:1]


def _try_eval(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: list[onnx.OperatorSetIdProto]) -> list | None:
    """The node's outputs on these inputs, or None where onnx.reference cannot compute them."""
    try:
        return evaluate_node(node, inputs, opset)
    except Exception:
        return None


def _nbytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod([int(d) for d in tensor.dims]))
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _fold(
    model: onnx.ModelProto, keep: set[str], memo: dict[int, list | None], max_elements: int | None = None
) -> tuple[onnx.ModelProto, int, dict[str, _Made]]:
    """Fold every node with constant inputs except those whose first output is in ``keep`` or that
    make a dense tensor of more than ``max_elements``; also returns the dense tensors it made.
    ``memo`` keeps each node's evaluation (None: it failed)."""

    graph = model.graph
    inputs = {i.name for i in graph.input}
    dense: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer if t.name not in inputs}
    uniform: dict[str, _Uniform] = {}
    kept: list[onnx.NodeProto] = []
    folded = 0
    new_dense: list[onnx.TensorProto] = []
    new_uniform: list[str] = []
    opset = list(model.opset_import)
    sources: dict[str, frozenset[str]] = {name: frozenset([name]) for name in dense}
    made: dict[str, _Made] = {}

    def const(name: str) -> bool:
        return name == "" or name in dense or name in uniform

    for index, node in enumerate(graph.node):
        if node.op_type == "ConstantOfShape" and node.domain == "" and node.input[0] in dense:
            dims = tuple(int(d) for d in tensor_array(dense[node.input[0]]))
            fill = numpy_helper.to_array(node.attribute[0].t) if node.attribute else np.zeros(1, np.float32)
            uniform[node.output[0]] = _Uniform(fill.reshape(-1)[:1], dims)
            kept.append(node)
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC | QUANTIZATION or not all(const(i) for i in node.input):
            kept.append(node)
            continue
        if node.output and node.output[0] in keep:
            kept.append(node)
            continue
        derived = frozenset().union(*(sources.get(i, frozenset()) for i in node.input if i))
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            kept.append(node)
            continue
        if node.op_type in ELEMENTWISE and all(i == "" or i in uniform for i in node.input) and len(node.output) == 1:
            if index not in memo:
                memo[index] = _try_eval(node, [uniform[i].value.reshape(()) if i else None for i in node.input], opset)
            one = memo[index]
            if one is None:
                kept.append(node)
                continue
            (out,) = one
            dims = np.broadcast_shapes(*[uniform[i].dims for i in node.input if i])
            uniform[node.output[0]] = _Uniform(np.asarray(out).reshape(-1)[:1], tuple(dims))
            new_uniform.append(node.output[0])
            sources[node.output[0]] = derived
            folded += 1
            continue
        if index not in memo:
            memo[index] = _try_eval(node, [None if i == "" else _materialize(i, dense, uniform) for i in node.input], opset)
        outs = memo[index]
        if outs is None:
            kept.append(node)
            continue
        if not all(isinstance(o, np.ndarray) for o in outs):
            kept.append(node)  # a sequence, map or optional (SequenceEmpty) is no tensor initializer
            continue
        if max_elements is not None and any(np.size(o) > max_elements and not _is_uniform(o) for o in outs):
            kept.append(node)
            continue
        for name, out in zip(node.output, outs, strict=True):
            out = np.asarray(out)
            if _is_uniform(out) and out.size > 16:
                uniform[name] = _Uniform(out.reshape(-1)[:1], out.shape)
                new_uniform.append(name)
            else:
                dense[name] = numpy_helper.from_array(out, name)
                new_dense.append(dense[name])
                made[name] = _Made(node.output[0], derived, out.nbytes)
            sources[name] = derived
        folded += 1
    return _rebuild(model, kept, uniform, new_dense, new_uniform), folded, made


def _is_uniform(a: np.ndarray) -> bool:
    a = np.asarray(a)
    if a.size == 0 or a.dtype == object:
        return False
    flat = a.reshape(-1)
    return bool(np.all(flat == flat[0]))


def _materialize(name: str, dense: dict[str, onnx.TensorProto], uniform: dict[str, _Uniform]) -> np.ndarray:
    if name in dense:
        return tensor_array(dense[name])
    u = uniform[name]
    return np.full(u.dims, u.value[0], dtype=u.value.dtype)


def _rebuild(
    model: onnx.ModelProto,
    kept: list[onnx.NodeProto],
    uniform: dict[str, _Uniform],
    new_dense: list[onnx.TensorProto],
    new_uniform: list[str],
) -> onnx.ModelProto:
    """Kept nodes, a ConstantOfShape per new uniform value, and only the live initializers;
    ``model`` itself when that is all of it (rebuilding copies every weight)."""
    graph = model.graph
    if not new_dense and not new_uniform and len(kept) == len(graph.node):
        live, used = _live_and_used(list(kept), graph)
        same_order = [tuple(n.output) for n in live] == [tuple(n.output) for n in graph.node]
        if same_order and all(t.name in used for t in graph.initializer):
            return model
    nodes = list(kept)
    inits = list(graph.initializer) + new_dense
    taken = {t.name for t in inits} | {o for n in kept for o in n.output} | {i.name for i in graph.input}
    for name in new_uniform:
        u = uniform[name]
        shape_name = f"{name}__shape"
        while shape_name in taken:
            shape_name += "_"
        taken.add(shape_name)
        inits.append(numpy_helper.from_array(np.array(u.dims, dtype=np.int64), shape_name))
        value = numpy_helper.from_array(u.value.reshape(1), "value")
        nodes.append(helper.make_node("ConstantOfShape", [shape_name], [name], value=value))
    out = model_shell(model, {"node", "initializer"})
    live, used = _live_and_used(nodes, graph)
    out.graph.node.extend(live)
    seen: set[str] = set()
    for t in inits:
        if t.name in used and t.name not in seen:
            seen.add(t.name)
            out.graph.initializer.append(t)
    return out


def _live_and_used(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes of ``nodes`` that reach an output of ``graph``, and every name they, the outputs
    and the graph inputs read (overridable inputs keep their default initializer)."""
    live = _live_nodes(nodes, [o.name for o in graph.output])
    used = {i for n in live for i in n.input} | {o.name for o in graph.output} | _subgraph_reads(live)
    return live, used | {i.name for i in graph.input}


def _subgraph_reads(nodes: list[onnx.NodeProto]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                for inner in sub.node:
                    names.update(inner.input)
                names |= _subgraph_reads(list(sub.node))
    return names


def _live_nodes(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """Nodes that contribute to an output, in a valid order (producers before consumers)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    needed: set[int] = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        reads = list(nodes[i].input) + sorted(_subgraph_reads([nodes[i]]))
        stack.extend(producer[x] for x in reads if x in producer)
    ordered = [nodes[i] for i in sorted(needed)]
    return _toposort(ordered)


def _toposort(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    produced_by = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    done: set[int] = set()
    order: list[onnx.NodeProto] = []

    def visit(i: int) -> None:
        stack = [(i, False)]
        while stack:
            j, expanded = stack.pop()
            if j in done:
                continue
            if expanded:
                done.add(j)
                order.append(nodes[j])
                continue
            stack.append((j, True))
            reads = list(nodes[j].input) + sorted(_subgraph_reads([nodes[j]]))
            for x in reads:
                k = produced_by.get(x)
                if k is not None and k not in done and k != j:
                    stack.append((k, False))

    for i in range(len(nodes)):
        visit(i)
    return order
