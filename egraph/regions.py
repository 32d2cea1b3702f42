"""Cut a large ONNX graph into regions, key them structurally, and put optimized regions back.

Saturating a 10,000-node graph at once is out of reach, and a transformer repeats one layer
many times. ``partition`` cuts the topologically ordered nodes where few computed tensors cross
(after a residual add, between layers), aiming at a target region size and repeating the last
region's length where the cut there is as narrow, so the identical layers give identical
regions. ``part_model`` makes a standalone model of a set of nodes; ``part_key`` hashes it
canonically (ops, attributes, shapes, dtypes, weight roles, and the values of every constant a
rule guard can read), so two parts with one key are the same computation on other weights and
one's optimized program can be replayed on the other (``rename_part``). ``replace_parts`` puts
optimized parts back into the graph, ``cut_windows`` finds the nodes around cuts, and
``eliminate_common_subexpressions`` merges what separately optimized parts recomputed.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..base.lazy_weights import tensor_array
from ..base.modelio import model_shell
from ..base.weightless import infer_shapes, infer_types
from .graph_types import KERNEL_STAMP, STAMP_SEPARATOR

SMALL_CONSTANT = 64
"""Constants up to this many elements enter a region's key by value (rules read small constants)."""

_NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


class PartitionError(ValueError):
    """The graph cannot be cut (no types for a crossing tensor, unsorted nodes): saturate it whole."""


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs and the outer-scope names its subgraphs use."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            names.extend(_outer_names(graph))
    return names


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: list[str] = []
    for node in graph.node:
        used.extend(n for n in node_inputs(node) if n not in local)
        local.update(node.output)
    used.extend(o.name for o in graph.output if o.name not in local)
    return used


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def cut_widths(model: onnx.ModelProto, types: Mapping[str, onnx.TypeProto] | None = None) -> list[int]:
    """``widths[p]``: how many computed tensors (not graph inputs, weights or Constant outputs) a cut
    before node ``p`` would cross: produced before it and read at or after it (or a graph output).
    With ``types``, the shape and mask computations a part copies in (``_copied``) do not count: a
    causal mask or a rotary table read by every layer crosses each cut between layers, and counted
    it made a cut inside the last attention (after its last read) look narrower than one between
    layers."""
    nodes = list(model.graph.node)
    n = len(nodes)
    g = _Graph(model, types) if types is not None else None
    shapes: dict[int, bool] = {}
    masks: dict[int, bool] = {}
    producer: dict[str, int] = {}
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node_inputs(node):
            if name in producer:
                last_use[name] = i
        if not _is_constant(node):
            for name in node.output:
                if name and not (g is not None and (_shape_chain(g, name, shapes) or _mask_chain(g, name, masks))):
                    producer[name] = i
    for out in model.graph.output:
        if out.name in producer:
            last_use[out.name] = n
    diff = [0] * (n + 2)
    for name, p in producer.items():
        end = last_use.get(name)
        if end is not None and end > p:
            diff[p + 1] += 1  # crosses every cut p+1 .. end
            diff[end + 1] -= 1
    widths, running = [], 0
    for p in range(n + 1):
        running += diff[p]
        widths.append(running)
    return widths


def partition(model: onnx.ModelProto, target: int, types: Mapping[str, onnx.TypeProto] | None = None) -> list[range]:
    """Consecutive node ranges of about ``target`` nodes, cut where the fewest computed tensors cross.

    Each cut is searched between half and one and a half targets after the previous one; among the
    narrowest positions, the one repeating the previous region's length wins (repeated layers then
    give identical regions), else the one nearest the target. ``types``: see ``cut_widths``."""
    n = len(model.graph.node)
    if target <= 0 or n <= target * 3 // 2:
        return [range(0, n)]
    widths = cut_widths(model, types)
    cuts = [0]
    previous = 0
    while n - cuts[-1] > target * 3 // 2:
        start = cuts[-1]
        low, high = start + max(1, target // 2), min(n - 1, start + target * 3 // 2)
        narrowest = min(widths[low : high + 1])
        candidates = [p for p in range(low, high + 1) if widths[p] == narrowest]
        repeat = start + previous
        cut = repeat if previous and repeat in candidates else min(candidates, key=lambda p: (abs(p - start - target), p))
        previous = cut - start
        cuts.append(cut)
    cuts.append(n)
    return [range(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


@dataclass
class Part:
    """A set of nodes as a standalone model, with the names it shares with the rest of the graph."""

    nodes: tuple[int, ...]
    """Indices into the graph's nodes."""
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    """Computed tensors and graph inputs it reads (its model's inputs, in first-use order)."""
    constants: tuple[str, ...]
    """Weights and outer Constant-node outputs it reads (its model's initializers, in first-use order)."""
    outputs: tuple[str, ...]
    """Tensors it computes that the rest of the graph reads (its model's outputs, in order of production)."""
    copies: tuple[str, ...] = ()
    """Outputs of the shape and mask computations copied in from outside (``_shape_chain``,
    ``_mask_chain``): computed here again so rules can read the sizes and masks, under fresh names
    when stitched (CSE merges them back)."""


class _Graph:
    """Index of one model's graph: producers, consumers, types, weights."""

    def __init__(self, model: onnx.ModelProto, types: Mapping[str, onnx.TypeProto]):
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.types = types
        inputs = {i.name for i in graph.input}
        self.weights = {t.name: t for t in graph.initializer if t.name not in inputs}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = i
            for name in node_inputs(node):
                self.consumers.setdefault(name, []).append(i)
        self.graph_outputs = {o.name for o in graph.output}
        self.graph_inputs = inputs - set(self.weights)


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type ``infer_types`` finds (plain ONNX inference where that fails): one name
    per free size through the whole graph and data propagation through Shape -> Reshape chains,
    so a region's sizes are tied to its neighbours' and repeated layers get the same symbols (and
    keys) instead of fresh ones per layer."""
    inferred = model
    for infer in (infer_types, infer_shapes):
        try:
            inferred = infer(model)  # types only: no weight copies
            break
        except Exception:
            continue
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    for t in graph.initializer:
        types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types


def part_model(model: onnx.ModelProto, nodes: Iterable[int], types: Mapping[str, onnx.TypeProto]) -> Part:
    """The nodes ``nodes`` of ``model`` as a model of their own (see ``Part``)."""
    return part_models(model, [nodes], types)[0]


def part_models(
    model: onnx.ModelProto, node_sets: Sequence[Iterable[int]], types: Mapping[str, onnx.TypeProto]
) -> list[Part]:
    """``part_model`` for each node set, indexing the graph once (not once per part: a model of
    many regions would cost regions x nodes)."""
    g = _Graph(model, types)
    return [_part(g, nodes) for nodes in node_sets]


SHAPE_OPS = frozenset(
    {"Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Reshape", "Identity"}
    | {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min", "Equal", "Where", "Not", "ReduceProd"}
)
"""Ops of the integer shape computations (``Shape -> Gather -> Concat -> Reshape``) a part copies in."""


def _small_ints(t: onnx.TypeProto | None) -> bool:
    if t is None or t.tensor_type.elem_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return False
    dims = t.tensor_type.shape.dim if t.tensor_type.HasField("shape") else None
    return dims is not None and len(dims) <= 1 and all(d.HasField("dim_value") and d.dim_value <= SMALL_CONSTANT for d in dims)


def _shape_chain(g: _Graph, name: str, memo: dict[int, bool]) -> bool:
    """Whether ``name`` is computed from sizes only (Shape/Size of tensors, constants, and small
    integer ops on those): such a tensor crossing a cut is computed again inside the part that
    reads it, so the rules there see what it holds instead of an opaque input."""
    source = g.producer.get(name)
    if source is None or _is_constant(g.nodes[source]):
        return False
    if source in memo:
        return memo[source]
    node = g.nodes[source]
    memo[source] = False
    ok = (
        node.domain in ("", "ai.onnx")
        and node.op_type in SHAPE_OPS
        and all(_small_ints(g.types.get(o)) for o in node.output if o)
        and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
    )
    if ok and node.op_type not in ("Shape", "Size"):
        ok = all(
            n in g.weights or n not in g.producer or _is_constant(g.nodes[g.producer[n]]) or _shape_chain(g, n, memo)
            for n in node.input
            if n
        )
    memo[source] = ok
    return ok


MASK_OPS = SHAPE_OPS | frozenset(
    {"GatherND", "And", "Or", "Xor", "IsNaN", "IsInf", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}
    | {"Expand", "Range", "ConstantOfShape", "Trilu", "Tile"}
    | {"MatMul", "Transpose", "Cos", "Sin", "Exp", "Pow"}
)
"""Ops of the attention masks and rotary position tables (``cos(positions @ inv_freq)``) an exporter
builds once from the graph's inputs for every layer."""
MASK_CHAIN_NODES = 32
"""The most nodes of a mask computation copied into a part."""
MASK_CONSTANT = 1 << 20
"""The most elements of a weight a copied mask computation may read: a folded causal mask of a
1,024-token sequence, not an embedding table (whose Gather would otherwise qualify)."""


def _mask_chain(g: _Graph, name: str, memo: dict[int, bool]) -> bool:
    """Whether ``name`` is computed by at most ``MASK_CHAIN_NODES`` nodes of ``MASK_OPS`` from the
    graph's inputs and small constants alone (a padding or causal mask, built once and read by every
    layer): like a shape computation, such a tensor crossing a cut is computed again inside the part
    that reads it, so a fusion there (attention) sees what the mask is instead of an opaque input."""
    source = g.producer.get(name)
    if source is None or _is_constant(g.nodes[source]):
        return False
    if source in memo:
        return memo[source]
    seen, stack, ok = {source}, [source], True
    while stack and ok:
        node = g.nodes[stack.pop()]
        ok = (
            node.domain in ("", "ai.onnx")
            and node.op_type in MASK_OPS
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        )
        for n in (n for n in node.input if n and ok):
            producer = g.producer.get(n)
            if n in g.weights:
                ok = math.prod(g.weights[n].dims) <= MASK_CONSTANT
            elif producer is None:
                ok = n in g.graph_inputs
            elif not _is_constant(g.nodes[producer]) and producer not in seen:
                seen.add(producer)
                stack.append(producer)
                ok = len(seen) <= MASK_CHAIN_NODES
    memo[source] = ok
    return ok


def _copied(g: _Graph, chosen: Sequence[int]) -> set[int]:
    """The outside nodes of the shape and mask computations ``chosen`` reads (see ``_shape_chain``
    and ``_mask_chain``)."""
    inside = set(chosen)
    memo: dict[int, bool] = {}
    masks: dict[int, bool] = {}
    copies: set[int] = set()
    stack = [n for i in chosen for n in node_inputs(g.nodes[i])]
    while stack:
        name = stack.pop()
        source = g.producer.get(name)
        if source is None or source in inside or source in copies:
            continue
        if not (_shape_chain(g, name, memo) or _mask_chain(g, name, masks)):
            continue
        copies.add(source)
        if g.nodes[source].op_type not in ("Shape", "Size"):
            stack.extend(n for n in g.nodes[source].input if n)
    return copies


def _part(g: _Graph, nodes: Iterable[int]) -> Part:
    own = sorted(set(nodes))
    inside = set(own)
    copies = _copied(g, own)
    chosen = sorted(inside | copies)
    produced: set[str] = set()
    inputs: list[str] = []
    constants: list[str] = []
    seen: set[str] = set()
    outer_constants: list[onnx.NodeProto] = []
    for i in chosen:
        node = g.nodes[i]
        for name in node_inputs(node):
            if name in produced or name in seen:
                continue
            seen.add(name)
            source = g.producer.get(name)
            if name in g.weights:
                constants.append(name)
            elif source is not None and _is_constant(g.nodes[source]):
                constants.append(name)
                outer_constants.append(g.nodes[source])
            else:
                inputs.append(name)
        produced.update(o for o in g.nodes[i].output if o)
    outputs = [
        o
        for i in own
        for o in g.nodes[i].output
        if o and (o in g.graph_outputs or any(c not in inside for c in g.consumers.get(o, ())))
    ]
    value_infos = []
    for name in [*inputs, *outputs]:
        t = g.types.get(name)
        source = g.producer.get(name)
        if (t is None or not t.tensor_type.elem_type) and source is not None and _is_constant(g.nodes[source]):
            value = _constant_tensor(g.nodes[source])  # a Constant inference left untyped
            t = helper.make_tensor_type_proto(value.data_type, list(value.dims))
        if t is None or not t.tensor_type.elem_type:
            raise PartitionError(f"no type for tensor {name!r} crossing a cut")
        value_infos.append(helper.make_value_info(name, t))
    initializers = [g.weights[name] for name in constants if name in g.weights]
    initializers.extend(_constant_tensor(node) for node in outer_constants)
    crossing = {*inputs, *outputs}
    inner = [  # the types the graph declared or ONNX inferred inside: the importer seeds its shapes from them
        helper.make_value_info(o, g.types[o])
        for i in chosen
        for o in g.nodes[i].output
        if o and o not in crossing and o in g.types and g.types[o].tensor_type.elem_type
    ]
    graph = helper.make_graph(
        [g.nodes[i] for i in chosen],
        g.model.graph.name,
        value_infos[: len(inputs)],
        value_infos[len(inputs) :],
        initializer=initializers,
        value_info=inner,
    )
    sub = helper.make_model(graph, opset_imports=list(g.model.opset_import), ir_version=g.model.ir_version)
    sub.functions.extend(g.model.functions)
    copied = tuple(o for i in sorted(copies) for o in g.nodes[i].output if o)
    return Part(tuple(own), sub, tuple(inputs), tuple(constants), tuple(outputs), copied)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto:
    """A Constant node's value as a tensor named after its output."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph([node], "c", [], [helper.make_value_info(node.output[0], onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    value = list(ReferenceEvaluator(model).run(None, {}))[0]
    return onnx.numpy_helper.from_array(np.asarray(value), node.output[0])


INVENTED_DIM = "unk__"
"""The prefix of the symbols ONNX shape inference invents for sizes it cannot compute."""


def _dims(t: onnx.TypeProto, invented: dict[str, str] | None = None) -> tuple[object, ...]:
    """A type's dims for a key: sizes, symbols by name; with ``invented``, the symbols shape
    inference invented (``unk__N``, numbered afresh in every layer of a repeated stack) by their
    order of first use in the part instead, so twin layers key alike while which of their dims
    are one symbol still counts."""
    if not t.tensor_type.HasField("shape"):
        return ("?",)
    dims: list[object] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif invented is not None and d.dim_param.startswith(INVENTED_DIM):
            dims.append("$" + invented.setdefault(d.dim_param, f"{INVENTED_DIM}{len(invented)}"))
        else:
            dims.append(f"${d.dim_param}")
    return tuple(dims)


def _constant_role(tensor: onnx.TensorProto, digests: dict[bytes, str], cid: str) -> str:
    """What a rule guard can read of a constant: small ones by value, larger ones whether they are
    uniform (zero, one, or any single value) and which earlier constant of the part they equal."""
    array = tensor_array(tensor)
    flat = array.reshape(-1)
    head = f"{tensor.data_type}{tuple(tensor.dims)}"
    if flat.size <= SMALL_CONSTANT:
        return f"{head}={flat.tobytes().hex()}"
    digest = hashlib.sha1(array.tobytes()).digest()
    tied = digests.setdefault(digest, cid)
    uniform = f" uniform {flat[0].tobytes().hex()}" if np.all(flat == flat[0]) else ""
    return f"{head}{uniform}" + (f" tied {tied}" if tied != cid else "")


def part_key(part: Part) -> tuple[str, list[str]]:
    """The part's canonical structural hash, and its tensor names in canonical order.

    Two parts with one key compute the same function of their inputs and weights as far as any
    rule can tell: the same ops and attributes in the same wiring, the same input and output
    types (symbolic dims by name), and constants equal wherever a rule guard can read them. The
    name lists of two such parts correspond position by position."""
    model = part.model
    graph = model.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    initializers = {t.name: t for t in graph.initializer}
    ids: dict[str, str] = {"": ""}
    names: list[str] = []
    digests: dict[bytes, str] = {}
    invented: dict[str, str] = {}
    lines = [",".join(f"{o.domain}:{o.version}" for o in sorted(model.opset_import, key=lambda o: o.domain))]
    for vi in graph.input:
        ids[vi.name] = f"i{len(names)}"
        names.append(vi.name)
        lines.append(f"in {vi.type.tensor_type.elem_type} {_dims(vi.type, invented)}")

    def cid(name: str) -> str:
        if name not in ids:
            ids[name] = f"c{len(names)}"
            names.append(name)
            lines.append(f"{ids[name]} " + _constant_role(initializers[name], digests, ids[name]))
        return ids[name]

    for node in graph.node:
        ins = [ids[n] if n in ids else cid(n) if n in initializers else f"?{n}" for n in node.input]
        if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute):
            ins.append("outer:" + ",".join(ids.get(n, n) for n in node_inputs(node)))
        outs = []
        for o in node.output:
            if o and o not in ids:
                ids[o] = f"t{len(names)}"
                names.append(o)
            outs.append(ids.get(o, ""))
        attrs = b"".join(a.SerializeToString() for a in sorted(node.attribute, key=lambda a: a.name))
        lines.append(f"{node.domain}:{node.op_type} {ins} -> {outs} {hashlib.sha1(attrs).hexdigest()}")
    for vi in graph.output:
        lines.append(f"out {ids[vi.name]} {vi.type.tensor_type.elem_type} {_dims(vi.type, invented)}")
    for name, t in types.items():
        if name in ids and name not in {vi.name for vi in graph.input}:
            lines.append(f"type {ids[name]} {_dims(t, invented)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest(), names


def rename_part(
    optimized: onnx.ModelProto, mapping: Mapping[str, str], prefix: str, external: Set[str]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The optimized part's nodes and new initializers with its tensor names renamed: names in
    ``mapping`` (the part's inputs, constants, outputs and original tensors) to their images, every
    other (fresh) name prefixed with ``prefix``. Initializers named in ``external`` (the part's
    inputs and constants, which the graph defines) are left out."""

    def name(n: str) -> str:
        return n if not n else mapping.get(n, prefix + n)

    nodes = []
    for node in optimized.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [name(n) for n in node.input]
        copy.output[:] = [name(n) for n in node.output]
        if copy.name:
            copy.name = prefix + copy.name
        for prop in copy.metadata_props:  # a kernel stamp names a tensor of the part
            if prop.key == KERNEL_STAMP:
                prop.value = STAMP_SEPARATOR.join(name(root) for root in prop.value.split(STAMP_SEPARATOR))
        for attr in copy.attribute:  # subgraphs read outer names: rename those too
            for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _rename_outer(graph, name)
        nodes.append(copy)
    initializers = []
    for tensor in optimized.graph.initializer:
        if tensor.name in external:
            continue
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = name(tensor.name)
        initializers.append(copy)
    return nodes, initializers


def _rename_outer(graph: onnx.GraphProto, name: object) -> None:
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for k, n in enumerate(node.input):
            if n and n not in local:
                node.input[k] = name(n)  # type: ignore[operator]
        local.update(node.output)
    for out in graph.output:
        if out.name not in local:
            out.name = name(out.name)  # type: ignore[operator]


def replace_parts(
    model: onnx.ModelProto,
    replaced: Sequence[tuple[Sequence[int], Sequence[onnx.NodeProto], Sequence[onnx.TensorProto]]],
) -> onnx.ModelProto:
    """``model`` with each part's nodes replaced by new nodes (and their new initializers), the
    nodes sorted topologically again and the weights nothing reads any more dropped."""
    graph = model.graph
    drop = {i for nodes, _, _ in replaced for i in nodes}
    at: dict[int, list[onnx.NodeProto]] = {}
    for nodes, new, _ in replaced:
        at.setdefault(min(nodes), []).extend(new)
    merged: list[onnx.NodeProto] = []
    for i, node in enumerate(graph.node):
        merged.extend(at.get(i, ()))
        if i not in drop:
            merged.append(node)
    out = model_shell(model, {"node", "initializer", "value_info"})
    out.graph.node.extend(topological(merged, {i.name for i in graph.input} | {t.name for t in graph.initializer}))
    used = {n for node in out.graph.node for n in node_inputs(node)} | {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}
    out.graph.initializer.extend(t for t in graph.initializer if t.name in used or t.name in inputs)
    for _, _, tensors in replaced:
        out.graph.initializer.extend(tensors)
    return out


def topological(nodes: Sequence[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each runs after the producers of what it reads (stable: the
    given order wherever it is already valid)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = {producer[n] for n in node_inputs(node) if n in producer and n not in available}
        deps.discard(i)
        waiting[i] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for r in readers.get(i, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):
        raise PartitionError("the replaced parts form a cycle")
    return order


def cut_windows(model: onnx.ModelProto, cuts: Sequence[int], hops: int, span: int) -> list[list[int]]:
    """For each cut (a node index), the nodes within ``hops`` edges (either way) of the tensors
    crossing the cut before that node, among the ``span`` nodes on each side of it: where a rewrite
    spanning the cut matches. The graph is indexed once for all cuts."""
    g = _Graph(model, {})
    return [_window(g, cut, hops, span) for cut in cuts]


def _window(g: _Graph, cut: int, hops: int, span: int) -> list[int]:
    low, high = max(0, cut - span), min(len(g.nodes), cut + span)
    crossing = [
        name
        for i in range(low, cut)
        for name in g.nodes[i].output
        if name and any(c >= cut for c in g.consumers.get(name, ()))
    ]
    frontier = {g.producer[n] for n in crossing} | {c for n in crossing for c in g.consumers.get(n, ()) if c < high}
    window = set(frontier)
    for _ in range(hops):
        step: set[int] = set()
        for i in frontier:
            node = g.nodes[i]
            step.update(g.producer[n] for n in node_inputs(node) if n in g.producer)
            step.update(c for o in node.output if o for c in g.consumers.get(o, ()))
        frontier = {i for i in step if low <= i < high and i not in window and not _is_constant(g.nodes[i])}
        window |= frontier
    return sorted(i for i in window if low <= i < high and not _is_constant(g.nodes[i]))


_COMMUTATIVE = frozenset({"Add", "Mul", "And", "Or", "Xor", "Equal", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
"""Two-input ops whose result is exactly the same with the inputs swapped (IEEE + and * are
commutative; Max and Min are left out: NaN handling may depend on the order)."""


def eliminate_common_subexpressions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Merge equal small weights and then nodes of one op, attributes and inputs (in place of the
    second, the first's outputs are read), and drop Identity nodes (their input is read instead):
    what separately optimized parts computed twice or passed on. Graph outputs stay as they are.
    Returns the model and how many nodes were merged or dropped."""
    graph = model.graph
    overridable = {i.name for i in graph.input}
    alias: dict[str, str] = {}
    by_value: dict[tuple[int, tuple[int, ...], bytes], str] = {}
    kept_weights = []
    for t in graph.initializer:
        count = int(np.prod(t.dims)) if t.dims else 1
        if t.name not in overridable and count <= 4096:
            value = (t.data_type, tuple(t.dims), tensor_array(t).tobytes())
            earlier = by_value.setdefault(value, t.name)
            if earlier != t.name:
                alias[t.name] = earlier
                continue
        kept_weights.append(t)
    outputs = {o.name for o in graph.output}
    seen: dict[tuple[object, ...], onnx.NodeProto] = {}
    kept: list[onnx.NodeProto] = []
    merged = 0
    for node in graph.node:
        node.input[:] = [alias.get(n, n) for n in node.input]
        has_graph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        if has_graph or node.op_type in _NONDETERMINISTIC or any(o in outputs for o in node.output):
            if has_graph:
                for attr in node.attribute:
                    for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                        _rename_outer(g, lambda n: alias.get(n, n))
            kept.append(node)
            continue
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.input[0]:
            alias[node.output[0]] = node.input[0]  # a region's output that was its input or a weight
            merged += 1
            continue
        attrs = b"".join(a.SerializeToString() for a in sorted(node.attribute, key=lambda a: a.name))
        inputs = tuple(node.input)
        if node.op_type in _COMMUTATIVE and node.domain in ("", "ai.onnx") and len(inputs) == 2:
            inputs = tuple(sorted(inputs))  # parts extract a + 1 and 1 + a alike often
        key = (node.domain, node.op_type, inputs, len(node.output), attrs)
        first = seen.get(key)
        if first is None:
            seen[key] = node
            kept.append(node)
            continue
        merged += 1
        for mine, theirs in zip(node.output, first.output, strict=True):
            if mine:
                alias[mine] = theirs
    for out in graph.output:
        if out.name in alias:
            raise AssertionError("graph outputs are never merged")
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(kept_weights)
    return model, merged
