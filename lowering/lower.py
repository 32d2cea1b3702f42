"""ONNX graph (as extraction chose it) -> ``KernelProgram``, for fixed input shapes.

The flow: weights and compile-time-known tensors are folded; the partitioner decides which
tensors are stored; each node's lowering rule turns its inputs (``Lazy`` tensors) into outputs,
emitting kernels for stored tensors and BLAS calls for matrix products; ops without a native
lowering run the numpy reference and are counted in ``KernelProgram.fallbacks``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxsat.base.errors import OnnxsatError
from onnxsat.egraph.graph_types import KERNEL_STAMP, STAMP_SEPARATOR
from onnxsat.extract.conv_layout import can_run_blocked, prefers_blocked

from .conv_kernels import RowPadded
from .kernel_ir import Buffer, dtype_of_numpy
from .layout_marks import read_layout_marks
from .loops import buffers_of, materialize_kernel
from .node_runner import node_runner
from .partition import PNode, partition
from .program import FallbackStep, KernelProgram, KernelStep, OutputView, Step
from .table import LOWERINGS, NotLowered, kind_of, load_rules
from .values import (
    Lazy,
    View,
    contiguous_strides,
    nchw_view,
    of_buffer,
    reads_channels_last,
    scalar,
    transpose,
)

MAX_FUSED_SIZE = 64
"""Expression nodes above which an inlined tensor is stored instead (bounded kernel size)."""

VALUE_SLOTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Slice": (1, 2, 3, 4),
    "Expand": (1,),
    "Pad": (1, 3),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
}
"""Inputs whose *values* decide shapes: a compiled model is specialized on them."""


RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})
"""Ops never evaluated at compile time even when their inputs are constants."""


class LoweringError(OnnxsatError):
    """The model cannot be compiled as given (unknown shapes, data-dependent shapes, odd dtypes)."""

    exit_code = 2


def value_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values decide shapes (the compiled code is specialized on their values)."""
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input} - inits
    found: list[str] = []
    for node in model.graph.node:
        for slot in VALUE_SLOTS.get(node.op_type, ()):
            if slot < len(node.input) and node.input[slot] in graph_inputs and node.input[slot] not in found:
                found.append(node.input[slot])
    return found


def _kernel_stamps(node: onnx.NodeProto) -> list[str]:
    """The kernels extraction put ``node`` in: one, or one per output (empty: unstamped)."""
    stamp = next((p.value for p in node.metadata_props if p.key == KERNEL_STAMP), None)
    return stamp.split(STAMP_SEPARATOR) if stamp else []


def ir_dtype(elem_type: int) -> str:
    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception as exc:  # noqa: BLE001 - onnx raises KeyError/ValueError by version
        raise NotLowered(f"element type {elem_type}") from exc
    dt = dtype_of_numpy(np_dtype)
    if dt is None:
        raise NotLowered(f"element type {onnx.TensorProto.DataType.Name(elem_type)}")
    return dt


class NodeView:
    """What a lowering rule sees of one node: attributes, opset, static input shapes and constants."""

    def __init__(self, lowerer: Lowerer, node: onnx.NodeProto):
        self.node = node
        self.op_type = node.op_type
        self.opset = lowerer.opset
        self.attrs: dict[str, Any] = {}
        for a in node.attribute:
            value = helper.get_attribute_value(a)
            self.attrs[a.name] = value.decode() if isinstance(value, bytes) else value
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self._lowerer = lowerer

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and bool(self.inputs[i])

    def const(self, i: int) -> np.ndarray | None:
        """The compile-time value of input ``i`` (None when absent or only known at run time)."""
        if not self.has(i):
            return None
        return self._lowerer.consts.get(self.inputs[i])

    def const_ints(self, i: int) -> list[int] | None:
        value = self.const(i)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def out_dtype(self, i: int = 0) -> str | None:
        return self._lowerer.declared_dtypes.get(self.outputs[i])


class Lowerer:
    """Lowers one graph for one set of input shapes (and values of shape-deciding inputs)."""

    def __init__(self, model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]], known: Mapping[str, np.ndarray]):
        load_rules()
        model, self.blocked_convs = read_layout_marks(model)
        """Outputs of the depthwise Convs extraction chose to run channel-blocked (None: no choice
        was made, ``runs_blocked`` decides by shape)."""
        self.model = model
        self.graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.consts: dict[str, np.ndarray] = {}
        self.lazies: dict[str, Lazy] = {}
        self.steps: list[Step] = []
        self.counter = itertools.count()
        self.constants: dict[str, np.ndarray] = {}
        self.const_buffers: dict[str, Buffer] = {}
        self.declared_dtypes: dict[str, str] = {}
        for vi in itertools.chain(model.graph.value_info, model.graph.output, model.graph.input):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                try:
                    self.declared_dtypes[vi.name] = ir_dtype(vi.type.tensor_type.elem_type)
                except NotLowered:
                    pass
        for init in model.graph.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        inits = set(self.consts)
        self.inputs: list[tuple[str, Buffer]] = []
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            if vi.name not in input_shapes:
                raise LoweringError(f"no shape for input {vi.name!r}")
            dt = ir_dtype(vi.type.tensor_type.elem_type)
            buf = self.buffer(vi.name, tuple(int(d) for d in input_shapes[vi.name]), dt)
            self.inputs.append((vi.name, buf))
            self.lazies[vi.name] = of_buffer(buf)
            if vi.name in known:
                self.consts[vi.name] = np.asarray(known[vi.name])
        self.output_names = [o.name for o in model.graph.output]
        self.output_buffers: dict[str, Buffer] = {}
        self.fallbacks: dict[str, int] = {}
        self.native: dict[str, int] = {}
        self.position = 0
        """Index of the node being lowered."""
        self.last_use: dict[str, int] = {}
        """Tensor -> index of the last node that reads it (graph outputs: past the end)."""
        self._reads: dict[str, set[str]] = {}
        """Tensor -> names of the buffers its value reads (memo for ``overwritable``)."""
        self.gemm_epilogues = False
        """Whether a product may absorb the bias Add (+ Relu) after it (see ``rules_nn``)."""
        self.output_views = False
        """Whether a graph output may be a view of a buffer (``_output_view``)."""
        self.fused: set[str] = set()
        """Tensors an earlier node's lowering already produced (their own nodes are skipped)."""
        self.blocked_images: dict[str, tuple[Buffer, tuple[int, ...], tuple[int, ...]]] = {}
        """Tensors a product stored channel-blocked and zero-padded for the blocked depthwise conv
        that reads them: the buffer, the padding before the image, the padded size."""
        self.row_planes: dict[str, tuple[Buffer, RowPadded]] = {}
        """Tensors a product stored into the row-padded planes of the flat depthwise conv that
        reads them (``conv_kernels.RowPadded``)."""
        self.producer: dict[str, int] = {t: i for i, node in enumerate(model.graph.node) for t in node.output if t}
        self.stamps: dict[str, str] = {}
        """Tensor -> the kernel extraction priced its node in (``KERNEL_STAMP``): a tensor and its
        reader of different stamps are never fused; unstamped nodes (ops extraction has no price
        for, a model not from extraction) may be."""
        for node in model.graph.node:
            kernels = _kernel_stamps(node)
            if kernels:
                self.stamps.update((t, kernels[min(k, len(kernels) - 1)]) for k, t in enumerate(node.output) if t)
        self.joined: list[tuple[int, int]] = []
        """Node pairs one kernel computes together through an epilogue (``fuse``)."""

    # ------------------------------------------------------------ buffers and values
    def buffer(self, hint: str, shape: tuple[int, ...], dtype: str) -> Buffer:
        clean = re.sub(r"[^A-Za-z0-9_]", "_", hint)[:24]
        return Buffer(f"b{next(self.counter)}_{clean}", dtype, tuple(int(d) for d in shape))

    def out_buffer(self, tensor: str, shape: tuple[int, ...], dtype: str) -> Buffer:
        """A fresh buffer for ``tensor``; a graph output gets its own output buffer (no copy later)."""
        if tensor in self.output_names and tensor not in self.output_buffers:
            buf = self.buffer(tensor, shape, dtype)
            self.output_buffers[tensor] = buf
            return buf
        return self.buffer(tensor, shape, dtype)

    def const_lazy(self, value: np.ndarray) -> Lazy:
        value = np.asarray(value)
        dt = dtype_of_numpy(value.dtype)
        if dt is None:
            raise NotLowered(f"constant of dtype {value.dtype}")
        if value.size == 1:
            item = value.reshape(-1)[0].item()
            return scalar(item, dt, tuple(value.shape))
        key = f"{value.dtype}{value.shape}{id(value)}"  # the same array object: one buffer
        buf = self.const_buffers.get(key)
        if buf is None:
            buf = Buffer(f"c{next(self.counter)}", dt, tuple(value.shape))
            self.const_buffers[key] = buf
            self.constants[buf.name] = np.ascontiguousarray(value)
        return of_buffer(buf)

    def value(self, tensor: str) -> Lazy | None:
        if not tensor:
            return None
        if tensor in self.lazies:
            return self.lazies[tensor]
        if tensor in self.consts:
            lazy = self.const_lazy(self.consts[tensor])
            self.lazies[tensor] = lazy
            return lazy
        raise LoweringError(f"tensor {tensor!r} is used before it is produced")

    def materialize(self, x: Lazy, hint: str = "t", tensor: str | None = None) -> Lazy:
        """``x`` stored in a buffer (a kernel is emitted unless it already is a contiguous buffer)."""
        if x.is_view:
            v = x.view
            if v.offset == 0 and v.buffer.shape == x.shape and v.strides == of_buffer(v.buffer).view.strides:
                if tensor is None or tensor not in self.output_names or v.buffer is self.output_buffers.get(tensor):
                    return x
        if tensor is not None and tensor in self.output_names and self._output_view(x, tensor) is not None:
            return x
        buf = self.out_buffer(tensor, x.shape, x.dtype) if tensor else self.buffer(hint, x.shape, x.dtype)
        if x.numel:
            self.emit_kernel(materialize_kernel(f"k{next(self.counter)}_{buf.name}", x, buf))
        return of_buffer(buf)

    def store(self, x: Lazy, tensor: str) -> Lazy:
        """``x`` stored as ``tensor``: channels last when it is an image computed from one stored
        channels last (a Winograd conv's output and the residual Add and Relu after it), so the
        elementwise kernel and the next conv read it with unit stride; otherwise ``materialize``."""
        if tensor in self.output_names or not reads_channels_last(x):
            return self.materialize(x, tensor=tensor)
        return nchw_view(self.materialize(transpose(x, (0, 2, 3, 1)), tensor=tensor).view.buffer, x.shape)

    def overwritable(self, x: Lazy) -> Buffer | None:
        """The intermediate buffer ``x`` reads element for element (same shape, contiguous, one
        leaf) when no node after the current one reads it: a row-wise kernel may write its result
        there (in place: no second buffer, no write-allocate traffic for the output)."""
        if x.leaves is None:
            return None
        dense = contiguous_strides(x.shape)
        fixed = {b.name for _, b in self.inputs} | {b.name for b in self.output_buffers.values()} | set(self.constants)
        later = [t for t in self.lazies if self.last_use.get(t, -1) > self.position]
        for t in later:
            if t not in self._reads:
                self._reads[t] = {b.name for b in buffers_of(self.lazies[t])}
        live = set().union(*(self._reads[t] for t in later))
        for v in x.leaves:
            buf = v.buffer
            if (
                buf.shape == x.shape
                and buf.dtype == x.dtype
                and v.offset == 0
                and all(s == c for s, c, d in zip(v.strides, dense, x.shape, strict=True) if d != 1)
                and sum(w.buffer.name == buf.name for w in x.leaves) == 1
                and buf.name not in fixed
                and buf.name not in live
            ):
                return buf
        return None

    def emit_kernel(self, kernel: Any) -> None:
        self.steps.append(KernelStep(kernel))

    def emit(self, step: Step) -> None:
        self.steps.append(step)

    def same_kernel(self, tensor: str, reader: onnx.NodeProto) -> bool:
        """Whether ``reader`` may be computed in the kernel that computes ``tensor``: extraction did
        not put them in different kernels."""
        made = self.stamps.get(tensor)
        read = {self.stamps[t] for t in reader.output if t in self.stamps}
        return made is None or not read or made in read

    def fuse(self, tensors: Iterable[str]) -> None:
        """The node being lowered computes ``tensors`` too (an epilogue): their nodes are skipped."""
        for t in tensors:
            self.fused.add(t)
            if t in self.producer:
                self.joined.append((self.position, self.producer[t]))

    def runs_blocked(self, conv: NodeView, x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: list[int], out_sp: list[int]) -> bool:
        """Whether the depthwise Conv ``conv`` runs channel-blocked: as extraction chose, or by shape
        for a model that carries no choice."""
        group = int(conv.attr("group", 1))
        if self.blocked_convs is None:
            return prefers_blocked(x_shape, w_shape, group, strides, out_sp)
        return conv.outputs[0] in self.blocked_convs and can_run_blocked(x_shape, w_shape, group)

    def view_of(self, node: onnx.NodeProto) -> NodeView:
        """What a lowering rule sees of ``node`` (a rule looking at the node that will read its result)."""
        return NodeView(self, node)

    # ------------------------------------------------------------ the flow
    def lower(self) -> KernelProgram:
        nodes = list(self.graph.node)
        pnodes = [
            PNode(f"n{i}", kind_of(n.op_type), tuple(n.input), tuple(n.output)) for i, n in enumerate(nodes)
        ]
        crossing = {t for i, n in enumerate(nodes) for t in n.input if not self.same_kernel(t, n)}
        parts = partition(pnodes, self.output_names, is_free=lambda t: t in self.consts, stored=crossing)
        for i, node in enumerate(nodes):
            for t in [*node.input, *_outer_references(node)]:
                self.last_use[t] = i
        for t in self.output_names:
            self.last_use[t] = len(nodes)
        for i, node in enumerate(nodes):
            self.position = i
            self._lower_node(node, parts.roots)
        outputs: list[tuple[str, Buffer]] = []
        views: dict[str, OutputView] = {}
        for name in self.output_names:
            x = self.value(name)
            assert x is not None
            handed = self._output_view(x, name)
            if handed is not None:
                outputs.append((name, handed.buffer))
                views[name] = OutputView(x.shape, handed.offset, handed.strides)
                continue
            stored = self.materialize(x, tensor=name)
            buf = stored.view.buffer
            if buf.name in {b.name for _, b in outputs} or buf.name in {b.name for _, b in self.inputs}:
                copy = self.buffer(name, x.shape, x.dtype)
                if x.numel:
                    self.emit_kernel(materialize_kernel(f"k{next(self.counter)}_{copy.name}", stored, copy))
                buf = copy
            outputs.append((name, buf))
        program = KernelProgram(self.inputs, outputs, self.steps, self.constants, output_views=views)
        program.fallbacks.update(self.fallbacks)
        program.native_ops.update(self.native)
        program.fused = self._fused_nodes(nodes, parts.groups)
        program.pinned = self._zero_padded()
        return program

    def _output_view(self, x: Lazy, tensor: str) -> View | None:
        """The view graph output ``tensor`` may be handed back through, with no kernel copying it
        first (with ``output_views``): rows of a buffer a kernel wrote (a Split's or Slice's part of
        a product or conv), which the caller's copy of the output reads with unit stride. Transposed
        views are copied by a kernel (parallel, vectorized); blocked images keep their zero padding
        in the arena."""
        if not self.output_views or not x.is_view or not x.numel:
            return None
        v = x.view
        if v.buffer is self.output_buffers.get(tensor) and v.buffer.shape == x.shape and v == of_buffer(v.buffer).view:
            return None  # the output's own buffer: handed back whole
        fixed = {b.name for _, b in self.inputs} | set(self.constants)
        fixed |= self._zero_padded()
        strides = [s for s, d in zip(v.strides, x.shape, strict=True) if d != 1]
        if v.buffer.name in fixed or any(s < 0 for s in strides) or (strides and strides[-1] != 1):
            return None
        return v

    def _zero_padded(self) -> set[str]:
        """Buffers whose padding a kernel relies on being zero (written once, in a pinned arena slot)."""
        return {buf.name for buf, _, _ in self.blocked_images.values()} | {buf.name for buf, _ in self.row_planes.values()}

    def _fused_nodes(self, nodes: list[onnx.NodeProto], groups: Mapping[str, list[str]]) -> list[frozenset[int]]:
        """Nodes computed together: each partition group (a kernel and what it inlines), joined by
        the epilogues; nodes folded at compile time left out."""
        graph = nx.Graph()  # a multi-output node (a Split, each part read by its own kernel) joins none
        run = [i for i, node in enumerate(nodes) if len(node.output) == 1 and node.output[0] not in self.consts]
        graph.add_nodes_from(run)
        for members in groups.values():
            index = [i for i in (int(name[1:]) for name in members) if i in graph]
            graph.add_edges_from(zip(index, index[1:], strict=False))
        graph.add_edges_from((a, b) for a, b in self.joined if a in graph and b in graph)
        return [frozenset(c) for c in nx.connected_components(graph) if len(c) > 1]

    def _lower_node(self, node: onnx.NodeProto, roots: set[str]) -> None:
        view = NodeView(self, node)
        if any(node.output) and all(t in self.fused for t in node.output if t):
            self.native[node.op_type] = self.native.get(node.op_type, 0) + 1
            return
        present = [t for t in node.input if t]
        if node.domain not in ("", "ai.onnx"):
            self._fallback(view, f"custom domain {node.domain}")
            return
        if node.op_type == "Constant" or (present and all(t in self.consts for t in present) and node.op_type not in RANDOM_OPS):
            self._fold(view)
            return
        rule = LOWERINGS.get(node.op_type)
        if rule is None:
            self._fallback(view, "no lowering rule")
            return
        try:
            xs = [self.value(t) for t in node.input]
            results = rule.fn(self, view, xs)
        except NotLowered as exc:
            self._fallback(view, str(exc))
            return
        for tensor, result in zip(node.output, results, strict=False):
            if not tensor or result is None:
                continue
            if isinstance(result, np.ndarray):
                self.consts[tensor] = result
                continue
            if tensor in roots or result.size > MAX_FUSED_SIZE:
                if not (result.is_view and tensor not in self.output_names):
                    result = self.store(result, tensor)
            self.lazies[tensor] = result
        self.native[node.op_type] = self.native.get(node.op_type, 0) + 1

    def _fold(self, view: NodeView) -> None:
        """A node whose inputs are all known at compile time: evaluate it now (numpy reference)."""
        outputs = _reference_run(view.node, self.opset, [self.consts.get(t) if t else None for t in view.inputs])
        for tensor, value in zip(view.outputs, outputs, strict=False):
            if tensor:
                self.consts[tensor] = np.asarray(value)
        self.native[view.op_type] = self.native.get(view.op_type, 0) + 1

    def _fallback(self, view: NodeView, reason: str) -> None:
        node = view.node
        in_buffers: list[Buffer | None] = []
        for t in node.input:
            x = self.value(t)
            in_buffers.append(None if x is None else self.materialize(x, t).view.buffer)
        captures = []
        for t in sorted(_outer_references(node)):
            x = self.value(t) if (t in self.lazies or t in self.consts) else None
            if x is not None:
                captures.append((t, self.materialize(x, t).view.buffer))
        shapes = _infer_output_shapes(node, self.opset, in_buffers, {t: self.consts[t] for t in node.input if t in self.consts}, captures)
        outs = []
        for tensor, (shape, elem) in zip(node.output, shapes, strict=True):
            dt = ir_dtype(elem) if elem else "f32"
            buf = self.out_buffer(tensor, shape, dt)
            outs.append(buf)
            self.lazies[tensor] = of_buffer(buf)
        self.emit(FallbackStep(node, self.opset, tuple(in_buffers), tuple(outs), reason, tuple(captures)))
        self.fallbacks[node.op_type] = self.fallbacks.get(node.op_type, 0) + 1


def _reference_run(node: onnx.NodeProto, opset: int, values: list[np.ndarray | None]) -> list[np.ndarray]:
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(values)]
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, values, strict=True)
        if v is not None
    ]
    outs = [f"o{k}" if o else "" for k, o in enumerate(node.output)]
    clone = helper.make_node(node.op_type, names, outs, domain=node.domain)
    clone.attribute.extend(node.attribute)
    graph = helper.make_graph([clone], "fold", inputs, [helper.make_tensor_value_info(o, 0, None) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
    feeds = {n: v for n, v in zip(names, values, strict=True) if v is not None}
    it = iter(node_runner(model)(feeds))
    return [next(it) if o else None for o in outs]  # type: ignore[misc]


def _outer_references(node: onnx.NodeProto) -> set[str]:
    """Names the node's subgraphs read from the enclosing graph."""
    found: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                for t in list(n.input) + sorted(_outer_references(n)):
                    if t and t not in defined:
                        found.add(t)
                defined.update(n.output)
            found.update(o.name for o in g.output if o.name not in defined)
    return found


def _infer_output_shapes(
    node: onnx.NodeProto,
    opset: int,
    inputs: list[Buffer | None],
    consts: dict[str, np.ndarray],
    captures: list[tuple[str, Buffer]],
) -> list[tuple[tuple[int, ...], int]]:
    """Static output shapes/types of one node (onnx shape inference with constants propagated)."""
    from .kernel_ir import NUMPY_DTYPES

    vis, inits = [], []
    for name, buf in [*zip(node.input, inputs, strict=True), *captures]:
        if buf is None:
            continue
        if name in consts:
            inits.append(numpy_helper.from_array(np.asarray(consts[name]), name))
        vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(NUMPY_DTYPES[buf.dtype]), buf.shape))
    graph = helper.make_graph([node], "infer", vis, [helper.make_tensor_value_info(o, 0, None) for o in node.output if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    found = {vi.name: vi for vi in itertools.chain(inferred.graph.output, inferred.graph.value_info)}
    result = []
    for o in node.output:
        vi = found.get(o)
        tt = vi.type.tensor_type if vi is not None else None
        if tt is None or not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
            raise LoweringError(f"{node.op_type} output {o!r} has a data-dependent or unknown shape")
        result.append((tuple(d.dim_value for d in tt.shape.dim), tt.elem_type))
    return result


def lower(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, tuple[int, ...]],
    known: Mapping[str, np.ndarray] | None = None,
    gemm_epilogues: bool = False,
    output_views: bool = False,
) -> KernelProgram:
    """Lower ``model`` for the given input shapes (and values of its shape-deciding inputs).
    ``gemm_epilogues``: a MatMul's bias Add (+ Relu) may go into its ``MatMulStep`` (only the CPU
    backend's packed GEMM applies them). ``output_views``: a graph output that is a row view of a
    computed buffer is handed back as ``KernelProgram.output_views`` says, not copied by a kernel
    (the CPU executable copies every output once anyway)."""
    lowerer = Lowerer(model, input_shapes, known or {})
    lowerer.gemm_epilogues = gemm_epilogues
    lowerer.output_views = output_views
    return lowerer.lower()


__all__ = ["lower", "value_inputs", "Lowerer", "NodeView", "LoweringError"]
